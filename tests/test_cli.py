"""The `fox` command line explains itself and fails plainly."""

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from fox_numba.cli import app

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
]


def test_top_level_help_lists_every_command():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for name in ("data", "collect", "train", "evaluate", "profile"):
        assert name in result.output


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_explains_itself(command):
    result = runner.invoke(app, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output
    # The command's one-line description is shown, not just the usage line.
    assert len([line for line in result.output.splitlines() if line.strip()]) > 4


def run_fox(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fox_numba", *args], capture_output=True, text=True, timeout=120
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


@pytest.mark.parametrize("command", [["collect"], ["train"], ["evaluate", "ckpt.npz"], ["profile"]], ids=" ".join)
def test_stages_not_landed_say_so_and_exit_2(command):
    proc = run_fox(*command, "--preset", "smoke")
    assert proc.returncode == 2, proc.stderr
    assert "is not available yet" in proc.stderr
    assert proc.stdout == ""
