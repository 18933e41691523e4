"""Benchmark the GPU runtime: mapped-pinned staging bandwidth and kernel launch cost, eager vs graph.

    python3 tools/bench_device.py --out tools/results/bench_device_h200

Writes OUT.md (tables, the machine, the command) and OUT.json (the same numbers). Each measurement runs
warm-up repetitions, then a timed window of repetitions between stream synchronisations; bandwidths are
bytes moved / wall time (1 GB = 1e9 bytes), reported as the median and the best of the window.

Staging (host->device of one tensor of --mib MiB): the Stager path (host writes into double-buffered
mapped chunks, DMA copies them into the device array), split into its two halves (host memcpy into
mapped memory; DMA from a fully written mapped buffer), a plain device-to-device copy for reference,
and the download path. Every element is checked after the upload and after the download.
Launch cost (--kernels small kernels, one step): eager through the launch helper, eager through numba's
dispatcher directly, and replays of the same step captured as a CUDA graph; the graph's results are
checked against eager replays bit for bit. Control step: ControlBlock.set + replay of a small graph,
the per-step host cost a training loop pays.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import sys
import time
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fox_numba.accelerator import choose_backend  # noqa: E402

choose_backend()  # the GPU or the simulator, decided before numba is first imported (a tool run without a GPU)
import numba  # noqa: E402
import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

from fox_numba.device.control import CONTROL_DTYPE, ControlBlock  # noqa: E402
from fox_numba.device.elementwise import axpy_f32, scale_f32  # noqa: E402
from fox_numba.device.graphs import StepGraph  # noqa: E402
from fox_numba.device.launch import grid_1d, i32, launch, launch_strided  # noqa: E402
from fox_numba.device.memory import Mapped, copy_device, device_empty  # noqa: E402
from fox_numba.device.registry import register  # noqa: E402
from fox_numba.device.runtime import SIMULATOR, new_stream  # noqa: E402
from fox_numba.device.staging import DEFAULT_HOST_THREADS, Stager  # noqa: E402
from fox_numba.io import atomic_write_text  # noqa: E402


@register((numba.float32[::1], numba.float32[::1], numba.from_dtype(CONTROL_DTYPE)[::1], numba.int32))
@cuda.jit
def lerp_by_control(target, online, ctl, n):  # type: ignore[no-untyped-def]
    """target[i] += ctl tau_eff * (online[i] - target[i]): a kernel reading the control block each step."""
    i = cuda.grid(1)
    if i < n:
        target[i] = target[i] + ctl[0].tau_eff * (online[i] - target[i])


def timed(fn: Any, stream: Any, warmup: int, iters: int) -> list[float]:
    """Seconds per call of `fn()` over `iters` calls after `warmup` calls, each ended by a sync."""
    for _ in range(warmup):
        fn()
        stream.synchronize()
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        stream.synchronize()
        out.append(time.perf_counter() - t0)
    return out


def bandwidth(nbytes: int, seconds: list[float]) -> dict[str, float]:
    return {
        "median_GBps": nbytes / statistics.median(seconds) / 1e9,
        "best_GBps": nbytes / min(seconds) / 1e9,
        "median_ms": statistics.median(seconds) * 1e3,
    }


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": f"{platform.python_version()} ({sys.executable})",
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
        "numpy": np.__version__,
        "numba": numba.__version__,
        "platform": platform.platform(),
    }
    try:
        info["numba_cuda"] = version("numba-cuda")
    except Exception as e:  # the distribution metadata may be absent when run from a source tree
        info["numba_cuda"] = f"unknown ({type(e).__name__})"
    if SIMULATOR:
        info["device"] = "CUDA simulator (CPU)"
    else:
        dev = cuda.get_current_device()
        name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
        info["device"] = name
        info["compute_capability"] = ".".join(map(str, dev.compute_capability))
        from numba.cuda.cudadrv.driver import get_version

        info["cuda_driver_api"] = ".".join(map(str, get_version()))
        info["device_memory_GiB"] = round(cuda.current_context().get_memory_info()[1] / 2**30, 1)
    return info


def bench_staging(mib: int, chunk_mibs: list[int], warmup: int, iters: int) -> dict[str, Any]:
    stream = new_stream()
    nbytes = mib << 20
    n = nbytes // 4
    host = np.random.default_rng(0).random(n, dtype=np.float32)
    dst = device_empty(n, np.float32)
    res: dict[str, Any] = {"bytes": nbytes}

    stager = Stager(stream, chunk_bytes=64 << 20)
    upload = timed(lambda: stager.upload(host, dst), stream, warmup, iters)
    res["upload_stager_64MiB"] = bandwidth(nbytes, upload)
    res["upload_verified_every_element"] = bool(np.array_equal(stager.download(dst), host))
    for chunk in chunk_mibs:
        chunked = Stager(stream, chunk_bytes=chunk << 20)
        upload = timed(functools.partial(chunked.upload, host, dst), stream, 1, iters)
        res[f"upload_stager_{chunk}MiB"] = bandwidth(nbytes, upload)
        del chunked  # free its mapped chunks before the next size

    mapped = Mapped(n, np.float32)
    res["host_memcpy_into_mapped_1_thread"] = bandwidth(
        nbytes, timed(lambda: np.copyto(mapped.host, host), stream, warmup, iters)
    )
    res["dma_mapped_to_device"] = bandwidth(
        nbytes, timed(lambda: copy_device(dst, mapped.device, stream=stream), stream, warmup, iters)
    )
    dst2 = device_empty(n, np.float32)
    res["device_to_device"] = bandwidth(
        nbytes, timed(lambda: copy_device(dst2, dst, stream=stream), stream, warmup, iters)
    )
    out = np.empty_like(host)
    res["download_stager_64MiB"] = bandwidth(
        nbytes, timed(lambda: stager.download(dst, out=out), stream, warmup, iters)
    )
    res["download_verified_every_element"] = bool(np.array_equal(out, host))
    return res


def bench_launches(n_kernels: int, n_elems: int, warmup: int, iters: int) -> dict[str, Any]:
    stream = new_stream()
    stager = Stager(stream, chunk_bytes=1 << 20)
    x0 = np.random.default_rng(1).standard_normal(n_elems).astype(np.float32)
    res: dict[str, Any] = {"kernels_per_step": n_kernels, "elements_per_kernel": n_elems}

    def make(use_graph: bool) -> tuple[StepGraph, Any]:
        y = stager.upload_new(x0)
        x = stager.upload_new(x0[::-1].copy())

        def body(s: Any) -> None:
            for _ in range(n_kernels):
                launch_strided(axpy_f32, n_elems, y, np.float32(1e-3), x, i32(n_elems), stream=s)

        return StepGraph("bench", body, stream, use_graph=use_graph), y

    eager, _ = make(use_graph=False)
    t = timed(eager.replay, stream, warmup, iters)
    res["eager_step_graph_us_per_kernel"] = statistics.median(t) / n_kernels * 1e6

    y = stager.upload_new(x0)
    x = stager.upload_new(x0[::-1].copy())
    grid, block = grid_1d(n_elems), 256
    alpha, count = np.float32(1e-3), i32(n_elems)

    def helper() -> None:
        for _ in range(n_kernels):
            launch_strided(axpy_f32, n_elems, y, alpha, x, count, stream=stream)

    def raw() -> None:
        for _ in range(n_kernels):
            axpy_f32[grid, block, stream](y, alpha, x, count)

    t = timed(helper, stream, warmup, iters)
    res["eager_launch_helper_us_per_kernel"] = statistics.median(t) / n_kernels * 1e6
    t = timed(raw, stream, warmup, iters)
    res["eager_numba_dispatcher_us_per_kernel"] = statistics.median(t) / n_kernels * 1e6

    graph, y_graph = make(use_graph=True)
    graph.replay()
    stream.synchronize()
    t0 = time.perf_counter()
    graph.replay()  # the capture, then the first graph launch
    stream.synchronize()
    res["capture_and_first_replay_ms"] = (time.perf_counter() - t0) * 1e3
    res["graph_mode"] = graph.mode
    res["graph_nodes"] = graph.graph_nodes
    t = timed(graph.replay, stream, warmup, iters)
    res["graph_replay_us_per_kernel"] = statistics.median(t) / n_kernels * 1e6
    res["graph_replay_ms_per_step"] = statistics.median(t) * 1e3
    res["eager_over_graph"] = res["eager_numba_dispatcher_us_per_kernel"] / res["graph_replay_us_per_kernel"]

    # the same number of replays from the same start: graph and eager must agree bit for bit
    e2, ye = make(use_graph=False)
    g2, yg = make(use_graph=True)
    for _ in range(4):
        e2.replay()
        g2.replay()
    stream.synchronize()
    res["graph_equals_eager_bitwise"] = bool(
        np.array_equal(stager.download(ye).view(np.uint32), stager.download(yg).view(np.uint32))
    )
    return res


def bench_control_step(n_kernels: int, n_elems: int, steps: int) -> dict[str, Any]:
    """Per-step host cost of the training-loop pattern: write the control block, replay the graph."""
    stream = new_stream()
    stager = Stager(stream, chunk_bytes=1 << 20)
    target = stager.upload_new(np.zeros(n_elems, np.float32))
    online = stager.upload_new(np.ones(n_elems, np.float32))
    ctl = ControlBlock()

    def body(s: Any) -> None:
        ctl.upload(s)
        for _ in range(n_kernels):
            launch(lerp_by_control, n_elems, target, online, ctl.device, i32(n_elems), stream=s)
            launch_strided(scale_f32, n_elems, target, np.float32(1.0), i32(n_elems), stream=s)

    graph = StepGraph("control", body, stream, use_graph=True)
    for k in range(3):
        ctl.set(step=k, tau_eff=np.float32(0.0))
        graph.replay()
    stream.synchronize()
    t0 = time.perf_counter()
    for k in range(steps):
        ctl.set(step=k, tau_eff=np.float32(1e-3))
        graph.replay()
    stream.synchronize()
    per_step = (time.perf_counter() - t0) / steps
    expected = 1.0 - (1.0 - 1e-3) ** (steps * n_kernels)
    got = float(stager.download(target)[0])
    return {
        "kernels_per_step": 1 + 2 * n_kernels,
        "steps": steps,
        "us_per_step": per_step * 1e6,
        "graph_mode": graph.mode,
        "target_after": got,
        "target_expected": expected,
        "matches_expected": abs(got - expected) < 1e-3,
    }


def results_header(title: str, command: str, info: dict[str, Any]) -> list[str]:
    """The opening lines of every benchmark results file: title, the command that made it, the machine."""
    return [
        f"# {title}",
        "",
        f"Command: `{command}`",
        "",
        f"Date (UTC): {info['date_utc']}",
        "",
        "| machine | |",
        "| --- | --- |",
        *[f"| {k} | {v} |" for k, v in info.items() if k != "date_utc"],
    ]


def markdown(command: str, info: dict[str, Any], staging: dict[str, Any], launches: dict[str, Any],
             control: dict[str, Any], args: argparse.Namespace) -> str:
    gib = staging["bytes"] / 2**30
    lines = results_header("Device runtime benchmark", command, info)
    lines += [
        "",
        f"## Staging, one float32 tensor of {gib:g} GiB ({args.warmup} warm-up, median/best of {args.iters})",
        "",
        "| path | median GB/s | best GB/s | median ms |",
        "| --- | ---: | ---: | ---: |",
    ]
    for key, v in staging.items():
        if isinstance(v, dict):
            lines.append(f"| {key} | {v['median_GBps']:.1f} | {v['best_GBps']:.1f} | {v['median_ms']:.1f} |")
    lines += [
        "",
        f"Upload verified element by element: {staging['upload_verified_every_element']}; "
        f"download: {staging['download_verified_every_element']}.",
        "`upload_stager_*`: host memcpy into double-buffered mapped chunks + DMA of each chunk into the "
        "device array (the chunk size in the name; the host copy of each chunk runs on "
        f"{DEFAULT_HOST_THREADS} threads). `host_memcpy_into_mapped_1_thread` and `dma_mapped_to_device` "
        "are its two halves measured apart, the first on one thread. `device_to_device` copies the bytes "
        "once (read + write: twice the traffic).",
        "",
        f"## Launch cost, {launches['kernels_per_step']} small kernels per step "
        f"(axpy on {launches['elements_per_kernel']} floats)",
        "",
        "| path | us per kernel |",
        "| --- | ---: |",
        f"| eager, numba dispatcher directly | {launches['eager_numba_dispatcher_us_per_kernel']:.2f} |",
        f"| eager, launch helper (argument checks) | {launches['eager_launch_helper_us_per_kernel']:.2f} |",
        f"| eager StepGraph replay (checks + launch trace, RunConfig.graphs=False) "
        f"| {launches['eager_step_graph_us_per_kernel']:.2f} |",
        f"| CUDA graph replay ({launches['graph_mode']}, {launches['graph_nodes']} nodes) "
        f"| {launches['graph_replay_us_per_kernel']:.3f} |",
        "",
        f"Eager (numba dispatcher) / graph replay: {launches['eager_over_graph']:.1f}x. "
        "Capture + first replay: "
        f"{launches['capture_and_first_replay_ms']:.1f} ms (once per step graph). Graph results equal eager "
        f"results bit for bit: {launches['graph_equals_eager_bitwise']}.",
        "",
        f"## Control step: ControlBlock.set + replay ({control['kernels_per_step']} kernels, "
        f"{control['graph_mode']})",
        "",
        f"{control['us_per_step']:.1f} us per step over {control['steps']} steps (the fence makes each "
        f"step wait for the previous one). Result check: {control['matches_expected']} "
        f"({control['target_after']:.6f} vs {control['target_expected']:.6f}).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="results path without suffix (.md, .json)")
    parser.add_argument("--mib", type=int, default=1024, help="size of the staged tensor in MiB")
    parser.add_argument("--chunk-mibs", type=int, nargs="*", default=[16, 256], help="other chunk sizes")
    parser.add_argument("--kernels", type=int, default=1000, help="small kernels per step")
    parser.add_argument("--elements", type=int, default=4096, help="elements per small kernel")
    parser.add_argument("--control-steps", type=int, default=2000, help="steps of the control-step loop")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args(argv)
    command = "python3 tools/bench_device.py " + " ".join(argv if argv is not None else sys.argv[1:])

    info = {"date_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M"), **machine()}
    staging = bench_staging(args.mib, args.chunk_mibs, args.warmup, args.iters)
    launches = bench_launches(args.kernels, args.elements, args.warmup, args.iters)
    control = bench_control_step(10, args.elements, args.control_steps)
    results = {"command": command, "machine": info, "staging": staging, "launches": launches,
               "control_step": control}
    atomic_write_text(args.out.with_suffix(".json"), json.dumps(results, indent=2) + "\n")
    text = markdown(command, info, staging, launches, control, args)
    atomic_write_text(args.out.with_suffix(".md"), text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
