"""Uniform-depth octree (quadtree in 2D) over sources and targets, on device.

Both point sets share one root box, a cube around all of them with small
unequal margins (see `root_box`).
Each set is sorted by the Morton key of its leaf; a leaf's points are then a
contiguous range [start[b], start[b + 1]) of the sorted array, so "the points
of a box" is two integers.

Boxes are the dense Morton grid of each level rather than a compacted list of
non-empty boxes: with the depth chosen from N (`choose_depth`), the static
bound on non-empty boxes, min(N, 2^(d*level)), equals 2^(d*level) at every
level, so compaction could not shrink any array. The dense grid needs no
search to find a neighbour and keeps siblings contiguous (box index = Morton
key; the children of box b are 2^d b + c, c < 2^d).
"""
from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from jfmm import _xla
from jfmm.tree import morton


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["lo", "side", "src_perm", "src_sorted", "src_start", "src_leaf",
                 "tgt_perm", "tgt_sorted", "tgt_start", "tgt_leaf", "finite"],
    meta_fields=["depth", "dim", "shared"])
@dataclasses.dataclass(frozen=True)
class Tree:
    """A uniform-depth tree of sources and targets.

    Static (changing them recompiles): depth, dim, shared (the targets are
    the sources, the same arrays).
    Arrays (nleaf = 2^(dim*depth); N sources, M targets):
      lo (dim,), side ()        root box: [lo, lo + side]^dim
      src_perm (N,) int32       sorted position -> original index
      src_sorted (N, dim)       sources in Morton order
      src_start (nleaf + 2,)    leaf b holds sorted sources [start[b], start[b+1]);
                                entry nleaf is the empty sentinel leaf
      src_leaf (N,) int32       leaf of each sorted source
      tgt_* likewise for targets
      finite () bool            all coordinates finite (else results are NaN)
    """
    lo: jax.Array
    side: jax.Array
    src_perm: jax.Array
    src_sorted: jax.Array
    src_start: jax.Array
    src_leaf: jax.Array
    tgt_perm: jax.Array
    tgt_sorted: jax.Array
    tgt_start: jax.Array
    tgt_leaf: jax.Array
    finite: jax.Array
    depth: int
    dim: int
    shared: bool = False

    @property
    def n_leaves(self) -> int:
        return 2 ** (self.dim * self.depth)

    def box_side(self, level: int):
        """Side of a box at `level` (scalar array)."""
        return self.side / (2 ** level)

    def swapped(self) -> Tree:
        """Sources and targets exchanged (the adjoint sum's tree)."""
        return dataclasses.replace(
            self, src_perm=self.tgt_perm, src_sorted=self.tgt_sorted, src_start=self.tgt_start,
            src_leaf=self.tgt_leaf, tgt_perm=self.src_perm, tgt_sorted=self.src_sorted,
            tgt_start=self.src_start, tgt_leaf=self.src_leaf)

    def leaf_centers(self, leaves):
        """Centres (..., dim) of leaves given by Morton index (...,)."""
        coords = morton.decode(leaves, self.depth, self.dim)
        h = self.box_side(self.depth)
        return self.lo + (coords.astype(self.lo.dtype) + 0.5) * h


def choose_depth(n: int, dim: int, leaf_size: int) -> int:
    """Depth so that leaves hold about `leaf_size` of n uniform points.

    Rounded in log space; never deeper than the Morton keys allow, and never
    so deep that there are more leaves than points.
    """
    if n <= leaf_size:
        return 0
    depth = int(round(math.log(n / leaf_size, 2 ** dim)))
    while depth > 0 and 2 ** (dim * depth) > n:
        depth -= 1
    return max(0, min(depth, morton.MAX_DEPTH[dim]))


_MARGIN_LO, _MARGIN_HI = 0.0371, 0.0213


def root_box(points):
    """A cube holding every finite point with small margins: (lo (d,), side ())."""
    return box_of(*bounds(points))


def bounds(points):
    """The finite points' (lo (d,), hi (d,)) corners, each a dtype extreme
    where no point is finite; those of several sets combine by min and max
    (the root box of points split over devices, `jfmm.distributed.build`)."""
    finite = jnp.all(jnp.isfinite(points), axis=-1, keepdims=True)
    big = jnp.finfo(points.dtype).max
    return (jnp.min(jnp.where(finite, points, big), axis=0),
            jnp.max(jnp.where(finite, points, -big), axis=0))


def box_of(lo, hi):
    """`root_box` from the corners `bounds` gives: (lo (d,), side ())."""
    any_finite = jnp.all(lo <= hi)
    lo = jnp.where(any_finite, lo, 0.0)
    hi = jnp.where(any_finite, hi, 0.0)
    extent = jnp.max(hi - lo)
    # Unequal margins (fractions of the extent) keep lattice-aligned data
    # (grid points, points on the bounding faces, 0.5) off box faces and
    # corners at every level, where M2L converges at its worst-case rate.
    # A point set with no extent (one point, or all coincident) gets a unit box.
    tiny = jnp.finfo(lo.dtype).eps
    extent = jnp.where(extent > 0, extent, 1.0)
    extent = jnp.maximum(extent, 8 * tiny * jnp.max(jnp.abs(hi)))
    return lo - _MARGIN_LO * extent, extent * (1 + _MARGIN_LO + _MARGIN_HI)


def leaf_coords(points, lo, side, depth: int):
    """(N, d) int32 integer coordinates of the leaves of the uniform tree of
    `depth` over the root box (lo, side) that hold points (N, d); non-finite
    points go to the corner leaf."""
    safe = jnp.where(jnp.isfinite(points), points, lo)
    scaled = jnp.floor((safe - lo) / side * (2 ** depth))
    return jnp.clip(scaled, 0, 2 ** depth - 1).astype(jnp.int32)


def leaf_keys(points, lo, side, depth: int):
    """(N,) int32 Morton index of the leaf of `depth` holding each point."""
    return morton.encode(leaf_coords(points, lo, side, depth), depth)


def _sort(points, lo, side, depth: int):
    """Sort points by leaf key. Returns perm, sorted points, start, leaf.

    The leaf is a function of the coordinates alone, the same for sources
    and targets: equal points share a leaf, which the Pallas P2P relies on
    (its r = 0 select runs only on the target's own leaf)."""
    n, d = points.shape
    nleaf = 2 ** (d * depth)
    if depth == 0:                  # one leaf: nothing to sort
        zero, count = jnp.zeros(1, jnp.int32), jnp.full(2, n, jnp.int32)
        return (jnp.arange(n, dtype=jnp.int32), points, jnp.concatenate([zero, count]),
                jnp.zeros(n, jnp.int32))
    keys = leaf_keys(points, lo, side, depth)
    perm = jnp.argsort(keys, stable=True).astype(jnp.int32)
    leaf = keys[perm]
    counts = jnp.zeros(nleaf, jnp.int32).at[leaf].add(1, indices_are_sorted=True)
    start = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(counts, dtype=jnp.int32),
                             jnp.full(1, n, jnp.int32)])
    return perm, points[perm], start, leaf


def build(sources, targets, depth: int) -> Tree:
    """Build the tree (jit-able; depth static).

    sources: (N, d); targets: (M, d) or None for targets = sources.
    """
    d = sources.shape[-1]
    both = sources if targets is None else jnp.concatenate([sources, targets])
    lo, side = root_box(both)
    finite = jnp.all(jnp.isfinite(both))
    src = _sort(sources, lo, side, depth)
    tgt = src if targets is None else _sort(targets, lo, side, depth)
    return Tree(lo, side, *src, *tgt, finite, depth=depth, dim=d, shared=targets is None)


def with_targets(tree: Tree, targets) -> tuple[Tree, jax.Array]:
    """The tree with new targets (M, d) sorted into its root box and leaves
    (jit-able), and whether every one lies in the box (closed; a target
    outside is counted in the nearest boundary leaf, where the leaf's
    local expansion does not hold)."""
    tgt = _sort(targets, tree.lo, tree.side, tree.depth)
    inside = jnp.all((targets >= tree.lo) & (targets <= tree.lo + tree.side))
    return dataclasses.replace(tree, tgt_perm=tgt[0], tgt_sorted=tgt[1], tgt_start=tgt[2],
                               tgt_leaf=tgt[3], shared=False,
                               finite=tree.finite & jnp.all(jnp.isfinite(targets))), inside


@_xla.once(static_argnames=("depth",))
def crowding(sources, targets, depth: int):
    """How much more near-field work the uniform tree of `depth` does on
    these points than on uniform ones: the pairs of targets and sources in
    neighbouring leaves over their count for points spread evenly over the
    occupied extent, N M 3^d / 2^(d depth) (1 for uniform points, ~4 on a
    sphere's surface, 10^3 and more for galaxies). targets None: the
    sources. jit-able; concrete points give a number to choose a tree by."""
    from jfmm.tree import lists

    d = sources.shape[1]
    lo, side = root_box(sources if targets is None else jnp.concatenate([sources, targets]))

    def counts(points):
        keys = leaf_keys(points, lo, side, depth)
        return jnp.zeros(2 ** (d * depth) + 1, jnp.float32).at[keys].add(1.0)

    src = counts(sources)
    tgt = src if targets is None else counts(targets)
    near = jnp.sum(src[lists.neighbors(depth, d)], axis=1)
    pairs = jnp.sum(tgt[:-1] * near)
    n, m = sources.shape[0], (sources if targets is None else targets).shape[0]
    return pairs / (n * m * 3.0 ** d / 2.0 ** (d * depth))
