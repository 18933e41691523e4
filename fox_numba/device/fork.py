"""Side streams: work of a step that may run beside the step stream's, ordered by events alone.

`fork(main)` returns the side stream after everything queued on `main` so far; `join(main)` makes `main` wait
for everything queued on the side. A captured graph keeps both as edges (no nodes), so the side's kernels
become a branch the GPU runs beside the main chain: a GEMM that fills part of the GPU (the head's weight gradient,
72 blocks on 132 SMs at batch 8192) shares it with the next one instead of leaving it idle.
The work put on a side stream must neither read what the main stream writes before the join nor write what it
reads: the callers say why theirs does not. Results stay bit-identical, since no kernel's arithmetic depends on
when it runs (no atomics between the two lanes). Under the simulator every launch runs at once, in program order.
Inside a step body the active `LaunchTrace` records each launch's lane and refuses a side left unjoined
(`device/graphs.py`) or launched on after its join. Under the per-kernel timer (`device/timing.py` kernels())
outside a step body, `fork` returns the main stream: each kernel's event pair then times it alone.
"""

from __future__ import annotations

from typing import Any

from fox_numba.device import timing
from fox_numba.device.launch import active_trace
from fox_numba.device.runtime import new_stream, sync_event


class SideStream:
    """A stream forked from and joined back into a step's stream (one per overlapping part, made once: a graph
    keeps its handle)."""

    def __init__(self) -> None:
        self.stream = new_stream()
        self._forked = sync_event()
        self._joined = sync_event()

    def fork(self, main: Any) -> Any:
        """The side stream, ordered after every launch queued on `main` so far (and its own earlier work)."""
        trace = active_trace()
        if trace is not None:
            trace.fork(self.stream)
        elif timing.active_kernel_timer() is not None:
            return main
        self._forked.record(main)
        self._forked.wait(self.stream)
        return self.stream

    def join(self, main: Any) -> None:
        """`main` waits for every launch queued on the side stream so far."""
        trace = active_trace()
        if trace is not None:
            trace.join(self.stream)
        self._joined.record(self.stream)
        self._joined.wait(main)
