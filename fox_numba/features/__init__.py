"""Per-bar features (multi-level OFI, trade and bar features) and their train-window normalisation."""
