"""The FMM passes, written once against the expansion-family interface.

    upward     P2M at the leaves, M2M up to level 2
    downward   M2L at every level >= 2, L2L down to the leaves
    evaluate   L2P at the targets plus P2P over near-neighbour leaves
               (families of SCHEME "grid", the fast Gauss transform:
               moments, moment-to-local and L2P on one grid level)

All arrays follow the tree's Morton order; results come back in the caller's
target order. Levels 0 and 1 hold no well-separated pairs, so a tree of depth
< 2 is pure near field.

On an adaptive tree (`jfmm.tree.adaptive`) the same passes run level by
level over its blocks of siblings, with leaves at every level: P2M at each
leaf, M2M into each split box, M2L over the V lists (the uniform tree's
stencil on the blocks), P2L of the X lists and L2L down, L2P at each leaf,
M2P of the W lists, and the near field over the U lists (`adaptive_evaluate`).
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jfmm import kernels
from jfmm.configure import Config
from jfmm.ops import backend, p2p, translate
from jfmm.tree import Tree, adaptive, lists, tiles


def upward(tree: Tree, q_sorted, family, ops, p: int, mode: str = "jnp", combine=None,
           leaves: int | None = None):
    """Multipoles per level: {level: (2^(d*level), K, P)} for levels >= 2.
    combine: applied to the leaf multipoles before M2M (the sum over the
    devices of a mesh, `jfmm.distributed`); leaves: the leaves that hold
    most trees' sources, where far fewer than the grid's (`backend.p2m`)."""
    h = tree.box_side(tree.depth)
    u = (tree.src_sorted - tree.leaf_centers(tree.src_leaf)) / h
    leaf = backend.p2m(family, u, q_sorted, tree.src_start, tree.src_leaf, p, mode, leaves)
    mult = {tree.depth: leaf if combine is None else combine(leaf)}
    for level in range(tree.depth, 2, -1):
        mult[level - 1] = translate.m2m(mult[level], ops.m2m)
    return mult


def downward(tree: Tree, mult, family, ops, kernel: kernels.Kernel, p: int,
             mode: str = "jnp", m2l=None):
    """Local expansions of the leaves: (n_leaves, K, P). m2l(mult, level,
    mats): one level's far-field translation in place of `backend.m2l`
    (a device's share of it, `jfmm.distributed`)."""
    loc = None
    basis = family.m2l_basis(ops)
    for level in range(2, tree.depth + 1):
        mats = family.m2l_matrices(ops, kernel, tree.box_side(level), p)
        m = mult[level]
        if basis is not None:
            m = jnp.einsum("bkq,eq->bke", m, basis, precision=translate.HIGHEST)
        far = (backend.m2l(m, level, mats, tree.dim, mode) if m2l is None
               else m2l(m, level, mats))
        if basis is not None:
            far = jnp.einsum("bke,eq->bkq", far, basis, precision=translate.HIGHEST)
        loc = far if loc is None else translate.l2l(loc, ops.l2l) + far
    return loc


def evaluate(tree: Tree, charges, kernel: kernels.Kernel, config: Config, ops,
             gradient: bool, mode: str = "jnp", curl: bool = False):
    """phi (M, K) and grad (M, K, d) or None at the targets, caller's order.

    charges: (N, K) in the caller's source order; config: the resolved
    family, order and depth (`jfmm.configure`), with the family's operators
    `ops` (None where the tree has no far field); mode: the backend of the near
    field, P2M, M2L and L2P (jfmm.ops.backend). curl=True (3D, K a
    multiple of 3): (None, `p2p.curl` of grad), the near field summing the
    curl alone (on a GPU three sums a pair and triple, not twelve).
    """
    family, p = config.family, config.order
    q_sorted = charges[tree.src_perm]
    if isinstance(tree, adaptive.AdaptiveTree):
        phi, grad = adaptive_evaluate(tree, q_sorted, kernel, family, ops, p, gradient, mode,
                                      curl)
        return _ordered(tree, phi, grad, gradient, curl)
    if family is not None and family.SCHEME == "grid":
        phi, grad = gauss_transform(tree, q_sorted, kernel, family, p, gradient or curl, mode)
        return _ordered(tree, phi, p2p.curl(grad) if curl else grad, gradient, curl)
    if tree.depth == 0:         # one box: all pairs, as `jfmm.direct` tiles them
        targets = None if tree.shared else tree.tgt_sorted
        phi, grad = backend.dense(kernel, targets, tree.src_sorted, q_sorted, gradient, mode,
                                  curl=curl)
        return _ordered(tree, phi, grad, gradient, curl)
    near = lists.neighbors(tree.depth, tree.dim)
    phi, grad = backend.near_field(kernel, tree.tgt_sorted, tree.tgt_start, tree.src_sorted,
                                   q_sorted, tree.src_start, near, gradient, mode, curl=curl)
    if family is not None and tree.depth >= 2:
        loc = leaf_locals(tree, q_sorted, family, ops, kernel, p, mode)
        fphi, fgrad = leaf_l2p(tree, loc, family, p, gradient or curl, mode)
        if curl:
            grad = grad + p2p.curl(fgrad)
        else:
            phi = phi + fphi
            grad = grad + fgrad if gradient else None
    return _ordered(tree, phi, grad, gradient, curl, config)


def leaf_locals(tree: Tree, q_sorted, family, ops, kernel: kernels.Kernel, p: int,
                mode: str = "jnp"):
    """The leaves' local expansions (n_leaves, K, P) of the sorted charges
    (N, K): all a target needs from the sources beyond its leaf's
    neighbours, whatever the targets."""
    return downward(tree, upward(tree, q_sorted, family, ops, p, mode), family, ops, kernel,
                    p, mode)


def at_targets(tree: Tree, q_sorted, loc, kernel: kernels.Kernel, config: Config,
               mode: str = "jnp"):
    """phi (M, K) at the tree's targets, in the caller's order, from the
    sorted charges (N, K) and their `leaf_locals` (a uniform tree of depth
    >= 2, family of SCHEME "tree"): the near field and the L2P, for targets
    that come after the sources' passes ran (`uniform.with_targets`)."""
    near = lists.neighbors(tree.depth, tree.dim)
    phi, _ = backend.near_field(kernel, tree.tgt_sorted, tree.tgt_start, tree.src_sorted,
                                q_sorted, tree.src_start, near, False, mode)
    fphi, _ = leaf_l2p(tree, loc, config.family, config.order, False, mode)
    return caller_order(tree, phi + fphi, None, False, config)[0]


def _ordered(tree, phi, grad, gradient: bool, curl: bool, config: Config | None = None):
    """`caller_order` of (phi, grad), or with curl of (None, the curl)."""
    if curl:
        return None, caller_order(tree, grad, None, False, config)[0]
    return caller_order(tree, phi, grad, gradient, config)


def hessian(tree: Tree, charges, kernel: kernels.Kernel, config: Config, ops,
            mode: str = "jnp"):
    """Second derivatives of phi along the targets, (M, K, d, d) in the
    caller's target order, on a uniform tree (families of SCHEME "tree", or
    none): the near field's (or all pairs') from `Kernel.hessian_pair` on
    backend `mode`, plus the far field's by forward mode through the jnp
    L2P of the leaves' local expansions, which the passes build once."""
    family, p = config.family, config.order
    q_sorted = charges[tree.src_perm]
    if tree.depth == 0:
        targets = None if tree.shared else tree.tgt_sorted
        h = backend.dense(kernel, targets, tree.src_sorted, q_sorted, False, mode, hessian=True)
        return caller_order(tree, h, None, False, config)[0]
    near = lists.neighbors(tree.depth, tree.dim)
    h = backend.near_field_hessian(kernel, tree.tgt_sorted, tree.tgt_start, tree.src_sorted,
                                   q_sorted, tree.src_start, near, mode)
    if family is not None and tree.depth >= 2:
        loc = leaf_locals(tree, q_sorted, family, ops, kernel, p, mode)

        def far_gradient(shift):
            moved = dataclasses.replace(tree, tgt_sorted=tree.tgt_sorted + shift)
            return leaf_l2p(moved, loc, family, p, True, "jnp")[1]

        h = h + jax.jacfwd(far_gradient)(jnp.zeros(tree.dim, tree.tgt_sorted.dtype))
    return caller_order(tree, h, None, False, config)[0]


def curl_along(tree, charges, along, kernel: kernels.Kernel, config: Config, ops,
               mode: str = "jnp"):
    """The curl of grad phi's derivative along each target's direction,
    (M, K) in the caller's target order, on a uniform or adaptive tree
    (families of SCHEME "tree", or none); charges (N, K), K a multiple of
    3, and along (M, 3) in the caller's orders. The near field's (or all
    pairs') from `Kernel.hessian_pair`, three sums a pair on backend
    `mode`; the far field's (L2P, and an adaptive tree's W lists) by
    forward mode through the jnp twins along the directions: for vortex
    stretching, where `hessian` sums every second derivative."""
    family, p = config.family, config.order
    q_sorted = charges[tree.src_perm]
    a_sorted = along[tree.tgt_perm]
    adaptive_tree = isinstance(tree, adaptive.AdaptiveTree)
    if not adaptive_tree and tree.depth == 0:
        targets = None if tree.shared else tree.tgt_sorted
        c = backend.dense(kernel, targets, tree.src_sorted, q_sorted, False, mode,
                          along=a_sorted)
        return caller_order(tree, c, None, False, config)[0]
    if adaptive_tree:
        near, busy = tree.near, adaptive.busy_leaves(tree, tree.tgt_sorted.shape[0])
    else:
        near, busy = lists.neighbors(tree.depth, tree.dim), None
    c = backend.near_field_along(kernel, tree.tgt_sorted, tree.tgt_start, tree.src_sorted,
                                 q_sorted, tree.src_start, near, a_sorted, mode, leaves=busy)
    if family is not None and tree.depth >= 2:
        if adaptive_tree:
            mult = adaptive_upward(tree, q_sorted, family, ops, p, tree.box_side(tree.level),
                                   mode)
            loc = adaptive_downward(tree, mult, q_sorted, family, ops, kernel, p, mode)
            far = lambda t: _adaptive_far(t, mult, loc, family, kernel, p, True,  # noqa: E731
                                          "jnp")
        else:
            loc = leaf_locals(tree, q_sorted, family, ops, kernel, p, mode)
            far = lambda t: leaf_l2p(t, loc, family, p, True, "jnp")  # noqa: E731
        moved = lambda y: far(dataclasses.replace(tree, tgt_sorted=y))[1]  # noqa: E731
        c = c + p2p.curl(jax.jvp(moved, (tree.tgt_sorted,), (a_sorted,))[1])
    return caller_order(tree, c, None, False, None if adaptive_tree else config)[0]


def leaf_l2p(tree: Tree, loc, family, p: int, gradient: bool, mode: str = "jnp",
             leaves: int | None = None):
    """The leaves' local expansions (n_leaves, K, P) at the sorted targets:
    phi (M, K), grad (M, K, d) or None; leaves: as in `upward`."""
    h = tree.box_side(tree.depth)
    u = (tree.tgt_sorted - tree.leaf_centers(tree.tgt_leaf)) / h
    return backend.l2p(family, u, loc, tree.tgt_start, tree.tgt_leaf, h, p, gradient, mode,
                       leaves)


def gauss_transform(tree: Tree, q_sorted, kernel: kernels.Gaussian, family, p: int,
                    gradient: bool, mode: str = "jnp", combine=None):
    """The fast Gauss transform on the tree's leaves (jfmm.ops.hermite):
    Hermite moments of every leaf, translated to Taylor coefficients of
    every leaf, evaluated at the targets. phi (M, K), grad (M, K, d) or
    None, Morton order. combine: applied to the moments (see `upward`)."""
    scale = jnp.asarray(kernel.epsilon, tree.src_sorted.dtype)   # lengths -> scaled units
    h = tree.box_side(tree.depth)
    s = (tree.src_sorted - tree.leaf_centers(tree.src_leaf)) * scale
    herm = backend.p2m(family, s, q_sorted, tree.src_start, tree.src_leaf, p, mode)
    herm = herm if combine is None else combine(herm)
    loc = family.h2l(herm, scale * h, tree.depth, p)
    t = (tree.tgt_sorted - tree.leaf_centers(tree.tgt_leaf)) * scale
    return backend.l2p(family, t, loc, tree.tgt_start, tree.tgt_leaf, 1 / scale, p, gradient,
                       mode)


# ------------------------------------------------------------------ adaptive

def _blocks(tree: adaptive.AdaptiveTree, level: int, busy):
    """The blocks of siblings `busy` (t,) of level `level` (nblk where
    none): their parents (t,) (B where none) and the blocks of each
    parent's colleagues' children (t, 3^d) (nblk where a colleague is a
    leaf or absent)."""
    off, end = tree.offsets[level], tree.offsets[level + 1]
    ways, total = 2 ** tree.dim, tree.n_boxes
    take = lambda a, i: jnp.take(a, i, axis=0, mode="fill", fill_value=total)  # noqa: E731
    owner = take(tree.parent[off:end:ways], busy)
    first = take(tree.first_child, take(tree.colleagues, owner))
    return owner, jnp.where(first < total, (first - off) // ways, (end - off) // ways)


def _far_list(tree: adaptive.AdaptiveTree, name: str, n_points: int, f, init):
    """f(tree, acc) (a pytree of sums, the list's added to acc) over the W
    (name "w") or X ("x") work list, from acc = init: at once, or on a
    bounded tree in chunks up to the list's count, each adding into the
    sums (not into a zeroed array of its own)."""
    if not tree.caps.bounded:
        return f(tree, init)
    tile, pos = getattr(tree, name + "_tile"), getattr(tree, name + "_pos")
    sentinel = tiles.tile_count(n_points, tree.n_boxes, adaptive.FAR_TILE)   # `far_tiles`
    count = jnp.sum(tile < sentinel, dtype=jnp.int32)
    chunk = adaptive.far_chunk(tile.shape[0])

    def part(start, acc):
        cut = lambda a: jax.lax.dynamic_slice_in_dim(a, start, chunk)   # noqa: E731
        return f(dataclasses.replace(tree, caps=tree.caps._replace(**{name: chunk}),
                                     **{name + "_tile": cut(tile), name + "_pos": cut(pos)}), acc)

    return tiles.until(count, tile.shape[0], chunk, part, init)


def x_lists(tree: adaptive.AdaptiveTree, q_sorted, family, kernel, p: int, mode: str, into):
    """The X lists' P2L added to the locals `into` (B, K, P)."""
    return _far_list(tree, "x", tree.src_sorted.shape[0], lambda t, acc: backend.far_p2l(
        family, kernel, t, q_sorted, p, acc, mode), into)


def w_lists(tree: adaptive.AdaptiveTree, mult, family, kernel, p: int, gradient: bool,
            mode: str, into=None):
    """The W lists' M2P of the multipoles mult (B, K, P) at the sorted
    targets, added to `into` (phi (M, K), grad (M, K, d) or None; None:
    zeros)."""
    if into is None:
        m, (k, d) = tree.tgt_sorted.shape[0], (mult.shape[1], tree.dim)
        into = (jnp.zeros((m, k), mult.dtype),
                jnp.zeros((m, k, d), mult.dtype) if gradient else None)
    return _far_list(tree, "w", tree.tgt_sorted.shape[0], lambda t, acc: jax.tree_util.tree_map(
        jnp.add, acc, backend.far_m2p(family, kernel, t, mult, p, gradient, mode)), into)


def adaptive_upward(tree: adaptive.AdaptiveTree, q_sorted, family, ops, p: int, side,
                    mode: str, combine=None):
    """Multipoles of every box (B, K, P): P2M at the leaves, M2M up to level
    2. combine: as in `upward`."""
    leaf = tree.src_leaf
    u = (tree.src_sorted - tree.center[leaf]) / side[leaf][:, None]
    mult = backend.p2m(family, u, q_sorted, tree.src_start, leaf, p, mode,
                       adaptive.busy_leaves(tree, u.shape[0]))
    mult = mult if combine is None else combine(mult)
    for level in range(tree.depth, 2, -1):
        off, end = tree.offsets[level], tree.offsets[level + 1]
        owner = tree.parent[off:end:2 ** tree.dim]
        mult = mult.at[owner].add(translate.m2m(mult[off:end], ops.m2m), mode="drop")
    return mult


def adaptive_downward(tree: adaptive.AdaptiveTree, mult, q_sorted, family, ops,
                      kernel: kernels.Kernel, p: int, mode: str, m2l=None, combine=None):
    """Local expansions of every box (B, K, P): P2L of the X lists, M2L over
    the V lists (`adaptive_m2l`), then level by level L2L from the parent.
    m2l(grouped, cols, mats): `backend.m2l_blocks` in its place (a device's
    share of it, `jfmm.distributed`); combine: applied to the X lists'
    locals (see `upward`)."""
    loc = x_lists(tree, q_sorted, family, kernel, p, mode, jnp.zeros_like(mult))
    loc = loc if combine is None else combine(loc)
    ways, total = 2 ** tree.dim, tree.n_boxes
    levels = [lv for lv in range(2, tree.depth + 1) if tree.level_blocks(lv).shape[0]]
    tables = [tree.level_blocks(lv) for lv in levels]    # the blocks with targets under them
    blocks = [_blocks(tree, lv, b) for lv, b in zip(levels, tables)]
    far = adaptive_m2l(tree, mult, family, ops, kernel, p, mode, levels,
                       [cols for _, cols in blocks], m2l, tables)
    for level, busy, (owner, _), got in zip(levels, tables, blocks, far):
        off, end = tree.offsets[level], tree.offsets[level + 1]
        if level > 2:                   # levels below 2 hold no locals
            parent = jnp.take(loc, owner, axis=0, mode="fill", fill_value=0)
            got = got + translate.l2l(parent, ops.l2l)
        # unused rows go past the boxes, each to its own place
        first = jnp.where(busy < (end - off) // ways, off + ways * busy,
                          total + ways * jnp.arange(busy.shape[0], dtype=busy.dtype))
        at = (first[:, None] + jnp.arange(ways, dtype=busy.dtype)).reshape(-1)
        loc = loc.at[at].add(got, mode="drop", unique_indices=True)
    return loc


# Where M2L's busy blocks run in chunks of FAR_CHUNK (large trees), those
# past the last whole chunk run in chunks this many times smaller, not
# padded to a whole one (H200, 2^20 Plummer points, float64: 1,706 busy
# blocks ran as 2,048). Smaller trees keep one loop (one trace to compile).
M2L_TAIL = 4


def _busy_only(run, rows, busy, sentinel: int):
    """run(rows) (t 2^d, K, P) for the rows (t, 3^d) marked busy (t,)
    alone, zeros elsewhere: the busy rows gathered to the front and run in
    chunks up to their count (`tiles.until`), whole chunks and then a tail
    of smaller ones (`M2L_TAIL`)."""
    t = rows.shape[0]
    chunk = adaptive.far_chunk(t)
    tail = chunk // M2L_TAIL if chunk == adaptive.FAR_CHUNK else chunk
    size = -(-t // chunk) * chunk
    order, count = adaptive.first_true(busy, size)           # t where none
    packed = jnp.take(rows, order, axis=0, mode="fill", fill_value=sentinel)
    shape = jax.eval_shape(run, packed[:chunk])
    ways = shape.shape[0] // chunk

    def part(width):
        def body(start, acc):
            got = run(jax.lax.dynamic_slice_in_dim(packed, start, width))
            return jax.lax.dynamic_update_slice_in_dim(acc, got, start * ways, 0)
        return body

    out = jnp.zeros((size * ways,) + shape.shape[1:], shape.dtype)
    whole = count // chunk * chunk if tail < chunk else count
    out = tiles.until(whole, size, chunk, part(chunk), out)
    if tail < chunk:
        out = tiles.until(count, size, tail, part(tail), out, first=whole)
    dest = (order[:, None] * ways + jnp.arange(ways, dtype=order.dtype)).reshape(-1)
    return jnp.zeros((t * ways,) + shape.shape[1:], shape.dtype).at[dest].set(
        out, mode="drop", unique_indices=True)


def adaptive_m2l(tree: adaptive.AdaptiveTree, mult, family, ops, kernel: kernels.Kernel,
                 p: int, mode: str, levels, cols, m2l=None, busy_of=None):
    """M2L into the busy blocks of `levels`: for each level, (t 2^d, K, P)
    locals of its t blocks (`tree.level_blocks`, given as busy_of), whose
    colleagues' children are the blocks `cols` (t, 3^d) of that level
    (nblk where none); on a bounded tree only the busy ones are run. M2L
    reads multipoles alone, so levels sharing one array of matrices
    (scaled expansions: 3D Laplace's every level) run as one product over
    their blocks side by side: one large product instead of a small one
    per level of a deep tree."""
    basis = family.m2l_basis(ops)
    ways = 2 ** tree.dim
    groups = []                                        # [matrices, [level index, ...]]
    for i, level in enumerate(levels):
        mats = family.m2l_matrices(ops, kernel, tree.box_side(level), p)
        if groups and groups[-1][0] is mats:
            groups[-1][1].append(i)
        else:
            groups.append([mats, [i]])
    out = []
    for mats, members in groups:
        first = tree.offsets[levels[members[0]]]
        m = mult[first:tree.offsets[levels[members[-1]] + 1]]
        if basis is not None:
            m = jnp.einsum("bkq,eq->bke", m, basis, precision=translate.HIGHEST)
        grouped = m.reshape((-1, ways) + m.shape[1:])
        rows = []
        for i in members:                              # level-local blocks -> the group's
            off, end = tree.offsets[levels[i]], tree.offsets[levels[i] + 1]
            rows.append(jnp.where(cols[i] < (end - off) // ways, cols[i] + (off - first) // ways,
                                  grouped.shape[0]))
        rows = jnp.concatenate(rows)
        run = ((lambda r: backend.m2l_blocks(grouped, r, mats, tree.dim, mode)) if m2l is None
               else (lambda r: m2l(grouped, r, mats)))
        if tree.caps.bounded:
            busy = jnp.concatenate([busy_of[i] < (tree.offsets[levels[i] + 1]
                                                  - tree.offsets[levels[i]]) // ways
                                    for i in members])
            got = _busy_only(run, rows, busy, grouped.shape[0])
        else:
            got = run(rows)
        if basis is not None:
            got = jnp.einsum("bke,eq->bkq", got, basis, precision=translate.HIGHEST)
        sizes = [ways * cols[i].shape[0] for i in members]
        out.extend(jnp.split(got, np.cumsum(sizes)[:-1]))
    return out


def adaptive_evaluate(tree: adaptive.AdaptiveTree, q_sorted, kernel: kernels.Kernel, family,
                      ops, p: int, gradient: bool, mode: str = "jnp", curl: bool = False):
    """phi (M, K), grad (M, K, d) or None at the sorted targets of an
    adaptive tree: the near field over the U lists, and where there is a
    family the far field through the V, W and X lists. curl: as `evaluate`."""
    busy = adaptive.busy_leaves(tree, tree.tgt_sorted.shape[0])
    phi, grad = backend.near_field(kernel, tree.tgt_sorted, tree.tgt_start, tree.src_sorted,
                                   q_sorted, tree.src_start, tree.near, gradient, mode,
                                   leaves=busy, curl=curl)
    if family is None or tree.depth < 2:
        return phi, grad
    gradient = gradient or curl
    mult = adaptive_upward(tree, q_sorted, family, ops, p, tree.box_side(tree.level), mode)
    loc = adaptive_downward(tree, mult, q_sorted, family, ops, kernel, p, mode)
    fphi, fgrad = _adaptive_far(tree, mult, loc, family, kernel, p, gradient, mode, busy)
    if curl:
        return None, grad + p2p.curl(fgrad)
    return phi + fphi, grad + fgrad if gradient else None


def _adaptive_far(tree: adaptive.AdaptiveTree, mult, loc, family, kernel, p: int,
                  gradient: bool, mode: str, busy=None):
    """The far field at the sorted targets of an adaptive tree from its
    multipoles and locals: the L2P and the W lists' M2P, (phi, grad)."""
    side = tree.box_side(tree.level)
    leaf = tree.tgt_leaf
    u = (tree.tgt_sorted - tree.center[leaf]) / side[leaf][:, None]
    into = backend.l2p(family, u, loc, tree.tgt_start, leaf, side, p, gradient, mode, busy)
    return w_lists(tree, mult, family, kernel, p, gradient, mode, into)


def caller_order(tree, phi, grad, gradient: bool, config: Config | None = None):
    """Results in Morton order -> the caller's target order, NaN where
    the tree cannot give them (`valid`)."""
    inv = jnp.zeros_like(tree.tgt_perm).at[tree.tgt_perm].set(
        jnp.arange(tree.tgt_perm.shape[0], dtype=tree.tgt_perm.dtype))
    return valid(tree, phi[inv], grad[inv] if gradient else grad, config)


def valid(tree, phi, grad, config: Config | None = None):
    """phi and grad (or None), NaN where the tree holds non-finite
    coordinates, (adaptive) overflowed its capacities, or (a uniform tree
    with a far field, `config.reach`) has leaves smaller than the distance
    within which the kernel is not the family's."""
    nan = jnp.asarray(jnp.nan, phi.dtype)
    ok = tree.finite & ~getattr(tree, "overflow", False)
    if config is not None and config.reach and config.family is not None and tree.depth >= 2:
        ok = ok & (tree.box_side(tree.depth) >= config.reach)
    return jnp.where(ok, phi, nan), None if grad is None else jnp.where(ok, grad, nan)
