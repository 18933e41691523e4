"""A system install run by another user: neither the package folder nor $HOME (nor the output folder) is
writable. Commands still run (numba's cache falls back to a private folder, or to none), and a store that
cannot be written is named in a one-line error.

Unwritable places are made so that they hold for root too (these tests may run as root in a container):
a regular file named `__pycache__` in every package folder and a $HOME below a regular file stop numba
from creating its cache folders there, as missing write permission does for other users.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import fox_numba
from fox_numba import cli, jitcache

PACKAGE = Path(fox_numba.__file__).parent
AAPL = Path(__file__).parent / "fixtures" / "lobster_aapl_head"
NOBODY = 65534


@pytest.fixture()
def read_only_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A copy of the package whose folders cannot hold a `__pycache__`, a $HOME that cannot hold
    `.cache`, and a private temporary directory (where the fallback cache goes)."""
    site = tmp_path / "site"
    shutil.copytree(PACKAGE, site / "fox_numba", ignore=shutil.ignore_patterns("__pycache__"))
    for folder in [site / "fox_numba", *(p for p in (site / "fox_numba").rglob("*") if p.is_dir())]:
        (folder / "__pycache__").write_text("a file where numba would make its cache folder")
    (tmp_path / "blocked").write_text("a file, so nothing can be created below it")
    (tmp_path / "tmp").mkdir()
    yield tmp_path


def run_installed(base: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_CACHE_DIR", "XDG_"))}
    # the copy first (it shadows the package), then whatever the caller's path holds (numpy's wheel, on a GPU host)
    path = [str(base / "site"), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env.update(
        HOME=str(base / "blocked" / "home"), PYTHONPATH=os.pathsep.join(path), TMPDIR=str(base / "tmp"),
        PYTHONDONTWRITEBYTECODE="1",
    )  # fmt: skip
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=300, env=env, cwd=base / "tmp", check=False
    )


def test_numba_alone_cannot_cache_in_such_an_install(read_only_install):
    script = "import numba\n\n@numba.njit(cache=True)\ndef f(x):\n    return x\n"
    (read_only_install / "site" / "fox_numba" / "market" / "probe.py").write_text(script)
    proc = run_installed(read_only_install, "-c", "import fox_numba.market.probe")
    assert proc.returncode != 0 and "cannot cache function 'f'" in proc.stderr


def test_commands_and_cached_functions_run_without_a_writable_cache_place(read_only_install):
    proc = run_installed(read_only_install, "-m", "fox_numba", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "Usage:" in proc.stdout and proc.stderr == ""
    script = (
        "import os, fox_numba.cli; from fox_numba.market.synthetic_book import _sigmoid; "
        "print(fox_numba.__file__, _sigmoid(0.0), os.environ.get('NUMBA_CACHE_DIR'))"
    )
    proc = run_installed(read_only_install, "-c", script)
    assert proc.returncode == 0, proc.stderr
    where, value, cache = proc.stdout.split()
    assert where.startswith(str(read_only_install / "site")) and float(value) == 0.5
    assert Path(cache) == read_only_install / "tmp" / jitcache.FALLBACK_NAME.format(uid=os.getuid())
    assert list(Path(cache).rglob("*.nbi")), "the fallback folder holds the compiled functions"


def test_without_any_writable_place_functions_compile_uncached(monkeypatch):
    calls = []

    def njit(**options):
        calls.append(options)
        if options.get("cache"):
            raise RuntimeError("cannot cache function 'f': no locator available for file 'f.py'")
        return lambda func: func

    monkeypatch.setattr(jitcache, "njit", njit)
    monkeypatch.setattr(jitcache, "use_fallback_folder", lambda: None)
    compiled = jitcache.cached_njit(inline="always")(len)
    assert compiled is len and calls == [{"cache": True, "inline": "always"}, {"inline": "always"}]


def test_a_fallback_folder_that_others_may_write_is_not_used(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setattr(jitcache.config, "CACHE_DIR", jitcache.config.CACHE_DIR)
    monkeypatch.setenv("NUMBA_CACHE_DIR", "")
    folder = tmp_path / jitcache.FALLBACK_NAME.format(uid=os.getuid())
    folder.mkdir()
    folder.chmod(0o777)
    assert jitcache.use_fallback_folder() is None
    folder.chmod(0o700)
    assert jitcache.use_fallback_folder() == folder and jitcache.config.CACHE_DIR == str(folder)
    assert os.environ["NUMBA_CACHE_DIR"] == str(folder)


def run_cli_unprivileged(*args: str) -> tuple[int, str]:
    """`fox ARGS` in a forked child without write permission on root-owned folders (root drops to nobody;
    no exec, so the interpreter's own folders need not be readable by nobody): (exit status, stderr)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        status = 99
        try:
            os.close(read)
            sys.stderr = os.fdopen(write, "w")
            if os.geteuid() == 0:
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            sys.argv = ["fox", *args]
            cli.main()
            status = 0
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else 1
        finally:
            sys.stderr.flush()
            os._exit(status)
    os.close(write)
    with os.fdopen(read) as fh:
        stderr = fh.read()
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), stderr


def test_a_read_only_output_folder_is_named_not_the_temporary_file():
    base = Path(tempfile.mkdtemp(prefix="fox-ro-"))  # pytest's own folders are private to their user
    out_dir = base / "out"
    out_dir.mkdir()
    base.chmod(0o755)
    out_dir.chmod(0o555)
    out = out_dir / "aapl.h5"
    try:
        status, stderr = run_cli_unprivileged("data", "import", str(AAPL), "--out", str(out))
    finally:
        out_dir.chmod(0o755)
        shutil.rmtree(base)
    assert status == 1
    assert stderr.splitlines() == [f"fox: error: {out}: cannot write its day folder {out}.days (Permission denied)"]
