"""Dense-layer kernels against float64 numpy references on seeded random inputs, every element checked.

Tolerance: each output is a chain of n float32 roundings (forward: K fused multiply-adds plus the bias
add; backward-input: N; weight gradient: the rows of one split plus S - 1 split additions, at most B + S),
so |got - ref| <= gamma(n) * (|X| @ |W| + |b|) elementwise, gamma(n) = n*u / (1 - n*u), u = 2^-24
(Higham, Accuracy and Stability of Numerical Algorithms, 3.1); ReLU and the mask are 1-Lipschitz and do
not widen it. The float64 reference is exact to ~2^-53 relative, inside the one extra rounding allowed.
The bound is ~n * 6e-8 of the element's magnitude, while a wrong index, a dropped or doubled term, a
missing bias or mask, or a tile edge handled wrongly moves an element by a whole product term, about
1/n of its magnitude: at these sizes 10^3 to 10^4 times the tolerance, so a broken kernel cannot pass.
Outputs start as NaN, so an element no thread wrote fails too.

Shapes are small for the simulator (~1.3 ms per thread per reduction step, so the reductions are short):
each configuration runs one block tile (where all must give the same bits) and a grid of several block
tiles, the weight gradient in batch splits with a short last split; a GPU-only test runs larger shapes.
The mutations tried while writing these (a dropped column at a tile edge, the mask on >= 0, the last
split left out of the reduction, a double-buffer store into the buffer being read, a missing bias
column) each made at least one of them fail.
"""


import numpy as np
import pytest

from fox_numba.device.graphs import StepGraph
from fox_numba.device.launch import launch_tiles
from fox_numba.device.memory import device_empty
from fox_numba.kernels.gemm import BK, CONFIGS, linear_fwd_64x4
from fox_numba.kernels.nn import (
    LinearWeightGrad,
    linear_backward_input,
    linear_forward,
    pick_config,
    split_rows,
)

U = 2.0**-24  # unit roundoff of float32
SMALL = (37, 19, 23)  # B, K, N: one block tile, reduction ending mid-tile
# (B, K, N) whose output spans several block tiles: 2x2 for 64x4 and for 128x8's forward pass, 2x1 for
# 128x8's others (256 threads a block are slow to simulate). Outputs: y[B,N], dx[B,K], dw[K,N].
MULTI = {
    "64x4": {"forward": (70, 20, 65), "backward_input": (70, 66, 20), "weight_grad": (24, 66, 65)},
    "128x8": {"forward": (130, 9, 131), "backward_input": (130, 20, 9), "weight_grad": (24, 130, 20)},
}


def gamma(n: int) -> float:
    return (n + 1) * U / (1 - (n + 1) * U)  # one rounding more than the chain: the float64 reference


def normal(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def nan_array(stager, *shape):
    return stager.upload_new(np.full(shape, np.nan, np.float32))


def assert_within(got, ref, bound):
    assert got.shape == ref.shape
    err = np.abs(got.astype(np.float64) - ref)
    bad = ~(err <= bound)  # NaN (an element never written) fails
    assert not bad.any(), (
        f"{bad.sum()} elements out of tolerance, worst at {np.unravel_index(np.argmax(err - bound), err.shape)}"
    )


def forward(stager, stream, x, w, b, relu, config):
    y = nan_array(stager, x.shape[0], w.shape[1])
    args = [stager.upload_new(a) for a in (x, w, b)]
    linear_forward(*args, y, relu=relu, stream=stream, config=config)
    return stager.download(y)


def forward_reference(x, w, b, relu):
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    ref = x64 @ w64 + b
    bound = gamma(x.shape[1] + 1) * (np.abs(x64) @ np.abs(w64) + np.abs(b))
    return (np.maximum(ref, 0) if relu else ref), bound


@pytest.mark.parametrize("relu", [True, False], ids=["relu", "identity"])
def test_forward_small_all_configs_same_bits(stream, stager, rng, relu):
    b_, k, n = SMALL
    x, w, b = normal(rng, b_, k), normal(rng, k, n), normal(rng, n)
    ref, bound = forward_reference(x, w, b, relu)
    got = forward(stager, stream, x, w, b, relu, config="64x4")
    assert_within(got, ref, bound)
    assert (got < 0).any() != relu  # the identity path keeps negative outputs, ReLU removes them
    np.testing.assert_array_equal(forward(stager, stream, x, w, b, relu, "128x8").view(np.uint32), got.view(np.uint32))


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_forward_multi_tile(stream, stager, rng, config):
    b_, k, n = MULTI[config]["forward"]
    x, w, b = normal(rng, b_, k), normal(rng, k, n), normal(rng, n)
    ref, bound = forward_reference(x, w, b, relu=True)
    assert_within(forward(stager, stream, x, w, b, True, config), ref, bound)


def activation(rng, *shape):
    """A layer input activation with positive, negative and exactly zero entries (mask = act > 0)."""
    a = normal(rng, *shape)
    a[rng.random(shape) < 0.2] = 0.0
    return a


def backward_input(stager, stream, dy, w, act, config):
    dx = nan_array(stager, dy.shape[0], w.shape[0])
    dev_act = None if act is None else stager.upload_new(act)
    linear_backward_input(stager.upload_new(dy), stager.upload_new(w), dx, act=dev_act, stream=stream, config=config)
    return stager.download(dx)


def backward_input_reference(dy, w, act):
    dy64, w64 = dy.astype(np.float64), w.astype(np.float64)
    ref = dy64 @ w64.T
    bound = gamma(dy.shape[1]) * (np.abs(dy64) @ np.abs(w64).T)
    return (ref if act is None else ref * (act > 0)), bound


def test_backward_input_small_masked_all_configs_same_bits(stream, stager, rng):
    b_, k, n = SMALL
    dy, w, act = normal(rng, b_, n), normal(rng, k, n), activation(rng, b_, k)
    ref, bound = backward_input_reference(dy, w, act)
    got = backward_input(stager, stream, dy, w, act, config="64x4")
    assert_within(got, ref, bound)
    np.testing.assert_array_equal(got[act <= 0].view(np.uint32), 0)  # masked entries are exactly +0
    other = backward_input(stager, stream, dy, w, act, "128x8")
    np.testing.assert_array_equal(other.view(np.uint32), got.view(np.uint32))


def test_backward_input_small_unmasked(stream, stager, rng):
    b_, k, n = SMALL
    dy, w = normal(rng, b_, n), normal(rng, k, n)
    ref, bound = backward_input_reference(dy, w, None)
    assert_within(backward_input(stager, stream, dy, w, None, config="64x4"), ref, bound)


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_backward_input_multi_tile(stream, stager, rng, config):
    b_, k, n = MULTI[config]["backward_input"]
    dy, w, act = normal(rng, b_, n), normal(rng, k, n), activation(rng, b_, k)
    ref, bound = backward_input_reference(dy, w, act)
    assert_within(backward_input(stager, stream, dy, w, act, config), ref, bound)


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_backward_input_over_the_leading_columns_reads_no_other(stream, stager, rng, config):
    """cols=: the reduction over the first `cols` columns of dy and w alone (a head's live columns): the float64
    product of those columns, whatever the rest of dy and w hold (random here, so a read of them would show), and
    the same bits as the whole reduction where the rest of dy is 0, as the caller promises."""
    b_, k, n = MULTI[config]["backward_input"]
    cols = n // 3 + 1
    dy, w, act = normal(rng, b_, n), normal(rng, k, n), activation(rng, b_, k)
    dx = nan_array(stager, b_, k)
    linear_backward_input(stager.upload_new(dy), stager.upload_new(w), dx, act=stager.upload_new(act),
                          stream=stream, config=config, cols=cols)
    ref, bound = backward_input_reference(dy[:, :cols], w[:, :cols], act)
    got = stager.download(dx)
    assert_within(got, ref, bound)
    dy[:, cols:] = 0.0
    whole = backward_input(stager, stream, dy, w, act, config)
    np.testing.assert_array_equal(got.view(np.uint32), whole.view(np.uint32))
    with pytest.raises(ValueError, match="linear_backward_input: cols = 0 must be in"):
        linear_backward_input(stager.upload_new(dy), stager.upload_new(w), dx, stream=stream, cols=0)


def weight_grad(stager, stream, grads, x, dy):
    dw, db = nan_array(stager, x.shape[1], dy.shape[1]), nan_array(stager, dy.shape[1])
    grads(stager.upload_new(x), stager.upload_new(dy), dw, db, stream=stream)
    return stager.download(dw), stager.download(db)


def check_weight_grad(grads, x, dy, dw, db):
    x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
    g = gamma(x.shape[0] + grads.splits)
    assert_within(dw, x64.T @ dy64, g * (np.abs(x64).T @ np.abs(dy64)))
    assert_within(db, dy64.sum(axis=0), g * np.abs(dy64).sum(axis=0))


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_weight_grad_small_one_split(stream, stager, rng, config):
    b_, k, n = SMALL
    x, dy = normal(rng, b_, k), normal(rng, b_, n)
    grads = LinearWeightGrad(b_, k, n, config=config)
    assert grads.splits == 1
    check_weight_grad(grads, x, dy, *weight_grad(stager, stream, grads, x, dy))


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_weight_grad_multi_tile_split_batch(stream, stager, rng, config):
    b_, k, n = MULTI[config]["weight_grad"]
    x, dy = normal(rng, b_, k), normal(rng, b_, n)
    grads = LinearWeightGrad(b_, k, n, config=config, chunk=2 * BK)
    assert (grads.splits, grads.chunk) == (2, 16)  # rows 0-15 and 16-23
    check_weight_grad(grads, x, dy, *weight_grad(stager, stream, grads, x, dy))


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_leading_columns_alone(stream, stager, rng, config):
    """cols (the network's live head columns): the forward launches the column tiles holding the first `cols`
    columns alone, the same bits there as the whole launch and y untouched (NaN) past them; the weight gradient
    writes the first `cols` columns of dw and db alone, the whole launch's bits. Shape (24, 9, 131): two column
    tiles of either configuration, cols = 10 in the first."""
    b_, k, n = 24, 9, 131
    tile, cols = CONFIGS[config].tile, 10
    x, w, b, dy = normal(rng, b_, k), normal(rng, k, n), normal(rng, n), normal(rng, b_, n)
    whole = forward(stager, stream, x, w, b, True, config)
    y = nan_array(stager, b_, n)
    linear_forward(*(stager.upload_new(a) for a in (x, w, b)), y, relu=True, stream=stream, config=config, cols=cols)
    got = stager.download(y)
    np.testing.assert_array_equal(got[:, :tile].view(np.uint32), whole[:, :tile].view(np.uint32))
    assert np.isnan(got[:, tile:]).all()
    full_dw, full_db = weight_grad(stager, stream, LinearWeightGrad(b_, k, n, config=config), x, dy)
    part = LinearWeightGrad(b_, k, n, config=config, cols=cols)
    assert part.grid_tiles[0] == 1
    dw, db = weight_grad(stager, stream, part, x, dy)
    np.testing.assert_array_equal(dw[:, :cols].view(np.uint32), full_dw[:, :cols].view(np.uint32))
    np.testing.assert_array_equal(db[:cols].view(np.uint32), full_db[:cols].view(np.uint32))
    assert np.isnan(dw[:, cols:]).all() and np.isnan(db[cols:]).all()
    with pytest.raises(ValueError, match="cols = 0 must be in 1..131"):
        linear_forward(*(stager.upload_new(a) for a in (x, w, b)), y, relu=True, stream=stream, cols=0)


def test_two_runs_give_identical_bits(stream, stager, rng):
    b_, k, n = SMALL
    x, w, b, dy, act = normal(rng, b_, k), normal(rng, k, n), normal(rng, n), normal(rng, b_, n), activation(rng, b_, k)
    grads = LinearWeightGrad(b_, k, n, chunk=2 * BK)  # 3 splits

    def run():
        y = forward(stager, stream, x, w, b, True, config=None)
        dx = backward_input(stager, stream, dy, w, act, config=None)
        return [a.view(np.uint32) for a in (y, dx, *weight_grad(stager, stream, grads, x, dy))]

    for first, second in zip(run(), run(), strict=True):
        np.testing.assert_array_equal(first, second)


def test_mlp_step_inside_a_step_graph(stream, stager, rng):
    """A ReLU MLP's forward and backward pass as one step body: it allocates nothing (the graph's
    launch-trace check), replays give the same bits, and each layer meets its bound given its inputs."""
    b_, k, h, n = 9, 5, 7, 3
    x0, w1_0, b1_0, w2_0, b2_0, dy0 = (normal(rng, *s) for s in ((b_, k), (k, h), (h,), (h, n), (n,), (b_, n)))
    x, w1, b1, w2, b2, dy = (stager.upload_new(a) for a in (x0, w1_0, b1_0, w2_0, b2_0, dy0))
    h1, out, dh = (device_empty(s, np.float32) for s in ((b_, h), (b_, n), (b_, h)))
    dw1, db1, dw2, db2 = (device_empty(s, np.float32) for s in ((k, h), (h,), (h, n), (n,)))
    g1, g2 = LinearWeightGrad(b_, k, h), LinearWeightGrad(b_, h, n)

    def body(s):
        linear_forward(x, w1, b1, h1, relu=True, stream=s)
        linear_forward(h1, w2, b2, out, relu=False, stream=s)
        g2(h1, dy, dw2, db2, stream=s)
        linear_backward_input(dy, w2, dh, act=h1, stream=s)
        g1(x, dh, dw1, db1, stream=s)

    step = StepGraph("mlp", body, stream, use_graph=True)
    results = []
    for _ in range(2):
        step.replay()
        stream.synchronize()
        results.append([stager.download(a) for a in (h1, out, dh, dw2, db2, dw1, db1)])
    for first, second in zip(*results, strict=True):
        np.testing.assert_array_equal(first.view(np.uint32), second.view(np.uint32))

    a1, y2, d1, dw2_, db2_, dw1_, db1_ = results[0]
    assert_within(a1, *forward_reference(x0, w1_0, b1_0, relu=True))
    assert_within(y2, *forward_reference(a1, w2_0, b2_0, relu=False))
    assert_within(d1, *backward_input_reference(dy0, w2_0, a1))
    check_weight_grad(g2, a1, dy0, dw2_, db2_)
    check_weight_grad(g1, x0, d1, dw1_, db1_)


@pytest.mark.gpu_only("shapes of several hundred: minutes per launch under the simulator")
def test_large_shapes_every_config(stream, stager, rng):
    b_, k, n = 1000, 300, 200
    x, w, b, dy, act = normal(rng, b_, k), normal(rng, k, n), normal(rng, n), normal(rng, b_, n), activation(rng, b_, k)
    y_ref, y_bound = forward_reference(x, w, b, relu=True)
    dx_ref, dx_bound = backward_input_reference(dy, w, act)
    ys, dxs = [], []
    for config in sorted(CONFIGS):
        ys.append(forward(stager, stream, x, w, b, True, config))
        dxs.append(backward_input(stager, stream, dy, w, act, config))
        assert_within(ys[-1], y_ref, y_bound)
        assert_within(dxs[-1], dx_ref, dx_bound)
        grads = LinearWeightGrad(b_, k, n, config=config, chunk=8 * BK)
        check_weight_grad(grads, x, dy, *weight_grad(stager, stream, grads, x, dy))
    np.testing.assert_array_equal(ys[0].view(np.uint32), ys[1].view(np.uint32))
    np.testing.assert_array_equal(dxs[0].view(np.uint32), dxs[1].view(np.uint32))


@pytest.fixture()
def arrays(stager):
    b_, k, n = SMALL
    shapes = {"x": (b_, k), "w": (k, n), "b": (n,), "y": (b_, n), "dy": (b_, n), "dx": (b_, k), "dw": (k, n)}
    return {name: stager.upload_new(np.ones(s, np.float32)) for name, s in shapes.items()}


def test_forward_refuses_mismatched_shapes(stream, arrays):
    a = arrays
    with pytest.raises(ValueError, match=r"linear_forward: shapes x \(37, 19\), w \(23, 19\)"):
        linear_forward(a["x"], a["dw"].reshape(23, 19), a["b"], a["y"], relu=True, stream=stream)
    with pytest.raises(ValueError, match=r"b \(19,\)"):
        linear_forward(a["x"], a["w"], a["dx"][0], a["y"], relu=True, stream=stream)
    with pytest.raises(ValueError, match=r"y \(37, 19\)"):
        linear_forward(a["x"], a["w"], a["b"], a["dx"], relu=True, stream=stream)


def test_backward_input_refuses_mismatched_shapes(stream, arrays):
    a = arrays
    with pytest.raises(ValueError, match=r"linear_backward_input: shapes .* act \(37, 23\)"):
        linear_backward_input(a["dy"], a["w"], a["dx"], act=a["dy"], stream=stream)
    with pytest.raises(ValueError, match=r"dx \(37, 23\)"):
        linear_backward_input(a["dy"], a["w"], a["y"], stream=stream)


def test_weight_grad_refuses_mismatched_shapes(stream, arrays):
    a = arrays
    grads = LinearWeightGrad(37, 19, 23)
    with pytest.raises(ValueError, match=r"LinearWeightGrad: shapes .* dw \(23, 19\)"):
        grads(a["x"], a["dy"], a["dw"].reshape(23, 19), a["b"], stream=stream)
    with pytest.raises(ValueError, match=r"\(B, K, N\) = \(36, 19, 23\)"):
        LinearWeightGrad(36, 19, 23)(a["x"], a["dy"], a["dw"], a["b"], stream=stream)
    with pytest.raises(ValueError, match="multiple of 8"):
        LinearWeightGrad(37, 19, 23, chunk=12)


def test_wrappers_refuse_host_float64_and_strided_arrays(stream, stager, arrays):
    a = arrays
    with pytest.raises(TypeError, match="x is a ndarray, not a device array"):
        linear_forward(np.ones((37, 19), np.float32), a["w"], a["b"], a["y"], relu=True, stream=stream)
    with pytest.raises(ValueError, match="w must be a C-contiguous float32 array, got float64"):
        linear_forward(a["x"], stager.upload_new(np.ones((19, 23))), a["b"], a["y"], relu=True, stream=stream)
    wide = stager.upload_new(np.ones((37, 40), np.float32))
    with pytest.raises(ValueError, match=r"x must be a C-contiguous float32 array, got .*\(not C-contiguous\)"):
        linear_forward(wide[:, :19], a["w"], a["b"], a["y"], relu=True, stream=stream)


def test_launch_tiles_refuses_empty_and_oversized_grids(stream, arrays):
    a = arrays
    with pytest.raises(ValueError, match="nothing to launch"):
        launch_tiles(linear_fwd_64x4, (0, 1), 256, a["x"], a["w"], a["b"], a["y"], np.int32(0), stream=stream)
    with pytest.raises(ValueError, match="exceed CUDA's 65535 blocks"):
        launch_tiles(linear_fwd_64x4, (1, 65536), 256, a["x"], a["w"], a["b"], a["y"], np.int32(0), stream=stream)


def test_config_and_split_choices():
    assert pick_config(8192, 512, 512) == "128x8"  # 256 blocks of 128, long reductions
    assert pick_config(8192, 256, 256) == "128x8"  # 128 blocks: most SMs busy
    assert pick_config(8192, 256, 64) == "64x4"  # reductions too short for 128x8's prologue and epilogue
    assert pick_config(1024, 512, 512) == "64x4"  # 32 blocks of 128 would leave most SMs idle
    assert pick_config(8192, 64, 256) == "64x4"  # a 128 tile would pad the output twice over
    assert pick_config(256, 256, 128, splits=64) == "128x8"  # the weight gradient's splits fill the GPU
    assert LinearWeightGrad(1024, 256, 256).gemm.config.name == "64x4"  # 4 tiles x 8 splits of 128 rows
    for batch, tiles, config in [(8192, 16, "128x8"), (8192, 4, "64x4"), (1000, 1, "128x8"), (37, 200, "64x4")]:
        splits, chunk = split_rows(batch, tiles, CONFIGS[config])
        assert chunk % BK == 0 and (splits - 1) * chunk < batch <= splits * chunk
    assert split_rows(8192, 16, CONFIGS["128x8"]) == (16, 512)  # 256 blocks: one wave of 2 per SM on 132 SMs
