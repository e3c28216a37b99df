"""Any radial kernel through jfmm.fmm (Chebyshev family; Gaussians through
the fast Gauss transform where it is chosen, see test_gauss_transform.py)
against the float64 direct sum: potential, gradient, targets = and !=
sources, uniform and clustered points, several shape parameters, eps sweeps,
and gradients with respect to kernel parameters. References: numpy sums
(conftest.radial_reference), not jfmm's own pair terms."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import charges, points, radial_reference, rel

import jfmm
from jfmm import passes
from jfmm import kernels as K
from jfmm.models import Unreachable
from jfmm.models import chebyshev as chebyshev_model

CASES = [K.Gaussian(0.7), K.Gaussian(3.0), K.Multiquadric(1.0), K.InverseMultiquadric(4.0),
         K.InverseQuadratic(2.0), K.ThinPlateSpline(), K.Linear(), K.Cubic(), K.Quintic(),
         K.Yukawa(2.0), K.Radial(lambda r: jnp.cos(r) / (1 + r * r))]


def _check(kernel, dim, kind, separate, eps, rng, n=900, family=None):
    x = points(kind, n, rng, dim)
    q = charges(n, rng)
    y = points(kind, 300, rng, dim) if separate else None
    phi, grad = jfmm.fmm(x, q, y, kernel=kernel, eps=eps, gradient=True, leaf_size=16,
                         family=family)
    ref, gref = radial_reference(kernel, x, q, y)
    assert rel(phi, ref) <= eps, rel(phi, ref)
    assert rel(grad, gref) <= eps, rel(grad, gref)


# Each kernel once per dimension; the distribution and whether targets are
# separate from sources alternate over the list, so both kinds of each occur.
SETUPS = [("cube", False), ("cluster", True), ("sphere", True), ("cluster", False)]


@pytest.mark.parametrize("i,kernel", list(enumerate(CASES + [K.Laplace2D()])),
                         ids=lambda v: type(v).__name__ if isinstance(v, K.Kernel) else "")
def test_every_kernel_2d(i, kernel, rng):
    kind, separate = SETUPS[i % 4]
    _check(kernel, 2, kind, separate, 1e-8 if i % 2 else 1e-5, rng)


@pytest.mark.optimized    # runs longer than it compiles (tests/conftest.py)
@pytest.mark.parametrize("i,kernel", list(enumerate(CASES)),
                         ids=lambda v: type(v).__name__ if isinstance(v, K.Kernel) else "")
def test_every_kernel_3d(i, kernel, rng):
    kind, separate = SETUPS[(i + 1) % 4]
    _check(kernel, 3, kind, separate, 1e-3, rng, n=700)


@pytest.mark.optimized    # runs longer than it compiles (tests/conftest.py)
@pytest.mark.parametrize("kernel", [K.Gaussian(3.0), K.Quintic()],
                         ids=lambda k: type(k).__name__)
def test_3d_at_its_tightest_eps(kernel, rng):
    _check(kernel, 3, "cube", False, 1e-4, rng, n=700)


@pytest.mark.parametrize("eps,kernel", [(1e-3, K.Multiquadric(2.0)), (1e-10, K.Laplace2D())])
def test_eps_ends_2d(eps, kernel, rng):
    _check(kernel, 2, "sphere", True, eps, rng, n=1200)


@pytest.mark.optimized    # runs longer than it compiles (tests/conftest.py)
@pytest.mark.parametrize("kernel,kind,dtype,eps,gradient", [
    (K.Linear(), "cube", np.float64, 1e-6, False),
    (K.ThinPlateSpline(), "cube", np.float32, 1e-4, False),
    (K.Multiquadric(1.0), "sphere", np.float64, 1e-5, True),
], ids=lambda v: type(v).__name__ if isinstance(v, K.Kernel) else None)
def test_orders_spend_what_eps_allows(kernel, kind, dtype, eps, gradient, rng):
    """The order chosen for phi (and grad where asked) meets eps for each of
    two charge draws, and on uniform and sphere points spends no more than
    that: the worst draw's error is above eps / 5, or one order less errs
    above eps / 10 in the worst of these draws (the rule holds the
    1-in-1,000 draw to eps: Linear's errors spread 6x between draws, and
    measured / estimated errors 3x between kernels).
    (Clustered points, whose far field the estimate overrates, are held
    to eps by test_every_kernel_3d and tests/test_adaptive.py.) 8,000 points: below that the rule is more careful (one pair can
    weigh more), and below ~10^4 the direct sum is the default."""
    n, draws = 8000, 2
    x, q = points(kind, n, rng).astype(dtype), charges(n, rng, draws).astype(dtype)
    ref, gref = radial_reference(kernel, x, q, gradient=gradient)

    def error(order):
        phi, grad = jfmm.fmm(x, q, kernel=kernel, gradient=True, order=order,
                             family="chebyshev")
        return max(max(rel(phi[:, c], ref[:, c]), rel(grad[:, c], gref[:, c]) if gradient else 0)
                   for c in range(draws))

    chosen = jfmm.plan(x, kernel=kernel, eps=eps, gradient=gradient)
    assert chosen.family == "chebyshev" and chosen.tree.depth >= 2
    err = error(chosen.order)
    assert err <= eps, err
    if chosen.order > chebyshev_model.RULES[3]["min_order"]:
        assert err > eps / 5 or error(chosen.order - 1) > eps / 10, (chosen.order, err)


@pytest.mark.optimized    # runs longer than it compiles (tests/conftest.py)
def test_kernel_parameter_gradients(rng):
    """d/d epsilon of a loss of the FMM sum equals the central difference of
    the numpy reference's loss."""
    for dim, kernel_of, e0, eps in ((2, K.Gaussian, 1.5, 1e-8),
                                    (3, K.InverseMultiquadric, 2.0, 1e-4)):
        x, q = points("cube", 500, rng, dim), charges(500, rng)

        def loss(phi, grad):
            return jnp.sum(phi ** 2) + jnp.sum(grad ** 2)

        h = 1e-5 * e0
        want = (loss(*radial_reference(kernel_of(e0 + h), x, q))
                - loss(*radial_reference(kernel_of(e0 - h), x, q))) / (2 * h)
        got = jax.jit(jax.grad(lambda e: loss(*jfmm.fmm(x, q, kernel=kernel_of(e), eps=eps,
                                                         gradient=True, leaf_size=16))))(e0)
        assert abs(got - want) <= 10 * eps * abs(want)


@pytest.mark.optimized    # runs longer than it compiles (tests/conftest.py)
def test_kernel_parameter_gradient_below_the_worst_case_rule(rng):
    """Differentiated outside jit, a kernel parameter's value chooses the
    order (eps = 3e-7 in 3D is below the rule for unknown parameters);
    inside jit the error names `order=`, which then works. d phi / d
    epsilon at every target against the numpy reference's central
    difference."""
    x, q = points("cluster", 600, rng), charges(600, rng)

    def phi(e, **options):
        return jfmm.fmm(x, q, kernel=K.Gaussian(e), eps=3e-7, leaf_size=16, **options)

    h = 1e-5 * 3.0
    want = (radial_reference(K.Gaussian(3.0 + h), x, q, gradient=False)[0]
            - radial_reference(K.Gaussian(3.0 - h), x, q, gradient=False)[0]) / (2 * h)
    assert rel(jax.jvp(phi, (3.0,), (1.0,))[1], want) <= 3e-7
    with pytest.raises(ValueError, match="pass order="):
        jax.jit(lambda e: jax.jvp(phi, (e,), (1.0,))[1])(3.0)
    got = jax.jit(lambda e: jax.jvp(lambda v: phi(v, order=10, family="chebyshev"), (e,),
                                    (1.0,))[1])(3.0)
    assert rel(got, want) <= 3e-7


@pytest.mark.optimized    # runs longer than it compiles (tests/conftest.py)
@pytest.mark.parametrize("kernel,kind,eps", [(K.Gaussian(1.0), "cube", 1e-8)],
                         ids=["Gaussian-cube"])
def test_3d_beyond_the_worst_case_rule(kernel, kind, eps, rng):
    """eps below the worst-case rule's 3D floor (9.5e-7), reached by the
    order from the error estimate for this kernel and points."""
    fam = chebyshev_model.rule(3)
    with pytest.raises(ValueError, match="reaches"):
        fam.order(eps, np.float64)
    _check(kernel, 3, kind, False, eps, rng, n=700, family="chebyshev")


@pytest.mark.optimized    # runs longer than it compiles (tests/conftest.py)
def test_estimated_order_under_jit(rng):
    """Traced points: the order is the estimate's worst over root box sizes
    (no more than the worst-case rule's); traced kernel parameters: the
    worst-case rule."""
    x, q = points("sphere", 900, rng, 2), charges(900, rng)
    ref, gref = radial_reference(K.Multiquadric(3.0), x, q)
    # The uniform tree alone: "auto" would compile the bounded adaptive one
    # too (4.8 -> 25 s; test_traced_chebyshev_on_bounded_trees runs it).
    opts = dict(eps=1e-8, gradient=True, leaf_size=16, tree="uniform")
    traced_points = jax.jit(lambda a, c: jfmm.fmm(a, c, kernel=K.Multiquadric(3.0), **opts))
    traced_kernel = jax.jit(lambda e: jfmm.fmm(x, q, kernel=K.Multiquadric(e), **opts))
    for phi, grad in (traced_points(x, q), traced_kernel(3.0)):
        assert rel(phi, ref) <= 1e-8, rel(phi, ref)
        assert rel(grad, gref) <= 1e-7, rel(grad, gref)
    fam = chebyshev_model.rule(3)
    assert fam.order_for(1e-6, np.float64, K.Cubic(), lambda n: 3)[0] <= fam.order(1e-6, np.float64)


def test_radial_kernel_with_closure_matches_direct(rng):
    kern = K.Radial(lambda r: jnp.exp(-r) * (1 + r), singular=False)
    _check(kern, 3, "cube", True, 1e-4, rng, n=600)


def test_unreachable_eps_and_wrong_dimension_raise(rng):
    x3, x2, q = points("cube", 100, rng, 3), points("cube", 100, rng, 2), charges(100, rng)
    with pytest.raises(ValueError, match="reaches"):
        jfmm.fmm(x3, q, kernel=K.Gaussian(1.0), eps=1e-14)
    # No order reaches it here; the error names the least eps one does for
    # these charges (the interpolator's fallback).
    y, c = points("cube", 3000, rng, 3), charges(3000, rng)
    opts = dict(kernel=K.Gaussian(12.0), leaf_size=16, family="chebyshev")
    with pytest.raises(Unreachable, match="reaches") as info:
        jfmm.fmm(y, c, eps=1e-11, **opts)
    reach = info.value.reachable
    assert 1e-11 < reach < 1e-6, reach
    jfmm.plan(y, eps=1.01 * reach, charges=c, **opts)
    with pytest.raises(Unreachable):
        jfmm.plan(y, eps=0.9 * reach, charges=c, **opts)
    with pytest.raises(ValueError, match=r"shape \(n, 2\)"):
        jfmm.fmm(x3, q, kernel=K.Laplace2D())
    with pytest.raises(ValueError, match=r"shape \(n, 3\)"):
        jfmm.fmm(x2, q, kernel=K.Laplace3D())


def test_float32(rng):
    """float32 in, float32 out, within eps of a float64 sum of the rounded
    inputs. eps is 2e-4: on leaves of 16 the float32 gradient's rounding
    alone reaches about 1e-4 for some charge draws (7.4e-5 at the best
    order on the worst of 200; eager calls, which see the charges, raise
    there at 1e-4), and 2e-4 measured within 7.9e-5 over 200 draws."""
    x, q = points("cube", 800, rng, 2), charges(800, rng)
    kern = K.Multiquadric(1.5)
    phi, grad = jfmm.fmm(np.float32(x), np.float32(q), kernel=kern, eps=2e-4, gradient=True,
                         leaf_size=16)
    assert phi.dtype == np.float32
    ref, gref = radial_reference(kern, np.float32(x), np.float32(q))
    assert rel(phi, ref) <= 2e-4 and rel(grad, gref) <= 2e-4


def test_float32_gradients_on_deep_trees(rng):
    """float32 gradients of a kernel flat over the leaves: the far field's
    rounding grows with the depth (`chebyshev.gradient_rounding`; before,
    deep adaptive trees of clusters gave 2.6e-2 at eps 1e-4). They come
    within eps, on one level fewer where that suffices, or raise."""
    kern = K.InverseMultiquadric(1.0)
    # Mixed-sign charges with a mean of 0.1: a draw of zero-mean ones whose
    # sum happened to cancel raised the charges' float32 floor first.
    x, q = np.float32(points("cube", 4096, rng, 2)), np.float32(charges(4096, rng) + 0.1)
    with pytest.raises(Unreachable, match="float32 gradients.*float64") as info:
        jfmm.fmm(x, q, kernel=kern, eps=1e-4, gradient=True, leaf_size=4)
    eps = 1.01 * info.value.reachable                      # the eps the error names
    phi, grad = jfmm.fmm(x, q, kernel=kern, eps=eps, gradient=True, leaf_size=4)
    ref, gref = radial_reference(kern, x, q)
    assert rel(phi, ref) <= eps and rel(grad, gref) <= eps, (eps, rel(phi, ref), rel(grad, gref))
    # Clusters: "auto" keeps the uniform tree; a forced adaptive one (16 levels) raises.
    y, c = np.float32(points("cluster", 3000, rng, 2)), np.float32(charges(3000, rng) + 0.1)
    with pytest.raises(Unreachable, match="float32 gradients"):
        jfmm.plan(y, kernel=kern, eps=1e-4, gradient=True, tree="adaptive")
    pl = jfmm.plan(y, kernel=kern, eps=1e-4, gradient=True)
    assert pl.config.tree == "uniform"
    phi, grad = pl.apply(c, gradient=True)
    ref, gref = radial_reference(kern, y, c)
    assert rel(phi, ref) <= 1e-4 and rel(grad, gref) <= 1e-4, (rel(phi, ref), rel(grad, gref))


@pytest.mark.parametrize("kernel,dim", [(K.Laplace3D(), 3)], ids=["Laplace3D"])
def test_family_override(kernel, dim, rng):
    """family="chebyshev" sums a Laplace kernel with the kernel-independent
    family, through fmm, plan and jax.grad alike (2D Laplace with it:
    test_every_kernel_2d's family, the one that every 2D kernel but
    Laplace2D takes)."""
    x, q = points("cluster", 500, rng, dim), charges(500, rng)
    ref, gref = radial_reference(kernel, x, q)
    phi, grad = jfmm.fmm(x, q, kernel=kernel, eps=1e-3, gradient=True, leaf_size=16,
                         family="chebyshev")
    assert rel(phi, ref) <= 1e-3 and rel(grad, gref) <= 1e-2
    pl = jfmm.plan(x, kernel=kernel, eps=1e-3, leaf_size=16, family="chebyshev")
    assert pl.family == "chebyshev" and rel(pl.apply(q), ref) <= 1e-3
    dq = jax.grad(lambda c: jnp.sum(jfmm.fmm(x, c, kernel=kernel, eps=1e-3, leaf_size=16,
                                             family="chebyshev") ** 2))(jnp.asarray(q))
    assert rel(dq, 2 * radial_reference(kernel, x, ref, gradient=False)[0]) <= 1e-2
    with pytest.raises(ValueError, match="family must be one of"):
        jfmm.fmm(x, q, kernel=kernel, family="fgt")


@pytest.mark.parametrize("dim", [2, 3])
def test_narrow_gaussian_near_field_only(dim, rng, monkeypatch):
    """A Gaussian below 0.1 eps within one leaf side skips the expansions
    (the downward pass is never called) and still meets eps; a wider one
    gets the fast Gauss transform, or with family="chebyshev" the FMM."""
    # Sizes no other test uses, so that these calls are traced here (with
    # the patched downward pass), not taken from jit caches.
    x, q = points("cube", 1499, rng, dim), charges(1499, rng)
    y = points("sphere", 401, rng, dim)      # in the unit box (clusters have far outliers)
    narrow, wide = K.Gaussian(300.0), K.Gaussian(3.0)
    ref, gref = radial_reference(narrow, x, q, y)
    calls = []
    real = passes.downward
    monkeypatch.setattr(passes, "downward", lambda *a: calls.append(1) or real(*a))
    phi, grad = jfmm.fmm(x, q, y, kernel=narrow, eps=1e-6, gradient=True, leaf_size=16)
    assert not calls
    assert rel(phi, ref) <= 1e-6 and rel(grad, gref) <= 1e-5
    assert jfmm.plan(x, y, kernel=wide, eps=1e-4, leaf_size=16).family == "hermite"
    jfmm.fmm(x, q, y, kernel=wide, eps=1e-4, leaf_size=16, family="chebyshev")
    assert calls
    with pytest.raises(ValueError, match="family must be one of"):
        jfmm.fmm(x, q, kernel=narrow, family="near")


@pytest.mark.parametrize("kernel,dim,eps", [(K.Multiquadric(1.0), 3, 1e-6),
                                             (K.InverseQuadratic(1.0), 3, 1e-6),
                                             (K.Multiquadric(1.0), 2, 1e-7)],
                         ids=["Multiquadric(1)-3d", "InverseQuadratic(1)-3d",
                              "Multiquadric(1)-2d"])
def test_charges_choose_the_order(kernel, dim, eps, rng):
    """Eager calls choose the Chebyshev order for their charges: charges
    with zero sum and first moments (RBF weights with a linear tail) on a
    sphere or circle, which cancel in phi's smoothest modes, are within
    eps of a float64 numpy sum at an order no lower than a plan's made
    without charges (the order jit takes, measured 0.8-5.8 eps on such
    draws), and so are random charges, at most one order above that
    plan's: a random draw whose sum nearly cancels (phi's smoothest mode)
    may take one more (in 3D, a sum of -1.8 where |q| sums to 2,069 took
    7 against 6)."""
    n = 8192
    x = points("sphere", n, rng, dim)
    moments = np.hstack([np.ones((n, 1)), x])
    q = charges(n, rng)
    free = q - moments @ np.linalg.lstsq(moments, q, rcond=None)[0]
    opts = dict(kernel=kernel, eps=eps, leaf_size=32)
    static = jfmm.plan(jnp.asarray(x), **opts)
    refs = radial_reference(kernel, x, np.stack([free, q], 1), gradient=False)[0]
    for c, ref, higher in ((free, refs[:, 0], True), (q, refs[:, 1], False)):
        phi = jfmm.fmm(jnp.asarray(x), jnp.asarray(c), **opts)
        assert rel(phi, ref) <= eps
        order = jfmm.plan(jnp.asarray(x), charges=jnp.asarray(c), **opts).order
        assert order >= static.order if higher else order <= static.order + 1


def test_sums_check_their_charges(rng):
    """A plan made without charges holds its order for charges that do not
    cancel by construction. Summing charges that do (zero sum and first
    moments on a circle: up to 17 eps at that order, measured), its check
    of their own phi (`configure.checked`) raises eagerly and gives NaN
    under jit in their column, unless the sum is within eps; random
    charges beside them in the same call stay within eps and finite (of
    mixed sign, their sum far from 0: centred random draws on this circle
    were flagged 2 times in 30, at most 0.51 eps)."""
    n, eps, kernel = 8192, 1e-7, K.Multiquadric(1.0)
    x = points("sphere", n, rng, 2)
    moments = np.hstack([np.ones((n, 1)), x])
    q = charges(n, rng, 2) + 0.25
    free = q - moments @ np.linalg.lstsq(moments, q, rcond=None)[0]
    both = np.hstack([q[:, :1], free[:, :1]])
    # one float64 sum for all four columns: q[:, 0], free[:, 0], q[:, 1], free[:, 1]
    ref = radial_reference(kernel, x, np.hstack([both, q[:, 1:], free[:, 1:]]),
                           gradient=False)[0]
    static = jfmm.plan(jnp.asarray(x), kernel=kernel, eps=eps, leaf_size=32)
    phi = np.asarray(jax.jit(static.apply)(jnp.asarray(both)))
    assert rel(phi[:, 0], ref[:, 0]) <= eps
    assert np.isnan(phi[:, 1]).all() or rel(phi[:, 1], ref[:, 1]) <= eps
    assert rel(static.apply(jnp.asarray(q[:, 1])), ref[:, 2]) <= eps
    try:
        phi = static.apply(jnp.asarray(free[:, 1]))
    except Unreachable as e:
        assert "cancel" in str(e) and "charges=" in str(e)
    else:
        assert rel(phi, ref[:, 3]) <= eps


def test_eager_calls_with_new_charges(rng):
    """Eager calls on the same points with a new charge array each time
    take the last plan for those points where its sums' check passes the
    new charges, and measure them where it does not: random, random,
    moment-free, random charges on a circle, each within eps."""
    n, eps, kernel = 8192, 1e-7, K.Multiquadric(1.0)
    x = jnp.asarray(points("sphere", n, rng, 2))
    moments = np.hstack([np.ones((n, 1)), np.asarray(x)])
    q = charges(n, rng, 4)
    q[:, 2] -= moments @ np.linalg.lstsq(moments, q[:, 2], rcond=None)[0]
    ref = radial_reference(kernel, np.asarray(x), q, gradient=False)[0]
    for j in range(4):
        phi = jfmm.fmm(x, jnp.asarray(q[:, j]), kernel=kernel, eps=eps, leaf_size=32)
        assert rel(phi, ref[:, j]) <= eps, j


def test_cancelling_charges_in_float32_raise(rng):
    """float32 rounding, relative to phi, grows as charges cancel: moment-free
    charges with a smooth kernel on a sphere raise in float32 (naming float64)
    where random ones of mean 0.25 at the same eps are summed within it
    (mixed-sign ones of mean 0 cancel by chance too: one draw in about ten
    raised)."""
    n = 6000
    x = points("sphere", n, rng)
    moments = np.hstack([np.ones((n, 1)), x])
    q = charges(n, rng) + 0.25
    free = q - moments @ np.linalg.lstsq(moments, q, rcond=None)[0]
    opts = dict(kernel=K.Multiquadric(1.0), eps=1e-4, leaf_size=32)
    x32 = jnp.asarray(x, jnp.float32)
    with pytest.raises(Unreachable, match="cancel.*float64"):
        jfmm.fmm(x32, jnp.asarray(free, jnp.float32), **opts)
    phi = jfmm.fmm(x32, jnp.asarray(q, jnp.float32), **opts)
    ref = radial_reference(K.Multiquadric(1.0), np.float32(x), np.float32(q), gradient=False)[0]
    assert rel(phi, ref) <= 1e-4
