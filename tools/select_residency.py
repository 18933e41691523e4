"""ptxas registers and shared memory of learner.select_q_rows for sm_90, compiled with its launch bounds, and the
blocks per SM they allow (compile_check.resident_blocks). No GPU needed (NVVM and nvJitLink: the cu13 extra):

    NUMBA_ENABLE_CUDASIM=0 python3 tools/select_residency.py
"""

from fox_numba.kernels import compile_check as c


def main() -> None:
    c._prepare_compiler((9, 0))
    from numba import cuda

    from fox_numba.device.registry import KERNELS

    c._import_package_modules("fox_numba")
    spec = KERNELS["fox_numba.kernels.learner.select_q_rows"]
    bounds = spec.kernel.targetoptions.get("launch_bounds")
    ptx, _ = cuda.compile_ptx(spec.py_func, spec.signatures[0], cc=(9, 0), launch_bounds=bounds)
    regs, smem = c.resources(ptx, (9, 0))
    threads = bounds[0] if bounds else 104
    print(f"launch bounds {bounds}; {regs} registers, {smem} B shared; blocks of {threads} threads per SM: "
          f"{c.resident_blocks(threads, regs, smem)}")


if __name__ == "__main__":
    main()
