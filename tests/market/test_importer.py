"""`fox data import` end to end: real files, folders, extending a store, and one-line errors."""

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fox_numba.cli import app
from fox_numba.errors import InputError, MissingDataError
from fox_numba.market.importer import detect_format, import_market
from fox_numba.market.store import MarketStore, require_schemas

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
