"""Register-tiled float32 GEMM kernels for dense layers, fused with their bias, ReLU and mask epilogues.

    linear_fwd_C      y[B,N]  = act(x[B,K] @ w[K,N] + b[N])           act = ReLU when relu != 0
    linear_bwd_in_C   dx[B,K] = (dy[B,N] @ w[K,N]^T) * (a[B,K] > 0)    the mask only when mask != 0
    linear_wgrad_C    pw[s] = x[rows s]^T @ dy[rows s], pb[s] = column sums of dy[rows s]   (split s)
    wgrad_reduce      dw = pw[0] + pw[1] + ..., db = pb[0] + pb[1] + ...    (the splits in order)

Each GEMM is built for the configurations C in CONFIGS, "TxM": a T x T block tile of output, M x M
outputs per thread, (T/M)^2 threads. 128x8 (256 threads) does the most work per shared-memory read and
wins on large outputs with long reductions; 64x4 (256 threads, 16 outputs each) pads narrow outputs
less and keeps 4x more warps in flight where 128x8 blocks would not fill the GPU (a 64x8 build, 64
threads, lost to one or the other on every shape of an H200 sweep). The wrappers in
`fox_numba.kernels.nn` pick one from the shapes and are the only launchers.

Launch shape: grid (ceil(out_cols / T), ceil(out_rows / T), splits), block ((T/M)^2,), through
`fox_numba.device.launch.launch_tiles`; wgrad_reduce is 1-D over K*N + N elements (`launch`).
Thread tile: the thread's M x M outputs are (M/4)^2 sub-tiles of 4x4, T/(M/4) apart: rows
4*ty + i (+ T/2 when M = 8), columns 4*tx + j (likewise). A warp's lanes are 8 tx by 4 ty, so every
shared-memory fragment read of a warp spans at most 128 contiguous bytes (one wavefront, no conflict);
the four floats a thread reads per sub-tile are one aligned 16-byte quad and compile to one
ld.shared.v4.
Shared memory: per operand two buffers of BK rows x (1 + T/4) quads, the reduction index first. Operand
tiles that are contiguous along the reduction in global memory (x in the forward pass; dy and w in the
backward-input pass) are stored transposed; the padding quad spreads those stores over all banks.
Global loads: consecutive threads read consecutive addresses (full 32-byte sectors).
Main loop (double buffering, one barrier per step): load reduction tile t+1 from global memory into
registers, multiply tile t out of shared memory, store tile t+1 into the other buffer, syncthreads.
Registers (ptxas, sm_90): 115-126 for 128x8, 61-64 for 64x4, no spills and no local memory; the launch
bounds (threads, blocks_per_sm) cap them so that 2 (128x8) or 4 (64x4) blocks stay resident per SM.
Determinism: every output element is one thread's chain of fused multiply-adds over the reduction in
index order, starting from 0, so the result depends on no configuration (all builds give the same bits)
and on no scheduling. The weight gradient splits the batch into fixed chunks; each split sums its rows
in order and wgrad_reduce adds the splits in order. No atomics anywhere.
Constraints: float32, C-contiguous 2-D arrays (pw 3-D); flags and counts int32; out-of-range rows and
columns are zero-filled on load and skipped on store, so any sizes work. `chunk` (rows per split) is a
multiple of BK, so a split's last reduction tile never reaches into the next split.
Simulator caveats kept here: float32(0) literals (a bare 0.0 computes in float64 on the GPU), one
`cuda.shared.array` per source line (two on a line alias in the simulator), no alignment argument and no
launch bounds (the simulator refuses both), no negative indices (every index is built from unsigned
parts, which also spares the GPU numba's negative-index wraparound code).
"""

from typing import Any, NamedTuple

from numba import cuda, float32, int32, uint32

from fox_numba.device.registry import register
from fox_numba.device.runtime import SIMULATOR

BK = 8  # reduction depth of one shared-memory tile
# Shared rows are 16-byte quads, (2, BK, 1 + T/4, 4) arrays. The padding quad leads the row, so a
# thread's four fragment reads are constant offsets from one aligned address and the compiler fuses
# them into one ld.shared.v4 (at quad 0 LLVM writes the offsets as `or`, which defeats the fusion).
SMEM_ALIGN = None if SIMULATOR else 16

_F1 = float32[::1]
_F2 = float32[:, ::1]
_F3 = float32[:, :, ::1]


class Config(NamedTuple):
    """A block tile of `tile` x `tile` outputs, `micro` x `micro` per thread (the thread count's measure; the
    tensor-core kernels of kernels/gemm_tensor.py, `precision` 'tf32' or 'bf16', hold theirs as mma fragments)."""

    tile: int
    micro: int
    blocks_per_sm: int  # the residency the launch bounds ask for (caps registers at 64K / (threads * it))
    precision: str = "fp32"

    @property
    def name(self) -> str:
        if self.precision == "fp32":
            return f"{self.tile}x{self.micro}"
        # the tensor-core kernels' first geometry (kernels/gemm_tensor.GEOMETRIES) is named by its format alone
        return self.precision if self.tile == 128 else f"{self.precision}_{self.tile}"

    @property
    def threads(self) -> int:
        return (self.tile // self.micro) ** 2


CONFIGS = {c.name: c for c in (Config(128, 8, 2), Config(64, 4, 4))}


class GemmKernels(NamedTuple):
    """The kernels built for one configuration."""

    config: Config
    fwd: Any
    bwd_in: Any
    wgrad: Any


def _named(fn, name):
    """Give a generated kernel's Python function its module-level name (the registry keys on it)."""
    fn.__name__ = name
    fn.__qualname__ = name
    return fn


def _build(cfg):
    """The three GEMM kernels of one configuration (closures over its compile-time constants)."""
    tile, micro, threads = cfg.tile, cfg.micro, cfg.threads
    subs = micro // 4  # 4x4 sub-tiles per dimension of a thread's micro-tile
    sub_step = tile // subs  # distance between a thread's sub-tiles, in elements
    loads = tile * BK // threads  # elements of one operand tile loaded by each thread
    t_stride = threads // BK  # row step of a transposed tile load
    d_stride = threads // tile  # row step of a direct tile load
    warps_x = tile // (8 * micro)  # warps side by side along the columns (8 tx each)
    quads = 1 + tile // 4

    @cuda.jit(device=True)
    def thread_coords(tid):
        """(ty, tx): the thread's micro-tile starts at row 4*ty and column 4*tx of the block tile."""
        warp = tid // 32
        lane = tid % 32
        tx = (warp % warps_x) * 8 + lane % 8
        ty = (warp // warps_x) * 4 + lane // 8
        return ty, tx

    @cuda.jit(device=True)
    def fetch(src, transposed, fixed, k, k_end, tid, regs):
        """Registers <- one operand tile at reduction offset k: src[fixed : fixed+tile, k : k+BK] when
        `transposed` (src contiguous along the reduction), else src[k : k+BK, fixed : fixed+tile]; zero past the
        source and at reduction indices from k_end on."""
        n_rows, n_cols = src.shape
        if transposed:
            c = k + tid % BK
            r = fixed + tid // BK
            step = t_stride
            n_cols = min(n_cols, k_end)
        else:
            c = fixed + tid % tile
            r = k + tid // tile
            step = d_stride
            n_rows = min(n_rows, k_end)
        for q in range(loads):
            rq = r + q * step
            v = float32(0)
            if rq < n_rows and c < n_cols:
                v = src[rq, c]
            regs[q] = v

    @cuda.jit(device=True)
    def store(dst, transposed, buf, tid, regs):
        """dst[buf, reduction index, output index] <- the registers of `fetch`."""
        for q in range(loads):
            if transposed:
                o = tid // BK + q * t_stride
                dst[buf, tid % BK, 1 + o // 4, o % 4] = regs[q]
            else:
                o = tid % tile
                dst[buf, tid // tile + q * d_stride, 1 + o // 4, o % 4] = regs[q]

    @cuda.jit(device=True)
    def read4(src, buf, k, q, dst, d):
        """dst[d : d+4] = the 16-byte quad src[buf, k, 1 + q] (one vector load: the quad is aligned)."""
        dst[d] = src[buf, k, 1 + q, 0]
        dst[d + 1] = src[buf, k, 1 + q, 1]
        dst[d + 2] = src[buf, k, 1 + q, 2]
        dst[d + 3] = src[buf, k, 1 + q, 3]

    @cuda.jit(device=True)
    def fragments(s_tile, buf, k, q0, dst):
        """dst = the thread's micro-tile slice of row k of a shared tile (its sub-tiles' quads)."""
        for s in range(subs):
            read4(s_tile, buf, k, q0 + s * (sub_step // 4), dst, 4 * s)

    @cuda.jit(device=True)
    def product(a_src, a_t, a_fixed, b_src, b_t, b_fixed, k0, k1, ty, tx, acc, sums, do_sums):
        """acc = A @ B over the reduction [k0, k1) for the thread's micro-tile, in index order; with
        `do_sums`, sums = the column sums of B over the same rows (the bias gradient)."""
        a_s = cuda.shared.array((2, BK, quads, 4), float32, SMEM_ALIGN)
        b_s = cuda.shared.array((2, BK, quads, 4), float32, SMEM_ALIGN)
        a = cuda.local.array(micro, float32)
        b = cuda.local.array(micro, float32)
        ra = cuda.local.array(loads, float32)
        rb = cuda.local.array(loads, float32)
        tid = uint32(cuda.threadIdx.x)
        for i in range(micro):
            sums[i] = float32(0)
            for j in range(micro):
                acc[i, j] = float32(0)
        n_steps = (k1 - k0 + BK - 1) // BK
        fetch(a_src, a_t, a_fixed, k0, k1, tid, ra)
        fetch(b_src, b_t, b_fixed, k0, k1, tid, rb)
        store(a_s, a_t, 0, tid, ra)
        store(b_s, b_t, 0, tid, rb)
        cuda.syncthreads()
        for t in range(n_steps):
            buf = uint32(t) % 2
            more = t + 1 < n_steps
            if more:
                fetch(a_src, a_t, a_fixed, k0 + (t + 1) * BK, k1, tid, ra)
                fetch(b_src, b_t, b_fixed, k0 + (t + 1) * BK, k1, tid, rb)
            for kk in range(BK):
                k = uint32(kk)
                fragments(a_s, buf, k, ty, a)
                fragments(b_s, buf, k, tx, b)
                for i in range(micro):
                    for j in range(micro):
                        acc[i, j] += a[i] * b[j]
                if do_sums:
                    for j in range(micro):
                        sums[j] += b[j]
            if more:
                store(a_s, a_t, buf ^ 1, tid, ra)
                store(b_s, b_t, buf ^ 1, tid, rb)
            cuda.syncthreads()

    @cuda.jit(device=True)
    def out_index(origin, t, i):
        """Block-tile origin + the thread's i-th output row (or column) of its micro-tile."""
        return origin + 4 * t + (i // 4) * sub_step + i % 4

    def linear_fwd(x, w, b, y, relu):
        """y = x @ w + b, then max(y, 0) when relu != 0."""
        acc = cuda.local.array((micro, micro), float32)
        unused = cuda.local.array(micro, float32)
        row0 = uint32(cuda.blockIdx.y) * tile
        col0 = uint32(cuda.blockIdx.x) * tile
        ty, tx = thread_coords(uint32(cuda.threadIdx.x))
        product(x, True, row0, w, False, col0, 0, x.shape[1], ty, tx, acc, unused, False)
        n_rows, n_cols = y.shape
        for j in range(micro):
            cj = out_index(col0, tx, j)
            if cj < n_cols:
                bj = b[cj]
                for i in range(micro):
                    ri = out_index(row0, ty, i)
                    if ri < n_rows:
                        v = acc[i, j] + bj
                        if relu != 0 and v < float32(0):
                            v = float32(0)
                        y[ri, cj] = v

    def linear_bwd_in(dy, w, act, dx, mask, k_len):
        """dx = dy[:, :k_len] @ w[:, :k_len]^T, zeroed where act <= 0 when mask != 0 (act is not read when
        mask == 0)."""
        acc = cuda.local.array((micro, micro), float32)
        unused = cuda.local.array(micro, float32)
        row0 = uint32(cuda.blockIdx.y) * tile
        col0 = uint32(cuda.blockIdx.x) * tile
        ty, tx = thread_coords(uint32(cuda.threadIdx.x))
        product(dy, True, row0, w, True, col0, 0, k_len, ty, tx, acc, unused, False)
        n_rows, n_cols = dx.shape
        for i in range(micro):
            ri = out_index(row0, ty, i)
            if ri < n_rows:
                for j in range(micro):
                    cj = out_index(col0, tx, j)
                    if cj < n_cols:
                        v = acc[i, j]
                        if mask != 0 and not act[ri, cj] > float32(0):
                            v = float32(0)
                        dx[ri, cj] = v

    def linear_wgrad(x, dy, pw, pb, chunk):
        """pw[s] = x[rows]^T @ dy[rows], rows = [s*chunk, (s+1)*chunk) for split s = blockIdx.z; the
        blocks of the first row of tiles also write pb[s] = dy[rows] summed over the rows."""
        acc = cuda.local.array((micro, micro), float32)
        sums = cuda.local.array(micro, float32)
        row0 = uint32(cuda.blockIdx.y) * tile
        col0 = uint32(cuda.blockIdx.x) * tile
        split = uint32(cuda.blockIdx.z)
        ty, tx = thread_coords(uint32(cuda.threadIdx.x))
        start = split * chunk
        stop = min(start + chunk, x.shape[0])
        do_sums = row0 == 0 and ty == 0  # these threads' columns cover the block tile once
        product(x, False, row0, dy, False, col0, start, stop, ty, tx, acc, sums, do_sums)
        n_rows = pw.shape[1]
        n_cols = pw.shape[2]
        for i in range(micro):
            ri = out_index(row0, ty, i)
            if ri < n_rows:
                for j in range(micro):
                    cj = out_index(col0, tx, j)
                    if cj < n_cols:
                        pw[split, ri, cj] = acc[i, j]
        if do_sums:
            for j in range(micro):
                cj = out_index(col0, tx, j)
                if cj < n_cols:
                    pb[split, cj] = sums[j]

    def kernel(fn, name, sig):
        options = {} if SIMULATOR else {"launch_bounds": (threads, cfg.blocks_per_sm)}
        return register(sig)(cuda.jit(**options)(_named(fn, f"{name}_{cfg.name}")))

    return GemmKernels(
        cfg,
        kernel(linear_fwd, "linear_fwd", (_F2, _F2, _F1, _F2, int32)),
        kernel(linear_bwd_in, "linear_bwd_in", (_F2, _F2, _F2, _F2, int32, int32)),
        kernel(linear_wgrad, "linear_wgrad", (_F2, _F2, _F3, _F2, int32)),
    )


linear_fwd_128x8, linear_bwd_in_128x8, linear_wgrad_128x8 = (GEMM_128x8 := _build(CONFIGS["128x8"]))[1:]
linear_fwd_64x4, linear_bwd_in_64x4, linear_wgrad_64x4 = (GEMM_64x4 := _build(CONFIGS["64x4"]))[1:]
GEMMS = {g.config.name: g for g in (GEMM_128x8, GEMM_64x4)}


@register((_F3, _F2, _F2, _F1, int32, int32))
@cuda.jit
def wgrad_reduce(pw, pb, dw, db, n_splits, n_cols):
    """dw = pw[0] + pw[1] + ... and db = pb[0] + pb[1] + ... over the first n_splits splits, in order, in the first
    n_cols columns (the rest of dw and db left as they are: the live head columns, agent/network.py)."""
    i = cuda.grid(1)
    n_rows = dw.shape[0]
    n_w = n_rows * n_cols
    if i < n_w:
        r = i // n_cols
        c = i % n_cols
        s = float32(0)
        for k in range(n_splits):
            s += pw[k, r, c]
        dw[r, c] = s
    elif i < n_w + n_cols:
        c = i - n_w
        s = float32(0)
        for k in range(n_splits):
            s += pb[k, c]
        db[c] = s
