"""ControlBlock: the host record written in place, uploaded to a device copy that kernels read."""

import numpy as np
import pytest

from fox_numba.device.control import CONTROL_DTYPE, ControlBlock, control_block_at
from fox_numba.device.launch import LaunchError, LaunchTrace, tracing
from fox_numba.device.staging import Stager


def test_layout_is_aligned_whole_words():
    assert CONTROL_DTYPE.isalignedstruct and CONTROL_DTYPE.itemsize % 8 == 0
    assert CONTROL_DTYPE.names == ("step", "seed", "lr_sched", "tau_eff", "eps")


def test_set_then_upload_reaches_the_device_copy(stream):
    stager = Stager(stream, chunk_bytes=64)
    ctl = ControlBlock()
    assert not ctl.host.view(np.uint8).any()  # a new block starts at zero
    values = {
        "step": 2**40 + 3,
        "seed": 2**63 + 11,
        "lr_sched": np.float32(1.5e-4),
        "tau_eff": np.float32(0.005),
        "eps": np.float32(0.125),
    }
    ctl.set(**values)
    ctl.upload(stream)
    got = stager.download(ctl.device)[0]
    for name, value in values.items():
        assert got[name] == value, name
    ctl.set(tau_eff=np.float32(0.25))  # a partial update keeps the other fields
    ctl.upload(stream)
    got = stager.download(ctl.device)[0]
    assert got["tau_eff"] == np.float32(0.25) and got["step"] == 2**40 + 3


def test_host_view_is_read_only_and_fields_are_checked():
    ctl = ControlBlock()
    with pytest.raises(ValueError):
        ctl.host[0] = np.zeros((), CONTROL_DTYPE)
    with pytest.raises(KeyError, match="no field"):
        ctl.set(learning_rate=0.1)


def test_set_inside_a_step_body_is_refused(stream):
    ctl = ControlBlock()
    with tracing(LaunchTrace(stream)), pytest.raises(LaunchError, match="inside a step body"):
        ctl.set(step=1)


def test_live_blocks_are_found_by_device_address():
    ctl = ControlBlock()
    assert control_block_at(ctl.address) is ctl
    assert control_block_at(ctl.address + 4) is None


def test_a_block_of_another_record_dtype(stream):
    dtype = np.dtype([("horizon", np.int64), ("rate", np.float32)], align=True)
    stager = Stager(stream, chunk_bytes=64)
    ctl = ControlBlock(dtype)
    assert ctl.pending  # nothing uploaded yet
    ctl.set(horizon=12, rate=np.float32(0.5))
    ctl.upload(stream)
    assert not ctl.pending
    got = stager.download(ctl.device)[0]
    assert got["horizon"] == 12 and got["rate"] == np.float32(0.5)
    with pytest.raises(KeyError, match="no field"):
        ctl.set(step=1)
    with pytest.raises(ValueError, match="aligned record"):
        ControlBlock(np.dtype([("a", np.int8)]))
