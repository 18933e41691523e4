"""Walk-forward validation: the host-side machinery the fold driver calls.

folds.py (folds as data), reset_registry.py (StateResetRegistry: every piece of state, its scope and its
fold-boundary reset), kill.py (Q drift, gradient collapse, non-finite values), metrics.py (validation
figures, flat and buy-and-hold baselines, the oracle reference), probe.py (the ridge probe baseline),
run_folder.py (runs/<name>/: config, folds, metrics.jsonl, checkpoints, summary, resume).
"""
