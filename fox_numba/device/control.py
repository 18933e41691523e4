"""The control block: the per-step scalars that kernels inside a captured graph read from memory.

A captured graph freezes every kernel argument, so a value that changes from step to step (the step
counter, lr_sched, tau_eff, eps, the seed) can never be a kernel argument of a graph: the host
writes it into this block, and kernels read `ctl[0].lr_sched` from the block's device copy.

    ctl = ControlBlock()
    def body(stream):
        ctl.upload(stream)                       # first: refresh the device copy from the host record
        launch(polyak_update, n, target, online, ctl.device, i32(n), stream=stream)
    step = StepGraph("polyak", body, stream, use_graph=cfg.run.graphs)
    for t in range(steps):
        ctl.set(step=t, tau_eff=tau(t))          # waits until the last replay has read the block
        step.replay()

The host record is mapped pinned memory; `upload` launches a one-thread-per-word copy into a device
copy, so the step's kernels read device memory (a read of mapped memory crosses PCIe each time), and a
graph replay copies whatever the host wrote last. `set` first waits on a fence recorded after the last
launch that read the record, so the host never overwrites values a queued step has not read yet.
`StepGraph` refuses a step whose kernels read `ctl.device` before the step uploaded it.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from fox_numba.device.elementwise import copy_u32
from fox_numba.device.launch import LaunchError, active_trace, i32, launch
from fox_numba.device.memory import Mapped, device_empty, words
from fox_numba.device.runtime import device_address, sync_event

CONTROL_DTYPE = np.dtype(
    [
        ("step", np.int64),  # gradient (or environment) step counter of the stage
        ("seed", np.uint64),  # per-step seed for counter-based random draws
        ("lr_sched", np.float32),  # the host schedule's learning rate (cosine per epoch), before the
        # GPU's warm-up damping: adam_step uses lr_sched * max(0.05, ISV[FOLD_WARMUP_FACTOR])
        ("tau_eff", np.float32),  # Polyak rate of the target network this step
        ("eps", np.float32),  # exploration rate of action selection
    ],
    align=True,
)

_LIVE: weakref.WeakValueDictionary[int, ControlBlock] = weakref.WeakValueDictionary()


def control_block_at(address: int) -> ControlBlock | None:
    """The live control block whose device copy starts at `address`, if any."""
    return _LIVE.get(address)


class ControlBlock:
    """One CONTROL_DTYPE record: `host` (mapped, written by the host), `device` (read by kernels)."""

    def __init__(self) -> None:
        self._mapped = Mapped(1, CONTROL_DTYPE)
        self._mapped.host[0] = np.zeros((), CONTROL_DTYPE)
        self.device: Any = device_empty(1, CONTROL_DTYPE)
        self._fence = sync_event()
        self._fenced = False
        self.address = device_address(self.device)
        _LIVE[self.address] = self

    @property
    def host(self) -> np.ndarray:
        """The host record (read-only view; write with `set`)."""
        view = self._mapped.host.view()
        view.flags.writeable = False
        return view

    def set(self, **values: Any) -> None:
        """Write fields of the host record, once the last step that read it is past its upload."""
        if active_trace() is not None:
            raise LaunchError("ControlBlock.set inside a step body: a captured graph would never repeat it")
        unknown = set(values) - set(CONTROL_DTYPE.names)
        if unknown:
            raise KeyError(f"control block has no field {sorted(unknown)} (fields: {CONTROL_DTYPE.names})")
        if self._fenced:
            self._fence.synchronize()
        rec = self._mapped.host[0]
        for name, value in values.items():
            rec[name] = value

    def upload(self, stream: Any) -> None:
        """Copy the host record into the device copy on `stream`: the first launch of every step."""
        trace = active_trace()
        if trace is not None:
            trace.note(self)
        dst, src = words(self.device), words(self._mapped.device)
        launch(copy_u32, dst.size, dst, src, i32(dst.size), stream=stream)
        if trace is None:
            self.fence(stream)

    def fence(self, stream: Any) -> None:
        """Record that every launch on `stream` so far that reads the host record must finish before `set`."""
        self._fence.record(stream)
        self._fenced = True
