"""The fast Gauss transform (family "hermite") against the float64 direct
sum: 2D and 3D, uniform, sphere and clustered points, targets = and !=
sources, several widths, float32 and float64; its derivatives; and its
automatic choice."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import charges, points, radial_reference, rel
from numpy.polynomial import hermite as nph

import jfmm
from jfmm import configure
from jfmm import kernels as K
from jfmm.models import hermite as hermite_model
from jfmm.ops import hermite


def test_normalized_hermite_functions():
    """The recurrence against numpy's Hermite polynomials H_n."""
    x = np.linspace(-6, 6, 41)
    got = hermite.normalized_hermite(x, 30)
    for n in range(30):
        h = np.exp(-x * x) * nph.hermval(x, np.eye(30)[n])
        want = h / np.sqrt(2.0 ** n * float(np.prod(np.arange(1, n + 1, dtype=float))))
        np.testing.assert_allclose(got[n], want, rtol=1e-9, atol=1e-12)


def test_series_of_one_pair_converges_to_the_gaussian(rng):
    s, t = rng.uniform(-0.5, 0.5, 2)
    for dd in (0.0, 1.0, -2.0, 4.0):
        approx, dapprox = hermite_model._series_1d(s, t, dd, 20)
        u = dd + t - s
        assert abs(approx[-1] - np.exp(-u * u)) < 1e-12
        assert abs(dapprox[-1] + 2 * u * np.exp(-u * u)) < 1e-11
        assert abs(approx[3] - np.exp(-u * u)) > abs(approx[-1] - np.exp(-u * u))


CASES = [  # dim, kind, separate, epsilon, eps, dtype
    (2, "cube", False, 0.5, 1e-10, np.float64),
    (2, "cluster", True, 0.2, 1e-6, np.float64),   # clusters span [-10, 10]
    (2, "sphere", True, 15.0, 1e-4, np.float32),
    (3, "sphere", False, 2.0, 1e-8, np.float64),
    (3, "cluster", True, 0.3, 1e-4, np.float32),   # float32 floor: 2e-5
    (3, "cube", True, 8.0, 1e-6, np.float64),
]


@pytest.mark.parametrize("dim,kind,separate,epsilon,eps,dtype", CASES)
def test_matches_direct(dim, kind, separate, epsilon, eps, dtype, rng):
    n = 1500
    x, q = points(kind, n, rng, dim), charges(n, rng)
    y = points("cube", 400, rng, dim) * 1.2 - 0.1 if separate else None
    kern = K.Gaussian(epsilon)
    cast = [None if a is None else np.asarray(a, dtype) for a in (x, q, y)]
    assert jfmm.plan(cast[0], cast[2], kernel=kern, eps=eps).family == "hermite"
    phi, grad = jfmm.fmm(*cast, kernel=kern, eps=eps, gradient=True)
    assert phi.dtype == dtype
    ref, gref = radial_reference(kern, *[None if a is None else np.asarray(a, np.float64)
                                         for a in cast])
    assert rel(phi, ref) <= eps, rel(phi, ref)
    assert rel(grad, gref) <= eps, rel(grad, gref)


def test_gradient_within_eps_on_clusters(rng):
    """A gradient asked for meets eps where the points crowd a few boxes of
    the grid (its estimate once measured 1.24x low there, at eps 1e-3)."""
    kern = K.Gaussian(0.7)
    for _ in range(3):
        x, q, y = points("cluster", 700, rng, 3), charges(700, rng), points("cluster", 300, rng, 3)
        phi, grad = jfmm.fmm(x, q, y, kernel=kern, eps=1e-3, gradient=True, family="hermite")
        ref, gref = radial_reference(kern, x, q, y)
        assert rel(phi, ref) <= 1e-3 and rel(grad, gref) <= 1e-3, (rel(phi, ref), rel(grad, gref))


def _cancellation(kern, x, q, y):
    """numpy: ||sqrt(sum_j q_j^2 K_ij^2)|| / ||phi|| at the strided targets
    of `configure.charged`, and the same with the gradient's |grad K|."""
    y = y[::max(1, len(y) // 256)][:256]
    diff = y[:, None] - x[None]
    r2 = (diff ** 2).sum(-1)
    k = np.exp(-kern.epsilon ** 2 * r2)
    dk = -2 * kern.epsilon ** 2 * k                  # grad K = dk (y - x)
    phi, grad = k @ q, np.einsum("mn,mnd,n->md", dk, diff, q)
    return (np.sqrt(np.sum((k * k) @ (q * q))) / np.linalg.norm(phi),
            np.sqrt(np.sum((dk * dk * r2) @ (q * q))) / np.linalg.norm(grad))


def test_charges_that_cancel_choose_the_order(rng):
    """Charges known to a call (eager, or a plan given them) choose the
    order for how much more their sums cancel at the targets than random
    charges' would (`hermite.Cancellation`, against a numpy sum). On a draw
    whose random charges cancel 44 times more than that at a cube of
    targets apart from clustered sources, the order chosen for random
    charges erred 3.6 eps (float64); chosen for these, the sums meet eps.
    A fresh draw meets eps too. Asked for the Chebyshev family, the same
    Gaussian's charges give that family's moments instead."""
    kern, eps = K.Gaussian(0.3), 1e-4

    def draw(gen):
        x, q = points("cluster", 1500, gen, 3), charges(1500, gen)
        return x, q, points("cube", 400, gen, 3) * 1.2 - 0.1

    cancelling = draw(np.random.default_rng(np.random.SeedSequence(12345).spawn(200)[188]))
    assert _cancellation(kern, *cancelling)[0] > 4 * hermite_model.CANCEL_SLACK
    for x, q, y in (cancelling, draw(rng)):
        xj, qj, yj = jnp.asarray(x), jnp.asarray(q)[:, None], jnp.asarray(y)
        want = _cancellation(kern, x, q, y)
        got = np.asarray(configure._gauss_ratios(kern, xj, qj, yj), np.float64)
        assert np.allclose(got, want, rtol=1e-3), (got, want)      # summed in float32
        cancel = configure.charged(xj, yj, kern, qj, "hermite", None, eps)
        assert isinstance(cancel, hermite_model.Cancellation)
        assert all(max(1, g) <= c < np.sqrt(2) * max(1, g) for c, g in zip(cancel, got))
        phi = jfmm.fmm(x, q, y, kernel=kern, eps=eps, family="hermite")
        assert rel(phi, radial_reference(kern, x, q, y, gradient=False)[0]) <= eps
    chebyshev = configure.charged(xj, yj, kern, qj, "chebyshev", None, eps)
    assert isinstance(chebyshev, tuple) and not isinstance(chebyshev, hermite_model.Cancellation)
    x, q, y = cancelling
    blind = jfmm.plan(x, y, kernel=kern, eps=eps, family="hermite", gradient=False)
    known = jfmm.plan(x, y, kernel=kern, eps=eps, family="hermite", gradient=False, charges=q)
    assert known.order > blind.order


def test_derivatives(rng):
    """jax.grad in points and charges (the transposed transform), forward
    mode in the targets, and d/d epsilon through a plan's kernel."""
    x, q, y = points("cube", 600, rng, 3), charges(600, rng), points("sphere", 200, rng, 3)
    w = jnp.asarray(rng.normal(size=200))
    kern, eps = K.Gaussian(3.0), 1e-8

    def loss(f, a, c, b, **kw):
        return jnp.sum(w * f(a, c, b, kernel=kern, **kw))

    got = jax.grad(lambda a, c, b: loss(jfmm.fmm, a, c, b, eps=eps), (0, 1, 2))(x, q, y)
    want = jax.grad(lambda a, c, b: loss(jfmm.direct, a, c, b), (0, 1, 2))(x, q, y)
    for g, h in zip(got, want):
        assert rel(g, np.asarray(h)) <= 10 * eps
    v = rng.normal(size=y.shape)
    got = jax.jvp(lambda b: jfmm.fmm(x, q, b, kernel=kern, eps=eps), (y,), (v,))[1]
    want = jax.jvp(lambda b: jfmm.direct(x, q, b, kernel=kern), (y,), (v,))[1]
    assert rel(got, np.asarray(want)) <= 10 * eps
    pl = jfmm.plan(x, y, kernel=kern, eps=eps)
    assert pl.family == "hermite"
    # d phi / d epsilon at every target (a weighted sum of it can cancel).
    de = jax.jvp(lambda e: dataclasses.replace(pl, kernel=K.Gaussian(e)).apply(q), (3.0,),
                 (1.0,))[1]
    dd = jax.jvp(lambda e: jfmm.direct(x, q, y, kernel=K.Gaussian(e)), (3.0,), (1.0,))[1]
    assert rel(de, np.asarray(dd)) <= 10 * eps


def test_plan_update_and_vmap_under_jit(rng):
    """A plan made outside jit keeps the transform for new points inside it;
    vmap over charge sets is one call."""
    x, x2 = points("cube", 800, rng, 2), points("cube", 800, rng, 2)
    qs = charges(800, rng, k=3)
    kern = K.Gaussian(4.0)
    pl = jfmm.plan(x, kernel=kern, eps=1e-7)
    phi = jax.jit(lambda p_, a, c: jax.vmap(p_.update(a).apply, in_axes=1, out_axes=1)(c))(
        pl, x2, qs)
    assert rel(phi, jfmm.direct(x2, qs, kernel=kern)) <= 1e-7


@pytest.mark.parametrize("kern", [K.Gaussian(4.0), K.Multiquadric(2.0)], ids=["hermite", "chebyshev"])
def test_plan_update_beyond_its_extent_is_flagged(rng, kern):
    """A plan of a kernel with a length scale moved to points spread wider
    than it was made for sets `overflow`, raises eagerly and is NaN under
    jit; points within the slack sum within eps; scale-free kernels carry
    over to any extent."""
    x, q = points("cube", 800, rng, 2), charges(800, rng)
    pl = jfmm.plan(x, kernel=kern, eps=1e-7)
    assert pl.family == ("hermite" if isinstance(kern, K.Gaussian) else "chebyshev")
    near = x * 1.02
    assert not bool(pl.update(near).overflow)
    assert rel(pl.update(near).apply(q), jfmm.direct(near, q, kernel=kern)) <= 1e-7
    wide = pl.update(3 * x)
    assert bool(wide.overflow)
    with pytest.raises(RuntimeError, match="wider than"):
        wide.apply(q)
    assert np.all(np.isnan(jax.jit(lambda p_, a: p_.update(a).apply(q))(pl, 3 * x)))
    laplace = jfmm.plan(x, kernel=K.Laplace2D(), eps=1e-7)
    assert laplace.extent is None and not bool(laplace.update(3 * x).overflow)


def test_choice_and_errors(rng):
    x, q = points("cube", 500, rng, 3), charges(500, rng)
    cfg = lambda a, k, **kw: configure.resolve(  # noqa: E731
        jnp.asarray(a), None, k, kw.pop("eps", 1e-6), None, kw.pop("order", None),
        kw.pop("family", None))
    assert cfg(x, K.Gaussian(1.0)).name == "hermite"
    assert cfg(x, K.Gaussian(1.0), family="chebyshev").name == "chebyshev"
    assert cfg(x, K.Gaussian(1.0), order=6).name == "chebyshev"   # an order given: Chebyshev
    assert cfg(x, K.Gaussian(1.0), order=6, family="hermite").order == 6
    # Too narrow for the transform's grid budget, too wide for the near field.
    assert cfg(x * 1e3, K.Gaussian(1.0)).name == "chebyshev"
    # Traced points: the grid level is unknown, so Chebyshev; "hermite" raises.
    traced = []
    jax.make_jaxpr(lambda a: traced.append(cfg(a, K.Gaussian(1.0))) or a)(x)
    assert [c.name for c in traced] == ["chebyshev"]
    with pytest.raises(ValueError, match="concrete points"):
        jax.jit(lambda a: jfmm.fmm(a, q, kernel=K.Gaussian(1.0), family="hermite"))(x)
    with pytest.raises(ValueError, match="Gaussian kernel only"):
        jfmm.fmm(x, q, kernel=K.Multiquadric(1.0), family="hermite")
    with pytest.raises(ValueError, match="reaches"):
        jfmm.fmm(x, q, kernel=K.Gaussian(1.0), eps=1e-13, family="hermite")
    with pytest.raises(ValueError, match="reaches"):
        jfmm.fmm(np.float32(x), np.float32(q), kernel=K.Gaussian(1.0), eps=1e-5,
                 family="hermite")
    pl = jfmm.plan(x, kernel=K.Gaussian(1.0), eps=1e-6)
    xn = x.copy()
    xn[3, 0] = np.nan
    assert np.isnan(jax.jit(lambda p_, a: p_.update(a).apply(q))(pl, xn)).all()
