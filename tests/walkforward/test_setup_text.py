"""A fold line's set-up time: the total and each part of walkforward/driver.py's SETUP_PARTS, from the marks taken
before and after each part, so that a slow set-up (runs sharing one host) says where it went."""

from __future__ import annotations

import pytest

from fox_numba.walkforward.driver import SETUP_PARTS, setup_text


def test_each_part_is_the_gap_between_its_marks_and_the_total_spans_them():
    marks = [10.0, 10.26, 11.0, 11.04, 11.53]
    assert setup_text(marks) == "set up in 1.5 s: features 0.3, device 0.7, resets 0.0, baselines 0.5"
    assert SETUP_PARTS == ("features", "device", "resets", "baselines")


def test_a_mark_short_or_over_is_refused():
    with pytest.raises(ValueError):
        setup_text([0.0, 1.0, 2.0, 3.0])
    with pytest.raises(ValueError):
        setup_text([0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
