"""Device helpers that walk the head rows of [samples, 13, Z] logits in shared-memory staging loops.

A block stages the 13 * Z atoms of a run of consecutive samples as one flat run of floats; a thread walks it in
steps of the block size, keeping (head row, atom) in the mixed radix of rows of Z atoms, so no step divides.
`stage_combined_heads` stages the same rows from the head GEMM's output [samples, head_width(Z)] instead, forming
the dueling combine in shared memory (kernels/heads.py's arithmetic, the same bits), so the [samples, 13, Z] logits
never go through global memory. Used by action selection (kernels/action_select.py) and the learner's fused C51
rows (kernels/learner.py); `combined_heads_stager(live)` builds the same for the first `live` branches alone (the
learner of a network with live branches, agent/network.py).

Shared-memory budget (both users size their arrays from the constants here): a block stages at most STAGE_SAMPLES
(8) samples, 13 advantage rows each in STAGE_WORDS floats and 4 value rows in VALUE_WORDS, at the odd stride Z | 1,
sized exactly for Z = 51 (27,744 B together). The learner's select_q_rows adds 416 B of its own (its a* array,
learner.SELECT_ROWS) and the driver reserves 1,024 B per block: 29,184 B, so eight of its blocks fit an sm_90 SM's
228 KiB (233,472 B, exactly; with the former stride-52 padding, 29,440 B, seven did). At batch 8,192 its 1,024 blocks are then one wave on 132 SMs x 8 instead of
1.1 waves, whose second wave ran 100 blocks for a whole block's time.
"""

from typing import Any

import numpy as np
from numba import cuda, float32

from fox_numba.actions import BRANCHES, N_BRANCHES, N_HEADS
from fox_numba.device.runtime import u32
from fox_numba.kernels.heads import MAX_BRANCH_SIZE, branch_span, live_streams, stream_branch

STAGE_SAMPLES = 8  # samples a block stages at most
STAGE_WORDS = STAGE_SAMPLES * N_HEADS * 51  # 21.2 KB: 8 samples' 13 advantage rows at Z = 51 (odd stride 51)
VALUE_WORDS = STAGE_SAMPLES * N_BRANCHES * 51  # 6.5 KB: their 4 value rows
MAX_ATOMS = max(z for z in range(2, STAGE_WORDS) if N_HEADS * (z | 1) <= STAGE_WORDS)  # 407: one sample a block
# The walks below index in uint32: numba types Python ints as int64 and promotes int32 arithmetic to it, and a
# signed index also costs a negative-index wrap per access, so every staged element paid ~70 64-bit PTX operations
# of index arithmetic. Unsigned 32-bit values, re-wrapped after each operation (u32(a + b), device/runtime.py: numba's
# uint32 cast on the GPU, where LLVM narrows the 64-bit operation back), need no wrap and no 64-bit multiply; every
# index here is far below 2**32.
_NH = np.uint32(N_HEADS)


def stage_samples(n_atoms: int) -> int:
    """Samples one block stages at Z = n_atoms: as many as STAGE_WORDS holds, at most STAGE_SAMPLES (VALUE_WORDS then
    holds their value rows: both are sized for the same samples at the same stride)."""
    return min(STAGE_SAMPLES, STAGE_WORDS // (N_HEADS * (n_atoms | 1)))


@cuda.jit(device=True)
def carry(row, j, d_row, d_j, n_atoms):
    """(row, j) + (d_row, d_j) in the mixed radix of rows of n_atoms atoms (d_j < n_atoms), in uint32."""
    j = u32(j + d_j)
    row = u32(row + d_row)
    if j >= n_atoms:
        j = u32(j - n_atoms)
        row = u32(row + u32(1))
    return row, j


@cuda.jit(device=True)
def walk_start(tid, threads, n_atoms):
    """(d_row, d_j, row, j), uint32: the step of a block of `threads` threads and thread tid's first (row, atom) in
    the mixed radix of rows of n_atoms atoms."""
    z = u32(n_atoms)
    t = u32(threads)
    i = u32(tid)
    d_row = u32(t // z)
    row = u32(i // z)
    return d_row, u32(t - d_row * z), row, u32(i - row * z)


@cuda.jit(device=True)
def staged_row(src, first, row, j):
    """Atom j of head row `row` counted from sample `first`: src[first + row // 13, row % 13, j]."""
    sample = u32(row // _NH)
    return src[u32(first + sample), u32(row - sample * _NH), j]


def live_heads(live: int) -> int:
    """Heads of the first `live` branches (they lead the 13: actions.BRANCHES' offsets)."""
    return N_HEADS if live >= N_BRANCHES else BRANCHES[live].offset


def combined_heads_stager(live: int, *, compact: bool = False) -> Any:
    """`stage_combined_heads` for the first `live` branches (compile-time constants: heads.live_streams(live)
    streams per sample, `live` branch rows per sample): the other heads' staged rows are neither loaded nor
    formed (agent/network.py's live branches: their logits are 0, and the learner's select_q_rows takes their
    statistics from a table instead). `compact`: a sample's staged rows are its live heads alone, sample s's head h
    at row s * live_heads(live) + h and its branch b's value at row s * live + b, so that a block's shared memory
    holds 13 / live_heads(live) times as many samples (the same values, staged by the same arithmetic)."""
    n_streams = np.uint32(live_streams(live))
    n_live = np.uint32(live)
    row_heads = np.uint32(live_heads(live) if compact else N_HEADS)  # staged head rows a sample
    row_values = np.uint32(live if compact else N_BRANCHES)  # staged value rows a sample

    @cuda.jit(device=True)
    def stream_atom(head, first, row, j, n_atoms):
        """Atom j of stream row `row` counted from sample `first` of the head GEMM's output rows head: stream
        row % n_streams (branch by branch, each value then its advantages: heads.N_STREAMS) of sample first +
        row // n_streams."""
        sample = u32(row // n_streams)
        return head[u32(first + sample), u32(u32(row - sample * n_streams) * n_atoms + j)]

    @cuda.jit(device=True)
    def put_stream(stage, values, row, j, stride, x):
        """Stream row `row` (as `stream_atom`) staged: branch b's value stream into `values` [(s * 4 + b) * stride +
        j], head h's advantage stream into its row of `stage` [(s * 13 + h) * stride + j] (h = stream - b - 1; 4 and
        13 are live and live_heads(live) when compact)."""
        sample = u32(row // n_streams)
        s = u32(row - sample * n_streams)
        b = u32(stream_branch(s))
        off, _ = branch_span(b)
        if s == u32(off + b):
            values[u32(u32(sample * row_values + b) * stride + j)] = x
        else:
            stage[u32(u32(sample * row_heads + u32(s - b - u32(1))) * stride + j)] = x

    @cuda.jit(device=True)
    def stage_combined_heads(head, first, count, stage, values, stride, tid, threads, n_atoms):
        """stage[(s * 13 + h) * stride + j] = logits[first + s, h, j] for s < count and the live branches' heads h,
        combined from the head GEMM's output rows `head`: one coalesced copy of the samples' live stream columns
        (consecutive threads at consecutive atoms, four loads in flight per thread; `put_stream`), a barrier, then
        per (sample, live branch, atom) the branch's mean and V + (A - mean) in place, dueling_combine_fwd's
        float32 operations in its order (the same bits). The caller's barrier follows."""
        z = u32(n_atoms)
        stride = u32(stride)
        rows = u32(count * n_streams)
        d_row, d_j, row, j = walk_start(tid, threads, z)
        while row < rows:
            row1, j1 = carry(row, j, d_row, d_j, z)
            row2, j2 = carry(row1, j1, d_row, d_j, z)
            row3, j3 = carry(row2, j2, d_row, d_j, z)
            x0 = stream_atom(head, first, row, j, z)
            x1 = float32(0.0)
            x2 = float32(0.0)
            x3 = float32(0.0)
            if row1 < rows:
                x1 = stream_atom(head, first, row1, j1, z)
            if row2 < rows:
                x2 = stream_atom(head, first, row2, j2, z)
            if row3 < rows:
                x3 = stream_atom(head, first, row3, j3, z)
            put_stream(stage, values, row, j, stride, x0)
            if row1 < rows:
                put_stream(stage, values, row1, j1, stride, x1)
            if row2 < rows:
                put_stream(stage, values, row2, j2, stride, x2)
            if row3 < rows:
                put_stream(stage, values, row3, j3, stride, x3)
            row, j = carry(row3, j3, d_row, d_j, z)
        cuda.syncthreads()
        rows = u32(count * n_live)  # live branch rows sample * live + b, walked without a division per step
        d_row, d_j, row, j = walk_start(tid, threads, z)
        while row < rows:
            sample = u32(row // n_live)
            b = u32(row - sample * n_live)
            off, size = branch_span(b)
            at = u32(u32(sample * row_heads + u32(off)) * stride + j)
            mean = float32(0.0)
            for k in range(MAX_BRANCH_SIZE):
                if k < size:
                    mean += stage[u32(at + u32(k) * stride)]
            mean = mean / float32(size)
            v = values[u32(u32(sample * row_values + b) * stride + j)]
            for k in range(MAX_BRANCH_SIZE):
                if k < size:
                    at_k = u32(at + u32(k) * stride)
                    stage[at_k] = v + (stage[at_k] - mean)
            row, j = carry(row, j, d_row, d_j, z)

    return stage_combined_heads


stage_combined_heads = combined_heads_stager(N_BRANCHES)
"""Every head's staged row (action selection; the learner with every branch live)."""
