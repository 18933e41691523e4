"""Optimiser kernels against float64 numpy references; per-step scalars come from the control block."""

import numpy as np

from fox_numba.device.control import ControlBlock
from fox_numba.device.launch import i32, launch
from fox_numba.device.staging import Stager
from fox_numba.kernels.optim import polyak_update

N = 1000
PREFIX = 901


def test_polyak_update_reads_tau_from_the_control_block(stream):
    """Tolerance: 3 float32 ulps of the larger operand (a subtract, a multiply and an add)."""
    stager = Stager(stream, chunk_bytes=1 << 16)
    rng = np.random.default_rng(7)
    target0 = rng.standard_normal(N).astype(np.float32)
    online0 = rng.standard_normal(N).astype(np.float32)
    tau = np.float32(rng.uniform(0.001, 0.5))
    target, online = stager.upload_new(target0), stager.upload_new(online0)
    ctl = ControlBlock()
    ctl.set(tau_eff=tau, lr_eff=np.float32(99.0), step=12)
    ctl.upload(stream)
    launch(polyak_update, PREFIX, target, online, ctl.device, i32(PREFIX), stream=stream)

    t64, o64 = target0.astype(np.float64), online0.astype(np.float64)
    expected = t64.copy()
    expected[:PREFIX] = t64[:PREFIX] + float(tau) * (o64[:PREFIX] - t64[:PREFIX])
    got = stager.download(target)
    scale = np.maximum(np.abs(t64), np.abs(o64)).astype(np.float32)
    assert np.all(np.abs(got - expected) <= 3 * np.spacing(scale).astype(np.float64))
    np.testing.assert_array_equal(got[PREFIX:], target0[PREFIX:])
    np.testing.assert_array_equal(stager.download(online), online0)
