"""Adaptive, 2:1-balanced tree over sources and targets, built on device.

Boxes split while they hold more than `leaf_size` sources or targets that
are not all at one place, so leaves sit at different levels and hold at
most `leaf_size` points, or more where they coincide (or are closer than
the deepest level's box side). The tree
is built top-down, one level at a time, from the points' integer
coordinates; no Morton keys are needed, so depth is not bounded by a key's
bits (`MAX_LEVEL`).

Balance. A box also splits where a colleague (a same-level neighbour,
itself included) has a child holding more than `leaf_size` points. This
rule gives: a box that splits has all its colleagues (their parents
split), hence leaves that touch differ by at most one level. (If X splits
because it is full, X's parent has a full child and is a colleague of the
parent of each colleague Z of X, which therefore splits; if X splits
because a colleague C' has a full child, C' is full and its parent is a
colleague of Z's parent, two level-m boxes apart at most.) Balance bounds
every interaction list by a constant of d alone:

  U (leaf b, direct): leaf colleagues of b, leaf colleagues of b's parent
    touching b, children of b's split colleagues touching b (leaves).
  V (any box, M2L): children of the split colleagues of b's parent that do
    not touch b (the uniform tree's implicit list, `lists.m2l_slots`).
  W (leaf b, M2P): children of b's split colleagues that do not touch b.
  X (any box, P2L): leaf colleagues of b's parent that do not touch b.

A leaf colleague of b's parent touching b makes b a leaf (b's colleagues
inside it do not exist), so these four lists cover every pair of leaves
once (tests/tree/test_adaptive.py counts them against brute force).

Layout. Boxes are numbered level by level; level l holds `capacity[l]`
slots from `offsets[l]`; the children of a split box are 2^d consecutive
slots, child c at first_child + c, in the order of their parents, so each
level is in Morton order. The sentinel index B (the total slot count)
names an empty box. Capacities are static and sized from the data
(`capacities`); a build whose points need more sets `overflow`.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jfmm.tree import lists
from jfmm.tree.uniform import root_box

# Deepest level: box sides of 2^-24 of the root, below float32's resolution of
# the coordinates (deeper boxes would split points the coordinates cannot).
MAX_LEVEL = 24


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


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["lo", "side", "level", "parent", "first_child", "leaf", "valid",
                 "colleagues", "src_perm", "src_sorted", "src_start", "tgt_perm",
                 "tgt_sorted", "tgt_start", "overflow"],
    meta_fields=["dim", "offsets", "shared"])
@dataclasses.dataclass(frozen=True)
class AdaptiveTree:
    """An adaptive, 2:1-balanced tree (module docstring).

    Static: dim, offsets (first slot of each level, then B), shared
    (targets are the sources).
    Arrays (B box slots, sentinel B; N sources, M targets):
      lo (dim,), side ()          root box [lo, lo + side]^dim
      level, parent, first_child  (B,) int32 (parent B for the root,
                                  first_child B for leaves and empty slots)
      leaf, valid                 (B,) bool
      colleagues (B, 3^d) int32   same-level neighbours that exist, by
                                  `lists.near_displacements`, else B
      src_perm (N,), src_sorted (N, dim), src_start (B + 2,): leaf b holds
                                  sorted sources [start[b], start[b + 1])
                                  (non-leaves and the sentinel none)
      tgt_* likewise for targets
      overflow () bool            the points need more slots than given
    """
    lo: jax.Array
    side: jax.Array
    level: jax.Array
    parent: jax.Array
    first_child: jax.Array
    leaf: jax.Array
    valid: jax.Array
    colleagues: jax.Array
    src_perm: jax.Array
    src_sorted: jax.Array
    src_start: jax.Array
    tgt_perm: jax.Array
    tgt_sorted: jax.Array
    tgt_start: jax.Array
    overflow: jax.Array
    dim: int
    offsets: tuple
    shared: bool = False

    @property
    def n_boxes(self) -> int:
        return self.offsets[-1]

    def slot(self):
        """(B,) child slot of each box within its parent."""
        local = jnp.arange(self.n_boxes, dtype=jnp.int32) - jnp.asarray(self.offsets[:-1],
                                                                          jnp.int32)[self.level]
        return local % (2 ** self.dim)


def _level_step(state, l, leaf_size, cap_next):
    """Split level l's boxes (module docstring's rule) and make level l+1.

    state: box (P,) int32 local box of each point at level l, -1 once in a
    leaf; kind (P,) bool source; q (P, d) coordinates in [0, 1); valid
    (C,), colleagues (C, 3^d) local (sentinel C). cap_next: slots of
    level l + 1 (static; l may be traced). Returns split (C,),
    first_child (C,) local at l + 1 (sentinel cap_next), the next level's
    valid, parent (local at l), colleagues, the points' boxes, and the
    number of children made."""
    box, is_src, q, valid, coll = state
    n_box, d = valid.shape[0], q.shape[1]
    ways = 2 ** d
    cells = jnp.left_shift(1, l + 1)                     # per axis at level l + 1
    coord = jnp.clip(jnp.floor(q * cells.astype(q.dtype)), 0, cells - 1).astype(jnp.int32)
    slot = jnp.sum((coord & 1) << jnp.arange(d, dtype=jnp.int32), axis=1)
    active = box >= 0
    cell = jnp.where(active, box * ways + slot, n_box * ways)

    def child_counts(mask):
        return (jnp.zeros(n_box * ways + 1, jnp.int32).at[cell].add(mask.astype(jnp.int32))
                [:-1].reshape(n_box, ways))

    def child_spread(op, fill):                         # min or max of q per child
        return getattr(jnp.full((n_box * ways + 1, d), fill, q.dtype).at[cell], op)(q)[:-1]

    lo_c = child_spread("min", jnp.inf).reshape(n_box, ways, d)
    hi_c = child_spread("max", -jnp.inf).reshape(n_box, ways, d)
    # Coincident points cannot be separated: a box of them does not count as full.
    apart_c = jnp.any(hi_c > lo_c, axis=-1)
    apart = jnp.any(hi_c.max(1) > lo_c.min(1), axis=-1)
    cs, ct = child_counts(is_src), child_counts(~is_src)
    full = (jnp.maximum(cs.sum(1), ct.sum(1)) > leaf_size) & apart
    full_child = jnp.any((jnp.maximum(cs, ct) > leaf_size) & apart_c, axis=1)
    full_child = jnp.concatenate([full_child, jnp.zeros(1, bool)])
    split = valid & (l < MAX_LEVEL) & (full | jnp.any(full_child[coll], axis=1))
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
    split_ext = jnp.concatenate([split, jnp.zeros(1, bool)])
    goes_on = active & split_ext[jnp.where(active, box, n_box)]
    nxt_box = jnp.where(goes_on, first_ext[jnp.where(active, box, n_box)] + slot, -1)
    nxt_box = jnp.where(nxt_box < cap, nxt_box, -1)      # dropped by an overflow
    return split, first, nxt_valid, parent, nxt_coll, nxt_box, made


def _root_state(sources, targets):
    """The root box and level 0's state for `_level_step`."""
    both = sources if targets is None else jnp.concatenate([sources, targets])
    lo, side = root_box(both)
    safe = jnp.where(jnp.isfinite(both), both, lo)
    q = jnp.clip((safe - lo) / side, 0.0, 1.0)
    d = q.shape[1]
    is_src = jnp.arange(q.shape[0]) < sources.shape[0]
    root_coll = jnp.where(jnp.arange(3 ** d) == lists.self_slot(d), 0, 1).astype(jnp.int32)
    return lo, side, (jnp.zeros(q.shape[0], jnp.int32), is_src, q, jnp.ones(1, bool),
                      root_coll[None])


_step = jax.jit(_level_step, static_argnums=(2, 3))


@functools.partial(jax.jit, static_argnums=(1,))
def _trim(step, size_next: int):
    """A `_level_step` result with its next level cut to size_next slots."""
    split, first, valid, parent, coll, box, made = step
    coll = coll[:size_next]
    return (split, jnp.where(first < size_next, first, size_next), valid[:size_next],
            parent[:size_next], jnp.where(coll >= size_next, size_next, coll),
            jnp.where(box < size_next, box, -1), made)


def _full_step(state, l, leaf_size: int):
    """`_level_step` with 2^d child slots per box: one compiled step per
    level size."""
    return _step(state, l, leaf_size, 2 ** state[2].shape[1] * state[3].shape[0])


def capacities(sources, targets, leaf_size: int) -> tuple:
    """Slots per level for these (concrete) points: (1, ...), each level's
    children rounded up to a power of 2 (few shapes to compile)."""
    _, _, state = _root_state(jnp.asarray(sources),
                              None if targets is None else jnp.asarray(targets))
    caps, l = [1], 0
    while True:
        step = _full_step(state, l, leaf_size)
        made = int(step[-1])
        if made == 0:
            return tuple(caps)
        caps.append(1 << (made - 1).bit_length())
        _, _, valid, _, coll, box, _ = _trim(step, caps[-1])
        state = (box, state[1], state[2], valid, coll)
        l += 1


def build(sources, targets, leaf_size: int, caps: tuple) -> AdaptiveTree:
    """The adaptive tree of sources (N, d) and targets (M, d) or None (the
    sources), with `caps` slots per level (`capacities`). jit-able with
    leaf_size and caps static."""
    sources = jnp.asarray(sources)
    targets = None if targets is None else jnp.asarray(targets)
    lo, side, state = _root_state(sources, targets)
    d = sources.shape[1]
    offsets = tuple(int(v) for v in np.concatenate([[0], np.cumsum(caps)]))
    total = offsets[-1]
    levels, parents, firsts, leaves, valids, colls = [], [], [], [], [], []
    leaf_of = jnp.full(state[2].shape[0], total, jnp.int32)
    parent = jnp.full(1, total, jnp.int32)
    overflow = jnp.zeros((), bool)
    for l, cap in enumerate(caps):
        box, _, _, valid, coll = state
        cap_next = caps[l + 1] if l + 1 < len(caps) else 0
        split, first, nvalid, nparent, ncoll, nbox, made = _trim(
            _full_step(state, l, leaf_size), cap_next)
        overflow = overflow | (made > cap_next)
        off, nxt = offsets[l], offsets[l + 1]
        levels.append(jnp.full(cap, l, jnp.int32))
        parents.append(parent)
        firsts.append(jnp.where(first < cap_next, nxt + first, total))
        leaves.append(valid & ~split)
        valids.append(valid)
        colls.append(jnp.where(coll < cap, off + coll, total))
        settled = (box >= 0) & ~split[jnp.maximum(box, 0)]
        leaf_of = jnp.where(settled, off + box, leaf_of)
        parent = jnp.where(nparent < cap, off + nparent, total)
        state = (nbox, state[1], state[2], nvalid, ncoll)
    cat = jnp.concatenate
    leaf = cat(leaves)
    n = sources.shape[0]

    def sort(points, leaf_idx):
        perm = jnp.argsort(leaf_idx, stable=True).astype(jnp.int32)
        counts = jnp.zeros(total + 1, jnp.int32).at[leaf_idx].add(1)
        start = cat([jnp.zeros(1, jnp.int32), jnp.cumsum(counts, dtype=jnp.int32)])
        return perm, points[perm], start

    src = sort(sources, leaf_of[:n])
    tgt = src if targets is None else sort(targets, leaf_of[n:])
    return AdaptiveTree(lo, side, cat(levels), cat(parents), cat(firsts), leaf, cat(valids),
                        cat(colls), *src, *tgt, overflow | jnp.any(leaf_of == total), dim=d,
                        offsets=offsets, shared=targets is None)


# ------------------------------------------------------------------ lists

def _ext(a, fill):
    return jnp.concatenate([a, jnp.full((1,) + a.shape[1:], fill, a.dtype)])


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
    """P2L sources (B, 3^d): leaf colleagues of the parent not touching the box."""
    total = tree.n_boxes
    pc = parent_colleagues(tree)
    touch = jnp.asarray(touch_parent_colleague(tree.dim))[tree.slot()]
    ok = _ext(tree.leaf, False)[pc] & ~touch & tree.valid[:, None]
    return jnp.where(ok, pc, total)


def _colleague_children(tree: AdaptiveTree):
    """(B, 3^d, 2^d) children of each box's colleagues (B where none)."""
    total, ways = tree.n_boxes, 2 ** tree.dim
    first = _ext(tree.first_child, total)[tree.colleagues]
    return jnp.where(first[:, :, None] < total,
                     first[:, :, None] + jnp.arange(ways, dtype=jnp.int32), total)


def w_list(tree: AdaptiveTree):
    """M2P sources of leaves (B, 3^d * 2^d): children of the split
    colleagues not touching the leaf."""
    total = tree.n_boxes
    kids = _colleague_children(tree)
    touch = jnp.asarray(touch_colleague_child(tree.dim))[None]
    ok = ~touch & tree.leaf[:, None, None] & (kids < total)
    return jnp.where(ok, kids, total).reshape(total, -1)


def u_list(tree: AdaptiveTree):
    """Direct-sum sources of leaves (B, 3^d * (2 + 2^d)): leaf colleagues,
    leaf colleagues of the parent touching the leaf, and children of the
    split colleagues touching it."""
    total, d = tree.n_boxes, tree.dim
    leaf_ext = _ext(tree.leaf, False)
    is_leaf = tree.leaf[:, None]
    same = jnp.where(is_leaf & leaf_ext[tree.colleagues], tree.colleagues, total)
    pc = parent_colleagues(tree)
    touch = jnp.asarray(touch_parent_colleague(d))[tree.slot()]
    coarse = jnp.where(is_leaf & leaf_ext[pc] & touch, pc, total)
    kids = _colleague_children(tree)
    touch_kid = jnp.asarray(touch_colleague_child(d))[None]
    fine = jnp.where(tree.leaf[:, None, None] & touch_kid & (kids < total), kids, total)
    return jnp.concatenate([same, coarse, fine.reshape(total, -1)], axis=1)
