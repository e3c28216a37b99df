"""Tensor-product bases shared by the families whose expansions are
products of per-axis factors (jfmm.ops.chebyshev, jfmm.ops.hermite)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

HIGHEST = jax.lax.Precision.HIGHEST


def product(factors):
    """prod_a f_a[..., m_a] flattened over (m_0, ..., m_(d-1)), axis 0 slowest."""
    out = factors[0]
    for f in factors[1:]:
        out = (out[..., :, None] * f[..., None, :]).reshape(out.shape[:-1] + (-1,))
    return out


def evaluate(loc, pairs, h, gradient: bool):
    """phi (M, K) = sum_m loc[:, :, m] prod_a f_a, and with gradient also
    grad (M, K, d) (axis a's factor replaced by its derivative, over h).

    loc: (M, K, P) per-target weights; pairs: per axis (f_a, df_a), each
    (M, n) (df_a unused and may be None without gradient); h: the length
    unit of the coordinates, a scalar or one per target (M,)."""
    values = [f for f, _ in pairs]
    phi = jnp.einsum("mkp,mp->mk", loc, product(values), precision=HIGHEST)
    if not gradient:
        return phi, None
    d = len(pairs)
    grad = jnp.stack([
        jnp.einsum("mkp,mp->mk", loc,
                   product([pairs[b][1] if b == a else values[b] for b in range(d)]),
                   precision=HIGHEST)
        for a in range(d)], axis=-1) / jnp.reshape(h, jnp.shape(h) + (1, 1))
    return phi, grad
