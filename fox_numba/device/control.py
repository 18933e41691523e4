"""Control blocks: host-written values that kernels inside a captured graph read from device memory.

A captured graph freezes every kernel argument, so a value the host decides (a schedule's base rate, its
horizon, an exploration rate) is never a kernel argument of a graph: the host writes it into a control
block and kernels read `ctl[0].lr_base` from the block's device copy. Values that change from step to
step (the step counter, this step's lr and tau) are not host values at all: kernels inside the graph
compute them from device counters (see `fox_numba.kernels.optim.OPTIM_STATE_DTYPE`), so steps can be
queued back to back with no host write and no fence between them.

    sched = ControlBlock(SCHEDULE_DTYPE)        # any aligned record dtype of whole 32-bit words
    def body(stream):                           # reads sched.device, never writes the host record
        launch(step_schedule, 1, sched.device, state, isv, stream=stream)
        ...
    step = StepGraph("train", body, stream, use_graph=cfg.run.graphs)
    for epoch in range(epochs):
        sched.set(lr_base=..., horizon=...)     # once per epoch
        sched.upload(stream)                    # ordered on the stream before the epoch's replays
        for _ in range(steps_per_epoch):
            step.replay()                       # no host write, no fence: replays queue back to back

The host record is mapped pinned memory; `upload` launches a one-thread-per-word copy into the device
copy, so kernels read device memory (a read of mapped memory crosses PCIe each time). Streams run in
order, so replays queued before an upload read the old values and replays queued after it the new ones.
`set` waits on a fence recorded after the last upload (at most once per upload, i.e. per epoch), so the
host never overwrites bytes an upload has not copied yet. `StepGraph` refuses to replay a step that
reads a block whose host record was `set` after its last upload (the step would read stale values).

A body may still call `ctl.upload(stream)` itself (the per-step pattern: every replay copies whatever the
host wrote last). Then each replay records the fence and the next `set` waits for that replay's upload,
which serialises host and device once per step; per-step values belong in device counters instead.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from fox_numba.device.elementwise import copy_u32
from fox_numba.device.launch import LaunchError, active_trace, i32, launch_strided
from fox_numba.device.memory import Mapped, device_empty, words
from fox_numba.device.runtime import device_address, sync_event

CONTROL_DTYPE = np.dtype(
    [
        ("step", np.int64),  # a host-side step or phase counter of the stage
        ("seed", np.uint64),  # a seed for counter-based random draws
        ("lr_sched", np.float32),  # a host-scheduled learning rate
        ("tau_eff", np.float32),  # a host-scheduled Polyak rate
        ("eps", np.float32),  # exploration rate of action selection
    ],
    align=True,
)
"""The default record of a ControlBlock (stages with their own fields pass their own dtype)."""

_LIVE: weakref.WeakValueDictionary[int, ControlBlock] = weakref.WeakValueDictionary()


def control_block_at(address: int) -> ControlBlock | None:
    """The live control block whose device copy starts at `address`, if any."""
    return _LIVE.get(address)


def _check_dtype(dtype: np.dtype) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype.names is None or not dtype.isalignedstruct or dtype.itemsize % 4:
        raise ValueError(f"a control block needs an aligned record dtype of whole 32-bit words, got {dtype}")
    return dtype


class ControlBlock:
    """One record of `dtype`: `host` (mapped, written by the host), `device` (read by kernels).

    `pending` is True while the host record holds values the device copy has not received (a new block,
    or a `set` since the last `upload`).
    """

    def __init__(self, dtype: Any = CONTROL_DTYPE) -> None:
        self.dtype = _check_dtype(dtype)
        self._mapped = Mapped(1, self.dtype)
        self._mapped.host[0] = np.zeros((), self.dtype)
        self.device: Any = device_empty(1, self.dtype)
        self._fence = sync_event()
        self._fenced = False
        self.pending = True
        self.address = device_address(self.device)
        _LIVE[self.address] = self

    @property
    def host(self) -> np.ndarray:
        """The host record (read-only view; write with `set`)."""
        view = self._mapped.host.view()
        view.flags.writeable = False
        return view

    def set(self, **values: Any) -> None:
        """Write fields of the host record, once the last upload that read it has copied it."""
        if active_trace() is not None:
            raise LaunchError("ControlBlock.set inside a step body: a captured graph would never repeat it")
        unknown = set(values) - set(self.dtype.names)
        if unknown:
            raise KeyError(f"control block has no field {sorted(unknown)} (fields: {self.dtype.names})")
        if self._fenced:
            self._fence.synchronize()
            self._fenced = False
        rec = self._mapped.host[0]
        for name, value in values.items():
            rec[name] = value
        self.pending = True

    def upload(self, stream: Any) -> None:
        """Copy the host record into the device copy on `stream`: once after the `set`s of an epoch (or,
        inside a step body, as the step's first launch: the per-step pattern of the module header)."""
        trace = active_trace()
        if trace is not None:
            trace.note(self)
        dst, src = words(self.device), words(self._mapped.device)
        launch_strided(copy_u32, dst.size, dst, src, i32(dst.size), stream=stream)
        if trace is None:
            self.fence(stream)

    def fence(self, stream: Any) -> None:
        """Record that an upload reading the host record is queued on `stream` (it must finish before the
        next `set`); the device copy will hold the host record's values from then on."""
        self._fence.record(stream)
        self._fenced = True
        self.pending = False
