"""`fox data import` end to end: real files, folders, extending a store, and one-line errors."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fox_numba.cli import app
from fox_numba.errors import InputError, MissingDataError
from fox_numba.io import TEMP_INFIX, temporary_path
from fox_numba.market.importer import detect_format, import_market
from fox_numba.market.store import MarketStore, day_folder, require_schemas

FIXTURES = Path(__file__).parents[1] / "fixtures"
AAPL = FIXTURES / "lobster_aapl_head"
ESU4 = FIXTURES / "databento_esu4_20240701"
STUBS = FIXTURES / "databento_stubs"


def test_lobster_folder_through_the_cli(tmp_path):
    out = tmp_path / "aapl.h5"
    result = CliRunner().invoke(app, ["data", "import", str(AAPL), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [f"wrote {out}: AAPL, 1 trading day(s), 2012-06-21", "  2012-06-21: bars 1, mbp10 938, trades 159"]
    with MarketStore(out) as store:
        assert (store.instrument.symbol, store.instrument.tick_size, store.instrument.point_value) == ("AAPL", 0.01, 1.0)
        assert store.instrument.day_roll == "24:00"
    require_schemas(out)


def test_databento_files_then_extend_with_another_day(tmp_path):
    out = tmp_path / "es.h5"
    files = sorted(ESU4.glob("*.dbn.zst"))
    result = import_market(files, out)
    assert result.rows == {"2024-07-02": {"bars": 30, "trades": 120}}
    assert result.notes[0].startswith("instrument ESU4: 30 records in futures_ohlcv-1m")
    result = CliRunner().invoke(app, ["data", "import", str(STUBS / "test_data.mbp-10.dbn.zst"), "-o", str(out)])
    assert result.exit_code == 0, result.output
    with MarketStore(out) as store:
        assert store.instrument.symbol == "ES"  # ESH1 and ESU4 share the root
        assert store.days() == ["2020-12-28", "2024-07-02"]
        assert store.days("mbp10") == ["2020-12-28"]
    with pytest.raises(MissingDataError, match=r"no mbp10 data on 1 of 2 days \(first 2024-07-02\)"):
        require_schemas(out)


def test_instrument_options_and_a_store_of_another_market(tmp_path):
    out = tmp_path / "nq.h5"
    result = import_market([next(ESU4.glob("futures_ohlcv*"))], out, instrument="NQU4", overrides={"point_value": 20.0})
    assert (result.instrument.symbol, result.instrument.point_value) == ("NQ", 20.0)
    before = out.read_bytes()
    with pytest.raises(InputError, match=r"nq.h5, group /: the store holds another instrument .*symbol 'NQ' vs 'AAPL'"):
        import_market([AAPL], out)
    assert out.read_bytes() == before


def test_format_detection(tmp_path):
    assert detect_format([AAPL]) == "lobster" and detect_format([ESU4]) == "databento"
    (tmp_path / "x.dbn").write_bytes(b"")
    (tmp_path / "AAPL_2012-06-21_34200000_57600000_message_10.csv").write_text("")
    with pytest.raises(InputError, match="found both Databento and LOBSTER files; name the format with --format"):
        detect_format([tmp_path])
    with pytest.raises(InputError, match="no such file or folder"):
        detect_format([tmp_path / "nothing"])


def run_fox(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fox_numba", *args], capture_output=True, text=True, timeout=120)


def test_bad_input_is_one_line_exit_1_and_the_store_is_kept(tmp_path):
    out = tmp_path / "s.h5"
    import_market([AAPL], out)
    before = out.read_bytes()
    proc = run_fox("data", "import", str(STUBS / "test_data.definition.dbn.zst"), "-o", str(out))
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"fox: error: {STUBS / 'test_data.definition.dbn.zst'}: DBN schema definition is not imported (use mbp-10, trades, ohlcv-1m)"
    ]
    assert out.read_bytes() == before
    proc = run_fox("data", "inspect", str(tmp_path / "missing.h5"))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "missing.h5: no such market store" in proc.stderr
    proc = run_fox("data", "import", str(AAPL), "-o", str(out), "--format", "csv")
    assert proc.returncode == 2 and "'csv' is not one of auto, databento, lobster" in proc.stderr


# Interrupted and killed imports: the store is kept, the temporary file does not outlive the next write.

PAUSED_IMPORT = """
import sys, time
from pathlib import Path
from fox_numba import cli
from fox_numba.market import store

ready, write_schema = Path(sys.argv[1]), store.StoreWriter.write_schema
def paused(*args):  # write the first schema of the first day, then wait to be stopped
    write_schema(*args)
    ready.touch()
    time.sleep(120)
store.StoreWriter.write_schema = paused
sys.argv = ["fox", *sys.argv[2:]]
cli.main()
"""


def stopped_import(tmp_path: Path, out: Path, sig: signal.Signals) -> tuple[int, str, int]:
    """`fox data import AAPL --out out`, stopped by `sig` while the store's temporary file is open:
    (exit status, stderr, process id)."""
    ready = tmp_path / "ready"
    proc = subprocess.Popen(
        [sys.executable, "-c", PAUSED_IMPORT, str(ready), "data", "import", str(AAPL), "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready.exists(), proc.communicate()
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=60)
    return proc.returncode, stderr, proc.pid


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_an_interrupted_import_says_so_and_keeps_the_store(tmp_path, sig):
    out = tmp_path / "s.h5"
    import_market([AAPL], out)
    before = out.read_bytes()
    status, stderr, _ = stopped_import(tmp_path, out, sig)
    assert status == 128 + sig
    assert stderr.strip() == f"fox: interrupted; {out} unchanged"
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ready", "s.h5", "s.h5.days"]
    assert sorted(p.name for p in day_folder(out).rglob(f"*{TEMP_INFIX}*")) == []  # no temporary day file either


def test_a_killed_import_leaves_a_temporary_file_that_the_next_write_removes(tmp_path):
    out = tmp_path / "s.h5"
    import_market([AAPL], out)
    before = out.read_bytes()
    status, _, pid = stopped_import(tmp_path, out, signal.SIGKILL)
    assert status == -signal.SIGKILL
    left = temporary_path(out, pid)
    assert left.exists() and left.stat().st_size > 0 and out.read_bytes() == before
    import_market([AAPL], out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ready", "s.h5", "s.h5.days"]
    assert sorted(p.name for p in day_folder(out).rglob(f"*{TEMP_INFIX}*")) == []  # the killed write's day file too


def test_out_naming_a_folder_is_refused_plainly(tmp_path):
    proc = run_fox("data", "import", str(AAPL), "--out", str(tmp_path))
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        f"fox: error: {tmp_path}: is a folder; --out names the store file to write or extend, e.g. {tmp_path / 'es.h5'}"
    )
    proc = run_fox("data", "inspect", str(tmp_path))
    assert proc.stderr.strip() == f"fox: error: {tmp_path}: is a folder, not a market store file"
