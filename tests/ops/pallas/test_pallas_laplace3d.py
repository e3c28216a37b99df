"""The Pallas P2M and L2P kernels (interpret mode) against the jnp operators."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import charges, points, rel

from jfmm.ops import backend, laplace3d as L
from jfmm.ops.pallas import laplace3d as pallas_laplace3d
from jfmm.tree import build


def test_regular_stream_matches_regular(rng):
    x = rng.normal(size=(40, 3))
    for p in (1, 2, 9):
        want = np.asarray(L.regular(jnp.asarray(x), p))
        got = np.full_like(want, np.nan)
        for j, y in L.regular_stream(x[:, 0], x[:, 1], x[:, 2], p):
            got[:, j] = y
        assert rel(got, want) < 1e-14


@pytest.mark.parametrize("kind,n_src,n_tgt,k,p,gradient,dtype,rolled", [
    ("cluster", 301, 97, 1, 6, True, np.float64, False),   # crowded leaves, many empty
    ("cube", 77, 203, 2, 5, True, np.float32, False),      # odd sizes, two charge vectors
    ("sphere", 150, 150, 1, 4, False, np.float64, False),
    ("cluster", 301, 97, 2, 6, True, np.float64, True),    # the loops of high orders
])
def test_p2m_l2p_match_jnp(kind, n_src, n_tgt, k, p, gradient, dtype, rolled, rng,
                           monkeypatch):
    if rolled:
        monkeypatch.setattr(pallas_laplace3d, "UNROLLED_MAX", 2)
    x = points(kind, n_src, rng)
    y = points(kind, n_tgt, rng)
    t = build(jnp.asarray(x, dtype), jnp.asarray(y, dtype), 2)
    q = jnp.asarray(charges(n_src, rng, k), dtype)[t.src_perm]
    h = t.box_side(t.depth)
    u = (t.src_sorted - t.leaf_centers(t.src_leaf)) / h
    # clustered: the tiles in steps of two leaves' worth (`tiles.in_steps`)
    leaves = 2 if kind == "cluster" else None
    args = (L, u, q, t.src_start, t.src_leaf, p)
    want, got = backend.p2m(*args, "jnp"), backend.p2m(*args, "interpret", leaves)
    assert got.dtype == dtype and got.shape == want.shape
    tol = 1e-13 if dtype == np.float64 else 1e-5
    assert rel(got, want) < tol

    loc = jnp.asarray(rng.normal(size=(t.n_leaves, k, p * p)), dtype)
    v = (t.tgt_sorted - t.leaf_centers(t.tgt_leaf)) / h
    if kind == "cube":          # the L2P in steps of 5 tiles, the tiles' leaves gathered per step
        monkeypatch.setattr(backend, "L2P_VALUES", 5 * k * (1 + 3 * gradient) * p * p)
    if kind == "sphere":        # one side per leaf, as adaptive trees pass them
        h = jnp.asarray(h * (1 + rng.random(t.n_leaves)), dtype)
    args = (L, v, loc, t.tgt_start, t.tgt_leaf, h, p, gradient)
    want, got = backend.l2p(*args, "jnp"), backend.l2p(*args, "interpret", leaves)
    assert got[0].shape == want[0].shape and rel(got[0], want[0]) < tol
    if gradient:
        assert got[1].shape == want[1].shape and rel(got[1], want[1]) < tol
    else:
        assert got[1] is None


def test_p2m_tiles_grow_with_the_leaves(rng):
    """Leaves of hundreds of points take P2M tiles of 128 (`p2m_tile`),
    clustered ones spanning many tiles, some one or none; against the jnp
    P2M, unrolled and rolled (high orders) alike."""
    x = points("cluster", 2100, rng)
    t = build(jnp.asarray(x), None, 1)
    assert pallas_laplace3d.p2m_tile(2100, t.n_leaves) == 128
    assert pallas_laplace3d.p2m_tile(2100, 64) == pallas_laplace3d.TILE
    q = jnp.asarray(charges(2100, rng, 2))[t.src_perm]
    u = (t.src_sorted - t.leaf_centers(t.src_leaf)) / t.box_side(t.depth)
    for p in (5, pallas_laplace3d.UNROLLED_MAX + 1):
        args = (L, u, q, t.src_start, t.src_leaf, p)
        assert rel(backend.p2m(*args, "interpret"), backend.p2m(*args, "jnp")) < 1e-13


@pytest.mark.parametrize("dtype,p", [("float32", 6), ("float64", 6), ("float64", 18)])
def test_p2m_l2p_lower_to_triton(dtype, p):
    """The Pallas P2M and L2P lower for the cuda platform (checked on the
    CPU), unrolled and (p = 18) in loops."""
    with jax.enable_x64(dtype == "float64"):
        t = build(jnp.zeros((64, 3), dtype) + jnp.linspace(0, 1, 64, dtype=dtype)[:, None],
                  None, 2)
        u = jnp.zeros((64, 3), dtype)
        q = jnp.zeros((64, 1), dtype)
        loc = jnp.zeros((t.n_leaves, 1, p * p), dtype)
        up = jax.jit(lambda a, c: backend.p2m(L, a, c, t.src_start, t.src_leaf, p, "pallas"))
        up.trace(u, q).lower(lowering_platforms=("cuda",))
        ev = jax.jit(lambda a, c: backend.l2p(L, a, c, t.tgt_start, t.tgt_leaf, 0.25, p,
                                              True, "pallas"))
        text = ev.trace(u, loc).lower(lowering_platforms=("cuda",)).as_text()
        assert ("fma.rn.f64" if dtype == "float64" else "fma.rn.f32") in text
