"""Tensor-core instructions for `@cuda.jit` kernels, as numba intrinsics over inline PTX (sm_80 and later).

    bits = tf32_bits(x)                                  float32 -> TF32 operand register (cvt.rna.tf32.f32)
    d0, d1, d2, d3 = mma_tf32(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)
                                                         D[16x8] = A[16x8] @ B[8x8] + C, one warp, fp32 accumulate
    bits = bf16_bits(x)                                  float32 -> bf16 in the low 16 bits (cvt.rn.bf16x2.f32)
    d0, d1, d2, d3 = mma_bf16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)
                                                         D[16x8] = A[16x16] @ B[16x8] + C, bf16 pairs, fp32 accumulate

numba-cuda has no tensor-core API; its intrinsics may emit inline PTX (numba's own cache-hint loads do), which
NVVM passes through. `mma_tf32` is PTX's mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32: all 32 lanes of a
warp call it together, each holding a fragment. With g = lane // 4 and t = lane % 4:
    A (16 x 8, row):  a0 = A[g, t]   a1 = A[g + 8, t]   a2 = A[g, t + 4]   a3 = A[g + 8, t + 4]
    B (8 x 8, col):   b0 = B[t, g]   b1 = B[t + 4, g]
    C, D (16 x 8):    c0 = C[g, 2t]  c1 = C[g, 2t + 1]  c2 = C[g + 8, 2t]  c3 = C[g + 8, 2t + 1]
A and B operands are TF32 values in 32-bit registers (`tf32_bits`: round to nearest, ties away from zero, to 10
explicit mantissa bits; `tf32_round` in tests/reference.py is its numpy twin). The products are exact in fp32
and are accumulated in fp32.

`mma_bf16` is mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: the same registers, each A and B register a
pair of bf16 values (the lower reduction index in the low 16 bits):
    A (16 x 16, row): a0 = A[g, 2t | 2t + 1]      a1 = A[g + 8, 2t | 2t + 1]
                      a2 = A[g, 2t + 8 | 2t + 9]  a3 = A[g + 8, 2t + 8 | 2t + 9]
    B (16 x 8, col):  b0 = B[2t | 2t + 1, g]      b1 = B[2t + 8 | 2t + 9, g]
    C, D: as above.
`bf16_bits` rounds to nearest, ties to even, to 7 explicit mantissa bits (8 significant; `bf16_round` in
tests/reference.py is its twin) and returns the bf16 in the low half of a 32-bit register, so a pair is
lo | hi << 16. Products of two bf16 values (16 significant bits) are exact in fp32 and accumulated in fp32.

The CUDA simulator cannot run these (a warp-wide instruction over the other lanes' registers); kernels that use
them run on the GPU only, are compiled for sm_90 by the compile check, and have an exact fp32 twin that the
simulator runs (agent/dense.py picks it).
"""

from typing import Any

from llvmlite import ir
from numba import types
from numba.cuda.extending import intrinsic

from fox_numba.device.kernel_cache import stable_identity


def _f32() -> ir.FloatType:
    """llvmlite's float type, built where it is used: a kernel's cache key pickles what its closure reaches,
    these functions' globals included, and an llvmlite type shared at module level caches its string once printed,
    so a kernel would be keyed one way before the first code generation and another after it (a prewarmed cache
    missed; the compile check now refuses such a kernel)."""
    return ir.FloatType()


def _i32() -> ir.IntType:
    """llvmlite's 32-bit integer type, built where it is used (`_f32`)."""
    return ir.IntType(32)


def _tf32_bits(typingctx, x):
    """The TF32 operand register of float32 x (cvt.rna.tf32.f32)."""
    sig = types.uint32(types.float32)

    def codegen(context, builder, sig, args):
        cvt = ir.InlineAsm(ir.FunctionType(_i32(), [_f32()]), "cvt.rna.tf32.f32 $0, $1;", "=r,f")
        return builder.call(cvt, args)

    return sig, codegen


def _bf16_bits(typingctx, x):
    """The bf16 of float32 x in the low 16 bits of a 32-bit register, the high 16 zero (cvt.rn.bf16x2.f32 of
    (0, x): the first source goes to the high half)."""
    sig = types.uint32(types.float32)

    def codegen(context, builder, sig, args):
        cvt = ir.InlineAsm(ir.FunctionType(_i32(), [_f32(), _f32()]), "cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,f,f")
        return builder.call(cvt, [ir.Constant(_f32(), 0.0), args[0]])

    return sig, codegen


tf32_bits = stable_identity(intrinsic(_tf32_bits), "tf32_bits")
bf16_bits = stable_identity(intrinsic(_bf16_bits), "bf16_bits")


def _mma(instruction: str) -> Any:
    """The intrinsic (d0, d1, d2, d3) = mma(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3) of one warp's `instruction`,
    an mma.sync with four 32-bit A and two B registers and four fp32 accumulators (module header)."""

    def mma(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        u, f = types.uint32, types.float32
        sig = types.UniTuple(f, 4)(u, u, u, u, u, u, f, f, f, f)

        def codegen(context, builder, sig, args):
            fragment = ir.LiteralStructType([_f32()] * 4)
            asm = ir.InlineAsm(
                ir.FunctionType(fragment, [_i32()] * 6 + [_f32()] * 4),
                f"{instruction} {{$0,$1,$2,$3}}, {{$4,$5,$6,$7}}, {{$8,$9}}, {{$10,$11,$12,$13}};",
                "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f",
            )
            out = builder.call(asm, args)
            return context.make_tuple(builder, sig.return_type, [builder.extract_value(out, k) for k in range(4)])

        return sig, codegen

    return stable_identity(intrinsic(mma), instruction)


mma_tf32 = _mma("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32")
mma_bf16 = _mma("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32")
