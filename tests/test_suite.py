"""tools/suite.py and data/suite/: the committed suite loads, a bad suite file is refused naming the file and the key,
each run's command carries the market's store and derived settings, and the table's means, standard errors and
ratios are those of the runs' summary.json files. The runner itself is run end to end with a stand-in for
`fox train` (a real one takes minutes under the simulator); the stores are built for real (one-day markets)."""

from __future__ import annotations

import json
import math
import shutil
import statistics
import sys
import tarfile
from pathlib import Path

import pytest
from tool_loader import tool_module

from fox_numba.config import load_config
from fox_numba.errors import ConfigError
from fox_numba.market.default import DEFINITION_PATH, built_hash
from fox_numba.market.synthetic_definition import load_definition



@pytest.fixture(scope="module")
def suite():
    yield from tool_module("suite")


def test_the_committed_suite(suite):
    loaded = suite.load_suite(suite.SUITE)
    by_name = {m.name: m for m in loaded.markets}
    roles = [m.role for m in loaded.markets]
    assert roles.count("held_out") >= 2 and roles.count("seen") >= 3
    assert by_name["default"].definition_path.resolve() == DEFINITION_PATH
    assert len({m.definition.digest() for m in loaded.markets}) == len(loaded.markets)
    assert sum(m.definition.switching is not None for m in loaded.markets) >= 1
    for m in loaded.markets:
        if m.name != "default":
            assert m.definition_path.read_text().startswith(f"# Suite market `{m.name}`")
        cfg = load_config("default", None, [*loaded.plan, *m.overrides, *m.derived()])
        assert cfg.env.commission == m.definition.oracle.commission
        assert cfg.evaluation.probe_horizon_bars == m.definition.oracle.horizon_minutes
    assert by_name["high_cost"].definition.oracle.commission > 2 * by_name["default"].definition.oracle.commission
    assert cfg.folds.n_folds == 2 and cfg.folds.train_days + cfg.folds.val_days + cfg.folds.step_days == 120


def test_the_fresh_draw_is_the_suite_from_other_generator_seeds(suite):
    """data/suite/fresh.toml: every market of suite.toml, same definition file, role and plan, a seed of its own that
    no definition uses, so another store (digest) per market."""
    base, fresh = suite.load_suite(suite.SUITE), suite.load_suite(suite.SUITE.parent / "fresh.toml")
    assert fresh.plan == base.plan and len(fresh.markets) == len(base.markets)
    for b, f in zip(base.markets, fresh.markets, strict=True):
        assert f.name == f"{b.name}_fresh" and f.role == b.role and f.overrides == b.overrides
        assert f.definition_path.resolve() == b.definition_path.resolve() and f.derived() == b.derived()
        assert f.definition == b.definition.with_overrides(seed=f.seed)
        assert f.definition.digest() != b.definition.digest()
    seeds = [m.seed for m in fresh.markets]
    assert seeds == list(range(1001, 1008)) and not set(seeds) & {m.definition.market.seed for m in base.markets}


def write_suite(path: Path, markets: str, plan: str = 'set = ["folds.n_folds=2"]') -> Path:
    path.write_text(f"[plan]\n{plan}\n{markets}")
    return path


GOOD = f'[markets.a]\ndefinition = "{DEFINITION_PATH}"\nrole = "seen"\n'


@pytest.mark.parametrize(
    ("markets", "plan", "message"),
    [
        (GOOD + 'rol = "x"\n', None, r"markets\.a: unknown keys \['rol'\]"),
        ('[markets.a]\ndefinition = "nope.toml"\nrole = "seen"\n', None,
         r"markets\.a\.definition: .*nope\.toml not found"),
        (GOOD.replace('"seen"', '"heldout"'), None, r"markets\.a\.role: expected one of \('seen', 'held_out'\)"),
        (f'[markets.a]\ndefinition = "{DEFINITION_PATH}"\n', None, r"markets\.a lacks \['role'\]"),
        (GOOD + 'set = ["env.commission=3"]\n', None, r"markets\.a\.set: \['env\.commission=3'\] set keys the tool"),
        (GOOD + 'set = "learner.lr=1e-3"\n', None, r"markets\.a\.set: expected a list"),
        (GOOD + "seed = -1\n", None, r"markets\.a\.seed: expected an integer >= 0, got -1"),
        (GOOD + 'seed = "7"\n', None, r"markets\.a\.seed: expected an integer >= 0, got '7'"),
        (GOOD, 'set = ["run.seed=3"]', r"plan\.set: \['run\.seed=3'\] set keys the tool"),
        (GOOD, 'set = ["learner.lrr=1"]', r"markets\.a: config section 'learner' has no field 'lrr'"),
        (GOOD, 'sets = []', r"\[plan\] must hold exactly the key 'set'"),
        ("", None, r"no \[markets\.NAME\] tables"),
        (GOOD + "[extra]\n", None, r"unknown tables \['extra'\]"),
    ],
)
def test_bad_suite_files_name_the_file_and_key(suite, tmp_path, markets, plan, message):
    path = write_suite(tmp_path / "suite.toml", markets, *([plan] if plan else []))
    with pytest.raises(ConfigError, match=f"{path}: {message}"):
        suite.load_suite(path)


def test_missing_suite_file_and_bad_definition(suite, tmp_path):
    with pytest.raises(ConfigError, match="absent.toml: market suite not found"):
        suite.load_suite(tmp_path / "absent.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text(DEFINITION_PATH.read_text().replace("phi = 0.97", "phi = 1.5"))
    path = write_suite(tmp_path / "suite.toml", GOOD.replace(str(DEFINITION_PATH), "bad.toml"))
    with pytest.raises(ConfigError, match=r"bad\.toml: latent\.phi must be in \[0, 1\)"):
        suite.load_suite(path)


def test_market_choice_extra_arguments_and_the_command(suite, tmp_path):
    loaded = suite.load_suite(suite.SUITE)
    assert [m.name for m in suite.pick(loaded, "trade_flow, default")] == ["default", "trade_flow"]
    with pytest.raises(ConfigError, match=r"suite\.toml: --markets names \['nope'\], not in the suite"):
        suite.pick(loaded, "default,nope")
    suite.check_extra(["--preset", "default", "--set", "learner.lr=3e-4"])
    for extra in (["--store", "x.h5"], ["--set", "env.commission=1"], ["--set=run.out_dir=x"]):
        with pytest.raises(ConfigError, match="the extra fox train arguments"):
            suite.check_extra(extra)
    high_cost = suite.pick(loaded, "high_cost")[0]
    cmd = suite.market_command(high_cost, loaded, ["--preset", "default", "--set", "learner.lr=3e-4"],
                               tmp_path / "high_cost.h5", 3, tmp_path / "runs")
    assert cmd[:4] == [sys.executable, "-m", "fox_numba", "train"]
    sets = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--set"]
    assert sets == [*loaded.plan, "learner.lr=3e-4", "env.commission=15.0", "evaluation.probe_horizon_bars=15",
                    "run.seed=3", 'run.name="seed_3"', f'run.out_dir="{tmp_path / "runs" / "high_cost"}"']
    assert cmd[cmd.index("--store") + 1] == str(tmp_path / "high_cost.h5") and "--preset" in cmd


def test_honest_sharpe_reads_the_field_else_the_last_epoch(suite):
    last = [{"fold": 0, "last_val": {"sharpe_daily": 1.0}}, {"fold": 1, "last_val": {"sharpe_daily": 3.0}}]
    assert suite.honest_sharpe({"folds": last}) == (2.0, "last epoch")
    per_fold = [{**last[0], "honest_sharpe_mean": 4.0}, {**last[1], "honest_sharpe_mean": 5.0}]
    assert suite.honest_sharpe({"folds": per_fold}) == (4.5, "honest_sharpe_mean per fold")
    assert suite.honest_sharpe({"folds": last, "honest_sharpe_mean": -1.0}) == (-1.0, "honest_sharpe_mean of the run")
    assert suite.honest_sharpe({}) == (None, "last epoch")


def test_in_sample_sharpe_in_each_summary_format(suite):
    val = [{"fold": k, "val": {"sharpe_daily": v}} for k, v in enumerate((6.0, 8.0))]
    assert suite.in_sample_sharpe({"folds": val, "best_chosen_on": "validation"}) == 7.0  # chosen on validation
    assert suite.in_sample_sharpe({"folds": val, "best_chosen_on": "selection"}) is None  # out of sample, no peek
    peek = [{**f, "in_sample_best_val": {"sharpe_daily": v}} for f, v in zip(val, (9.0, 11.0), strict=True)]
    assert suite.in_sample_sharpe({"folds": peek, "best_chosen_on": "last"}) == 10.0
    assert suite.in_sample_sharpe({"folds": peek, "in_sample_best_sharpe_mean": 3.0}) == 3.0


def fold(k: int, honest: float, best: float, probe: float, oracle: float) -> dict:
    return {"fold": k, "best_epoch": 2, "val": {"sharpe_daily": best},
            "baselines": {"probe": {"sharpe_daily": probe}, "buy_and_hold": {"sharpe_daily": 0.5},
                          "oracle_sharpe": oracle},
            "kill": None, "last_val": {"sharpe_daily": honest}, "every_epoch_sharpe_mean": 0.0}


def write_run(runs: Path, market: str, seed: int, folds: list[dict], chosen: str = "validation") -> None:
    run = runs / market / f"seed_{seed}"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"folds": folds, "best_chosen_on": chosen}))


def test_tabulate_means_standard_errors_and_ratios(suite, tmp_path):
    runs = tmp_path / "runs"
    honest = {"calm": {0: (1.0, 3.0), 1: (2.0, 4.0), 2: (6.0, 8.0)}, "odd": {0: (-1.0, 0.0), 1: (0.0, 0.0)}}
    for market, seeds in honest.items():
        for seed, (h0, h1) in seeds.items():
            probe = 2.0 if market == "calm" else -1.0
            write_run(runs, market, seed, [fold(0, h0, h0 + 5, probe, 10.0), fold(1, h1, h1 + 5, probe, 14.0)])
    record = {"command": "python3 tools/suite.py --seeds 0 1 2", "wall_s": 30.0, "parallel": 2, "seeds": [0, 1, 2],
              "machine": {"date_utc": "2026-12-03 10:00", "device": "X"}, "suite": "s.toml", "runs": "elsewhere",
              "markets": {
                  "calm": {"role": "seen", "build": {"reused": True},
                           "runs": {str(s): {"returncode": 0, "wall_s": 10.0} for s in (0, 1, 2)}},
                  "odd": {"role": "held_out", "build": {"reused": False, "returncode": 0, "wall_s": 2.0},
                          "runs": {"0": {"returncode": 0, "wall_s": 9.0}, "1": {"returncode": 0, "wall_s": 9.0},
                                   "2": {"returncode": 1, "wall_s": 1.0, "error": "ValueError: boom"}}}}}
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps(record))
    out = tmp_path / "table"
    assert suite.main(["--tabulate", str(earlier), "--runs", str(runs), "--out", str(out)]) == 1  # odd seed 2 failed
    result = json.loads(out.with_suffix(".json").read_text())
    calm, odd = result["table"]["calm"], result["table"]["odd"]
    per_seed = [2.0, 3.0, 7.0]  # mean over the two folds of each seed's honest figure
    assert calm["honest"] == pytest.approx(4.0) and calm["n"] == 3 and calm["runs"] == 3
    assert calm["honest_se"] == pytest.approx(statistics.stdev(per_seed) / math.sqrt(3))
    assert calm["in_sample"] == pytest.approx(9.0) and calm["probe"] == 2.0 and calm["oracle"] == 12.0
    assert calm["agent_probe"] == pytest.approx(2.0) and calm["agent_oracle"] == pytest.approx(4.0 / 12.0)
    assert odd["n"] == 2 and odd["honest"] == pytest.approx(-0.25) and odd["agent_probe"] is None
    assert result["pooled"]["seen"]["honest"] == pytest.approx(4.0)
    assert result["pooled"]["held_out"]["n"] == 2 and result["pooled"]["held_out"]["honest"] == pytest.approx(-0.25)
    assert result["runs"] == str(runs) and result["markets"]["calm"]["runs"]["0"]["honest_source"] == "last epoch"
    text = out.with_suffix(".md").read_text()
    assert "| calm | seen | 3/3 | +4.00 ± 1.53 | +2.00 | +0.50 | +12.00 | 2.00 | 0.33 | +9.00 ± 1.53 | 10 |" in text
    assert "| odd | held_out | 2/3 | -0.25 ± 0.25 | -1.00 | +0.50 | +12.00 | n/a | -0.02 | +4.75 ± 0.25 | 6 |" in text
    assert "last epoch's validation Sharpe (chosen by nothing) in the 5 of 5 runs" in text
    assert "'in sample' is the validation Sharpe of each fold's epoch with the best validation Sharpe" in text
    assert "| odd | -0.50 | +0.00 | exit 1 |" in text and "Failed: odd seed 2 (exit 1: ValueError: boom)" in text


def test_the_epoch_table_averages_folds_then_seeds_then_markets(suite, tmp_path):
    """metrics.jsonl of two seeds x two folds x three epochs on a seen market and one run on a held-out one: each
    epoch's cell is the mean over folds, then seeds; the role row the mean over its markets; a run without
    metrics.jsonl adds nothing."""
    runs = tmp_path / "runs"
    curves = {("a", 0): [[1.0, 2.0, 3.0], [3.0, 4.0, 5.0]], ("a", 1): [[0.0, 0.0, 1.0], [2.0, 2.0, 3.0]],
              ("b", 0): [[-1.0, 1.0, 3.0]]}
    for (market, seed), folds in curves.items():
        write_run(runs, market, seed, [fold(k, 0.0, 0.0, 1.0, 10.0) for k in range(len(folds))])
        lines = [{"fold": k, "epoch": e, "val": {"sharpe_daily": v}}
                 for k, c in enumerate(folds) for e, v in enumerate(c)]
        (runs / market / f"seed_{seed}" / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    write_run(runs, "b", 1, [fold(0, 0.0, 0.0, 1.0, 10.0)])  # no metrics.jsonl
    record = {"command": "c", "wall_s": 1.0, "parallel": 1, "seeds": [0, 1], "machine": {"date_utc": "d"},
              "suite": "s", "runs": str(runs),
              "markets": {m: {"role": role, "build": {"reused": True},
                              "runs": {"0": {"returncode": 0}, "1": {"returncode": 0}}}
                          for m, role in (("a", "seen"), ("b", "held_out"))}}
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps(record))
    out = tmp_path / "table"
    assert suite.main(["--tabulate", str(earlier), "--out", str(out)]) == 0
    text = out.with_suffix(".md").read_text()
    # a: seed 0 folds mean [2, 3, 4], seed 1 [1, 1, 2] -> [1.5, 2, 3]; b: [-1, 1, 3]
    assert "| a | +1.50 | +2.00 | +3.00 |" in text and "| b | -1.00 | +1.00 | +3.00 |" in text
    assert "| **seen markets** | +1.50 | +2.00 | +3.00 |" in text
    assert "| **held_out markets** | -1.00 | +1.00 | +3.00 |" in text
    # by fold: a fold 0 seeds [1, 2, 3] and [0, 0, 1] -> [0.5, 1, 2], last - first 2 and 1 -> +1.50 (SE 0.50);
    # fold 1 [3, 4, 5] and [2, 2, 3] -> [2.5, 3, 4], 2 and 1; b one seed, no SE
    assert "| a fold 0 | +0.50 | +1.00 | +2.00 | +1.50 ± 0.50 |" in text
    assert "| a fold 1 | +2.50 | +3.00 | +4.00 | +1.50 ± 0.50 |" in text
    assert "| b fold 0 | -1.00 | +1.00 | +3.00 | +4.00 |" in text


FAKE_TRAIN = """import json, pathlib, sys
run = pathlib.Path(sys.argv[1]) / f"seed_{sys.argv[2]}"
run.mkdir(parents=True)
honest = float(sys.argv[2]) + (10.0 if "env.commission=15.0" in sys.argv else 0.0)
fold = {"fold": 0, "val": {"sharpe_daily": honest + 1}, "last_val": {"sharpe_daily": honest},
        "baselines": {"probe": {"sharpe_daily": 1.0}, "buy_and_hold": {"sharpe_daily": 0.0}, "oracle_sharpe": 8.0}}
(run / "summary.json").write_text(json.dumps({"folds": [fold]}))
print("trained", sys.argv[3:])
"""


def test_the_runner_end_to_end(suite, tmp_path, monkeypatch):
    """Stores built by `fox data synth` from one-day definitions (and reused on a second run), markets x seeds runs
    of a stand-in for `fox train` that receives the real arguments and writes a summary.json, then the table."""
    for name in ("default", "high_cost"):
        source = suite.SUITE.parent / ("../default_market.toml" if name == "default" else f"{name}.toml")
        text = source.read_text().replace("days = 120", "days = 1")
        (tmp_path / f"{name}.toml").write_text(text)
    (tmp_path / "suite.toml").write_text('[plan]\nset = ["folds.n_folds=1"]\n[markets.default]\ndefinition = '
                                         '"default.toml"\nrole = "seen"\n[markets.high_cost]\ndefinition = '
                                         '"high_cost.toml"\nrole = "held_out"\nseed = 7\n')
    script = tmp_path / "fake_train.py"
    script.write_text(FAKE_TRAIN)
    monkeypatch.setattr(suite, "train_command",
                        lambda args, seed, runs: [sys.executable, str(script), str(runs), str(seed), *args])
    stores, runs, out = tmp_path / "stores", tmp_path / "runs", tmp_path / "out"
    argv = ["--seeds", "0", "1", "--parallel", "3", "--suite", str(tmp_path / "suite.toml"), "--stores", str(stores),
            "--runs", str(runs), "--out", str(out), "--", "--preset", "smoke"]
    assert suite.main(argv) == 0
    result = json.loads(out.with_suffix(".json").read_text())
    for name in ("default", "high_cost"):
        store = stores / f"{name}.h5"
        seed = 7 if name == "high_cost" else None  # the suite file's seed reaches `fox data synth`
        assert built_hash(store) == load_definition(tmp_path / f"{name}.toml").with_overrides(seed=seed).digest()
        assert result["markets"][name]["seed"] == (seed or load_definition(tmp_path / f"{name}.toml").market.seed)
        assert result["markets"][name]["build"]["returncode"] == 0
    assert result["table"]["default"]["honest"] == pytest.approx(0.5)
    assert result["table"]["high_cost"]["honest"] == pytest.approx(10.5)
    log = (runs / "high_cost" / "seed_1.log").read_text()
    assert "'--preset', 'smoke'" in log and f"'--store', '{stores / 'high_cost.h5'}'" in log
    assert result["extra"] == ["--preset", "smoke"] and result["machine"]["device"]
    mtime = (stores / "default.h5").stat().st_mtime_ns
    for name in ("default", "high_cost"):
        for seed in (0, 1):
            (runs / name / f"seed_{seed}" / "summary.json").unlink()
            (runs / name / f"seed_{seed}").rmdir()
    assert suite.main(argv) == 0
    again = json.loads(out.with_suffix(".json").read_text())
    assert again["markets"]["default"]["build"] == {"reused": True}
    assert (stores / "default.h5").stat().st_mtime_ns == mtime


def test_keep_finished_trains_only_the_runs_left_and_sets_the_failed_ones_aside(suite, tmp_path, monkeypatch):
    """A suite whose run of seed 1 failed (its folder holds no summary.json, as after running out of GPU memory):
    without --keep-finished the stand-in refuses the existing folder, as `fox train` does; with it seed 0 is kept
    untouched, seed 1's folder and log move to seed_1.failed-1 and it trains again, and the table counts both."""
    (tmp_path / "suite.toml").write_text(f'[plan]\nset = ["folds.n_folds=1"]\n[markets.a]\ndefinition = '
                                         f'"{DEFINITION_PATH}"\nrole = "seen"\n')
    script = tmp_path / "fake_train.py"
    script.write_text(FAKE_TRAIN)
    monkeypatch.setattr(suite, "train_command",
                        lambda args, seed, runs: [sys.executable, str(script), str(runs), str(seed), *args])
    monkeypatch.setattr(suite, "build_stores", lambda markets, stores, parallel: {m.name: {"reused": True}
                                                                                  for m in markets})
    runs, out = tmp_path / "runs", tmp_path / "out"
    argv = ["--seeds", "0", "1", "--suite", str(tmp_path / "suite.toml"), "--stores", str(tmp_path / "stores"),
            "--runs", str(runs), "--out", str(out)]
    assert suite.main(argv) == 0
    kept = (runs / "a" / "seed_0" / "summary.json").read_bytes()
    (runs / "a" / "seed_1" / "summary.json").unlink()  # seed 1 failed: its folder stays, with what it wrote
    (runs / "a" / "seed_1" / "train.log").write_text("out of memory")
    assert suite.main(argv) == 1  # the stand-in, as fox train, refuses a folder that exists
    assert suite.main([*argv, "--keep-finished"]) == 0
    assert (runs / "a" / "seed_0" / "summary.json").read_bytes() == kept
    assert (runs / "a" / "seed_1.failed-1" / "train.log").read_text() == "out of memory"
    assert (runs / "a" / "seed_1.failed-1.log").is_file() and (runs / "a" / "seed_1" / "summary.json").is_file()
    result = json.loads(out.with_suffix(".json").read_text())
    assert result["markets"]["a"]["runs"]["0"]["kept"] and "kept" not in result["markets"]["a"]["runs"]["1"]
    assert result["table"]["a"]["n"] == 2 and result["table"]["a"]["honest"] == pytest.approx(0.5)
    assert "1 runs finished by earlier calls were kept" in out.with_suffix(".md").read_text()
    with pytest.raises(SystemExit):
        suite.main(["--from-runs", "--keep-finished", "--runs", str(runs), "--out", str(out)])


def test_from_runs_tabulates_what_the_run_folders_hold(suite, tmp_path):
    """A suite finished by several cut-short calls: --from-runs trains nothing, counts a run with a summary.json as
    finished and one without as not run, and the table says it was tabulated, not timed."""
    runs, out = tmp_path / "runs", tmp_path / "table"
    (tmp_path / "suite.toml").write_text(f'[plan]\nset = ["folds.n_folds=2"]\n[markets.a]\ndefinition = '
                                         f'"{DEFINITION_PATH}"\nrole = "seen"\n')
    write_run(runs, "a", 0, [fold(0, 1.0, 2.0, 0.5, 9.0), fold(1, 3.0, 4.0, 0.5, 9.0)])
    write_run(runs, "a", 2, [fold(0, 4.0, 5.0, 0.5, 9.0), fold(1, 6.0, 7.0, 0.5, 9.0)])
    argv = ["--from-runs", "--runs", str(runs), "--seeds", "0", "1", "2", "--suite", str(tmp_path / "suite.toml"),
            "--stores", str(tmp_path / "no_stores"), "--out", str(out), "--", "--preset", "default"]
    assert suite.main(argv) == 1  # seed 1 was not run
    assert not (tmp_path / "no_stores").exists()
    result = json.loads(out.with_suffix(".json").read_text())
    a = result["table"]["a"]
    assert a["n"] == 2 and a["runs"] == 3 and a["honest"] == pytest.approx(3.5)
    assert a["honest_se"] == pytest.approx(statistics.stdev([2.0, 5.0]) / math.sqrt(2))
    assert result["wall_s"] is None and result["extra"] == ["--preset", "default"]
    text = out.with_suffix(".md").read_text()
    assert "tabulated from run folders trained by earlier calls" in text
    assert "| a | +2.00 | not run | +5.00 |" in text and "Failed: a seed 1 (not run)" in text


def test_pack_writes_the_runs_records_the_same_bytes_each_time(suite, tmp_path):
    """--pack (with --from-runs here): one gzip tar under runs_NAME/ holding each run's summary.json and metrics.jsonl
    (no checkpoint), the same bytes when packed again from a copy made later; a name without .tgz is refused."""
    runs, out = tmp_path / "runs", tmp_path / "table"
    (tmp_path / "suite.toml").write_text(f'[plan]\nset = ["folds.n_folds=2"]\n[markets.a]\ndefinition = '
                                         f'"{DEFINITION_PATH}"\nrole = "seen"\n')
    for seed in (0, 1):
        write_run(runs, "a", seed, [fold(0, 1.0 + seed, 2.0, 0.5, 9.0)])
        (runs / "a" / f"seed_{seed}" / "metrics.jsonl").write_text('{"fold": 0, "epoch": 0, "val": {}}\n')
        (runs / "a" / f"seed_{seed}" / "fold_00").mkdir()
        (runs / "a" / f"seed_{seed}" / "fold_00" / "best.h5").write_bytes(b"checkpoint")
    argv = ["--from-runs", "--runs", str(runs), "--seeds", "0", "1", "--suite", str(tmp_path / "suite.toml"),
            "--out", str(out), "--pack"]
    assert suite.main([*argv, str(tmp_path / "runs_x.tgz")]) == 0
    with tarfile.open(tmp_path / "runs_x.tgz") as tar:
        assert tar.getnames() == [f"runs_x/a/seed_{s}/{f}" for s in (0, 1) for f in ("metrics.jsonl", "summary.json")]
        assert json.loads(tar.extractfile("runs_x/a/seed_1/summary.json").read()) == json.loads(
            (runs / "a" / "seed_1" / "summary.json").read_text())
    copy = tmp_path / "copy"
    shutil.copytree(runs, copy)
    (tmp_path / "again").mkdir()
    assert suite.main([*argv[:2], str(copy), *argv[3:], str(tmp_path / "again" / "runs_x.tgz")]) == 0
    assert (tmp_path / "again" / "runs_x.tgz").read_bytes() == (tmp_path / "runs_x.tgz").read_bytes()
    with pytest.raises(SystemExit):
        suite.main([*argv, str(tmp_path / "runs_x.tar")])


FAKE_EVALUATE = """import json, sys
from pathlib import Path
checkpoint, margin = Path(sys.argv[1]), float(sys.argv[3].split("=")[1])
if not checkpoint.is_file():
    sys.exit("no checkpoint " + str(checkpoint))
print("evaluating " + str(checkpoint), file=sys.stderr, flush=True)
fold, seed = int(checkpoint.parent.name[5:]), int(checkpoint.parent.parent.name[5:])
print(json.dumps({"agent_sharpe_daily": 10 * margin + fold + 0.5 * seed, "days": 3}, indent=1))
"""


def test_rescore_scores_each_fold_checkpoint_again(suite, tmp_path, monkeypatch):
    """--tabulate --rescore: one `fox evaluate --set` per fold checkpoint of every finished run (a stand-in prints a
    figure from the margin, fold and seed), the fold and honest figures replaced, pooled and paired as any suite; a
    run whose checkpoint is missing ends with the evaluation's error instead of a figure, and one whose best.h5 was
    chosen on its validation days (in sample) is refused."""
    runs = tmp_path / "runs"
    for seed in (0, 1, 2):
        write_run(runs, "calm", seed, [fold(0, 1.0, 2.0, 0.5, 9.0), fold(1, 3.0, 4.0, 0.5, 9.0)], chosen="last")
        for k in (0, 1):
            if (seed, k) != (2, 1):
                (runs / "calm" / f"seed_{seed}" / f"fold_{k:02d}").mkdir()
                (runs / "calm" / f"seed_{seed}" / f"fold_{k:02d}" / "best.h5").write_bytes(b"ck")
    record = {"command": "python3 tools/suite.py --seeds 0 1 2", "wall_s": 30.0, "parallel": 2, "seeds": [0, 1, 2],
              "machine": {"date_utc": "2026-12-06 10:00", "device": "X"}, "suite": "s.toml", "runs": str(runs),
              "markets": {"calm": {"role": "seen", "build": {"reused": True},
                                   "runs": {str(s): {"returncode": 0, "wall_s": 10.0} for s in (0, 1, 2)}}}}
    earlier, out = tmp_path / "earlier.json", tmp_path / "rescored_margin0.2"  # a dot in the name stays
    earlier.write_text(json.dumps(record))
    script = tmp_path / "fake_evaluate.py"
    script.write_text(FAKE_EVALUATE)
    monkeypatch.setattr(suite, "evaluate_command", lambda checkpoint, sets: [
        sys.executable, str(script), str(checkpoint), *suite.set_options(sets)])
    argv = ["--tabulate", str(earlier), "--rescore", "evaluation.hold_margin=0.2", "--parallel", "3", "--out", str(out)]
    assert suite.main(argv) == 1  # seed 2's fold 1 has no checkpoint
    result = json.loads((tmp_path / "rescored_margin0.2.json").read_text())
    in_sample = runs / "calm" / "seed_1" / "summary.json"
    in_sample.write_text(in_sample.read_text().replace('"last"', '"validation"'))
    assert suite.main([*argv[:-1], str(tmp_path / "again")]) == 1
    again = json.loads((tmp_path / "again.json").read_text())["markets"]["calm"]["runs"]["1"]
    assert again["honest"] is None and "chosen on the validation days" in again["error"]
    calm = result["markets"]["calm"]["runs"]
    for seed in (0, 1):  # folds 2 + 0 + 0.5 seed and 2 + 1 + 0.5 seed
        assert [row["agent"] for row in calm[str(seed)]["folds"]] == pytest.approx([2 + 0.5 * seed, 3 + 0.5 * seed])
        assert calm[str(seed)]["honest"] == pytest.approx(2.5 + 0.5 * seed)
    assert calm["2"]["honest"] is None and "no checkpoint" in calm["2"]["error"]
    assert result["table"]["calm"]["honest"] == pytest.approx(2.75) and result["table"]["calm"]["n"] == 2
    assert result["rescore"] == ["evaluation.hold_margin=0.2"] and result["rescored_from"] == str(earlier)
    text = (tmp_path / "rescored_margin0.2.md").read_text()
    assert "with `--set evaluation.hold_margin=0.2` on the fold's validation days" in text
    assert result["command"].endswith("--rescore evaluation.hold_margin=0.2 --parallel 3 --out " + str(out))
    with pytest.raises(SystemExit):
        suite.main(["--rescore", "evaluation.hold_margin=0.2", "--out", str(out)])
