"""The fast Gauss transform (Greengard and Strain 1991) on one grid level.

For K(r) = exp(-(epsilon r)^2), in scaled coordinates (epsilon times
lengths) the kernel factors over axes, and per axis (../shared/REFERENCES.md,
seed 001, with its errata applied)

    P2H   A_a  = sum_j q_j s_j^a / a!                  s = scaled source - box centre
    H2L   C_b  = ((-1)^b / b!) sum_a A_a h_(a+b)(D)     D = scaled target centre - source centre
    L2P   phi  = sum_b C_b t^b                          t = scaled target - box centre

with the Hermite functions h_n(x) = exp(-x^2) H_n(x); in d dimensions the
multi-indices a, b < p per axis (p^d coefficients) and every operator is a
tensor product. Unlike the FMM, every pair of boxes interacts through the
expansions (the Gaussian is entire: the series converge at any distance,
fast where the scaled box side rho = epsilon h is about 1 or less), so there
is no near field and no tree of levels: one grid of n = 2^L boxes per axis.

The H2L of all box pairs is a tensor product too: along each axis it is one
dense (n p, n p) matrix [i, b; j, a] acting on the (box, coefficient) pair
of that axis, so the whole translation is d matrix products of
(n p)^2 n^(d-1) p^(d-1) K terms, with no distance cutoff (tiny Hermite
functions at large D are exact zeros, not errors).

`jfmm.models.hermite` chooses (L, p) from an error estimate for the points
(float64, numpy) and a cost model. The operators are built from epsilon in
the traced computation, so derivatives with respect to epsilon flow.

Numerics: h_n grows like sqrt(2^n n!), so the translation uses the
normalised functions g_n = h_n / sqrt(2^n n!) (bounded by about 1) and the
constant c_ab = sqrt(2^(a+b) (a+b)!) / (a! b!), built in float64.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from jfmm.ops import tensor
from jfmm.tree import morton

HIGHEST = jax.lax.Precision.HIGHEST


def normalized_hermite(x, count: int):
    """g_k(x) = exp(-x^2) H_k(x) / sqrt(2^k k!) for k < count: (count,) + x.shape.

    Works on numpy (float64) and jnp arrays alike; the recurrence
    g_(k+1) = (sqrt(2) x g_k - sqrt(k) g_(k-1)) / sqrt(k + 1) is stable."""
    xp = np if isinstance(x, np.ndarray) else jnp
    g = [xp.exp(-x * x)]
    if count > 1:
        g.append(math.sqrt(2.0) * x * g[0])
    for k in range(1, count - 1):
        g.append((math.sqrt(2.0) * x * g[k] - math.sqrt(k) * g[k - 1]) / math.sqrt(k + 1))
    return xp.stack(g[:count])


@functools.lru_cache(maxsize=None)
def _coupling(p: int) -> np.ndarray:
    """(p, p) float64: [b, a] = (-1)^b sqrt(2^(a+b) (a+b)!) / (a! b!)."""
    a = np.arange(p)
    s = a[:, None] + a[None, :]
    lg = (0.5 * (s * math.log(2.0) + _lgamma(s + 1)) - _lgamma(a[:, None] + 1)
          - _lgamma(a[None, :] + 1))
    return (-1.0) ** a[:, None] * np.exp(lg)


def _lgamma(k):
    return np.vectorize(math.lgamma)(k.astype(float))


def axis_operator(rho, n: int, p: int, dtype):
    """The H2L of one axis: (n p, n p), rows (target box i, b), columns
    (source box j, a), for boxes of scaled side rho (traced) on a line of n."""
    i = np.arange(n)
    d = (i[:, None] - i[None, :]).astype(np.float64)                    # (n, n)
    g = normalized_hermite(rho * jnp.asarray(d, dtype), 2 * p - 1)      # (2p-1, n, n)
    idx = np.arange(p)[:, None] + np.arange(p)[None, :]                 # (b, a)
    t = g[idx] * jnp.asarray(_coupling(p), dtype)[:, :, None, None]     # (b, a, i, j)
    return jnp.transpose(t, (2, 0, 3, 1)).reshape(n * p, n * p)


@functools.lru_cache(maxsize=None)
def grid_order(level: int, dim: int) -> np.ndarray:
    """(n^d,) Morton index of each box of the level, boxes in row-major
    order of their integer coordinates (axis 0 slowest)."""
    n = 2 ** level
    coords = np.stack(np.meshgrid(*([np.arange(n)] * dim), indexing="ij"), -1).reshape(-1, dim)
    with jax.ensure_compile_time_eval():
        return np.asarray(morton.encode(jnp.asarray(coords, jnp.int32), level))


def _powers(x, p: int, derivative: bool = False):
    """x^a (..., p) for a < p; with derivative, also a x^(a-1)."""
    pw = [jnp.ones_like(x)]
    for _ in range(1, p):
        pw.append(pw[-1] * x)
    out = jnp.stack(pw, axis=-1)
    if not derivative:
        return out
    dpw = [jnp.zeros_like(x)] + [a * pw[a - 1] for a in range(1, p)]
    return out, jnp.stack(dpw, axis=-1)


# ---------------------------------------------------------------- the plan
class GaussTransform:
    """The fast Gauss transform family in `dim` dimensions (Gaussian only)."""

    NAME = "hermite"
    SCHEME = "grid"          # moments on one grid level to local series; no near field

    def __init__(self, dim: int):
        self.dim = dim

    def __repr__(self):
        return f"GaussTransform(dim={self.dim})"

    # -------------------------------------------------------------- operators
    def operators(self, p: int, m2l_offsets, dtype):
        """None: every operator is built from epsilon in the evaluation."""
        return None

    def p2m(self, u, q, p: int):
        """(N, K, p^d) per-source moments q s^a at scaled offsets u (N, d)
        from their box centres (the 1 / a! of A_a is in `axis_operator`)."""
        mono = tensor.product([_powers(u[:, a], p) for a in range(u.shape[1])])
        return q[:, :, None] * mono[:, None, :]

    def h2l(self, herm, rho, level: int, p: int):
        """Taylor coefficients (B, K, p^d) of every box from the Hermite
        moments (B, K, p^d) of every box (Morton order), boxes of scaled
        side rho: d products with `axis_operator`."""
        d, n = self.dim, 2 ** level
        k = herm.shape[1]
        order = grid_order(level, d)
        g = herm[order].reshape((n,) * d + (k,) + (p,) * d)
        op = axis_operator(rho, n, p, herm.dtype)
        for a in range(d):
            g = jnp.moveaxis(g, (a, d + 1 + a), (0, 1))
            shape = g.shape
            g = jnp.dot(op, g.reshape(n * p, -1), precision=HIGHEST).reshape(shape)
            g = jnp.moveaxis(g, (0, 1), (a, d + 1 + a))
        out = g.reshape(n ** d, k, p ** d)
        return jnp.zeros_like(out).at[order].set(out, unique_indices=True)

    def l2p_coefficients(self, loc, p: int, gradient: bool):
        return loc[:, :, None, :]

    def l2p(self, u, coef, h, p: int, gradient: bool):
        """phi (M, K) and grad (M, K, d) from per-target Taylor coefficients
        coef (M, K, 1, p^d) at scaled offsets u (M, d); h: the length unit
        of u (1 / epsilon)."""
        pairs = [_powers(u[:, a], p, derivative=True) if gradient
                 else (_powers(u[:, a], p), None) for a in range(self.dim)]
        return tensor.evaluate(coef[:, :, 0, :], pairs, h, gradient)
