"""Tensor-core GEMM kernels for dense layers, TF32 and bf16: the same three products and epilogues as `kernels.gemm`.

    linear_fwd_<f>     y[B,N]  = act(x[B,K] @ w[K,N] + b[N])           act = ReLU when relu != 0
    linear_bwd_in_<f>  dx[B,K] = (dy[B,N] @ w[K,N]^T) * (a[B,K] > 0)    the mask only when mask != 0
    linear_wgrad_<f>   pw[s] = x[rows s]^T @ dy[rows s], pb[s] = column sums of dy[rows s]   (split s)
    (f = tf32 or bf16; the splits are added by kernels.gemm.wgrad_reduce, as for the fp32 kernels)

Operands are rounded as they enter shared memory, to TF32 (10 explicit mantissa bits, round to nearest, ties away)
or to bf16 (7 bits, ties to even), and multiplied by mma.sync m16n8k8 (TF32) or m16n8k16 (bf16 pairs; both
kernels/tensor_core.py) with fp32 accumulation; the bias, the ReLU, the mask and the bias gradient stay fp32 (pb
sums the fp32 dy). Error bound per output element (tests/kernels/test_gemm_tensor.py): sum_k |a_k b_k| times
2 u + u^2 (two operands each within u = 2^-11 for TF32, 2^-8 for bf16) plus the fp32 accumulation's K * 2^-23.

Launch shape: grid (ceil(out_cols / TILE), ceil(out_rows / TILE), splits), block (THREADS,), through
`fox_numba.device.launch.launch_tiles`. A block computes a TILE x TILE output tile; its 8 warps are 2 (rows) x
4 (columns), each a 64 x 32 warp tile of 4 x 4 mma tiles (16 x 8), so a thread holds 64 fp32 accumulators.
Shared memory: per operand two buffers of one BK-deep reduction tile, one 32-bit register per element (TF32, or
a bf16 in the low half, paired into the mma's registers as the fragments are read). An operand
that is contiguous along the reduction in global memory is kept [TILE][BK + 4] ("k-major"), otherwise
[BK][TILE + 8]; with either padding the fragment reads of a warp (8 output indices g by 4 reduction indices t)
fall in 32 different banks, and the stores from global memory are consecutive. Main loop as kernels.gemm:
load tile t+1 into registers, multiply tile t out of shared memory, store tile t+1 into the other buffer,
syncthreads. Out-of-range rows, columns and reduction indices are zero-filled on load and skipped on store.
Epilogue: a lane's accumulators hold pairs of adjacent columns in 8 rows of a warp, so storing them straight to global
memory writes 8-byte pieces 8 bytes apart (a third of each 32-byte sector used, the main cost of the forward GEMM in
Nsight Compute: tools/results/bench_learner_u32_h200.md). Instead each warp writes 8 rows of its 32 columns
(one accumulator row g of an mma tile row) into its slice of a shared staging array (STAGE_SHAPE) and reads it back a
row at a time, a lane per column, so every store (and the mask's or the bias' load) of a warp covers 128 contiguous
bytes. Columns are stored XOR `swizzle(row)`: the 32 lanes' writes (rows g, columns 8j + 2t (+1)) then fall in 32
different banks, and a row's reads are a permutation of its 32 words, so neither side has a bank conflict. The
barriers around the staging are block-wide (the simulator has no syncwarp; the control flow is uniform).
Determinism: every output element is one lane's accumulator, updated by the mma tiles in reduction order from
0; the mma itself is a fixed circuit, so a shape gives the same bits on every run. One BK tile is two TF32 k-steps
of 8 or one bf16 k-step of 16.
GPU only: the simulator cannot run mma (kernels/tensor_core.py); agent/dense.py runs the fp32 kernels there. The
epilogues run there alone (tests/kernels/test_gemm_tensor.py checks them against the accumulators' layout).
"""

from typing import Any

from numba import cuda, float32, int32, uint32

from fox_numba.device.registry import register
from fox_numba.device.runtime import SIMULATOR
from fox_numba.kernels.tensor_core import bf16_bits, mma_bf16, mma_tf32, tf32_bits

TILE = 128  # output rows and columns of one block
BK = 16  # reduction depth of one shared-memory tile (two TF32 mma k-steps of 8, one bf16 k-step of 16)
THREADS = 256
BLOCKS_PER_SM = 2  # the launch bounds' residency (caps registers at 128)
WARPS_N = 4  # warps side by side along the output columns (2 along the rows)
WARP_M, WARP_N = TILE // (THREADS // 32 // WARPS_N), TILE // WARPS_N  # 64 x 32
MT, NT = WARP_M // 16, WARP_N // 8  # mma tiles of a warp: 4 x 4
LOADS = TILE * BK // THREADS  # elements of one operand tile each thread loads
ACC, A_FRAG, B_FRAG = MT * NT * 4, MT * 4, NT * 2  # a lane's accumulators and fragment registers
UNIT_ROUNDOFF = {"tf32": 2.0**-11, "bf16": 2.0**-8}
"""Relative rounding error of an operand converted to each format (11 and 8 significant bits, round to nearest)."""
K_MAJOR_SHAPE = (2, TILE, BK + 4)
O_MAJOR_SHAPE = (2, BK, TILE + 8)
STAGE_SHAPE = (THREADS // 32, 8, WARP_N)
"""The epilogue's staging: per warp 8 rows of its WARP_N output columns (8 KiB a block, which keeps the k-major
backward-input kernel's static shared memory at the 48 KiB limit)."""

_F1 = float32[::1]
_F2 = float32[:, ::1]
_F3 = float32[:, :, ::1]


@cuda.jit(device=True)
def fetch(src, k_major, fixed, k, k_end, tid, regs):
    """Registers <- one operand tile at reduction offset k, zero past the source and past k_end: element
    (o, kk) is src[fixed + o, k + kk] when `k_major` (src contiguous along the reduction), else
    src[k + kk, fixed + o]."""
    n_rows, n_cols = src.shape
    for q in range(LOADS):
        v = float32(0)
        if k_major:
            r = fixed + tid // BK + q * (THREADS // BK)
            c = k + tid % BK
            if r < n_rows and c < k_end:
                v = src[r, c]
        else:
            r = k + tid // TILE + q * (THREADS // TILE)
            c = fixed + tid % TILE
            if r < k_end and c < n_cols:
                v = src[r, c]
        regs[q] = v


def product_error(fmt: str) -> float:
    """Relative error of a product of two operands rounded to `fmt` ('fp32': none): (1 + u)^2 - 1 = 2u + u^2."""
    u = UNIT_ROUNDOFF.get(fmt, 0.0)
    return 2.0 * u + u * u


def _store(convert: Any) -> Any:
    """The device function dst[buf] <- the registers of `fetch`, each as convert(value) (tf32_bits, bf16_bits)."""

    @cuda.jit(device=True)
    def store(dst, k_major, buf, tid, regs):
        for q in range(LOADS):
            if k_major:
                dst[buf, tid // BK + q * (THREADS // BK), tid % BK] = convert(regs[q])
            else:
                dst[buf, tid // TILE + q * (THREADS // TILE), tid % TILE] = convert(regs[q])

    return store


_store_tf32, _store_bf16 = _store(tf32_bits), _store(bf16_bits)


@cuda.jit(device=True)
def operand(s_tile, k_major, buf, o, k):
    """Element (output index o, reduction index k) of a shared operand tile."""
    if k_major:
        return s_tile[buf, o, k]
    return s_tile[buf, k, o]


@cuda.jit(device=True)
def pair(s_tile, k_major, buf, o, k):
    """The bf16 pair (o, k) | (o, k + 1) << 16 of a shared operand tile of bf16 in low halves."""
    return operand(s_tile, k_major, buf, o, k) | (operand(s_tile, k_major, buf, o, k + 1) << uint32(16))


def _build(a_k_major: bool, b_k_major: bool, bf16: bool) -> Any:
    """The block product of one operand orientation and format (shared-array shapes are compile-time constants)."""
    a_shape = K_MAJOR_SHAPE if a_k_major else O_MAJOR_SHAPE
    b_shape = K_MAJOR_SHAPE if b_k_major else O_MAJOR_SHAPE
    store = _store_bf16 if bf16 else _store_tf32
    # a k-step's depth, the reduction indices a register holds (TF32 one, bf16 a pair) and the second register's
    # offset: fragments (g, t) of m16n8k8 (TF32) read k = t and t + 4, of m16n8k16 (bf16) pairs 2t | 2t + 1 and
    # 2t + 8 | 2t + 9 (kernels/tensor_core.py)
    k_step, pack, half = (16, 2, 8) if bf16 else (8, 1, 4)
    load, mma = (pair, mma_bf16) if bf16 else (operand, mma_tf32)

    @cuda.jit(device=True)
    def product(a_src, a_fixed, b_src, b_fixed, k0, k1, acc, sums, do_sums):
        """acc = A @ B over the reduction [k0, k1) for the lane's fragments (acc[(i * NT + j) * 4 + e]: mma
        tile (i, j), element e); with `do_sums` (b not k-major), sums[0] = this thread's sum of its B column
        over its reduction rows (the bias gradient's share)."""
        a_s = cuda.shared.array(a_shape, uint32)
        b_s = cuda.shared.array(b_shape, uint32)
        ra = cuda.local.array(LOADS, float32)
        rb = cuda.local.array(LOADS, float32)
        af = cuda.local.array(A_FRAG, uint32)
        bf = cuda.local.array(B_FRAG, uint32)
        tid = uint32(cuda.threadIdx.x)
        lane = tid % 32
        g = lane // 4
        t = lane % 4
        m_base = (tid // 32) // WARPS_N * WARP_M + g
        n_base = (tid // 32) % WARPS_N * WARP_N + g
        for e in range(ACC):
            acc[e] = float32(0)
        sums[0] = float32(0)
        n_steps = (k1 - k0 + BK - 1) // BK
        fetch(a_src, a_k_major, a_fixed, k0, k1, tid, ra)
        fetch(b_src, b_k_major, b_fixed, k0, k1, tid, rb)
        store(a_s, a_k_major, 0, tid, ra)
        store(b_s, b_k_major, 0, tid, rb)
        if do_sums:
            for q in range(LOADS):
                sums[0] += rb[q]
        cuda.syncthreads()
        for step in range(n_steps):
            buf = uint32(step) % 2
            more = step + 1 < n_steps
            if more:
                fetch(a_src, a_k_major, a_fixed, k0 + (step + 1) * BK, k1, tid, ra)
                fetch(b_src, b_k_major, b_fixed, k0 + (step + 1) * BK, k1, tid, rb)
            for ks in range(BK // k_step):
                k = uint32(ks * k_step) + t * pack  # a lane's first reduction index in this k-step
                for i in range(MT):
                    m = m_base + i * 16
                    af[4 * i] = load(a_s, a_k_major, buf, m, k)
                    af[4 * i + 1] = load(a_s, a_k_major, buf, m + 8, k)
                    af[4 * i + 2] = load(a_s, a_k_major, buf, m, k + half)
                    af[4 * i + 3] = load(a_s, a_k_major, buf, m + 8, k + half)
                for j in range(NT):
                    n = n_base + j * 8
                    bf[2 * j] = load(b_s, b_k_major, buf, n, k)
                    bf[2 * j + 1] = load(b_s, b_k_major, buf, n, k + half)
                for i in range(MT):
                    for j in range(NT):
                        e = (i * NT + j) * 4
                        acc[e], acc[e + 1], acc[e + 2], acc[e + 3] = mma(
                            af[4 * i], af[4 * i + 1], af[4 * i + 2], af[4 * i + 3], bf[2 * j], bf[2 * j + 1],
                            acc[e], acc[e + 1], acc[e + 2], acc[e + 3],
                        )
            if more:
                store(a_s, a_k_major, buf ^ 1, tid, ra)
                store(b_s, b_k_major, buf ^ 1, tid, rb)
                if do_sums:
                    for q in range(LOADS):
                        sums[0] += rb[q]
            cuda.syncthreads()

    return product


@cuda.jit(device=True)
def out_row(origin, tid, i):
    """Output row of the lane's accumulators 0 and 1 of mma tile row i (2 and 3 are 8 rows down)."""
    return origin + (tid // 32) // WARPS_N * WARP_M + i * 16 + (tid % 32) // 4


@cuda.jit(device=True)
def out_col(origin, tid, j):
    """Output column of the lane's accumulators 0 and 2 of mma tile column j (1 and 3 are the next column)."""
    return origin + (tid // 32) % WARPS_N * WARP_N + j * 8 + 2 * (tid % 4)


@cuda.jit(device=True)
def put_fwd(y, b, relu, r, c, v):
    """y[r, c] = v + b[c] (then ReLU) inside y."""
    if r < y.shape[0] and c < y.shape[1]:
        v += b[c]
        if relu != 0 and v < float32(0):
            v = float32(0)
        y[r, c] = v


@cuda.jit(device=True)
def put_bwd_in(dx, act, mask, r, c, v):
    """dx[r, c] = v, or 0 where act[r, c] <= 0 when mask != 0, inside dx."""
    if r < dx.shape[0] and c < dx.shape[1]:
        if mask != 0 and not act[r, c] > float32(0):
            v = float32(0)
        dx[r, c] = v


@cuda.jit(device=True)
def put_plain(out, unused, flag, r, c, v):
    """out[r, c] = v inside out (a split's weight-gradient partial)."""
    if r < out.shape[0] and c < out.shape[1]:
        out[r, c] = v


@cuda.jit(device=True)
def swizzle(row):
    """The staging column XOR mask of a staged row: bit 0 from row bit 0, bits 3-4 from row bits 1-2 (Epilogue)."""
    return (row & 1) | ((row >> 1) << 3)


def _epilogue(put: Any) -> Any:
    """The device function that hands each of a block's outputs to `put(out, aux, flag, row, col, value)`, 8 x 32
    of a warp's outputs at a time staged through shared memory (module header: Epilogue)."""

    @cuda.jit(device=True)
    def epilogue(out, aux, flag, row0, col0, tid, acc):
        stage = cuda.shared.array(STAGE_SHAPE, float32)
        warp = tid // 32
        lane = tid % 32
        g = lane // 4
        t2 = lane % 4 * 2
        mask = swizzle(g)
        r_warp = out_row(row0, tid, 0) - g  # the warp tile's first output row
        c = out_col(col0, tid, 0) - t2 + lane  # this lane's output column when it writes rows out
        for i in range(MT):
            for half in range(2):  # the accumulators' rows g, then g + 8
                for j in range(NT):
                    e = (i * NT + j) * 4 + 2 * half
                    cc = j * 8 + t2
                    stage[warp, g, cc ^ mask] = acc[e]
                    stage[warp, g, (cc + 1) ^ mask] = acc[e + 1]
                cuda.syncthreads()
                for rr in range(8):
                    put(out, aux, flag, r_warp + i * 16 + half * 8 + rr, c, stage[warp, rr, lane ^ swizzle(rr)])
                cuda.syncthreads()

    return epilogue


epilogue_fwd, epilogue_bwd_in, epilogue_plain = _epilogue(put_fwd), _epilogue(put_bwd_in), _epilogue(put_plain)


def _kernel(fn: Any, sig: tuple) -> Any:
    options = {} if SIMULATOR else {"launch_bounds": (THREADS, BLOCKS_PER_SM)}
    return register(sig)(cuda.jit(**options)(fn))


def _kernels(bf16: bool) -> tuple[Any, Any, Any]:
    """The three kernels of one format (module header), registered as linear_fwd_<f>, linear_bwd_in_<f>,
    linear_wgrad_<f>."""
    product_fwd = _build(True, False, bf16)  # x[B,K] (contiguous along K), w[K,N]
    product_bwd_in = _build(True, True, bf16)  # dy[B,N] and w[K,N], both contiguous along N
    product_wgrad = _build(False, False, bf16)  # x[B,K] and dy[B,N], both contiguous along the output

    def linear_fwd(x, w, b, y, relu):
        """y = x @ w + b, then max(y, 0) when relu != 0."""
        acc = cuda.local.array(ACC, float32)
        unused = cuda.local.array(1, float32)
        row0 = uint32(cuda.blockIdx.y) * TILE
        col0 = uint32(cuda.blockIdx.x) * TILE
        product_fwd(x, row0, w, col0, 0, x.shape[1], acc, unused, False)
        epilogue_fwd(y, b, relu, row0, col0, uint32(cuda.threadIdx.x), acc)

    def linear_bwd_in(dy, w, act, dx, mask, k_len):
        """dx = dy[:, :k_len] @ w[:, :k_len]^T, zeroed where act <= 0 when mask != 0 (act is not read when
        mask == 0)."""
        acc = cuda.local.array(ACC, float32)
        unused = cuda.local.array(1, float32)
        row0 = uint32(cuda.blockIdx.y) * TILE
        col0 = uint32(cuda.blockIdx.x) * TILE
        product_bwd_in(dy, row0, w, col0, 0, k_len, acc, unused, False)
        epilogue_bwd_in(dx, act, mask, row0, col0, uint32(cuda.threadIdx.x), acc)

    def linear_wgrad(x, dy, pw, pb, chunk):
        """pw[s] = x[rows]^T @ dy[rows], rows = [s*chunk, (s+1)*chunk) for split s = blockIdx.z; the blocks of the
        first row of tiles also write pb[s] = dy[rows] summed over the rows (fp32, from the unrounded dy)."""
        acc = cuda.local.array(ACC, float32)
        sums = cuda.local.array(1, float32)
        partial = cuda.shared.array(THREADS, float32)
        row0 = uint32(cuda.blockIdx.y) * TILE
        col0 = uint32(cuda.blockIdx.x) * TILE
        split = uint32(cuda.blockIdx.z)
        tid = uint32(cuda.threadIdx.x)
        start = split * chunk
        stop = min(start + chunk, x.shape[0])
        do_sums = row0 == 0
        product_wgrad(x, row0, dy, col0, start, stop, acc, sums, do_sums)
        epilogue_plain(pw[split], pb, 0, row0, col0, tid, acc)
        if do_sums:  # a column's rows are split over threads tid and tid + TILE (even and odd reduction rows)
            partial[tid] = sums[0]
            cuda.syncthreads()
            c = col0 + tid
            if tid < TILE and c < pb.shape[1]:
                pb[split, c] = partial[tid] + partial[tid + TILE]

    fmt = "bf16" if bf16 else "tf32"
    built = []
    for fn, sig in ((linear_fwd, (_F2, _F2, _F1, _F2, int32)), (linear_bwd_in, (_F2, _F2, _F2, _F2, int32, int32)),
                    (linear_wgrad, (_F2, _F2, _F3, _F2, int32))):
        fn.__name__ = fn.__qualname__ = f"{fn.__name__}_{fmt}"  # the registry's and the compile check's name
        built.append(_kernel(fn, sig))
    return built[0], built[1], built[2]


linear_fwd_tf32, linear_bwd_in_tf32, linear_wgrad_tf32 = _kernels(bf16=False)
linear_fwd_bf16, linear_bwd_in_bf16, linear_wgrad_bf16 = _kernels(bf16=True)
