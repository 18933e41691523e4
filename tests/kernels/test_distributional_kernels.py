"""C51 kernels against float64 numpy references on seeded random inputs, every output element checked.

Tolerances follow from float32 rounding (eps = 2**-24 per operation, expf within 2 ulps):
- expected_q: S and TZ each gather Z terms, and each term passes through at most Z rescalings, so E[Q]
  is within 4 (Z + 2) eps max|z| and the entropy within 4 (Z + 2) eps (1 + max |x - M|). The variance
  sum_j w_j (z_j - q)**2 / S has nonnegative terms, each within a few eps of its value, so within
  4 (Z + 2) eps Var; rounding z_j and z_j - q (within 3 eps max|z| each) adds at most 6 eps max|z| sqrt(Var)
  (Cauchy-Schwarz), and the error dq of q only dq**2 (sum_j p_j (z_j - q) = 0). Utilisation counts atoms with w_j > 1e-3 S: exact except for atoms
  whose float64 probability is within 4 (Z + 2) eps (relative) of 1e-3, which may fall either way.
- c51_project: the atom position b_j (<= Z - 1) carries a few roundings of its size, the weights
  1 - |b_j - k| inherit them, and m sums Z products: within 8 Z eps per atom; mass within 8 Z eps.
- c51_loss: Z-term sums of terms bounded by (M - x) and log S: loss within 4 (Z + 2) eps (1 + max|M - x|
  + log S); gradients within 4 (Z + 2) eps weight.
"""


import numpy as np
import pytest
from reference import atoms64, loss64, project64, random_support, softmax64, variance64

from fox_numba.device.memory import device_empty
from fox_numba.device.runtime import SIMULATOR
from fox_numba.kernels.distributional import UTIL_THRESHOLD, c51_loss, c51_project, expected_q

EPS = 2.0**-24

pytestmark = pytest.mark.usefixtures("long_switch_interval")


@pytest.mark.parametrize("n_atoms", [21, 51])
def test_expected_q_and_entropy_match_float64(stream, stager, rng, n_atoms):
    """B = 64 samples x 13 heads. Logits: standard normal x 3, and in a quarter of the rows sorted
    ascending so the running max rises at every atom (every rescaling path runs)."""
    b, a, z = 64, 13, n_atoms
    logits = (3 * rng.standard_normal((b, a, z))).astype(np.float32)
    logits[: b // 4] = np.sort(logits[: b // 4], axis=-1)
    support = random_support(rng, (b, a), z)
    q, entropy = device_empty((b, a), np.float32), device_empty((b, a), np.float32)
    expected_q(stager.upload_new(logits), stager.upload_new(support), q, entropy, stream=stream)

    p, atoms = softmax64(logits), atoms64(support, z)
    q_ref = (p * atoms).sum(axis=-1)
    h_ref = -(p * np.log(p)).sum(axis=-1)
    q_tol = 4 * (z + 2) * EPS * np.abs(atoms).max(axis=-1)
    spread = (logits.max(axis=-1) - logits.min(axis=-1)).astype(np.float64)
    h_tol = 4 * (z + 2) * EPS * (1 + spread)
    assert np.all(np.abs(stager.download(q) - q_ref) <= q_tol)
    assert np.all(np.abs(stager.download(entropy) - h_ref) <= h_tol)


def expected_q_inputs(rng, b, a, z):
    """Logits: standard normal x 3 (probabilities from ~1e-6 to ~1, so atom utilisation varies), and in a
    quarter of the rows sorted ascending so the running max rises at every atom; random supports."""
    logits = (3 * rng.standard_normal((b, a, z))).astype(np.float32)
    logits[: b // 4] = np.sort(logits[: b // 4], axis=-1)
    return logits, random_support(rng, (b, a), z)


@pytest.mark.parametrize("n_atoms", [21, 51])
def test_expected_q_variance_and_utilisation_match_float64(stream, stager, rng, n_atoms):
    """B = 64 samples x 13 heads: variance within the bound of the module docstring of the float64
    sum p (z - E[Q])**2, utilisation = the float64 fraction of atoms with p > 1e-3 (atoms within rounding of
    the threshold may count either way; fewer than 1% of the heads have one), and q and entropy with the
    same bits as `expected_q` without the optional outputs. Each optional output alone leaves the other
    array untouched."""
    b, a, z = 64, 13, n_atoms
    logits, support = expected_q_inputs(rng, b, a, z)
    args = (stager.upload_new(logits), stager.upload_new(support))
    q0, h0 = device_empty((b, a), np.float32), device_empty((b, a), np.float32)
    expected_q(*args, q0, h0, stream=stream)
    q, h, var, util = (device_empty((b, a), np.float32) for _ in range(4))
    expected_q(*args, q, h, stream=stream, variance=var, utilisation=util)
    np.testing.assert_array_equal(stager.download(q), stager.download(q0))
    np.testing.assert_array_equal(stager.download(h), stager.download(h0))

    eps = 2.0**-24
    atoms = atoms64(support, z)
    var_ref = variance64(logits, support)
    z_max = np.abs(atoms).max(axis=-1)
    var_tol = 4 * (z + 2) * eps * var_ref + 6 * eps * z_max * np.sqrt(var_ref) + (4 * (z + 2) * eps * z_max) ** 2
    got_var = stager.download(var)
    assert np.all(np.abs(got_var - var_ref) <= var_tol)
    assert var_ref.min() < 1e-3 < var_ref.max()  # narrow and wide distributions both present
    p32, z32 = softmax64(logits).astype(np.float32), atoms.astype(np.float32)
    mean32 = (p32 * z32).sum(axis=-1, dtype=np.float32)
    naive = (p32 * z32 * z32).sum(axis=-1, dtype=np.float32) - mean32 * mean32  # E[Z**2] - E[Z]**2 in float32
    assert np.any(np.abs(naive - var_ref) > var_tol)  # cancels below this tolerance: hence the second pass

    p = softmax64(logits)
    band = 4 * (z + 2) * eps * float(UTIL_THRESHOLD)
    lo = (p > float(UTIL_THRESHOLD) + band).sum(axis=-1)
    hi = (p > float(UTIL_THRESHOLD) - band).sum(axis=-1)
    assert np.mean(lo != hi) < 0.01
    got_util = stager.download(util)
    used = np.rint(got_util * z)
    np.testing.assert_array_equal(got_util, used.astype(np.float32) / np.float32(z))  # a count over Z
    assert np.all((lo <= used) & (used <= hi))
    assert len(np.unique(lo)) > z // 3  # utilisation spreads over many values

    sentinel = np.full((b, a), np.nan, np.float32)
    only_var, only_util = stager.upload_new(sentinel), stager.upload_new(sentinel)
    expected_q(*args, q, h, stream=stream, variance=only_var)
    np.testing.assert_array_equal(stager.download(only_var), got_var)
    expected_q(*args, q, h, stream=stream, utilisation=only_util)
    np.testing.assert_array_equal(stager.download(only_util), got_util)
    np.testing.assert_array_equal(stager.download(q), stager.download(q0))


def test_c51_project_worked_example_from_the_docstring(stream, stager):
    """The three rows of `c51_project`'s docstring, asserted exactly (short binary fractions)."""
    p_next = np.array(
        [[0.25, 0.25, 0.25, 0.125, 0.125], [0.5, 0.25, 0.125, 0.0625, 0.0625], [0.125, 0.25, 0.25, 0.25, 0.125]],
        np.float32,
    )
    rewards = np.array([0.5, 0.25, -0.75], np.float32)
    discounts = np.array([0.5, 0.5, 0.0], np.float32)
    support_next = np.array([[-2, 2, 1], [0, 4, 1], [-2, 2, 1]], np.float32)
    support_proj = np.array([[-2, 2, 1], [-1, 1, 0.5], [-2, 2, 1]], np.float32)
    expected = np.array(
        [[0, 0.125, 0.5, 0.3125, 0.0625], [0, 0, 0.25, 0.375, 0.375], [0, 0.75, 0.25, 0, 0]], np.float32
    )
    m = device_empty((3, 5), np.float32)
    args = (p_next, rewards, discounts, support_next, support_proj)
    c51_project(*(stager.upload_new(x) for x in args), m, stream=stream)
    np.testing.assert_array_equal(stager.download(m), expected)
    doc = c51_project.__doc__
    for line in ("= [0, 0.125, 0.5, 0.3125, 0.0625]", "= [0, 0, 0.25, 0.375, 0.375]", "m = [0, 0.75, 0.25, 0, 0]"):
        assert line in doc
    np.testing.assert_array_equal(project64(*args), expected)


def random_projection_inputs(rng, rows, z):
    """Target probabilities, rewards (a fifth far outside the support, so clipping runs), discounts
    (a fifth terminal) and per-row supports for both sides."""
    p_next = softmax64(2 * rng.standard_normal((rows, z))).astype(np.float32)
    rewards = rng.normal(0, 0.5, rows).astype(np.float32)
    rewards[::5] *= 6
    discounts = rng.uniform(0.5, 0.99, rows).astype(np.float32)
    discounts[1::5] = 0
    discounts[::10] = 0  # terminal with a reward beyond the support: all mass on an end atom
    return p_next, rewards, discounts, random_support(rng, rows, z), random_support(rng, rows, z)


def test_c51_project_matches_the_float64_scatter_reference(stream, stager, rng):
    """R = 40 rows of 51 atoms (2040 threads) against the classic floor/ceil scatter form in float64."""
    rows, z = 40, 51
    inputs = random_projection_inputs(rng, rows, z)
    m = device_empty((rows, z), np.float32)
    c51_project(*(stager.upload_new(x) for x in inputs), m, stream=stream)
    got = stager.download(m)
    np.testing.assert_array_less(np.abs(got - project64(*inputs)), 8 * z * EPS)
    ends = got[(np.abs(inputs[1]) > 1.5) & (inputs[2] == 0)][:, [0, -1]]
    assert len(ends) >= 2 and np.all(ends.max(axis=1) > 0.99)


def test_c51_project_marks_rows_with_a_non_finite_input_nan(stream, stager, rng):
    """Rows with a NaN reward, an infinite discount or a NaN support get NaN in every atom (the learner's guard
    then skips the step); every other row equals the float64 reference as above."""
    rows, z = 12, 11
    p, rewards, discounts, sup_next, sup_proj = random_projection_inputs(rng, rows, z)
    rewards[2], discounts[5], sup_next[7, 0], sup_proj[9, 2] = np.nan, np.inf, np.nan, np.nan
    m = device_empty((rows, z), np.float32)
    c51_project(*(stager.upload_new(x) for x in (p, rewards, discounts, sup_next, sup_proj)), m, stream=stream)
    got = stager.download(m)
    bad = [2, 5, 7, 9]
    assert np.isnan(got[bad]).all()
    good = [i for i in range(rows) if i not in bad]
    want = project64(p[good], rewards[good], discounts[good], sup_next[good], sup_proj[good])
    np.testing.assert_array_less(np.abs(got[good] - want), 8 * z * EPS)


def test_c51_project_conserves_mass(stream, stager, rng):
    """On 96 random rows of 21 atoms, sum_k m = sum_j p_next within 8 Z eps, and m >= 0."""
    rows, z = 96, 21
    inputs = random_projection_inputs(rng, rows, z)
    m = device_empty((rows, z), np.float32)
    c51_project(*(stager.upload_new(x) for x in inputs), m, stream=stream)
    got = stager.download(m).astype(np.float64)
    assert np.all(got >= 0)
    np.testing.assert_array_less(np.abs(got.sum(axis=1) - inputs[0].astype(np.float64).sum(axis=1)), 8 * z * EPS)


def project_gather32(p_next, rewards, discounts, support_next, support_proj):
    """The projection as the former kernel computed it, one output atom at a time gathering over all sources
    (m_k = sum_j p_j * (1 - |b_j - k|) over positive weights, j ascending), every operation rounded to float32
    as the simulator rounds it."""
    f32 = np.float32
    rows, z = p_next.shape
    k = np.arange(z, dtype=f32)
    inv_dz = f32(1.0) / support_proj[:, 2]
    acc = np.zeros((rows, z), f32)
    for j in range(z):
        tz = rewards + discounts * (support_next[:, 0] + f32(j) * support_next[:, 2])
        b = np.minimum(np.maximum((tz - support_proj[:, 0]) * inv_dz, f32(0.0)), f32(z - 1))
        w = f32(1.0) - np.abs(b[:, None] - k)
        acc = np.where(w > 0, acc + p_next[:, j : j + 1] * w, acc)
    return acc


def test_c51_project_equals_the_gather_over_all_sources(stream, stager, rng):
    """The per-row scatter adds the same terms in the same order as a gather over all Z sources per output atom,
    so on 60 random rows of 21 atoms its output has the gather's bits (emulated in float32 numpy; on a GPU,
    which fuses multiply-adds that numpy rounds twice, within the 8 Z eps of the float64 test)."""
    rows, z = 60, 21
    inputs = random_projection_inputs(rng, rows, z)
    m = device_empty((rows, z), np.float32)
    c51_project(*(stager.upload_new(x) for x in inputs), m, stream=stream)
    got, gathered = stager.download(m), project_gather32(*inputs)
    if SIMULATOR:
        np.testing.assert_array_equal(got, gathered)
    else:
        np.testing.assert_array_less(np.abs(got - gathered), 8 * z * EPS)


def test_c51_project_walks_rows_whose_targets_fall_with_the_atom_index(stream, stager, rng):
    """Rows whose target positions b_j decrease in j (a negative discount, or a negative atom spacing of the
    next-state support; neither occurs in training) are walked from the last source atom down, and still
    match the float64 scatter reference and conserve mass."""
    rows, z = 24, 21
    p_next, rewards, discounts, support_next, support_proj = random_projection_inputs(rng, rows, z)
    discounts[: rows // 2] = -rng.uniform(0.5, 0.99, rows // 2).astype(np.float32)
    support_next[rows // 2 :: 2, 2] *= -1  # atoms v_min, v_min - dz, ...
    inputs = (p_next, rewards, discounts, support_next, support_proj)
    m = device_empty((rows, z), np.float32)
    c51_project(*(stager.upload_new(x) for x in inputs), m, stream=stream)
    got = stager.download(m)
    np.testing.assert_array_less(np.abs(got - project64(*inputs)), 8 * z * EPS)
    np.testing.assert_array_less(np.abs(got.astype(np.float64).sum(axis=1) - p_next.sum(axis=1)), 8 * z * EPS)


def test_c51_loss_gradient_keeps_the_target_mass(stream, stager, rng):
    """Targets whose rows sum to 0.3 .. 1.7 (a projection's rows sum to sum(p_next), which rounding and truncated
    targets move away from 1): dlogits = weight * (sum(m) softmax - m) within tolerance, which the gradient
    of a normalised target, weight * (softmax - m), misses by far more; the loss is -sum m log softmax."""
    rows, z = 48, 21
    logits = (2 * rng.standard_normal((rows, z))).astype(np.float32)
    mass = rng.uniform(0.3, 1.7, rows)
    mass[np.abs(mass - 1) < 0.2] += 0.4  # every row at least 0.2 away from a normalised target
    target = (softmax64(rng.standard_normal((rows, z))) * mass[:, None]).astype(np.float32)
    weights = (rng.uniform(0.2, 2.0, rows) / rows).astype(np.float32)
    loss, dlogits = device_empty(rows, np.float32), device_empty((rows, z), np.float32)
    c51_loss(*(stager.upload_new(x) for x in (logits, target, weights)), loss, dlogits, stream=stream)

    w64, t64, p64 = weights.astype(np.float64)[:, None], target.astype(np.float64), softmax64(logits)
    grad_ref = w64 * (t64.sum(axis=1, keepdims=True) * p64 - t64)
    grad_tol = 4 * (z + 2) * EPS * w64
    got = stager.download(dlogits)
    assert np.all(np.abs(got - grad_ref) <= grad_tol)
    dropped = w64 * (p64 - t64)  # the planted bug: sum(m) left out
    assert np.all(np.abs(dropped - grad_ref).max(axis=1) > 100 * grad_tol[:, 0])
    np.testing.assert_allclose(got.astype(np.float64).sum(axis=1), 0.0, atol=z * grad_tol[:, 0].max())
    x = logits.astype(np.float64)
    loss_tol = 4 * (z + 2) * EPS * mass.max() * (1 + x.max(axis=1) - x.min(axis=1) + np.log(z))
    assert np.all(np.abs(stager.download(loss) - loss64(logits, target)) <= loss_tol)


def test_c51_loss_and_gradient_match_float64_and_finite_differences(stream, stager, rng):
    """R = 64 rows of 51 atoms: loss against float64 cross-entropy; dlogits against the analytic float64
    weight * (sum(m) softmax - m), which central finite differences of the float64 loss confirm (to 1e-8)."""
    rows, z = 64, 51
    logits = (2 * rng.standard_normal((rows, z))).astype(np.float32)
    target = softmax64(rng.standard_normal((rows, z))).astype(np.float32)
    weights = (rng.uniform(0.2, 2.0, rows) / rows).astype(np.float32)
    loss, dlogits = device_empty(rows, np.float32), device_empty((rows, z), np.float32)
    c51_loss(*(stager.upload_new(x) for x in (logits, target, weights)), loss, dlogits, stream=stream)

    w64, t64 = weights.astype(np.float64)[:, None], target.astype(np.float64)
    grad_ref = w64 * (t64.sum(axis=1, keepdims=True) * softmax64(logits) - t64)
    h = 1e-6
    fd = np.empty((rows, z))
    for k in range(z):
        step = np.zeros(z)
        step[k] = h
        fd[:, k] = (loss64(logits + step, target) - loss64(logits - step, target)) / (2 * h)
    np.testing.assert_allclose(w64 * fd, grad_ref, rtol=0, atol=1e-8)

    x = logits.astype(np.float64)
    spread = x.max(axis=1) - x.min(axis=1)
    loss_tol = 4 * (z + 2) * EPS * (1 + spread + np.log(z))
    assert np.all(np.abs(stager.download(loss) - loss64(logits, target)) <= loss_tol)
    assert np.all(np.abs(stager.download(dlogits) - grad_ref) <= 4 * (z + 2) * EPS * w64)


def test_wrappers_reject_bad_shapes(stream, stager):
    b, a, z = 2, 13, 5
    logits = stager.upload_new(np.ones((b, a, z), np.float32))
    support = stager.upload_new(np.ones((b, a, 3), np.float32))
    q, entropy = device_empty((b, a), np.float32), device_empty((b, a), np.float32)
    with pytest.raises(ValueError, match=r"support must be a C-contiguous float32 array \[B, A, 3\] = \(2, 13, 3\)"):
        expected_q(logits, stager.upload_new(np.ones((b, a, 2), np.float32)), q, entropy, stream=stream)
    with pytest.raises(ValueError, match=r"q must be .* got float64\(2, 13\)"):
        expected_q(logits, support, device_empty((b, a), np.float64), entropy, stream=stream)
    with pytest.raises(ValueError, match="at least 2 atoms"):
        expected_q(stager.upload_new(np.ones((b, a, 1), np.float32)), support, q, entropy, stream=stream)
    with pytest.raises(ValueError, match=r"entropy must be .* \(not C-contiguous\)"):
        expected_q(logits, support, q, device_empty((b, a + 1), np.float32)[:, :a], stream=stream)

    rows = stager.upload_new(np.ones((b, z), np.float32))
    vec, sup = stager.upload_new(np.ones(b, np.float32)), stager.upload_new(np.ones((b, 3), np.float32))
    with pytest.raises(ValueError, match=r"discounts must be .* \[R\] = \(2,\)"):
        c51_project(rows, vec, stager.upload_new(np.ones(b + 1, np.float32)), sup, sup, rows, stream=stream)
    with pytest.raises(ValueError, match=r"m must be .* \[R, Z\] = \(2, 5\)"):
        c51_project(rows, vec, vec, sup, sup, device_empty((b, z + 1), np.float32), stream=stream)
    with pytest.raises(ValueError, match=r"logits must be a float32 array \[R, Z\]"):
        c51_loss(logits, rows, vec, vec, rows, stream=stream)
    with pytest.raises(ValueError, match=r"weights must be .* \[R\] = \(2,\)"):
        c51_loss(rows, rows, sup, vec, rows, stream=stream)
