"""A head start for timing eager launches: a busy kernel that holds the stream while the host enqueues.

An event pair around one eager launch on an idle GPU measures the host's launch cost as well as the kernel
(the start event fires at once, the kernel arrives a launch later, ~0.1 ms for a numba launch). Behind a
busy kernel, the host enqueues the launches to be timed while the GPU is still working; the GPU then runs
them back to back and each event pair brackets the kernel's own time.

    hold = StreamHold(stream)
    hold.timed(step_body, timings)   # the step's kernels timed into `timings`, launch cost excluded

Under the simulator, which has no timing events (its regions read the wall clock and synchronise), no hold
is launched and `timed` only times the body.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numba import cuda, int32, uint32

from fox_numba.device.launch import i32, launch
from fox_numba.device.memory import device_zeros
from fox_numba.device.registry import register
from fox_numba.device.rng import modular
from fox_numba.device.runtime import SIMULATOR
from fox_numba.device.timing import Timings


@modular
@cuda.jit(device=True)
def _lcg_step(v):  # type: ignore[no-untyped-def]
    """1664525 v + 1013904223 modulo 2**32 (the wrap is the generator's)."""
    return v * uint32(1664525) + uint32(1013904223)


@register((uint32[::1], int32))
@cuda.jit
def busy_lcg(x, iters):
    """One thread steps x[0] through `iters` rounds of the LCG x = 1664525 x + 1013904223 (mod 2^32): a
    chain of dependent integer multiply-adds that keeps the GPU busy for a predictable time."""
    if cuda.grid(1) == 0:
        v = x[0]
        for _ in range(iters):
            v = _lcg_step(v)
        x[0] = v


class StreamHold:
    """A busy kernel on a stream, ahead of launches to be timed (module docstring)."""

    MAX_ITERS = 1 << 30  # about two seconds of hold on an H200

    def __init__(self, stream: Any, iters: int = 1 << 22) -> None:
        self.stream, self.iters = stream, iters
        self.state = device_zeros(1, np.uint32, stream=stream)

    def hold(self) -> Any:
        """Enqueue the busy kernel; the returned event completes when the GPU has finished it."""
        launch(busy_lcg, 1, self.state, i32(self.iters), stream=self.stream)
        done = cuda.event(timing=False)
        done.record(self.stream)
        return done

    def timed(self, body: Callable[[Any], None], timings: Timings) -> None:
        """Run `body(stream)` with its kernels timed into `timings`, behind a hold that outlasts the host's
        enqueueing: a try whose hold had ended before `body` returned is discarded and retried with a hold
        twice as long."""
        if SIMULATOR:
            with timings.kernels():
                body(self.stream)
            return
        while True:
            step = Timings()
            done = self.hold()
            with step.kernels():
                body(self.stream)
            if not done.query():
                timings.merge(step)
                return
            step.stats()  # let the discarded try finish before the next
            if self.iters >= self.MAX_ITERS:
                raise RuntimeError(f"StreamHold: the host took longer to enqueue the body than {self.iters:,} "
                                   "busy rounds on the GPU")
            self.iters *= 2
