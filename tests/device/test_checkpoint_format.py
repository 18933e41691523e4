"""Checkpoints: round trip of every element, the ISV fingerprint stored, mismatches refused by name."""

import json

import numpy as np
import pytest

from fox_numba import checkpoint
from fox_numba.checkpoint import array_layout, layout_fingerprint, load_checkpoint, save_checkpoint
from fox_numba.device.isv import ISV_FINGERPRINT
from fox_numba.errors import InputError, LayoutMismatchError

RECORD = np.dtype([("s0", np.uint64), ("s1", np.uint64)], align=True)


def arrays():
    rng = np.random.default_rng(11)
    states = np.zeros(5, RECORD)
    states["s0"] = rng.integers(1, 2**63, 5, dtype=np.int64)
    states["s1"] = rng.integers(1, 2**63, 5, dtype=np.int64)
    return {
        "params": rng.standard_normal((3, 17)).astype(np.float32),
        "adam_t": np.array([1234], np.int32),
        "isv": rng.uniform(-1, 1, 131).astype(np.float32),
        "rng_states": states,
    }


def test_round_trip_keeps_every_element_and_the_metadata(tmp_path):
    path = save_checkpoint(tmp_path / "best.npz", arrays(), {"fold": 2, "sharpe": 1.5})
    ck = load_checkpoint(path, expected_layout=array_layout(arrays()))
    assert ck.isv_fingerprint == ISV_FINGERPRINT
    assert ck.meta == {"fold": 2, "sharpe": 1.5}
    assert set(ck.arrays) == set(arrays())
    for name, a in arrays().items():
        assert ck.arrays[name].dtype == a.dtype
        np.testing.assert_array_equal(ck.arrays[name], a)
    assert [p.name for p in tmp_path.iterdir()] == ["best.npz"]  # no temporary file left behind


def test_another_isv_fingerprint_is_refused_naming_both(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint, "ISV_FINGERPRINT", "0123456789abcdef")
    path = save_checkpoint(tmp_path / "old.npz", arrays())
    monkeypatch.undo()
    with pytest.raises(LayoutMismatchError) as err:
        load_checkpoint(path)
    message = str(err.value)
    assert "0123456789abcdef" in message and ISV_FINGERPRINT in message and str(path) in message


def test_another_array_layout_is_refused_naming_the_arrays(tmp_path):
    path = save_checkpoint(tmp_path / "ck.npz", arrays())
    expected = array_layout({**arrays(), "params": np.zeros((3, 18), np.float32)})
    with pytest.raises(LayoutMismatchError) as err:
        load_checkpoint(path, expected_layout=expected)
    message = str(err.value)
    assert "params" in message and "adam_t" not in message
    assert layout_fingerprint(expected) in message and layout_fingerprint(array_layout(arrays())) in message


def test_layout_fingerprint_sees_shape_dtype_and_fields():
    base = layout_fingerprint(array_layout(arrays()))
    changed = [
        {**arrays(), "adam_t": np.array([1], np.int64)},
        {**arrays(), "isv": np.zeros(130, np.float32)},
        {**arrays(), "rng_states": np.zeros(5, np.dtype([("a", np.uint64), ("s1", np.uint64)]))},
    ]
    assert all(layout_fingerprint(array_layout(c)) != base for c in changed)


def test_bad_files_and_names_are_refused(tmp_path):
    with pytest.raises(InputError, match="not found"):
        load_checkpoint(tmp_path / "missing.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(InputError, match="not a readable checkpoint"):
        load_checkpoint(tmp_path / "junk.npz")
    np.savez(tmp_path / "plain.npz", x=np.ones(3))
    with pytest.raises(InputError, match="not a fox_numba checkpoint"):
        load_checkpoint(tmp_path / "plain.npz")
    for bad in ("__meta__", "", "file"):
        with pytest.raises(ValueError, match="reserved"):
            save_checkpoint(tmp_path / "x.npz", {bad: np.ones(2, np.float32)})


def rewrite(path, header_change=None, arrays_change=None):
    """Rewrite a saved checkpoint with its JSON header and arrays edited (a damaged or foreign file)."""
    with np.load(path) as npz:
        entries = {k: npz[k] for k in npz.files}
    header = json.loads(str(entries.pop("__meta__")))
    (header_change or (lambda h: None))(header)
    entries.update(arrays_change or {})
    np.savez(path, __meta__=np.array(json.dumps(header)), **entries)


def test_damaged_headers_and_arrays_are_refused_naming_the_file(tmp_path):
    path = save_checkpoint(tmp_path / "ck.npz", arrays())
    rewrite(path, header_change=lambda h: h.pop("layout"))
    with pytest.raises(InputError, match=r"ck\.npz, field __meta__: the checkpoint header lacks \['layout'\]"):
        load_checkpoint(path)
    path = save_checkpoint(tmp_path / "ck.npz", arrays())
    rewrite(path, arrays_change={"params": np.zeros((3, 16), np.float32)})
    with pytest.raises(InputError, match="arrays do not match the layout recorded in the checkpoint"):
        load_checkpoint(path)
    path = save_checkpoint(tmp_path / "ck.npz", arrays())
    rewrite(path, header_change=lambda h: h.update(format="fox_numba.checkpoint/0"))
    with pytest.raises(InputError, match="checkpoint format 'fox_numba.checkpoint/0', this build reads"):
        load_checkpoint(path)
