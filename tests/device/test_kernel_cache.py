"""The on-disk kernel cache's folder, key and switch (device/kernel_cache.py). Loading from it needs a GPU: the
device calls time a cold and a warm `fox train` and compare their figures (tools/results/train_cache_h100.md)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from numba.cuda.core import config

from fox_numba.device import elementwise, kernel_cache
from fox_numba.device.runtime import SIMULATOR


def test_the_digest_follows_every_source_file(tmp_path):
    """Any change to any .py file of the package (content or name) gives another digest; other files do not."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.py").write_text("X = 1\n")
    (tmp_path / "sub" / "b.py").write_text("Y = 2\n")
    first = kernel_cache.source_digest(tmp_path)
    assert len(first) == 16 and kernel_cache.source_digest(tmp_path) == first
    (tmp_path / "notes.txt").write_text("not source")
    assert kernel_cache.source_digest(tmp_path) == first
    (tmp_path / "sub" / "b.py").write_text("Y = 3\n")
    changed = kernel_cache.source_digest(tmp_path)
    assert changed != first
    (tmp_path / "sub" / "b.py").rename(tmp_path / "sub" / "c.py")
    assert kernel_cache.source_digest(tmp_path) not in (first, changed)


def test_the_parent_folder_from_the_environment(tmp_path):
    assert kernel_cache.cache_parent({"FOX_KERNEL_CACHE": "0"}) is None
    assert kernel_cache.cache_parent({"FOX_KERNEL_CACHE": str(tmp_path)}) == tmp_path
    assert kernel_cache.cache_parent({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "fox_numba"
    assert kernel_cache.cache_parent({}) == Path.home() / ".cache" / "fox_numba"


class Dispatcher:
    """Stands in for numba-cuda's CUDADispatcher: records the CACHE_DIR its enable_caching saw."""

    def __init__(self, link=None):
        self.targetoptions = {"link": link}
        self.saw = None

    def enable_caching(self):
        self.saw = config.CACHE_DIR


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv("FOX_KERNEL_CACHE", str(tmp_path))
    kernel_cache.cache_folder.cache_clear()
    yield tmp_path / f"kernels-{kernel_cache.source_digest()}"
    kernel_cache.cache_folder.cache_clear()


def test_a_kernel_caches_into_the_digest_folder_and_the_config_is_restored(folder):
    before = config.CACHE_DIR
    kernel = Dispatcher()
    kernel_cache.enable_disk_cache(kernel)
    assert kernel.saw == str(folder) and folder.is_dir()
    assert config.CACHE_DIR == before


def test_no_cache_for_linked_kernels_when_off_or_not_writable(folder, monkeypatch, tmp_path):
    linked = Dispatcher(link=["tensor_core.cu"])
    kernel_cache.enable_disk_cache(linked)
    assert linked.saw is None
    monkeypatch.setenv("FOX_KERNEL_CACHE", "0")
    kernel_cache.cache_folder.cache_clear()
    off = Dispatcher()
    kernel_cache.enable_disk_cache(off)
    assert off.saw is None
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    monkeypatch.setenv("FOX_KERNEL_CACHE", str(blocker))  # its kernels-<digest> folder cannot be created
    kernel_cache.cache_folder.cache_clear()
    assert kernel_cache.cache_folder() is None


def test_a_new_folder_prunes_all_but_the_newest_others(tmp_path, monkeypatch):
    """Creating this version's folder keeps the KEEP most recently modified folders of other versions, deletes the
    older ones and leaves other files alone; an existing folder prunes nothing."""
    import os

    for age in range(5):  # kernels-old0 newest ... kernels-old4 oldest
        old = tmp_path / f"kernels-old{age}"
        old.mkdir()
        (old / "k.nbi").write_text("x")
        os.utime(old, (1e9 - age * 1000, 1e9 - age * 1000))
    (tmp_path / "notes.txt").write_text("kept")
    monkeypatch.setenv("FOX_KERNEL_CACHE", str(tmp_path))
    kernel_cache.cache_folder.cache_clear()
    folder = kernel_cache.cache_folder()
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert kept == sorted([folder.name, "kernels-old0", "kernels-old1", "kernels-old2", "notes.txt"])
    assert kernel_cache.KEEP == 3
    (tmp_path / "kernels-new").mkdir()
    kernel_cache.cache_folder.cache_clear()
    assert kernel_cache.cache_folder() == folder and (tmp_path / "kernels-new").is_dir()
    kernel_cache.cache_folder.cache_clear()


@pytest.mark.skipif(not SIMULATOR, reason="the simulator's kernels")
def test_simulator_kernels_are_left_alone(folder):
    """Under the simulator a registered kernel has no file cache to enable; enabling one is a no-op."""
    kernel = elementwise.fill_f32
    assert not hasattr(kernel, "enable_caching")
    kernel_cache.enable_disk_cache(kernel)
    assert not folder.exists()


def test_the_backend_line_names_the_cache_on_a_gpu(monkeypatch, tmp_path):
    """On a GPU `fox train`'s first line says where the compiled kernels are kept, or that every run compiles."""
    from fox_numba import cli
    from fox_numba.device import runtime

    monkeypatch.setattr(runtime, "SIMULATOR", False)
    monkeypatch.setattr(kernel_cache, "cache_folder", lambda: tmp_path / "kernels-x")
    line = cli.backend_line("default")
    assert line.startswith("CUDA GPU found") and str(tmp_path / "kernels-x") in line and line.endswith("preset default")
    monkeypatch.setattr(kernel_cache, "cache_folder", lambda: None)
    assert "no kernel cache" in cli.backend_line()


KEYS = """
import hashlib
from fox_numba.kernels.compile_check import import_package
from fox_numba.device.registry import KERNELS, kernel_py_func
from numba.cuda.dispatcher import CUDACache

class Codegen:  # the GPU's part of the key (its compute capability), fixed: no GPU needed
    def magic_tuple(self):
        return ("sm_90",)

import_package()
for name, spec in sorted(KERNELS.items()):
    cache = CUDACache(kernel_py_func(spec.kernel))
    keys = [cache._index_key(sig, Codegen()) for sig in spec.signatures]
    print(name, hashlib.sha256(repr(keys).encode()).hexdigest())
"""


def test_every_kernels_cache_key_is_the_same_in_another_process(tmp_path):
    """numba-cuda keys a cached kernel on its closure's pickled contents; anything in it that pickles with a
    per-process identity (an intrinsic, numba's own jit functions) makes every new process miss the cache and
    compile again (kernel_cache.stable_identity). Two fresh processes (different hash seeds) must agree on
    numba-cuda's own key of every registered kernel; before the fix 14 of them differed."""
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0", "FOX_KERNEL_CACHE": "0", "NUMBA_CACHE_DIR": str(tmp_path)}
    runs = [subprocess.run([sys.executable, "-c", KEYS], capture_output=True, text=True, env=env, timeout=600)
            for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr[-3000:]
    first, second = (dict(line.split() for line in run.stdout.splitlines()) for run in runs)
    assert len(first) >= 150 and first.keys() == second.keys()
    assert [name for name in first if first[name] != second[name]] == []
