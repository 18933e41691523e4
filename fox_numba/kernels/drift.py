"""The Q-drift rate producer: once per epoch, how far the epoch's mean E[Q] moved, relative to its scale.

    ISV[Q_DRIFT_RATE] = clip(|q(t) - q(t-1)| / max(|q(t-1)|, ISV[Q_ABS_REF] + ISV[Q_DIR_ABS_REF], 1e-6), 0, 4)
    ISV[Q_EPOCH_MEAN_PREV] = q(t)                                   (the baseline of the next epoch)

t counts epochs; q(t-1) is ISV[Q_EPOCH_MEAN_PREV]. The rate is left as it was when |q(t-1)| <= 1e-6 (the
first epoch of a fold: the fold reset writes 0 to both slots, so the first epoch only sets the baseline).
A non-finite q(t) changes neither slot (the kill criteria end the fold on it). The consumer is the Polyak
rate: tau_eff = scheduled tau / (1 + ISV[Q_DRIFT_RATE]), in [tau_base / 5, tau_base].

Worked example (the seed's Plan C fold 0, epoch 2): q(t-1) = -0.018, q(t) = 0.82, ISV[16] + ISV[21] = 0.1:
|0.838| / max(0.018, 0.1, 1e-6) = 8.38, clipped to 4 (tau_eff = tau_base / 5); a run whose q stays at 0.21
gets 0 (tau unchanged).

Launch shape: one thread (`launch_rows(.., 1, 1, ..)`), a cold-path producer run after the host's Q-drift
kill check, outside the captured training graph. q(t) is read from a device float32[1] (the learner's epoch
reduction, or a mapped scalar the host wrote): the value stays on the GPU. Float32 literals throughout.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import cuda, float32

from fox_numba.device.isv import ISV_TOTAL_DIM, Isv
from fox_numba.device.launch import check_array, launch_rows
from fox_numba.device.registry import register

RATE_MAX = np.float32(4.0)  # tau_eff >= tau_base / (1 + RATE_MAX)
PREV_MIN = np.float32(1e-6)  # |q(t-1)| at or below this: no rate (cold start)
DENOM_MIN = np.float32(1e-6)  # the seed's floor; |q(t-1)| > PREV_MIN already keeps the denominator above it

_PREV = int(Isv.Q_EPOCH_MEAN_PREV)
_RATE = int(Isv.Q_DRIFT_RATE)
_Q_ABS = int(Isv.Q_ABS_REF)
_Q_DIR_ABS = int(Isv.Q_DIR_ABS_REF)


@register((float32[::1], float32[::1]))
@cuda.jit
def q_drift_rate_producer(isv, q_epoch_mean):
    """ISV[Q_DRIFT_RATE] from q(t) = q_epoch_mean[0] and q(t-1) = ISV[Q_EPOCH_MEAN_PREV], then the baseline."""
    q = q_epoch_mean[0]
    if math.isinf(q) or math.isnan(q):
        return
    prev = isv[_PREV]
    if abs(prev) > PREV_MIN:
        denom = max(abs(prev), isv[_Q_ABS] + isv[_Q_DIR_ABS], DENOM_MIN)
        isv[_RATE] = min(max(abs(q - prev) / denom, float32(0.0)), RATE_MAX)
    isv[_PREV] = q


def update_q_drift_rate(isv: Any, q_epoch_mean: Any, *, stream: Any) -> None:
    """Run the producer once (per epoch): `isv` float32[ISV_TOTAL_DIM], `q_epoch_mean` float32[1] on the device."""
    check_array("isv", isv, "[ISV_TOTAL_DIM]", (ISV_TOTAL_DIM,))
    check_array("q_epoch_mean", q_epoch_mean, "[1]", (1,))
    launch_rows(q_drift_rate_producer, 1, 1, isv, q_epoch_mean, stream=stream)
