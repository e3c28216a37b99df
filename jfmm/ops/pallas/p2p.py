"""Pallas near-field (P2P) kernel for any radial kernel.

Same signature and result as `jfmm.ops.p2p.near_field` (the specification).
One program per leaf-aligned target tile: it holds its T targets in
registers, walks the merged source ranges of the leaf's neighbours
(`jfmm.ops.p2p.source_ranges`) in chunks of S (a loop with a data-dependent
trip count, so any occupancy works), and accumulates potential and gradient
in (T, S) tiles that are reduced over sources once at the end (reducing in
every step was 3-4x slower in a measured all-pairs kernel). Sums of
products are PTX fma (`jfmm.ops.pallas.fma`): 1.2-1.3x more pairs per
second than the product-then-sum that XLA otherwise emits. The kernel's jnp
expression is traced into the program, so every radial kernel reuses it,
with float32 1/sqrt as one instruction (`jfmm.ops.pallas.fast_math`).

The r = 0 select that makes coincident pairs contribute K(0) (0 for
singular kernels) runs only on the source chunks that may hold a point
equal to a target (the target's own leaf; see `near_field`'s coincide);
whole chunks need no mask either, so each range is walked by straight
loops: chunks without select, with select, without, then the one partial
chunk masked (with fast_math, 1.27e12 -> 1.59e12 pairs/s over all pairs:
docs/design.md, "Near field").

Arrays are passed whole (structure of arrays, padded by S so that no slice
leaves its buffer); masks, not bounds checks, exclude padding.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from jfmm.kernels import Kernel
from jfmm.ops import p2p as ref
from jfmm.ops.pallas import compiler_params, fast_math, fma as _fma


@dataclasses.dataclass(frozen=True)
class Blocks:
    """Tile sizes (powers of two): T targets per program, S sources per step;
    fma: products summed with PTX fma (one instruction, one rounding) rather
    than a product and a sum (XLA compiles Pallas kernels without
    contraction); fast_math: `jfmm.ops.pallas.fast_math` on the kernel's
    pair terms. False is kept for benchmarks in both.

    8 x 16 with one warp is among the fastest at the FMM's default depths;
    over all pairs 8 x 32 is faster, and `jfmm.direct` uses it
    (docs/design.md, "Near field").
    """
    targets: int = 8
    sources: int = 16
    num_warps: int = 1
    fma: bool = True
    fast_math: bool = True


def _kernel(meta_ref, y_ref, x_ref, q_ref, *refs, treedef, width: int, n_k: int,
            dim: int, blocks: Blocks, gradient: bool, interpret: bool, hessian: bool = False,
            curl: bool = False, along: bool = False):
    """One target tile. meta row: [t0, t1, n, g0, g1, s0[0..width), s1[0..width)]
    (n ranges in use, see `jfmm.ops.p2p.source_ranges`; [g0, g1) the
    sources that may equal a target); refs: the kernel's scalar parameters
    (each (1,)), then phi and grad, or (hessian) the second derivatives'
    upper triangles (`_PAIRS`) alone, or (curl) the curls alone; along: the
    targets' directions (d, M) come first, and the curls of the gradients'
    derivatives along them are the output."""
    single = hessian or curl or along
    a_ref, *refs = refs if along else (None,) + refs
    *param_refs, phi_ref, grad_ref = refs if not single else refs + [None]
    params = [r[0] for r in param_refs]
    t_sz, s_sz = blocks.targets, blocks.sources
    i = pl.program_id(0)
    t0, g0, g1 = meta_ref[i, 0], meta_ref[i, 3], meta_ref[i, 4]
    y = [y_ref[a, pl.ds(t0, t_sz)] for a in range(dim)]
    dirs = [a_ref[a, pl.ds(t0, t_sz)][:, None] for a in range(dim)] if along else None
    dt = y[0].dtype
    zeros = jnp.zeros((t_sz, s_sz), dt)
    pairs = _PAIRS[dim]
    per = len(pairs) if hessian else 1 if curl or along else 1 + (dim if gradient else 0)
    init = tuple([zeros] * (n_k * per))

    def fma(a, b, c):
        return _fma(a, b, c, interpret) if blocks.fma else a * b + c

    def pair(guard):
        def f(params, r2):
            kernel = jax.tree_util.tree_unflatten(treedef, params)
            if hessian or along:
                return kernel.hessian_pair(r2, guard=guard)
            return kernel.pair(r2, gradient or curl, differentiable=False, guard=guard)
        return fast_math(f, interpret) if blocks.fast_math else f

    def chunk(start, end, acc, masked: bool, guard: bool):
        xs = [x_ref[a, pl.ds(start, s_sz)] for a in range(dim)]
        qs = [q_ref[k, pl.ds(start, s_sz)] for k in range(n_k)]
        if masked:
            # Sources past `end` belong to the next leaf or to padding: their
            # charges are zeroed (one select per source, not per pair); the
            # kernel's pair terms are finite everywhere.
            live = (start + jax.lax.broadcasted_iota(jnp.int32, (s_sz,), 0)) < end
            qs = [jnp.where(live, qk, 0) for qk in qs]
        diff = [y[a][:, None] - xs[a][None, :] for a in range(dim)]
        r2 = diff[0] * diff[0]
        for d in diff[1:]:
            r2 = fma(d, d, r2)
        kv, g = pair(guard)(params, r2)
        out = list(acc)
        if hessian:             # q (A I + B r r^T): kv is A, g is B
            for k in range(n_k):
                aq, bq = kv * qs[k][None, :], g * qs[k][None, :]
                bd = [bq * diff[a] for a in range(dim)]
                for j, (a, b) in enumerate(pairs):
                    o = k * len(pairs) + j
                    out[o] = fma(bd[a], diff[b], out[o] + aq if a == b else out[o])
            return tuple(out)
        if curl or along:
            # curl: g (diff x q); along (a the target's direction): A (a x q)
            # + B (diff . a)(diff x q). Cross products from -q per source.
            if along:
                bda = g * fma(diff[2], dirs[2], fma(diff[1], dirs[1], diff[0] * dirs[0]))
            for k in range(0, n_k, 3):
                q, nq = [v[None, :] for v in qs[k:k + 3]], [-v[None, :] for v in qs[k:k + 3]]
                for a in range(3):
                    b, c = (a + 1) % 3, (a + 2) % 3
                    dq = fma(diff[c], nq[b], diff[b] * q[c])
                    if along:
                        aq = fma(dirs[c], nq[b], dirs[b] * q[c])
                        out[k + a] = fma(kv, aq, fma(bda, dq, out[k + a]))
                    else:
                        out[k + a] = fma(g, dq, out[k + a])
            return tuple(out)
        for k in range(n_k):
            out[k] = fma(kv, qs[k][None, :], out[k])
            if gradient:
                gq = g * qs[k][None, :]
                for a in range(dim):
                    out[n_k + k * dim + a] = fma(gq, diff[a], out[n_k + k * dim + a])
        return tuple(out)

    def chunks(lo, hi, s0, s1, acc, masked: bool, guard: bool):
        body = functools.partial(chunk, masked=masked, guard=guard)
        return jax.lax.fori_loop(lo, hi, lambda c, a: body(s0 + c * s_sz, s1, a), acc)

    def neighbour(j, acc):
        # Whole chunks in three loops: the r = 0 select only on those that
        # overlap [g0, g1) (a branch per chunk measured 8-15% slower than
        # straight loops); the last, partial chunk masked and guarded.
        s0 = meta_ref[i, 5 + j]
        s1 = meta_ref[i, 5 + width + j]
        n_full = (s1 - s0) // s_sz
        c_lo = jnp.clip(jnp.floor_divide(g0 - s0, s_sz), 0, n_full)
        c_hi = jnp.clip(-jnp.floor_divide(s0 - g1, s_sz), c_lo, n_full)
        acc = chunks(0, c_lo, s0, s1, acc, False, False)
        acc = chunks(c_lo, c_hi, s0, s1, acc, False, True)
        acc = chunks(c_hi, n_full, s0, s1, acc, False, False)
        return chunks(n_full, -jnp.floor_divide(s0 - s1, s_sz), s0, s1, acc, True, True)

    acc = jax.lax.fori_loop(0, meta_ref[i, 2], neighbour, init)
    if single:
        for o in range(len(acc)):
            phi_ref[i, o, :] = jnp.sum(acc[o], axis=1)
        return
    for k in range(n_k):
        phi_ref[i, k, :] = jnp.sum(acc[k], axis=1)
        if gradient:
            for a in range(dim):
                grad_ref[i, k * dim + a, :] = jnp.sum(acc[n_k + k * dim + a], axis=1)


# The upper triangle (a <= b) of a d x d symmetric matrix, row by row.
_PAIRS = {d: [(a, b) for a in range(d) for b in range(a, d)] for d in (2, 3)}


def near_field(kernel: Kernel, tgt_sorted, tgt_start, src_sorted, q_sorted, src_start,
               near, gradient: bool, blocks: Blocks = Blocks(), interpret: bool = False,
               coincide=None, hessian: bool = False, tiles=None, curl: bool = False,
               along=None, ranges=None):
    """Pallas twin of `jfmm.ops.p2p.near_field` (same arguments and results).

    coincide: None, or (g0, g1) int arrays, one entry per target tile of
    `jfmm.ops.p2p.leaf_tiles(tgt_start, M, blocks.targets)`: the source rows
    [g0, g1) that may equal one of the tile's targets. Source chunks outside
    it skip the kernel's r = 0 select. None: the tile's own leaf (a tree puts
    equal points in one leaf). A pair outside it at r^2 = 0 (an exact
    duplicate, or points closer than sqrt of the smallest normal number:
    1e-19 in float32) gets the kernel's `from_r2` at 0: the right terms for
    kernels smooth there (Gaussian, multiquadrics), inf or NaN for the
    others (every built-in one is checked in tests), never a silent 0.

    hessian=True: the second derivatives along the targets alone, (M, K,
    d, d) (`jfmm.ops.p2p.near_field_hessian`), from `Kernel.hessian_pair`.

    curl=True (3D, K a multiple of 3): the curl of the gradient of each
    triple of charge columns, (M, K) (`jfmm.ops.p2p.curl` of the gradient):
    three sums a pair and triple where potential and gradient take twelve.

    along (M, 3), the targets' directions a (sorted as they are): the curls
    of the gradients' derivatives along them, (M, K) (`p2p.curl` of the
    second derivatives contracted with a, from `Kernel.hessian_pair`): for
    the stretching (a . grad) u of vortex elements, three sums a pair.

    tiles: (leaf, t0, t1) of the target tiles to run (`leaf_tiles` with
    `blocks.targets`; coincide then per one of them), or None for all.
    """
    m, dim = tgt_sorted.shape
    n_k = q_sorted.shape[1]
    t_sz, s_sz = blocks.targets, blocks.sources
    width = near.shape[1]
    leaf, t0, t1 = ref.leaf_tiles(tgt_start, m, t_sz) if tiles is None else tiles
    r0, r1, n = ref.source_ranges(near, src_start) if ranges is None else ranges
    g0, g1 = (src_start[leaf], src_start[leaf + 1]) if coincide is None else coincide
    meta = jnp.concatenate([t0[:, None], t1[:, None], n[leaf, None], g0[:, None], g1[:, None],
                            r0[leaf], r1[leaf]], axis=1).astype(jnp.int32)
    n_tiles = meta.shape[0]
    y = ref.pad_rows(tgt_sorted, t_sz).T
    x = ref.pad_rows(src_sorted, s_sz).T
    q = ref.pad_rows(q_sorted, s_sz).T
    dt = tgt_sorted.dtype
    out_shape = [jax.ShapeDtypeStruct((n_tiles, n_k, t_sz), dt),
                 jax.ShapeDtypeStruct((n_tiles, n_k * dim if gradient else 1, t_sz), dt)]
    if hessian:
        out_shape = [jax.ShapeDtypeStruct((n_tiles, n_k * len(_PAIRS[dim]), t_sz), dt)]
    if curl or along is not None:
        if dim != 3 or n_k % 3:
            raise ValueError(f"the curl takes 3D points and charge columns in threes, got "
                             f"dimension {dim} and {n_k} columns")
        out_shape = out_shape[:1]
    extra = [] if along is None else [ref.pad_rows(along.astype(dt), t_sz).T]
    # Kernel parameters are traced values: they enter as inputs, not constants.
    leaves, treedef = jax.tree_util.tree_flatten(kernel)
    if any(jnp.ndim(leaf) for leaf in leaves):
        raise NotImplementedError("the Pallas P2P kernel takes scalar kernel parameters only")
    params = [jnp.reshape(jnp.asarray(leaf, dt), (1,)) for leaf in leaves]
    body = functools.partial(_kernel, treedef=treedef, width=width, n_k=n_k, dim=dim,
                             blocks=blocks, gradient=gradient, interpret=interpret,
                             hessian=hessian, curl=curl, along=along is not None)
    outs = pl.pallas_call(
        body, out_shape=out_shape, grid=(n_tiles,), interpret=interpret,
        compiler_params=compiler_params(blocks.num_warps, interpret))(meta, y, x, q, *extra,
                                                                      *params)
    if hessian:                 # (tiles, K * pairs, T) -> (M, K, d, d), symmetric
        upper = jnp.transpose(outs[0].reshape(n_tiles, n_k, -1, t_sz), (0, 3, 1, 2))
        upper = ref.scatter_tiles(upper, None, t0, t1, m)[0]
        index = np.zeros((dim, dim), np.int32)
        for j, (a, b) in enumerate(_PAIRS[dim]):
            index[a, b] = index[b, a] = j
        return upper[..., index]
    if curl or along is not None:
        return ref.scatter_tiles(jnp.swapaxes(outs[0], 1, 2), None, t0, t1, m)[0]
    phi_t, grad_t = outs
    grad = None
    if gradient:  # (tiles, K * dim, T) -> (tiles, T, K, dim)
        grad = jnp.transpose(grad_t.reshape(n_tiles, n_k, dim, t_sz), (0, 3, 1, 2))
    return ref.scatter_tiles(jnp.swapaxes(phi_t, 1, 2), grad, t0, t1, m)
