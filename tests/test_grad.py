"""Reverse-mode derivatives of fmm() against autodiff of the direct sum."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import charges, points, rel

import jfmm

EPS = 1e-7     # agreement asserted at 10 * EPS; one case checks eps = 1e-10


def _loss(call, w):
    def f(x, q, y):
        return jnp.sum(w * call(x, q, y))
    return f


@pytest.mark.parametrize("kind,separate,eps", [
    ("cube", False, EPS), ("cube", True, 1e-10), ("sphere", False, EPS),
    ("sphere", True, EPS), ("cluster", False, EPS), ("cluster", True, EPS)])
def test_grad_matches_direct_autodiff(kind, separate, eps, rng):
    n, m = 700, 300
    x, q = points(kind, n, rng), charges(n, rng)
    y = points(kind, m, rng) if separate else None
    w = jnp.asarray(rng.normal(size=m if separate else n))
    fast = _loss(lambda a, b, c: jfmm.fmm(a, b, c, eps=eps, leaf_size=8), w)
    exact = _loss(lambda a, b, c: jfmm.direct(a, b, c), w)
    argnums = (0, 1, 2) if separate else (0, 1)
    got = jax.grad(fast, argnums)(x, q, y)
    want = jax.grad(exact, argnums)(x, q, y)
    for a, b in zip(got, want):
        assert np.isfinite(a).all()
        assert rel(a, np.asarray(b)) < 10 * eps


def test_forces_from_energy_match_gradient_output(rng):
    """-d/dx of E = 1/2 sum q phi(x) equals -q grad phi (targets = sources)."""
    x, q = points("cube", 600, rng), charges(600, rng)
    energy = lambda a: 0.5 * jnp.sum(q * jfmm.fmm(a, q, eps=EPS, leaf_size=8))  # noqa: E731
    forces = -jax.jit(jax.grad(energy))(x)
    _, grad = jfmm.fmm(x, q, eps=EPS, gradient=True, leaf_size=8)
    assert rel(forces, -q[:, None] * np.asarray(grad)) < 10 * EPS


def test_grad_finite_with_coincident_points_and_finite_differences(rng):
    x, q = points("cube", 400, rng), charges(400, rng)
    x[:50] = x[50:100]
    w = jnp.asarray(rng.normal(size=400))
    f = _loss(lambda a, b, c: jfmm.fmm(a, b, eps=EPS, leaf_size=8), w)
    gx, gq = jax.grad(f, (0, 1))(x, q, None)
    assert np.isfinite(gx).all() and np.isfinite(gq).all()
    d = rng.normal(size=x.shape)
    h = 1e-6
    fd = (f(x + h * d, q, None) - f(x - h * d, q, None)) / (2 * h)
    assert abs(float(fd) - float(jnp.sum(gx * d))) < 1e-5 * abs(float(fd))


def test_vmap_of_grad_over_charge_sets(rng):
    x, qs = points("cube", 300, rng), charges(300, rng, k=3).T
    g = jax.vmap(jax.grad(lambda q: jnp.sum(jfmm.fmm(x, q, eps=EPS, leaf_size=8) ** 2)))(qs)
    for k in range(3):
        want = jax.grad(lambda q: jnp.sum(jfmm.direct(x, q) ** 2))(qs[k])
        assert rel(g[k], np.asarray(want)) < 10 * EPS
