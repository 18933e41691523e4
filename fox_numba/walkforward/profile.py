"""`fox profile`: where the time of a training epoch goes, per stage and per kernel, on the GPU.

On fold 0 of the chosen store and preset: one warm-up epoch (compilation, graph capture; its evaluation
runs twice, since a pass replays its chunk graph once and the second replay captures it), then a timed
window of `--epochs` epochs, each stage (collect, train, evaluate) timed between CUDA events around its
replays (graph mode as configured). On a GPU the same warm-up and window then run on a second trainer
with run.graphs flipped, so every stage has a time with graphs on and off (the simulator has no graphs:
there the second window is skipped and the graphs-on time is n/a). Per kernel, one step of each stage is
launched eagerly `--steps` times with a CUDA event pair around every launch, behind a busy kernel that
holds the stream while the host enqueues (device/hold.py): each figure is the kernel's GPU time without
the host's launch cost, which is what the stage figures save with graphs. For
every kernel: calls per step, total and mean time, its share of its stage's eager time and of the epoch
(its GPU time in one epoch, calls per step x the stage's steps per epoch, over the configured mode's epoch
time); for the dense-layer
GEMMs the achieved TFLOP/s
(2 x rows x in x out per call), for every other kernel the achieved bandwidth, counting each array
argument's bytes once (an estimate of the traffic: a kernel that reads an array twice moves more, one that
reads part of it less), against the device's copy bandwidth measured here (a 256 MiB device-to-device copy).

Writes RUN/profile.json and RUN/profile.md (RUN = run.out_dir/profile-<time> or run.name) and prints the
tables. Under the CUDA simulator it runs the same code and says that its timings mean nothing.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fox_numba.agent.fold_market import FoldMarket
from fox_numba.agent.trainer import Trainer
from fox_numba.config import FoxConfig, write_config
from fox_numba.device.hold import StreamHold
from fox_numba.device.launch import LaunchTrace, short_kernel_name, tracing
from fox_numba.device.memory import copy_device, device_zeros
from fox_numba.device.runtime import SIMULATOR
from fox_numba.device.timing import Timings
from fox_numba.io import atomic_write_text
from fox_numba.market.select import MarketSelection
from fox_numba.walkforward.driver import load_features
from fox_numba.walkforward.folds import make_folds

GEMM_MODULES = ("gemm", "gemm_tensor")  # the dense layers' GEMMs: fp32 and tensor-core (kernels.nn)
GEMM_OPS = ("linear_fwd", "linear_bwd_in", "linear_wgrad")
COPY_BYTES = 256 << 20


def device_name() -> str:
    """The GPU's name (the simulator has none)."""
    if SIMULATOR:
        return "the CUDA simulator"
    from numba import cuda

    name = cuda.get_current_device().name
    return name.decode() if isinstance(name, bytes) else str(name)


def copy_bandwidth(stream: Any) -> float:
    """GB/s of a device-to-device copy of COPY_BYTES (best of 5; read + write counted). Under the simulator
    4 KiB: zeroing the buffers launches a thread per word there, and the figure means nothing anyway."""
    n = (COPY_BYTES if not SIMULATOR else 1 << 12) // 4
    src, dst = device_zeros(n, np.float32, stream=stream), device_zeros(n, np.float32, stream=stream)
    timings = Timings()
    for _ in range(6):
        with timings.region("copy", stream):
            copy_device(dst, src, stream=stream)
    stat = timings.stats()["copy"]
    return 2 * 4 * n / (stat.min_ms * 1e-3) / 1e9


def gemm_op(name: str) -> str | None:
    """The GEMM operation (GEMM_OPS) a kernel's short name runs, None for any other kernel."""
    module, _, kernel = name.partition(".")
    return next((op for op in GEMM_OPS if kernel.startswith(op + "_")), None) if module in GEMM_MODULES else None


def launch_name(rec: Any) -> str:
    """A launch's row in the kernel tables: the kernel and its grid ("gemm_tensor.linear_fwd_tf32 7x128"), so one
    kernel launched on several shapes (the GEMMs of different layers) gets a row per shape, as the kernel timer
    names it (Timings(by_grid=True))."""
    return f"{short_kernel_name(rec.kernel)} {'x'.join(map(str, rec.grid))}"


def _work(rec: Any) -> tuple[float, float]:
    """(bytes, flops) of one launch from its argument keys: arrays' bytes, and 2 B K N for the GEMMs."""
    arrays = [a for a in rec.args if a[0] == "array"]
    nbytes = float(sum(int(np.prod(a[2])) * np.dtype(a[3]).itemsize for a in arrays))
    op = gemm_op(short_kernel_name(rec.kernel))
    flops = 0.0
    if op == "linear_fwd":  # x[B,K], w[K,N]
        (b, k), (_, n) = arrays[0][2], arrays[1][2]
        flops = 2.0 * b * k * n
    elif op == "linear_bwd_in":  # dy[B,N], w[K,N], then mask and k_len: the reduction runs over k_len <= N
        (b, _), (k, _) = arrays[0][2], arrays[1][2]
        dtype, value = rec.args[-1]
        flops = 2.0 * b * k * float(np.frombuffer(value, dtype)[0])
    elif op == "linear_wgrad":  # x[B,K], dy[B,N]
        (b, k), (_, n) = arrays[0][2], arrays[1][2]
        flops = 2.0 * b * k * n
    return nbytes, flops


def kernel_table(body: Callable[[Any], None], stream: Any, steps: int) -> tuple[list[dict[str, Any]], int]:
    """Per kernel and grid (`launch_name`) of one eager step of `body`: calls per step, mean us, total share,
    TFLOP/s or GB/s."""
    trace = LaunchTrace(stream)
    with tracing(trace):
        body(stream)
    work: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for rec in trace.launches:
        w = work[launch_name(rec)]
        b, f = _work(rec)
        w[0] += 1
        w[1] += b
        w[2] += f
    timings, hold = Timings(by_grid=True), StreamHold(stream)
    for _ in range(steps):
        hold.timed(body, timings)
    stats = timings.stats()
    total = sum(s.total_ms for s in stats.values()) or 1.0
    rows = []
    for name, s in sorted(stats.items(), key=lambda kv: -kv[1].total_ms):
        calls, nbytes, flops = work.get(name, [s.count / steps, 0.0, 0.0])
        per_call_s = s.mean_ms * 1e-3
        row = {"kernel": name, "calls_per_step": calls, "mean_us": s.mean_ms * 1e3, "total_ms": s.total_ms,
               "share": s.total_ms / total}
        if gemm_op(name.rsplit(" ", 1)[0]):
            row["tflops"] = flops / calls / per_call_s / 1e12 if per_call_s > 0 else 0.0
        else:
            row["gb_per_s"] = nbytes / calls / per_call_s / 1e9 if per_call_s > 0 else 0.0
        rows.append(row)
    return rows, len(trace.launches)


def timed_window(cfg: FoxConfig, market: FoldMarket, fold: int, epochs: int) -> tuple[Trainer, dict[str, Any], float]:
    """A trainer bound to the fold after a warm-up epoch that leaves every step graph captured (compilation
    at each graph's first replay, capture at its second), its stage timings over `epochs` epochs, and the
    warm-up's seconds."""
    trainer = Trainer(cfg)
    trainer.bind_fold(market, fold)
    s = trainer.stream
    t0 = time.perf_counter()
    trainer.collect()
    trainer.train(lambda: None)
    for _ in range(1 if SIMULATOR else 2):  # a pass replays each chunk graph once: the second captures it
        trainer.evaluate()
    warmup_s = time.perf_counter() - t0
    timings = Timings()
    for _ in range(epochs):
        with timings.region("collect", s):
            trainer.collect()
        with timings.region("train", s):
            trainer.train(lambda: None)
        with timings.region("evaluate", s):
            trainer.evaluate()
    return trainer, timings.stats(), warmup_s


def profile(cfg: FoxConfig, selection: MarketSelection, *, epochs: int, steps: int, out_dir: Path,
            log: Callable[[str], None], command: str = "") -> dict[str, Any]:
    """Profile fold 0 (module docstring); returns the results written to out_dir/profile.json."""
    features = load_features(cfg, selection)
    fold = make_folds(cfg.folds, selection.days)[0]
    market = FoldMarket.build(features, fold, cfg.features, cfg.env)
    log(f"profile: {fold.describe()}, warm-up epoch (compilation and graph capture)")
    trainer, stages, warmup_s = timed_window(cfg, market, fold.index, epochs)
    s = trainer.stream
    epoch_ms = sum(st.mean_ms for st in stages.values())
    ev = trainer.evaluator
    stage_steps = {"collect": cfg.env.collect_steps, "train": cfg.learner.steps_per_epoch, "evaluate": ev.steps}
    if ev.chunk_rows is not None:  # an encoder over past bars: the cache a step reads, filled once per chunk
        ev.net.encode(ev.params, ev.chunk_rows[0], stream=s)
    bodies = {"collect": trainer.collector._step, "train": trainer.learner._step,
              "evaluate": lambda st, ev=ev: ev._step(st, 0)}  # ev bound now: the del below drops it
    kernels, launches = {}, {}
    for name, body in bodies.items():
        kernels[name], launches[name] = kernel_table(body, s, steps)
        for row in kernels[name]:
            row["epoch_share"] = row["total_ms"] / steps * stage_steps[name] / epoch_ms
    eval_env_steps = ev.steps * ev.env.n
    del trainer, ev, bodies  # one trainer's device memory at a time (its step graphs hold cycles)
    gc.collect()
    by_setting = {False: stages, True: None} if SIMULATOR else {cfg.run.graphs: stages}
    if not SIMULATOR:
        flipped = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, graphs=not cfg.run.graphs))
        log(f"profile: the same window with run.graphs={str(flipped.run.graphs).lower()}")
        by_setting[flipped.run.graphs] = timed_window(flipped, market, fold.index, epochs)[1]
    env_steps = cfg.env.n_envs * cfg.env.collect_steps
    out = {
        "command": command,
        "device": device_name(),
        "simulator": SIMULATOR,
        "note": "timings under the CUDA simulator mean nothing" if SIMULATOR else "CUDA events on the GPU",
        "fold": fold.describe(), "epochs_timed": epochs, "warmup_s": warmup_s,
        "copy_bandwidth_gb_s": copy_bandwidth(s),
        "stages": {name: {"mean_ms": st.mean_ms, "share": st.mean_ms / epoch_ms, "launches_per_step": launches[name],
                          "mode": "graph" if cfg.run.graphs and not SIMULATOR else "eager",
                          "steps_per_epoch": stage_steps[name],
                          "graphs_on_ms": None if by_setting[True] is None else by_setting[True][name].mean_ms,
                          "graphs_off_ms": by_setting[False][name].mean_ms}
                   for name, st in stages.items()},
        "epoch_ms": epoch_ms,
        "throughput": {"env_steps_per_s": env_steps / (stages["collect"].mean_ms * 1e-3),
                       "gradient_steps_per_s": cfg.learner.steps_per_epoch / (stages["train"].mean_ms * 1e-3),
                       "evaluation_steps_per_s": eval_env_steps / (stages["evaluate"].mean_ms * 1e-3)},
        "kernels": kernels,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    write_config(cfg, out_dir / "config.toml")
    atomic_write_text(out_dir / "profile.json", json.dumps(out, indent=1))
    atomic_write_text(out_dir / "profile.md", markdown(out))
    return out


def markdown(p: dict[str, Any]) -> str:
    """The profile as Markdown tables."""
    lines = [f"# fox profile: {p['fold']}", "", f"Command: `{p['command']}` on {p['device']}.", "", f"{p['note']}; {p['epochs_timed']} epochs timed after a warm-up of "
             f"{p['warmup_s']:.1f} s. Device copy bandwidth {p['copy_bandwidth_gb_s']:.0f} GB/s.", "",
             "| stage | mode | launches per step | mean ms per epoch | share | ms, graphs on | ms, graphs off |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, st in p["stages"].items():
        lines.append(f"| {name} | {st['mode']} | {st['launches_per_step']} | {st['mean_ms']:.2f} | {st['share']:.1%} | "
                     f"{'n/a' if st['graphs_on_ms'] is None else format(st['graphs_on_ms'], '.2f')} | "
                     f"{st['graphs_off_ms']:.2f} |")
    t = p["throughput"]
    lines += ["", f"Epoch {p['epoch_ms']:.1f} ms: {t['env_steps_per_s'] / 1e6:.2f} M environment steps/s collecting, "
              f"{t['gradient_steps_per_s']:.0f} gradient steps/s, {t['evaluation_steps_per_s'] / 1e6:.3f} M evaluation "
              "environment steps/s.", ""]
    for stage, rows in p["kernels"].items():
        lines += [f"## {stage}: kernels of one eager step (CUDA events per launch; a row per kernel and grid)", "",
                  "| kernel | calls/step | mean us | share | share of epoch | TFLOP/s | GB/s (est.) |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for r in rows:
            tf = f"{r['tflops']:.1f}" if "tflops" in r else ""
            bw = f"{r['gb_per_s']:.0f}" if "gb_per_s" in r else ""
            lines.append(f"| {r['kernel']} | {r['calls_per_step']:g} | {r['mean_us']:.1f} | {r['share']:.1%} | "
                         f"{r['epoch_share']:.1%} | {tf} | {bw} |")
        lines.append("")
    return "\n".join(lines)
