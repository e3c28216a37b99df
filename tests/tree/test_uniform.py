"""The uniform-depth tree (jfmm.tree.uniform) against a numpy binning."""
import jax
import numpy as np
import pytest
from conftest import DISTRIBUTIONS, points

from jfmm.tree import build, choose_depth, root_box


def _numpy_leaf(x, lo, side, depth):
    """The Morton index of each point's leaf, by bit interleaving in numpy."""
    d = x.shape[1]
    cells = np.clip(np.floor((x - lo) / side * 2 ** depth), 0, 2 ** depth - 1).astype(np.int64)
    key = np.zeros(len(x), np.int64)
    for bit in range(depth):
        for a in range(d):
            key |= ((cells[:, a] >> bit) & 1) << (bit * d + a)
    return key


@pytest.mark.parametrize("kind", DISTRIBUTIONS)
@pytest.mark.parametrize("dim,depth", [(2, 4), (3, 3)])
def test_points_sorted_into_their_leaves(kind, dim, depth, rng):
    x, y = points(kind, 700, rng, dim), points(kind, 300, rng, dim)
    tree = jax.jit(build, static_argnums=2)(x, y, depth)
    lo, side = np.asarray(tree.lo), float(tree.side)
    both = np.concatenate([x, y])
    assert np.all(both >= lo) and np.all(both <= lo + side)      # the root box holds every point
    for pts, perm, srt, start, leaf in ((x, tree.src_perm, tree.src_sorted, tree.src_start,
                                         tree.src_leaf),
                                        (y, tree.tgt_perm, tree.tgt_sorted, tree.tgt_start,
                                         tree.tgt_leaf)):
        perm, leaf, start = np.asarray(perm), np.asarray(leaf), np.asarray(start)
        assert sorted(perm) == list(range(len(pts)))               # a permutation
        np.testing.assert_array_equal(np.asarray(srt), pts[perm])
        np.testing.assert_array_equal(leaf, _numpy_leaf(pts[perm], lo, side, depth))
        assert np.all(np.diff(leaf) >= 0)                            # Morton order
        n_leaves = 2 ** (dim * depth)
        assert len(start) == n_leaves + 2 and start[-1] == start[-2] == len(pts)
        counts = np.bincount(leaf, minlength=n_leaves)
        np.testing.assert_array_equal(np.diff(start[:-1]), counts)
        centres = np.asarray(tree.leaf_centers(leaf))
        h = side / 2 ** depth
        assert np.all(np.abs(pts[perm] - centres) <= 0.5 * h * (1 + 1e-12))


def test_targets_none_shares_the_sources(rng):
    x = points("cube", 500, rng)
    tree = build(x, None, 2)
    np.testing.assert_array_equal(tree.tgt_perm, tree.src_perm)
    np.testing.assert_array_equal(tree.tgt_start, tree.src_start)


def test_non_finite_points_are_flagged(rng):
    x = points("cube", 100, rng)
    assert bool(build(x, None, 2).finite)
    x[7, 1] = np.nan
    assert not bool(build(x, None, 2).finite)


def test_root_box_of_degenerate_sets():
    lo, side = root_box(np.full((5, 3), 2.5))                     # all coincident: a unit box
    assert float(side) > 0 and np.all(np.asarray(lo) <= 2.5)
    assert np.all(np.asarray(lo) + float(side) >= 2.5)


@pytest.mark.parametrize("n,dim,leaf", [(10, 3, 32), (4096, 3, 64), (4096, 2, 16),
                                        (10 ** 6, 3, 32), (100, 2, 1)])
def test_choose_depth(n, dim, leaf):
    depth = choose_depth(n, dim, leaf)
    assert depth == 0 if n <= leaf else depth >= 1
    assert 2 ** (dim * depth) <= max(n, 1)                         # no more leaves than points
    if depth:
        # within a factor 2^(dim/2) of the leaf size asked for
        assert n / 2 ** (dim * depth) <= leaf * 2 ** (dim / 2) + 1
