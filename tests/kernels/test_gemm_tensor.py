"""The tensor-core GEMMs (kernels/gemm_tensor.py), TF32 and bf16, against float64 numpy references, every element
checked.

GPU only (but the last tests): the simulator cannot run mma.sync (kernels/tensor_core.py); CI compiles and
assembles these kernels for sm_90, and the simulator runs the exact fp32 kernels wherever run.precision asks for
tf32 or bf16. Two references per output, with u the format's unit roundoff (2^-11 TF32, 2^-8 bf16):
- exact inputs: |got - x @ w| <= (2u + u^2 + gamma(n)) * (|x| @ |w|) (+ |b|): each operand is rounded within a
  relative u, so a product within (1 + u)^2 - 1 of the exact one (gemm_tensor.product_error); the fp32
  accumulation over n terms adds gamma(n) (Higham 3.1; the mma's internal order is unspecified, gamma covers any).
- rounded inputs (tests/reference.py tf32_round, bf16_round: the twins of cvt.rna.tf32 and cvt.rn.bf16x2):
  |got - round(x) @ round(w)| <= gamma(n) * (|round(x)| @ |round(w)|): only the accumulation remains, so this
  checks the rounding mode too (another rounding misses it by up to u of a product, ~100 (TF32) or ~1000 (bf16)
  times this bound at these sizes), and the bf16 pairing: a fragment's two halves swapped or read one reduction
  index off move an element by whole product terms.
Every configuration (format x tile size) runs every shape. A wrong fragment index, tile edge or split moves an
element by a whole product term, ~1/n of its magnitude and hundreds of times the bounds here. Outputs start as NaN,
so an element no lane wrote fails.
The epilogues (the shared-memory staging of the accumulators to global memory) also run under the simulator: a test
kernel lays a matrix out in the lanes' accumulators as the mma leaves them and hands them to each epilogue.
"""

import numpy as np
import pytest
from numba import cuda, float32, uint32

from fox_numba.agent.dense import dense_kind, precision_dense
from fox_numba.device.runtime import SIMULATOR
from fox_numba.kernels.gemm_tensor import GEOMETRIES, NT, PARTS, THREADS, product_error
from fox_numba.kernels.nn import TENSOR, LinearWeightGrad, linear_backward_input, linear_forward, pick_tensor
from reference import ROUND

U = 2.0**-24
FORMATS = ("tf32", "bf16")
CONFIGS = tuple(TENSOR)  # each format at each tile size: "tf32", "tf32_64", "bf16", "bf16_64"
TILE = GEOMETRIES[0].tile

gpu_only = pytest.mark.gpu_only("mma.sync runs on tensor cores; the simulator has none")

# (B, K, N): below one tile; several tiles with ragged edges and a reduction ending mid-tile; a head-sized one
SHAPES = [(37, 19, 23), (300, 141, 263), (2 * TILE + 5, 134, 868)]


def gamma(n: int) -> float:
    return (n + 1) * U / (1 - (n + 1) * U)


def normal(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def within(got, ref, bound):
    err = np.abs(got.astype(np.float64) - ref)
    bad = ~(err <= bound)
    assert not bad.any(), f"{bad.sum()} of {bad.size} out of tolerance, worst {np.max(err - bound)}"


def check(fmt, got, a, b, n, extra=0.0, post=lambda v: v):
    """got against a @ b (float64) from exact and from `fmt`-rounded operands (module docstring)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ar, br = ROUND[fmt](a).astype(np.float64), ROUND[fmt](b).astype(np.float64)
    g = gamma(n + 1)
    within(got, post(a64 @ b64 + extra), (product_error(fmt) + g) * (np.abs(a64) @ np.abs(b64) + np.abs(extra)))
    within(got, post(ar @ br + extra), g * (np.abs(ar) @ np.abs(br) + np.abs(extra)))


@gpu_only
@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("relu", [True, False], ids=["relu", "identity"])
def test_forward(stream, stager, rng, config, shape, relu):
    fmt = TENSOR[config].config.precision
    b_, k, n = shape
    x, w, b = normal(rng, b_, k), normal(rng, k, n), normal(rng, n)
    y = stager.upload_new(np.full((b_, n), np.nan, np.float32))
    linear_forward(*(stager.upload_new(a) for a in (x, w, b)), y, relu=relu, stream=stream,
                   config=config)
    got = stager.download(y)
    check(fmt, got, x, w, k, extra=b.astype(np.float64), post=(lambda v: np.maximum(v, 0)) if relu else (lambda v: v))
    assert (got < 0).any() != relu


@gpu_only
@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("masked", [True, False], ids=["masked", "unmasked"])
def test_backward_input(stream, stager, rng, config, shape, masked):
    fmt = TENSOR[config].config.precision
    b_, k, n = shape
    dy, w = normal(rng, b_, n), normal(rng, k, n)
    act = normal(rng, b_, k)
    act[rng.random(act.shape) < 0.2] = 0.0
    dx = stager.upload_new(np.full((b_, k), np.nan, np.float32))
    linear_backward_input(stager.upload_new(dy), stager.upload_new(w), dx, act=stager.upload_new(act) if masked
                          else None, stream=stream, config=config)
    mask = (act > 0) if masked else np.ones_like(act, bool)
    check(fmt, stager.download(dx), dy, w.T, n, post=lambda v: v * mask)


@gpu_only
@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_weight_grad_in_splits(stream, stager, rng, config, shape):
    fmt = TENSOR[config].config.precision
    b_, k, n = shape
    x, dy = normal(rng, b_, k), normal(rng, b_, n)
    grads = LinearWeightGrad(b_, k, n, config=config, chunk=24)  # splits of 24 rows: reductions end mid-tile
    assert grads.gemm.config.name == config and grads.splits == -(-b_ // 24)
    dw = stager.upload_new(np.full((k, n), np.nan, np.float32))
    db = stager.upload_new(np.full(n, np.nan, np.float32))
    grads(stager.upload_new(x), stager.upload_new(dy), dw, db, stream=stream)
    check(fmt, stager.download(dw), x.T, dy, b_ + grads.splits)
    dy64 = dy.astype(np.float64)
    within(stager.download(db), dy64.sum(axis=0), gamma(b_ + grads.splits) * np.abs(dy64).sum(axis=0))


@gpu_only
@pytest.mark.parametrize("fmt", FORMATS)
def test_live_head_columns_alone(stream, stager, rng, fmt):
    """The default network's head (K = 134, N = 868) with its live direction columns (cols = 255, 5 streams of 51):
    the forward launches the column tiles holding them, the same bits there as the whole launch and y untouched past
    them; the
    weight gradient writes the 255 columns of dw and db alone, the same bits."""
    b_, k, n, cols = 2 * TILE + 5, 134, 868, 255
    x, w, b, dy = normal(rng, b_, k), normal(rng, k, n), normal(rng, n), normal(rng, b_, n)
    dev = [stager.upload_new(a) for a in (x, w, b)]
    outs = []
    for c in (None, cols):
        y = stager.upload_new(np.full((b_, n), np.nan, np.float32))
        linear_forward(*dev, y, relu=False, stream=stream, precision=fmt, cols=c)
        grads = LinearWeightGrad(b_, k, n, precision=fmt, cols=c)
        dw = stager.upload_new(np.full((k, n), np.nan, np.float32))
        db = stager.upload_new(np.full(n, np.nan, np.float32))
        grads(dev[0], stager.upload_new(dy), dw, db, stream=stream)
        outs.append([stager.download(a) for a in (y, dw, db)])
    (y0, dw0, db0), (y1, dw1, db1) = outs
    tile = TENSOR[pick_tensor(fmt, b_, cols)].config.tile
    live = -(-cols // tile) * tile
    np.testing.assert_array_equal(y1[:, :live].view(np.uint32), y0[:, :live].view(np.uint32))
    np.testing.assert_array_equal(dw1[:, :cols].view(np.uint32), dw0[:, :cols].view(np.uint32))
    np.testing.assert_array_equal(db1[:cols].view(np.uint32), db0[:cols].view(np.uint32))
    assert np.isnan(y1[:, live:]).all() and np.isnan(dw1[:, cols:]).all() and np.isnan(db1[cols:]).all()


@gpu_only
@pytest.mark.parametrize("fmt", FORMATS)
def test_backward_input_over_the_live_head_columns(stream, stager, rng, fmt):
    """The head's input gradient (a trunk's last layer, or an encoder's columns) with cols = 255 of 868: the
    product of those columns alone, whatever the others hold (random here, so a read would show), and the same bits
    as the whole reduction where dy is 0 past them, as the network promises."""
    b_, k, n, cols = 2 * TILE + 5, 256, 868, 255
    dy, w = normal(rng, b_, n), normal(rng, k, n)
    dev_w = stager.upload_new(w)
    dx = stager.upload_new(np.full((b_, k), np.nan, np.float32))
    linear_backward_input(stager.upload_new(dy), dev_w, dx, stream=stream, precision=fmt, cols=cols)
    got = stager.download(dx)
    check(fmt, got, dy[:, :cols], w[:, :cols].T, cols)
    dy[:, cols:] = 0.0
    whole = stager.upload_new(np.full((b_, k), np.nan, np.float32))
    linear_backward_input(stager.upload_new(dy), dev_w, whole, stream=stream, precision=fmt)
    np.testing.assert_array_equal(got.view(np.uint32), stager.download(whole).view(np.uint32))


@gpu_only
def test_same_bits_twice_and_chosen_by_precision(stream, stager, rng):
    b_, k, n = SHAPES[1]
    x, w, b = normal(rng, b_, k), normal(rng, k, n), normal(rng, n)
    args = [stager.upload_new(a) for a in (x, w, b)]
    outs = {}
    for precision in ("tf32", "bf16", "fp32"):
        runs = []
        for _ in range(2):
            y = stager.upload_new(np.full((b_, n), np.nan, np.float32))
            linear_forward(*args, y, relu=False, stream=stream, precision=precision)
            runs.append(stager.download(y).view(np.uint32))
        np.testing.assert_array_equal(runs[0], runs[1])
        outs[precision] = runs[0]
    for a, b in (("tf32", "fp32"), ("bf16", "fp32"), ("bf16", "tf32")):
        assert (outs[a] != outs[b]).mean() > 0.5, (a, b)  # each precision ran its own kernels


def test_precision_picks_the_kernels(stream):
    """precision 'tf32' or 'bf16' means that format's kernels on the GPU and the exact fp32 ones under the simulator;
    anything else is refused with the options named."""
    for fmt in FORMATS:
        assert LinearWeightGrad(300, 134, 868, precision=fmt).gemm.config.name == fmt  # TILE 128
        assert precision_dense(fmt) == fmt
        assert dense_kind(fmt, "test") == ("strided" if SIMULATOR else fmt)
    assert LinearWeightGrad(300, 134, 868).gemm.config.precision == "fp32"
    assert precision_dense("fp32") == "auto"
    with pytest.raises(ValueError, match="fp32"):
        precision_dense("fp16")
    with pytest.raises(ValueError, match="precision"):
        LinearWeightGrad(8, 4, 4, precision="fp16")


def test_bf16_round_is_nearest_with_ties_to_even(rng):
    """The reference twin of cvt.rn.bf16x2.f32 against a float64 search: the nearer of the two bf16 values around
    each float32 (ties to the even mantissa), on random values and on exact ties."""
    x = (rng.standard_normal(4000) * 10.0 ** rng.uniform(-3, 3, 4000)).astype(np.float32)
    bits = x.view(np.uint32)
    ties = ((bits & np.uint32(0xFFFF0000)) | np.uint32(0x8000)).view(np.float32)  # halfway between two bf16
    x = np.concatenate([x, ties])
    low = (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32).astype(np.float64)  # toward zero
    high = ((x.view(np.uint32) & np.uint32(0xFFFF0000)) + np.uint32(0x10000)).view(np.float32).astype(np.float64)
    d_low, d_high = np.abs(x - low), np.abs(high - x)
    low_even = ((x.view(np.uint32) >> np.uint32(16)) & np.uint32(1)) == 0
    want = np.where(d_low < d_high, low, np.where(d_high < d_low, high, np.where(low_even, low, high)))
    got = ROUND["bf16"](x).astype(np.float64)
    np.testing.assert_array_equal(got, want)
    assert (d_low[-4000:] == d_high[-4000:]).all() and (got[-4000:] != low[-4000:]).any()  # ties, both ways


def _epilogue_kernel(tile: int):
    """A kernel of TILE `tile` whose lanes' accumulators hold src at the mma's (row, column) of them (out_row,
    out_col; 0 outside src), then go through each epilogue: y = src + b with ReLU, dx = src masked by act > 0,
    plain = src."""
    parts = PARTS[tile]
    geom = next(g for g in GEOMETRIES if g.tile == tile)
    acc_n, mt = geom.acc, geom.mt
    out_row, out_col = parts.out_row, parts.out_col  # the GPU compiler types globals' attributes of no module
    epilogue_fwd, epilogue_bwd_in, epilogue_plain = parts.epilogue_fwd, parts.epilogue_bwd_in, parts.epilogue_plain

    @cuda.jit(device=True)
    def fill(src, row0, col0, tid, acc):
        """acc <- src at each accumulator's (row, column), 0 outside src."""
        for i in range(mt):
            for j in range(NT):
                for e in range(4):
                    r = out_row(row0, tid, i) + e // 2 * 8
                    c = out_col(col0, tid, j) + e % 2
                    acc[(i * NT + j) * 4 + e] = src[r, c] if r < src.shape[0] and c < src.shape[1] else float32(0)

    @cuda.jit
    def epilogues(src, b, act, y, dx, plain):
        acc = cuda.local.array(acc_n, float32)
        row0 = uint32(cuda.blockIdx.y) * tile
        col0 = uint32(cuda.blockIdx.x) * tile
        tid = uint32(cuda.threadIdx.x)
        fill(src, row0, col0, tid, acc)  # again before each epilogue, which consumes acc
        epilogue_fwd(y, b, 1, row0, col0, tid, acc)
        fill(src, row0, col0, tid, acc)
        epilogue_bwd_in(dx, act, 1, row0, col0, tid, acc)
        fill(src, row0, col0, tid, acc)
        epilogue_plain(plain, b, 0, row0, col0, tid, acc)

    return epilogues


@pytest.mark.parametrize("tile", [g.tile for g in GEOMETRIES])
def test_epilogues_write_every_accumulator_to_its_element(stream, stager, rng, tile):
    """Every output element of a ragged block grid (TILE + 72 x TILE + 22: 2 x 2 blocks at TILE 128, 3 x 2 at 64,
    partial tiles in both directions) receives the accumulator the mma layout assigns it, through the staging: a
    lane or row mixed up moves an element to another's value (src is random normal, so two elements never agree), an
    element left out stays NaN. Against float64: y within one float32 rounding of src + b (then ReLU); dx and plain
    exact."""
    rows, cols = tile + 72, tile + 22
    src, b, act = normal(rng, rows, cols), normal(rng, cols), normal(rng, rows, cols)
    outs = [stager.upload_new(np.full((rows, cols), np.nan, np.float32)) for _ in range(3)]
    grid = (-(-cols // tile), -(-rows // tile))
    _epilogue_kernel(tile)[grid, THREADS, stream](*(stager.upload_new(a) for a in (src, b, act)), *outs)
    y, dx, plain = (stager.download(o).astype(np.float64) for o in outs)
    ref = np.maximum(src.astype(np.float64) + b, 0.0)
    within(y, ref, np.abs(src.astype(np.float64) + b) * 2.0**-24)
    np.testing.assert_array_equal(dx, np.where(act > 0, src, 0.0))
    np.testing.assert_array_equal(plain, src)


def test_tile_size_follows_the_launched_output():
    """Forward and backward-input: TILE 128 where its blocks give each of an H200's 132 SMs one, else TILE 64: the
    trunk's 8192 x 256 outputs (128 blocks of 128) and the head's live 255 columns take 64, 16384 x 256 takes 128;
    a 16384 x 868 head's output (896 blocks) takes 128, but not an encoder's 64 columns, which it would pad to 128.
    Both give the same bits (test_tiles_give_the_same_bits,
    GPU). The weight gradient keeps TILE 128, whose bits the committed results were trained with."""
    assert pick_tensor("tf32", 8192, 256) == "tf32_64" and pick_tensor("bf16", 8192, 255) == "bf16_64"
    assert pick_tensor("tf32", 16384, 868) == "tf32" and pick_tensor("tf32", 16384, 256) == "tf32"
    assert pick_tensor("tf32", 33 * 128, 4 * 128) == "tf32" and pick_tensor("tf32", 33 * 128 - 1, 4 * 128) == "tf32"
    assert pick_tensor("tf32", 32 * 128, 4 * 128) == "tf32_64"
    assert pick_tensor("tf32", 1 << 19, 64) == "tf32_64"  # TILE 128 would compute twice the output
    assert LinearWeightGrad(8192, 256, 256, precision="tf32").gemm.config.name == "tf32"


@gpu_only
@pytest.mark.parametrize("fmt", FORMATS)
def test_tiles_give_the_same_bits(stream, stager, rng, fmt):
    """The forward and backward-input products at TILE 128 and TILE 64 agree bit for bit (each element's mma
    k-steps run in the same order), so the shape rule never changes a result."""
    b_, k, n = SHAPES[2]
    x, w, b, dy = normal(rng, b_, k), normal(rng, k, n), normal(rng, n), normal(rng, b_, n)
    dev = {name: stager.upload_new(a) for name, a in (("x", x), ("w", w), ("b", b), ("dy", dy))}
    outs = []
    for config in (fmt, f"{fmt}_64"):
        y = stager.upload_new(np.full((b_, n), np.nan, np.float32))
        linear_forward(dev["x"], dev["w"], dev["b"], y, relu=True, stream=stream, config=config)
        dx = stager.upload_new(np.full((b_, k), np.nan, np.float32))
        linear_backward_input(dev["dy"], dev["w"], dx, act=dev["x"], stream=stream, config=config)
        outs.append([stager.download(a).view(np.uint32) for a in (y, dx)])
    for big, small in zip(*outs):
        np.testing.assert_array_equal(big, small)
