"""Interaction lists on the dense Morton grid of one level.

Padding convention (used throughout jfmm): a box table of a level with B
boxes has a sentinel index B that names an extra, empty box; arrays that are
gathered with such a table carry one all-zero row (or an empty point range)
at index B.

The M2L list of a box is stored implicitly, as in most GPU FMMs: the source
boxes of child c of parent P are the children c' of P's near neighbours j
(3^d including P itself) that are not adjacent to c. Which (j, c', c) pairs
are well separated, and by which offset, depends on d alone:
`m2l_slots(d)[j, c', c]` is an index into `m2l_offsets(d)`, or the count of
offsets (a zero operator) for adjacent pairs. Over all (j, c') every child
gets exactly 6^d - 3^d sources (189 in 3D, 27 in 2D) when all of them exist,
through 316 (3D) or 40 (2D) distinct offsets.
"""
from __future__ import annotations

import functools
import itertools

import jax.numpy as jnp
import numpy as np

from jfmm.tree import morton


@functools.lru_cache(maxsize=None)
def near_displacements(d: int) -> np.ndarray:
    """(3^d, d) displacements {-1,0,1}^d in lexicographic order (self in the middle)."""
    return np.array(list(itertools.product((-1, 0, 1), repeat=d)), np.int32)


def self_slot(d: int) -> int:
    """Column of the box itself in a near table."""
    return (3 ** d - 1) // 2


def neighbors(level: int, d: int):
    """Near-neighbour table of the full grid at `level`.

    Returns (2^(d*level), 3^d) int32: the Morton index of each box's
    neighbour at `near_displacements(d)[j]`, or the sentinel 2^(d*level)
    where it falls outside the root box.
    """
    n = 2 ** (d * level)
    coords = morton.decode(jnp.arange(n, dtype=jnp.int32), level, d)
    nb = coords[:, None, :] + jnp.asarray(near_displacements(d))[None]
    inside = jnp.all((nb >= 0) & (nb < 2 ** level), axis=-1)
    keys = morton.encode(jnp.clip(nb, 0, 2 ** level - 1), level)
    return jnp.where(inside, keys, n)


@functools.lru_cache(maxsize=None)
def m2l_offsets(d: int) -> np.ndarray:
    """(n_off, d) source-minus-target offsets (in box sides) of an M2L pair:
    every o in [-3, 3]^d with max |o_k| >= 2 (316 in 3D, 40 in 2D)."""
    o = np.array(list(itertools.product(range(-3, 4), repeat=d)), np.int32)
    return o[np.abs(o).max(axis=1) >= 2]


def child_bits(d: int) -> np.ndarray:
    """(2^d, d) bit vector of each child slot (axis 0 is the lowest key bit)."""
    c = np.arange(2 ** d)
    return ((c[:, None] >> np.arange(d)[None, :]) & 1).astype(np.int32)


@functools.lru_cache(maxsize=None)
def m2l_slots(d: int) -> np.ndarray:
    """(3^d, 2^d, 2^d) int32: M2L offset index of source child c' of parent
    neighbour j seen from target child c, or n_off if they are adjacent."""
    offs = m2l_offsets(d)
    lookup = {tuple(o): i for i, o in enumerate(offs)}
    bits = child_bits(d)
    disp = near_displacements(d)
    table = np.full((3 ** d, 2 ** d, 2 ** d), len(offs), np.int32)
    for j, dp in enumerate(disp):
        for cs, bs in enumerate(bits):
            for ct, bt in enumerate(bits):
                o = tuple(2 * dp + bs - bt)
                table[j, cs, ct] = lookup.get(o, len(offs))
    return table
