"""`fox profile`'s kernel rows: a row per kernel and grid, and the GEMMs' floating-point work for the fp32 and the
tensor-core kernels alike (their TFLOP/s column)."""

import numpy as np

from fox_numba.device.launch import LaunchRecord
from fox_numba.walkforward.profile import _work, gemm_op, launch_name


def array(shape, dtype=np.float32):
    return ("array", 0, shape, np.dtype(dtype))


def test_gemm_ops_of_both_kernel_families_and_no_other():
    assert gemm_op("gemm.linear_fwd_128x8") == gemm_op("gemm_tensor.linear_fwd_tf32") == "linear_fwd"
    assert gemm_op("gemm.linear_bwd_in_64x4") == gemm_op("gemm_tensor.linear_bwd_in_bf16") == "linear_bwd_in"
    assert gemm_op("gemm.linear_wgrad_64x4") == gemm_op("gemm_tensor.linear_wgrad_tf32") == "linear_wgrad"
    assert gemm_op("gemm.wgrad_reduce") is gemm_op("dense_strided.dense_fwd") is gemm_op("learner.linear_x") is None


def test_rows_name_the_grid_and_count_the_gemm_work():
    fwd = LaunchRecord("fox_numba.kernels.gemm_tensor.linear_fwd_tf32", (7, 128), (256,),
                       (array((16384, 134)), array((134, 868)), array((868,)), array((16384, 868)), ("<i4", b"")))
    assert launch_name(fwd) == "gemm_tensor.linear_fwd_tf32 7x128"
    nbytes, flops = _work(fwd)
    assert flops == 2.0 * 16384 * 134 * 868
    assert nbytes == 4.0 * (16384 * 134 + 134 * 868 + 868 + 16384 * 868)
    wgrad = LaunchRecord("fox_numba.kernels.gemm.linear_wgrad_64x4", (14, 3, 18), (256,),
                         (array((8192, 134)), array((8192, 868)), array((18, 134, 868)), array((18, 868))))
    assert launch_name(wgrad) == "gemm.linear_wgrad_64x4 14x3x18" and _work(wgrad)[1] == 2.0 * 8192 * 134 * 868
    k_len = np.int32(255).tobytes()  # the reduction over a head's live columns alone (kernels/nn.py cols=)
    bwd_in = LaunchRecord("fox_numba.kernels.gemm_tensor.linear_bwd_in_tf32", (2, 64), (256,),
                          (array((8192, 868)), array((256, 868)), array((8192, 256)), array((8192, 256)),
                           ("<i4", np.int32(1).tobytes()), ("<i4", k_len)))
    assert _work(bwd_in)[1] == 2.0 * 8192 * 256 * 255
    other = LaunchRecord("fox_numba.kernels.learner.select_q_rows", (1024,), (104,), (array((8192, 4), np.int32),))
    assert launch_name(other) == "learner.select_q_rows 1024" and _work(other) == (8192 * 4 * 4.0, 0.0)
