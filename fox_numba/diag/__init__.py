"""HEALTH_DIAG: the snapshot layout, its line format and parser (kernels fill it; the host only formats)."""
