"""Elementwise kernels against float64 numpy references on seeded random inputs, every element checked.

Tolerance: exact where a float32 result has one rounding (fill, copy, scale: the product of two float32
values is exact in float64); axpy allows 2 float32 ulps of its larger operand (two roundings, or one
when the GPU fuses the multiply-add).
"""


import numpy as np

from fox_numba.device.elementwise import axpy_f32, copy_u32, fill_f32, fill_u32, scale_f32, scatter_f32
from fox_numba.device.launch import i32, launch_strided
from fox_numba.device.memory import words

N = 1000
PREFIX = 937  # kernels process a prefix; the tail must stay untouched


def normal(rng, n=N):
    return rng.standard_normal(n).astype(np.float32)


def test_fill_f32(stream, stager, rng):
    x0 = normal(rng)
    value = np.float32(rng.standard_normal())
    x = stager.upload_new(x0)
    launch_strided(fill_f32, PREFIX, x, value, i32(PREFIX), stream=stream)
    expected = x0.astype(np.float64)
    expected[:PREFIX] = float(value)
    np.testing.assert_array_equal(stager.download(x), expected.astype(np.float32))


def test_fill_u32_on_the_words_of_a_uint64_array(stream, stager, rng):
    x0 = rng.integers(1, 2**63, N, dtype=np.int64).view(np.uint64)
    x = stager.upload_new(x0)
    w = words(x)
    value = np.uint32(rng.integers(1, 2**32))
    launch_strided(fill_u32, 2 * PREFIX, w, value, i32(2 * PREFIX), stream=stream)
    expected = x0.copy().view(np.uint32)
    expected[: 2 * PREFIX] = value
    np.testing.assert_array_equal(stager.download(x).view(np.uint32), expected)


def test_scale_f32(stream, stager, rng):
    x0 = normal(rng)
    alpha = np.float32(rng.uniform(0.01, 3.0))
    x = stager.upload_new(x0)
    launch_strided(scale_f32, PREFIX, x, alpha, i32(PREFIX), stream=stream)
    expected = x0.astype(np.float64)
    expected[:PREFIX] *= float(alpha)
    np.testing.assert_array_equal(stager.download(x), expected.astype(np.float32))


def test_axpy_f32(stream, stager, rng):
    y0, x0 = normal(rng), normal(rng)
    alpha = np.float32(rng.uniform(-2.0, 2.0))
    y, x = stager.upload_new(y0), stager.upload_new(x0)
    launch_strided(axpy_f32, PREFIX, y, alpha, x, i32(PREFIX), stream=stream)
    expected = y0.astype(np.float64)
    expected[:PREFIX] += float(alpha) * x0[:PREFIX].astype(np.float64)
    got = stager.download(y)
    operands = np.maximum(np.abs(y0), np.abs(alpha * x0))
    assert np.all(np.abs(got - expected) <= 2 * np.spacing(operands).astype(np.float64))
    np.testing.assert_array_equal(got[PREFIX:], y0[PREFIX:])


def test_copy_u32_copies_bit_patterns(stream, stager, rng):
    src0 = rng.integers(0, 2**32, N, dtype=np.uint64).astype(np.uint32)
    dst0 = rng.integers(0, 2**32, N, dtype=np.uint64).astype(np.uint32)
    src, dst = stager.upload_new(src0), stager.upload_new(dst0)
    launch_strided(copy_u32, PREFIX, dst, src, i32(PREFIX), stream=stream)
    expected = dst0.copy()
    expected[:PREFIX] = src0[:PREFIX]
    np.testing.assert_array_equal(stager.download(dst), expected)


def test_scatter_f32(stream, stager, rng):
    dst0 = normal(rng, 131)
    index0 = rng.permutation(131)[:40].astype(np.int32)
    values0 = normal(rng, 40)
    dst, index, values = (stager.upload_new(a) for a in (dst0, index0, values0))
    launch_strided(scatter_f32, 40, dst, index, values, i32(40), stream=stream)
    expected = dst0.astype(np.float64)
    expected[index0] = values0
    np.testing.assert_array_equal(stager.download(dst), expected.astype(np.float32))
