"""Device helpers that walk the head rows of [samples, 13, Z] logits in shared-memory staging loops.

A block stages the 13 * Z atoms of a run of consecutive samples as one flat run of floats; a thread walks it in
steps of the block size, keeping (head row, atom) in the mixed radix of rows of Z atoms, so no step divides.
Used by action selection (kernels/action_select.py) and the learner's fused C51 rows (kernels/learner.py).
"""

from numba import cuda

from fox_numba.actions import N_HEADS


@cuda.jit(device=True)
def carry(row, j, d_row, d_j, n_atoms):
    """(row, j) + (d_row, d_j) in the mixed radix of rows of n_atoms atoms (d_j < n_atoms)."""
    j += d_j
    row += d_row
    if j >= n_atoms:
        j -= n_atoms
        row += 1
    return row, j


@cuda.jit(device=True)
def staged_row(src, first, row, j):
    """Atom j of head row `row` counted from sample `first`: src[first + row // 13, row % 13, j]."""
    sample = row // N_HEADS
    return src[first + sample, row - sample * N_HEADS, j]

