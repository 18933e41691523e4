"""Checkpoints (HDF5): round trip of every element, the fingerprints stored, mismatches refused naming both
fingerprints, damaged files refused naming the file, and a kill -9 between the temporary write and the
rename leaving the previous checkpoint intact."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import h5py
import numpy as np
import pytest

from fox_numba import checkpoint
from fox_numba.checkpoint import (
    array_layout,
    layout_fingerprint,
    load_checkpoint,
    remove_stale_temporaries,
    save_checkpoint,
)
from fox_numba.device.isv import ISV_FINGERPRINT
from fox_numba.device.rng import XOROSHIRO_DTYPE
from fox_numba.errors import InputError, LayoutMismatchError

RECORD = np.dtype([("s0", np.uint64), ("s1", np.uint64)], align=True)
PADDED = np.dtype([("a", np.uint8), ("b", np.float64)], align=True)


def arrays():
    rng = np.random.default_rng(11)
    states = np.zeros(5, RECORD)
    states["s0"] = rng.integers(1, 2**63, 5, dtype=np.int64)
    states["s1"] = rng.integers(1, 2**63, 5, dtype=np.int64)
    padded = np.zeros(3, PADDED)
    padded["a"], padded["b"] = (1, 2, 3), rng.standard_normal(3)
    return {
        "params": rng.standard_normal((3, 17)).astype(np.float32),
        "adam_t": np.array([1234], np.int32),
        "isv": rng.uniform(-1, 1, 131).astype(np.float32),
        "rng_states": states,
        "padded": padded,
        "replay.cursor": np.int64(77),
        "empty": np.zeros((0, 4), np.float32),
    }


def test_round_trip_keeps_every_element_and_the_state(tmp_path):
    state = {"kill.q_drift.window": [0.1, -0.2], "learner.global_step": 5000}
    path = save_checkpoint(tmp_path / "last.h5", arrays(), {"fold": 2, "epoch": 3}, registry_state=state,
                           config_toml="[run]\nseed = 3\n", fingerprints={"params": "abcdef0123456789"})
    ck = load_checkpoint(path, expected_layout=array_layout(arrays()), expected_fingerprints={"params": "abcdef0123456789"})
    assert ck.isv_fingerprint == ISV_FINGERPRINT and ck.fingerprints == {"params": "abcdef0123456789"}
    assert ck.meta == {"fold": 2, "epoch": 3} and ck.registry_state == state
    assert ck.config_toml == "[run]\nseed = 3\n"
    assert set(ck.arrays) == set(arrays())
    for name, a in arrays().items():
        assert ck.arrays[name].dtype == a.dtype and ck.arrays[name].shape == np.shape(a)
        np.testing.assert_array_equal(ck.arrays[name], a)
    assert ck.arrays["rng_states"].dtype == XOROSHIRO_DTYPE  # what the Stager uploads to the generators
    assert [p.name for p in tmp_path.iterdir()] == ["last.h5"]  # no temporary file left behind


def test_another_isv_fingerprint_is_refused_naming_both(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint, "ISV_FINGERPRINT", "0123456789abcdef")
    path = save_checkpoint(tmp_path / "old.h5", arrays())
    monkeypatch.undo()
    with pytest.raises(LayoutMismatchError) as err:
        load_checkpoint(path)
    message = str(err.value)
    assert "0123456789abcdef" in message and ISV_FINGERPRINT in message and str(path) in message


def test_another_array_layout_is_refused_naming_the_arrays(tmp_path):
    path = save_checkpoint(tmp_path / "ck.h5", arrays())
    expected = array_layout({**arrays(), "params": np.zeros((3, 18), np.float32)})
    with pytest.raises(LayoutMismatchError) as err:
        load_checkpoint(path, expected_layout=expected)
    message = str(err.value)
    assert "params" in message and "adam_t" not in message
    assert layout_fingerprint(expected) in message and layout_fingerprint(array_layout(arrays())) in message


def test_another_parameter_layout_fingerprint_is_refused_naming_both(tmp_path):
    path = save_checkpoint(tmp_path / "ck.h5", arrays(), fingerprints={"params": "1111111111111111"})
    with pytest.raises(LayoutMismatchError, match="params layout fingerprint 1111111111111111 differs from this "
                                                  "build's 2222222222222222"):
        load_checkpoint(path, expected_fingerprints={"params": "2222222222222222"})
    with pytest.raises(LayoutMismatchError, match="network layout fingerprint None"):
        load_checkpoint(path, expected_fingerprints={"network": "2222222222222222"})


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
        load_checkpoint(tmp_path / "missing.h5")
    (tmp_path / "junk.h5").write_bytes(b"not hdf5")
    with pytest.raises(InputError, match="not a readable checkpoint"):
        load_checkpoint(tmp_path / "junk.h5")
    with h5py.File(tmp_path / "plain.h5", "w") as f:
        f.create_dataset("x", data=np.ones(3))
    with pytest.raises(InputError, match="not a fox_numba checkpoint"):
        load_checkpoint(tmp_path / "plain.h5")
    for bad in ("__meta__", "", "a/b", ".hidden"):
        with pytest.raises(ValueError, match="reserved"):
            save_checkpoint(tmp_path / "x.h5", {bad: np.ones(2, np.float32)})
    with pytest.raises(ValueError):
        save_checkpoint(tmp_path / "x.h5", arrays(), {"sharpe": float("nan")})  # strict JSON
    assert not (tmp_path / "x.h5").exists() and not list(tmp_path.glob(".x.h5.tmp-*"))


def rewrite(path, header_change=None, arrays_change=None):
    """Edit a saved checkpoint's header and arrays in place (a damaged or foreign file)."""
    with h5py.File(path, "r+") as f:
        header = json.loads(f.attrs["header"])
        (header_change or (lambda h: None))(header)
        f.attrs["header"] = json.dumps(header)
        for name, a in (arrays_change or {}).items():
            del f["arrays"][name]
            f["arrays"].create_dataset(name, data=a)


def test_damaged_headers_and_arrays_are_refused_naming_the_file(tmp_path):
    path = save_checkpoint(tmp_path / "ck.h5", arrays())
    rewrite(path, header_change=lambda h: h.pop("layout"))
    with pytest.raises(InputError, match=r"ck\.h5, field header: the checkpoint header lacks \['layout'\]"):
        load_checkpoint(path)
    path = save_checkpoint(tmp_path / "ck.h5", arrays())
    rewrite(path, arrays_change={"params": np.zeros((3, 16), np.float32)})
    with pytest.raises(InputError, match="arrays do not match the layout recorded in the checkpoint"):
        load_checkpoint(path)
    path = save_checkpoint(tmp_path / "ck.h5", arrays())
    rewrite(path, header_change=lambda h: h.update(format="fox_numba.checkpoint/1"))
    with pytest.raises(InputError, match="checkpoint format 'fox_numba.checkpoint/1', this build reads"):
        load_checkpoint(path)


KILL_BEFORE_RENAME = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    from fox_numba.checkpoint import save_checkpoint
    real_replace = os.replace
    def replace(src, dst):  # the temporary file is complete: die before the rename
        os.kill(os.getpid(), signal.SIGKILL)
    os.replace = replace
    save_checkpoint(sys.argv[1], {"params": np.full(4, 2.0, np.float32)}, {"epoch": 2})
""")


def test_kill_between_the_temporary_write_and_the_rename(tmp_path):
    path = save_checkpoint(tmp_path / "last.h5", {"params": np.full(4, 1.0, np.float32)}, {"epoch": 1})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", KILL_BEFORE_RENAME, str(path)], env=env, capture_output=True,
                          timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    stale = list(tmp_path.glob(".last.h5.tmp-*"))
    assert len(stale) == 1 and stale[0].stat().st_size > 0
    ck = load_checkpoint(path)  # the previous checkpoint, whole
    assert ck.meta == {"epoch": 1} and ck.arrays["params"].tolist() == [1.0] * 4
    assert remove_stale_temporaries(tmp_path) == stale and sorted(p.name for p in tmp_path.iterdir()) == ["last.h5"]
