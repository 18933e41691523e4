"""Per-level order-flow imbalance on a hand-worked 3-level book: price improvements, level shifts,
cancellations and empty levels (E). Prices in ticks; e = per-event contribution per level (L1, L2, L3).

state  bid L1   L2     L3     | ask L1   L2     L3     | e L1  L2  L3  what happened
s0     100x5    99x6   98x7   | 102x4    103x3  104x2  |                entering bar A
s1     101x2    100x5  99x6   | 102x4    103x3  104x2  | +2   +5  +6    new best bid: every bid level's price
                                                                          rises, so each adds its new size
s2     101x2    100x5  99x6   | 102x1    103x3  104x2  | +3    0   0    best ask queue 4 -> 1: -1 + 4
s3     101x2    100x5  99x6   | 103x3    104x2  E      | +1   +3  +2    best ask gone: ask prices rise, each
                                                                          level adds its old size; L3 empties
                                                                          (its stale size 99 must count 0)
  bar A = s0..s3: OFI = (6, 8, 8); depth D = (27 + 22 + 19 + 18) / (2 * 3 levels * 4 states) = 86/24
s4     101x2    100x5  E      | 103x3    104x2  E      |  0    0  -6    bid L3 cancelled: -qb_prev
s5     101x2    100x5  E      | 102x8    103x3  104x2  | -8   -3  -2    new best ask: ask prices fall, each
                                                                          level takes its new size; L3 refills
s6     101x9    100x5  E      | 102x8    103x3  104x2  | +7    0   0    bid queue 2 -> 9; empty bid L3 stays
                                                                          empty: 0 - 0
s7     100x5    E      E      | 102x8    103x3  104x2  | -9   -5   0    best bid gone: bid prices fall, each
                                                                          level loses its old size
  bar B = s3..s7 (s3 enters it): OFI = (-10, -8, -8); D = (18 + 12 + 20 + 27 + 18) / (2 * 3 * 5) = 95/30
"""

from __future__ import annotations

import doctest

import numpy as np

import fox_numba.features.ofi as ofi_module
from fox_numba.features.ofi import bar_order_flow
from fox_numba.market.schema import UNDEF_PRICE

E = int(UNDEF_PRICE)
#        bid prices        bid sizes   ask prices        ask sizes
STATES = [
    ((100, 99, 98), (5, 6, 7), (102, 103, 104), (4, 3, 2)),
    ((101, 100, 99), (2, 5, 6), (102, 103, 104), (4, 3, 2)),
    ((101, 100, 99), (2, 5, 6), (102, 103, 104), (1, 3, 2)),
    ((101, 100, 99), (2, 5, 6), (103, 104, E), (3, 2, 99)),
    ((101, 100, E), (2, 5, 0), (103, 104, E), (3, 2, 0)),
    ((101, 100, E), (2, 5, 0), (102, 103, 104), (8, 3, 2)),
    ((101, 100, E), (9, 5, 0), (102, 103, 104), (8, 3, 2)),
    ((100, E, E), (5, 0, 0), (102, 103, 104), (8, 3, 2)),
]
EVENTS = [(2, 5, 6), (3, 0, 0), (1, 3, 2), (0, 0, -6), (-8, -3, -2), (7, 0, 0), (-9, -5, 0)]


def book() -> tuple[np.ndarray, ...]:
    cols = list(zip(*STATES, strict=True))
    return (
        np.array(cols[0], dtype=np.int64),
        np.array(cols[1], dtype=np.uint32),
        np.array(cols[2], dtype=np.int64),
        np.array(cols[3], dtype=np.uint32),
    )


def test_each_event_contribution():
    # One bar per event: entering state n-1, event n.
    n = len(EVENTS)
    ofi, _ = bar_order_flow(*book(), np.arange(n), np.arange(n) + 2)
    np.testing.assert_array_equal(ofi, EVENTS)


def test_bars_sum_their_events_and_average_depth():
    ofi, depth = bar_order_flow(*book(), np.array([0, 3]), np.array([4, 8]))
    np.testing.assert_array_equal(ofi, [[6, 8, 8], [-10, -8, -8]])
    np.testing.assert_allclose(depth, [86 / 24, 95 / 30], rtol=1e-15)


def test_bar_without_events_has_zero_ofi_and_the_entering_depth():
    ofi, depth = bar_order_flow(*book(), np.array([3]), np.array([4]))
    np.testing.assert_array_equal(ofi, [[0, 0, 0]])
    np.testing.assert_allclose(depth, [18 / 6], rtol=1e-15)


def test_docstring_worked_example():
    results = doctest.testmod(ofi_module)
    assert results.attempted >= 7 and results.failed == 0
    one_level = (
        np.array([[400], [400], [400], [400], [399]]),
        np.array([[5], [7], [7], [7], [9]]),
        np.array([[401], [401], [401], [402], [402]]),
        np.array([[4], [4], [1], [6], [6]]),
    )
    ofi, depth = bar_order_flow(*one_level, np.array([0]), np.array([5]))
    assert (ofi[0, 0], depth[0]) == (-1.0, 5.6)
