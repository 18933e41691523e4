"""The `fox` command line explains itself and fails plainly."""

import dataclasses
import inspect
import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from fox_numba.cli import app, cache_app, data_app, resolve_config
from fox_numba.config import PRESETS
from fox_numba.device.runtime import SIMULATOR
from fox_numba.market.store import write_store
from fox_numba.walkforward.report import headline

runner = CliRunner()

COMMANDS = [
    ["data"],
    ["data", "synth"],
    ["data", "import"],
    ["data", "inspect"],
    ["collect"],
    ["train"],
    ["evaluate"],
    ["profile"],
    ["sweep"],
    ["cache"],
    ["cache", "warm"],
]


def test_top_level_help_lists_every_command():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for name in ("data", "collect", "train", "evaluate", "profile", "sweep", "cache"):
        assert name in result.output


def test_top_level_help_gives_each_command_a_whole_sentence():
    """Each command's line in `fox --help` is its docstring's first paragraph, one sentence, whole: rich keeps a
    help text's line breaks, so a summary wrapped in the source broke mid-sentence in the listing."""
    for group, prefix in ((app, []), (data_app, ["data"]), (cache_app, ["cache"])):
        output = runner.invoke(app, [*prefix, "--help"], env={"COLUMNS": "80"}).output
        listing = " ".join(line.strip("│ ") for line in output.split("Commands")[1].splitlines())
        listing = " ".join(listing.split())
        for info in group.registered_commands:
            first = inspect.cleandoc(info.help or info.callback.__doc__).split("\n\n")[0]
            assert "\n" not in first and first.endswith(".") and first.count(". ") == 0, first
            assert f"{info.name or info.callback.__name__} {first}" in listing


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_explains_itself(command):
    result = runner.invoke(app, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output
    # The command's one-line description is shown, not just the usage line.
    assert len([line for line in result.output.splitlines() if line.strip()]) > 4


def test_the_headline_falls_back_to_the_per_bar_sharpe_and_says_why():
    """One validation day a fold (the smoke preset): no daily Sharpe can be formed, so the per-bar one leads."""
    base = {"best_chosen_on": "last", "across_folds": {"all_validation_days": {"sharpe_bar": 0.25}}}
    line = headline({**base, "honest_sharpe_mean": None, "in_sample_best_sharpe_mean": None})
    assert line.startswith("validation Sharpe: per bar +0.25 (every fold's validation days, out of sample")
    assert "daily n/a (it needs 2+ validation days a fold: folds.val_days)" in line and "+0.00" not in line
    line = headline({**base, "honest_sharpe_mean": 1.5, "in_sample_best_sharpe_mean": 2.0})
    assert line.startswith("validation Sharpe: daily +1.50 (mean across folds, out of sample")
    assert "per bar +0.25" in line and line.endswith("validation days) +2.00")


@pytest.mark.parametrize("store", ["plain.h5", r"C:\data\es.h5", 'a "quoted" name.h5', "tab\there.h5"])
def test_store_option_reaches_the_config_verbatim(store):
    assert resolve_config("smoke", None, None, store).market.store == store
    assert resolve_config("smoke", None, ["market.store=other.h5"], store).market.store == "other.h5"  # --set last


def run_fox(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fox_numba", *args], capture_output=True, text=True, timeout=600
    )


def test_no_arguments_shows_help():
    proc = run_fox()
    assert "Usage:" in proc.stdout + proc.stderr
    assert proc.returncode == 2


def test_bad_override_exits_1_with_one_line():
    proc = run_fox("train", "--preset", "smoke", "--set", "learner.lr=abc")
    assert proc.returncode == 1
    assert proc.stderr.strip() == "fox: error: learner.lr: expected float, got str 'abc'"
    assert "Traceback" not in proc.stderr


def test_a_name_outside_a_fields_choices_exits_1_before_any_run_folder(tmp_path):
    proc = run_fox("train", "--preset", "smoke", "--set", 'run.precision="fp16"', "--set",
                   f'run.out_dir="{tmp_path}"')
    assert proc.returncode == 1
    assert proc.stderr.strip() == "fox: error: run.precision: 'fp16' is not one of fp32, tf32, bf16"
    assert not any(tmp_path.iterdir())


@pytest.fixture(scope="module")
def stores(four_day_market, four_day_store, tmp_path_factory):
    """A four-day synthetic store (the smoke preset's folds span 4 days), and the same without trades."""
    no_trades = [dataclasses.replace(day, trades=None) for day in four_day_market.days]
    path = tmp_path_factory.mktemp("stores") / "no_trades.h5"
    return four_day_store, write_store(path, four_day_market.instrument, no_trades)


STAGES = [["collect"], ["train"], ["profile"]]


def test_profile_prints_the_stage_and_kernel_tables(half_hour_store, tmp_path):
    """One smoke warm-up epoch, one timed epoch, the same with run.graphs flipped, 2 eager steps per stage for
    the kernel tables. A quarter of the smoke preset's environments, half its network width and fewer atoms: the
    tables' rows and steps do not depend on the sizes, the simulator's time does."""
    small = ["env.n_envs=4", "network.hidden=8", "network.n_atoms=5", "learner.batch_size=4", "learner.buffer_size=64"]
    proc = run_fox("profile", "--preset", "smoke", "--store", str(half_hour_store), "--epochs", "1", "--steps", "2",
                   "--set", f"run.out_dir={json.dumps(str(tmp_path))}", "--set", 'run.name="prof"',
                   *(a for s in small for a in ("--set", s)))
    assert proc.returncode == 0, proc.stderr
    assert ("timings under the CUDA simulator mean nothing" in proc.stdout) == SIMULATOR
    result = json.loads((tmp_path / "prof" / "profile.json").read_text())
    assert set(result["stages"]) == {"collect", "train", "evaluate"}
    assert abs(sum(st["share"] for st in result["stages"].values()) - 1.0) < 1e-9
    train = {r["kernel"]: r for r in result["kernels"]["train"]}
    assert any(name.startswith("dense_strided.") or name.startswith("gemm.") for name in train)
    assert result["stages"]["train"]["launches_per_step"] == sum(r["calls_per_step"] for r in train.values())
    stages = result["stages"]
    collect_steps = PRESETS["smoke"]["env.collect_steps"]
    expected = {"collect": collect_steps, "train": PRESETS["smoke"]["learner.steps_per_epoch"], "evaluate": 29}
    assert {k: st["steps_per_epoch"] for k, st in stages.items()} == expected
    for st in stages.values():
        assert st["graphs_off_ms"] == st["mean_ms"]  # smoke: run.graphs = false
        assert (st["graphs_on_ms"] is None) == SIMULATOR  # the simulator has no graphs to time
        assert st["graphs_on_ms"] is None or st["graphs_on_ms"] > 0
    for stage, rows in result["kernels"].items():
        for r in rows:  # the kernel's GPU time in one epoch over the epoch's time
            assert r["epoch_share"] == pytest.approx(r["total_ms"] / 2 * stages[stage]["steps_per_epoch"]
                                                     / result["epoch_ms"], rel=1e-12)
    assert ("run.graphs=true" in proc.stderr) != SIMULATOR  # on a GPU the second window flips the mode
    md = (tmp_path / "prof" / "profile.md").read_text()
    assert "| ms, graphs on | ms, graphs off |" in md and md.count("| share of epoch |") == 3


@pytest.mark.parametrize("command", STAGES, ids=" ".join)
def test_stages_refuse_a_store_without_trades(command, stores):
    proc = run_fox(*command, "--preset", "smoke", "--store", str(stores[1]))
    assert proc.returncode == 1, proc.stderr
    assert "no trades data" in proc.stderr and "fox data import" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.no_gpu_only("without --preset a GPU takes the default preset, too large for this 4-day store")
def test_collect_prints_the_rollout_metrics(half_hour_store):
    """One smoke epoch of collection on fold 0 (env.n_envs x env.collect_steps steps), on half-hour days with
    half the smoke preset's environments and network width and fewer atoms (--set on top of the preset the
    machine gets): the metrics and their checks do not depend on the sizes, the simulator's time does."""
    small = ["env.n_envs=8", "network.hidden=8", "network.n_atoms=5"]
    proc = run_fox("collect", "--store", str(half_hour_store), "--json", *(a for s in small for a in ("--set", s)))
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads(proc.stdout)
    assert metrics["steps"] == 8 * PRESETS["smoke"]["env.collect_steps"]
    assert 0.0 <= metrics["active_frac"] <= 1.0
    shares = metrics["short_frac"] + metrics["hold_frac"] + metrics["long_frac"] + metrics["flat_frac"]
    assert abs(shares - 1.0) < 1e-9
    assert "no CUDA GPU" in proc.stderr and "preset smoke" in proc.stderr  # the preset that fits the machine


@pytest.mark.no_gpu_only("the default preset is refused only where there is no GPU")
def test_gpu_presets_are_refused_without_a_gpu(stores):
    proc = run_fox("train", "--preset", "default", "--store", str(stores[0]))
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        "fox: error: --preset default is sized for a GPU and this machine has none; use --preset smoke (or run on a GPU)"
    )


@pytest.mark.skipif(not SIMULATOR, reason="tests the machine without a GPU: there nothing is compiled to cache")
def test_cache_warm_says_the_simulator_compiles_nothing():
    proc = run_fox("cache", "warm")
    assert proc.returncode == 2
    assert proc.stderr == ("fox: error: the CUDA simulator compiles nothing: run `fox cache warm` on a machine with "
                           "a GPU\n")


def test_evaluate_refuses_a_missing_checkpoint(tmp_path):
    missing = tmp_path / "runs" / "r" / "fold_00" / "best.h5"
    proc = run_fox("evaluate", str(missing))
    assert proc.returncode == 1
    assert proc.stderr == f"fox: error: {missing}: checkpoint not found\n"


def test_resume_refuses_a_missing_run_folder(tmp_path):
    proc = run_fox("train", "--resume", str(tmp_path / "nosuch_run"))
    assert proc.returncode == 1
    assert proc.stderr == f"fox: error: {tmp_path / 'nosuch_run'}: run folder not found\n"


def test_an_unknown_preset_is_named_on_any_machine():
    """On a machine without a GPU too, where a known GPU preset is refused for the machine's sake."""
    proc = run_fox("train", "--preset", "nosuch")
    assert proc.returncode == 1
    assert proc.stderr == f"fox: error: unknown preset 'nosuch' (presets: {', '.join(PRESETS)})\n"


def test_stages_refuse_a_missing_store(tmp_path):
    proc = run_fox("train", "--store", str(tmp_path / "nope.h5"))
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"fox: error: {tmp_path / 'nope.h5'}: market store not found")


def test_unwritable_output_is_one_line_not_a_traceback(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    proc = run_fox("data", "synth", "--days", "1", "--out", str(blocker / "market.h5"))
    assert proc.returncode == 1
    assert proc.stderr.startswith("fox: error: ") and str(blocker) in proc.stderr
    assert "Traceback" not in proc.stderr


def test_train_refuses_a_market_too_short_for_its_folds(stores):
    proc = run_fox("train", "--preset", "smoke", "--store", str(stores[0]), "--set", "folds.n_folds=6")  # 8 days
    assert proc.returncode == 1
    assert "need 8 trading days; the market has 4" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_the_cli_starts_without_numba():
    """`fox ... --help` and the data commands start without importing numba (0.2 s of CPU at every start): the
    synthetic book, the only numba code below the CLI's imports, is imported where a day is simulated."""
    code = "import sys, fox_numba.cli; print(sorted(m for m in sys.modules if m.split('.')[0] == 'numba'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_train_waits_for_a_cold_cache_fill_before_its_first_kernel(monkeypatch, four_day_store):
    """`fox train` enters the kernel-cache fill (kernels/warm_cache.py Prewarm) before it reads its market and leaves
    it, after `ready`, before the training (the first kernel launch) starts."""
    from fox_numba.errors import FoxError
    from fox_numba.kernels import warm_cache
    from fox_numba.walkforward import driver

    events = []

    class Recorder:
        def __init__(self, log):
            pass

        def __enter__(self):
            events.append("fill")
            return self

        def ready(self):
            events.append("ready")

        def __exit__(self, *exc):
            events.append("left")

    def features(*args, **kwargs):
        events.append("market")
        return load_features(*args, **kwargs)

    def stop(*args, **kwargs):
        events.append("training")
        raise FoxError("stopped before the first kernel")

    load_features = driver.load_features
    monkeypatch.setattr(warm_cache, "Prewarm", Recorder)
    monkeypatch.setattr(driver, "load_features", features)
    monkeypatch.setattr(driver, "train_run", stop)
    run = CliRunner().invoke(app, ["train", "--preset", "smoke", "--store", str(four_day_store)])
    assert run.exit_code != 0 and "stopped before the first kernel" in str(run.exception)
    assert events == ["fill", "market", "ready", "left", "training"]
