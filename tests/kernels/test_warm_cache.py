"""`fox cache warm` and a stage's fill of a cold cache (kernels/warm_cache.py): every cacheable registered kernel in
exactly one share, the shares near equal, each share's process run and its failure reported, the folder marked only
after a complete fill, one filler at a time (the others wait), the share processes killed when a stage stops early;
on a GPU, a kernel compiled by a share's process is loaded from the cache by the next process, not compiled
again."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from fox_numba.device import kernel_cache, runtime
from fox_numba.kernels import warm_cache
from fox_numba.device.registry import KERNELS
from fox_numba.device.runtime import SIMULATOR
from fox_numba.errors import ConfigError


def test_shares_split_the_kernels_once_each_and_near_equal():
    kernels = {"a": 3, "b": 1, "c": 1, "d": 2, "e": 1}
    plan = warm_cache.shares(kernels, 3)
    assert sorted(k for share in plan for k in share) == sorted(kernels)
    assert [sum(kernels[k] for k in share) for share in plan] == [3, 3, 2]
    assert plan == warm_cache.shares(dict(reversed(kernels.items())), 3)  # the order given does not matter
    assert warm_cache.shares(kernels, 10) == [[k] for k in ("a", "d", "b", "c", "e")]
    assert warm_cache.shares(kernels, 0) == [["a", "d", "b", "c", "e"]]


def test_every_registered_kernel_is_loaded():
    kernels = warm_cache.load_all_kernels()
    assert len(kernels) >= 150 and set(kernels) <= set(KERNELS)
    assert all(n >= 1 for n in kernels.values())
    assert {"fox_numba.device.elementwise.fill_f32", "fox_numba.kernels.optim.polyak_update"} <= set(kernels)


WORKER = """import os, pathlib, sys
names = sys.argv[2:]
pathlib.Path(sys.argv[1], f"{os.getpid()}.txt").write_text(" ".join(names))  # one file a share, whatever the timing
if "fox_numba.device.elementwise.fill_f32" in names:
    print("compiling fill_f32 failed")
    sys.exit(5)
"""


def test_warm_runs_every_share_and_reports_a_failed_one(tmp_path, monkeypatch):
    script, seen = tmp_path / "worker.py", tmp_path / "seen"
    script.write_text(WORKER)
    seen.mkdir()
    kernels = warm_cache.load_all_kernels()  # imported before SIMULATOR is patched, which the kernels' modules read
    monkeypatch.setattr(runtime, "SIMULATOR", False)
    (tmp_path / "kernels-x").mkdir()
    monkeypatch.setattr(warm_cache, "cache_folder", lambda: tmp_path / "kernels-x")
    monkeypatch.setattr(warm_cache, "marker", lambda folder: folder / "warmed-sm90")
    monkeypatch.setattr(warm_cache, "WORKER", (sys.executable, str(script), str(seen)))
    done = warm_cache.warm(3)
    shares = [p.read_text().split() for p in sorted(seen.iterdir())]
    assert len(shares) == done.workers == 3 and sorted(sum(shares, [])) == sorted(kernels)
    assert (done.kernels, done.signatures, done.folder) == (len(kernels), sum(kernels.values()), tmp_path / "kernels-x")
    assert len(done.failures) == 1 and "exit 5" in done.failures[0] and "compiling fill_f32 failed" in done.failures[0]
    assert not (tmp_path / "kernels-x" / "warmed-sm90").exists()  # an incomplete fill leaves no mark


def test_nothing_to_warm_under_the_simulator_or_without_a_cache(monkeypatch):
    if SIMULATOR:
        with pytest.raises(warm_cache.CannotWarm, match="simulator"):
            warm_cache.warm(1)
    monkeypatch.setattr(runtime, "SIMULATOR", False)
    monkeypatch.setattr(warm_cache, "cache_folder", lambda: None)
    with pytest.raises(warm_cache.CannotWarm, match="cache is off"):
        warm_cache.warm(1)


def test_background_workers_follow_the_variable_else_the_cores(monkeypatch):
    assert warm_cache.background_workers({warm_cache.WORKERS_ENV: "3"}) == 3
    assert warm_cache.background_workers({warm_cache.WORKERS_ENV: "0"}) == 0
    with pytest.raises(ConfigError, match="FOX_COMPILE_WORKERS='many'"):
        warm_cache.background_workers({warm_cache.WORKERS_ENV: "many"})
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert warm_cache.background_workers({}) == 15
    monkeypatch.setattr(os, "cpu_count", lambda: warm_cache.MIN_BACKGROUND_WORKERS)  # one short of worth it
    assert warm_cache.background_workers({}) == 0


SLEEPER = """import os, pathlib, sys, time
pathlib.Path(sys.argv[1], "+".join(sys.argv[2:]) + ".started").touch()
time.sleep(float(os.environ["SHARE_SECONDS"]))
pathlib.Path(sys.argv[1], "+".join(sys.argv[2:]) + ".done").touch()
"""


@pytest.fixture
def fake_gpu_cache(tmp_path, monkeypatch):
    """A cache folder on a pretend GPU machine whose share processes sleep SHARE_SECONDS (0.2 unless a test sets
    it), leaving NAMES.started and NAMES.done in `seen`; and the list of lines the stage logs."""
    folder, seen, script = tmp_path / "kernels-x", tmp_path / "seen", tmp_path / "sleeper.py"
    folder.mkdir()
    seen.mkdir()
    script.write_text(SLEEPER)
    monkeypatch.setattr(runtime, "SIMULATOR", False)
    monkeypatch.setattr(warm_cache, "gpu_missing", lambda: None)
    monkeypatch.setattr(warm_cache, "cache_folder", lambda: folder)
    monkeypatch.setattr(warm_cache, "marker", lambda f: f / "warmed-sm90")
    monkeypatch.setattr(warm_cache, "load_all_kernels", lambda: {"k1": 1, "k2": 2, "k3": 1})
    monkeypatch.setattr(warm_cache, "WORKER", (sys.executable, str(script), str(seen)))
    monkeypatch.setenv(warm_cache.WORKERS_ENV, "2")
    monkeypatch.setenv("SHARE_SECONDS", "0.2")
    return folder, seen, []


def test_a_stage_fills_a_cold_cache_once_and_marks_it(fake_gpu_cache):
    folder, seen, lines = fake_gpu_cache
    with warm_cache.Prewarm(lines.append) as prewarm:
        assert "kernel cache cold: compiling 3 kernels in 2 processes" in lines[0]
        prewarm.ready()
    assert sorted(p.name for p in seen.iterdir() if p.suffix == ".done") == ["k1+k3.done", "k2.done"]
    assert (folder / "warmed-sm90").exists() and "compiled 3 kernels in" in lines[1] and len(lines) == 2
    with warm_cache.Prewarm(lines.append) as prewarm:  # marked: nothing to do, nothing said
        prewarm.ready()
    assert len(lines) == 2 and len(list(seen.iterdir())) == 4


def test_nothing_is_filled_without_workers_or_under_the_simulator(fake_gpu_cache, monkeypatch):
    folder, seen, lines = fake_gpu_cache
    monkeypatch.setenv(warm_cache.WORKERS_ENV, "0")
    with warm_cache.Prewarm(lines.append) as prewarm:
        prewarm.ready()
    monkeypatch.setenv(warm_cache.WORKERS_ENV, "2")
    monkeypatch.setattr(runtime, "SIMULATOR", True)
    with warm_cache.Prewarm(lines.append) as prewarm:
        prewarm.ready()
    assert lines == [] and list(seen.iterdir()) == [] and not (folder / "warmed-sm90").exists()


def test_a_stage_waits_for_another_process_filling_the_folder(fake_gpu_cache):
    folder, seen, lines = fake_gpu_cache
    other = warm_cache.lock(folder, wait=False)  # another open file: flock conflicts as between processes
    assert other is not None and warm_cache.lock(folder, wait=False) is None
    release = threading.Timer(0.5, other.close)
    with warm_cache.Prewarm(lines.append) as prewarm:
        assert "another process compiles the kernels" in lines[0]
        t0 = time.perf_counter()
        release.start()
        prewarm.ready()
        assert time.perf_counter() - t0 >= 0.4  # returned only once the other let go
    assert list(seen.iterdir()) == [] and warm_cache.lock(folder, wait=False) is not None


def test_a_stage_stopped_early_kills_its_share_processes(fake_gpu_cache, monkeypatch):
    folder, seen, lines = fake_gpu_cache
    monkeypatch.setenv("SHARE_SECONDS", "60")
    with pytest.raises(KeyboardInterrupt), warm_cache.Prewarm(lines.append) as prewarm:
        procs = prewarm.fill.procs
        while len(list(seen.iterdir())) < 2:  # both shares started
            time.sleep(0.05)
        raise KeyboardInterrupt
    assert all(p.returncode is not None for p in procs)  # killed and reaped, not left running for a minute
    assert not any(p.suffix == ".done" for p in seen.iterdir()) and not (folder / "warmed-sm90").exists()
    assert warm_cache.lock(folder, wait=False) is not None  # the lock went with them


LOAD = """import sys
from fox_numba.device.registry import KERNELS
from fox_numba.kernels.compile_check import import_package
import_package()
spec = KERNELS[sys.argv[1]]
sig = spec.signatures[0]
spec.kernel.compile(sig)
print(sum(spec.kernel._cache_hits.values()), sum(spec.kernel._cache_misses.values()))
"""


@pytest.mark.skipif(SIMULATOR, reason="needs a real GPU: the simulator compiles and caches nothing")
@pytest.mark.parametrize("name", [
    "fox_numba.device.elementwise.fill_f32",
    # built in factories, reaching an intrinsic or numba's generator: they missed in every process before
    # kernel_cache.stable_identity (tools/results/learner_ablation_h200.md section 90)
    "fox_numba.kernels.gemm_tensor.linear_fwd_tf32",
    "fox_numba.kernels.action_select.action_select_heads_kernel_direction",
])
def test_a_share_compiled_is_loaded_by_the_next_process(tmp_path, name):
    env = {**os.environ, kernel_cache.ENV: str(tmp_path)}
    subprocess.run([*warm_cache.WORKER, name], env=env, check=True)
    out = subprocess.run([sys.executable, "-c", LOAD, name], env=env, check=True, capture_output=True, text=True)
    assert out.stdout.split() == ["1", "0"]  # one cache hit, no compile
