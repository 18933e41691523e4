"""Per-bar features (multi-level OFI, trade and bar features) and their train-window normalisation.

`build_features(days, instrument, config, session=market.session)` gives a `FeatureSet` over the bars of
that session: unnormalised features (`values`, columns named by `FEATURE_NAMES`, defined in
`names.FEATURES`) and the `RawMarket` the environment fills and marks against (days without a session
bar are left out, with a note in `FeatureSet.notes`). Per fold:
`stats = fit_normaliser(fs.values, fs.day_rows(a, b))`, then `apply_normaliser(fs.values, stats,
config.clip_sigma)` gives the float32 observations.
"""

from fox_numba.features.build import build_features
from fox_numba.features.feature_set import FeatureSet, RawMarket
from fox_numba.features.names import FEATURE_NAMES, FEATURES, check_feature_config
from fox_numba.features.normalise import NormStats, apply_normaliser, fit_normaliser

__all__ = [
    "FEATURES",
    "FEATURE_NAMES",
    "FeatureSet",
    "NormStats",
    "RawMarket",
    "apply_normaliser",
    "build_features",
    "check_feature_config",
    "fit_normaliser",
]
