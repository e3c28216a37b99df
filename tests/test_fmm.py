"""The whole FMM against the float64 direct sum, and its structure."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import DISTRIBUTIONS, charges, points, radial_reference, reference, rel

import jfmm
from jfmm import configure, kernels, passes
from jfmm.models import laplace3d as laplace3d_model
from jfmm.configure import Config
from jfmm.ops import laplace3d
from jfmm.tree import build as build_tree, lists


@pytest.mark.parametrize("kind", DISTRIBUTIONS)
@pytest.mark.parametrize("dtype,eps,leaf", [(np.float64, 1e-7, 12),
                                            (np.float32, 1e-5, 64), (np.float32, 1e-3, 12)])
def test_accuracy_vs_direct(kind, dtype, eps, leaf, rng):
    n = 2000
    x, q = points(kind, n, rng), charges(n, rng)
    phi, grad = jfmm.fmm(jnp.asarray(x, dtype), jnp.asarray(q, dtype), eps=eps,
                         gradient=True, leaf_size=leaf)
    assert phi.dtype == dtype and grad.dtype == dtype
    ref, gref = reference(x, q, dtype=dtype)
    assert rel(phi, ref) <= eps, rel(phi, ref)
    assert rel(grad, gref) <= eps, rel(grad, gref)


@pytest.mark.parametrize("kind,dtype,eps,gradient", [("cluster", np.float64, 1e-6, False),
                                                     ("sphere", np.float64, 1e-6, False),
                                                     ("cube", np.float32, 1e-4, True)])
def test_orders_spend_what_eps_allows(kind, dtype, eps, gradient, rng):
    """The order an eager call chooses meets eps (phi's, and grad's where
    asked) for each of two charge draws and spends no more than that: the
    worst error is above eps / 5, or one order less errs above eps / 10,
    or the order is the family's lowest. Crowded points (clusters, a
    sphere's surface) take lower orders than a plan for any points. (A
    sphere with its gradient is not tight: grad's own, smaller share is
    not weighed; docs/BENCHMARKS.md, "Calibration". Nor are clusters:
    their far field is a few outlier pairs, whose error the factor's
    floor `laplace3d.FAR_FLOOR` bounds instead of weighing.)"""
    n, draws = 8000, 2
    x, q = points(kind, n, rng).astype(dtype), charges(n, rng, draws).astype(dtype)
    ref, gref = reference(x, q, dtype=dtype)
    any_points = jfmm.plan(x, eps=eps, gradient=gradient).config
    config = configure.on_uniform(any_points, kernels.Laplace3D(), jnp.asarray(x), None)
    assert config.tree == "uniform" and config.depth >= 2
    if kind == "cluster":
        assert config.order < any_points.order

    def error(out):
        phi, grad = out if gradient else (out, None)
        return max(max(rel(phi[:, c], ref[:, c]),
                       rel(grad[:, c], gref[:, c]) if gradient else 0) for c in range(draws))

    err = error(jfmm.fmm(x, q, eps=eps, gradient=gradient))
    assert err <= eps, (config.order, err)
    if kind != "cluster" and config.order > laplace3d_model.ORDERS[0] and err <= eps / 5:
        leaf = -(-n // 8 ** config.depth)
        below = error(jfmm.fmm(x, q, eps=eps, gradient=gradient, order=config.order - 1,
                               leaf_size=leaf, tree="uniform"))
        assert below > eps / 10, (config.order, err, below)


def test_crowded_far_field_of_a_few_pairs(rng):
    """Clustered sources whose far field is a handful of outliers, on cube
    targets, and the sum the other way, within eps: the points and
    weights of a draw found by CI (the far share weighed the error 7.6x
    too low there: 1.07e-6 at eps 1e-6), then a fresh draw."""
    found = np.random.default_rng(3139527716879317615017345086651815462)
    for gen in (found, rng):
        x, y = points("cube", 1201, gen), points("cluster", 803, gen)
        qy, qx = gen.standard_normal(803), charges(1201, gen)
        assert rel(jfmm.fmm(y, qy, x, eps=1e-6, leaf_size=16), reference(y, qy, x)[0]) < 1e-6
        assert rel(jfmm.fmm(x, qx, y, eps=1e-6, leaf_size=16), reference(x, qx, y)[0]) < 1e-6


@pytest.mark.optimized                   # p = 36: 12 s, not 25 s, optimized
def test_float64_at_its_floor(rng):
    """float64 at the smallest eps jfmm.fmm states for 3D Laplace (8.5e-11,
    p = 36, the order rule's worst case; a call builds 2-4 GB of dense M2L
    operators on the CPU, so there is one) on the uniform cube: the points
    of a draw found by CI, where a source-target pair near facing box
    corners converges at 0.69x per order (p = 30 gave 3.9e-10 at eps
    1e-10), with fresh charges. The rule must cover such tails, not just
    the typical error."""
    x = points("cube", 3000, np.random.default_rng(301993070094320508013737250768825878688))
    q = charges(3000, rng)
    phi, grad = jfmm.fmm(x, q, eps=8.5e-11, gradient=True, leaf_size=64)
    ref, gref = reference(x, q)
    assert phi.dtype == np.float64
    assert rel(phi, ref) <= 8.5e-11 and rel(grad, gref) <= 8.5e-10


@pytest.mark.parametrize("kind", DISTRIBUTIONS)
def test_targets_differ_from_sources(kind, rng):
    x, q = points(kind, 1500, rng), charges(1500, rng)
    y = points("cube", 700, rng) * 1.5 - 0.25  # partly outside the sources' box
    phi, grad = jfmm.fmm(x, q, y, eps=1e-6, gradient=True, leaf_size=16)
    ref, gref = reference(x, q, y)
    assert phi.shape == (700,) and grad.shape == (700, 3)
    assert rel(phi, ref) <= 1e-6 and rel(grad, gref) <= 1e-6, (rel(phi, ref), rel(grad, gref))


@pytest.mark.parametrize("n", [1, 2, 7])
def test_tiny_n(n, rng):
    """Every pair to rounding: each target's error within 1e-12 of the sum
    of its terms' magnitudes (mixed-sign terms may cancel far below it)."""
    x, q = rng.random((n, 3)), charges(n, rng)
    phi, grad = jfmm.fmm(x, q, eps=1e-8, gradient=True)
    ref, gref = reference(x, q)
    r = np.linalg.norm(x[:, None] - x[None], axis=-1)
    inv = np.divide(1.0, r, out=np.zeros_like(r), where=r > 0)
    assert np.all(np.abs(phi - ref) <= 1e-12 * (inv @ np.abs(q)))
    assert np.all(np.abs(grad - gref) <= 1e-12 * (inv ** 2 @ np.abs(q))[:, None])


def test_coincident_points_and_box_faces(rng):
    """Duplicated points contribute 0 to each other; points on every face and
    corner of the root box land in valid leaves."""
    x = points("cube", 1200, rng)
    x[:300] = x[300:600]                       # 300 coincident pairs
    x[600:700] = np.round(x[600:700])          # box corners
    x[700:800, 0] = 0.0
    x[800:900, 1] = 1.0
    q = charges(1200, rng)
    phi, grad = jfmm.fmm(x, q, eps=1e-7, gradient=True, leaf_size=8)
    assert np.isfinite(phi).all() and np.isfinite(grad).all()
    ref, gref = reference(x, q)
    assert rel(phi, ref) <= 1e-7 and rel(grad, gref) <= 1e-6


def test_k_charge_vectors_and_vmap_equal_columns(rng):
    x, q = points("cube", 2000, rng), charges(2000, rng, k=3)
    both = jfmm.fmm(x, q, eps=1e-8, gradient=True)
    assert both[0].shape == (2000, 3) and both[1].shape == (2000, 3, 3)
    vm = jax.vmap(lambda c: jfmm.fmm(x, c, eps=1e-8, gradient=True), in_axes=1,
                  out_axes=(1, 1))(jnp.asarray(q))
    for col in range(3):
        phi, grad = jfmm.fmm(x, q[:, col], eps=1e-8, gradient=True)
        np.testing.assert_allclose(both[0][:, col], phi, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(vm[0][:, col], phi, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(vm[1][:, col], grad, rtol=1e-12, atol=1e-12)
    ref, _ = reference(x, q)
    assert rel(both[0], ref) <= 1e-8


def test_jit_reuses_compilation(rng):
    traces = []

    @jax.jit
    def f(x, q):
        traces.append(1)
        return jfmm.fmm(x, q, eps=1e-6)

    for _ in range(3):
        x, q = points("sphere", 1000, rng), charges(1000, rng)
        phi = f(x, q)
        assert rel(phi, reference(x, q)[0]) <= 1e-6
    assert len(traces) == 1


def test_eager_calls_do_not_recompile(rng):
    x, q = points("cube", 900, rng), charges(900, rng)
    jfmm.fmm(x, q, eps=1e-5)
    size = lambda: sum(f._cache_size() for f in jfmm.api._fmm_jits)   # noqa: E731
    before = size()
    jfmm.fmm(points("cube", 900, rng), charges(900, rng), eps=1e-5)
    assert size() == before


def test_plans_that_differ_in_their_charge_check_alone_share_a_compilation(rng):
    """The values of a Chebyshev plan's check of its charges depend on its
    points; they travel as arrays, so plans of new points at the same
    order compile once."""
    kernel = kernels.Multiquadric(1.0)
    x1, x2 = points("cube", 900, rng), points("cube", 900, rng)
    p1, p2 = (jfmm.plan(x, kernel=kernel, eps=1e-6, leaf_size=16) for x in (x1, x2))
    assert p1.config == p2.config and p1.check is not None
    assert not np.array_equal(p1.check.log_num, p2.check.log_num)
    q = charges(900, rng) + 0.25        # mixed sign, not near a cancelling sum
    p1.apply(q)
    size = lambda: sum(f._cache_size() for f in jfmm.api._apply_jits)   # noqa: E731
    before = size()
    assert rel(p2.apply(q), radial_reference(kernel, x2, q, gradient=False)[0]) <= 1e-6
    assert size() == before


def test_plan_apply_and_update(rng):
    x, y = points("cube", 1500, rng), points("sphere", 500, rng)
    pl = jfmm.plan(x, y, eps=1e-8, gradient=True)
    q = charges(1500, rng, k=2)
    phi, grad = pl.apply(q, gradient=True)
    ref, gref = reference(x, q, y)
    assert rel(phi, ref) <= 1e-8 and rel(grad, gref) <= 1e-7
    x2, y2 = points("cluster", 1500, rng), points("cube", 500, rng)
    pl2 = jax.jit(lambda p_, a, b: p_.update(a, b))(pl, x2, y2)
    q1 = charges(1500, rng)
    assert rel(pl2.apply(q1), reference(x2, q1, y2)[0]) <= 1e-8
    # float32 points make a float32 plan (jax_enable_x64 is on here).
    pl32 = jfmm.plan(np.float32(x), eps=1e-4)
    assert pl32.tree.src_sorted.dtype == np.float32
    phi32 = pl32.apply(np.float32(q1))
    assert phi32.dtype == np.float32
    assert rel(phi32, reference(x, q1, dtype=np.float32)[0]) <= 1e-4


def test_constant_arrays_captured_by_jit(rng):
    """Points closed over by a jitted function are concrete: checked, not traced."""
    x, q = points("cube", 400, rng), charges(400, rng)
    y = jnp.asarray(points("sphere", 50, rng))
    phi = jax.jit(lambda c: jfmm.fmm(x, c, y, eps=1e-8))(q)
    assert rel(phi, reference(x, q, y)[0]) <= 1e-8


def test_nan_under_jit_gives_nan(rng):
    x, q = points("cube", 500, rng), charges(500, rng)
    x[7, 1] = np.nan
    phi = jax.jit(lambda a, b: jfmm.fmm(a, b, eps=1e-6))(x, q)
    assert np.isnan(phi).all()


# ---------------------------------------------------------------- structure

@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _One(kernels.Kernel):
    """K = 1 everywhere (not singular): the counting kernel."""

    def radial(self, r):
        return jnp.ones_like(r)


class _Counting:
    """A one-coefficient family whose every operator passes counts through:
    each target must receive every source exactly once (exafmm's check)."""

    NAME, SCHEME = "counting", "tree"

    @staticmethod
    def operators(p, offsets, dtype):
        one = lambda n: jnp.ones((n, 1, 1), dtype)  # noqa: E731
        m2l = jnp.concatenate([one(len(offsets)), jnp.zeros((1, 1, 1), dtype)])
        return laplace3d.Operators(one(8), one(8), m2l)

    @staticmethod
    def m2l_basis(ops):
        return None

    @staticmethod
    def m2l_matrices(ops, kernel, side, p):
        return ops.m2l

    @staticmethod
    def p2m(u, q, p):
        return q[:, :, None]

    @staticmethod
    def l2p_coefficients(loc, p, gradient):
        return loc

    @staticmethod
    def l2p(u, loc, h, p, gradient):
        return loc[:, :, 0], None


@pytest.mark.parametrize("kind,depth", [("cube", 2), ("sphere", 3), ("cluster", 4)])
def test_counting_fmm_covers_every_pair_once(kind, depth, rng):
    x, y = points(kind, 900, rng), points(kind, 400, rng)
    tree = jax.jit(build_tree, static_argnums=2)(jnp.asarray(x), jnp.asarray(y), depth)
    ops = _Counting.operators(1, lists.m2l_offsets(3), jnp.float64)
    run = jax.jit(passes.evaluate, static_argnums=(3, 5))     # compiled, not op by op
    phi, _ = run(tree, jnp.ones((900, 1)), _One(), Config(_Counting, 1, depth, 1.0), ops, False)
    np.testing.assert_array_equal(phi, 900.0)


def test_chunked_p2m_l2p_match_direct(rng, monkeypatch):
    """Large jnp P2M / L2P passes run over chunks of points (memory O(N));
    forced here with a tiny budget, results and gradients match the direct
    sum and an odd N pads the last chunk. The budget is read when a call is
    traced: sizes used by no other test make these calls trace afresh (and
    keep their chunked executables to themselves)."""
    from jfmm.ops import backend
    monkeypatch.setattr(backend, "CHUNK_VALUES", 2 ** 15)
    x, y = points("cluster", 1001, rng), points("cube", 501, rng)
    q = charges(1001, rng)
    phi, grad = jfmm.fmm(x, q, y, eps=1e-6, gradient=True, leaf_size=16)
    ref, gref = jfmm.direct(x, q, y, gradient=True)
    assert rel(phi, ref) <= 1e-6 and rel(grad, gref) <= 1e-6, (rel(phi, ref), rel(grad, gref))
    w = jnp.asarray(rng.random(501) - 0.5)
    loss = lambda f, a, **kw: jnp.sum(w * f(a, q, y, **kw))  # noqa: E731
    got = jax.jit(jax.grad(lambda a: loss(jfmm.fmm, a, eps=1e-6, leaf_size=16)))(x)
    want = jax.jit(jax.grad(lambda a: loss(jfmm.direct, a)))(x)
    assert rel(got, want) <= 1e-5
