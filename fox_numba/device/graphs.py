"""Step graphs: a sequence of kernel launches captured once into a CUDA graph and replayed every step.

A step is a Python callable `body(stream)` that launches kernels through the launch helpers on the
stream it is given. `StepGraph.replay()` runs it:
- first replay: eagerly (kernels compile, lazy buffers are allocated, and the launch trace is recorded);
- later replays, on the GPU with `use_graph` (RunConfig.graphs): the second replay captures the body into
  a CUDA graph (runtime stream capture through `cuda.bindings`), and every replay launches the graph;
- under the simulator, or with `use_graph=False`, every replay runs the body eagerly again.
Each replay executes the sequence exactly once, so eager and graph runs give identical results.
A body may fork side streams from its stream (device/fork.py): their launches become branches of the graph that
run beside the main chain, and each must be joined back before the body ends.

A graph freezes each launch's grid, array addresses and scalar arguments. Eager replays and the capture
record a `LaunchTrace` and compare it with the first replay's, so a body that would replay differently as
a graph fails on the simulator already: a scalar argument that changes (per-step values belong in the
`ControlBlock`), an array allocated anew each step, a different number of launches. A body that uploads a
control block must do so before its kernels read it; a body that reads a block it does not upload (the
block is uploaded per epoch, outside the step) refuses to replay while the block's host record was set
after its last upload.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from fox_numba.device.control import ControlBlock, control_block_at
from fox_numba.device.launch import LaunchRecord, LaunchTrace, tracing
from fox_numba.device.runtime import SIMULATOR

if not SIMULATOR:
    from cuda.bindings import runtime as rt


class GraphError(RuntimeError):
    """A step body that a captured graph would replay differently from an eager run."""


def _describe_difference(step: str, replay: int, pos: int, ref: LaunchRecord, got: LaunchRecord) -> str:
    where = f"{step}: replay {replay}, launch {pos} ({ref.kernel})"
    if got.kernel != ref.kernel:
        return f"{where}: launched {got.kernel} where the first replay launched {ref.kernel}"
    if got.lane != ref.lane:
        return f"{where}: launched on lane {got.lane} where the first replay used lane {ref.lane} (device/fork.py)"
    if (got.grid, got.block) != (ref.grid, ref.block):
        return (
            f"{where}: grid/block {got.grid}/{got.block} differ from the first replay's "
            f"{ref.grid}/{ref.block}"
        )
    for i, (a, b) in enumerate(zip(ref.args, got.args, strict=False)):
        if a != b:
            if a[0] == "array":
                return (
                    f"{where}: argument {i} is another array ({ref.shown(i)} -> {got.shown(i)}); a graph "
                    "keeps the first array's address: allocate step buffers once, outside the body"
                )
            return (
                f"{where}: argument {i} changed between replays ({ref.shown(i)} -> {got.shown(i)}); a "
                "captured graph replays the first value: read per-step values from the ControlBlock"
            )
    return f"{where}: differs from the first replay"


def _check_controls_uploaded(step: str, trace: LaunchTrace) -> tuple[list[ControlBlock], list[ControlBlock]]:
    """(blocks the step uploads, blocks it reads without uploading them); fails if a kernel reads a block
    that the body uploads only later."""
    uploaded: dict[int, tuple[int, ControlBlock]] = {}
    for position, obj in trace.notes:
        if isinstance(obj, ControlBlock):
            uploaded.setdefault(obj.address, (position, obj))
    read_only: dict[int, ControlBlock] = {}
    for pos, rec in enumerate(trace.launches):
        for address in rec.addresses:
            ctl = control_block_at(address)
            if ctl is None:
                continue
            if address not in uploaded:
                read_only[address] = ctl
            elif uploaded[address][0] > pos:
                raise GraphError(
                    f"{step}: launch {pos} ({rec.kernel}) reads a control block the step has not uploaded "
                    "yet; call ctl.upload(stream) first in the body"
                )
    return [ctl for _, ctl in uploaded.values()], list(read_only.values())


def _check_current(step: str, controls: list[ControlBlock]) -> None:
    for ctl in controls:
        if ctl.pending:
            raise GraphError(
                f"{step}: reads a control block whose host record was set after its last upload (or never "
                "uploaded); call ctl.upload(stream) before replaying"
            )


def _check(result: tuple[Any, ...], what: str) -> Any:
    err, *values = result
    if err != rt.cudaError_t.cudaSuccess:
        raise GraphError(f"{what} failed: {err!r}")
    return values[0] if len(values) == 1 else tuple(values)


def _destroy(graph: Any, exe: Any) -> None:
    rt.cudaGraphExecDestroy(exe)
    rt.cudaGraphDestroy(graph)


class StepGraph:
    """A step body replayed as a captured CUDA graph (GPU, `use_graph`) or eagerly (simulator, debugging)."""

    def __init__(self, name: str, body: Callable[[Any], None], stream: Any, *, use_graph: bool) -> None:
        self.name = name
        self.body = body
        self.stream = stream
        self.use_graph = use_graph and not SIMULATOR
        self.replays = 0
        self.graph_nodes = 0
        self._reference: LaunchTrace | None = None
        self._controls: list[ControlBlock] = []  # uploaded by the body: fenced after each replay
        self._read_controls: list[ControlBlock] = []  # read by the body, uploaded outside it
        self._exe: Any = None
        self._arrays: list[Any] = []

    @property
    def mode(self) -> str:
        """'graph' once captured, else 'eager'."""
        return "graph" if self._exe is not None else "eager"

    @property
    def launches(self) -> list[LaunchRecord]:
        """The launches of one replay, as the first replay recorded them."""
        return list(self._reference.launches) if self._reference is not None else []

    def _run_body(self, capturing: bool) -> LaunchTrace:
        trace = LaunchTrace(self.stream, capturing=capturing)
        with tracing(trace):
            self.body(self.stream)
        if not trace.launches:
            raise GraphError(f"{self.name}: the step body launched no kernel")
        if trace.forked:
            raise GraphError(f"{self.name}: side stream(s) {sorted(trace.forked)} forked and not joined: the step "
                             "would end before their work (device/fork.py)")
        controls, read_controls = _check_controls_uploaded(self.name, trace)
        ref = self._reference
        if ref is None:
            self._reference, self._controls, self._read_controls = trace, controls, read_controls
        else:
            if len(trace.launches) != len(ref.launches):
                raise GraphError(
                    f"{self.name}: replay {self.replays + 1} made {len(trace.launches)} launches, the first "
                    f"made {len(ref.launches)}; a graph replays the first sequence"
                )
            for pos, (a, b) in enumerate(zip(ref.launches, trace.launches, strict=True)):
                if a != b:
                    raise GraphError(_describe_difference(self.name, self.replays + 1, pos, a, b))
        return trace

    def _capture(self) -> None:
        handle = int(self.stream)
        mode = rt.cudaStreamCaptureMode.cudaStreamCaptureModeRelaxed
        _check(rt.cudaStreamBeginCapture(handle, mode), f"{self.name}: cudaStreamBeginCapture")
        try:
            trace = self._run_body(capturing=True)
        except BaseException:
            err, graph = rt.cudaStreamEndCapture(handle)
            if err == rt.cudaError_t.cudaSuccess and graph is not None:
                rt.cudaGraphDestroy(graph)
            raise
        graph = _check(rt.cudaStreamEndCapture(handle), f"{self.name}: cudaStreamEndCapture")
        _, n_nodes = _check(rt.cudaGraphGetNodes(graph, 0), f"{self.name}: cudaGraphGetNodes")
        if n_nodes != len(trace.launches):
            rt.cudaGraphDestroy(graph)
            raise GraphError(
                f"{self.name}: the captured graph has {n_nodes} nodes for {len(trace.launches)} traced "
                "launches; something in the body enqueued work outside the launch helpers"
            )
        exe = _check(rt.cudaGraphInstantiate(graph, 0), f"{self.name}: cudaGraphInstantiate")
        self._exe = exe
        self.graph_nodes = n_nodes
        self._arrays = trace.arrays  # the graph holds their addresses: keep them alive with it
        weakref.finalize(self, _destroy, graph, exe)

    def replay(self) -> None:
        """Run the step once on its stream (asynchronously: synchronise before reading results)."""
        if self._exe is None and self.use_graph and self._reference is not None:
            self._capture()
        _check_current(self.name, self._read_controls)  # known from the first replay on
        if self._exe is not None:
            _check(rt.cudaGraphLaunch(self._exe, int(self.stream)), f"{self.name}: cudaGraphLaunch")
        else:
            first = self._reference is None
            self._run_body(capturing=False)
            if first:
                _check_current(self.name, self._read_controls)
        for ctl in self._controls:
            ctl.fence(self.stream)
        self.replays += 1
