"""The Mamba2 encoder in a real trainer (network.mamba2_window): the collector's, the learner's (s and s') and the
direction signal's windows end at the rows they act on, training moves the encoder's parameters, evaluation runs,
and the registry audit finds no unregistered state. The network with the encoder: tests/agent/test_mamba2_network.py.
"""

import numpy as np
import pytest
from windowed_network import collect_train_evaluate, encoder_trainer

from fox_numba.agent.direction_signal import DirectionSignal
from fox_numba.agent.mamba2 import MAMBA2_PREFIX
from fox_numba.config import FeatureConfig
from fox_numba.observation import feature_columns
from fox_numba.walkforward.trainer_state import audit_trainer

T = 3
SIGNAL_ROWS = 36
SIZES = [f"network.mamba2_window={T}", "network.mamba2_heads=1", "network.mamba2_head_dim=4", "network.mamba2_state=4",
         "network.mamba2_out=4"]


def windows(market, rows):
    """[S T, the default feature columns, the time-weighted imbalance's included]: the bars rows - T + 1 .. rows of
    each row's day (kernels/windows.py), from the host market."""
    first = market.day_first
    width = feature_columns(FeatureConfig())
    return np.concatenate([market.market_obs[np.maximum(np.arange(r - T + 1, r + 1), first[r]), :width]
                           for r in rows])


def test_a_mamba2_trainer_reads_the_windows_of_the_rows_it_acts_on(half_hour_store):
    """(Beside the crossed mean head the encoder's path is the same code for either encoder: the TLOB trainer's test
    runs it, tests/agent/test_tlob_trainer.py.)"""
    rt = encoder_trainer(half_hour_store, SIZES, mean_cross=False)
    trainer = rt.trainer
    assert audit_trainer(rt.registry, trainer, rt.kills, rt.best) == []
    host = trainer.market.host
    params, supports = collect_train_evaluate(rt, windows, MAMBA2_PREFIX)
    lay = trainer.layout
    dev = trainer.market
    # The first SIGNAL_ROWS rows (the simulator pays per row): they cross the day boundary at row 30 and, in chunks
    # of 16, two chunk boundaries and a padded tail; in one chunk of 36, none.
    obs, day_first = dev.market_obs[:SIGNAL_ROWS], dev.day_first[:SIGNAL_ROWS]
    assert host.day_first[SIGNAL_ROWS - 1] > 0
    signals = [DirectionSignal(lay, stager=trainer.stager, chunk=c).compute(obs, params, supports, day_first)
               for c in (16, SIGNAL_ROWS)]
    assert np.isfinite(signals[0]).all() and np.ptp(signals[0]) > 0
    np.testing.assert_allclose(signals[0], signals[1], rtol=1e-6, atol=1e-7)  # each row's window, whatever its chunk
    with pytest.raises(ValueError, match="needs day_first"):
        DirectionSignal(lay, stager=trainer.stager, chunk=16).compute(obs, params, supports)
