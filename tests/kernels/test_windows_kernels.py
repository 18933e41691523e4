"""Window kernels of the Mamba2 encoder (kernels/windows.py) against plain numpy references on small seeded random
inputs, every output element. The kernels copy float32 values, so the outputs equal the references exactly.

The market: R = 23 rows over days of 1, 4, 7 and 11 bars (a one-bar day included); the samples' rows include every
day's first bar, a bar one after it and each day's last bar, so windows of T = 5 or 11 clamp at day starts in every way;
at T = 11 a gather block's warps take more than one bar, and at F = 67 and 161 its lanes one and two rounds of four
columns, the last rounds partial.
"""

import numpy as np
import pytest

from fox_numba.device import registry
from fox_numba.kernels.windows import concat_columns, gather_windows

DAY_START = np.array([0, 1, 5, 12, 23])
T, C, F = 5, 9, 6


def gather64(market_obs, rows, day_start, seq_len, width):
    """u [S T, F]: for each sample, the bars r - T + 1 .. r of its day (a bar before the day's first reads the first)."""
    out = []
    for r in rows:
        first = day_start[np.searchsorted(day_start, r, side="right") - 1]
        out += [market_obs[max(r - seq_len + 1 + t, first), :width] for t in range(seq_len)]
    return np.array(out)


def test_kernels_are_registered():
    names = {name.rsplit(".", 1)[1] for name in registry.KERNELS if name.startswith("fox_numba.kernels.windows.")}
    assert names == {"gather_windows_kernel", "concat_columns_kernel"}


@pytest.mark.parametrize("T, C, F", [(T, C, F), (11, 70, 67), (3, 170, 161)],
                         ids=["short", "more bars than warps", "two column rounds"])
def test_gather_windows_matches_numpy(stream, stager, rng, T, C, F):
    market = rng.standard_normal((DAY_START[-1], C)).astype(np.float32)
    day_first = np.repeat(DAY_START[:-1], np.diff(DAY_START)).astype(np.int32)
    rows = np.array([0, 1, 2, 5, 6, 9, 11, 12, 13, 16, 17, 22], np.int32)
    rng.shuffle(rows)
    u = stager.upload_new(np.full((rows.size * T, F), np.nan, np.float32))
    gather_windows(stager.upload_new(market), stager.upload_new(rows), stager.upload_new(day_first), u, seq_len=T,
                   stream=stream)
    want = gather64(market, rows, DAY_START, T, F)
    np.testing.assert_array_equal(stager.download(u), want)
    assert not np.any(want == 0)  # every element was compared against a nonzero value


def test_concat_columns_matches_numpy(stream, stager, rng):
    batch, d, e = 4, 7, 3
    obs = rng.standard_normal((batch, d)).astype(np.float32)
    enc = rng.standard_normal((batch, e)).astype(np.float32)
    x = stager.upload_new(np.full((batch, d + e), np.nan, np.float32))
    concat_columns(stager.upload_new(obs), stager.upload_new(enc), x, stream=stream)
    np.testing.assert_array_equal(stager.download(x), np.concatenate([obs, enc], axis=1))
