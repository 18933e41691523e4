"""Peak memory and time of loading a store's features as `fox train` does (walkforward/driver.py load_features).

    NUMBA_ENABLE_CUDASIM=1 python3 tools/load_memory.py [--store STORE.h5]   # default: the embedded market

Prints the days, bars and load seconds, and the process's peak RSS after the market selection (which reads
and validates every selected day) and after the feature load (which reads every day again and keeps only
its per-bar features and raw-market rows).
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fox_numba.config import load_config  # noqa: E402
from fox_numba.market.default import ensure_default_store  # noqa: E402
from fox_numba.market.select import select_market  # noqa: E402
from fox_numba.walkforward.driver import load_features  # noqa: E402


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", type=Path, help="market store (default: the embedded default market)")
    args = parser.parse_args(argv)
    store = args.store or ensure_default_store()
    cfg = load_config("default", overrides=[f'market.store="{store}"'])
    selection = select_market(cfg.market)
    after_select = peak_mib()
    start = time.perf_counter()
    features = load_features(cfg, selection)
    print(f"{store}: {len(features.days)} days, {features.values.shape[0]:,} bars, load "
          f"{time.perf_counter() - start:.1f} s; peak RSS {after_select:.0f} MiB after the selection, "
          f"{peak_mib():.0f} MiB after the load")
    return 0


if __name__ == "__main__":
    sys.exit(main())
