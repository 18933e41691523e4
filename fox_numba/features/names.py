"""The per-bar feature vector: every feature's name and definition, in column order (one source of truth).

All features of a bar use only what is known at the bar's close: book rows and trades with
`ts < bar start + 60 s`, and earlier bars of the same day. Look-back windows restart at each day's first
bar: a window that would reach into the previous day is shortened to the bars of the current day.

Terms used in the definitions: the *close book* is the last MBP-10 row before the bar's end; *mid* is
the close book's (best bid + best ask) / 2; *depth D* is the bar's average resting size per level and
side (see `fox_numba.features.ofi`); *tick* is the instrument's tick size.
"""

from __future__ import annotations

from fox_numba.config import FeatureConfig
from fox_numba.errors import ConfigError
from fox_numba.market.schema import N_LEVELS

RETURN_LAGS = (1, 5, 15)
"""Bars over which log mid returns are taken."""
FLOW_SUM_BARS = 5
"""Bars summed by `ofi_multi_sum5` and `trade_imbalance_sum5` (the current bar and the four before)."""
VOL_BARS = 15
"""One-bar returns in the realised-volatility window (the current bar's and the fourteen before)."""

FEATURES: tuple[tuple[str, str], ...] = (
    *(
        (
            f"ofi_l{m}",
            f"Order-flow imbalance at book level {m} (Cont, Kukanov, Stoikov), summed over the bar's "
            "MBP-10 events, divided by the bar's depth D.",
        )
        for m in range(1, N_LEVELS + 1)
    ),
    ("ofi_multi", "Sum of ofi_l1 .. ofi_l{ofi_levels} (features.ofi_levels; an equal-weight integrated OFI)."),
    ("ofi_multi_sum5", "ofi_multi summed over the last 5 bars of the day."),
    (
        "trade_imbalance",
        "Signed trade volume / trade volume in the bar (buyer aggressor +, seller -, unknown side 0); "
        "0 without trades.",
    ),
    ("trade_imbalance_sum5", "Signed volume / volume over the last 5 bars of the day; 0 without trades."),
    ("log_volume", "log(1 + contracts traded in the bar)."),
    ("log_trade_count", "log(1 + trades in the bar)."),
    ("ret_1", "log(mid / mid one bar earlier); 0 on the day's first bar."),
    ("ret_5", "log(mid / mid 5 bars earlier), or / the day's first close mid if the day has fewer bars."),
    ("ret_15", "log(mid / mid 15 bars earlier), or / the day's first close mid if the day has fewer bars."),
    ("range_rel", "(bar high - bar low) / mid, from the bar's OHLC."),
    (
        "realised_vol_15",
        "sqrt(mean of ret_1^2) over the day's last 15 bars, leaving out the day's first bar; 0 on that bar.",
    ),
    ("spread_close_ticks", "(best ask - best bid) / tick in the close book."),
    ("spread_mean_ticks", "Time-weighted mean spread / tick over the bar; one-sided book states are left out."),
    ("depth_imbalance_l1", "(bid size - ask size) / (bid size + ask size) at the best level of the close book."),
    ("depth_imbalance_l5", "The same over the sizes of levels 1-5 of the close book (empty levels count 0)."),
    ("depth_imbalance_l10", "The same over the sizes of all 10 levels of the close book."),
    (
        "microprice_offset_ticks",
        "(microprice - mid) / tick in the close book; "
        "microprice = (bid * ask size + ask * bid size) / (bid size + ask size).",
    ),
    ("log_depth", "log(1 + D), the bar's average resting size per level and side (the OFI divisor)."),
    ("log_book_events", "log(1 + MBP-10 events in the bar)."),
    ("tod_sin", "sin(2 pi f), f = session_frac."),
    ("tod_cos", "cos(2 pi f), f = session_frac."),
    (
        "session_frac",
        "(bar end - session open) / (session close - session open) of the run's session (market.session: the "
        "regular hours, or the whole trading day from the reopen to the day roll); in (0, 1].",
    ),
)
"""(name, definition) of every feature, in the column order of `FeatureSet.values`."""

FEATURE_NAMES: tuple[str, ...] = tuple(name for name, _ in FEATURES)
FEATURE_INDEX: dict[str, int] = {name: i for i, name in enumerate(FEATURE_NAMES)}

TW_IMBALANCE_FEATURES: tuple[tuple[str, str], ...] = (
    (
        "tw_imbalance_l1",
        "(bid size - ask size) / (bid size + ask size) at book level 1, averaged over the bar's book states, each "
        "weighted by the time it rests inside the bar (0 where both sides are empty).",
    ),
    *((f"tw_imbalance_l{m}", f"The same at book level {m}.") for m in range(2, N_LEVELS + 1)),
    ("tw_imbalance_l1_5", "The same over the sizes of levels 1-5 (empty levels count 0)."),
    ("tw_imbalance_l1_10", "The same over the sizes of all 10 levels."),
)
"""(name, definition) of the time-weighted book imbalance columns (features.tw_imbalance; features/book_features.py
time_weighted_imbalance), which follow the features in `FeatureSet.values` when on."""
TW_IMBALANCE_COLUMNS: tuple[str, ...] = tuple(name for name, _ in TW_IMBALANCE_FEATURES)


def feature_names(config: FeatureConfig) -> tuple[str, ...]:
    """The columns of `FeatureSet.values` under `config`: the features, then the time-weighted imbalance's with
    features.tw_imbalance."""
    return FEATURE_NAMES + (TW_IMBALANCE_COLUMNS if config.tw_imbalance else ())


def check_feature_config(config: FeatureConfig) -> None:
    """Reject a feature config the builder cannot honour (width, OFI levels, clip)."""
    if config.n_features != len(FEATURE_NAMES):
        raise ConfigError(
            f"features.n_features is {config.n_features} but the feature builder produces "
            f"{len(FEATURE_NAMES)} features (FEATURE_NAMES); set features.n_features = {len(FEATURE_NAMES)}"
        )
    if not 1 <= config.ofi_levels <= N_LEVELS:
        raise ConfigError(f"features.ofi_levels is {config.ofi_levels}; it must be between 1 and {N_LEVELS}")
    if not config.clip_sigma > 0:
        raise ConfigError(f"features.clip_sigma is {config.clip_sigma}; it must be positive")
