"""Per-step records of the validation backtest: each evaluation environment's PnL and position per step.

The evaluator replays one captured step (observe -> forward -> argmax E[Q] -> env step -> record), so the
step index the record writes at cannot be a kernel argument: it lives in a device counter that
`advance_step` increments after `record_step` has read it (two launches, so no thread of the record reads
a counter another thread already moved).

Launch shapes: record_step 1-D, one thread per environment (`env.thread_block`); advance_step one thread.
record_step writes pnl[t, i] = comps[COMP_PNL, i] * risk_unit (dollars, net of costs: the equity change
of the step that acted at bar t of window i) and pos[t, i] = the position after the step; steps past the
end of a window (the environment is frozen) record 0 and the final, flat position.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda, float32, float64, int32

from fox_numba.device.launch import check_array, launch, launch_rows
from fox_numba.device.registry import register
from fox_numba.kernels.env import COMP_PNL, N_COMPS, N_PARAMS, N_SI, PRM_RISK_UNIT, SI_POS, thread_block


@register((float32[:, ::1], int32[:, ::1], float64[::1], int32[::1], float32[:, ::1], int32[:, ::1]))
@cuda.jit
def record_step(comps, si, params, counter, pnl, pos):
    """pnl[t, i] = comps[COMP_PNL, i] * risk unit, pos[t, i] = si[SI_POS, i], t = counter[0] (if t < rows)."""
    i = cuda.grid(1)
    t = counter[0]
    if i < comps.shape[1] and t < pnl.shape[0]:
        pnl[t, i] = float32(float64(comps[COMP_PNL, i]) * params[PRM_RISK_UNIT])
        pos[t, i] = si[SI_POS, i]


@register((int32[::1],))
@cuda.jit
def advance_step(counter):
    """counter[0] += 1 (one thread, after record_step)."""
    if cuda.grid(1) == 0:
        counter[0] += 1


def record_eval_step(comps: Any, si: Any, params: Any, counter: Any, pnl: Any, pos: Any, *, stream: Any) -> None:
    """Record the last env step of N environments at step counter[0] of pnl / pos [T, N], then advance it."""
    n = comps.shape[1]
    t = pnl.shape[0]
    check_array("comps", comps, "[N_COMPS, N]", (N_COMPS, n))
    check_array("si", si, "[N_SI, N]", (N_SI, n), np.int32)
    check_array("params", params, "[N_PARAMS]", (N_PARAMS,), np.float64)
    check_array("counter", counter, "[1]", (1,), np.int32)
    check_array("pnl", pnl, "[T, N]", (t, n))
    check_array("pos", pos, "[T, N]", (t, n), np.int32)
    launch(record_step, n, comps, si, params, counter, pnl, pos, stream=stream, block=thread_block(n))
    launch_rows(advance_step, 1, 1, counter, stream=stream)
