"""Peak memory and time of selecting a store's days and loading their features as `fox train` does
(market/select.py select_market, then walkforward/driver.py load_features), without, with a cold and with a warm
per-day cache (`market.cache`, features/cache.py).

    NUMBA_ENABLE_CUDASIM=1 python3 tools/load_memory.py [--store STORE.h5]   # default: the embedded market

Each case runs in a process of its own (peak RSS is per process): 'off' (no cache: the selection reads and
validates every day, the load reads every day again), 'cold' (an empty cache folder: the same reads, and the
records and feature files written), 'warm' (the folder 'cold' filled: the selection reads only the bars, the load
no day). Prints, per case, the days, bars, seconds of the selection and of the load, and the peak RSS after each.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fox_numba.config import load_config  # noqa: E402
from fox_numba.market.default import ensure_default_store  # noqa: E402
from fox_numba.market.select import select_market  # noqa: E402
from fox_numba.walkforward.driver import load_features  # noqa: E402

CASES = ("off", "cold", "warm")


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def measure(store: Path, cache: str) -> dict:
    """Select and load `store` with `market.cache = cache`, in this process."""
    cfg = load_config("default", overrides=[f"market.store={json.dumps(str(store))}",
                                            f"market.cache={json.dumps(cache)}"])
    start = time.perf_counter()
    selection = select_market(cfg.market)
    selected, after_select = time.perf_counter(), peak_mib()
    features = load_features(cfg, selection)
    return {"days": len(features.days), "bars": int(features.values.shape[0]), "select_s": selected - start,
            "load_s": time.perf_counter() - selected, "select_mib": after_select, "load_mib": peak_mib()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", type=Path, help="market store (default: the embedded default market)")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # one case, in a child process: 'off' or a cache folder
    args = parser.parse_args(argv)
    store = args.store or ensure_default_store()
    if args.case is not None:
        print(json.dumps(measure(store, args.case)))
        return 0
    with tempfile.TemporaryDirectory(prefix="fox-cache-") as folder:
        for case in CASES:
            cmd = [sys.executable, __file__, "--store", str(store), "--case", "off" if case == "off" else folder]
            r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1])
            print(f"{store} cache {case}: {r['days']} days, {r['bars']:,} bars; selection {r['select_s']:.2f} s, "
                  f"load {r['load_s']:.2f} s; peak RSS {r['select_mib']:.0f} MiB after the selection, "
                  f"{r['load_mib']:.0f} MiB after the load")
    return 0


if __name__ == "__main__":
    sys.exit(main())
