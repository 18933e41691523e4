"""Walk-forward validation: folds as data, and (with the training stage) the per-fold driver."""
