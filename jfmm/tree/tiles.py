"""Leaf-aligned tiles of sorted points: the unit of work of the operators
that loop over a leaf's points (near field, P2M, L2P, M2P, P2L)."""
from __future__ import annotations

import jax.numpy as jnp


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def tile_count(n_points: int, nleaf: int, tile: int) -> int:
    """Leaf-aligned tiles that always suffice: a leaf of c points takes
    ceil(c / tile) of them, so ceil(n / tile) + nleaf."""
    return -(-n_points // tile) + nleaf


def leaf_tiles(start, n_points: int, tile: int, multiple: int = 1):
    """Leaf-aligned tiles of sorted points.

    start: (nleaf + 2,) leaf ranges (leaf b holds [start[b], start[b + 1]),
    entry nleaf the empty sentinel leaf). A leaf of c points gets
    ceil(c / tile) tiles, so ceil(n / tile) + nleaf tiles always suffice
    (rounded up to a multiple of `multiple`). Returns per tile (leaf, first
    point, end), unused tiles pointing at the sentinel leaf nleaf and
    starting at n (a kernel reading `tile` rows from there stays in the
    `tile` rows of padding after the points).
    """
    nleaf = start.shape[0] - 2
    counts = start[1:nleaf + 1] - start[:nleaf]
    per_leaf = (counts + tile - 1) // tile
    cum = jnp.cumsum(per_leaf)
    n_tiles = round_up(tile_count(n_points, nleaf, tile), multiple)
    k = jnp.arange(n_tiles, dtype=jnp.int32)
    leaf = jnp.searchsorted(cum, k, side="right").astype(jnp.int32)
    first_tile = jnp.concatenate([cum - per_leaf, jnp.zeros(1, cum.dtype)])[leaf]
    t0 = start[leaf] + tile * jnp.where(leaf < nleaf, k - first_tile, 0)
    t1 = jnp.minimum(t0 + tile, start[leaf + 1])
    return leaf, t0, t1
