"""What ptxas makes of the fused C51 kernels for sm_90, no GPU needed (NVVM and nvJitLink: the cu13 extra): per
kernel its registers and shared memory at its launch bounds, the blocks per SM they allow
(compile_check.resident_blocks), and its PTX: lines, 64-bit integer operations (index arithmetic: numba computes
in int64 unless told otherwise) and the integer divisions left in it.

    NUMBA_ENABLE_CUDASIM=0 python3 tools/select_residency.py [KERNEL ...]

KERNEL: one of the defaults (learner.select_q_rows, learner.project_loss_scatter and
action_select.action_select_heads_kernel, under fox_numba.kernels) or a tensor-core GEMM (gemm_tensor.linear_*_tf32),
each at the block its driver launches.
"""

import argparse
import re

from fox_numba.kernels import compile_check as c

DEFAULT_KERNELS = ("learner.select_q_rows", "learner.project_loss_scatter", "action_select.action_select_heads_kernel")
GEMM_KERNELS = ("gemm_tensor.linear_fwd_tf32", "gemm_tensor.linear_bwd_in_tf32", "gemm_tensor.linear_wgrad_tf32")
INT64_OP = re.compile(r"^\s*(?:@%p\d+\s+)?[a-z]+(?:\.[a-z0-9]+)*\.[sub]64\b", re.MULTILINE)
INT_DIV = re.compile(r"^\s*(?:div|rem)\.[su](?:32|64)\b", re.MULTILINE)


def launch_threads(name: str) -> int:
    """Threads of a block as the kernel's driver launches it at Z = 51."""
    from fox_numba.kernels import action_select, gemm_tensor, head_rows, learner

    if name in GEMM_KERNELS:
        return gemm_tensor.THREADS
    return {"learner.select_q_rows": learner.select_threads(head_rows.STAGE_SAMPLES),
            "learner.project_loss_scatter": learner.LOSS_ROWS * learner.LOSS_THREADS_PER_ROW,
            "action_select.action_select_heads_kernel": head_rows.STAGE_SAMPLES * action_select.LANES}[name]


def ptx_counts(ptx: str) -> tuple[int, int, int]:
    """(lines, 64-bit integer operations, integer divisions) of a PTX text."""
    return ptx.count("\n"), len(INT64_OP.findall(ptx)), len(INT_DIV.findall(ptx))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    known = DEFAULT_KERNELS + GEMM_KERNELS
    parser.add_argument("kernels", nargs="*", default=list(DEFAULT_KERNELS), help=" | ".join(known))
    args = parser.parse_args()
    unknown = sorted(set(args.kernels) - set(known))
    if unknown:
        parser.error(f"unknown kernel(s) {unknown}: choose from {list(known)}")
    c._prepare_compiler((9, 0))
    from numba import cuda

    from fox_numba.device.registry import KERNELS

    c.import_package()
    print("| kernel | launch bounds | registers | shared B | blocks per SM | PTX lines | 64-bit int ops "
          "| int divisions |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in args.kernels:
        spec = KERNELS[f"fox_numba.kernels.{name}"]
        bounds = spec.kernel.targetoptions.get("launch_bounds")
        ptx, _ = cuda.compile_ptx(spec.py_func, spec.signatures[0], cc=(9, 0), launch_bounds=bounds)
        regs, smem = c.resources(ptx, (9, 0))
        threads = launch_threads(name)
        lines, ops64, divs = ptx_counts(ptx)
        print(f"| {name} | {bounds} | {regs} | {smem} | {c.resident_blocks(threads, regs, smem)} | {lines} | {ops64} "
              f"| {divs} |")


if __name__ == "__main__":
    main()
