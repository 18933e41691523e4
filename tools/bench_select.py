"""Benchmark action selection and the C51 kernels on the GPU, each new launch shape against the one it replaced.

    python3 tools/bench_select.py --out tools/results/bench_select_h200 [--sweep]
    python3 tools/bench_select.py --tiny --out /tmp/bench_select_tiny     # under the CUDA simulator: a smoke run

- select_actions at B in --batch (1024 8192 16384), Z in --atoms (21 51), training (explore) and evaluation:
  the production shape (16 lanes per sample), the --lanes variants, and the one-thread-per-sample kernel it
  replaced (kept below, registered, as the baseline: 7 draws, ties to the lowest direction); then from the head
  GEMM's rows, as collect and evaluation select: the dueling combine kernel followed by select_actions on its
  logits (the chain before), against select_actions forming the combine in shared memory.
- expected_q at B x 13 heads, alone and with the variance + utilisation pass.
- c51_project (one thread per row, scatter) against the former kernel (one thread per output atom, gathering
  over all Z sources; kept below) at R in --rows (8192 32768), and c51_loss. --sweep adds the projection at
  other block sizes.

Timing: each op is captured --reps times into one StepGraph; after --warmup replays, --windows windows each
time --replays replays between two CUDA events; us per op is the best window's mean. The simulator has no
timing events: there one replay is timed by the wall clock, a smoke number only.
Checks: every lanes variant gives the production shape's bits (actions, conviction, advanced states);
evaluation's actions and conviction equal those computed from expected_q's E[Q], bit for bit; the scatter
projection equals the gather bit for bit and a float64 projection within 8 Z eps; expected_q's q and
entropy have the same bits with and without the second pass; the loss and its gradient match float64.
Writes OUT.md and OUT.json (the numbers, the checks, the command, the machine); exits 1 if a check fails.
Timings measured before these launch shapes: tools/results/select_c51_before_h200.md.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from numba import cuda, float32, int32
from numba.cuda.random import xoroshiro128p_type

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_device import machine, results_header

from fox_numba.actions import DIR_OFFSET, FLAT, HOLD, MAG_OFFSET, N_DIRECTIONS, N_HEADS, ORDER_OFFSET, URGENCY_OFFSET
from fox_numba.device.graphs import StepGraph
from fox_numba.device.launch import launch
from fox_numba.device.memory import device_empty
from fox_numba.device.registry import register
from fox_numba.device.rng import xoroshiro128p_uniform_float32, xoroshiro_states_host
from fox_numba.device.runtime import SIMULATOR, new_stream
from fox_numba.device.staging import Stager
from fox_numba.io import atomic_write_text
from fox_numba.kernels.action_select import LANES, TAU_FLOOR, select_actions
from fox_numba.kernels.distributional import F32_2D, F32_3D, c51_loss, c51_project, expected_q, softmax_stats
from fox_numba.kernels.heads import dueling_combine_forward, head_width

EPS = 2.0**-24
_NEG_INF = np.float32(-np.inf)


# ---- the kernels these shapes replaced, kept as baselines -----------------------------------------------


@cuda.jit(device=True)
def _legacy_sample_atom(logits, i, a, m, s, u):
    target = u * s
    c = float32(0.0)
    pick = 0
    for j in range(logits.shape[2]):
        w = math.exp(logits[i, a, j] - m)
        c += w
        if w > float32(0.0):
            pick = j
        if c > target:
            break
    return pick


@cuda.jit(device=True)
def _legacy_pick3(logits, support, states, i, offset, explore):
    _m, s0, tz0, _tlm = softmax_stats(logits, support, i, offset)
    _m, s1, tz1, _tlm = softmax_stats(logits, support, i, offset + 1)
    _m, s2, tz2, _tlm = softmax_stats(logits, support, i, offset + 2)
    q0 = tz0 / s0
    q1 = tz1 / s1
    q2 = tz2 / s2
    if explore == 0:
        if q0 >= q1 and q0 >= q2:
            return 0
        return 1 if q1 >= q2 else 2
    u = xoroshiro128p_uniform_float32(states, i)
    hi = max(max(q0, q1), q2)
    tau = max(hi - min(min(q0, q1), q2), TAU_FLOOR)
    w0 = math.exp((q0 - hi) / tau)
    w1 = math.exp((q1 - hi) / tau)
    w2 = math.exp((q2 - hi) / tau)
    target = u * (w0 + w1 + w2)
    if target < w0:
        return 0
    return 1 if target < w0 + w1 else 2


@register((F32_3D, F32_3D, xoroshiro128p_type[::1], int32, int32[:, ::1], float32[::1]))
@cuda.jit
def legacy_action_select_kernel(logits, support, states, explore, actions, conviction):
    """The former action selection: one thread per sample (blocks of 64), ties to the lowest direction."""
    i = cuda.grid(1)
    if i >= logits.shape[0]:
        return
    best_q = _NEG_INF
    second_q = _NEG_INF
    best_d = 0
    draw_v = _NEG_INF
    draw_d = 0
    draw_q = float32(0.0)
    for d in range(N_DIRECTIONS):
        a = DIR_OFFSET + d
        m, s, tz, _tlm = softmax_stats(logits, support, i, a)
        q = tz / s
        if q > best_q:
            second_q = best_q
            best_q = q
            best_d = d
        elif q > second_q:
            second_q = q
        if explore != 0:
            u = xoroshiro128p_uniform_float32(states, i)
            v = support[i, a, 0] + float32(_legacy_sample_atom(logits, i, a, m, s, u)) * support[i, a, 2]
            if v > draw_v:
                draw_v = v
                draw_d = d
                draw_q = q
    direction = best_d
    conv = best_q - second_q
    if explore != 0:
        direction = draw_d
        conv = draw_q - (second_q if draw_d == best_d else best_q)
    magnitude = _legacy_pick3(logits, support, states, i, MAG_OFFSET, explore)
    order = _legacy_pick3(logits, support, states, i, ORDER_OFFSET, explore)
    urgency = _legacy_pick3(logits, support, states, i, URGENCY_OFFSET, explore)
    if direction == HOLD or direction == FLAT:
        magnitude = 0
    actions[i, 0] = direction
    actions[i, 1] = magnitude
    actions[i, 2] = order
    actions[i, 3] = urgency
    conviction[i] = conv


@register((F32_2D, float32[::1], float32[::1], F32_2D, F32_2D, F32_2D))
@cuda.jit
def gather_project_kernel(p_next, rewards, discounts, support_next, support_proj, m):
    """The former projection: one thread per output atom, R * Z threads, each gathering over all Z sources."""
    t = cuda.grid(1)
    n_atoms = p_next.shape[1]
    if t < p_next.shape[0] * n_atoms:
        r = t // n_atoms
        k = float32(t - r * n_atoms)
        reward = rewards[r]
        discount = discounts[r]
        v_min_next = support_next[r, 0]
        dz_next = support_next[r, 2]
        v_min_proj = support_proj[r, 0]
        inv_dz_proj = float32(1.0) / support_proj[r, 2]
        top = float32(n_atoms - 1)
        acc = float32(0.0)
        for j in range(n_atoms):
            tz = reward + discount * (v_min_next + float32(j) * dz_next)
            b = min(max((tz - v_min_proj) * inv_dz_proj, float32(0.0)), top)
            w = float32(1.0) - abs(b - k)
            if w > float32(0.0):
                acc += p_next[r, j] * w
        m[r, t - r * n_atoms] = acc


# ---- timing ------------------------------------------------------------------------------------------


def time_op(body: Callable[[Any], None], stream: Any, args: argparse.Namespace) -> float:
    """us per call of `body(stream)` captured --reps times into one graph (best window of CUDA events)."""

    def step(s: Any) -> None:
        for _ in range(args.reps):
            body(s)

    graph = StepGraph("bench", step, stream, use_graph=True)
    for _ in range(max(args.warmup, 2)):  # the first replay runs eagerly, the second captures
        graph.replay()
    stream.synchronize()
    if SIMULATOR:
        t0 = time.perf_counter()
        graph.replay()
        stream.synchronize()
        return (time.perf_counter() - t0) / args.reps * 1e6
    best = float("inf")
    for _ in range(args.windows):
        start, end = cuda.event(timing=True), cuda.event(timing=True)
        start.record(stream)
        for _ in range(args.replays):
            graph.replay()
        end.record(stream)
        end.synchronize()
        best = min(best, cuda.event_elapsed_time(start, end) * 1e3 / (args.replays * args.reps))
    return best


def random_support(rng: np.random.Generator, shape: tuple[int, ...], z: int) -> np.ndarray:
    v_min = rng.uniform(-1.5, -0.1, shape).astype(np.float32)
    v_max = rng.uniform(0.1, 1.5, shape).astype(np.float32)
    dz = ((v_max.astype(np.float64) - v_min) / (z - 1)).astype(np.float32)
    return np.stack([v_min, v_max, dz], axis=-1)


def softmax64(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# ---- action selection and expected_q -----------------------------------------------------------------


def argmax_policy(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Evaluation policy and conviction from float32 E[Q][B, 13] (ties to the lowest bin), as the kernel."""
    acts = np.stack([q[:, o : o + n].argmax(axis=1) for o, n in ((0, 4), (4, 3), (7, 3), (10, 3))], axis=1)
    acts[np.isin(acts[:, 0], (HOLD, FLAT)), 1] = 0
    top2 = np.sort(q[:, :N_DIRECTIONS], axis=1)
    return acts.astype(np.int32), top2[:, -1] - top2[:, -2]


def bench_select(b: int, z: int, args: argparse.Namespace, stager: Stager, stream: Any) -> dict[str, Any]:
    rng = np.random.default_rng(1000 * b + z)
    logits = stager.upload_new((2 * rng.standard_normal((b, N_HEADS, z))).astype(np.float32))
    head = stager.upload_new(rng.standard_normal((b, head_width(z))).astype(np.float32))
    combined = device_empty((b, N_HEADS, z), np.float32)
    support = stager.upload_new(random_support(rng, (b, N_HEADS), z))
    states0 = xoroshiro_states_host(b, 7)
    states = stager.upload_new(states0)
    actions, conviction = device_empty((b, 4), np.int32), device_empty(b, np.float32)
    q, entropy = device_empty((b, N_HEADS), np.float32), device_empty((b, N_HEADS), np.float32)
    variance, util = device_empty((b, N_HEADS), np.float32), device_empty((b, N_HEADS), np.float32)
    res: dict[str, Any] = {"B": b, "Z": z, "select_us": {}, "checks": {}}

    def select(explore: bool, lanes: int | None) -> Callable[[Any], None]:
        return lambda s: select_actions(logits, support, states, actions, conviction, explore=explore, stream=s,
                                        lanes=lanes)  # fmt: skip

    def legacy(explore: bool) -> Callable[[Any], None]:
        flag = np.int32(1 if explore else 0)
        return lambda s: launch(legacy_action_select_kernel, b, logits, support, states, flag, actions, conviction,
                                stream=s, block=64)  # fmt: skip

    def chain(explore: bool) -> Callable[[Any], None]:
        def run(s: Any) -> None:
            dueling_combine_forward(head, combined, stream=s)
            select_actions(combined, support, states, actions, conviction, explore=explore, stream=s)
        return run

    def fused(explore: bool) -> Callable[[Any], None]:
        return lambda s: select_actions(head, support, states, actions, conviction, explore=explore, stream=s)

    for mode, explore in (("explore", True), ("eval", False)):
        times = {f"lanes={lanes}": time_op(select(explore, lanes), stream, args) for lanes in args.lanes}
        times["one thread per sample (before)"] = time_op(legacy(explore), stream, args)
        times["head rows: dueling combine, then select"] = time_op(chain(explore), stream, args)
        times["head rows: select with the combine in shared memory"] = time_op(fused(explore), stream, args)
        res["select_us"][mode] = times
        outs = []
        for run in (chain(explore), fused(explore)):
            stager.upload(states0, states)
            run(stream)
            outs.append([stager.download(a).view(np.uint8) for a in (actions, conviction, states)])
        res["checks"][f"{mode}: selecting from head rows gives the bits of combine + select"] = all(
            np.array_equal(x, y) for x, y in zip(*outs, strict=True))

        outputs = {}
        for lanes in args.lanes:  # the same bits from the same states, whatever the shape
            stager.upload(states0, states)
            select(explore, lanes)(stream)
            outputs[lanes] = (stager.download(actions), stager.download(conviction), stager.download(states))
        ref = outputs[LANES] if LANES in outputs else outputs[args.lanes[0]]
        res["checks"][f"{mode}: every lanes variant gives the same bits"] = all(
            all(np.array_equal(x.view(np.uint8), y.view(np.uint8)) for x, y in zip(got, ref, strict=True))
            for got in outputs.values()
        )
        if not explore:
            expected_q(logits, support, q, entropy, stream=stream)
            want_actions, want_conv = argmax_policy(stager.download(q))
            res["checks"]["eval: actions and conviction equal argmax of expected_q's E[Q], bit for bit"] = bool(
                np.array_equal(ref[0], want_actions)
                and np.array_equal(ref[1].view(np.uint32), want_conv.view(np.uint32))
            )

    res["expected_q_us"] = {
        "q + entropy": time_op(lambda s: expected_q(logits, support, q, entropy, stream=s), stream, args),
        "+ variance + utilisation": time_op(
            lambda s: expected_q(logits, support, q, entropy, stream=s, variance=variance, utilisation=util),
            stream, args),
    }  # fmt: skip
    expected_q(logits, support, q, entropy, stream=stream)
    plain = stager.download(q), stager.download(entropy)
    expected_q(logits, support, q, entropy, stream=stream, variance=variance, utilisation=util)
    res["checks"]["expected_q: same q and entropy bits with the second pass"] = all(
        np.array_equal(a.view(np.uint32), stager.download(d).view(np.uint32))
        for a, d in zip(plain, (q, entropy), strict=True)
    )
    return res


# ---- projection and loss -----------------------------------------------------------------------------


def project64(p, rewards, discounts, support_next, support_proj) -> np.ndarray:
    """Bellemare et al.'s floor/ceil scatter in float64, vectorised."""
    rows, z = p.shape
    atoms = support_next[:, :1].astype(np.float64) + np.arange(z) * support_next[:, 2:].astype(np.float64)
    tz = rewards[:, None].astype(np.float64) + discounts[:, None] * atoms
    b = np.clip((tz - support_proj[:, :1].astype(np.float64)) / support_proj[:, 2:].astype(np.float64), 0, z - 1)
    lo, hi = np.floor(b).astype(np.int64), np.ceil(b).astype(np.int64)
    out = np.zeros((rows, z))
    r = np.broadcast_to(np.arange(rows)[:, None], b.shape)
    p64 = p.astype(np.float64)
    np.add.at(out, (r, lo), p64 * (hi - b) + p64 * (lo == hi))
    np.add.at(out, (r, hi), p64 * (b - lo))
    return out


def bench_c51(rows: int, z: int, args: argparse.Namespace, stager: Stager, stream: Any) -> dict[str, Any]:
    rng = np.random.default_rng(10 * rows + z)
    host = (
        softmax64(2 * rng.standard_normal((rows, z))).astype(np.float32),
        (rng.normal(0, 0.5, rows) * np.where(np.arange(rows) % 5 == 0, 6, 1)).astype(np.float32),
        np.where(np.arange(rows) % 5 == 1, 0.0, rng.uniform(0.5, 0.99, rows)).astype(np.float32),
        random_support(rng, (rows,), z),
        random_support(rng, (rows,), z),
    )
    dev = tuple(stager.upload_new(x) for x in host)
    m_new, m_old = device_empty((rows, z), np.float32), device_empty((rows, z), np.float32)
    res: dict[str, Any] = {"R": rows, "Z": z, "checks": {}}
    res["project_us"] = {
        "scatter, a thread per row (now)": time_op(lambda s: c51_project(*dev, m_new, stream=s), stream, args),
        "gather, a thread per output atom (before)": time_op(
            lambda s: launch(gather_project_kernel, rows * z, *dev, m_old, stream=s), stream, args),
    }  # fmt: skip
    if args.sweep:
        for block in (32, 128, 256):
            from fox_numba.kernels.distributional import c51_project_kernel

            res["project_us"][f"scatter, blocks of {block}"] = time_op(
                lambda s, block=block: launch(c51_project_kernel, rows, *dev, m_new, stream=s, block=block), stream, args)  # fmt: skip
    c51_project(*dev, m_new, stream=stream)
    launch(gather_project_kernel, rows * z, *dev, m_old, stream=stream)
    new, old = stager.download(m_new), stager.download(m_old)
    res["checks"]["project: scatter equals the gather bit for bit"] = bool(
        np.array_equal(new.view(np.uint32), old.view(np.uint32))
    )
    res["checks"]["project: within 8 Z eps of float64"] = bool(np.all(np.abs(new - project64(*host)) <= 8 * z * EPS))

    logits = (2 * rng.standard_normal((rows, z))).astype(np.float32)
    weights = (rng.uniform(0.2, 2.0, rows) / rows).astype(np.float32)
    d_logits, d_weights = stager.upload_new(logits), stager.upload_new(weights)
    loss, dlogits = device_empty(rows, np.float32), device_empty((rows, z), np.float32)
    res["loss_us"] = time_op(lambda s: c51_loss(d_logits, m_new, d_weights, loss, dlogits, stream=s), stream, args)
    c51_loss(d_logits, m_new, d_weights, loss, dlogits, stream=stream)
    x, t, w = logits.astype(np.float64), new.astype(np.float64), weights.astype(np.float64)[:, None]
    log_p = x - x.max(axis=1, keepdims=True)
    log_p -= np.log(np.exp(log_p).sum(axis=1, keepdims=True))
    loss_ref = -(t * log_p).sum(axis=1)
    grad_ref = w * (t.sum(axis=1, keepdims=True) * np.exp(log_p) - t)
    spread = x.max(axis=1) - x.min(axis=1)
    res["checks"]["loss and gradient within the tests' tolerance of float64"] = bool(
        np.all(np.abs(stager.download(loss) - loss_ref) <= 4 * (z + 2) * EPS * (1 + spread + np.log(z)))
        and np.all(np.abs(stager.download(dlogits) - grad_ref) <= 4 * (z + 2) * EPS * w)
    )
    return res


# ---- report ------------------------------------------------------------------------------------------


def markdown(command: str, info: dict[str, Any], results: dict[str, Any], args: argparse.Namespace) -> str:
    clock = "wall clock of one replay (simulator: a smoke number)" if SIMULATOR else "CUDA events"
    lines = [
        *results_header("Action selection and C51 kernels", command, info),
        "",
        (
            f"Each op captured {args.reps} times in one CUDA graph; {args.warmup} warm-up replays, then the best of "
            f"{args.windows} windows of {args.replays} replays ({clock}); us per op. Inputs: logits 2 x N(0, 1), "
            "per-(sample, head) supports with v_min in [-1.5, -0.1] and v_max in [0.1, 1.5]."
        ),
        "",
        "## select_actions (13 heads)",
        "",
        "| B | Z | mode | shape | us | before / this |",
        "| ---: | ---: | --- | --- | ---: | ---: |",
    ]
    for r in results["select"]:
        for mode, times in r["select_us"].items():
            before = times["one thread per sample (before)"]
            for shape, us in times.items():
                lines.append(f"| {r['B']} | {r['Z']} | {mode} | {shape} | {us:.2f} | {before / us:.1f} |")
    lines += ["", "## expected_q (B x 13 heads)", "", "| B | Z | outputs | us |", "| ---: | ---: | --- | ---: |"]
    for r in results["select"]:
        lines += [f"| {r['B']} | {r['Z']} | {name} | {us:.2f} |" for name, us in r["expected_q_us"].items()]
    lines += ["", "## c51_project and c51_loss (R rows)", "", "| R | Z | kernel | us |", "| ---: | ---: | --- | ---: |"]
    for r in results["c51"]:
        lines += [f"| {r['R']} | {r['Z']} | c51_project: {name} | {us:.2f} |" for name, us in r["project_us"].items()]
        lines.append(f"| {r['R']} | {r['Z']} | c51_loss | {r['loss_us']:.2f} |")
    lines += ["", "## Checks", "", "| shape | check | ok |", "| --- | --- | --- |"]
    for r in results["select"]:
        lines += [f"| B={r['B']}, Z={r['Z']} | {name} | {ok} |" for name, ok in r["checks"].items()]
    for r in results["c51"]:
        lines += [f"| R={r['R']}, Z={r['Z']} | {name} | {ok} |" for name, ok in r["checks"].items()]
    lines += [
        "",
        (
            "Shapes: `lanes=16` is the production launch (8 samples per block of 128 threads, a thread per head, "
            "logits staged in shared memory); `lanes=n` runs the same kernel with n threads per sample; "
            "'one thread per sample (before)' is the kernel it replaced (7 draws, ties to the lowest direction). "
            "Earlier measurements: tools/results/select_c51_before_h200.md."
        ),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="results path without suffix (.md, .json)")
    parser.add_argument("--batch", type=int, nargs="+", default=[1024, 8192, 16384], help="samples B")
    parser.add_argument("--atoms", type=int, nargs="+", default=[21, 51], help="atoms Z")
    parser.add_argument("--rows", type=int, nargs="+", default=[8192, 32768], help="projection / loss rows R")
    parser.add_argument("--lanes", type=int, nargs="+", default=[16, 8, 4], help="threads per sample to time")
    parser.add_argument("--reps", type=int, default=20, help="ops captured per graph")
    parser.add_argument("--warmup", type=int, default=3, help="graph replays before timing")
    parser.add_argument("--replays", type=int, default=10, help="graph replays per timed window")
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--sweep", action="store_true", help="also time the projection at other block sizes")
    parser.add_argument("--tiny", action="store_true", help="a few samples of 5 atoms: a smoke run under the simulator")
    args = parser.parse_args(argv)
    command = "python3 tools/bench_select.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.tiny:
        args.batch, args.atoms, args.rows, args.lanes = [12], [5], [16], [LANES, 1]
        args.reps, args.warmup, args.replays, args.windows = 1, 2, 1, 1
    elif SIMULATOR:
        parser.error("under the CUDA simulator only --tiny runs (the full sizes take hours)")

    info = {"date_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M"), **machine()}
    stream = new_stream()
    stager = Stager(stream, chunk_bytes=16 << 20)
    results: dict[str, Any] = {"select": [], "c51": []}
    for z in args.atoms:
        for b in args.batch:
            results["select"].append(bench_select(b, z, args, stager, stream))
            print(json.dumps(results["select"][-1]), flush=True)
        for rows in args.rows:
            results["c51"].append(bench_c51(rows, z, args, stager, stream))
            print(json.dumps(results["c51"][-1]), flush=True)
    atomic_write_text(
        args.out.with_suffix(".json"),
        json.dumps({"command": command, "machine": info, **results}, indent=2) + "\n",
    )
    text = markdown(command, info, results, args)
    atomic_write_text(args.out.with_suffix(".md"), text)
    print(text)
    ok = all(all(r["checks"].values()) for group in results.values() for r in group)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
