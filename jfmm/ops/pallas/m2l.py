"""Pallas M2L kernel: far-field translations of one level on tensor cores.

Twin of `jfmm.ops.translate.m2l` (the specification) for any family whose
M2L operators are one (P, P) matrix per offset. Formulation: grouped by
offset as matrix products. Target boxes are taken in tiles of T parents
that share a child slot c; for every (parent neighbour j, source child s)
well separated from c (`lists.m2l_slots`; 189 in 3D) all T targets use the
same operator, so one step gathers the T source multipoles (a (T, P) tile,
rows picked by the neighbour table) and adds their product with that
operator to a (T, P) accumulator. The 316 operators (20 MB at p = 11) stay
in L2; the gathered multipoles are never stored.

Float32 products run on the tensor cores split into bfloat16 (or TF32)
pieces (`Tiles.algorithm`), with Triton's float32 accumulation of short
sums: 3.4e-7 relative error at p = 11, below the float32 products' 1.9e-6.
It is not the default: XLA's products of the same bfloat16 pieces
(`translate.m2l(bf16x6=True)`) run about 2x faster (docs/design.md, "M2L on
tensor cores"). `jfmm.ops.backend.set_backend(m2l=Tiles())` selects it.
Float64 uses float64 products.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from jfmm.ops.pallas import compiler_params
from jfmm.tree import lists


@dataclasses.dataclass(frozen=True)
class Tiles:
    """T parents per program (at least 16, the tensor-core tile) and W
    coefficients per product in and out (powers of two; P is padded to a
    multiple of W); algorithm: the float32 product, a
    `jax.lax.DotAlgorithmPreset` name. The defaults were the fastest
    measured at p = 11 (128-wide tiles exceed the shared memory there)."""
    parents: int = 64
    width: int = 64
    num_warps: int = 4
    num_stages: int = 2
    algorithm: str = "BF16_BF16_F32_X6"


@functools.lru_cache(maxsize=None)
def steps(dim: int) -> np.ndarray:
    """(2^d, n_steps, 3) int32: for target child c, its well-separated
    (neighbour position j, source child s, offset index) triples."""
    slots = lists.m2l_slots(dim)                       # (3^d, 2^d src, 2^d tgt)
    n_off = len(lists.m2l_offsets(dim))
    rows = [[(j, s, slots[j, s, c]) for j in range(slots.shape[0])
             for s in range(slots.shape[1]) if slots[j, s, c] < n_off]
            for c in range(slots.shape[2])]
    assert len({len(r) for r in rows}) == 1
    return np.array(rows, np.int32)


def _kernel(steps_ref, nbr_ref, src_ref, ops_ref, out_ref, *, tile: int, width: int,
            n_chunks: int, nc: int, rows_per_k: int, precision):
    """One program: parents [i T, (i + 1) T) of charge vector k, child slot
    c, output coefficients [n W, (n + 1) W)."""
    k, c, i, n = (pl.program_id(a) for a in range(4))
    parents = pl.ds(i * tile, tile)

    def step(t, acc):
        j, s, slot = steps_ref[c, t, 0], steps_ref[c, t, 1], steps_ref[c, t, 2]
        rows = k * rows_per_k + nbr_ref[parents, j] * nc + s          # (T,)
        for m in range(n_chunks):
            a = src_ref[rows, pl.ds(m * width, width)]                 # (T, W) gather
            w = ops_ref[slot, pl.ds(m * width, width), pl.ds(n * width, width)]
            acc = acc + jnp.dot(a, w, precision=precision,
                                preferred_element_type=acc.dtype)
        return acc

    acc = jnp.zeros((tile, width), out_ref.dtype)
    acc = jax.lax.fori_loop(0, steps_ref.shape[1], step, acc)
    out_ref[k, c, parents, pl.ds(n * width, width)] = acc


def m2l(mult, level: int, mats, dim: int, tiles: Tiles = Tiles(), interpret: bool = False):
    """Pallas twin of `jfmm.ops.translate.m2l` (same arguments and result)."""
    nc = 2 ** dim
    nb_par = lists.neighbors(level - 1, dim)                     # (B, 3^d), sentinel B
    b = nb_par.shape[0]
    n_box, n_k, p = mult.shape
    dt = mult.dtype
    width = min(tiles.width, max(16, 1 << (p - 1).bit_length()))
    ppad = -(-p // width) * width
    tile = tiles.parents
    bpad = -(-b // tile) * tile
    # Source rows: per charge vector, the level's boxes then the sentinel
    # parent's nc zero children.
    rows_per_k = n_box + nc
    src = jnp.pad(jnp.swapaxes(mult, 0, 1), ((0, 0), (0, nc), (0, ppad - p)))
    src = src.reshape(n_k * rows_per_k, ppad)
    nbr = jnp.pad(nb_par, ((0, bpad - b), (0, 0)), constant_values=b)
    # (offset, in, out): acc (T, in) @ op.
    ops = jnp.pad(jnp.swapaxes(mats[:-1], 1, 2), ((0, 0), (0, ppad - p), (0, ppad - p)))
    table = jnp.asarray(steps(dim))
    if dt == jnp.float32 and not interpret:
        precision = getattr(jax.lax.DotAlgorithmPreset, tiles.algorithm)
    else:
        precision = jax.lax.Precision.HIGHEST
    body = functools.partial(_kernel, tile=tile, width=width, n_chunks=ppad // width, nc=nc,
                             rows_per_k=rows_per_k, precision=precision)
    out = pl.pallas_call(
        body, out_shape=jax.ShapeDtypeStruct((n_k, nc, bpad, ppad), dt),
        grid=(n_k, nc, bpad // tile, ppad // width), interpret=interpret,
        compiler_params=compiler_params(tiles.num_warps, interpret, tiles.num_stages),
    )(table, nbr, src, ops.astype(dt))
    out = out[:, :, :b, :p]                                      # (K, c, B, P)
    return jnp.transpose(out, (2, 1, 0, 3)).reshape(b * nc, n_k, p)
