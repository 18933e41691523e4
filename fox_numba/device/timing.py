"""Timing of named regions and kernels: CUDA events on the GPU, the wall clock under the simulator.

    timings = Timings()
    with timings.region("train_step", stream):
        graph.replay()
    with timings.kernels():          # every launch helper call inside is timed under its kernel name
        step_body(stream)
    print(timings.markdown())

On the GPU a region records a pair of events on its stream and costs no synchronisation; the pairs are
resolved (one synchronisation) when `stats()` is read, so a timed window runs at full speed. Under the
simulator, which has no timing events, a region synchronises its stream and reads `time.perf_counter`.
Kernels launched while a graph is being captured are not timed (they run later, at replay): time the
replay as a region instead. Each name accumulates count, total, min and max in milliseconds.

On an idle GPU a kernel's event pair also holds the host's launch cost; fox_numba/device/hold.py times
eager kernels behind a busy kernel to leave it out.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from numba import cuda

from fox_numba.device.runtime import SIMULATOR

_RESOLVE_EVERY = 4096  # pending event pairs kept before they are resolved (bounds the events alive)


@dataclass
class Stat:
    """Accumulated timings of one name, in milliseconds."""

    count: int = 0
    total_ms: float = 0.0
    min_ms: float = math.inf
    max_ms: float = 0.0

    def add(self, ms: float) -> None:
        self.count += 1
        self.total_ms += ms
        self.min_ms = min(self.min_ms, ms)
        self.max_ms = max(self.max_ms, ms)

    @property
    def mean_ms(self) -> float:
        return self.total_ms / self.count if self.count else 0.0


class Timings:
    """Named timings; `use_events` defaults to CUDA events on the GPU and the wall clock otherwise."""

    def __init__(self, use_events: bool | None = None, *, by_grid: bool = False) -> None:
        """`by_grid`: `kernels()` names each launch by its kernel and grid ("name 7x128"), so one kernel launched
        on several shapes (the GEMMs of different layers) gets a row per shape."""
        self.use_events = (not SIMULATOR) if use_events is None else use_events
        self.by_grid = by_grid
        if self.use_events and SIMULATOR:
            raise ValueError("the CUDA simulator has no timing events")
        self._stats: dict[str, Stat] = {}
        self._pending: list[tuple[str, Any, Any]] = []

    @contextlib.contextmanager
    def region(self, name: str, stream: Any) -> Iterator[None]:
        """Time the work enqueued on `stream` inside the block (GPU time with events)."""
        if self.use_events:
            start, end = cuda.event(timing=True), cuda.event(timing=True)
            start.record(stream)
            yield
            end.record(stream)
            self._pending.append((name, start, end))
            if len(self._pending) >= _RESOLVE_EVERY:
                self._resolve()
        else:
            stream.synchronize()
            t0 = time.perf_counter()
            yield
            stream.synchronize()
            self._stats.setdefault(name, Stat()).add((time.perf_counter() - t0) * 1e3)

    @contextlib.contextmanager
    def kernels(self) -> Iterator[None]:
        """Time every launch made through the launch helpers inside the block, by kernel name."""
        token = _KERNEL_TIMER.set(self)
        try:
            yield
        finally:
            _KERNEL_TIMER.reset(token)

    def merge(self, other: Timings) -> None:
        """Add every timing of `other` (resolved) to this one's."""
        for name, st in other.stats().items():
            mine = self._stats.setdefault(name, Stat())
            mine.count += st.count
            mine.total_ms += st.total_ms
            mine.min_ms = min(mine.min_ms, st.min_ms)
            mine.max_ms = max(mine.max_ms, st.max_ms)

    def _resolve(self) -> None:
        for name, start, end in self._pending:
            end.synchronize()
            self._stats.setdefault(name, Stat()).add(cuda.event_elapsed_time(start, end))
        self._pending.clear()

    def stats(self) -> dict[str, Stat]:
        """Every name's accumulated timings (synchronises on pending events first)."""
        self._resolve()
        return dict(self._stats)

    def markdown(self) -> str:
        """A table of the timings, slowest total first."""
        rows = sorted(self.stats().items(), key=lambda kv: -kv[1].total_ms)
        clock = "CUDA events" if self.use_events else "wall clock"
        lines = [
            f"| region ({clock}) | count | total ms | mean ms | min ms | max ms |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for name, s in rows:
            lines.append(
                f"| {name} | {s.count} | {s.total_ms:.3f} | {s.mean_ms:.4f} | {s.min_ms:.4f} "
                f"| {s.max_ms:.4f} |"
            )
        return "\n".join(lines) + "\n"


_KERNEL_TIMER: ContextVar[Timings | None] = ContextVar("fox_kernel_timer", default=None)


def active_kernel_timer() -> Timings | None:
    """The `Timings` that times each launch helper call, set by `Timings.kernels()`, or None."""
    return _KERNEL_TIMER.get()
