"""The FMM sum sharded over the devices of a one-axis mesh (`jax.shard_map`).

The tree is the tree of one device (the uniform tree built by XLA's
partitioner on sharded points, or an adaptive plan's), so the
configuration, the order and the error are the single-device ones; the
work is split, while every device holds all the points and the whole
tree's expansions. The tree's sorted points are cut into D equal
contiguous ranges, one per device (Morton ranges balanced by point count).
Each device then, per call:

    near field  all-gathers the sorted sources and charges, and sums the
                near neighbours of its own targets
    upward      P2M of its own sources into the leaf grid, one psum over
                the mesh (a leaf cut by a range boundary gets both parts),
                then M2M up on every device (the same on each, and cheap)
    downward    M2L of 1/D of every level's boxes (equal Morton windows of
                the dense grid, whose M2L costs the same per box),
                all-gathered level by level, then L2L down on every device
    evaluate    L2P at its own targets

The fast Gauss transform sums its moments the same way and then runs its
grid translation on every device. On an adaptive tree (`jfmm.tree.adaptive`,
whose points are sorted by leaf) the near field over the U lists, P2M and
L2P are split the same way, and the M2L of each level's blocks and the W
and X work lists (M2P, P2L) in equal windows, whose partial sums are
reduced over the mesh; M2M and L2L run whole on every device. Collectives
are XLA's (NCCL on GPUs): the same program runs over the GPUs of one host
and, after `jax.distributed.initialize()`, over many hosts.

Bytes received per device and call on the uniform tree, D devices, N
sources, K charge columns, leaf grid of B boxes with P coefficients (E
after the family's M2L basis), s bytes a value: (D-1)/D [N (d + K) +
2 B K P + 8/7 B K E] s (the all-gather of the points, a ring all-reduce of
the leaf multipoles, the all-gathers of the locals); an adaptive tree adds
its targets' coordinates, the all-reduce of the X lists' locals and the
reduce-scatter of the W lists' sums, with B its box count (8/7 is
2^d / (2^d - 1) in 3D: the levels above the leaves). This is O(N)
per device, not O(N / D): it suits one host's links, where it is a few
percent of the work (docs/BENCHMARKS.md, "Several GPUs"); a locally
essential tree, which exchanges only the halo and the coarse levels, would
scale it to many hosts.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jfmm import passes
from jfmm._compat import Tracer
from jfmm.ops import backend
from jfmm.tree import Tree, adaptive, lists, tiles


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


def evaluate(tree: Tree, charges, kernel, config, ops, gradient: bool, mode: str = "jnp"):
    """`jfmm.passes.evaluate` over `config.mesh`: phi (M, K) and grad
    (M, K, d) or None at the targets, caller's order (same arguments)."""
    mesh = config.mesh
    axis = mesh.axis_names[0]
    n_dev = mesh.devices.size
    n, m = tree.src_sorted.shape[0], tree.tgt_sorted.shape[0]
    q_sorted = charges[tree.src_perm]
    local = (_pad(tree.src_sorted, n_dev, True), _pad(q_sorted, n_dev, False),
             _pad(tree.src_leaf, n_dev, True), _pad(tree.tgt_sorted, n_dev, True),
             _pad(tree.tgt_leaf, n_dev, True))
    local = [sharded(x, mesh) for x in local]
    # Operators and kernel parameters enter as inputs, whole on every device.
    operators = jax.tree_util.tree_map(jnp.asarray, (ops, kernel))
    static = dict(config=config, n=n, depth=tree.depth, dim=tree.dim, axis=axis, n_dev=n_dev,
                  gradient=gradient, mode=mode)
    if isinstance(tree, adaptive.AdaptiveTree):
        body = functools.partial(_adaptive_shard, **static)
        shared = (tree, operators)
    else:
        body = functools.partial(_shard, **static)
        shared = (tree.src_start, tree.tgt_start, tree.lo, tree.side, operators)
    rows, whole = PartitionSpec(axis), PartitionSpec()
    outs = jax.shard_map(body, mesh=mesh, in_specs=(rows,) * 5 + (whole,) * len(shared),
                         out_specs=(rows, rows) if gradient else (rows,),
                         check_vma=False)(*local, *shared)
    phi, grad = outs[0][:m], (outs[1][:m] if gradient else None)
    return passes.caller_order(tree, phi, grad, gradient, config)


def _shard(src, q, src_leaf, tgt, tgt_leaf, src_start, tgt_start, lo, side, operators, *,
           config, n: int, depth: int, dim: int, axis: str, n_dev: int, gradient: bool,
           mode: str):
    """One device's part: phi (m, K) and grad (m, K, d) at its m sorted
    targets, from its n / D sorted sources and the collectives."""
    ops, kernel = operators
    me = jax.lax.axis_index(axis)
    first_src, first_tgt = me * src.shape[0], me * tgt.shape[0]
    # This device's rows of each leaf: the global ranges shifted and clipped.
    mine = Tree(lo, side, None, src, jnp.clip(src_start - first_src, 0, src.shape[0]),
                src_leaf, None, tgt, jnp.clip(tgt_start - first_tgt, 0, tgt.shape[0]),
                tgt_leaf, jnp.ones((), bool), depth=depth, dim=dim)
    gather = functools.partial(jax.lax.all_gather, axis_name=axis, tiled=True)
    src_all, q_all = gather(src)[:n], gather(q)[:n]
    family, p = config.family, config.order
    if family is not None and family.SCHEME == "grid":
        combine = functools.partial(jax.lax.psum, axis_name=axis)
        return _outputs(passes.gauss_transform(mine, q, kernel, family, p, gradient, mode,
                                               combine=combine), gradient)
    if depth == 0:
        return _outputs(backend.dense(kernel, tgt, src_all, q_all, gradient, mode), gradient)
    near = lists.neighbors(depth, dim)
    phi, grad = backend.near_field(kernel, mine.tgt_sorted, mine.tgt_start, src_all, q_all,
                                   src_start, near, gradient, mode)
    if family is not None and depth >= 2:
        combine = functools.partial(jax.lax.psum, axis_name=axis)
        mult = passes.upward(mine, q, family, ops, p, mode, combine=combine)
        window = functools.partial(_window_m2l, dim=dim, axis=axis, n_dev=n_dev, mode=mode)
        loc = passes.downward(mine, mult, family, ops, kernel, p, mode, m2l=window)
        fphi, fgrad = passes.leaf_l2p(mine, loc, family, p, gradient, mode)
        phi = phi + fphi
        grad = grad + fgrad if gradient else None
    return _outputs((phi, grad), gradient)


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
        coef = family.l2p_coefficients(loc, p, gradient)
        lphi, lgrad = backend.l2p(family, (tgt - tree.center[tgt_leaf]) / side[tgt_leaf][:, None],
                                  coef, mine.tgt_start, tgt_leaf, side, p, gradient, mode)
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


def _window_m2l(mult, level: int, mats, *, dim: int, axis: str, n_dev: int, mode: str):
    """The M2L of one level of the dense grid (`_window_blocks` over its
    blocks of siblings): locals of every box (2^(d level), K, P)."""
    nc = 2 ** dim
    grouped = mult.reshape((-1, nc) + mult.shape[1:])
    return _window_blocks(grouped, lists.neighbors(level - 1, dim), mats, dim=dim, axis=axis,
                          n_dev=n_dev, mode=mode)


def _window_blocks(grouped, cols, mats, *, dim: int, axis: str, n_dev: int, mode: str):
    """`backend.m2l_blocks` with each device translating into a window of
    ceil(t / D) of the t target blocks, all-gathered: (t 2^d, K, P)."""
    t, b = cols.shape[0], grouped.shape[0]
    width = -(-t // n_dev)
    rows = jax.lax.axis_index(axis) * width + jnp.arange(width)
    mine = jnp.where(rows[:, None] < t, cols[jnp.minimum(rows, t - 1)], b)
    far = backend.m2l_blocks(grouped, mine, mats, dim, mode)
    return jax.lax.all_gather(far, axis, tiled=True)[:t * 2 ** dim]
