"""Interaction lists against brute force on the full grid."""
import itertools

import numpy as np
import pytest

from jfmm.tree import lists, morton


def _coords(level, dim):
    return np.asarray(morton.decode(np.arange(2 ** (dim * level)), level, dim))


@pytest.mark.parametrize("dim,n_off,n_list", [(2, 40, 27), (3, 316, 189)])
def test_offset_counts(dim, n_off, n_list):
    assert len(lists.m2l_offsets(dim)) == n_off
    per_child = (lists.m2l_slots(dim) < n_off).sum(axis=(0, 1))
    assert (per_child == n_list).all()


@pytest.mark.parametrize("dim,depth", [(2, 4), (3, 3)])
def test_every_pair_covered_exactly_once(dim, depth):
    """Each ordered leaf pair is in the near table at the leaves, or in the
    M2L list of exactly one pair of ancestors, never both."""
    n_leaf = 2 ** (dim * depth)
    count = np.zeros((n_leaf, n_leaf), np.int32)
    near = np.asarray(lists.neighbors(depth, dim))
    for b in range(n_leaf):
        for s in near[b]:
            if s < n_leaf:
                count[b, s] += 1
    n_off = len(lists.m2l_offsets(dim))
    slots = lists.m2l_slots(dim)
    for level in range(2, depth + 1):
        nb = np.asarray(lists.neighbors(level - 1, dim))
        shift = dim * (depth - level)
        for parent in range(nb.shape[0]):
            for j in range(nb.shape[1]):
                if nb[parent, j] == nb.shape[0]:
                    continue
                for cs, ct in itertools.product(range(2 ** dim), repeat=2):
                    if slots[j, cs, ct] == n_off:
                        continue
                    tgt = (parent * 2 ** dim + ct) << shift
                    src = (nb[parent, j] * 2 ** dim + cs) << shift
                    count[tgt:tgt + (1 << shift), src:src + (1 << shift)] += 1
    assert (count == 1).all()


@pytest.mark.parametrize("dim,level", [(2, 3), (3, 2)])
def test_neighbors_brute_force(dim, level):
    c = _coords(level, dim)
    nb = np.asarray(lists.neighbors(level, dim))
    n = len(c)
    for b in range(n):
        expect = {s for s in range(n) if np.abs(c[s] - c[b]).max() <= 1}
        got = set(nb[b][nb[b] < n].tolist())
        assert got == expect
        assert nb[b, lists.self_slot(dim)] == b


@pytest.mark.parametrize("dim", [2, 3])
def test_m2l_offsets_match_geometry(dim):
    """slots[j, c', c] names the true source-minus-target offset, and M2L
    pairs are exactly the non-adjacent ones."""
    offs = lists.m2l_offsets(dim)
    bits = lists.child_bits(dim)
    disp = lists.near_displacements(dim)
    slots = lists.m2l_slots(dim)
    for j, cs, ct in itertools.product(range(len(disp)), range(2 ** dim), range(2 ** dim)):
        o = 2 * disp[j] + bits[cs] - bits[ct]
        if np.abs(o).max() <= 1:
            assert slots[j, cs, ct] == len(offs)
        else:
            np.testing.assert_array_equal(offs[slots[j, cs, ct]], o)
