"""The FMM sum sharded over the devices of a one-axis mesh (`jax.shard_map`).

The configuration, the order and the error are the single-device ones;
the work and the points are split. The tree's sorted points are cut into
D equal contiguous ranges, one per device (Morton ranges balanced by
point count). On the uniform tree each device holds only its range of
the points and charges, its block of the caller's points and of the
results, and the tree's leaf table and expansions (O(N / D + leaves)):

    build       `build`: the root box by a min and max over the mesh, the
                leaf counts summed over it, and each point's place in the
                sorted order from them; the points pass round the ring of
                devices and each keeps those of its range (the same tree
                as `jfmm.tree.build`, array for array). Point counts that
                do not divide over the mesh take `jfmm.tree.build` under
                XLA's partitioner instead, which gathers the points.
    charges     to the sorted order, passing round the ring (`_ring`)
    near field  the sorted sources and charges pass round the ring; each
                device sums each block's near neighbours of its targets
    upward      P2M of its own sources into the leaf grid, summed over
                the mesh (a leaf cut by a range boundary gets both parts):
                where D divides 2^d, reduce-scattered to equal Morton
                windows of the boxes (a window's parents are the window
                above) and M2M up each device's windows; else one psum and
                M2M up the whole grid on every device
    downward    M2L into 1/D of every level's boxes (the same windows; the
                dense grid's M2L costs the same per box): where the
                windows nest, a window is a box of the grid and its
                device receives the multipoles of the parents around it
                alone (`_halo_m2l`), L2L runs down the windows and the
                leaves' locals are gathered once; else each level's
                multipoles whole, its locals gathered, L2L down on every
                device
    evaluate    L2P at its own targets; the results pass round the ring to
                the caller's order (`unsort` likewise for the tangents of
                moved points)

A ring step sends one block to the next device (`lax.ppermute`), so a
device holds two blocks at a time, never all N points. The fast Gauss
transform sums its moments the same way and then runs its grid
translation on every device. On an adaptive tree (`jfmm.tree.adaptive`,
whose points are sorted by leaf; every device holds all of them) the near
field over the U lists, P2M and L2P are split the same way, and the M2L
of each level's blocks and the W and X work lists (M2P, P2L) in equal
windows, whose partial sums are reduced over the mesh; M2M and L2L run
whole on every device. Collectives are XLA's (NCCL on GPUs): the same
program runs over the GPUs of one host and, after
`jax.distributed.initialize()`, over many hosts.

Bytes received per device and call on the uniform tree, D devices, N
sources, K charge columns, leaf grid of B boxes with P coefficients (E
after the family's M2L basis), s bytes a value: about (D-1)/D [N (d + 2K)
+ M K (1 + d) + 2 B K P + 8/7 B K E] s (the charges to the sorted order,
the sources and charges round the ring, the results back, the leaf
multipoles summed, every level's locals or multipoles gathered; where D
divides 2^d the last term is the leaf locals' B K P plus, for the M2L,
the multipoles of the parents bordering each device's box alone); an
adaptive tree adds its targets' coordinates, the all-reduce of the X
lists' locals and the reduce-scatter of the W lists' sums, with B its box
count (8/7 is 2^d / (2^d - 1) in 3D: the levels above the leaves). The
memory per device is O(N / D); the bytes are O(N) per device, not O(N /
D): they suit one host's links, where they are a few percent of the work
(docs/BENCHMARKS.md, "Several GPUs"); a locally essential tree, which
exchanges only the halo of neighbour leaves and the coarse levels, would
scale them to many hosts.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jfmm import passes
from jfmm._compat import Tracer
from jfmm.ops import backend, p2p
from jfmm.tree import Tree, adaptive, lists, morton, tiles, uniform


def check_mesh(mesh) -> Mesh:
    """mesh, with its axes of type Auto (the partitioner places the tree's
    sort and gathers), or a ValueError for anything but a one-axis Mesh,
    and inside a `jax.set_mesh` context of Explicit axes (where jfmm's
    placement of its arrays is refused)."""
    if not isinstance(mesh, Mesh) or len(mesh.axis_names) != 1:
        raise ValueError(f"mesh must be a jax.sharding.Mesh with one axis, got {mesh!r}")
    context = jax.sharding.get_abstract_mesh()
    if jax.sharding.AxisType.Explicit in getattr(context, "axis_types", ()):
        raise ValueError("mesh= does not run inside a jax.set_mesh context of Explicit axes: "
                         "call jfmm outside it, or set a mesh with Auto axes")
    auto = jax.sharding.AxisType.Auto
    if tuple(mesh.axis_types) == (auto,):
        return mesh
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(auto,))


def on_mesh(x, mesh: Mesh):
    """A point or charge array placed for a call on `mesh`. Concrete arrays
    committed elsewhere move onto the mesh (whole on each device), and
    those sharded through a mesh of Explicit axes onto the same layout on
    `mesh`'s Auto axes; other values (None, lists) pass. A traced one typed with Explicit
    axes (under jit, grad or vmap) raises: jfmm sorts and gathers the
    points and charges, which arrays of that type do not allow."""
    if not isinstance(x, (jax.Array, Tracer)):
        return x
    sharding = getattr(jax.typeof(x), "sharding", None)
    explicit = jax.sharding.AxisType.Explicit
    if sharding is not None and explicit in getattr(sharding.mesh, "axis_types", ()):
        if isinstance(x, Tracer):
            raise ValueError("under jit, grad or vmap, pass points and charges sharded over a "
                             "mesh with Auto axes (jax.sharding.Mesh(devices, names, "
                             "axis_types=(AxisType.Auto,))) or not sharded: arrays typed with "
                             "Explicit axes cannot be sorted and gathered as jfmm does")
        return jax.device_put(x, NamedSharding(mesh, x.sharding.spec))
    if (not isinstance(x, Tracer) and getattr(x, "committed", False)
            and x.sharding.device_set != set(mesh.devices.flat)):
        return jax.device_put(x, NamedSharding(mesh, PartitionSpec()))
    return x


def sharded(x, mesh: Mesh, axis: int = 0):
    """x constrained to the mesh: its rows (along `axis`) split over the
    devices where they divide evenly, else whole on each. The FMM primitive
    places its results so, which also tells an enclosing jit that the
    computation spans the mesh (the shard_map inside the primitive's
    lowering is invisible to it)."""
    split = [None] * x.ndim
    if x.shape[axis] % mesh.devices.size == 0:
        split[axis] = mesh.axis_names[0]
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, PartitionSpec(*split)))


def _pad(x, n_dev: int, edge: bool):
    """Rows padded to a multiple of n_dev: copies of the last row (points and
    their leaves: sorted order and finite coordinates kept) or zeros."""
    pad = -x.shape[0] % n_dev
    if not pad:
        return x
    fill = jnp.broadcast_to(x[-1:], (pad,) + x.shape[1:]) if edge else jnp.zeros(
        (pad,) + x.shape[1:], x.dtype)
    return jnp.concatenate([x, fill])


def build(sources, targets, depth: int, mesh: Mesh) -> Tree:
    """`jfmm.tree.build` over the devices of `mesh` from points split over
    it in equal row blocks (N and M multiples of the device count; jit-able,
    depth static): the same tree, array for array, its per-point arrays
    split the same way and its leaf table whole on every device, while no
    device holds more than two blocks of points.

    A point's place in the sorted order is its leaf's start (the leaf
    counts summed over the mesh), plus the points of its leaf on the
    devices before its own (the caller's order breaks ties, as the stable
    sort of one device does), plus its rank among its device's points of
    that leaf; the points then pass round the ring of devices (`_ring`)
    and each device keeps those of its block of the order.
    """
    axis, n_dev = mesh.axis_names[0], mesh.devices.size
    sets = (sources,) if targets is None else (sources, targets)
    rows, whole = PartitionSpec(axis), PartitionSpec()
    body = functools.partial(_build_shard, depth=depth, axis=axis, n_dev=n_dev)
    out = jax.shard_map(body, mesh=mesh, in_specs=(rows,) * len(sets),
                        out_specs=(whole, whole, whole) + ((rows, rows, whole, rows),) * len(sets),
                        check_vma=False)(*sets)
    lo, side, finite, src = out[:4]
    tgt = src if targets is None else out[4]
    return Tree(lo, side, *src, *tgt, finite, depth=depth, dim=sources.shape[1],
                shared=targets is None)


def splits(mesh: Mesh, sources, targets) -> bool:
    """Whether `build` takes these points: their counts divide over the mesh."""
    n_dev = mesh.devices.size
    return all(x.shape[0] % n_dev == 0 for x in (sources, targets) if x is not None)


def _build_shard(*sets, depth: int, axis: str, n_dev: int):
    """One device's part of `build`: the root box and finiteness (whole),
    then each point set's block of (perm, sorted, start, leaf)."""
    # The root box's tangents are not used (`jfmm.primitive`), and pmin has no rule.
    lo, hi = zip(*(uniform.bounds(jax.lax.stop_gradient(x)) for x in sets))
    lo = jax.lax.pmin(functools.reduce(jnp.minimum, lo), axis)
    hi = jax.lax.pmax(functools.reduce(jnp.maximum, hi), axis)
    lo, side = uniform.box_of(lo, hi)
    finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in sets]))
    finite = jax.lax.pmin(finite.astype(jnp.int32), axis).astype(bool)
    return (lo, side, finite) + tuple(_sort_shard(x, lo, side, depth, axis, n_dev)
                                      for x in sets)


def _sort_shard(points, lo, side, depth: int, axis: str, n_dev: int):
    """This device's block of `uniform._sort` of points split over the mesh
    in equal row blocks (points: its block): perm (global indices), sorted
    points and leaves of its block of the sorted order, and start whole."""
    nb, d = points.shape
    n, me = nb * n_dev, jax.lax.axis_index(axis)
    if depth == 0:
        zero, count = jnp.zeros(1, jnp.int32), jnp.full(2, n, jnp.int32)
        return (me * nb + jnp.arange(nb, dtype=jnp.int32), points,
                jnp.concatenate([zero, count]), jnp.zeros(nb, jnp.int32))
    keys = uniform.leaf_keys(points, lo, side, depth)
    order = jnp.argsort(keys, stable=True).astype(jnp.int32)
    keys = keys[order]
    own = jnp.zeros(2 ** (d * depth), jnp.int32).at[keys].add(1, indices_are_sorted=True)
    count = jnp.cumsum(jax.lax.psum(own, axis), dtype=jnp.int32)
    start = jnp.concatenate([jnp.zeros(1, jnp.int32), count, jnp.full(1, n, jnp.int32)])
    before = _ring(lambda acc, c, origin: acc + jnp.where(origin < me, c, 0),
                   jnp.zeros_like(own), own, axis, n_dev)
    first = jnp.cumsum(own, dtype=jnp.int32) - own          # this device's start of each leaf
    rank = start[keys] + before[keys] + jnp.arange(nb, dtype=jnp.int32) - first[keys]

    def keep(acc, block, origin):
        *values, rank = block
        slot = _slots(rank, nb, me)
        return tuple(a.at[slot].set(v, mode="drop", unique_indices=True)
                     for a, v in zip(acc, values))

    mine = (points[order], keys, me * nb + order)
    placed, leaf, perm = _ring(keep, tuple(jnp.zeros_like(v) for v in mine), mine + (rank,),
                               axis, n_dev)
    return perm, placed, start, leaf


def _ring(visit, carry, block, axis: str, n_dev: int, others: bool = False):
    """carry after visit(carry, block, origin) of every device's block
    (pytree), its own first, each block passed one step round the ring of
    devices between visits (D - 1 sends of one block, `lax.ppermute`): a
    device holds two blocks at once, never all of them. others: the
    others' blocks alone (the caller visited its own), one traced visit in
    a fori_loop (for heavy visits)."""
    me = jax.lax.axis_index(axis)
    step = [(i, (i + 1) % n_dev) for i in range(n_dev)]

    def send(block):
        return jax.tree_util.tree_map(lambda x: jax.lax.ppermute(x, axis, step), block)

    if others:
        def body(k, state):
            carry, block = state
            block = send(block)
            return visit(carry, block, (me - k) % n_dev), block
        return jax.lax.fori_loop(1, n_dev, body, (carry, block))[0]
    for k in range(n_dev):
        carry = visit(carry, block, (me - k) % n_dev)
        if k < n_dev - 1:
            block = send(block)
    return carry


def _slots(index, rows: int, me):
    """Rows of device me's block for global indices (index // rows == me),
    and distinct rows past the block for the others (dropped by a scatter
    whose indices stay unique, so that it transposes)."""
    past = rows + jnp.arange(index.shape[0], dtype=index.dtype)
    return jnp.where(index // rows == me, index % rows, past)


def _from_callers(values, perm, axis: str, n_dev: int):
    """values[perm] for this device's rows perm (global indices) of values
    split over the mesh in row blocks (values: its block)."""
    nb = values.shape[0]

    def take(acc, block, origin):
        here = (perm // nb == origin).reshape(perm.shape + (1,) * (values.ndim - 1))
        return jnp.where(here, block[perm % nb], acc)

    return _ring(take, jnp.zeros(perm.shape + values.shape[1:], values.dtype), values, axis,
                 n_dev)


def _to_callers(values, perm, axis: str, n_dev: int):
    """The arrays `values` (rows of this device's block) placed at rows
    perm (global indices) of arrays split over the mesh in blocks of as
    many rows: this device's block of each."""
    mb, me = perm.shape[0], jax.lax.axis_index(axis)

    def place(acc, block, origin):
        *values, perm = block
        slot = _slots(perm, mb, me)
        return tuple(a.at[slot].set(v, mode="drop", unique_indices=True)
                     for a, v in zip(acc, values))

    return _ring(place, tuple(jnp.zeros_like(v) for v in values), tuple(values) + (perm,),
                 axis, n_dev)


def unsort(values, perm, mesh: Mesh):
    """values (N, ...) in a tree's sorted order -> the caller's order (row i
    to row perm[i]), passed round the ring of `mesh` (`_to_callers`)."""
    axis, n_dev = mesh.axis_names[0], mesh.devices.size
    rows = PartitionSpec(axis)
    body = lambda v, p: _to_callers((v,), p, axis, n_dev)[0]        # noqa: E731
    out = jax.shard_map(body, mesh=mesh, in_specs=(rows, rows), out_specs=rows, check_vma=False)(
        sharded(_pad(values, n_dev, False), mesh), sharded(_pad_perm(perm, n_dev), mesh))
    return out[:perm.shape[0]]


def _pad_perm(perm, n_dev: int):
    """A permutation padded to a multiple of n_dev rows with the indices
    after its own (the padded rows map to each other)."""
    pad = -perm.shape[0] % n_dev
    return jnp.concatenate([perm, perm.shape[0] + jnp.arange(pad, dtype=perm.dtype)])


def evaluate(tree: Tree, charges, kernel, config, ops, gradient: bool, mode: str = "jnp"):
    """`jfmm.passes.evaluate` over `config.mesh`: phi (M, K) and grad
    (M, K, d) or None at the targets, caller's order (same arguments).
    Per-point arrays are padded to a multiple of the device count and
    split over the mesh in row blocks (`_shard`, `_adaptive_shard`)."""
    mesh = config.mesh
    axis, n_dev = mesh.axis_names[0], mesh.devices.size
    m = tree.tgt_sorted.shape[0]
    # Operators and kernel parameters enter as inputs, whole on every device.
    operators = jax.tree_util.tree_map(jnp.asarray, (ops, kernel))
    static = dict(config=config, depth=tree.depth, dim=tree.dim, axis=axis, n_dev=n_dev,
                  gradient=gradient, mode=mode)
    if isinstance(tree, adaptive.AdaptiveTree):
        local = (tree.src_sorted, charges[tree.src_perm], tree.src_leaf, tree.tgt_sorted,
                 tree.tgt_leaf)
        edges = (True, False, True, True, True)
        body = functools.partial(_adaptive_shard, n=tree.src_sorted.shape[0], **static)
        shared = (tree, operators)
    else:
        local = (tree.src_sorted, tree.src_perm, tree.src_leaf, tree.tgt_sorted, tree.tgt_perm,
                 tree.tgt_leaf, charges)
        edges = (True, None, True, True, None, True, False)
        body = functools.partial(_shard, **static)
        shared = (tree.src_start, tree.tgt_start, tree.lo, tree.side, operators)
    # Padded with copies of the last row (True), zeros (False), or the
    # indices after a permutation's (None).
    local = [sharded(_pad_perm(x, n_dev) if edge is None else _pad(x, n_dev, edge), mesh)
             for x, edge in zip(local, edges)]
    rows, whole = PartitionSpec(axis), PartitionSpec()
    outs = jax.shard_map(body, mesh=mesh, in_specs=(rows,) * len(local) + (whole,) * len(shared),
                         out_specs=(rows, rows) if gradient else (rows,),
                         check_vma=False)(*local, *shared)
    phi, grad = outs[0][:m], (outs[1][:m] if gradient else None)
    if isinstance(tree, adaptive.AdaptiveTree):         # its shards sum in Morton order
        return passes.caller_order(tree, phi, grad, gradient, config)
    return passes.valid(tree, phi, grad, config)


def _shard(src, src_perm, src_leaf, tgt, tgt_perm, tgt_leaf, q_in, src_start, tgt_start, lo, side,
           operators, *, config, depth: int, dim: int, axis: str, n_dev: int, gradient: bool,
           mode: str):
    """One device's part on a uniform tree: phi (m, K) and grad (m, K, d) at
    its block of the caller's targets, from its blocks of the sorted
    sources and targets and of the caller's charges. The charges come to
    the sorted order, the sorted sources pass round the ring for the near
    field, and the results go back to the caller's order, each by `_ring`."""
    ops, kernel = operators
    me = jax.lax.axis_index(axis)
    nb, mb = src.shape[0], tgt.shape[0]
    q = _from_callers(q_in, src_perm, axis, n_dev)
    # This device's rows of each leaf: the global ranges shifted and clipped.
    mine = Tree(lo, side, None, src, jnp.clip(src_start - me * nb, 0, nb), src_leaf, None, tgt,
                jnp.clip(tgt_start - me * mb, 0, mb), tgt_leaf, jnp.ones((), bool),
                depth=depth, dim=dim)
    family, p = config.family, config.order
    combine = functools.partial(jax.lax.psum, axis_name=axis)
    if family is not None and family.SCHEME == "grid":
        phi, grad = passes.gauss_transform(mine, q, kernel, family, p, gradient, mode,
                                           combine=combine)
        return _to_callers((phi, grad) if gradient else (phi,), tgt_perm, axis, n_dev)

    # A block of the order holds points of about 1/D of the leaves: the
    # tiled kernels loop over the tiles that many leaves take, as many
    # times as the block's points need, not over every leaf of the grid.
    nleaf = 2 ** (dim * depth)
    busy = -(-nleaf // n_dev) + 1 if n_dev > 1 else None

    if depth:                   # the neighbours' source rows, clipped to each block
        near = lists.neighbors(depth, dim)
        r0, r1, used = p2p.source_ranges(near, src_start)

    def pairs(origin, src, q, own: bool):
        """The near field (all pairs at depth 0) of the sorted sources of
        device origin's block at this device's targets; from another's
        block (own False), at the leaves that neighbour its sources alone."""
        if depth == 0:
            return backend.dense(kernel, tgt, src, q, gradient, mode)
        clip = lambda r: jnp.clip(r - origin * nb, 0, nb)       # noqa: E731
        ranges = (clip(r0), clip(r1), used)
        active = None if own else jnp.any(ranges[1] > ranges[0], axis=1)
        return backend.near_field(kernel, tgt, mine.tgt_start, src, q, clip(src_start), near,
                                  gradient, mode, leaves=None if active is not None else busy,
                                  ranges=ranges, active=active)

    def visit(acc, block, origin):
        return tuple(a + o for a, o in zip(acc, pairs(origin, *block, False)))

    out = tuple(o for o in pairs(me, src, q, True) if o is not None)
    out = _ring(visit, out, (src, q), axis, n_dev, others=True)
    if family is not None and depth >= 2:
        # Where D divides 2^d, each device's Morton window of a level's boxes
        # holds the children of its window of the level above: M2M, M2L and
        # L2L run on the windows (the M2L with the parents around its box,
        # `_halo_m2l`), and the leaves' locals are gathered once for the L2P.
        nest = 2 ** dim % n_dev == 0
        split = functools.partial(jax.lax.psum_scatter, axis_name=axis, tiled=True)
        mult = passes.upward(mine, q, family, ops, p, mode, combine=split if nest else combine,
                             leaves=busy)
        window = functools.partial(_window_m2l, dim=dim, axis=axis, n_dev=n_dev, mode=mode,
                                   windows=nest)
        loc = passes.downward(mine, mult, family, ops, kernel, p, mode, m2l=window)
        if nest:
            loc = jax.lax.all_gather(loc, axis, tiled=True)
        far = passes.leaf_l2p(mine, loc, family, p, gradient, mode, leaves=busy)
        out = tuple(a + f for a, f in zip(out, far) if f is not None)
    return _to_callers(out, tgt_perm, axis, n_dev)


def _adaptive_shard(src, q, src_leaf, tgt, tgt_leaf, tree, operators, *, config, n: int,
                    depth: int, dim: int, axis: str, n_dev: int, gradient: bool, mode: str):
    """`_shard` on an adaptive tree (`passes.adaptive_evaluate`), whole on
    every device: the near field over the U lists at this device's targets,
    P2M of its sources summed over the mesh, the M2L of each level's
    blocks and the W and X work lists split in windows (their partial
    sums reduced over the mesh); M2M and L2L on every device."""
    ops, kernel = operators
    me = jax.lax.axis_index(axis)
    m = tgt.shape[0]
    mine = dataclasses.replace(
        tree, src_sorted=src, src_start=jnp.clip(tree.src_start - me * src.shape[0], 0,
                                                 src.shape[0]),
        src_leaf=src_leaf, tgt_sorted=tgt, tgt_leaf=tgt_leaf,
        tgt_start=jnp.clip(tree.tgt_start - me * m, 0, m))
    q_all = jax.lax.all_gather(q, axis, tiled=True)[:n]
    phi, grad = backend.near_field(kernel, tgt, mine.tgt_start, tree.src_sorted, q_all,
                                   tree.src_start, tree.near, gradient, mode)
    family, p = config.family, config.order
    if family is not None and tree.depth >= 2:
        side = tree.box_side(tree.level)
        combine = functools.partial(jax.lax.psum, axis_name=axis)
        mult = passes.adaptive_upward(mine, q, family, ops, p, side, mode, combine=combine)
        window = functools.partial(_window_blocks, dim=dim, axis=axis, n_dev=n_dev, mode=mode)
        # Each device takes a window of the W and X work lists over all points.
        win = functools.partial(_window, me=me, n_dev=n_dev, bounded=tree.caps.bounded)
        share = dataclasses.replace(tree, w_tile=win(tree.w_tile), w_pos=win(tree.w_pos),
                                    x_tile=win(tree.x_tile), x_pos=win(tree.x_pos))
        loc = passes.adaptive_downward(share, mult, q_all, family, ops, kernel, p, mode,
                                       m2l=window, combine=combine)
        lphi, lgrad = backend.l2p(family, (tgt - tree.center[tgt_leaf]) / side[tgt_leaf][:, None],
                                  loc, mine.tgt_start, tgt_leaf, side, p, gradient, mode)
        wphi, wgrad = passes.w_lists(share, mult, family, kernel, p, gradient, mode)
        mine_rows = functools.partial(jax.lax.psum_scatter, axis_name=axis, tiled=True)
        phi = phi + lphi + mine_rows(_pad(wphi, n_dev, False))
        grad = grad + lgrad + mine_rows(_pad(wgrad, n_dev, False)) if gradient else None
    return _outputs((phi, grad), gradient)


def _window(work, me, n_dev: int, bounded: bool):
    """Device me's equal share of a work list (W, X), padded with entries
    past every tile (dead ones); on a bounded tree a multiple of the chunks
    its loop takes (`adaptive.far_chunk`)."""
    width = -(-work.shape[0] // n_dev)
    while bounded and width % adaptive.far_chunk(width):
        width = tiles.round_up(width, adaptive.far_chunk(width))
    padded = jnp.concatenate([work, jnp.full((n_dev * width - work.shape[0],),
                                             jnp.iinfo(jnp.int32).max, work.dtype)])
    return jax.lax.dynamic_slice_in_dim(padded, me * width, width)


def _outputs(result, gradient: bool):
    phi, grad = result
    return (phi, grad) if gradient else (phi,)


def _window_m2l(mult, level: int, mats, *, dim: int, axis: str, n_dev: int, mode: str,
                windows: bool = False):
    """The M2L of one level of the dense grid (`_window_blocks` over its
    blocks of siblings): locals of every box (2^(d level), K, P) from the
    multipoles of every box; windows: of this device's window of the boxes
    from its window of the multipoles (D dividing 2^d, `_halo_m2l`)."""
    nc = 2 ** dim
    grouped = mult.reshape((-1, nc) + mult.shape[1:])
    if windows and n_dev > 1:
        return _halo_m2l(grouped, level, mats, dim=dim, axis=axis, n_dev=n_dev, mode=mode)
    return _window_blocks(grouped, lists.neighbors(level - 1, dim), mats, dim=dim, axis=axis,
                          n_dev=n_dev, mode=mode, gather=not windows)


@functools.lru_cache(maxsize=None)
def _window_boxes(parent_level: int, dim: int, n_dev: int) -> np.ndarray:
    """(D, 2, d) int32: the box [lo, hi) of parent boxes (coordinates at
    parent_level >= 1) that each device's equal Morton window covers, D
    dividing 2^d: its 2^d / D consecutive octants of the root."""
    g, per = 2 ** parent_level, 2 ** dim // n_dev
    boxes = np.zeros((n_dev, 2, dim), np.int32)
    for j in range(n_dev):
        bits = (np.arange(j * per, (j + 1) * per)[:, None] >> np.arange(dim)) & 1
        for a in range(dim):
            lo, hi = bits[:, a].min(), bits[:, a].max()
            boxes[j, :, a] = (0, g) if lo != hi else (lo * g // 2, (lo + 1) * g // 2)
    return boxes


def _dilated(boxes: np.ndarray, g: int):
    """Boxes grown by one parent box on every side, within [0, g)."""
    return np.stack([np.maximum(boxes[:, 0] - 1, 0), np.minimum(boxes[:, 1] + 1, g)], axis=1)


@functools.lru_cache(maxsize=None)
def halo_counts(parent_level: int, dim: int, n_dev: int) -> tuple[int, ...]:
    """Parents a device sends in each step k = 1 .. D-1 of `_halo_m2l`
    (to the device k after it): the largest overlap of a device's box
    with the grown box of the device k after it, over the devices."""
    boxes = _window_boxes(parent_level, dim, n_dev)
    grown = _dilated(boxes, 2 ** parent_level)
    out = []
    for k in range(1, n_dev):
        other = np.roll(grown, -k, axis=0)
        over = np.maximum(np.minimum(boxes[:, 1], other[:, 1])
                          - np.maximum(boxes[:, 0], other[:, 0]), 0)
        out.append(int(np.prod(over, axis=1).max()))
    return tuple(out)


def _overlap(a, b):
    """The box where boxes a and b (..., 2, d) overlap: lo, hi (hi >= lo)."""
    lo = jnp.maximum(a[..., 0, :], b[..., 0, :])
    return lo, jnp.maximum(jnp.minimum(a[..., 1, :], b[..., 1, :]), lo)


def _cells(lo, hi, count: int):
    """(count, d) the cells of box [lo, hi) in raster order (axis 0
    fastest), and (count,) which of them are in it (the rest pad)."""
    ext = hi - lo
    m = jnp.arange(count, dtype=jnp.int32)
    coords, rest = [], m
    for a in range(lo.shape[0]):
        e = jnp.maximum(ext[a], 1)
        coords.append(lo[a] + rest % e)
        rest = rest // e
    return jnp.stack(coords, axis=-1), m < jnp.prod(ext)


def _halo_m2l(grouped, level: int, mats, *, dim: int, axis: str, n_dev: int, mode: str):
    """The M2L into this device's window of target parents at level - 1
    (a box of the parent grid, `_window_boxes`) from its window of the
    multipoles (grouped: (w, 2^d, K, P)) and those of the parents around
    it, which the other devices send (one `lax.ppermute` a ring distance,
    only the parents the receiver's box borders): (w 2^d, K, P), locals
    of its window. The multipoles sit in a local grid over the box grown
    by one parent (raster order); a device never holds a whole level."""
    pl, w = level - 1, grouped.shape[0]
    g = 2 ** pl
    boxes = _window_boxes(pl, dim, n_dev)
    grown = _dilated(boxes, g)
    ext = (grown[:, 1] - grown[:, 0]).max(axis=0)                  # (d,) local grid
    size = int(np.prod(ext))
    strides = jnp.asarray(np.cumprod(np.concatenate([[1], ext[:-1]])), jnp.int32)
    me = jax.lax.axis_index(axis)
    box, near = jnp.asarray(boxes), jnp.asarray(grown)

    def slots(coords):                                              # raster in my grown box
        return jnp.sum((coords - near[me, 0]) * strides, axis=-1)

    own = morton.decode(me * w + jnp.arange(w, dtype=jnp.int32), pl, dim)
    local = jnp.zeros((size,) + grouped.shape[1:], grouped.dtype).at[slots(own)].set(
        grouped, unique_indices=True)
    for k, count in enumerate(halo_counts(pl, dim, n_dev), start=1):
        if count == 0:
            continue
        # Sent: my parents in the grown box of device me + k, in its raster order.
        cells, valid = _cells(*_overlap(box[me], near[(me + k) % n_dev]), count)
        rows = jnp.where(valid, morton.encode(cells, pl) - me * w, w)
        block = jnp.take(grouped, rows, axis=0, mode="fill", fill_value=0)
        block = jax.lax.ppermute(block, axis, [(i, (i + k) % n_dev) for i in range(n_dev)])
        # Received: device me - k's parents in my grown box, in the same order.
        cells, valid = _cells(*_overlap(box[(me - k) % n_dev], near[me]), count)
        local = local.at[jnp.where(valid, slots(cells), size)].set(block, mode="drop",
                                                                    unique_indices=True)
    disp = jnp.asarray(lists.near_displacements(dim))
    nb = own[:, None, :] + disp[None]                               # (w, 3^d, d)
    inside = jnp.all((nb >= 0) & (nb < g), axis=-1)
    cols = jnp.where(inside, slots(nb), size)
    return backend.m2l_blocks(local, cols, mats, dim, mode)


def _window_blocks(grouped, cols, mats, *, dim: int, axis: str, n_dev: int, mode: str,
                   gather: bool = True):
    """`backend.m2l_blocks` with each device translating into a window of
    ceil(t / D) of the t target blocks: that window's locals (ceil(t / D)
    2^d, K, P), all-gathered where gather (t 2^d, K, P)."""
    t, b = cols.shape[0], grouped.shape[0]
    width = -(-t // n_dev)
    rows = jax.lax.axis_index(axis) * width + jnp.arange(width)
    mine = jnp.where(rows[:, None] < t, cols[jnp.minimum(rows, t - 1)], b)
    far = backend.m2l_blocks(grouped, mine, mats, dim, mode)
    return jax.lax.all_gather(far, axis, tiled=True)[:t * 2 ** dim] if gather else far
