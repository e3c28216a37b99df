"""The jnp pair tile, `p2p.pairwise`, in each of its layouts against a
float64 numpy sum: one (T, S, d) array where XLA's optimisations are off
(the suite's default), one (T, S) array per axis where they are on."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import rel

from jfmm import kernels as K
from jfmm.ops import backend, p2p
from jfmm.tree import build, lists, tiles


@pytest.mark.optimized
@pytest.mark.parametrize("dim", [2, 3])
def test_pairwise_layouts_match_numpy(dim, rng):
    y, x = rng.random((64, dim)), rng.random((48, dim))
    x[5] = y[7]                                     # a pair at r = 0 is skipped
    q, mask = rng.random((48, 2)) - 0.5, rng.random(48) < 0.8
    d = y[:, None] - x[None]
    r = np.linalg.norm(d, axis=-1)
    inv = np.divide(1.0, r, out=np.zeros_like(r), where=r > 0)
    qm = np.where(mask[:, None], q, 0)
    if dim == 3:                                    # 1/r
        kernel, k, factor = K.Laplace3D(), inv, -inv ** 3
    else:                                           # -log r
        kernel, k, factor = K.Laplace2D(), -np.log(np.where(r > 0, r, 1.0)), -inv ** 2
    want_phi = k @ qm
    want_grad = np.einsum("tsd,ts,sk->tkd", d, factor, qm)
    before = jax.config.read("jax_disable_most_optimizations")
    try:
        for unoptimised in (True, False):
            jax.config.update("jax_disable_most_optimizations", unoptimised)
            phi, grad = jax.jit(lambda a, b, c, m: p2p.pairwise(kernel, a, b, c, m, True))(
                y, x, q, mask)
            assert rel(phi, want_phi) < 1e-13 and rel(grad, want_grad) < 1e-13
    finally:
        jax.config.update("jax_disable_most_optimizations", before)


@pytest.mark.parametrize("n_tgt, leaves", [(150, None), (97, 5)])
def test_near_field_tiles_not_a_multiple_of_the_batch(n_tgt, leaves, rng):
    """The jnp near field over tiles whose count is not a multiple of the
    tiles run per step (padded with empty tiles), all at once and in steps
    (`tiles.in_steps`), against a numpy sum over the pairs of neighbouring
    leaves (centres at most one box side apart on every axis)."""
    x = rng.random((301, 3))
    x[:200] = 0.3 + 0.05 * rng.random((200, 3))                 # most in a few leaves
    y = rng.random((n_tgt, 3))
    q = rng.random((301, 2)) - 0.5
    t = build(jnp.asarray(x), jnp.asarray(y), 2)
    count = tiles.tile_count(n_tgt, t.tgt_start.shape[0] - 2, p2p.TILE)
    assert count % 4 and p2p.default_batch(count) == 4
    qs = jnp.asarray(q)[t.src_perm]
    phi, grad = backend.near_field(K.Laplace3D(), t.tgt_sorted, t.tgt_start, t.src_sorted, qs,
                                   t.src_start, lists.neighbors(2, 3), True, "jnp",
                                   leaves=leaves)
    ys, xs = np.asarray(t.tgt_sorted), np.asarray(t.src_sorted)
    cy, cx = (np.asarray(t.leaf_centers(b)) for b in (t.tgt_leaf, t.src_leaf))
    near = np.all(np.abs(cy[:, None] - cx[None]) < 1.01 * float(t.box_side(2)), axis=-1)
    d = ys[:, None] - xs[None]
    inv = np.where(near, 1 / np.linalg.norm(d, axis=-1), 0.0)
    assert rel(phi, inv @ np.asarray(qs)) < 1e-13
    assert rel(grad, np.einsum("tsd,ts,sk->tkd", d, -inv ** 3, np.asarray(qs))) < 1e-13


def test_near_field_at_active_leaves_from_ranges_made(rng):
    """The near field at the targets of some leaves alone (`tiles.in_steps`'
    active: their tiles moved to the front and run in steps, as a device
    sums another's block, `jfmm.distributed`), from source ranges made
    beforehand: the numpy sum over neighbouring leaves at those targets, 0
    at the others."""
    x, y = rng.random((301, 3)), rng.random((211, 3))
    x[:150] = 0.6 + 0.1 * rng.random((150, 3))
    q = rng.random((301, 2)) - 0.5
    t = build(jnp.asarray(x), jnp.asarray(y), 2)
    near = lists.neighbors(2, 3)
    active = rng.random(65) < 0.3
    active[-1] = False                                          # the sentinel leaf
    qs = jnp.asarray(q)[t.src_perm]
    phi, grad = backend.near_field(K.Laplace3D(), t.tgt_sorted, t.tgt_start, t.src_sorted, qs,
                                   t.src_start, near, True, "jnp",
                                   ranges=p2p.source_ranges(near, t.src_start),
                                   active=jnp.asarray(active))
    ys, xs = np.asarray(t.tgt_sorted), np.asarray(t.src_sorted)
    cy, cx = (np.asarray(t.leaf_centers(b)) for b in (t.tgt_leaf, t.src_leaf))
    near_pairs = np.all(np.abs(cy[:, None] - cx[None]) < 1.01 * float(t.box_side(2)), axis=-1)
    near_pairs &= active[np.asarray(t.tgt_leaf)][:, None]
    d = ys[:, None] - xs[None]
    inv = np.where(near_pairs, 1 / np.linalg.norm(d, axis=-1), 0.0)
    assert np.any(inv) and not np.all(active[np.asarray(t.tgt_leaf)])
    assert rel(phi, inv @ np.asarray(qs)) < 1e-13
    assert rel(grad, np.einsum("tsd,ts,sk->tkd", d, -inv ** 3, np.asarray(qs))) < 1e-13


@pytest.mark.parametrize("sources, limit", [(64, 16), (64, 1)])
def test_dense_source_chunks_unrolled_or_looped(sources, limit, monkeypatch, rng):
    """All pairs on the CPU: source chunks unrolled (up to CPU_CHUNKS of
    them) or looped beyond, both with a partly filled last chunk and
    target tile, coincident pairs skipped, against a float64 numpy sum."""
    monkeypatch.setattr(p2p, "CPU_SOURCES", sources)
    monkeypatch.setattr(p2p, "CPU_CHUNKS", limit)
    x, y = rng.random((300, 3)), rng.random((77, 3))
    y[3] = x[10]
    q = rng.random((300, 2)) - 0.5
    phi, grad = jax.jit(lambda a, b, c: p2p.dense(K.Laplace3D(), a, b, c, True))(y, x, q)
    d = y[:, None] - x[None]
    r = np.linalg.norm(d, axis=-1)
    inv = np.divide(1.0, r, out=np.zeros_like(r), where=r > 0)
    assert rel(phi, inv @ q) < 1e-13
    assert rel(grad, np.einsum("tsd,ts,sk->tkd", d, -inv ** 3, q)) < 1e-13
