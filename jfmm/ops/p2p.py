"""Direct particle-to-particle interactions for any radial kernel (jnp).

The tile function `pairwise` is the specification that a Pallas kernel of
the same signature must match. `dense` sums all pairs; `near_field` sums the
pairs of neighbouring leaves of a tree. Both keep memory at
O((N + M) + tile^2) per mapped tile and handle any leaf occupancy: targets
are cut into leaf-aligned tiles, and each tile walks its neighbours' source
ranges in chunks with a loop whose trip count is data-dependent, so nothing
is sized by the data.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jfmm.kernels import Kernel
from jfmm.tree.tiles import leaf_tiles  # noqa: F401 (the Pallas kernels tile alike)
from jfmm.tree.tiles import round_up as _round_up
from jfmm.tree.tiles import tile_count as _tile_count

# Targets per tile of the jnp near field.
TILE = 64

HIGHEST = jax.lax.Precision.HIGHEST


def pairwise(kernel: Kernel, y, x, q, mask, gradient: bool):
    """Sum over a tile of sources for a tile of targets.

    y: (T, d) targets; x: (S, d) sources; q: (S, K) charges;
    mask: (S,) bool, sources to include. Returns phi (T, K) and, if
    gradient, grad (T, K, d) = d phi / d y. Singular kernels skip r = 0.

    The differences are one (T, S) array per axis: a minor axis of d = 2
    or 3 does not vectorise on a CPU (2-core CPU, 2^16 points, 3D Laplace
    float64 with gradient, the cube's near field: 0.9 s per axis, 1.7 s as
    one (d, T, S) array, 3.1 s as (T, S, d)). Compiled without XLA's
    optimisations (`jax_disable_most_optimizations`, the test suite's
    setting), where nothing vectorises, one (T, S, d) array: the fewest
    operations to compile.
    """
    if jax.config.read("jax_disable_most_optimizations"):
        diff = y[:, None, :] - x[None, :, :]
        r2 = jnp.sum(diff * diff, axis=-1)
        along = lambda g, q: jnp.einsum("tsd,sk->tkd", diff * g[..., None], q,  # noqa: E731
                                     precision=HIGHEST)
    else:
        diffs = [y[:, i, None] - x[None, :, i] for i in range(y.shape[1])]
        r2 = sum(v * v for v in diffs)
        along = lambda g, q: jnp.stack([jnp.dot(g * v, q, precision=HIGHEST)  # noqa: E731
                                     for v in diffs], axis=-1)
    k, g = kernel.pair(r2, gradient)  # finite everywhere, so masking q suffices
    q = jnp.where(mask[:, None], q, 0)
    phi = jnp.dot(k, q, precision=HIGHEST)
    return phi, (along(g, q) if gradient else None)


def squared_distances(y, x):
    """|y_i - x_j|^2 (T, S) of y (T, d) and x (S, d), one (T, S) array per
    axis (a minor axis of d does not vectorise on a CPU: 512 local RBF
    systems of 384 points, 0.30 s against 0.64 s)."""
    return sum((y[:, i, None] - x[None, :, i]) ** 2 for i in range(y.shape[1]))


def _map(f, xs, batch: int):
    """lax.map with `batch` tiles vectorised per step. The tile count must
    be a multiple of batch: a remainder would trace and compile f twice."""
    assert jax.tree_util.tree_leaves(xs)[0].shape[0] % batch == 0
    return jax.lax.map(f, xs, batch_size=batch)


def default_batch(n_tiles: int) -> int:
    """Tiles per mapped step: all at once on accelerators, a few on CPU (a
    vectorised data-dependent loop runs to the largest trip count; one
    tile a step runs 6x slower: 2-core CPU, 2^16 points, the cube's near
    field 0.90, 1.12, 6.1 and 1.10 s at 4, 2, 1 and 8 tiles a step)."""
    if jax.default_backend() == "cpu":
        return max(1, min(n_tiles, 4))
    return max(1, n_tiles)


def pad_rows(a, n, value=0):
    """a with n rows of `value` appended (so fixed-size slices never leave it)."""
    return jnp.concatenate([a, jnp.full((n,) + a.shape[1:], value, a.dtype)])


# The CPU's all-pairs sum: tiles of CPU_TILE targets against source chunks
# of CPU_SOURCES, the chunks unrolled where there are at most CPU_CHUNKS
# (a rolled loop over source chunks ran 2-3x slower on a 2-core CPU).
CPU_TILE, CPU_SOURCES, CPU_CHUNKS = 32, 4096, 16


def dense(kernel: Kernel, targets, sources, charges, gradient: bool,
          tile: int = 256, batch: int | None = None):
    """All-pairs sum. targets (M, d), sources (N, d), charges (N, K).

    Target tiles of `tile` against source chunks of `tile`, `batch` target
    tiles a step; on a CPU, up to CPU_CHUNKS * CPU_SOURCES sources, tiles
    of CPU_TILE against unrolled chunks of CPU_SOURCES (2-core CPU, 2x10^4
    points, 3D, float64, jfmm.direct: the linear kernel 0.28 s against 0.52
    s, Laplace 0.35 s against 1.08 s; with the gradient 1.0 s against 2.8
    s). Temporaries O(CPU_TILE (N + M)) under grad and vmap."""
    m, d = targets.shape
    n, kq = charges.shape
    chunk, unroll = tile, 1
    if batch is None and jax.default_backend() == "cpu" and n <= CPU_CHUNKS * CPU_SOURCES:
        tile, chunk, batch, unroll = CPU_TILE, min(n, CPU_SOURCES), 1, True
    nt, ns = -(-m // tile), -(-n // chunk)
    batch = batch or default_batch(nt)
    nt = _round_up(nt, batch)
    y = pad_rows(targets, nt * tile - m).reshape(nt, tile, d)
    x = pad_rows(sources, ns * chunk - n).reshape(ns, chunk, d)
    q = pad_rows(charges, ns * chunk - n).reshape(ns, chunk, kq)
    valid = (jnp.arange(ns * chunk) < n).reshape(ns, chunk)

    def one_tile(yt):
        def body(acc, src):
            xs, qs, ms = src
            phi, grad = pairwise(kernel, yt, xs, qs, ms, gradient)
            return (acc[0] + phi, acc[1] + grad if gradient else None), None
        init = (jnp.zeros((tile, kq), yt.dtype),
                jnp.zeros((tile, kq, d), yt.dtype) if gradient else None)
        return jax.lax.scan(body, init, (x, q, valid), unroll=unroll)[0]

    phi, grad = _map(one_tile, y, batch)
    phi = phi.reshape(nt * tile, kq)[:m]
    grad = grad.reshape(nt * tile, kq, d)[:m] if gradient else None
    return phi, grad


def any_coincide(a, b=None):
    """Whether two rows of a are equal (b None) or a row of b equals a row of
    a: one lexicographic sort of the rows, O(n log n). -0.0 counts as 0.0
    (the distance is 0); NaN rows equal nothing."""
    pts = a if b is None else jnp.concatenate([a, b])
    side = jnp.arange(pts.shape[0]) >= a.shape[0]
    pts = jnp.where(pts == 0, jnp.zeros_like(pts), pts)   # -0.0 -> 0.0 before sorting
    *cols, side = jax.lax.sort([*pts.T, side], num_keys=pts.shape[1])
    same = jnp.all(jnp.stack([c[1:] == c[:-1] for c in cols]), axis=0)
    if b is not None:  # equal runs holding both sets have a mixed adjacent pair
        same = same & (side[1:] != side[:-1])
    return jnp.any(same)


def scatter_tiles(phi_t, grad_t, t0, t1, m: int):
    """Per-tile results back to sorted target rows.

    phi_t (n_tiles, T, K), grad_t (n_tiles, T, K, d) or None; tile k holds
    rows [t0[k], t1[k]). Rows past a tile's end go to a dropped row m.
    """
    n_tiles, tile = phi_t.shape[:2]
    rows = t0[:, None] + jnp.arange(tile)[None, :]
    rows = jnp.where(rows < t1[:, None], rows, m).reshape(-1)

    def put(t):
        flat = t.reshape((-1,) + t.shape[2:])
        return jnp.zeros((m + 1,) + flat.shape[1:], t.dtype).at[rows].set(flat)[:m]

    return put(phi_t), None if grad_t is None else put(grad_t)


def source_ranges(near, src_start):
    """Source ranges of each leaf's near neighbours, touching ones merged.

    near: (nleaf, W) neighbour leaves (sentinel nleaf), or (nleaf, W, 2)
    ranges of leaf slots [first, end) (an adaptive tree's U lists; [nleaf,
    nleaf + 1) where none) whose sources are consecutive; src_start:
    (nleaf + 2,). Returns s0, s1 (nleaf + 1, W) int32: ranges [s0, s1) in
    ascending order, and n (nleaf + 1,) int32, how many are in use (the rest
    are empty); the last row, for the sentinel leaf of padded target tiles,
    is empty. Neighbours whose leaves are consecutive in Morton order hold
    consecutive sources, so in 3D the 27 ranges of an interior leaf merge
    into 12-14 (fewer loop steps, and fewer partly filled chunks at the ends
    of ranges).
    """
    if near.ndim == 3:
        order = jnp.argsort(near[..., 0], axis=1)
        first, end = (jnp.take_along_axis(near[..., k], order, axis=1) for k in (0, 1))
    else:
        first = jnp.sort(near, axis=1)
        end = first + 1
    s0, s1 = src_start[first], src_start[end]
    opens = jnp.concatenate([jnp.ones_like(s0[:, :1], bool), s0[:, 1:] != s1[:, :-1]], axis=1)
    run = jnp.cumsum(opens, axis=1) - 1
    rows = jnp.arange(first.shape[0])[:, None]
    m0 = jnp.zeros_like(s0).at[rows, run].max(jnp.where(opens, s0, 0))
    m1 = jnp.zeros_like(s1).at[rows, run].max(s1)
    n = run[:, -1] + 1
    return tuple(pad_rows(a.astype(jnp.int32), 1) for a in (m0, m1, n))


def near_field(kernel: Kernel, tgt_sorted, tgt_start, src_sorted, q_sorted, src_start,
               near, gradient: bool, tile: int = TILE, batch: int | None = None, tiles=None,
               ranges=None):
    """Sum over the sources of each target leaf's near neighbours.

    tgt_sorted (M, d), src_sorted (N, d), q_sorted (N, K): Morton-sorted;
    tgt_start, src_start (nleaf + 2,): leaf ranges with an empty sentinel leaf;
    near (nleaf, 3^d): neighbour leaves, sentinel nleaf (or slot ranges,
    `source_ranges`).
    tiles: (leaf, t0, t1) of the target tiles to run (`leaf_tiles` with
    `tile`; padded with empty tiles to a multiple of the batch), or None
    for all. ranges: `source_ranges(near, src_start)` made already, or None.
    Returns phi (M, K), grad (M, K, d) or None, in sorted target order.
    """
    m, d = tgt_sorted.shape
    kq = q_sorted.shape[1]
    if tiles is None:
        batch = batch or default_batch(_tile_count(m, tgt_start.shape[0] - 2, tile))
        tiles = leaf_tiles(tgt_start, m, tile, batch)
    else:
        batch = batch or default_batch(tiles[0].shape[0])
        extra = -tiles[0].shape[0] % batch      # empty tiles: the sentinel leaf, from row m
        tiles = tuple(pad_rows(a, extra, v) for a, v in zip(tiles, (tgt_start.shape[0] - 2, m, m)))
    leaf, t0, t1 = tiles
    y_pad = pad_rows(tgt_sorted, tile)
    x_pad = pad_rows(src_sorted, tile)
    q_pad = pad_rows(q_sorted, tile)
    r0, r1, _ = source_ranges(near, src_start) if ranges is None else ranges

    def one_tile(args):
        lf, a, b = args
        yt = jax.lax.dynamic_slice_in_dim(y_pad, a, tile)
        s0, s1 = r0[lf], r1[lf]
        chunks = (s1 - s0 + tile - 1) // tile
        cum = jnp.cumsum(chunks)

        def body(i, acc):
            j = jnp.searchsorted(cum, i, side="right")
            start = s0[j] + tile * (i - (cum[j] - chunks[j]))
            xs = jax.lax.dynamic_slice_in_dim(x_pad, start, tile)
            qs = jax.lax.dynamic_slice_in_dim(q_pad, start, tile)
            ms = start + jnp.arange(tile) < s1[j]
            phi, grad = pairwise(kernel, yt, xs, qs, ms, gradient)
            return (acc[0] + phi, acc[1] + grad if gradient else None)

        init = (jnp.zeros((tile, kq), y_pad.dtype),
                jnp.zeros((tile, kq, d), y_pad.dtype) if gradient else None)
        return jax.lax.fori_loop(0, cum[-1], body, init)

    phi_t, grad_t = _map(one_tile, (leaf, t0, t1), batch)
    return scatter_tiles(phi_t, grad_t, t0, t1, m)


def curl(grad):
    """The curl of each triple of charge columns' gradients: grad (M, K, 3)
    with [m, k, j] = d psi_k / d y_j, K a multiple of 3 -> (M, K), each
    triple (psi_0, psi_1, psi_2) giving (curl psi)_0..2 (the Biot-Savart
    velocity of a vector potential)."""
    g = grad.reshape(grad.shape[:-2] + (-1, 3, 3))
    c = jnp.stack([g[..., 2, 1] - g[..., 1, 2],
                   g[..., 0, 2] - g[..., 2, 0],
                   g[..., 1, 0] - g[..., 0, 1]], axis=-1)
    return c.reshape(grad.shape[:-1])


def _along_targets(grad, y):
    """d grad(y + s) / d s at s = 0 (forward mode, d directions): (M, K, d, d)."""
    return jax.jacfwd(lambda shift: grad(y + shift))(jnp.zeros(y.shape[1], y.dtype))


def dense_few(kernel: Kernel, targets, sources, charges, gradient: bool, chunk: int = 2048):
    """All-pairs sum at a few targets (M, d) (a few hundred: a check's
    samples), a scan over chunks of `chunk` sources: phi (M, K), grad
    (M, K, d) or None. Compiles in about a third of `dense`'s time on a
    CPU (0.15 against 0.37 s); pairs at r = 0 as `Kernel.pair`."""
    n, d = sources.shape
    pad = -n % chunk
    xs = pad_rows(sources, pad).reshape(-1, chunk, d)
    qs = pad_rows(charges, pad).reshape(-1, chunk, charges.shape[1])   # padding: zero charges

    def body(acc, block):
        x, q = block
        diff = targets[:, None, :] - x[None]                          # (M, chunk, d)
        k, dk = kernel.pair(jnp.sum(diff * diff, axis=-1), gradient)
        phi = acc[0] + jnp.dot(k, q, precision=HIGHEST)
        if not gradient:
            return (phi,), None
        return (phi, acc[1] + jnp.einsum("mc,mcd,ck->mkd", dk, diff, q, precision=HIGHEST)), None

    m, kq = targets.shape[0], charges.shape[1]
    init = (jnp.zeros((m, kq), targets.dtype),) + (
        (jnp.zeros((m, kq, d), targets.dtype),) if gradient else ())
    out = jax.lax.scan(body, init, (xs, qs))[0]
    return out[0], (out[1] if gradient else None)


def dense_hessian(kernel: Kernel, targets, sources, charges):
    """All pairs' second derivatives (M, K, d, d) along the targets, by
    forward mode through `dense`'s gradient (the Pallas kernel's
    specification)."""
    return _along_targets(lambda y: dense(kernel, y, sources, charges, True)[1], targets)


def near_field_hessian(kernel: Kernel, tgt_sorted, tgt_start, src_sorted, q_sorted,
                       src_start, near):
    """`near_field`'s second derivatives (M, K, d, d) along the targets, by
    forward mode through its gradient (the Pallas kernel's specification)."""
    return _along_targets(lambda y: near_field(kernel, y, tgt_start, src_sorted, q_sorted,
                                               src_start, near, True)[1], tgt_sorted)
