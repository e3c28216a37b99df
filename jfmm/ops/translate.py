"""Expansion translations on the dense Morton grid, for any family whose
operators are matrices (out = A @ in on the last axis).

Expansions of a level are (B, K, P): B boxes in Morton order, K charge
vectors, P coefficients. Siblings are contiguous, so M2M and L2L are one
batched matrix product per level, and M2L gathers the children of each
parent's near neighbours (see jfmm.tree.lists).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jfmm.tree import lists

HIGHEST = jax.lax.Precision.HIGHEST


def m2m(child, mats):
    """Children's multipoles (2^d B, K, P) -> parents' (B, K, P).

    mats: (2^d, P, P), one operator per child slot.
    """
    nc = mats.shape[0]
    c = child.reshape((-1, nc) + child.shape[1:])
    return jnp.einsum("bckq,cpq->bkp", c, mats, precision=HIGHEST)


def l2l(parent, mats):
    """Parents' locals (B, K, P) -> children's (2^d B, K, P)."""
    out = jnp.einsum("bkq,cpq->bckp", parent, mats, precision=HIGHEST)
    return out.reshape((-1,) + out.shape[2:])


def bf16_split(x, pieces: int = 3):
    """float32 x as bfloat16 pieces [h1, h2, ...] with h1 + h2 + ... = x:
    each piece is the leading 8 significant bits of what the previous ones
    leave (three hold all 24), cut by masking the bits rather than by
    rounding through bfloat16: XLA removes float32 -> bfloat16 -> float32
    round trips (excess precision), which made a rounding split return
    bf16(x) and nothing else on the GPU (M2L error 3e-3)."""
    out, rest = [], x
    for _ in range(pieces):
        bits = jax.lax.bitcast_convert_type(rest, jnp.uint32) & jnp.uint32(0xFFFF0000)
        h = jax.lax.bitcast_convert_type(bits, jnp.float32)
        out.append(h.astype(jnp.bfloat16))          # exact: h has 8 significant bits
        rest = rest - h                             # exact
    return out


def _product(spec: str, a, w, bf16x6: bool, per_position: str | None = None):
    """einsum(spec, a, w) with float32 (or float64) products, or, with
    bf16x6, as the six bfloat16 products a_i w_j (i + j <= 2, smallest
    first) of the operands' bfloat16 pieces, summed in float32: exact
    products on tensor cores, dropping terms of 2^-24 relative. Long
    tensor-core sums lose accuracy (docs/design.md, "M2L on tensor
    cores"), so the leading product a_1 w_1 is contracted with
    `per_position`, spec with the position axis kept first in the output,
    and summed over positions in float32."""
    if not bf16x6 or a.dtype != jnp.float32:
        return jnp.einsum(spec, a, w, precision=HIGHEST)
    ap, wp = bf16_split(a), bf16_split(w)
    out = None
    for i, j in ((2, 0), (1, 1), (0, 2), (1, 0), (0, 1)):
        t = jnp.einsum(spec, ap[i], wp[j], preferred_element_type=jnp.float32)
        out = t if out is None else out + t
    if per_position is None:
        return out + jnp.einsum(spec, ap[0], wp[0], preferred_element_type=jnp.float32)
    lead = jnp.einsum(per_position, ap[0], wp[0], preferred_element_type=jnp.float32)
    return out + jnp.sum(lead, axis=0)


def stores_m2l(limits: dict, count: int, size: int, dtype) -> bool:
    """Whether a family stores `count` (size x size) M2L matrices of `dtype`,
    within its byte limits per backend ({"cpu": ..., "gpu": ...}), or
    holds something smaller that builds them where `m2l_blocks` indexes
    them (its loop over neighbour positions gathers each position's
    matrices anyway)."""
    limit = limits["cpu" if jax.default_backend() == "cpu" else "gpu"]
    return count * size * size * jnp.dtype(dtype).itemsize <= limit


# Bytes of gathered operators and neighbour multipoles that one product of
# `m2l` may hold; beyond them it loops (over parent chunks, or over the 3^d
# neighbour positions when the operators alone are too large).
GATHER_BYTES = 2 ** 28


def m2l(mult, level: int, mats, dim: int, bf16x6: bool = False):
    """Far-field translation at one level (level >= 2) of the dense grid.

    mult: (2^(d*level), K, P) multipoles of the level.
    mats: (n_off + 1, P, P) operators per M2L offset (the last one zero).
    Returns locals (2^(d*level), K, P): for each box, the sum over its M2L
    list of the translated multipoles (`m2l_blocks` with the blocks of
    siblings and their parents' neighbour table).
    """
    nc = 2 ** dim
    b = mult.shape[0] // nc
    return m2l_blocks(mult.reshape((b, nc) + mult.shape[1:]), lists.neighbors(level - 1, dim),
                      mats, dim, bf16x6)


def m2l_blocks(grouped, cols, mats, dim: int, bf16x6: bool = False):
    """M2L over blocks of siblings: (b, 2^d, K, P) multipoles -> locals (t 2^d, K, P).

    grouped: the 2^d children of each of b parents; cols: (t, 3^d) the
    blocks of the near neighbours of t target parents
    (`lists.near_displacements` order; b where a neighbour has no children:
    t = b for every parent, fewer for a window of them, as a device of a
    mesh computes, `jfmm.distributed`); mats: (n_off + 1, P, P)
    operators per M2L offset (the last one zero). Child c of parent i gets
    child c' of neighbour j translated by `lists.m2l_slots(d)[j, c', c]`.
    The children of each parent's 3^d neighbours are gathered, and one
    (b, J 2^d P) x (J 2^d P, 2^d P) product applies the J non-empty
    neighbour positions' blocks at once (faster than a loop over
    positions: docs/design.md). Memory is kept under GATHER_BYTES by
    chunking parents (counting the gathered multipoles in their own dtype;
    with bf16x6 their three bfloat16 pieces and the per-position leading
    product take about 2.5 times that); where even the gathered operators
    exceed it (high p), the loop over positions runs instead. bf16x6:
    float32 products as six bfloat16 products (`_product`; the GPU default,
    see jfmm.ops.backend).
    """
    nc = 2 ** dim
    b, _, k, p = grouped.shape
    t = cols.shape[0]
    # Block b (no children) gathers zeros: no copy of the level with a zero block appended.
    take = lambda c: jnp.take(grouped, c, axis=0, mode="fill", fill_value=0)  # noqa: E731
    slots = lists.m2l_slots(dim)
    keep = np.flatnonzero((slots < len(lists.m2l_offsets(dim))).any(axis=(1, 2)))
    item = grouped.dtype.itemsize
    if len(keep) * nc * nc * p * p * item > GATHER_BYTES:
        def body(acc, xs):
            col, slot = xs
            return acc + _product("bskq,scpq->bckp", take(col), mats[slot], bf16x6), None

        init = jnp.zeros((t, nc, k, p), grouped.dtype)
        out, _ = jax.lax.scan(body, init, (cols.T[keep], jnp.asarray(slots[keep])))
        return out.reshape(t * nc, k, p)

    # With bf16x6 both operands are split inside each product (per parent
    # chunk): splitting once per level measured slower (docs/design.md).
    w = mats[slots[keep]]                               # (J, 2^d src, 2^d tgt, P, P)
    per_parent = len(keep) * nc * k * p * item
    chunk = min(t, max(1, 2 ** int(np.log2(max(1, GATHER_BYTES // per_parent)))))

    def apply(c):                                       # (C, J) -> (C, 2^d, K, P)
        return _product("bjskq,jscpq->bckp", take(c), w, bf16x6,
                        per_position="bjskq,jscpq->jbckp")

    cols = cols[:, keep]
    if chunk >= t:
        out = apply(cols)
    else:
        pad = -t % chunk                                # padding rows gather the zero block
        cols = jnp.concatenate([cols, jnp.full((pad, cols.shape[1]), b, cols.dtype)])
        out = jax.lax.map(apply, cols.reshape(-1, chunk, cols.shape[1]))
        out = out.reshape((-1, nc, k, p))[:t]
    return out.reshape(t * nc, k, p)
