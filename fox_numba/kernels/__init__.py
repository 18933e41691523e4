"""Numba-CUDA kernels of the stages, one module per concern; each registers its kernels in
`fox_numba.device.registry`. Layering: kernels/ imports device/ and actions.py, never agent/ or a stage."""
