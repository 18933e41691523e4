"""A kernel NVVM compiles and ptxas refuses: inline PTX passes NVVM unread, so its mistakes (here a TF32 mma
with an f16 accumulator, a shape PTX does not define) surface only when the PTX is assembled."""

from llvmlite import ir
from numba import cuda, float32, types, uint32
from numba.cuda.extending import intrinsic

from fox_numba.device.registry import register

_F32, _I32 = ir.FloatType(), ir.IntType(32)


@intrinsic
def wrong_mma(typingctx, a, b, c):
    sig = types.float32(types.uint32, types.uint32, types.float32)

    def codegen(context, builder, sig, args):
        frag = ir.LiteralStructType([_F32] * 4)
        asm = ir.InlineAsm(
            ir.FunctionType(frag, [_I32, _I32, _F32]),
            "mma.sync.aligned.m16n8k8.row.col.f16.tf32.tf32.f32 {$0,$1,$2,$3}, {$4,$4,$4,$4}, {$5,$5}, "
            "{$6,$6,$6,$6};",
            "=f,=f,=f,=f,r,r,f",
        )
        return builder.extract_value(builder.call(asm, args), 0)

    return sig, codegen


@register((float32[::1], uint32[::1]))
@cuda.jit
def misassembled_mma(out, bits):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = wrong_mma(bits[0], bits[1], out[i])
