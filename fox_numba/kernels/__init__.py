"""Numba-CUDA kernels, one module per concern; each module registers its kernels in `registry`."""
