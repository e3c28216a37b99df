"""Adaptive, 2:1-balanced tree over sources and targets, built on device.

Boxes split while they hold more than `leaf_size` sources or targets that
are not all at one place, so leaves sit at different levels and hold at
most `leaf_size` points, or more where they coincide (or are closer than
the deepest level's box side). The tree is built top-down, one level at a
time, from the points' integer coordinates, with the points in Morton order
(sorted once, by the 30-bit words of their keys at the deepest level, so
depth is not bounded by one key's bits): each child's points are one run.

Balance. A box also splits where a colleague (a same-level neighbour,
itself included) has a child holding more than `leaf_size` points. This
rule gives: a box that splits has all its colleagues (their parents
split), hence leaves that touch differ by at most one level. (If X splits
because it is full, X's parent has a full child and is a colleague of the
parent of each colleague Z of X, which therefore splits; if X splits
because a colleague C' has a full child, C' is full and its parent is a
colleague of Z's parent, two level-m boxes apart at most.) It also gives:
a child of a leaf's colleague holds at most `leaf_size` points or points
at one place (else the leaf would have split), and so does a box with a
leaf colleague of its parent. Every interaction between a leaf and a box
one level finer or coarser is therefore between two such small sets.

Lists. For a leaf b (its own level l):

  U (direct): b's colleagues that are leaves, the leaf children of b's
    split colleagues, and the leaf colleagues of b's parent (level l - 1),
    touching b or not.
  V (any box, M2L): children of the split colleagues of b's parent that do
    not touch b (the uniform tree's implicit list, `lists.m2l_slots`).
  W (leaf b, M2P): children of b's split colleagues that are split
    themselves (they do not touch b, by balance).
  X (any split box b, P2L): leaf colleagues of b's parent that do not
    touch b.

A leaf colleague of b's parent touching b makes b a leaf (b's colleagues
inside it do not exist), so these four lists cover every pair of leaves
once (tests/tree/test_adaptive.py counts them against brute force). The
leaf-to-leaf pairs of the classic W and X lists (leaf children of split
colleagues not touching b, and the coarse leaves of b's X list when b is a
leaf) are summed directly: they are pairs of at most `leaf_size` points,
and an M2P or P2L of one box costs as much as several hundred direct pairs
(docs/design.md, "Adaptive trees"), so direct costs less. In the
children's Morton block a split child holds no points, so U is a table of
at most 2 x 3^d slot ranges (`near_width`): a colleague (its slot, or its
children's block where it is split) and a parent colleague. W and X keep
only the split boxes, few in practice (about 1% of the classic lists on
Plummer points).

W and X are transposes of each other (b is in X(c) exactly when c is in
W(b)), and both come from the pairs (leaf b, split colleague j): W(b) is
the split children of j not touching b, and those children have b in X.
The passes walk them as work lists of (tile of the leaf's points, j)
pairs (`far_pairs`): M2P evaluates the children's multipoles at a tile of
targets, P2L adds a tile of sources to the children's locals.

M2L rows. Each level's M2L translates into blocks of siblings; only the
blocks with targets under them need locals. Per level, the tree lists
those blocks (`busy_blocks`; sources likewise for the adjoint sum), so
M2L skips the empty blocks that balance makes around dense regions and
the slots left free for moving points (half of the blocks on clustered
points).

Layout. Boxes are numbered level by level; level l holds `levels[l]`
slots from `offsets[l]`; the children of a split box are 2^d consecutive
slots (a block), child c at first_child + c, in the order of their
parents, so each level is in Morton order. The sentinel index B (the
total slot count) names an empty box. Capacities are static and sized
from the data (`capacities`); a build whose points need more sets
`overflow`.

Exact centres. The root box is a power of two in side, and its corner a
multiple of the deepest level's half side: every box centre is then a
float of the working dtype exactly, so box-local coordinates (x - c) / h
are as exact as the points (rounded centres would shift every expansion
by the rounding, 2^-24 of the root side in float32, which is a whole box
side at level 24). The deepest level is the one down to which this holds
(about 20 in float32 for points near the origin, `deepest_level`).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jfmm import _xla
from jfmm.tree import lists, tiles
from jfmm.tree.uniform import root_box

# Deepest level in any dtype (int32 box coordinates; float32 stops sooner,
# where its centres stop being exact: `deepest_level`).
MAX_LEVEL = 30
# Points per tile of the W and X work lists.
FAR_TILE = 16
# Capacities leave this much room for points that move (`Plan.update`).
SLACK = 1.125
# Capacities from sizes alone (`bounded_capacities`): splits per level per
# leaf of points, and levels below the depth of evenly spread points.
# Clustered sets at 2^20 split at most 0.22 (Plummer) and 0.38 (five
# clusters) per leaf of points at a level, 13 and 14 levels deep where even
# points take 5 (docs/BENCHMARKS.md, "Adaptive trees under jit"). Every
# slot costs time whether used or not (near-field and L2P tiles, M2M).
BOUNDED_ROOM = 0.3
BOUNDED_LEVELS = 9
# ... plus the splits that balance makes around this many crowded boxes
# (each splits its 3^d colleagues' parents), one per 16 leaves of points
# below that: what small sets need most (Plummer, 2^13 points in 32
# leaves: 56 splits at a level).
BOUNDED_CLUSTERS = 8
# Entries of the W and X work lists, M2L blocks, per step of a loop that
# stops at their count (bounded capacities hold every case, most unused);
# fewer where the capacity is under 8 chunks (`far_chunk`).
FAR_CHUNK = 1024
MIN_FAR_CHUNK = 64
# Leaves that hold points per leaf of points (n / leaf_size): the tiles of a
# bounded tree's near field, P2M and L2P run in steps of what this many
# leaves take (`tiles.in_steps`). At 2^20 the cube, Plummer and five
# clusters fill 4.6-5.9 (leaf 256) and 2.2-3.7 (leaf 64); a bounded tree has
# 7-25 slots per leaf of points.
BUSY_LEAVES = 8


@functools.lru_cache(maxsize=None)
def _child_colleague_tables(d: int):
    """For child slot c and colleague displacement j of the child: the
    parent's colleague column jp and that box's child slot cc holding the
    child's colleague. (2^d, 3^d) each."""
    disp = lists.near_displacements(d)
    bits = lists.child_bits(d)
    index = {tuple(v): i for i, v in enumerate(disp)}
    jp = np.zeros((2 ** d, 3 ** d), np.int32)
    cc = np.zeros((2 ** d, 3 ** d), np.int32)
    for c, b in enumerate(bits):
        for j, v in enumerate(disp):
            fine = b + v                                   # in [-1, 2] per axis
            jp[c, j] = index[tuple(fine // 2)]
            cc[c, j] = int(((fine % 2) << np.arange(d)).sum())
    return jp, cc


@functools.lru_cache(maxsize=None)
def touch_parent_colleague(d: int) -> np.ndarray:
    """(2^d, 3^d) bool: child c touches (shares at least a corner with) the
    box at near displacement j of its parent."""
    bits, disp = lists.child_bits(d), lists.near_displacements(d)
    return np.all((disp[None] == 0) | (disp[None] == 2 * bits[:, None] - 1), axis=-1)


@functools.lru_cache(maxsize=None)
def touch_colleague_child(d: int) -> np.ndarray:
    """(3^d, 2^d) bool: child c of the colleague at near displacement j
    touches the box."""
    bits, disp = lists.child_bits(d), lists.near_displacements(d)
    return np.all((disp[:, None] == 0) | (2 * bits[None] == 1 - disp[:, None]), axis=-1)


def _padded_rows(mask: np.ndarray):
    """Column indices of each row's True entries, padded with -1: (R, max count)."""
    width = int(mask.sum(axis=1).max())
    out = np.full((mask.shape[0], width), -1, np.int32)
    for r, row in enumerate(mask):
        cols = np.flatnonzero(row)
        out[r, :len(cols)] = cols
    return out


@functools.lru_cache(maxsize=None)
def far_children(d: int) -> np.ndarray:
    """(3^d, 2^d - 1) child slots of the colleague at displacement j that do
    not touch the box (its W list's share), padded with -1."""
    return _padded_rows(~touch_colleague_child(d))


def near_width(d: int) -> int:
    """The most slot ranges a U list has (module docstring): 54 in 3D, 18 in 2D."""
    return 2 * 3 ** d


class Capacities(NamedTuple):
    """Static sizes of an adaptive tree, from the data (`capacities`):
    levels, slots per level (each a multiple of 2^d); w and x, the pairs of
    the W and X work lists (`far_pairs`) for targets and sources;
    tgt_blocks and src_blocks, per level, the blocks of siblings with
    targets (sources) under them (`busy_blocks`). None: not sized yet.
    bounded: sized from the shapes alone (`bounded_capacities`): levels
    out of room leave larger leaves, and the lists hold every case."""
    levels: tuple
    w: int | None = None
    x: int | None = None
    tgt_blocks: tuple | None = None
    src_blocks: tuple | None = None
    bounded: bool = False


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["lo", "side", "level", "parent", "first_child", "leaf", "valid",
                 "colleagues", "center", "src_perm", "src_sorted", "src_start", "src_leaf",
                 "tgt_perm", "tgt_sorted", "tgt_start", "tgt_leaf", "near", "w_tile", "w_pos",
                 "x_tile", "x_pos", "tgt_blocks", "src_blocks", "finite", "overflow"],
    meta_fields=["dim", "leaf_size", "caps", "shared"])
@dataclasses.dataclass(frozen=True)
class AdaptiveTree:
    """An adaptive, 2:1-balanced tree (module docstring).

    Static (changing them recompiles): dim, leaf_size, caps (`Capacities`),
    shared (targets are the sources).
    Arrays (B box slots, sentinel B; N sources, M targets):
      lo (dim,), side ()          root box [lo, lo + side]^dim
      level, parent, first_child  (B,) int32 (parent B for the root,
                                  first_child B for leaves and empty slots)
      leaf, valid                 (B,) bool
      colleagues (B, 3^d) int32   same-level neighbours that exist, by
                                  `lists.near_displacements`, else B
      center (B, dim)             box centres (exact, module docstring)
      src_perm (N,), src_sorted (N, dim), src_start (B + 2,): leaf b holds
                                  sorted sources [start[b], start[b + 1])
                                  (non-leaves and the sentinel none)
      src_leaf (N,)               leaf of each sorted source
      tgt_* likewise for targets
      near (B, near_width, 2)     U lists of the leaves as slot ranges
                                  [first, end) ([B, B + 1) where none)
      w_tile, w_pos (caps.w,)     W work list: target tile (`far_tiles`)
                                  and colleague displacement j of its leaf
                                  whose box has a split child
                                  (sentinels: the tile count, 0)
      x_tile, x_pos (caps.x,)     the same over source tiles (X)
      tgt_blocks                  per level l, caps.tgt_blocks[l] local
                                  indices of the blocks of siblings with
                                  targets under them, then nblk (the
                                  level's block count); levels
                                  concatenated (`level_blocks`)
      src_blocks                  the same for sources
      finite () bool              all coordinates finite (else results are NaN)
      overflow () bool            the points need more room than caps give
    """
    lo: jax.Array
    side: jax.Array
    level: jax.Array
    parent: jax.Array
    first_child: jax.Array
    leaf: jax.Array
    valid: jax.Array
    colleagues: jax.Array
    center: jax.Array
    src_perm: jax.Array
    src_sorted: jax.Array
    src_start: jax.Array
    src_leaf: jax.Array
    tgt_perm: jax.Array
    tgt_sorted: jax.Array
    tgt_start: jax.Array
    tgt_leaf: jax.Array
    near: jax.Array
    w_tile: jax.Array
    w_pos: jax.Array
    x_tile: jax.Array
    x_pos: jax.Array
    tgt_blocks: jax.Array
    src_blocks: jax.Array
    finite: jax.Array
    overflow: jax.Array
    dim: int
    leaf_size: int
    caps: Capacities
    shared: bool = False

    @property
    def offsets(self) -> tuple:
        """First slot of each level, then B."""
        return tuple(int(v) for v in np.concatenate([[0], np.cumsum(self.caps.levels)]))

    @property
    def n_boxes(self) -> int:
        return self.offsets[-1]

    @property
    def depth(self) -> int:
        """The deepest level the capacities hold."""
        return len(self.caps.levels) - 1

    def slot(self):
        """(B,) child slot of each box within its parent."""
        local = jnp.arange(self.n_boxes, dtype=jnp.int32) - jnp.asarray(self.offsets[:-1],
                                                                          jnp.int32)[self.level]
        return local % (2 ** self.dim)

    def level_blocks(self, level: int, sources: bool = False):
        """(caps.tgt_blocks[level],) the level's blocks with targets (or
        sources) under them, nblk after them."""
        counts = self.caps.src_blocks if sources else self.caps.tgt_blocks
        start = sum(counts[:level])
        return (self.src_blocks if sources else self.tgt_blocks)[start:start + counts[level]]

    def box_side(self, level):
        """Side of a box at `level` (int or int array)."""
        return jnp.ldexp(self.side, -jnp.asarray(level, jnp.int32))     # exact

    def swapped(self) -> AdaptiveTree:
        """Sources and targets exchanged (the adjoint sum's tree)."""
        return dataclasses.replace(
            self, src_perm=self.tgt_perm, src_sorted=self.tgt_sorted, src_start=self.tgt_start,
            src_leaf=self.tgt_leaf, tgt_perm=self.src_perm, tgt_sorted=self.src_sorted,
            tgt_start=self.src_start, tgt_leaf=self.src_leaf, w_tile=self.x_tile,
            w_pos=self.x_pos, x_tile=self.w_tile, x_pos=self.w_pos,
            tgt_blocks=self.src_blocks, src_blocks=self.tgt_blocks,
            caps=self.caps._replace(w=self.caps.x, x=self.caps.w,
                                    tgt_blocks=self.caps.src_blocks,
                                    src_blocks=self.caps.tgt_blocks))


# ------------------------------------------------------------------ root

def deepest_level(lo, side, dtype):
    """The deepest level whose box centres are exact in `dtype` for a root
    box of power-of-two `side` whose corner is a multiple of that level's
    half side: (|lo| + side) / (side 2^-(l+1)) < 2^(mantissa bits), less a
    level of margin; at most MAX_LEVEL (traced int32)."""
    bits = jnp.finfo(dtype).nmant + 1
    spread = jnp.log2(1.0 + jnp.max(jnp.abs(lo)) / side)
    return jnp.clip(jnp.floor(bits - 3 - spread), 0, MAX_LEVEL).astype(jnp.int32)


def exact_root(points):
    """The adaptive root box of finite points (N, d): `root_box`'s cube
    grown to a power-of-two side, its corner snapped down to a multiple of
    the deepest level's half side. Returns lo (d,), side (), deepest level
    ()."""
    lo0, side0 = root_box(points)
    side = jnp.ldexp(jnp.ones_like(side0), jnp.ceil(jnp.log2(side0)).astype(jnp.int32))
    side = jnp.where(side < side0, 2 * side, side)           # log2 rounding
    deepest = deepest_level(lo0, side, points.dtype)
    quantum = jnp.ldexp(side, -(deepest + 1))
    lo = jnp.floor(lo0 / quantum) * quantum
    return lo, side, deepest


# ------------------------------------------------------------------ build

def _level_step(state, l, leaf_size, cap_next):
    """Split level l's boxes (module docstring's rule) and make level l+1.

    state: box (P,) int32 local box of each point at level l, -1 once in a
    leaf; kind (P,) bool source; q (P, d) coordinates in [0, 1), the points
    in Morton order (`_morton_order`); deepest () the deepest level; valid
    (C,), colleagues (C, 3^d) local (sentinel C); gap (C, 3^d) bool, the
    colleague positions inside the root box that hold no box (a coarser
    leaf: only where an earlier level ran out of room). cap_next: slots of
    level l + 1 (static; l may be traced). Returns split (C,), first_child
    (C,) local at l + 1 (sentinel cap_next), the next level's valid, parent
    (local at l), colleagues and gap, the points' boxes, the number of
    children made, and the number the rule asked for.

    Room. A box with a gap among its colleagues does not split (its
    children would touch a leaf two levels coarser), and where the rule
    splits more boxes than cap_next holds, those whose neighbourhood holds
    the most points in one child split first: a level out of room leaves
    larger leaves, never an unbalanced tree, so a tree of any capacities
    holds any points (`bounded_capacities`).

    In Morton order each child's points are one run of equal level-(l+1)
    coordinates, so a child's counts are differences of prefix sums at its
    run's ends, and its points are apart where the run's first and last
    differ: one write per run, where reductions over each child's points
    would pile a GPU's atomics onto the few crowded children."""
    box, is_src, q, deepest, valid, coll, gap = state
    n_box, (n, d) = valid.shape[0], q.shape
    ways = 2 ** d
    cells = jnp.left_shift(1, jnp.minimum(l + 1, 30))       # per axis at level l + 1
    coord = jnp.clip(jnp.floor(q * cells.astype(q.dtype)), 0, cells - 1).astype(jnp.int32)
    slot = jnp.sum((coord & 1) << jnp.arange(d, dtype=jnp.int32), axis=1, dtype=jnp.int32)
    active = box >= 0
    cell = jnp.where(active, box * ways + slot, n_box * ways)

    at = jnp.arange(n, dtype=jnp.int32)
    first_of_run = jnp.concatenate([jnp.ones(1, bool), jnp.any(coord[1:] != coord[:-1], axis=1)])
    # each run's end: the next run's first point
    end = jax.lax.cummin(jnp.concatenate([jnp.where(first_of_run, at, n)[1:],
                                          jnp.full(1, n, jnp.int32)]), reverse=True)
    sources_before = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(is_src,
                                                                           dtype=jnp.int32)])
    n_src = sources_before[end] - sources_before[at]
    apart_run = jnp.any(q[jnp.maximum(end - 1, 0)] != q, axis=1)
    runs = jnp.stack([n_src, end - at - n_src, apart_run.astype(jnp.int32)], axis=1)
    # one row per child: its first point's run (children without points: zeros)
    row = jnp.where(first_of_run & active, cell, n_box * ways + at)
    table = jnp.zeros((n_box * ways, 3), jnp.int32).at[row].set(runs, mode="drop",
                                                                unique_indices=True)
    cs, ct, apart_c = (table[:, k].reshape(n_box, ways) for k in range(3))
    apart_c = apart_c > 0
    # Coincident points cannot be separated: a box of them does not count as full.
    apart = jnp.any(apart_c, axis=1) | (jnp.sum((cs + ct) > 0, axis=1) > 1)
    full = (jnp.maximum(cs.sum(1), ct.sum(1)) > leaf_size) & apart
    crowd = jnp.max(jnp.where(apart_c, jnp.maximum(cs, ct), 0), axis=1)     # (C,)
    crowd = jnp.concatenate([crowd, jnp.zeros(1, crowd.dtype)])
    split = valid & (l < deepest) & (full | jnp.any(crowd[coll] > leaf_size, axis=1))
    split = split & ~jnp.any(gap, axis=1)
    asked = ways * jnp.sum(split, dtype=jnp.int32)
    room_for = cap_next // ways
    if room_for == 0:
        split = jnp.zeros_like(split)
    elif room_for < n_box:          # the most crowded neighbourhoods first

        def most_crowded(split):
            score = jnp.where(split, jnp.max(crowd[coll], axis=1), -1)
            _, keep = jax.lax.top_k(score, room_for)
            return split & jnp.zeros(n_box, bool).at[keep].set(True)

        split = jax.lax.cond(asked > cap_next, most_crowded, lambda s: s, split)
    made = ways * jnp.sum(split, dtype=jnp.int32)
    cap = cap_next
    first = ways * (jnp.cumsum(split, dtype=jnp.int32) - 1)
    first = jnp.where(split & (first < cap), first, cap)

    k = jnp.arange(cap, dtype=jnp.int32)
    nxt_valid = k < made
    eldest = jnp.zeros(cap + 1, jnp.int32).at[first].set(jnp.arange(n_box, dtype=jnp.int32),
                                                         mode="drop")
    parent = jnp.where(nxt_valid, eldest[k - k % ways], n_box)
    jp, cc = (jnp.asarray(t) for t in _child_colleague_tables(d))
    first_ext = jnp.concatenate([first, jnp.full(1, cap, jnp.int32)])
    coll_ext = jnp.concatenate([coll, jnp.full((1, coll.shape[1]), n_box, jnp.int32)])
    c = k % ways
    pc = coll_ext[parent[:, None], jp[c]]                 # the parent's colleague
    nxt_coll = jnp.where(first_ext[pc] < cap, first_ext[pc] + cc[c], cap)
    nxt_coll = jnp.where(nxt_valid[:, None], nxt_coll, cap)
    gap_ext = jnp.concatenate([gap, jnp.zeros((1, gap.shape[1]), bool)])
    nxt_gap = gap_ext[parent[:, None], jp[c]] | ((pc < n_box) & (first_ext[pc] >= cap))
    nxt_gap = nxt_gap & nxt_valid[:, None]
    split_ext = jnp.concatenate([split, jnp.zeros(1, bool)])
    goes_on = active & split_ext[jnp.where(active, box, n_box)]
    nxt_box = jnp.where(goes_on, first_ext[jnp.where(active, box, n_box)] + slot, -1)
    nxt_box = jnp.where(nxt_box < cap, nxt_box, -1)
    return split, first, nxt_valid, parent, nxt_coll, nxt_gap, nxt_box, made, asked


def _morton_order(q, levels: int):
    """The permutation (P,) int32 that puts points q (P, d) in [0, 1] in
    Morton order of their boxes at `levels` (static), ties in input order:
    stable sorts by the keys' 30-bit words, least significant first (radix
    sorts of one int32 key on a GPU)."""
    d = q.shape[1]
    per_word = 30 // d
    ci = jnp.clip(jnp.floor(q * 2.0 ** levels), 0, 2 ** levels - 1).astype(jnp.int32)
    perm = jnp.arange(q.shape[0], dtype=jnp.int32)
    tops = range(levels - 1, -1, -per_word)          # each word: bits top .. top - per_word + 1
    for top in reversed(tops):
        c, key = ci[perm], jnp.zeros(q.shape[0], jnp.int32)
        for bit in range(top, max(top - per_word, -1), -1):
            for a in range(d):
                key = (key << 1) | ((c[:, d - 1 - a] >> bit) & 1)
        perm = perm[jnp.argsort(key, stable=True)]
    return perm


@_xla.once
def _root_state(sources, targets):
    """The root box, the Morton order of sources then targets (P,) and
    level 0's state for `_level_step` (the points in that order)."""
    both = sources if targets is None else jnp.concatenate([sources, targets])
    lo, side, deepest = exact_root(both)
    safe = jnp.where(jnp.isfinite(both), both, lo)
    q = jnp.clip((safe - lo) / side, 0.0, 1.0)
    d = q.shape[1]
    perm = _morton_order(q, min(MAX_LEVEL, jnp.finfo(q.dtype).nmant - 2))
    is_src = perm < sources.shape[0]
    root_coll = jnp.where(jnp.arange(3 ** d) == lists.self_slot(d), 0, 1).astype(jnp.int32)
    return lo, side, perm, (jnp.zeros(q.shape[0], jnp.int32), is_src, q[perm], deepest,
                            jnp.ones(1, bool), root_coll[None], jnp.zeros((1, 3 ** d), bool))


_step = _xla.once(_level_step, static_argnums=(2, 3))     # one program a level outside jit


@_xla.once(static_argnums=(1,))
def _padded(level_state, size: int):
    """A level's (valid, colleagues, gap) with slots up to `size` (invalid
    boxes; the sentinel moved to size)."""
    valid, coll, gap = level_state
    cap = valid.shape[0]
    coll = jnp.where(coll >= cap, size, coll)
    return (jnp.concatenate([valid, jnp.zeros(size - cap, bool)]),
            jnp.concatenate([coll, jnp.full((size - cap, coll.shape[1]), size, coll.dtype)]),
            jnp.concatenate([gap, jnp.zeros((size - cap, gap.shape[1]), bool)]))


@_xla.once(static_argnums=(1, 2))
def _level_counts(state, leaf_size: int, size: int):
    """The boxes each level below the root needs for these points
    (MAX_LEVEL + 1,) int32, from every level's step with `size` slots in
    one loop that stops at the first level without splits (one program for
    any depth), and whether a level asked for more than `size` (its counts
    and those after are then short)."""
    box, is_src, q, deepest = state[:4]

    def more(carry):
        l, _, made, short = carry
        return (l <= MAX_LEVEL) & ((l == 0) | (made[jnp.maximum(l - 1, 0)] > 0)) & ~short

    def one(carry):
        l, (box, valid, coll, gap), made, short = carry
        _, _, nvalid, _, ncoll, ngap, nbox, n_made, asked = _level_step(
            (box, is_src, q, deepest, valid, coll, gap), l, leaf_size, size)
        return l + 1, (nbox, nvalid, ncoll, ngap), made.at[l].set(n_made), short | (asked > size)

    init = (jnp.zeros((), jnp.int32), (box,) + _padded(state[4:], size),
            jnp.zeros(MAX_LEVEL + 1, jnp.int32), jnp.zeros((), bool))
    _, _, made, short = jax.lax.while_loop(more, one, init)
    return made, short


def room(count: int, multiple: int = 1) -> int:
    """A capacity for `count` items: SLACK more, rounded up to the next of
    {4, 5, 6, 7} x 2^k that is a multiple of `multiple` (few sizes to
    compile, at most a quarter unused beyond the slack)."""
    need = max(1, math.ceil(count * SLACK))
    k = max(0, need.bit_length() - 3)
    while True:
        for m in (4, 5, 6, 7):
            size = m << k
            if size >= need and size % multiple == 0:
                return size
        k += 1


def _level_capacities(sources, targets, leaf_size: int) -> tuple:
    """Slots per level for these (concrete) points (`room` of the boxes
    each level needs): `_level_counts` with a power of two of slots per
    level that holds 2^d children for every full leaf, quadrupled where the
    splits that balance the tree ask for more."""
    _, _, _, state = _root_state(sources, targets)
    ways = 2 ** sources.shape[1]
    size = 1 << (ways * -(-state[2].shape[0] // leaf_size) - 1).bit_length()
    while True:
        made, short = jax.device_get(_level_counts(state, leaf_size, size))
        if not short:
            break
        size *= 4
    caps = [1]
    for count in made:
        if count == 0:
            return tuple(caps)
        caps.append(min(room(int(count), ways), ways * caps[-1]))   # no more than can be made
    return tuple(caps)


def bounded_capacities(n_points: int, dim: int, leaf_size: int, dtype,
                       n_targets: int | None = None) -> Capacities:
    """Capacities from the sizes alone, which hold any points (a traced
    call's tree): `BOUNDED_ROOM` x n_points / leaf_size splits per level
    (plus 3^d x `BOUNDED_CLUSTERS`, or one per 16 leaves of points where
    fewer), down to `BOUNDED_LEVELS` below the depth at which even points would
    fill the leaves (and no deeper than the dtype's exact centres allow),
    every block of siblings in the M2L tables, and W and X work lists of
    every (tile, colleague) pair. A build with them splits the most
    crowded boxes first where a level runs out of room (`_level_step`).
    n_points: sources and targets together; n_targets: the targets where
    they are not the sources (None)."""
    ways = 2 ** dim
    leaves = n_points / leaf_size
    per_level = ways * (math.ceil(BOUNDED_ROOM * leaves)
                        + 3 ** dim * min(BOUNDED_CLUSTERS, math.ceil(leaves / 16)))
    even = max(0, math.ceil(math.log(max(n_points / leaf_size, 1.0), ways)))
    exact = jnp.finfo(dtype).nmant - 2
    levels = [1]
    for _ in range(min(MAX_LEVEL, exact, even + BOUNDED_LEVELS)):
        levels.append(min(ways * levels[-1], per_level))
    blocks = tuple(0 if level < 2 else size // ways for level, size in enumerate(levels))
    n_src = n_points - (n_targets or 0)

    def pairs(n):              # (tile, colleague) pairs, a whole number of chunks
        count = tiles.tile_count(n, sum(levels), FAR_TILE)
        return tiles.round_up(count * 3 ** dim, FAR_CHUNK)

    w = pairs(n_targets or n_src)
    return Capacities(tuple(levels), w, w if n_targets is None else pairs(n_src), blocks,
                      blocks, bounded=True)


def far_chunk(capacity: int) -> int:
    """Entries per step of a loop over `capacity` (static) work-list
    entries or M2L blocks: FAR_CHUNK, or a power of two near an eighth of
    a smaller capacity (at least MIN_FAR_CHUNK), so that a small tree's
    loop runs about the entries in use, not a whole FAR_CHUNK of them
    (2-core CPU, 300 points on a line, float32 gradients: 4.9 -> 0.7 s).
    It divides every capacity `bounded_capacities` makes."""
    chunk = MIN_FAR_CHUNK
    while chunk < FAR_CHUNK and 8 * chunk < capacity:
        chunk *= 2
    return chunk


def capacities(sources, targets, leaf_size: int) -> Capacities:
    """The capacities of these (concrete) points' tree (`plan_tree`)."""
    return plan_tree(sources, targets, leaf_size).caps


def plan_tree(sources, targets, leaf_size: int) -> AdaptiveTree:
    """The tree of these (concrete) points with capacities sized from them:
    the levels' sizes (`_level_capacities`, one program), then the tree
    built (its levels in one loop: one step to compile), then the work
    lists sized and made. What `jfmm.plan` calls; `build` under jit
    rebuilds with the same capacities."""
    sources = jnp.asarray(sources)
    targets = None if targets is None else jnp.asarray(targets)
    levels = _level_capacities(sources, targets, leaf_size)
    tree = build_jit(sources, targets, leaf_size, Capacities(levels), True)   # built once
    w, x, tgt, src = jax.device_get(_work_counts(tree))
    blocks = lambda counts: tuple(room(int(c)) if c else 0 for c in counts)   # noqa: E731
    return work_lists(tree, Capacities(levels, room(int(w)), room(int(x)), blocks(tgt),
                                       blocks(src)))


def build(sources, targets, leaf_size: int, caps: Capacities, scan: bool = False) -> AdaptiveTree:
    """The adaptive tree of sources (N, d) and targets (M, d) or None (the
    sources), with the capacities `caps` (`capacities`; caps.w None: no
    work lists or busy blocks yet); scan: the levels in one loop (`_levels`:
    faster to compile, slower to run). jit-able with leaf_size, caps and
    scan static."""
    sources = jnp.asarray(sources)
    targets = None if targets is None else jnp.asarray(targets)
    # Only the sorted points carry derivatives (the boxes are piecewise
    # constant in them): differentiating the rest only makes programs larger.
    lo, side, perm, state = _root_state(*jax.lax.stop_gradient((sources, targets)))
    offsets = tuple(int(v) for v in np.concatenate([[0], np.cumsum(caps.levels)]))
    total = offsets[-1]
    leaf_of = jnp.full(state[2].shape[0], total, jnp.int32)
    steps, leaf_of, overflow = _levels(state, leaf_size, caps.levels, leaf_of, caps.bounded,
                                       scan)
    leaf_of = jnp.zeros_like(leaf_of).at[perm].set(leaf_of, unique_indices=True)   # input order
    tree = _assemble(sources, targets, lo, side, steps, leaf_of, overflow, leaf_size, caps.levels)
    return tree if caps.w is None else work_lists(tree, caps)


build_jit = _xla.once(build, static_argnums=(2, 3, 4))


def _levels(state, leaf_size: int, levels: tuple, leaf_of, bounded: bool, scan: bool):
    """`build`'s level steps, one program whatever the depth with bounded
    capacities or scan: every level in one `lax.scan` with the slots of the
    largest (a step costs what its points cost more than its slots), each
    level's results then cut to its own slots; else one step per level on
    its own slots (faster to run: a rebuild of 2^20 Plummer points on an
    H100 took 2.7 ms, against 3.2 ms scanned; slower to compile). With
    levels[l + 1] <= 2^d levels[l] the cut loses nothing a level's slots
    hold: a level makes at most 2^d children per box. Bounded capacities
    split the most crowded boxes first where a level runs out of room, and
    their last level does not split (leaves grow instead: never an
    overflow); others overflow where a level asks for more boxes than the
    next holds. Returns the steps, leaf_of and overflow."""
    size, n_levels = max(levels), len(levels)
    offsets = jnp.asarray(np.cumsum((0,) + tuple(levels[:-1])), jnp.int32)
    nexts = tuple(levels[1:]) + (0,)
    if not (bounded or scan):
        steps, overflow = [], jnp.zeros((), bool)
        for l, cap_next in enumerate(nexts):
            split, first, nvalid, nparent, ncoll, ngap, nbox, _, asked = _step(
                state, l, leaf_size, cap_next)
            overflow = overflow | (asked > cap_next)
            leaf_of = _settle(leaf_of, state[0], split, offsets[l])
            steps.append((state[4], state[5], split, first, nparent))
            state = (nbox,) + state[1:4] + (nvalid, ncoll, ngap)
        return steps, leaf_of, overflow
    held = jnp.asarray(nexts, jnp.int32)
    box, is_src, q, deepest = state[:4]
    fixed = (is_src, q, jnp.minimum(deepest, n_levels - 1) if bounded else deepest)

    def one(carry, level):
        (box, valid, coll, gap), leaf_of = carry
        split, first, nvalid, nparent, ncoll, ngap, nbox, _, asked = _level_step(
            (box,) + fixed + (valid, coll, gap), level, leaf_size, size)
        leaf_of = _settle(leaf_of, box, split, offsets[level])
        return ((nbox, nvalid, ncoll, ngap), leaf_of), (valid, coll, split, first, nparent,
                                                        asked > held[level])

    carry = ((box,) + _padded(state[4:], size), leaf_of)
    (_, leaf_of), ys = jax.lax.scan(one, carry, jnp.arange(n_levels, dtype=jnp.int32))
    # local indices past a level's slots are its sentinels (`_assemble` compares)
    valid, coll, split, first, parent, short = ys
    steps = [(valid[l, :cap], coll[l, :cap], split[l, :cap], first[l, :cap], parent[l, :nxt])
             for l, (cap, nxt) in enumerate(zip(levels, nexts))]
    return steps, leaf_of, jnp.zeros((), bool) if bounded else jnp.any(short)


@_xla.once
def _settle(leaf_of, box, split, offset):
    """leaf_of with the points whose level box did not split set to it."""
    settled = (box >= 0) & ~split[jnp.maximum(box, 0)]
    return jnp.where(settled, (offset + box).astype(leaf_of.dtype), leaf_of)


@functools.partial(jax.jit, static_argnums=(7, 8))
def _assemble(sources, targets, lo, side, steps, leaf_of, overflow, leaf_size: int,
              levels: tuple) -> AdaptiveTree:
    """The tree from its levels' steps ((valid, colleagues, split, first
    child, next level's parents), local indices) and the points' leaves:
    global numbering, centres, the points sorted by leaf, the U lists; no
    work lists."""
    cat = jnp.concatenate
    d = sources.shape[1]
    ways = 2 ** d
    offsets = np.concatenate([[0], np.cumsum(levels)])
    total = int(offsets[-1])
    bits = jnp.asarray(lists.child_bits(d))
    parents, firsts, leaves, valids, colls, coords = [], [], [], [], [], []
    parent = jnp.full(1, total, jnp.int32)
    coord = jnp.zeros((1, d), jnp.int32)
    for l, (valid, coll, split, first, nparent) in enumerate(steps):
        cap, off, nxt = levels[l], int(offsets[l]), int(offsets[l + 1])
        cap_next = int(levels[l + 1]) if l + 1 < len(levels) else 0
        parents.append(parent)
        firsts.append(jnp.where(first < cap_next, nxt + first, total))
        leaves.append(valid & ~split)
        valids.append(valid)
        colls.append(jnp.where(coll < cap, off + coll, total))
        coords.append(coord)
        parent = jnp.where(nparent < cap, off + nparent, total)
        slot = jnp.arange(cap_next, dtype=jnp.int32) % ways
        nvalid = nparent < cap
        coord = jnp.where(nvalid[:, None], 2 * coord[jnp.minimum(nparent, cap - 1)] + bits[slot],
                          0)
    level = cat([jnp.full(cap, l, jnp.int32) for l, cap in enumerate(levels)])
    h = jnp.ldexp(side, -level)
    center = lo + (2 * cat(coords) + 1).astype(lo.dtype) * (h / 2)[:, None]     # exact
    n = sources.shape[0]

    def sort(points, leaf_idx):
        perm = jnp.argsort(leaf_idx, stable=True).astype(jnp.int32)
        counts = jnp.zeros(total + 1, jnp.int32).at[leaf_idx].add(1)
        start = cat([jnp.zeros(1, jnp.int32), jnp.cumsum(counts, dtype=jnp.int32)])
        return perm, points[perm], start, leaf_idx[perm]

    src = sort(sources, leaf_of[:n])
    tgt = src if targets is None else sort(targets, leaf_of[n:])
    both = sources if targets is None else cat([sources, targets])
    empty = jnp.zeros(0, jnp.int32)
    tree = AdaptiveTree(lo, side, level, cat(parents), cat(firsts), cat(leaves), cat(valids),
                        cat(colls), center, *src, *tgt, jnp.zeros((total, 1, 2), jnp.int32), empty,
                        empty, empty, empty, empty, empty, jnp.all(jnp.isfinite(both)),
                        overflow | jnp.any(leaf_of == total), dim=d, leaf_size=leaf_size,
                        caps=Capacities(levels), shared=targets is None)
    return dataclasses.replace(tree, near=near_lists(tree))


@_xla.once(static_argnums=(1,))
def work_lists(tree: AdaptiveTree, caps: Capacities) -> AdaptiveTree:
    """The tree with its W and X work lists of caps.w and caps.x entries
    (`far_pairs`) and its busy blocks (`busy_blocks`), `overflow` set
    where they need more."""
    w_tile, w_pos, w_count = far_pairs(tree, tree.tgt_start, tree.tgt_sorted.shape[0], caps.w)
    x_tile, x_pos, x_count = ((w_tile, w_pos, w_count) if tree.shared
                              else far_pairs(tree, tree.src_start, tree.src_sorted.shape[0],
                                             caps.x))
    tgt, tgt_short = busy_blocks(tree, tree.tgt_start, caps.tgt_blocks)
    src, src_short = ((tgt, tgt_short) if tree.shared
                      else busy_blocks(tree, tree.src_start, caps.src_blocks))
    return dataclasses.replace(
        tree, w_tile=w_tile, w_pos=w_pos, x_tile=x_tile, x_pos=x_pos, tgt_blocks=tgt,
        src_blocks=src, caps=caps,
        overflow=tree.overflow | (w_count > caps.w) | (x_count > caps.x) | tgt_short | src_short)


# ------------------------------------------------------------------ lists

def _ext(a, fill):
    return jnp.concatenate([a, jnp.full((1,) + a.shape[1:], fill, a.dtype)])


def _split(tree: AdaptiveTree):
    """(B + 1,) bool: the box exists and is split (the sentinel is not)."""
    return _ext(tree.valid & ~tree.leaf, False)


def parent_colleagues(tree: AdaptiveTree):
    """(B, 3^d) colleagues of each box's parent (B where none)."""
    total = tree.n_boxes
    coll = _ext(tree.colleagues, total)
    return coll[tree.parent]


def v_list(tree: AdaptiveTree):
    """M2L sources (B, 3^d * 2^d) and their offset slot into
    `lists.m2l_offsets` (n_off where none): children of the split
    colleagues of the parent that do not touch the box."""
    d, total = tree.dim, tree.n_boxes
    ways = 2 ** d
    first = _ext(tree.first_child, total)[parent_colleagues(tree)]      # (B, 3^d)
    kids = jnp.where(first[:, :, None] < total,
                     first[:, :, None] + jnp.arange(ways, dtype=jnp.int32), total)
    slots = jnp.asarray(lists.m2l_slots(d))[:, :, tree.slot()]           # (3^d, 2^d, B)
    slots = jnp.moveaxis(slots, -1, 0)
    n_off = len(lists.m2l_offsets(d))
    ok = (slots < n_off) & (kids < total) & tree.valid[:, None, None]
    return (jnp.where(ok, kids, total).reshape(total, -1),
            jnp.where(ok, slots, n_off).reshape(total, -1))


def x_list(tree: AdaptiveTree):
    """P2L sources (B, 3^d): leaf colleagues of a split box's parent that do
    not touch the box (a leaf sums them directly, in its U list)."""
    total = tree.n_boxes
    pc = parent_colleagues(tree)
    touch = jnp.asarray(touch_parent_colleague(tree.dim))[tree.slot()]
    ok = _ext(tree.leaf, False)[pc] & ~touch & _split(tree)[:-1, None]
    return jnp.where(ok, pc, total)


def _colleague_children(tree: AdaptiveTree):
    """(B, 3^d, 2^d) children of each box's colleagues (B where none)."""
    total, ways = tree.n_boxes, 2 ** tree.dim
    first = _ext(tree.first_child, total)[tree.colleagues]
    return jnp.where(first[:, :, None] < total,
                     first[:, :, None] + jnp.arange(ways, dtype=jnp.int32), total)


def w_list(tree: AdaptiveTree):
    """M2P sources of leaves (B, 3^d * 2^d): children of the split
    colleagues that are split themselves (they touch no leaf colleague)."""
    total = tree.n_boxes
    kids = _colleague_children(tree)
    ok = _split(tree)[kids] & tree.leaf[:, None, None]
    return jnp.where(ok, kids, total).reshape(total, -1)


def u_list(tree: AdaptiveTree):
    """Direct-sum sources of leaves (B, 3^d * (2 + 2^d)): leaf colleagues,
    leaf colleagues of the parent, and leaf children of the split
    colleagues (`near_lists` holds the same as slot ranges)."""
    total = tree.n_boxes
    leaf_ext = _ext(tree.leaf, False)
    is_leaf = tree.leaf[:, None]
    same = jnp.where(is_leaf & leaf_ext[tree.colleagues], tree.colleagues, total)
    pc = parent_colleagues(tree)
    coarse = jnp.where(is_leaf & leaf_ext[pc], pc, total)
    kids = _colleague_children(tree)
    fine = jnp.where(tree.leaf[:, None, None] & leaf_ext[kids], kids, total)
    return jnp.concatenate([same, coarse, fine.reshape(total, -1)], axis=1)


def near_lists(tree: AdaptiveTree):
    """The U lists as slot ranges (B, `near_width`, 2), [first, end) per
    entry ([B, B + 1) where none): each colleague of a leaf, its own slot if
    it is a leaf or its children's block if split (the block's split
    children hold no points), and each leaf colleague of the leaf's parent."""
    total, ways = tree.n_boxes, 2 ** tree.dim
    leaf_ext = _ext(tree.leaf, False)
    is_leaf = tree.leaf[:, None]
    coll = tree.colleagues
    first = _ext(tree.first_child, total)[coll]
    fine = is_leaf & (first < total)
    same = is_leaf & leaf_ext[coll]
    lo = jnp.where(fine, first, jnp.where(same, coll, total))
    hi = jnp.where(fine, first + ways, lo + 1)
    pc = parent_colleagues(tree)
    coarse = jnp.where(is_leaf & leaf_ext[pc], pc, total)
    lo = jnp.concatenate([lo, coarse], axis=1)
    hi = jnp.concatenate([hi, coarse + 1], axis=1)
    return jnp.stack([lo, hi], axis=-1)


def busy_leaves(tree: AdaptiveTree, n_points: int) -> int | None:
    """Leaves of n_points points to size tile steps by on a bounded tree
    (`BUSY_LEAVES`), None on a tree sized to its points."""
    return BUSY_LEAVES * -(-n_points // tree.leaf_size) if tree.caps.bounded else None


def far_tiles(start, n_points: int):
    """The leaf-aligned tiles of FAR_TILE points the W and X work lists
    index: (leaf, first point, end) per tile (`tiles.leaf_tiles`)."""
    return tiles.leaf_tiles(start, n_points, FAR_TILE)


def _far_mask(tree: AdaptiveTree, start, n_points: int):
    """(tiles, 3^d) bool: the tile's leaf has a colleague at j with a split
    child (W and X concern only split boxes: `far_boxes`)."""
    leaf, _, _ = far_tiles(start, n_points)
    has = jnp.any(_split(tree)[_colleague_children(tree)], axis=2)
    return _ext(has, False)[leaf]


def far_boxes(tree: AdaptiveTree, leaf, pos):
    """(E, 2^d - 1) the boxes a work-list entry of `leaf` (E,) and colleague
    displacement `pos` (E,) concerns: the split children of that colleague
    not touching the leaf (B where none)."""
    total, d = tree.n_boxes, tree.dim
    first = _ext(tree.first_child, total)[_ext(tree.colleagues, total)[leaf, pos]]
    kids = jnp.asarray(far_children(d))[pos]
    boxes = jnp.where((kids >= 0) & (first[:, None] < total), first[:, None] + kids, total)
    return jnp.where(_split(tree)[boxes], boxes, total)


def far_pairs(tree: AdaptiveTree, start, n_points: int, cap: int):
    """The W (start: target ranges) or X (source ranges) work list: the
    first `cap` (tile, j) pairs of a tile of a leaf and a split colleague j
    of that leaf, padded with (tile count, 0); and how many there are."""
    mask = _far_mask(tree, start, n_points)
    width = mask.shape[1]
    flat, count = first_true(mask.reshape(-1), cap)
    return flat // width, flat % width, count


def first_true(mask, cap: int):
    """The indices (cap,) int32 of the first `cap` True entries of mask (n,)
    (n after them) and how many there are. A prefix sum ranks the entries
    and each is written to its own slot: `jnp.nonzero` with a size counts
    ranks into bins instead, piling a GPU's atomics onto the few bins of a
    sparse mask (most of the W and X lists' time before)."""
    n = mask.shape[0]
    at = jnp.arange(n, dtype=jnp.int32)
    rank = jnp.cumsum(mask, dtype=jnp.int32) - 1
    dest = jnp.where(mask, rank, max(n, cap) + at)       # distinct; past cap: dropped
    out = jnp.full(cap, n, jnp.int32).at[dest].set(at, mode="drop", unique_indices=True)
    return out, jnp.sum(mask, dtype=jnp.int32)


def _busy_masks(tree: AdaptiveTree, start):
    """Per level, (nblk,) bool: the blocks of siblings with points of the
    ranges `start` under them (empty for levels 0 and 1, which have no
    M2L)."""
    counts = subtree_counts(tree, start)
    ways = 2 ** tree.dim
    return [jnp.zeros(0, bool) if level < 2 else
            jnp.any(counts[tree.offsets[level]:tree.offsets[level + 1]].reshape(-1, ways) > 0,
                    axis=1) for level in range(tree.depth + 1)]


def busy_blocks(tree: AdaptiveTree, start, caps: tuple):
    """The `AdaptiveTree.tgt_blocks` table for points of ranges `start`
    with caps[l] entries at level l, and whether a level needs more.

    Every level is ranked by one prefix sum over all levels' masks: one
    scan per level let XLA's GPU backend fuse the levels' scans into one
    kernel wherever the bounded tree's levels have equal sizes, which LLVM
    and ptxas took over 20 s to compile."""
    masks = _busy_masks(tree, start)[:len(caps)]
    sizes = np.array([m.shape[0] for m in masks], int)
    caps = np.asarray(caps[:len(masks)], int)
    begin = np.concatenate([[0], np.cumsum(sizes)])
    out_begin = np.concatenate([[0], np.cumsum(caps)])
    level = np.repeat(np.arange(len(sizes)), sizes)
    local = np.arange(begin[-1]) - begin[level]
    mask = jnp.concatenate(masks)
    before = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(mask, dtype=jnp.int32)])
    count = before[begin[1:]] - before[begin[:-1]]
    rank = before[1:] - 1 - before[begin[:-1]][level]
    keep = mask & (rank < caps[level])
    dest = jnp.where(keep, out_begin[level] + rank, out_begin[-1] + np.arange(begin[-1]))
    out = jnp.asarray(np.repeat(sizes, caps), jnp.int32)        # padding: the level's size
    out = out.at[dest].set(jnp.asarray(local, jnp.int32), mode="drop", unique_indices=True)
    return out, jnp.any(count > caps)


@_xla.once
def _work_counts(tree: AdaptiveTree):
    """The W and X work lists' lengths and the busy blocks per level
    (depth + 1,) for targets and sources."""
    w = jnp.sum(_far_mask(tree, tree.tgt_start, tree.tgt_sorted.shape[0]), dtype=jnp.int32)
    x = w if tree.shared else jnp.sum(_far_mask(tree, tree.src_start, tree.src_sorted.shape[0]),
                                      dtype=jnp.int32)
    busy = lambda start: jnp.stack([jnp.sum(m, dtype=jnp.int32)            # noqa: E731
                                    for m in _busy_masks(tree, start)])
    tgt = busy(tree.tgt_start)
    return w, x, tgt, tgt if tree.shared else busy(tree.src_start)


# ------------------------------------------------------------------ work

def subtree_counts(tree: AdaptiveTree, start):
    """(B,) points under each box, from the leaves' ranges `start`."""
    counts = jnp.diff(start)[:tree.n_boxes].astype(jnp.float32)
    ways = 2 ** tree.dim
    for level in range(tree.depth, 0, -1):
        off, end = tree.offsets[level], tree.offsets[level + 1]
        block = counts[off:end].reshape(-1, ways).sum(axis=1)
        counts = counts.at[tree.parent[off:end:ways]].add(block, mode="drop")
    return counts


@jax.jit
def pair_shares(tree: AdaptiveTree):
    """(depth + 1,) the share of the source-target pairs whose interaction
    the far field translates at each level: V pairs at the level of their
    boxes, X and W pairs at the level of the finer box (the one that is
    not a leaf colleague). What an error model weighs each level's
    expansion error by."""
    src, tgt = subtree_counts(tree, tree.src_start), subtree_counts(tree, tree.tgt_start)
    src_ext, tgt_ext = _ext(src, 0.0), _ext(tgt, 0.0)
    v, _ = v_list(tree)
    x = x_list(tree)                           # leaves s with b in W(s): b's X list
    pairs = (tgt * src_ext[v].sum(axis=1) + tgt * src_ext[x].sum(axis=1)
             + src * tgt_ext[x].sum(axis=1))
    per_level = jax.ops.segment_sum(pairs, tree.level, tree.depth + 1)
    return per_level / (tree.src_sorted.shape[0] * tree.tgt_sorted.shape[0])
