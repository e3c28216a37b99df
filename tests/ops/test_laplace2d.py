"""2D Laplace (-log r) series operators against the direct sum, one at a time,
then the whole FMM through jfmm.passes."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import charges, points, rel

import jfmm
from jfmm import kernels, passes
from jfmm.configure import Config
from jfmm.models import laplace2d as model
from jfmm.ops import laplace2d as L
from jfmm.tree import build as build_tree, lists

OFFS = lists.m2l_offsets(2)
KERNEL = kernels.Laplace2D()


def _direct(y, x, q):
    """phi (M,) and grad (M, 2) of sum_i -q_i log|y - x_i|, numpy float64."""
    diff = y[:, None, :] - x[None, :, :]
    r2 = (diff * diff).sum(-1)
    return -0.5 * (q * np.log(r2)).sum(1), -(q[None, :, None] * diff / r2[..., None]).sum(1)


def _box(rng, n, centre, side):
    return centre + (rng.random((n, 2)) - 0.5) * side


def _offset_index(o):
    return int(np.flatnonzero((OFFS == np.asarray(o)).all(axis=1))[0])


def _at_targets(coef, m):
    """One box's coefficient sets (K, E, P) gathered for m targets."""
    return jnp.broadcast_to(coef, (m,) + coef.shape)


def _m2l_then_l2p(x, q, y, src_centre, tgt_centre, h, p, ops):
    """Sources of one box -> P2M -> M2L (side h) -> L2P at targets y."""
    o = _offset_index(np.rint((src_centre - tgt_centre) / h).astype(int))
    m = L.p2m(jnp.asarray((x - src_centre) / h), jnp.asarray(q)[:, None], p).sum(0)
    loc = m @ L.m2l_matrices(ops, KERNEL, jnp.asarray(h), p)[o].T
    coef = L.l2p_coefficients(loc[None], p, True)[0]
    return L.l2p(jnp.asarray((y - tgt_centre) / h), _at_targets(coef, len(y)), h, p, True)


@pytest.mark.parametrize("side", [1e-3, 1.0, 1e3])
def test_root_multipole_far_field(side, rng):
    """P2M then M2P far away reproduces the direct sum (log-side term
    included); the error falls with p."""
    c = np.array([0.3, -0.2]) * side
    x, q = _box(rng, 100, c, side), charges(100, rng)
    a = rng.random(40) * 2 * np.pi
    y = c + 3 * side * np.stack([np.cos(a), np.sin(a)], axis=1)
    ref, _ = _direct(y, x, q)
    errs = []
    for p in (4, 12, 24):
        m = L.p2m(jnp.asarray((x - c) / side), jnp.asarray(q)[:, None], p).sum(0)
        phi = L.m2p(jnp.asarray((y - c) / side), _at_targets(m, 40), side, p)[:, 0]
        errs.append(rel(phi, ref))
    assert errs[0] > errs[1] > errs[2]
    assert errs[2] < 1e-12


def test_m2m_and_l2l_exact(rng):
    """M2M of a child's multipole equals P2M at the parent; L2L leaves the
    potential and gradient of a local expansion unchanged (exact to rounding)."""
    p = 12
    ops = L.operators(p, OFFS, jnp.float64)
    for c, bits in enumerate(lists.child_bits(2)):
        zc = (bits - 0.5) / 2  # parent of side 1 at the origin
        x = _box(rng, 100, zc, 0.5)
        q = jnp.asarray(charges(100, rng))[:, None]
        mc = L.p2m(jnp.asarray((x - zc) / 0.5), q, p).sum(0)
        mp = L.p2m(jnp.asarray(x), q, p).sum(0)
        np.testing.assert_allclose(mc @ ops.m2m[c].T, mp, atol=1e-14)
        loc = jnp.asarray(rng.normal(size=(1, 2 * p))).at[:, 1].set(0.0)
        lc = loc @ ops.l2l[c].T
        y = _box(rng, 40, zc, 0.5)
        pp, gp = L.l2p(jnp.asarray(y), _at_targets(L.l2p_coefficients(loc[None], p, True)[0], 40),
                       1.0, p, True)
        pc, gc = L.l2p(jnp.asarray((y - zc) / 0.5),
                       _at_targets(L.l2p_coefficients(lc[None], p, True)[0], 40), 0.5, p, True)
        np.testing.assert_allclose(pc, pp, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(gc, gp, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("offset", [(2, 0), (-2, 1), (2, -2), (3, -3), (-1, 3)])
def test_m2l_error_falls_with_p(offset, rng):
    """One source box to one target box through P2M, M2L and L2P (potential
    and gradient) at several offsets; the error falls with p."""
    h = 0.25
    x, q = _box(rng, 100, np.zeros(2), h), charges(100, rng)
    w = -np.asarray(offset) * h            # offsets are source minus target
    y = _box(rng, 40, w, h)
    ref, gref = _direct(y, x, q)
    errs = []
    for p in (4, 12, 24):
        phi, grad = _m2l_then_l2p(x, q, y, np.zeros(2), w, h, p, L.operators(p, OFFS, jnp.float64))
        errs.append((rel(phi[:, 0], ref), rel(grad[:, 0], gref)))
    for (e0, g0), (e1, g1) in zip(errs, errs[1:]):   # until rounding
        assert e1 < max(0.5 * e0, 1e-13) and g1 < max(0.5 * g0, 1e-12)
    # The nearest offset measured 1.5e-11 and 1.0e-9 (worst of 10 draws).
    assert errs[-1][0] < 1e-9 and errs[-1][1] < 1e-7


@pytest.mark.parametrize("side", [1e-3, 1e3])
def test_m2l_matrices_carry_the_level(side, rng):
    """-log is not scale invariant: boxes of side 1e-3 and 1e3 need the
    log(side) term of m2l_matrices. Its matrices differ from ops.m2l only in
    the monopole -> constant entry, and the zero slot stays zero."""
    p = 24
    ops = L.operators(p, OFFS, jnp.float64)
    mats = jax.jit(L.m2l_matrices, static_argnums=3)(ops, KERNEL, jnp.asarray(side), p)
    diff = np.array(mats - ops.m2l)
    np.testing.assert_allclose(diff[:-1, 0, 0], -np.log(side), rtol=1e-14)
    diff[:, 0, 0] = 0.0
    assert not diff.any() and not np.asarray(mats[-1]).any()
    x, q = _box(rng, 100, np.zeros(2), side), charges(100, rng)
    w = np.array([-2.0, 1.0]) * side
    y = _box(rng, 40, w, side)
    ref, gref = _direct(y, x, q)
    phi, grad = _m2l_then_l2p(x, q, y, np.zeros(2), w, side, p, ops)
    assert rel(phi[:, 0], ref) < 1e-10 and rel(grad[:, 0], gref) < 1e-9


def test_l2p_gradient_is_the_derivative(rng):
    """The gradient sets (Re f', -Im f') / h equal jax.grad of the potential."""
    p, h = 12, 0.3
    loc = jnp.asarray(rng.normal(size=(1, 2, 2 * p))).at[..., 1].set(0.0)
    u = jnp.asarray(rng.random((40, 2)) - 0.5)
    _, grad = L.l2p(u, L.l2p_coefficients(loc, p, True)[jnp.zeros(40, int)], h, p, True)

    def phi(ui):
        return L.l2p(ui[None] / h, L.l2p_coefficients(loc, p, False), h, p, False)[0][0]

    auto = jax.vmap(jax.jacfwd(phi))(u * h)                    # d/dy, y = u h
    np.testing.assert_allclose(grad, auto, rtol=1e-12, atol=1e-12)


def test_one_leaf_through_every_operator(rng):
    """Sources of one child box -> P2M -> M2M -> M2L between parents -> L2L
    -> L2P at targets in one child of the target parent, box side 5e-2."""
    p, side = 24, 5e-2                       # parents of side 2 * side
    ops = L.operators(p, OFFS, jnp.float64)
    bits = lists.child_bits(2)
    src_parent, tgt_parent = np.zeros(2), np.array([3.0, -2.0]) * 2 * side
    src_child = src_parent + (bits[1] - 0.5) / 2 * 2 * side
    tgt_child = tgt_parent + (bits[2] - 0.5) / 2 * 2 * side
    x, q = _box(rng, 100, src_child, side), charges(100, rng)
    y = _box(rng, 40, tgt_child, side)
    m = L.p2m(jnp.asarray((x - src_child) / side), jnp.asarray(q)[:, None], p).sum(0)
    m = m @ ops.m2m[1].T
    o = _offset_index(np.rint((src_parent - tgt_parent) / (2 * side)).astype(int))
    loc = m @ L.m2l_matrices(ops, KERNEL, jnp.asarray(2 * side), p)[o].T
    loc = loc @ ops.l2l[2].T
    coef = L.l2p_coefficients(loc[None], p, True)[0]
    phi, grad = L.l2p(jnp.asarray((y - tgt_child) / side), _at_targets(coef, 40), side, p, True)
    ref, gref = _direct(y, x, q)
    assert rel(phi[:, 0], ref) < 1e-12 and rel(grad[:, 0], gref) < 1e-11


def test_shapes_dtypes_and_zero_slots(rng):
    p = 6
    ops = L.operators(p, OFFS, jnp.float32)
    assert ops.m2m.shape == ops.l2l.shape == (4, 2 * p, 2 * p)
    assert ops.m2l.shape == (len(OFFS) + 1, 2 * p, 2 * p) == (41, 12, 12)
    assert all(a.dtype == jnp.float32 for a in ops)
    assert not np.asarray(ops.m2l[-1]).any()
    # Slot 1 (Im of degree 0) is never written.
    assert not np.asarray(ops.m2m[:, 1]).any() and not np.asarray(ops.m2l[:, 1]).any()
    assert not np.asarray(ops.l2l[:, 1]).any()
    u = jnp.asarray(rng.random((5, 2)) - 0.5, jnp.float32)
    mp = L.p2m(u, jnp.ones((5, 3), jnp.float32), p)
    assert mp.shape == (5, 3, 2 * p) and mp.dtype == jnp.float32 and not mp[..., 1].any()
    coef = L.l2p_coefficients(jnp.ones((2, 3, 2 * p), jnp.float32), p, True)
    assert coef.shape == (2, 3, 3, 2 * p) and coef.dtype == jnp.float32
    phi, grad = L.l2p(u, coef[jnp.zeros(5, int)], jnp.float32(0.5), p, True)
    assert phi.shape == (5, 3) and grad.shape == (5, 3, 2)
    assert phi.dtype == grad.dtype == jnp.float32
    mats = L.m2l_matrices(ops, KERNEL, jnp.float32(1e-3), p)
    assert mats.dtype == jnp.float32


def test_order_rule():
    assert model.order_for_eps(1e-3, jnp.float32) < model.order_for_eps(1e-5, jnp.float32)
    assert model.order_for_eps(1e-10, jnp.float64) > model.order_for_eps(1e-5, jnp.float64)
    floor = model.GRADIENT_EPS_FLOOR["float64"]
    assert model.order_for_eps(floor, jnp.float64, gradient=True) == model.MAX_ORDER
    assert model.order_for_eps(floor, jnp.float64) < model.MAX_ORDER     # phi alone: lower
    with pytest.raises(ValueError, match="gradients"):
        model.order_for_eps(model.EPS_FLOOR["float64"], jnp.float64, gradient=True)
    assert all(model._error_bound(p) > model._error_bound(p + 1) for p in model.ORDERS[:-1])
    with pytest.raises(ValueError, match="float32"):
        model.order_for_eps(1e-9, jnp.float32)
    with pytest.raises(ValueError, match="float64"):
        model.order_for_eps(1e-16, jnp.float64)
    assert model.leaf_size(4) >= 32 and model.leaf_size(model.MAX_ORDER) >= model.leaf_size(4)


# ------------------------------------------------------------------ whole FMM

@functools.partial(jax.jit, static_argnames=("p", "depth"))
def _fmm(x, q, y, p, depth):
    tree = build_tree(x, y, depth)
    config = Config(L, p, depth, 0.0)
    return passes.evaluate(tree, q[:, None], KERNEL, config, config.operators(2, x.dtype), True,
                           "jnp")


def _check_fmm(x, q, y, eps, dtype):
    """FMM in dtype against jfmm.direct in float64 on the rounded inputs."""
    x, q = np.asarray(x, dtype), np.asarray(q, dtype)
    y = None if y is None else np.asarray(y, dtype)
    p = model.order_for_eps(eps, dtype, (len(x) * (len(x) if y is None else len(y))) ** 0.5,
                            gradient=True)
    phi, grad = _fmm(jnp.asarray(x), jnp.asarray(q), None if y is None else jnp.asarray(y),
                     p=p, depth=3)
    assert phi.dtype == grad.dtype == dtype
    ref, gref = jfmm.direct(x.astype(np.float64), q.astype(np.float64),
                            None if y is None else y.astype(np.float64), kernel=KERNEL,
                            gradient=True)
    assert rel(phi[:, 0], ref) <= eps, rel(phi[:, 0], ref)
    assert rel(grad[:, 0], gref) <= eps, rel(grad[:, 0], gref)


N, M = 1200, 500


@pytest.mark.parametrize("separate", [False, True], ids=["same", "separate"])
@pytest.mark.parametrize("kind", ["cube", "cluster", "sphere"])
def test_fmm_float64(kind, separate, rng):
    x, q = points(kind, N, rng, 2), charges(N, rng)
    y = points("cube", M, rng, 2) * 1.5 - 0.25 if separate else None  # partly outside
    _check_fmm(x, q, y, 1e-10, np.float64)


@pytest.mark.parametrize("scale", [1e-3, 1e3])
def test_fmm_far_from_unit_scale(scale, rng):
    """Points in [0, 1e-3]^2 and [0, 1e3]^2: the level term of M2L at work."""
    x, q = points("cube", N, rng, 2) * scale, charges(N, rng)
    _check_fmm(x, q, None, 1e-10, np.float64)


@pytest.mark.parametrize("kind", ["cube", "cluster", "sphere"])
def test_fmm_float32(kind, rng):
    x, q = points(kind, N, rng, 2), charges(N, rng)
    _check_fmm(x, q, None, 1e-5, np.float32)
