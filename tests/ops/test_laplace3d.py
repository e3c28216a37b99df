"""3D Laplace operators against direct evaluation, one at a time."""
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import charges, rel

from jfmm.ops import laplace3d as L, translate
from jfmm.tree import lists
from jfmm.models import laplace3d as M

OFFS = lists.m2l_offsets(3)


def _direct(y, x, q):
    diff = y[:, None, :] - x[None, :, :]
    r = np.linalg.norm(diff, axis=-1)
    return (q[None, :] / r).sum(1), -(q[None, :, None] * diff / r[..., None] ** 3).sum(1)


def _legendre(n, m, c):
    """P_n^m(c), m >= 0, without the Condon-Shortley phase (explicit sum)."""
    s = np.sqrt(1 - c * c)
    tot = 0.0
    for k in range((n - m) // 2 + 1):
        tot = tot + ((-1) ** k * math.factorial(2 * n - 2 * k)
                     / (2 ** n * math.factorial(k) * math.factorial(n - k)
                        * math.factorial(n - 2 * k - m)) * c ** (n - 2 * k - m))
    return s ** m * tot


def test_harmonics_match_spherical_definition(rng):
    """Recurrences against Y = (-i)^m r^n P_n^m e^{im phi}/(n+m)! and
    T = (-i)^m (n-m)! P_n^m e^{im phi} / r^(n+1)."""
    p = 7
    x = rng.normal(size=(20, 3))
    r = np.linalg.norm(x, axis=1)
    c, ph = x[:, 2] / r, np.arctan2(x[:, 1], x[:, 0])
    y, t = np.asarray(L.regular(jnp.asarray(x), p)), np.asarray(L.irregular(jnp.asarray(x), p))
    for n in range(p):
        for m in range(n + 1):
            base = (-1j) ** m * _legendre(n, m, c) * np.exp(1j * m * ph)
            ye = r ** n * base / math.factorial(n + m)
            te = math.factorial(n - m) * base / r ** (n + 1)
            i = n * n + (0 if m == 0 else 2 * m - 1)
            np.testing.assert_allclose(y[:, i], ye.real, rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(t[:, i], te.real, rtol=1e-10, atol=1e-12)
            if m:
                np.testing.assert_allclose(y[:, i + 1], ye.imag, rtol=1e-10, atol=1e-12)
                np.testing.assert_allclose(t[:, i + 1], te.imag, rtol=1e-10, atol=1e-12)


def _box(rng, n, centre, side):
    return centre + (rng.random((n, 3)) - 0.5) * side


def test_root_multipole_far_field(rng):
    """P2M then M2P far away reproduces the direct sum; error falls with p."""
    x = _box(rng, 200, np.zeros(3), 1.0)
    q = charges(200, rng)
    y = rng.normal(size=(50, 3))
    y = 4 * y / np.linalg.norm(y, axis=1, keepdims=True)
    ref, _ = _direct(y, x, q)
    errs = []
    for p in (4, 8, 16):
        m = L.p2m(jnp.asarray(x), jnp.asarray(q)[:, None], p).sum(0)
        phi = L.m2p(jnp.asarray(y), jnp.broadcast_to(m, (50,) + m.shape), 1.0, p)[:, 0]
        errs.append(rel(phi, ref))
    assert errs[0] > errs[1] > errs[2]
    assert errs[2] < 1e-9


def test_m2m_and_l2l_exact(rng):
    """M2M of child multipoles equals P2M at the parent; L2L leaves the field
    of a local expansion unchanged (both exact to rounding)."""
    p = 10
    ops = L.operators(p, OFFS, jnp.float64)
    bits = lists.child_bits(3)
    p2m = jax.jit(L.p2m, static_argnums=2)        # compiled once, not op by op
    l2p = jax.jit(L.l2p, static_argnums=(3, 4))
    for c in range(8):
        zc = (bits[c] - 0.5) / 2  # parent of side 1 at the origin
        x = _box(rng, 40, zc, 0.5)
        q = jnp.asarray(charges(40, rng))[:, None]
        mc = p2m(jnp.asarray((x - zc) / 0.5), q, p).sum(0)
        mp = p2m(jnp.asarray(x), q, p).sum(0)
        np.testing.assert_allclose(mc @ ops.m2m[c].T, mp, atol=1e-13)
        loc = jnp.asarray(rng.normal(size=(1, p * p)))
        lc = loc @ ops.l2l[c].T
        y = _box(rng, 30, zc, 0.5)
        phi_p, _ = l2p(jnp.asarray(y), jnp.broadcast_to(loc, (30, 1, 1, p * p)), 1.0, p, False)
        phi_c, _ = l2p(jnp.asarray((y - zc) / 0.5), jnp.broadcast_to(lc, (30, 1, 1, p * p)),
                         0.5, p, False)
        np.testing.assert_allclose(phi_c, phi_p, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("which", [0, 150, 315])
def test_m2l_error_falls_with_p(which, rng):
    """One source box to one target box through P2M, M2L, L2P (potential and
    gradient), for the nearest, a middle and a far offset."""
    h = 0.25
    x = _box(rng, 100, np.zeros(3), h)
    q = charges(100, rng)
    w = -OFFS[which] * h  # target centre; source centre is the origin
    y = _box(rng, 40, w, h)
    ref, gref = _direct(y, x, q)

    @functools.partial(jax.jit, static_argnums=0)    # one compile per p, not per op
    def one(p, u, q, v):
        ops = L.operators(p, OFFS, jnp.float64)
        loc = L.p2m(u, q[:, None], p).sum(0) @ ops.m2l[which].T
        coef = L.l2p_coefficients(loc[None], p, True)[0]
        return L.l2p(v, jnp.broadcast_to(coef, (40,) + coef.shape), h, p, True)

    errs = []
    for p in (4, 8, 12, 16):
        phi, grad = one(p, jnp.asarray(x / h), jnp.asarray(q), jnp.asarray((y - w) / h))
        errs.append((rel(phi[:, 0], ref), rel(grad[:, 0], gref)))
    for (e0, g0), (e1, g1) in zip(errs, errs[1:]):
        assert e1 < 0.5 * e0 and g1 < 0.5 * g0
    bound = 0.764 ** 16 * 10  # worst-case M2L convergence rate (REFERENCES.md)
    assert errs[-1][0] < bound and errs[-1][1] < 10 * bound


def test_zero_operator_slot_is_zero():
    ops = L.operators(3, OFFS, jnp.float32)
    assert ops.m2l.shape == (317, 9, 9)
    assert float(jnp.abs(ops.m2l[-1]).max()) == 0.0
    assert ops.m2l.dtype == jnp.float32


def test_order_rule():
    assert M.order_for_eps(1e-3, jnp.float32) < M.order_for_eps(1e-5, jnp.float32)
    assert M.order_for_eps(1e-10, jnp.float64) > M.order_for_eps(1e-5, jnp.float64)
    with pytest.raises(ValueError, match="float32"):
        M.order_for_eps(1e-9, jnp.float32)
    with pytest.raises(ValueError):
        M.order_for_eps(1e-16, jnp.float64)


@pytest.mark.parametrize("budget,stored", [(2 ** 16, True), (1, True), (1, False)],
                         ids=["chunked", "loop", "loop-unstored"])
def test_m2l_formulations_agree(budget, stored, rng, monkeypatch):
    """The gathered M2L, chunked over parents or looping over neighbour
    positions (when memory is short), with stored matrices or matrices
    built per position from the offsets' harmonics (high orders), gives the
    same locals."""
    p, level = 4, 3
    ops = L.operators(p, lists.m2l_offsets(3), jnp.float64)
    mult = jnp.asarray(rng.normal(size=(8 ** level, 2, p * p)))
    want = translate.m2l(mult, level, ops.m2l, 3)
    monkeypatch.setattr(translate, "GATHER_BYTES", budget)
    if not stored:
        monkeypatch.setattr(L, "STORED_M2L_BYTES", {"cpu": 0, "gpu": 0})
        ops = L.operators(p, lists.m2l_offsets(3), jnp.float64)
        assert isinstance(ops.m2l, L.M2LFromHarmonics)
    assert rel(translate.m2l(mult, level, ops.m2l, 3), want) < 1e-14
