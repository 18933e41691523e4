"""The TLOB encoder in a real trainer (network.tlob_window): the collector's, the learner's (s and s') and the
direction signal's book windows end at the rows they act on, training moves every encoder parameter, evaluation runs,
the registry audit finds no unregistered state, and the next fold's book replaces the first's. The network with the
encoder: tests/agent/test_tlob_network.py.
"""

import numpy as np
import pytest
from windowed_network import collect_train_evaluate, encoder_trainer

from fox_numba.agent.direction_signal import DirectionSignal
from fox_numba.agent.fold_market import FoldMarket
from fox_numba.agent.tlob import TLOB_PREFIX
from fox_numba.walkforward.trainer_state import audit_trainer

T = 3
SIGNAL_FROM, SIGNAL_ROWS = 24, 12
SIZES = [f"network.tlob_window={T}", "network.tlob_width=4", "network.tlob_heads=1", "network.tlob_out=4"]


def windows(market, rows):
    """[S T, BOOK_FEATURES]: the book snapshots of bars rows - T + 1 .. rows of each row's day (kernels/windows.py),
    from the host market."""
    first = market.day_first
    return np.concatenate([market.book_obs[np.maximum(np.arange(r - T + 1, r + 1), first[r])] for r in rows])


@pytest.mark.parametrize("mean_cross", [False, True], ids=["linear", "mean_cross"])
def test_a_tlob_trainer_reads_the_book_windows_of_the_rows_it_acts_on(half_hour_store, mean_cross):
    """Beside the crossed mean head too (network.mean_cross on a linear network: it acts on [obs | enc], mirror
    off), there with the encoder's own weight decay."""
    decay = ["learner.weight_decay=0.01", "learner.encoder_weight_decay=0.5"] if mean_cross else []
    rt = encoder_trainer(half_hour_store, SIZES + decay, mean_cross)
    trainer, cfg = rt.trainer, rt.cfg
    rates = trainer.stager.download(trainer.learner.decay_mask)
    np.testing.assert_array_equal(rates, trainer.layout.decay_mask(*((0.01, 0.51) if mean_cross else (0.0, 0.0))))
    assert audit_trainer(rt.registry, trainer, rt.kills, rt.best) == []
    host = trainer.market.host
    assert np.isfinite(host.book_obs).all() and np.ptp(host.book_obs) > 0
    params, supports = collect_train_evaluate(rt, windows, TLOB_PREFIX)
    lay = trainer.layout
    dev, stager = trainer.market, trainer.stager
    # Rows 24 .. 35 only (the simulator pays per row), as a market of their own: its first day is rows 24 .. 29 (the
    # windows clamp at 24), its second starts at row 30. In chunks of 5: two chunk boundaries and a padded tail; in
    # one chunk of 12, none.
    part = slice(SIGNAL_FROM, SIGNAL_FROM + SIGNAL_ROWS)
    obs, book = dev.market_obs[part], dev.book_obs[part]
    day_first = stager.upload_new(np.maximum(host.day_first[part] - SIGNAL_FROM, 0).astype(np.int32))
    assert host.day_first[part.stop - 1] == 30 > host.day_first[part.start]
    signals = [DirectionSignal(lay, stager=stager, chunk=c).compute(obs, params, supports, day_first, book)
               for c in (5, SIGNAL_ROWS)]
    assert np.isfinite(signals[0]).all() and np.ptp(signals[0]) > 0
    np.testing.assert_allclose(signals[0], signals[1], rtol=1e-6, atol=1e-7)  # each row's window, whatever its chunk
    with pytest.raises(ValueError, match="needs book_obs"):
        DirectionSignal(lay, stager=stager, chunk=5).compute(obs, params, supports, day_first)
    trainer.bind_fold(FoldMarket.build(rt.features, rt.folds[1], cfg.features, cfg.env), 1)  # the learner's set_market
    learner = trainer.learner
    for net in (learner.online, learner.target_net, trainer.collector.net, trainer.evaluator.net):
        assert net.encoder._market[0] is trainer.market.book_obs
