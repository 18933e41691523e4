"""A kernel whose cache key changes when it is compiled: built in a factory, it reaches an intrinsic, itself built in
a factory, whose code generation uses an llvmlite type held at module level; the type keeps its string once printed,
so the intrinsic pickles differently after the first compile (the 12 tensor-core GEMMs did, until
kernels/tensor_core.py built its types where the code is generated). The compile check must refuse it."""

from llvmlite import ir
from numba import cuda, float32, types, uint32
from numba.cuda.extending import intrinsic

from fox_numba.device.kernel_cache import stable_identity
from fox_numba.device.registry import register

_F32, _I32 = ir.FloatType(), ir.IntType(32)


def _make_bits():
    """An intrinsic defined in a factory, as tensor_core's mma intrinsics are, so it pickles by value with the
    module-level types its code generation reads."""

    def bits(typingctx, x):
        sig = types.uint32(types.float32)

        def codegen(context, builder, sig, args):
            return builder.call(ir.InlineAsm(ir.FunctionType(_I32, [_F32]), "mov.b32 $0, $1;", "=r,f"), args)

        return sig, codegen

    return stable_identity(intrinsic(bits), "compile_fixture.drifting_bits")


drifting_bits = _make_bits()


def make_kernel():
    @cuda.jit(device=True)
    def bits_of(x):
        return drifting_bits(x)

    @cuda.jit
    def drifting_key(out, x):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = bits_of(x[i])

    return drifting_key


drifting_key = register((uint32[::1], float32[::1]))(make_kernel())
