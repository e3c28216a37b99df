"""Reverse-mode derivatives of fmm() against autodiff of the direct sum."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import charges, points, reference, rel

import jfmm

# Agreement asserted at 10 * EPS: these tests check the transformation
# rules, which err by O(1) where wrong; one case checks eps = 1e-8.
EPS = 1e-4


def _loss(call, w):
    def f(x, q, y):
        return jnp.sum(w * call(x, q, y))
    return f


@functools.lru_cache(maxsize=None)
def _weighted_grads(separate: bool, eps: float):
    """Jitted grads of sum(w * fmm) and sum(w * direct) in the points and
    charges (and targets), kept so that point sets of one shape share them:
    under jit the configuration depends on shapes, not on the points."""
    argnums = (0, 1, 2) if separate else (0, 1)

    def loss(call):
        return lambda x, q, y, w: jnp.sum(w * call(x, q, y))

    fast = loss(lambda a, b, c: jfmm.fmm(a, b, c, eps=eps, leaf_size=8))
    exact = loss(lambda a, b, c: jfmm.direct(a, b, c))
    return jax.jit(jax.grad(fast, argnums)), jax.jit(jax.grad(exact, argnums))


@pytest.mark.parametrize("kind,separate,eps", [
    pytest.param("cube", True, 1e-8, marks=pytest.mark.optimized),   # p = 32: 14 s, not 26 s
    ("sphere", False, EPS), ("cluster", False, EPS),
    ("cluster", True, EPS)])
def test_grad_matches_direct_autodiff(kind, separate, eps, rng):
    n, m = 700, 300
    x, q = points(kind, n, rng), charges(n, rng)
    y = points(kind, m, rng) if separate else None
    w = jnp.asarray(rng.normal(size=m if separate else n))
    fast, exact = _weighted_grads(separate, eps)
    for a, b in zip(fast(x, q, y, w), exact(x, q, y, w)):
        assert np.isfinite(a).all()
        assert rel(a, np.asarray(b)) < 10 * eps


def test_forces_from_energy_match_gradient_output(rng):
    """-d/dx of E = 1/2 sum q phi(x) equals -q grad phi (targets = sources)."""
    x, q = points("cube", 600, rng), charges(600, rng)
    energy = lambda a: 0.5 * jnp.sum(q * jfmm.fmm(a, q, eps=EPS, leaf_size=8))  # noqa: E731
    forces = -jax.jit(jax.grad(energy))(x)
    _, grad = jfmm.fmm(x, q, eps=EPS, gradient=True, leaf_size=8)
    assert rel(forces, -q[:, None] * np.asarray(grad)) < 10 * EPS


def test_grad_finite_with_coincident_points(rng):
    """Coincident points (their pair skipped, as in the sum): the gradients
    of sum(w phi) are finite and match the float64 reference's,
    d/dx_m = w_m grad phi_q(x_m) + q_m grad phi_w(x_m) and d/dq_m = phi_w(x_m).
    (Finite differences of an eager FMM are not a reference here: a point
    crossing a leaf boundary between the two evaluations steps the value.)"""
    x, q = points("cube", 400, rng), charges(400, rng)
    x[:50] = x[50:100]
    w = rng.normal(size=400)
    f = _loss(lambda a, b, c: jfmm.fmm(a, b, eps=EPS, leaf_size=8), jnp.asarray(w))
    gx, gq = jax.jit(jax.grad(f, (0, 1)))(x, q, None)
    assert np.isfinite(gx).all() and np.isfinite(gq).all()
    (_, grad_q), (phi_w, grad_w) = reference(x, q), reference(x, w)
    assert rel(gx, w[:, None] * grad_q + q[:, None] * grad_w) < 10 * EPS
    assert rel(gq, phi_w) < 10 * EPS


@pytest.mark.parametrize("leaf_size", [None, 8])
def test_grad_finite_with_a_pair_closer_than_the_cube_root_of_max(leaf_size, rng):
    """A target 1e-104 from a source: 1/r^3 overflows float64 (r < 1.8e-103)
    while 1/r^2 does not. phi there is ~1e104, tanh saturates and the weight
    of that target in the adjoint sum is exactly 0, so its pair adds
    nothing to any gradient; an infinite pair factor times that 0 made NaN
    in the rows of both points (d/dx, d/dy). Reference: the float64 direct
    sum without target 0 (its weight is 0), d/dy_0 = 0."""
    n, m = 400, 200
    x, q, y = points("cube", n, rng), charges(n, rng), points("cube", m, rng)
    x[0], y[0] = 0.0, (1e-104, 0.0, 0.0)
    w = rng.normal(size=m)
    f = _loss(lambda a, b, c: jnp.tanh(jfmm.fmm(a, b, c, eps=EPS, leaf_size=leaf_size)),
              jnp.asarray(w))
    gx, gq, gy = jax.jit(jax.grad(f, (0, 1, 2)))(x, q, y)
    assert np.isfinite(gx).all() and np.isfinite(gq).all() and np.isfinite(gy).all()
    with np.errstate(over="ignore", invalid="ignore"):     # the pair's own 1/r^3
        phi, grad = reference(x, q, y)
    u = w * (1 - np.tanh(phi) ** 2)
    assert u[0] == 0
    phi_u, grad_u = reference(y[1:], u[1:], x)
    assert rel(gx, q[:, None] * grad_u) < 10 * EPS
    assert rel(gq, phi_u) < 10 * EPS
    assert np.all(np.asarray(gy)[0] == 0)
    assert rel(np.asarray(gy)[1:], u[1:, None] * grad[1:]) < 10 * EPS


def test_vmap_of_grad_over_charge_sets(rng):
    x, qs = points("cube", 300, rng), charges(300, rng, k=3).T
    g = jax.jit(jax.vmap(jax.grad(lambda q: jnp.sum(jfmm.fmm(x, q, eps=EPS, leaf_size=8) ** 2))))(qs)
    for k in range(3):
        want = jax.jit(jax.grad(lambda q: jnp.sum(jfmm.direct(x, q) ** 2)))(qs[k])
        assert rel(g[k], np.asarray(want)) < 10 * EPS


@pytest.mark.parametrize("kind,separate", [("sphere", True), ("cluster", False)])
def test_jvp_matches_direct(kind, separate, rng):
    """Forward mode with respect to every input at once."""
    n, m = 500, 200
    x, q = points(kind, n, rng), charges(n, rng)
    y = points(kind, m, rng) if separate else None
    primals = (x, q) + ((y,) if separate else ())
    tangents = tuple(rng.normal(size=a.shape) for a in primals)

    def call(f):
        return lambda *a: f(*a, eps=EPS, leaf_size=8) if f is jfmm.fmm else f(*a)

    got = jax.jit(lambda p, t: jax.jvp(call(jfmm.fmm), p, t))(primals, tangents)
    want = jax.jit(lambda p, t: jax.jvp(call(jfmm.direct), p, t))(primals, tangents)
    assert rel(got[0], np.asarray(want[0])) < EPS
    assert rel(got[1], np.asarray(want[1])) < 10 * EPS


def test_jacfwd_and_jacrev_small(rng):
    n = 50
    x, q = points("cube", n, rng), charges(n, rng)
    f = lambda a, b: jfmm.fmm(a, b, eps=EPS, leaf_size=2)    # noqa: E731 (depth 2)
    g = lambda a, b: jfmm.direct(a, b)                        # noqa: E731
    for jac in (jax.jacfwd, jax.jacrev):
        got = jax.jit(jac(f, (0, 1)))(x, q)
        want = jax.jit(jac(g, (0, 1)))(x, q)
        for a, b in zip(got, want):
            assert rel(a, np.asarray(b)) < 10 * EPS


def test_hessian_vector_product_of_energy(rng):
    """Forward-over-reverse: d/dt grad E(x + t v), E = 1/2 sum q phi(x)
    (clustered points; the uniform cube is in the other derivative tests)."""
    x, q = points("cluster", 400, rng), charges(400, rng)
    v = rng.normal(size=x.shape)

    def hvp(phi):
        energy = lambda a: 0.5 * jnp.sum(q * phi(a))   # noqa: E731
        return jax.jvp(jax.grad(energy), (x,), (v,))[1]

    got = jax.jit(lambda: hvp(lambda a: jfmm.fmm(a, q, eps=EPS, leaf_size=8)))()
    want = jax.jit(lambda: hvp(lambda a: jfmm.direct(a, q)))()
    assert np.isfinite(got).all()
    assert rel(got, np.asarray(want)) < 100 * EPS


@pytest.mark.parametrize("mode", ["jnp", "interpret"])
def test_second_derivatives_along_targets(mode, rng, monkeypatch):
    """The gradient output's derivative along per-target moves: near field
    from the kernel's Hessian terms (the Pallas kernel in interpret mode),
    far field from the L2P in forward mode, against numpy closed forms of
    1/r's Hessian (pairs at distance 0 left out)."""
    from jfmm.ops import backend
    monkeypatch.setattr(backend, "_mode", mode)
    x, q = points("cluster", 300, rng), charges(300, rng)
    y, v = rng.random((120, 3)), rng.standard_normal((120, 3))
    got = jax.jvp(lambda t: jfmm.fmm(x, q, t, eps=1e-6, gradient=True, leaf_size=4)[1],
                  (y,), (v,))[1]
    d = y[:, None] - x[None]
    r2 = (d * d).sum(-1)
    hv = -v[:, None] * r2[..., None] ** -1.5 + 3 * d * (d * v[:, None]).sum(-1, keepdims=True) \
        * r2[..., None] ** -2.5
    assert rel(got, np.einsum("mnj,n->mj", hv, q)) < 1e-5


def test_grad_through_gradient_output(rng):
    """Reverse mode through the field: loss of grad phi (needs Hessians),
    with respect to sources, charges and separate targets."""
    n, m = 400, 150
    x, q = points("sphere", n, rng), charges(n, rng)
    y = points("cube", m, rng)
    w = jnp.asarray(rng.normal(size=(m, 3)))

    def loss(f):
        return lambda a, b, c: jnp.sum(w * f(a, b, c)[1])

    fast = loss(lambda a, b, c: jfmm.fmm(a, b, c, eps=EPS, gradient=True, leaf_size=8))
    exact = loss(lambda a, b, c: jfmm.direct(a, b, c, gradient=True))
    argnums = (0, 1, 2)
    for a, b in zip(jax.jit(jax.grad(fast, argnums))(x, q, y),
                    jax.jit(jax.grad(exact, argnums))(x, q, y)):
        assert rel(a, np.asarray(b)) < 100 * EPS


def test_plan_apply_gradients(rng):
    """Plan.apply: grad in the charges with a fixed plan, and in the points
    when the plan is built inside the differentiated function."""
    x, q = points("sphere", 500, rng), charges(500, rng)
    w = jnp.asarray(rng.normal(size=500))
    pl = jfmm.plan(x, eps=EPS, leaf_size=8)
    got = jax.grad(lambda b: jnp.sum(w * pl.apply(b)))(q)           # eager: top level
    want = jax.jit(jax.grad(lambda b: jnp.sum(w * jfmm.direct(x, b))))(q)
    assert rel(got, np.asarray(want)) < 10 * EPS
    got = jax.jit(jax.grad(lambda a: jnp.sum(w * jfmm.plan(a, eps=EPS, leaf_size=8).apply(q))))(x)
    want = jax.jit(jax.grad(lambda a: jnp.sum(w * jfmm.direct(a, q))))(x)
    assert rel(got, np.asarray(want)) < 10 * EPS


def test_vmap_over_point_sets_equals_loop(rng):
    """vmap over point sets equals the same traced call on each set (eager
    calls may choose lower orders for crowded points: `configure.on_uniform`)."""
    xs = np.stack([points(k, 300, rng) for k in ("cube", "sphere", "cluster")])
    qs = np.stack([charges(300, rng) for _ in range(3)])
    f = lambda a, b: jfmm.fmm(a, b, eps=EPS, leaf_size=8, gradient=True)   # noqa: E731
    phi, grad = jax.jit(jax.vmap(f))(xs, qs)
    dx = jax.jit(jax.vmap(jax.grad(lambda a, b: jnp.sum(f(a, b)[0] ** 2))))(xs, qs)
    want = jax.jit(jax.vmap(jax.grad(lambda a, b: jnp.sum(jfmm.direct(a, b) ** 2))))(xs, qs)
    for i in range(3):
        p1, g1 = jax.jit(f)(xs[i], qs[i])
        np.testing.assert_allclose(phi[i], p1, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(grad[i], g1, rtol=1e-10, atol=1e-10)
        assert rel(dx[i], np.asarray(want[i])) < 10 * EPS
