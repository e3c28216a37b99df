"""Kernel-independent expansions: tensor-product Chebyshev interpolation.

The black-box FMM of Fong and Darve (2009). A box's expansion is the set of
weights at its n^d Chebyshev nodes; every operator is interpolation or a
kernel evaluation, so any radial kernel works and its parameters stay
traceable:

    P2M   W_m = sum_i q_i S_m(u_i)                 S_m = prod_a S_{m_a}(u_a)
    M2M   W_m(parent) = sum_m' S_m(node m' of the child) W_m'(child)
    M2L   L_m(target) = sum_m' K(|x_m - x_m'|) W_m'(source)     (node points)
    L2L   L_m'(child) = sum_m S_m(node m' of the child) L_m(parent)
    L2P   phi(y) = sum_m L_m S_m(u),   grad phi = sum_m L_m grad S_m(u) / h

with the 1D interpolation basis on the n Chebyshev points xi_k of
[-1/2, 1/2] (box-local coordinates u = (x - centre) / h)

    S_k(u) = 1/n + (2/n) sum_{j=1}^{n-1} T_j(2 xi_k) T_j(2 u).

M2M and L2L are level independent. M2L needs the kernel at the physical node
distances, so its matrices are built per level, from the kernel, inside the
traced computation (`m2l_matrices`): nothing is assumed about scale
invariance, and gradients with respect to kernel parameters can flow
through them.

Here `p` (the driver's order) is n, the nodes per dimension; a box holds
P = n^d weights. The M2L matrices are dense (n_off + 1) x P x P per level,
which limits n in 3D (memory grows as n^6); compressing them (SVD per
offset) is the way to higher orders.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jfmm.ops import rules
from jfmm.tree import lists

HIGHEST = jax.lax.Precision.HIGHEST


@functools.lru_cache(maxsize=None)
def nodes(n: int) -> np.ndarray:
    """The n Chebyshev points of the first kind on [-1/2, 1/2]."""
    return 0.5 * np.cos((2 * np.arange(n) + 1) * np.pi / (2 * n))


@functools.lru_cache(maxsize=None)
def _basis_coefficients(n: int) -> np.ndarray:
    """C (n, n) with S_k(u) = sum_j T_j(2u) C[j, k]."""
    t = np.cos(np.outer(np.arange(n), np.arccos(2 * nodes(n))))   # T_j(2 xi_k)
    w = np.full((n, 1), 2.0 / n)
    w[0] = 1.0 / n
    return w * t


def basis(u, n: int, derivative: bool = False):
    """S_k(u) (..., n) for u (...) in [-1/2, 1/2]; with derivative, also dS_k/du.

    numpy in, numpy (float64) out: how the M2M matrices are built once."""
    xp = np if isinstance(u, np.ndarray) else jnp
    x = 2 * u
    t = [xp.ones_like(x), x]
    dt = [xp.zeros_like(x), 2 * xp.ones_like(x)]                   # d/du T_j(2u)
    for j in range(2, n):
        t.append(2 * x * t[j - 1] - t[j - 2])
        dt.append(4 * t[j - 1] + 2 * x * dt[j - 1] - dt[j - 2])
    c = xp.asarray(_basis_coefficients(n), u.dtype)
    s = xp.stack(t[:n], axis=-1) @ c
    if not derivative:
        return s
    return s, xp.stack(dt[:n], axis=-1) @ c


def _tensor(factors):
    """prod_a f_a[..., m_a] flattened over (m_0, ..., m_{d-1}), axis 0 slowest."""
    out = factors[0]
    for f in factors[1:]:
        out = (out[..., :, None] * f[..., None, :]).reshape(out.shape[:-1] + (-1,))
    return out


def interpolation(u, n: int):
    """S_m(u) (N, n^d) at box-local points u (N, d): the P2M weights of unit
    charges, and the L2P evaluation."""
    return _tensor([basis(u[:, a], n) for a in range(u.shape[1])])


@functools.lru_cache(maxsize=None)
def grid(n: int, dim: int) -> np.ndarray:
    """(n^d, d) node coordinates in the order of `_tensor`."""
    g = np.meshgrid(*([nodes(n)] * dim), indexing="ij")
    return np.stack([a.reshape(-1) for a in g], axis=-1)


class Operators(NamedTuple):
    """Kernel-independent operators (the M2L matrices are built per level).

    m2m: (2^d, P, P) child weights -> parent weights, per child slot
    l2l: (2^d, P, P) parent local -> child local (the transposes)
    """
    m2m: jax.Array
    l2l: jax.Array


@functools.lru_cache(maxsize=None)
def _m2m_numpy(n: int, dim: int) -> np.ndarray:
    """(2^d, P, P) float64: [c, m, m'] = S_m(node m' of child c, in parent
    coordinates), i.e. P2M of the child's node weights as charges."""
    child_nodes = grid(n, dim) / 2
    return np.stack([interpolation((bits - 0.5) / 2.0 + child_nodes, n).T
                     for bits in lists.child_bits(dim)])


# Order rules per dimension: the relative error assumed at n nodes per
# dimension is error_scale * error_rate^n, at least 4x the worst of
# max(err phi, err grad / 10) measured over every kernel (Gaussians of three
# widths, multiquadrics, polyharmonics, Yukawa, Laplace2D), uniform and
# clustered points (benchmarks/accuracy_rbf.py, N = 4,000, float64;
# docs/accuracy_chebyshev_*.md). The worst case is the Gaussian whose width
# is about a box side. 3D orders 8-10 were measured on the seven hardest
# kernels of n = 7. max_order: 2D saturates near 1e-13 (rounding) by n = 18;
# in 3D the dense M2L matrices hold 317 n^6 values per level (2.5 GB in
# float64 at n = 10). Orders below min_order were not measured.
RULES = {2: dict(error_scale=2.5, error_rate=0.215, min_order=4, max_order=18),
         3: dict(error_scale=1.0, error_rate=0.25, min_order=4, max_order=10)}


class Chebyshev:
    """The Chebyshev family in `dim` dimensions (any kernel).

    The order rule assumes a relative error of error_scale * error_rate^n at
    n nodes per dimension, n in [min_order, max_order] (`RULES`: the worst
    kernel measured, so one rule serves all kernels of a dimension).
    """

    def __init__(self, dim: int, error_scale: float, error_rate: float, min_order: int,
                 max_order: int):
        self.dim = dim
        self.error_scale, self.error_rate = error_scale, error_rate
        self.MAX_ORDER = max_order
        self.ORDERS = tuple(range(min_order, max_order + 1))

    def __repr__(self):
        return f"Chebyshev(dim={self.dim})"

    # -------------------------------------------------------------- rules
    def _error_bound(self, n: int) -> float:
        return self.error_scale * self.error_rate ** n

    @property
    def EPS_FLOOR(self):
        return {"float32": max(3e-6, self._error_bound(self.MAX_ORDER)),
                "float64": self._error_bound(self.MAX_ORDER)}

    def order(self, eps: float, dtype) -> int:
        """Nodes per dimension n for a relative L2 error eps (ValueError if
        eps is below what dtype or the largest n reaches)."""
        return rules.choose_order(eps, dtype, self.EPS_FLOOR, self.ORDERS, self._error_bound,
                                  f"the {self.dim}D Chebyshev family")

    def leaf_size(self, n: int) -> int:
        """Mean points per leaf s that balances, per leaf, the near field's
        3^d s^2 pair terms against M2L's 2 L P^2 flops (L = 189 or 27
        translations): s = P sqrt(2 L / (3^d r)), with r = 40 flops of GEMM
        per pair term (H200: 7e11 pairs/s against 3e13 flop/s)."""
        translations = 6 ** self.dim - 3 ** self.dim      # an interior box's list
        share = (2 * translations / (3 ** self.dim * 40)) ** 0.5
        return max(32, int(share * n ** self.dim))

    # -------------------------------------------------------------- operators
    def operators(self, n: int, m2l_offsets, dtype) -> Operators:
        m2m = jnp.asarray(_m2m_numpy(n, self.dim), dtype)
        return Operators(m2m, jnp.swapaxes(m2m, 1, 2))

    def m2l_matrices(self, ops, kernel, side, n: int):
        """(n_off + 1, P, P) M2L matrices for boxes of side `side` (traced),
        the last one zero: entry [o, m, m'] = K(side |xi_m - xi_m' - o|)."""
        dt = ops.m2m.dtype
        g = jnp.asarray(grid(n, self.dim), dt)
        offs = jnp.asarray(lists.m2l_offsets(self.dim), dt)
        r2 = 0.0
        for a in range(self.dim):   # per axis: no (n_off, P, P, d) temporary
            d = g[None, :, None, a] - g[None, None, :, a] - offs[:, None, None, a]
            r2 = r2 + d * d
        mats = kernel.radial(side * jnp.sqrt(r2))
        return jnp.concatenate([mats, jnp.zeros((1,) + mats.shape[1:], dt)])

    def p2m(self, u, q, n: int):
        """(N, K, P) per-source contributions q_i S_m(u_i)."""
        return q[:, :, None] * interpolation(u, n)[:, None, :]

    def l2p_coefficients(self, loc, n: int, gradient: bool):
        return loc[:, :, None, :]

    def l2p(self, u, coef, h, n: int, gradient: bool):
        """phi (M, K) and grad (M, K, d) from per-target weights coef (M, K, 1, P)."""
        loc = coef[:, :, 0, :]
        if not gradient:
            return jnp.einsum("mkp,mp->mk", loc, interpolation(u, n), precision=HIGHEST), None
        pairs = [basis(u[:, a], n, derivative=True) for a in range(self.dim)]
        s = [v for v, _ in pairs]
        phi = jnp.einsum("mkp,mp->mk", loc, _tensor(s), precision=HIGHEST)
        grad = jnp.stack([
            jnp.einsum("mkp,mp->mk", loc,
                       _tensor([pairs[b][1] if b == a else s[b] for b in range(self.dim)]),
                       precision=HIGHEST)
            for a in range(self.dim)], axis=-1) / h
        return phi, grad
