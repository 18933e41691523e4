"""Tensor-core instructions for `@cuda.jit` kernels, as numba intrinsics over inline PTX (sm_80 and later).

    bits = tf32_bits(x)                                  float32 -> TF32 operand register (cvt.rna.tf32.f32)
    d0, d1, d2, d3 = mma_tf32(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)
                                                         D[16x8] = A[16x8] @ B[8x8] + C, one warp, fp32 accumulate

numba-cuda has no tensor-core API; its intrinsics may emit inline PTX (numba's own cache-hint loads do), which
NVVM passes through. `mma_tf32` is PTX's mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32: all 32 lanes of a
warp call it together, each holding a fragment. With g = lane // 4 and t = lane % 4:
    A (16 x 8, row):  a0 = A[g, t]   a1 = A[g + 8, t]   a2 = A[g, t + 4]   a3 = A[g + 8, t + 4]
    B (8 x 8, col):   b0 = B[t, g]   b1 = B[t + 4, g]
    C, D (16 x 8):    c0 = C[g, 2t]  c1 = C[g, 2t + 1]  c2 = C[g + 8, 2t]  c3 = C[g + 8, 2t + 1]
A and B operands are TF32 values in 32-bit registers (`tf32_bits`: round to nearest, ties away from zero, to 10
explicit mantissa bits; `tf32_round` in tests/reference.py is its numpy twin). The products are exact in fp32
and are accumulated in fp32.

The CUDA simulator cannot run these (a warp-wide instruction over the other lanes' registers); kernels that use
them run on the GPU only, are compiled for sm_90 by the compile check, and have an exact fp32 twin that the
simulator runs (agent/dense.py picks it).
"""

from llvmlite import ir
from numba import types
from numba.cuda.extending import intrinsic

_F32 = ir.FloatType()
_I32 = ir.IntType(32)


@intrinsic
def tf32_bits(typingctx, x):
    """The TF32 operand register of float32 x (cvt.rna.tf32.f32)."""
    sig = types.uint32(types.float32)

    def codegen(context, builder, sig, args):
        cvt = ir.InlineAsm(ir.FunctionType(_I32, [_F32]), "cvt.rna.tf32.f32 $0, $1;", "=r,f")
        return builder.call(cvt, args)

    return sig, codegen


@intrinsic
def mma_tf32(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    """(d0, d1, d2, d3): this lane's fragment of D = A @ B + C for one warp's m16n8k8 TF32 product."""
    u, f = types.uint32, types.float32
    sig = types.UniTuple(f, 4)(u, u, u, u, u, u, f, f, f, f)

    def codegen(context, builder, sig, args):
        fragment = ir.LiteralStructType([_F32] * 4)
        mma = ir.InlineAsm(
            ir.FunctionType(fragment, [_I32] * 6 + [_F32] * 4),
            "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9}, "
            "{$10,$11,$12,$13};",
            "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f",
        )
        out = builder.call(mma, args)
        return context.make_tuple(builder, sig.return_type, [builder.extract_value(out, k) for k in range(4)])

    return sig, codegen
