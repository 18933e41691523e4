"""fox_numba/device/mps.py: the private MPS daemon's start, its variables in the children, its stop, and the errors
where it cannot run. A stand-in `nvidia-cuda-mps-control` on PATH records what it was asked (no GPU needed)."""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from fox_numba.device import mps

FAKE = """#!/bin/sh
# Records its arguments, its stdin and the daemon's pipe folder; exits with $FAKE_MPS_RC for "-d".
log="$FAKE_MPS_LOG"
if [ "$1" = "-d" ]; then
  echo "start $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY" >> "$log"
  [ -d "$CUDA_MPS_PIPE_DIRECTORY" ] && [ -d "$CUDA_MPS_LOG_DIRECTORY" ] || echo "missing folders" >> "$log"
  [ "${FAKE_MPS_RC:-0}" = 0 ] || { echo "An instance of this daemon is already running" >&2; exit "$FAKE_MPS_RC"; }
  exit 0
fi
read line; echo "stdin $line $CUDA_MPS_PIPE_DIRECTORY" >> "$log"
"""


@pytest.fixture
def fake_control(tmp_path, monkeypatch):
    """A fake control program first on PATH; the file its calls are logged to."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    program = bin_dir / mps.CONTROL
    program.write_text(FAKE)
    program.chmod(program.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "calls.log"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_MPS_LOG", str(log))
    monkeypatch.delenv(mps.PIPE_VARIABLE, raising=False)
    monkeypatch.setenv(mps.LOG_VARIABLE, "/the/users/own")  # restored after the block, not removed
    return log


def test_children_connect_to_the_daemon_which_stops_and_leaves_nothing(fake_control, tmp_path):
    probe = tmp_path / "child.txt"
    with mps.mps_for_children(True):
        pipe = os.environ[mps.PIPE_VARIABLE]
        assert Path(pipe).is_dir() and os.environ[mps.LOG_VARIABLE] != "/the/users/own"
        child = f"import os; open({str(probe)!r}, 'w').write(os.environ.get({mps.PIPE_VARIABLE!r}, ''))"
        subprocess.run([sys.executable, "-c", child], check=True)  # a child started in the block sees the daemon
    assert probe.read_text() == pipe
    calls = fake_control.read_text().splitlines()
    assert calls[0].split() == ["start", pipe, str(Path(pipe).parent / "log")]
    assert calls[1:] == [f"stdin quit {pipe}"]  # stopped, with the same pipe folder
    assert not Path(pipe).parent.exists()  # the temporary folder is gone
    assert mps.PIPE_VARIABLE not in os.environ and os.environ[mps.LOG_VARIABLE] == "/the/users/own"


def test_off_starts_nothing(fake_control):
    with mps.mps_for_children(False):
        assert mps.PIPE_VARIABLE not in os.environ
    assert not fake_control.exists()


def test_the_daemon_stops_when_the_block_fails(fake_control):
    with pytest.raises(RuntimeError, match="a run failed"), mps.mps_daemon():
        raise RuntimeError("a run failed")
    assert [line.split()[0] for line in fake_control.read_text().splitlines()] == ["start", "stdin"]


def test_a_daemon_that_does_not_start_is_reported_with_its_message(fake_control, monkeypatch):
    monkeypatch.setenv("FAKE_MPS_RC", "3")
    with pytest.raises(mps.MpsUnavailable, match=r"exited 3: An instance of this daemon is already running"):
        with mps.mps_daemon():
            pytest.fail("the block must not run")
    assert len(fake_control.read_text().splitlines()) == 1  # no quit sent to a daemon that never started


def test_a_missing_control_program_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert "nvidia-cuda-mps-control is not on PATH" in mps.mps_problem()
    with pytest.raises(mps.MpsUnavailable, match="run without --mps"), mps.mps_daemon():
        pytest.fail("the block must not run")
