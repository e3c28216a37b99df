"""Every kernel through jfmm.direct against numpy float64 formulas."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import charges, points, rel

import jfmm
from jfmm import kernels

# name -> (params, K(r), dK/dr), written out by hand in numpy.
FORMULAS = {
    "gaussian": ({"epsilon": 1.7}, lambda r, e: np.exp(-(e * r) ** 2),
                 lambda r, e: -2 * e * e * r * np.exp(-(e * r) ** 2)),
    "multiquadric": ({"epsilon": 0.8}, lambda r, e: -np.sqrt(1 + (e * r) ** 2),
                     lambda r, e: -e * e * r / np.sqrt(1 + (e * r) ** 2)),
    "inverse_multiquadric": ({"epsilon": 2.5}, lambda r, e: 1 / np.sqrt(1 + (e * r) ** 2),
                             lambda r, e: -e * e * r * (1 + (e * r) ** 2) ** -1.5),
    "inverse_quadratic": ({"epsilon": 1.3}, lambda r, e: 1 / (1 + (e * r) ** 2),
                          lambda r, e: -2 * e * e * r / (1 + (e * r) ** 2) ** 2),
    "thin_plate_spline": ({}, lambda r: r * r * np.log(r), lambda r: 2 * r * np.log(r) + r),
    "linear": ({}, lambda r: -r, lambda r: -np.ones_like(r)),
    "cubic": ({}, lambda r: r ** 3, lambda r: 3 * r * r),
    "quintic": ({}, lambda r: -r ** 5, lambda r: -5 * r ** 4),
    "yukawa": ({"kappa": 3.0}, lambda r, k: np.exp(-k * r) / r,
               lambda r, k: -np.exp(-k * r) * (k * r + 1) / r ** 2),
    "laplace2d": ({}, lambda r: -np.log(r), lambda r: -1 / r),
    "laplace3d": ({}, lambda r: 1 / r, lambda r: -1 / r ** 2),
}
SINGULAR = {"yukawa", "laplace2d", "laplace3d"}


def numpy_sum(name, x, q, y):
    """phi (M,) and grad (M, d); r = 0 pairs: skipped if singular, else K(0)
    and no gradient (every kernel here has K'(0) = 0 or a cone at 0)."""
    params, k, dk = FORMULAS[name]
    args = tuple(params.values())
    diff = y[:, None, :] - x[None, :, :]
    r = np.sqrt((diff ** 2).sum(-1))
    pos = r > 0
    rs = np.where(pos, r, 1.0)
    kv = np.where(pos, k(rs, *args), 0.0 if name in SINGULAR or name == "thin_plate_spline"
                  else k(np.zeros(1), *args)[0])
    g = np.where(pos, dk(rs, *args) / rs, 0.0)
    return kv @ q, np.einsum("ms,msd,s->md", g, diff, q)


@pytest.mark.parametrize("name", sorted(FORMULAS))
def test_direct_matches_formula(name, rng):
    params = FORMULAS[name][0]
    kern = kernels.get(name, **params)
    for dim in kern.dims:
        x, q = points("cube", 300, rng, dim), charges(300, rng)
        y = np.concatenate([points("cluster", 120, rng, dim), x[:30]])   # coincident with sources
        phi, grad = jfmm.direct(x, q, y, kernel=kern, gradient=True)
        ref, gref = numpy_sum(name, x, q, y)
        assert rel(phi, ref) < 1e-12
        assert rel(grad, gref) < 1e-11


def test_radial_user_kernel_and_scipy_names(rng):
    x, q = points("sphere", 200, rng), charges(200, rng)
    mine = kernels.Radial(lambda r: jnp.exp(-(1.7 * r) ** 2))
    # Relative L2: the built-in kernels' closed forms round differently, and
    # sums of mixed-sign charges can be near zero (a CI draw: one element
    # 2.2e-13 apart relatively, 4.4e-16 absolutely).
    assert rel(jfmm.direct(x, q, kernel=mine),
               np.asarray(jfmm.direct(x, q, kernel=kernels.Gaussian(1.7)))) < 1e-13
    sing = kernels.Radial(lambda r: 1 / r, singular=True)
    assert rel(jfmm.direct(x, q, kernel=sing), np.asarray(jfmm.direct(x, q))) < 1e-13
    assert isinstance(kernels.get("Thin_Plate_Spline"), kernels.ThinPlateSpline)
    assert jax.tree_util.tree_leaves(kernels.get("gaussian", epsilon=2.0)) == [2.0]
    with pytest.raises(ValueError, match="unknown kernel"):
        kernels.get("matern")
    with pytest.raises(ValueError, match=r"\(n, 2\)"):
        jfmm.direct(x, q, kernel=kernels.Laplace2D())


@pytest.mark.parametrize("name,param", [("gaussian", "epsilon"), ("yukawa", "kappa"),
                                        ("inverse_multiquadric", "epsilon")])
def test_grad_with_respect_to_kernel_parameter(name, param, rng):
    """d/d epsilon of a loss of the direct sum against central differences of
    the numpy formula."""
    x, q = points("cube", 200, rng), charges(200, rng)
    w = rng.normal(size=200)
    params, k, dk = FORMULAS[name]
    value = params[param]
    cls = type(kernels.get(name))
    loss = lambda v: jnp.sum(w * jfmm.direct(x, q, kernel=cls(v)))   # noqa: E731
    got = jax.grad(loss)(value)
    h = 1e-6

    r = np.sqrt(((x[:, None] - x[None]) ** 2).sum(-1))
    pos = r > 0
    rs = np.where(pos, r, 1.0)
    f = lambda v: w @ (np.where(pos, k(rs, v), 0.0 if name in SINGULAR else k(0.0, v)) @ q)  # noqa: E731
    fd = (f(value + h) - f(value - h)) / (2 * h)
    assert abs(float(got) - fd) < 1e-6 * abs(fd)


def test_kernel_classes_never_share_a_compiled_sum(rng):
    """Pytree structures of different kernel classes differ, so jit cannot
    reuse one kernel's executable for another (it did with register_dataclass)."""
    made = [kernels.get(name, **FORMULAS[name][0]) for name in sorted(FORMULAS)]
    structs = [jax.tree_util.tree_structure(k) for k in made]
    for i, a in enumerate(structs):
        for j, b in enumerate(structs):
            assert (a == b) == (i == j)
    x, q = points("cube", 50, rng), charges(50, rng)
    for name, kern in zip(sorted(FORMULAS), made):
        if 3 in kern.dims:
            assert rel(jfmm.direct(x, q, kernel=kern), numpy_sum(name, x, q, x)[0]) < 1e-12


@pytest.mark.parametrize("name", sorted(FORMULAS))
def test_closed_form_pair_terms_match_radial(name, rng):
    """Each kernel's `from_r2` (the near field's closed form) equals K(r)
    and K'(r) / r from `radial` and its autodiff, in float64 and float32,
    and its derivatives in r^2 and in the parameters too (the jnp near
    field is differentiated through it)."""
    kern = kernels.get(name, **FORMULAS[name][0])
    generic = super(type(kern), kern).from_r2            # Kernel.from_r2: sqrt and jvp
    for dtype, tol in ((jnp.float64, 1e-13), (jnp.float32, 3e-6)):
        r2 = jnp.asarray(rng.uniform(0.05, 3.0, 500) ** 2, dtype)
        for got, want in zip(kern.from_r2(r2, True), generic(r2, True)):
            assert got.dtype == dtype
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol)    # atol: zeros near r = 1
    r2 = jnp.asarray(rng.uniform(1e-2, 9.0, 50) ** 2)
    d = lambda f: jax.vmap(jax.grad(lambda s: f(s, True)[0] + f(s, True)[1]))(r2)  # noqa: E731
    np.testing.assert_allclose(d(kern.from_r2), d(generic), rtol=1e-10)
    leaves = jax.tree_util.tree_leaves(kern)
    if leaves:
        cls = type(kern)
        dp = lambda f: jax.grad(lambda v: jnp.sum(f(cls(v), r2)[0] + f(cls(v), r2)[1]))(leaves[0])  # noqa: E731
        np.testing.assert_allclose(dp(lambda k, s: k.from_r2(s, True)),
                                   dp(lambda k, s: super(cls, k).from_r2(s, True)), rtol=1e-10)


def test_float64_logarithm_against_numpy(rng):
    """The CPU's float64 logarithm of the pair loops (`kernels._log64`):
    within 3 ulp of numpy's over the normal range, at the mantissa's
    boundaries and powers of 2, inf as inf; its derivative 1 / x."""
    x = np.concatenate([10.0 ** rng.uniform(-307, 308, 200_000), rng.uniform(0.5, 2.0, 200_000),
                        1 + rng.uniform(-1e-6, 1e-6, 1000), 2.0 ** np.arange(-1022, 1024),
                        [np.sqrt(2), np.nextafter(np.sqrt(2), 2), np.nextafter(np.sqrt(2), 1),
                         np.finfo(np.float64).tiny, np.finfo(np.float64).max]])
    got = np.asarray(jax.jit(kernels._log64)(jnp.asarray(x)))
    want = np.log(x)
    assert np.all(np.abs(got - want) <= 3 * np.spacing(np.abs(want)) + 1e-300 * (want == 0))
    assert np.asarray(kernels._log64(jnp.asarray([np.inf])))[0] == np.inf
    unit = x[200_000:201_000]
    d = jax.vmap(jax.grad(kernels._log64))(jnp.asarray(unit))
    np.testing.assert_allclose(d, 1 / unit, rtol=1e-15)


def test_is_concrete_sees_tracers_in_parameters_and_closures():
    """Kernel.is_concrete: False where a parameter or a Radial fn's closure
    holds a tracer (inside jit), True otherwise; jfmm's own kernels answer
    from their parameters alone."""
    scale = 2.0
    assert kernels.get("gaussian", epsilon=1.5).is_concrete()
    assert kernels.Radial(lambda r: jnp.exp(-scale * r)).is_concrete()
    seen = []

    @jax.jit
    def f(eps):
        seen.append((kernels.Gaussian(epsilon=eps).is_concrete(),
                     kernels.Radial(lambda r: jnp.exp(-eps * r)).is_concrete(),
                     kernels.Laplace3D().is_concrete()))
        return eps

    f(1.0)
    assert seen == [(False, False, True)]


def test_a_radial_fn_closing_over_a_tracer_is_refused(rng):
    """A Radial fn that closes over a traced value raises a TypeError that
    says what to do, in fmm, plan and direct alike."""
    x = jnp.asarray(rng.random((50, 3)))
    q = jnp.asarray(rng.random(50) - 0.5)
    for call in (lambda k: jfmm.fmm(x, q, kernel=k, eps=1e-4), lambda k: jfmm.plan(x, kernel=k),
                 lambda k: jfmm.direct(x, q, kernel=k)):
        with pytest.raises(TypeError, match="closes over a traced value"):
            jax.jit(lambda e: call(kernels.Radial(lambda r: jnp.exp(-e * r))))(1.0)
