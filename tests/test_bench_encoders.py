"""tools/bench_encoders.py's numba half at its --tiny shapes, without torch: our encoders pass the tool's own check
against the float64 references, its check refuses a result off by 0.1%, and its timed step (the learner's share:
forward over 2S windows, gradients from S) replays under StepGraph's launch-trace check, which refuses a body that a
captured graph would replay differently. The torch half and the GPU numbers come from the H200 run."""

import importlib.util
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "bench_encoders.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_encoders", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("which", [0, 1], ids=["mamba2", "tlob"])
def test_the_tools_check_and_timed_step_at_tiny_size(bench, stream, stager, which):
    args, command = bench.parse(["--out", "unused", "--tiny"])
    assert command.endswith("--out unused --tiny") and (args.samples, args.warmup, args.replays) == (2, 2, 1)
    enc = bench.encoders(args)[which]
    params = enc.params(args.seed)
    inputs = bench.make_inputs(enc, 8 * enc.seq, 2 * enc.seq, 2 * args.samples, args.samples, 1)
    assert (inputs.rows - inputs.day_first[inputs.rows] < enc.seq - 1).any()  # a window clamped at its day's start
    ref = bench.reference_check(enc, params, inputs)
    ours = bench.ours_check(enc, params, inputs, stager, stream)
    result = bench.compare(ref, {"ours": ours})
    assert result["ok"], result
    assert [r["array"] for r in result["arrays"]] == list(ref) and set(ours) == set(ref)
    off = {k: v * 1.001 if k == "out" else v for k, v in ours.items()}
    assert not bench.compare(ref, {"ours": off})["ok"]

    step = bench.Ours(enc, params, inputs, 2 * args.samples, args.samples, backward=True, stager=stager,
                      stream=stream)
    assert bench.time_ours(step.step, stream, args) > 0
    replayed = step.results()
    assert set(replayed) == {"out", *(name for name, _ in enc.entries())}
    assert bench.compare(ref, {"ours": {"out": replayed.pop("out"), **enc.named(replayed)}})["ok"]
