"""HEALTH_DIAG on the device: the snapshot record in mapped pinned memory, filled by kernels, formatted by the host.

    health = HealthDiag(stager)
    health.collect_step(actions, reward, stream=s)       after a collect phase: train histogram, magnitude stats
    health.eval_step(actions, counts, stream=s)          inside the evaluation graph: per-environment tallies
    health.eval_done(counts, stream=s)                   after a validation pass: the eval histogram
    health.snapshot(isv, optim_state, env_metrics, ...)  a captured graph: ISV mirror + finalise (+ the noisy
                                                         head's mean |sigma| per branch, from the parameters)
    line = health.line(fold=k, epoch=e, kill=...)        one synchronisation, then `format_line`

No per-sample buffer is copied to the host: the kernels reduce them into the mapped record and the host
reads only that record (after a synchronisation). The host writes only the fields it owns already (fold,
epoch, the kill criteria's state), as the layout table says (fox_numba/diag/layout.py, HEALTH_DIAG.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from fox_numba.actions import N_HEADS
from fox_numba.agent.network import ParamLayout
from fox_numba.agent.noisy import BIAS_SIGMA, WEIGHT_SIGMA
from fox_numba.device.elementwise import fill_u32
from fox_numba.device.graphs import StepGraph
from fox_numba.device.launch import i32, launch_strided
from fox_numba.device.memory import Mapped, device_zeros, words
from fox_numba.device.staging import Stager
from fox_numba.diag.layout import SNAPSHOT_DTYPE, format_line, mirror_table
from fox_numba.kernels.health_diag import (
    finalise_snapshot,
    histogram_actions,
    histogram_counts,
    mirror_isv,
    reduce_magnitude_stats,
    reduce_noisy_sigma,
    tally,
)


class HealthDiag:
    """The snapshot and the launches that fill it (module docstring)."""

    def __init__(self, stager: Stager) -> None:
        self.record = Mapped(1, SNAPSHOT_DTYPE)
        self.record.host.view(np.uint32)[:] = 0
        flat = words(self.record.device)
        self.snap_u, self.snap_f = flat, flat.view(np.float32)
        slots, wds = mirror_table()
        self.slots, self.words = stager.upload_new(slots), stager.upload_new(wds)
        self.stream = stager.stream
        self._graphs: dict[tuple[int, ...], StepGraph] = {}

    def collect_step(self, actions: Any, reward: Any, *, stream: Any) -> None:
        """The train action histogram and the per-magnitude win share / reward variance of one collect step."""
        histogram_actions(actions, self.snap_u, evaluation=False, accumulate=False, stream=stream)
        reduce_magnitude_stats(actions, reward, self.snap_f, stream=stream)

    @staticmethod
    def eval_counts(n: int, *, stream: Any) -> Any:
        """Per-environment head counts int32 [n, 13] for a validation pass (the evaluator owns them)."""
        return device_zeros((n, N_HEADS), np.int32, stream=stream)

    def eval_step(self, actions: Any, counts: Any, *, stream: Any) -> None:
        """Count one evaluation step's actions per environment (inside the evaluation graph)."""
        tally(actions, counts, stream=stream)

    def eval_done(self, counts: Any, *, stream: Any) -> None:
        """The eval histogram from a validation pass's counts, which start over at zero."""
        histogram_counts(counts, self.snap_u, stream=stream)
        w = words(counts)
        launch_strided(fill_u32, w.size, w, np.uint32(0), i32(w.size), stream=stream)

    def snapshot(
        self, isv: Any, optim_state: Any, env_metrics: Any, *, use_graph: bool,
        noisy: tuple[ParamLayout, Any] | None = None,
    ) -> None:
        """The ISV mirror and the finalise kernel, as one captured graph per set of source arrays; with
        `noisy` = (a noisy layout, its flat parameters) also the per-branch mean |sigma| (0 in the record without)."""
        key = tuple(id(a) for a in (isv, optim_state, env_metrics, *(noisy or ())))
        graph = self._graphs.get(key)
        if graph is None:
            views = None if noisy is None else noisy[0].views(noisy[1])
            sigma = None if views is None else (views[WEIGHT_SIGMA], views[BIAS_SIGMA])

            def body(s: Any) -> None:
                mirror_isv(isv, self.slots, self.words, self.snap_f, stream=s)
                finalise_snapshot(isv, optim_state, env_metrics, self.snap_f, self.snap_u, stream=s)
                if sigma is not None:
                    reduce_noisy_sigma(*sigma, self.snap_f, stream=s)

            graph = self._graphs[key] = StepGraph("health_diag.snapshot", body, self.stream, use_graph=use_graph)
        graph.replay()

    def line(self, *, fold: int, epoch: int, kill: Callable[[float, float], dict[str, float]] | None = None) -> str:
        """Wait for the kernels, write the host-owned fields and format the record as one HEALTH_DIAG line.
        `kill(q_abs_ref, q_dir_abs_ref)` gives the kill criteria's fields (walkforward/kill.py diag_fields)."""
        self.stream.synchronize()
        rec = self.record.host
        rec["fold"], rec["epoch"] = fold, epoch
        fields = kill(float(rec["q_abs_ref"][0]), float(rec["q_dir_abs_ref"][0])) if kill is not None else {}
        for name in ("kill_q_median", "kill_q_mad", "kill_q_floor"):
            rec[name] = fields.get(name, math.nan)
        rec["kill_collapse_epochs"] = int(fields.get("kill_collapse_epochs", 0))
        return format_line(rec[0])
