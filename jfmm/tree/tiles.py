"""Leaf-aligned tiles of sorted points: the unit of work of the operators
that loop over a leaf's points (near field, P2M, L2P, M2P, P2L)."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def tile_count(n_points: int, nleaf: int, tile: int) -> int:
    """Leaf-aligned tiles that always suffice: a leaf of c points takes
    ceil(c / tile) of them, so ceil(n / tile) + nleaf."""
    return -(-n_points // tile) + nleaf


def _per_leaf(start, tile: int):
    """Tiles of each leaf (nleaf,) and their running sum."""
    nleaf = start.shape[0] - 2
    per_leaf = (start[1:nleaf + 1] - start[:nleaf] + tile - 1) // tile
    return per_leaf, jnp.cumsum(per_leaf)


def leaf_tiles(start, n_points: int, tile: int, multiple: int = 1, first=0,
               count: int | None = None):
    """Leaf-aligned tiles of sorted points.

    start: (nleaf + 2,) leaf ranges (leaf b holds [start[b], start[b + 1]),
    entry nleaf the empty sentinel leaf). A leaf of c points gets
    ceil(c / tile) tiles, so ceil(n / tile) + nleaf tiles always suffice
    (rounded up to a multiple of `multiple`): all of them, or the `count`
    (static) from tile `first` (traced). Returns per tile (leaf, first
    point, end), unused tiles pointing at the sentinel leaf nleaf and
    starting at n (a kernel reading `tile` rows from there stays in the
    `tile` rows of padding after the points).
    """
    nleaf = start.shape[0] - 2
    per_leaf, cum = _per_leaf(start, tile)
    if count is None:
        count = round_up(tile_count(n_points, nleaf, tile), multiple)
    k = first + jnp.arange(count, dtype=jnp.int32)
    leaf = jnp.searchsorted(cum, k, side="right").astype(jnp.int32)
    first_tile = jnp.concatenate([cum - per_leaf, jnp.zeros(1, cum.dtype)])[leaf]
    t0 = start[leaf] + tile * jnp.where(leaf < nleaf, k - first_tile, 0)
    t1 = jnp.minimum(t0 + tile, start[leaf + 1])
    return leaf, t0, t1


def until(count, total: int, chunk: int, body, init, first=0):
    """body(start, acc) for start = first, first + chunk, ... below count
    (traced) and total (static, a multiple of chunk; first may be traced,
    a multiple of chunk too): a loop that stops at the work there is, where
    static bounds (an adaptive tree's bounded capacities) hold far more
    than most points need."""
    assert total % chunk == 0

    def step(carry):
        i, acc = carry
        return i + 1, body(first + i * chunk, acc)

    def more(carry):
        start = first + carry[0] * chunk
        return (start < count) & (start < total)

    return jax.lax.while_loop(more, step, (jnp.zeros((), jnp.int32), init))[1]


def in_steps(run, start, n_points: int, tile: int, leaves: int | None, active=None,
             max_tiles: int | None = None):
    """run(leaf, t0, t1) (a pytree of sums over tiles, `leaf_tiles`) over
    every tile: at once, or, where `leaves` (static) bounds the leaves that
    hold points in most trees, in steps of the tiles that many leaves take,
    as many as the tiles in use need. A tree of many slots, most without
    points (bounded capacities), then runs about the tiles its points fill,
    not the tiles its slots could. active (nleaf + 1,) bool: only the tiles
    of these leaves, moved to the front, in steps of a sixteenth of the
    tiles (a device's sum from another's sources, which neighbour few of
    its leaves). max_tiles (static): no step runs more tiles than this
    (a run whose temporaries grow with its tiles). `run` is traced once,
    for the sums' shapes, and that trace runs inside the loop: a GPU
    compiles each Pallas kernel a trace holds while lowering it, and
    tracing the unrolled kernels is most of a first call's lowering (jit
    of fmm at 2^20 lowered for a GPU: 4.0 -> 3.8 s against tracing twice)."""
    nleaf = start.shape[0] - 2
    if active is not None:
        leaf, t0, t1 = leaf_tiles(start, n_points, tile)
        step = -(-leaf.shape[0] // 16)
        keep = active[leaf] & (t0 < t1)
        order = jnp.argsort(~keep, stable=True)
        used = jnp.sum(keep)
        # The rest become empty tiles: a last step's slice runs past `used`.
        live = jnp.arange(leaf.shape[0]) < used
        tiles = [jnp.pad(jnp.where(live, a[order], c), (0, 16 * step - a.shape[0]),
                         constant_values=c)
                 for a, c in ((leaf, nleaf), (t0, n_points), (t1, n_points))]
        part = lambda first: run(*(jax.lax.dynamic_slice_in_dim(a, first, step)  # noqa: E731
                                   for a in tiles))
        total = 16 * step
    else:
        every = tile_count(n_points, nleaf, tile)
        step = tile_count(n_points, min(nleaf, leaves or nleaf), tile)
        step = step if max_tiles is None else min(step, max_tiles)
        if step >= every:
            return run(*leaf_tiles(start, n_points, tile))
        total = round_up(every, step)
        used = _per_leaf(start, tile)[1][-1]
        part = lambda first: run(*leaf_tiles(start, n_points, tile, first=first,  # noqa: E731
                                             count=step))
    part = jax.jit(part)                    # its trace for eval_shape serves the loop
    add = lambda first, acc: jax.tree_util.tree_map(jnp.add, acc, part(first))  # noqa: E731
    zeros = jax.tree_util.tree_map(lambda a: jnp.zeros(a.shape, a.dtype),
                                   jax.eval_shape(part, jax.ShapeDtypeStruct((), jnp.int32)))
    return until(used, total, step, add, zeros)
