"""Numba-CUDA kernels of the stages, one module per concern; each registers its kernels in
`fox_numba.device.registry`. Layering: kernels/ imports device/ and actions.py, never agent/ or a stage; the two
tools over every kernel (compile_check: sm_90 PTX in CI; warm_cache: `fox cache warm`) import the whole package at
run time to fill the registry."""
