"""Hindsight relabelling (env.hindsight_fraction > 0): the oracle's rule, read with the realised forward move.

The seed relabels transitions after the fact (its commits name the bar indices, HER source indices and reward
buffers it uploads) but is silent on the rule. Ours relabels at collect time, so every transition stays one the
environment really played: the relabelled action is stepped, and its reward and next state are real.

    hindsight_labels(mid, row_stop, train_stop, h, c_rt, labels)     once per fold: label[r] of every fold row
    relabel_directions(labels, row, port, actions, n_relabel)       each collect step, after action selection

Label of fold row r, with fwd = mid[r + h] - mid[r] (h = evaluation.probe_horizon_bars, the oracle's horizon;
c_rt = market.synthetic_oracle.oracle_threshold, the nominal round trip):

    NO_LABEL      r >= train_stop, or r + h >= row_stop[r] (past the day's end or at the purge start: on a
                  training row row_stop is min(day end, purge start)), or fwd is NaN
    LONG / SHORT  fwd > c_rt / fwd < -c_rt                    (enter or reverse: the move beats the costs)
    KEEP_LONG     0 < fwd <= c_rt                             (Hold while long, else Flat)
    KEEP_SHORT    -c_rt <= fwd < 0                            (Hold while short, else Flat)
    FLAT          fwd == 0

so with p the sign of the environment's position (port[i, PORT_POSITION]) the relabelled direction takes the
position to the side of the oracle's pos_m = sign(fwd) if |fwd| > c_rt, p if p * fwd > 0, else 0
(synthetic_oracle.oracle_positions with the realised move for the expected one; a test checks the identity).
The relabel overwrites the direction of environments 0 .. n_relabel - 1 where their row has a label;
magnitude, order type and urgency stay the policy's draw, except that Hold and Flat record magnitude 0
(actions.py). A policy's Hold or Flat already recorded magnitude 0, so a Long or Short relabelled from one
trades the Quarter magnitude. The conviction output of action selection is not changed.

Launch shapes: one thread per fold row (labels), one per relabelled environment (relabel); no barriers.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda, float32, float64, int32

from fox_numba.actions import FLAT, HOLD, LONG, N_BRANCHES, N_DIRECTIONS, SHORT
from fox_numba.device.launch import check_array, i32, launch
from fox_numba.device.registry import register
from fox_numba.observation import N_PORTFOLIO, PORT_POSITION

NO_LABEL = -1
"""No forward target: the environment keeps the policy's direction."""
KEEP_LONG = N_DIRECTIONS
"""Inside the cost band, the move up: Hold while long, else Flat."""
KEEP_SHORT = N_DIRECTIONS + 1
"""Inside the cost band, the move down: Hold while short, else Flat."""

_I1, _I2, _F2, _D1 = int32[::1], int32[:, ::1], float32[:, ::1], float64[::1]


@register((_D1, _I1, int32, int32, float64, _I1))
@cuda.jit
def hindsight_labels_kernel(mid, row_stop, train_stop, horizon, threshold, labels):
    """labels[r] of the module header, one thread per fold row."""
    r = cuda.grid(1)
    if r >= labels.shape[0]:
        return
    label = NO_LABEL
    if r < train_stop and r + horizon < row_stop[r]:
        fwd = mid[r + horizon] - mid[r]
        if fwd > threshold:
            label = LONG
        elif fwd < -threshold:
            label = SHORT
        elif fwd > 0.0:
            label = KEEP_LONG
        elif fwd < 0.0:
            label = KEEP_SHORT
        elif fwd == 0.0:
            label = FLAT
    labels[r] = label


@register((_I1, _I1, _F2, int32, _I2))
@cuda.jit
def hindsight_relabel_kernel(labels, row, port, n_relabel, actions):
    """Environment i < n_relabel: its direction from labels[row[i]] and its position (module header)."""
    i = cuda.grid(1)
    if i >= n_relabel:
        return
    label = labels[row[i]]
    if label == NO_LABEL:
        return
    direction = label
    if label == KEEP_LONG:
        direction = HOLD if port[i, PORT_POSITION] > 0 else FLAT
    elif label == KEEP_SHORT:
        direction = HOLD if port[i, PORT_POSITION] < 0 else FLAT
    actions[i, 0] = direction
    if direction == HOLD or direction == FLAT:
        actions[i, 1] = 0


def hindsight_labels(mid: Any, row_stop: Any, train_stop: int, horizon: int, threshold: float, labels: Any, *,
                     stream: Any) -> None:
    """labels int32 [n] of the fold's rows from mid float64 [n] and row_stop int32 [n] (FoldMarketDevice), the
    purge start `train_stop`, `horizon` bars (>= 1) and the round trip `threshold` (price units, >= 0)."""
    n = int(mid.shape[0])
    check_array("mid", mid, "[n]", (n,), np.float64)
    check_array("row_stop", row_stop, "[n]", (n,), np.int32)
    check_array("labels", labels, "[n]", (n,), np.int32)
    if horizon < 1 or not threshold >= 0.0:
        raise ValueError(f"hindsight labels need horizon >= 1 and threshold >= 0, got {horizon} and {threshold}")
    launch(hindsight_labels_kernel, n, mid, row_stop, i32(train_stop), i32(horizon), np.float64(threshold), labels,
           stream=stream)  # fmt: skip


def relabel_directions(labels: Any, row: Any, port: Any, actions: Any, n_relabel: int, *, stream: Any) -> None:
    """The hindsight direction of environments 0 .. n_relabel - 1 into actions int32 [N, 4] in place (row int32
    [N], port float32 [N, N_PORTFOLIO], labels from `hindsight_labels`); graph-safe, 1 <= n_relabel <= N."""
    n = int(row.shape[0])
    check_array("labels", labels, "[n_rows]", None, np.int32)
    check_array("row", row, "[N]", (n,), np.int32)
    check_array("port", port, "[N, N_PORTFOLIO]", (n, N_PORTFOLIO))
    check_array("actions", actions, "[N, N_BRANCHES]", (n, N_BRANCHES), np.int32)
    if not 1 <= n_relabel <= n:
        raise ValueError(f"n_relabel = {n_relabel}: relabel 1 .. {n} environments")
    launch(hindsight_relabel_kernel, n_relabel, labels, row, port, i32(n_relabel), actions, stream=stream)
