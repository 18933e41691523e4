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

Geometries (GEOMETRIES): a block of THREADS = 256 threads computes a TILE x TILE output tile, its 8 warps each a
WARP_M x 32 warp tile of (WARP_M / 16) x 4 mma tiles (16 x 8). TILE 128: 2 (rows) x 4 (columns) warps of 64 x 32,
64 fp32 accumulators a thread, 2 blocks per SM; TILE 64: 4 x 2 warps of 16 x 32, 16 accumulators, 4 blocks per SM,
for outputs whose 128-tiles would not fill the GPU (kernels/nn.py picks from the shapes). Both give the same bits
for the forward and backward-input products (each element's mma k-steps run in the same order); the weight
gradient's depend on its splits, as for the fp32 kernels. Launch shape: grid (ceil(out_cols / TILE),
ceil(out_rows / TILE), splits), block (THREADS,), through `fox_numba.device.launch.launch_tiles`.
Shared memory: per operand two buffers of one BK-deep reduction tile, one 32-bit register per element (TF32, or
a bf16 in the low half, paired into the mma's registers as the fragments are read). An operand
that is contiguous along the reduction in global memory is kept [TILE][BK + 4] ("k-major"), otherwise
[BK][TILE + 8]; with either padding the fragment reads of a warp (8 output indices g by 4 reduction indices t)
fall in 32 different banks, and the stores from global memory are consecutive. Main loop as kernels.gemm:
load tile t+1 into registers, multiply tile t out of shared memory, store tile t+1 into the other buffer,
syncthreads. Out-of-range rows, columns and reduction indices are zero-filled on load and skipped on store.
Epilogue: a lane's accumulators hold pairs of adjacent columns in 8 rows of a warp, so storing them straight to
global memory writes 8-byte pieces 8 bytes apart (a third of each 32-byte sector used, the main cost of the forward
GEMM in Nsight Compute: tools/results/bench_learner_u32_h200.md). Instead each warp writes 8 rows of its 32 columns
(one accumulator row g of an mma tile row) into its slice of a shared staging array (Geometry.stage_shape) and reads
it back a row at a time, a lane per column, so every store (and the mask's or the bias' load) of a warp covers 128
contiguous bytes. Columns are stored XOR `swizzle(row)`: the 32 lanes' writes (rows g, columns 8j + 2t (+1)) then
fall in 32 different banks, and a row's reads are a permutation of its 32 words, so neither side has a bank
conflict. The barriers around the staging are block-wide (the simulator has no syncwarp; the control flow is
uniform).
Registers: at TILE 128 the 64 accumulators and the main loop's operands fill the 128 registers the launch bounds
allow, so nothing may push them to local memory. An array index that changes with a loop the compiler does not
unroll does (the epilogue's loop over mma tile rows, whose body is too large to unroll, once made a 256-byte stack
frame): the epilogue reads tile row 0 only and shifts the next row in (shift_tile_row). The weight gradient's
bias-gradient share accumulates in the thread's slot of a shared array, not in a register that ptxas spilled. ptxas'
figures: tools/results/gemm_tiles_h100.md.
Determinism: every output element is one lane's accumulator, updated by the mma tiles in reduction order from
0; the mma itself is a fixed circuit, so a shape gives the same bits on every run. One BK tile is two TF32 k-steps
of 8 or one bf16 k-step of 16.
GPU only: the simulator cannot run mma (kernels/tensor_core.py); agent/dense.py runs the fp32 kernels there. The
epilogues run there alone (tests/kernels/test_gemm_tensor.py checks them against the accumulators' layout).
"""

from types import SimpleNamespace
from typing import Any, NamedTuple

from numba import cuda, float32, int32, uint32

from fox_numba.device.registry import register
from fox_numba.device.runtime import SIMULATOR
from fox_numba.kernels.tensor_core import bf16_bits, mma_bf16, mma_tf32, tf32_bits

BK = 16  # reduction depth of one shared-memory tile (two TF32 mma k-steps of 8, one bf16 k-step of 16)
THREADS = 256
WARP_N = 32  # a warp tile's output columns: the epilogue writes a row of them with a lane per column
NT = WARP_N // 8  # mma tile columns of a warp
TILE_ROW = NT * 4  # a lane's accumulators of one mma tile row (4 of each mma tile)
UNIT_ROUNDOFF = {"tf32": 2.0**-11, "bf16": 2.0**-8}
"""Relative rounding error of an operand converted to each format (11 and 8 significant bits, round to nearest)."""


class Geometry(NamedTuple):
    """A block's TILE x TILE output tile over THREADS threads, and the residency its launch bounds ask for."""

    tile: int
    blocks_per_sm: int  # caps registers at 64K / (THREADS * it)

    @property
    def warps_n(self) -> int:
        return self.tile // WARP_N  # warps side by side along the output columns

    @property
    def warp_m(self) -> int:
        return self.tile // (THREADS // 32 // self.warps_n)  # a warp tile's output rows

    @property
    def mt(self) -> int:
        return self.warp_m // 16  # mma tile rows of a warp (NT = WARP_N // 8 = 4 columns)

    @property
    def loads(self) -> int:
        return self.tile * BK // THREADS  # elements of one operand tile each thread loads

    @property
    def acc(self) -> int:
        return self.mt * TILE_ROW  # a lane's accumulators

    @property
    def k_major_shape(self) -> tuple[int, int, int]:
        return (2, self.tile, BK + 4)

    @property
    def o_major_shape(self) -> tuple[int, int, int]:
        return (2, BK, self.tile + 8)

    @property
    def stage_shape(self) -> tuple[int, int, int]:
        """The epilogue's staging: per warp 8 rows of its WARP_N output columns (8 KiB a block, which keeps the
        k-major backward-input kernel's static shared memory at the 48 KiB limit at TILE 128)."""
        return (THREADS // 32, 8, WARP_N)


GEOMETRIES = (Geometry(128, 2), Geometry(64, 4))
"""The built tile sizes; the first is each format's configuration named by the format alone ("tf32")."""

_F1 = float32[::1]
_F2 = float32[:, ::1]
_F3 = float32[:, :, ::1]


def product_error(fmt: str) -> float:
    """Relative error of a product of two operands rounded to `fmt` ('fp32': none): (1 + u)^2 - 1 = 2u + u^2."""
    u = UNIT_ROUNDOFF.get(fmt, 0.0)
    return 2.0 * u + u * u


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


def device_parts(geom: Geometry) -> SimpleNamespace:
    """The device functions of one geometry (its sizes are compile-time constants): fetch, store_tf32 /
    store_bf16, out_row, out_col, the epilogues epilogue_fwd / epilogue_bwd_in / epilogue_plain, and `product`,
    the builder of the block product of one operand orientation and format."""
    tile, warps_n, warp_m, mt, loads, acc_n = geom.tile, geom.warps_n, geom.warp_m, geom.mt, geom.loads, geom.acc
    a_frag, b_frag = mt * 4, NT * 2
    stage_shape = geom.stage_shape

    @cuda.jit(device=True)
    def fetch(src, k_major, fixed, k, k_end, tid, regs):
        """Registers <- one operand tile at reduction offset k, zero past the source and past k_end: element
        (o, kk) is src[fixed + o, k + kk] when `k_major` (src contiguous along the reduction), else
        src[k + kk, fixed + o]."""
        n_rows, n_cols = src.shape
        for q in range(loads):
            v = float32(0)
            if k_major:
                r = fixed + tid // BK + q * (THREADS // BK)
                c = k + tid % BK
                if r < n_rows and c < k_end:
                    v = src[r, c]
            else:
                r = k + tid // tile + q * (THREADS // tile)
                c = fixed + tid % tile
                if r < k_end and c < n_cols:
                    v = src[r, c]
            regs[q] = v

    def make_store(convert: Any) -> Any:
        """The device function dst[buf] <- the registers of `fetch`, each as convert(value) (tf32_bits,
        bf16_bits)."""

        @cuda.jit(device=True)
        def store(dst, k_major, buf, tid, regs):
            for q in range(loads):
                if k_major:
                    dst[buf, tid // BK + q * (THREADS // BK), tid % BK] = convert(regs[q])
                else:
                    dst[buf, tid // tile + q * (THREADS // tile), tid % tile] = convert(regs[q])

        return store

    store_tf32, store_bf16 = make_store(tf32_bits), make_store(bf16_bits)

    def product(a_k_major: bool, b_k_major: bool, bf16: bool) -> Any:
        """The block product of one operand orientation and format (shared-array shapes are compile-time
        constants)."""
        a_shape = geom.k_major_shape if a_k_major else geom.o_major_shape
        b_shape = geom.k_major_shape if b_k_major else geom.o_major_shape
        store = store_bf16 if bf16 else store_tf32
        # a k-step's depth, the reduction indices a register holds (TF32 one, bf16 a pair) and the second
        # register's offset: fragments (g, t) of m16n8k8 (TF32) read k = t and t + 4, of m16n8k16 (bf16) pairs
        # 2t | 2t + 1 and 2t + 8 | 2t + 9 (kernels/tensor_core.py)
        k_step, pack, half = (16, 2, 8) if bf16 else (8, 1, 4)
        load, mma = (pair, mma_bf16) if bf16 else (operand, mma_tf32)

        @cuda.jit(device=True)
        def block_product(a_src, a_fixed, b_src, b_fixed, k0, k1, acc, sums, do_sums):
            """acc = A @ B over the reduction [k0, k1) for the lane's fragments (acc[(i * NT + j) * 4 + e]: mma
            tile (i, j), element e); with `do_sums` (b not k-major), sums[0] = this thread's sum of its B column
            over its reduction rows (the bias gradient's share; the weight gradient passes a slot of shared
            memory, module header: Registers)."""
            a_s = cuda.shared.array(a_shape, uint32)
            b_s = cuda.shared.array(b_shape, uint32)
            ra = cuda.local.array(loads, float32)
            rb = cuda.local.array(loads, float32)
            af = cuda.local.array(a_frag, uint32)
            bf = cuda.local.array(b_frag, uint32)
            tid = uint32(cuda.threadIdx.x)
            lane = tid % 32
            g = lane // 4
            t = lane % 4
            m_base = (tid // 32) // warps_n * warp_m + g
            n_base = (tid // 32) % warps_n * WARP_N + g
            for e in range(acc_n):
                acc[e] = float32(0)
            sums[0] = float32(0)
            n_steps = (k1 - k0 + BK - 1) // BK
            fetch(a_src, a_k_major, a_fixed, k0, k1, tid, ra)
            fetch(b_src, b_k_major, b_fixed, k0, k1, tid, rb)
            store(a_s, a_k_major, 0, tid, ra)
            store(b_s, b_k_major, 0, tid, rb)
            if do_sums:
                for q in range(loads):
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
                    for i in range(mt):
                        m = m_base + i * 16
                        af[4 * i] = load(a_s, a_k_major, buf, m, k)
                        af[4 * i + 1] = load(a_s, a_k_major, buf, m + 8, k)
                        af[4 * i + 2] = load(a_s, a_k_major, buf, m, k + half)
                        af[4 * i + 3] = load(a_s, a_k_major, buf, m + 8, k + half)
                    for j in range(NT):
                        n = n_base + j * 8
                        bf[2 * j] = load(b_s, b_k_major, buf, n, k)
                        bf[2 * j + 1] = load(b_s, b_k_major, buf, n, k + half)
                    for i in range(mt):
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
                        for q in range(loads):
                            sums[0] += rb[q]
                cuda.syncthreads()

        return block_product

    @cuda.jit(device=True)
    def out_row(origin, tid, i):
        """Output row of the lane's accumulators 0 and 1 of mma tile row i (2 and 3 are 8 rows down)."""
        return origin + (tid // 32) // warps_n * warp_m + i * 16 + (tid % 32) // 4

    @cuda.jit(device=True)
    def out_col(origin, tid, j):
        """Output column of the lane's accumulators 0 and 2 of mma tile column j (1 and 3 are the next column)."""
        return origin + (tid // 32) % warps_n * WARP_N + j * 8 + 2 * (tid % 4)

    @cuda.jit(device=True)
    def shift_tile_row(acc):
        """Moves the accumulators one mma tile row down (acc[e] = acc[e + TILE_ROW]; the last row's are left):
        the epilogue reads tile row 0 only, at constant indices, which keeps acc in registers (an index that
        changes with a loop the compiler does not unroll puts acc in local memory)."""
        for e in range(acc_n - TILE_ROW):
            acc[e] = acc[e + TILE_ROW]

    def make_epilogue(put: Any) -> Any:
        """The device function that hands each of a block's outputs to `put(out, aux, flag, row, col, value)`,
        8 x 32 of a warp's outputs at a time staged through shared memory (module header: Epilogue). It consumes
        acc (shift_tile_row)."""

        @cuda.jit(device=True)
        def epilogue(out, aux, flag, row0, col0, tid, acc):
            stage = cuda.shared.array(stage_shape, float32)
            warp = tid // 32
            lane = tid % 32
            g = lane // 4
            t2 = lane % 4 * 2
            mask = swizzle(g)
            r_warp = out_row(row0, tid, 0) - g  # the warp tile's first output row
            c = out_col(col0, tid, 0) - t2 + lane  # this lane's output column when it writes rows out
            for i in range(mt):
                for half in range(2):  # the accumulators' rows g, then g + 8
                    for j in range(NT):
                        e = j * 4 + 2 * half  # in tile row 0, which holds tile row i (shift_tile_row)
                        cc = j * 8 + t2
                        stage[warp, g, cc ^ mask] = acc[e]
                        stage[warp, g, (cc + 1) ^ mask] = acc[e + 1]
                    cuda.syncthreads()
                    for rr in range(8):
                        put(out, aux, flag, r_warp + i * 16 + half * 8 + rr, c, stage[warp, rr, lane ^ swizzle(rr)])
                    cuda.syncthreads()
                shift_tile_row(acc)

        return epilogue

    return SimpleNamespace(
        fetch=fetch, store_tf32=store_tf32, store_bf16=store_bf16, product=product, out_row=out_row,
        out_col=out_col, epilogue_fwd=make_epilogue(put_fwd), epilogue_bwd_in=make_epilogue(put_bwd_in),
        epilogue_plain=make_epilogue(put_plain),
    )


PARTS = {geom.tile: device_parts(geom) for geom in GEOMETRIES}
"""Each geometry's device functions, by TILE."""


def kernel_name(op: str, fmt: str, tile: int) -> str:
    """The registry's name of a kernel: linear_fwd_tf32 for the first geometry, linear_fwd_tf32_64 for TILE 64."""
    return f"{op}_{fmt}" if tile == GEOMETRIES[0].tile else f"{op}_{fmt}_{tile}"


def _kernels(geom: Geometry, bf16: bool) -> tuple[Any, Any, Any]:
    """The three kernels of one geometry and format (module header), registered under kernel_name."""
    parts = PARTS[geom.tile]
    tile, acc_n = geom.tile, geom.acc
    product_fwd = parts.product(True, False, bf16)  # x[B,K] (contiguous along K), w[K,N]
    product_bwd_in = parts.product(True, True, bf16)  # dy[B,N] and w[K,N], both contiguous along N
    product_wgrad = parts.product(False, False, bf16)  # x[B,K] and dy[B,N], both contiguous along the output
    epilogue_fwd, epilogue_bwd_in, epilogue_plain = parts.epilogue_fwd, parts.epilogue_bwd_in, parts.epilogue_plain
    row_parts = THREADS // tile  # threads whose bias-gradient shares make one column's (non-k-major rows)

    def linear_fwd(x, w, b, y, relu):
        """y = x @ w + b, then max(y, 0) when relu != 0."""
        acc = cuda.local.array(acc_n, float32)
        unused = cuda.local.array(1, float32)
        row0 = uint32(cuda.blockIdx.y) * tile
        col0 = uint32(cuda.blockIdx.x) * tile
        product_fwd(x, row0, w, col0, 0, x.shape[1], acc, unused, False)
        epilogue_fwd(y, b, relu, row0, col0, uint32(cuda.threadIdx.x), acc)

    def linear_bwd_in(dy, w, act, dx, mask, k_len):
        """dx = dy[:, :k_len] @ w[:, :k_len]^T, zeroed where act <= 0 when mask != 0 (act is not read when
        mask == 0)."""
        acc = cuda.local.array(acc_n, float32)
        unused = cuda.local.array(1, float32)
        row0 = uint32(cuda.blockIdx.y) * tile
        col0 = uint32(cuda.blockIdx.x) * tile
        product_bwd_in(dy, row0, w, col0, 0, k_len, acc, unused, False)
        epilogue_bwd_in(dx, act, mask, row0, col0, uint32(cuda.threadIdx.x), acc)

    def linear_wgrad(x, dy, pw, pb, chunk):
        """pw[s] = x[rows]^T @ dy[rows], rows = [s*chunk, (s+1)*chunk) for split s = blockIdx.z; the blocks of the
        first row of tiles also write pb[s] = dy[rows] summed over the rows (fp32, from the unrounded dy)."""
        acc = cuda.local.array(acc_n, float32)
        partial = cuda.shared.array(THREADS, float32)
        row0 = uint32(cuda.blockIdx.y) * tile
        col0 = uint32(cuda.blockIdx.x) * tile
        split = uint32(cuda.blockIdx.z)
        tid = uint32(cuda.threadIdx.x)
        start = split * chunk
        stop = min(start + chunk, x.shape[0])
        do_sums = row0 == 0
        product_wgrad(x, row0, dy, col0, start, stop, acc, partial[tid:tid + 1], do_sums)  # partial[tid] = the share
        epilogue_plain(pw[split], pb, 0, row0, col0, tid, acc)
        if do_sums:  # a column's rows are split over threads tid, tid + TILE, ... (reduction rows mod row_parts)
            cuda.syncthreads()
            c = col0 + tid
            if tid < tile and c < pb.shape[1]:
                total = partial[tid]
                for p in range(1, row_parts):
                    total += partial[tid + p * tile]
                pb[split, c] = total

    fmt = "bf16" if bf16 else "tf32"
    options = {} if SIMULATOR else {"launch_bounds": (THREADS, geom.blocks_per_sm)}
    built = []
    for fn, sig in ((linear_fwd, (_F2, _F2, _F1, _F2, int32)), (linear_bwd_in, (_F2, _F2, _F2, _F2, int32, int32)),
                    (linear_wgrad, (_F2, _F2, _F3, _F2, int32))):
        fn.__name__ = fn.__qualname__ = kernel_name(fn.__name__, fmt, tile)  # the registry's and compile check's
        built.append(register(sig)(cuda.jit(**options)(fn)))
    return built[0], built[1], built[2]


KERNELS = {(fmt, geom.tile): _kernels(geom, bf16=fmt == "bf16") for fmt in ("tf32", "bf16") for geom in GEOMETRIES}
"""(fwd, bwd_in, wgrad) of each (format, TILE)."""
