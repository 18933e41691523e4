"""`fox cache warm` (kernels/warm_cache.py): every cacheable registered kernel in exactly one share, the shares near
equal, each share's process run and its failure reported; on a GPU, a kernel compiled by a share's process is
loaded from the cache by the next process, not compiled again."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fox_numba.device import kernel_cache, runtime
from fox_numba.kernels import warm_cache
from fox_numba.device.registry import KERNELS
from fox_numba.device.runtime import SIMULATOR


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


WORKER = """import pathlib, sys
names = sys.argv[2:]
pathlib.Path(sys.argv[1], f"{len(list(pathlib.Path(sys.argv[1]).iterdir()))}.txt").write_text(" ".join(names))
if "fox_numba.device.elementwise.fill_f32" in names:
    print("compiling fill_f32 failed")
    sys.exit(5)
"""


def test_warm_runs_every_share_and_reports_a_failed_one(tmp_path, monkeypatch):
    script, seen = tmp_path / "worker.py", tmp_path / "seen"
    script.write_text(WORKER)
    seen.mkdir()
    monkeypatch.setattr(runtime, "SIMULATOR", False)
    monkeypatch.setattr(warm_cache, "cache_folder", lambda: tmp_path / "kernels-x")
    monkeypatch.setattr(warm_cache, "WORKER", (sys.executable, str(script), str(seen)))
    done = warm_cache.warm(3)
    kernels = warm_cache.load_all_kernels()
    shares = [p.read_text().split() for p in sorted(seen.iterdir())]
    assert len(shares) == done.workers == 3 and sorted(sum(shares, [])) == sorted(kernels)
    assert (done.kernels, done.signatures, done.folder) == (len(kernels), sum(kernels.values()), tmp_path / "kernels-x")
    assert len(done.failures) == 1 and "exit 5" in done.failures[0] and "compiling fill_f32 failed" in done.failures[0]


def test_nothing_to_warm_under_the_simulator_or_without_a_cache(monkeypatch):
    if SIMULATOR:
        with pytest.raises(warm_cache.CannotWarm, match="simulator"):
            warm_cache.warm(1)
    monkeypatch.setattr(runtime, "SIMULATOR", False)
    monkeypatch.setattr(warm_cache, "cache_folder", lambda: None)
    with pytest.raises(warm_cache.CannotWarm, match="cache is off"):
        warm_cache.warm(1)


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
