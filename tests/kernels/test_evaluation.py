"""The validation backtest's per-step records (kernels/evaluation.py) against a hand-worked book in dollars.

Two evaluation environments trade one hand-made day of 4 bars (tick 0.25, $50 per point, $2 commission per
contract, risk unit $100, beyond-depth penalty 2 ticks, max position 4: targets 1, 2, 4); each step is
recorded by `record_eval_step`. The expected PnL is the equity change of each step in dollars, net of
commissions, worked out by hand below (the environment's fill rule, kernels/env.py header); the step
kernel is also compared with the float64 reference environment at every step (tests/reference_env.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from reference_env import Bar, Run, env_config, hand_market

from fox_numba.device.memory import device_zeros
from fox_numba.kernels.evaluation import record_eval_step

SHORT, HOLD, LONG, FLAT = range(4)
QUARTER, FULL = 0, 2
MARKET = 0
PATIENT = 0
HOLD_ACTION = [HOLD, 0, MARKET, PATIENT]
pytestmark = pytest.mark.usefixtures("long_switch_interval")

BARS = [
    Bar(5000.00, (1, 2), 5000.25, (5,)),  # mid 5000.125
    Bar(5001.00, (5,), 5001.25, (5,)),  # mid 5001.125
    Bar(5000.50, (5,), 5000.75, (5,)),  # mid 5000.625
    Bar(5002.00, (5,), 5002.50, (5,)),  # mid 5002.25, the window's last bar
]
ACTIONS = [  # per step: (environment A, environment B)
    ([LONG, FULL, MARKET, PATIENT], [SHORT, FULL, MARKET, PATIENT]),
    (HOLD_ACTION, [FLAT, 0, MARKET, PATIENT]),
    (HOLD_ACTION, [LONG, QUARTER, MARKET, PATIENT]),
    ([LONG, FULL, MARKET, PATIENT], [SHORT, FULL, MARKET, PATIENT]),  # past the window: frozen
]
# Dollars per step (rows) and environment (columns):
# A buys 4 at 5000.25, marked at 5001.125: 0.875 x 4 x 50 - 4 x 2 = 167; holds to 5000.625: -0.5 x 200 = -100;
#   holds, and bar 3 ends the window: marked at 5002.25 and sold at its bid 5002.00: 1.375 x 200 - 8 = 267.
# B sells 4 into bids 1 @ 5000.00, 2 @ 4999.75, and 1 beyond the depth at 4999.75 - 2 ticks = 4999.25
#   (19998.75), marked at 5001.125 (20004.5): -5.75 x 50 - 8 = -295.5; Flat buys 4 at 5001.25:
#   -0.125 x 200 - 8 = -33; buys 1 at 5000.75, closed at bar 3's bid 5002.00: 1.25 x 50 - 2 x 2 = 58.5.
# Step 4 is past the window: both environments are frozen and record 0 dollars and a flat position.
EXPECTED_PNL = [[167.0, -295.5], [-100.0, -33.0], [267.0, 58.5], [0.0, 0.0]]
EXPECTED_POS = [[4, -4], [4, 0], [0, 0], [0, 0]]


def test_records_are_dollars_and_positions_of_a_hand_worked_book(stager):
    market = hand_market(BARS, windows=[(0, 4), (0, 4)], risk_unit=100.0)
    run = Run(stager, market, env_config(), mode="eval")
    stream = stager.stream
    pnl = stager.upload_new(np.full((4, 2), -7.0, np.float32))
    pos = stager.upload_new(np.full((4, 2), -7, np.int32))
    counter = device_zeros(1, np.int32, stream=stream)
    for t, (a, b) in enumerate(ACTIONS):
        run.step([a, b], f"step {t}")
        record_eval_step(run.env.comps, run.env.si, run.env.params, counter, pnl, pos, stream=stream)
        assert stager.download(counter)[0] == t + 1
    got_pnl, got_pos = stager.download(pnl), stager.download(pos)
    np.testing.assert_allclose(got_pnl, EXPECTED_PNL, rtol=1e-6, atol=1e-4)
    np.testing.assert_array_equal(got_pos, EXPECTED_POS)
    # a record past the last row writes nothing and still advances the counter
    record_eval_step(run.env.comps, run.env.si, run.env.params, counter, pnl, pos, stream=stream)
    assert stager.download(counter)[0] == 5
    np.testing.assert_array_equal(stager.download(pnl), got_pnl)
    np.testing.assert_array_equal(stager.download(pos), got_pos)
