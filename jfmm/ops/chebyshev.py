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
P = n^d weights.

In 3D the M2L runs in a truncated Chebyshev basis: multipole weights W go
to Chebyshev moments nu = F^-T W, local node values L to coefficients c =
F L (F: the tensor Chebyshev transform, `_basis_coefficients` per axis),
and only the multi-indices j with |j|_2 <= n - 1 + M2L_RADIUS_PAD are kept
(k of the P; `m2l_basis`). The far field between well-separated boxes is
analytic and its Chebyshev coefficients decay with the Euclidean length of
j, so the corners of the index cube (large |j|_2, every j_a < n) carry
little: measured on K(|x - y|) over the M2L offsets (Laplace, Yukawa(2),
thin-plate; n = 6-14), the tail beyond |j|_2 = n + 0.25 weighs no more
than the tensor truncation's (beyond max_a j_a = n - 1), and in the whole
FMM, where interpolation errs more than truncation, the error grew by 3%
(Yukawa(2), n = 6; docs/BENCHMARKS.md). Per level the matrices are F_E
K_o F_E^T (k x k): per-axis transforms of the kernel's node matrices K_o
for 16 canonical offsets, mapped to all 316 by the cube's symmetries
(`_symmetries`). A translation costs (k / P)^2 of the dense one (0.46 at
n = 10: k = 678 of 1,000). The matrices are still dense (n_off + 1) x k x
k per level, which limits n in 3D; above STORED_M2L_BYTES only the 16
canonical ones are held and each use gathers its offsets' matrices from
them (`SymmetricM2L`); compressing them further (SVD per offset) is the
way to higher orders.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jfmm.ops import tensor, translate
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


def interpolation(u, n: int):
    """S_m(u) (N, n^d) at box-local points u (N, d): the P2M weights of unit
    charges, and the L2P evaluation."""
    return tensor.product([basis(u[:, a], n) for a in range(u.shape[1])])


def _node_matrices(kernel, side, n: int, dim: int, offsets: np.ndarray, dt):
    """(len(offsets), P, P): [o, m, m'] = K(side |xi_m - xi_m' - o|)."""
    g = jnp.asarray(grid(n, dim), dt)
    offs = jnp.asarray(offsets, dt)
    r2 = 0.0
    for a in range(dim):        # per axis: no (n_off, P, P, d) temporary
        d = g[None, :, None, a] - g[None, None, :, a] - offs[:, None, None, a]
        r2 = r2 + d * d
    return kernel.radial(side * jnp.sqrt(r2))


@functools.lru_cache(maxsize=None)
def _symmetries(n: int):
    """The 3D M2L offsets as images of 16 canonical ones (0 <= c_0 <= c_1
    <= c_2) under the cube's reflections and axis permutations, which act
    on truncated Chebyshev matrices by permuting and sign-flipping their
    multi-indices: with c = |o| sorted by a permutation pi (c_i =
    |o_pi(i)|) and s = sign(o), K(|x - y - o|) = K(|Phi x - Phi y - c|)
    for (Phi x)_i = s_pi(i) x_pi(i), so

        C_o[J, J'] = C_c[J o pi, J' o pi] prod_a s_a^(J_a + J'_a).

    Returns (canonical offsets (16, 3), which (n_off,) canonical each
    offset maps to, index (n_off, k) the row of C_c for each kept
    multi-index, sign (n_off, k) prod_a s_a^(J_a))."""
    offsets = lists.m2l_offsets(3)
    keep = _ball(n, 3)
    j = np.stack(np.unravel_index(keep, (n, n, n)), axis=1)          # (k, 3)
    position = {tuple(v): i for i, v in enumerate(j)}
    canon, which, index, sign = [], [], [], []
    for o in offsets:
        pi = np.argsort(np.abs(o), kind="stable")
        c = tuple(np.abs(o)[pi])
        if c not in canon:
            canon.append(c)
        which.append(canon.index(c))
        index.append([position[tuple(v[pi])] for v in j])
        s = np.where(o < 0, -1.0, 1.0)
        sign.append(np.prod(s[None, :] ** j, axis=1))
    return (np.array(canon, np.float64), np.array(which), np.array(index, np.int32),
            np.array(sign))


def _truncate(mats, n: int):
    """(n_off, P, Q) -> (n_off, Q, k): F_E along the middle axis (per-axis
    transforms, then the kept rows), and the result transposed; applied
    twice, K_o -> F_E K_o F_E^T (3D)."""
    o, p, q = mats.shape
    c = jnp.asarray(_basis_coefficients(n), mats.dtype)             # [j, k]
    x = mats.reshape(o, n, n, n, q)
    x = jnp.einsum("oabcq,ia->oibcq", x, c, precision=HIGHEST)
    x = jnp.einsum("oibcq,jb->oijcq", x, c, precision=HIGHEST)
    x = jnp.einsum("oijcq,kc->oijkq", x, c, precision=HIGHEST)
    x = x.reshape(o, p, q)[:, _ball(n, 3)]
    return jnp.swapaxes(x, 1, 2)


# Above this many bytes of a level's (n_off + 1, k, k) M2L matrices (per
# backend) only the 16 canonical ones are held (`SymmetricM2L`): M2L's loop
# over neighbour positions gathers each position's matrices anyway
# (`translate.m2l_blocks`), from either. The GPU keeps the measured
# configurations' stored matrices (float64 n = 10: 1.2 GB); the CPU holds
# n = 12 float64 in 0.2 GB, not 3.3 GB.
STORED_M2L_BYTES = {"cpu": 2 ** 29, "gpu": 2 ** 31}


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["canon", "which", "index", "sign"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class SymmetricM2L:
    """The 3D M2L matrices of a level as their 16 canonical ones: `self[i]`
    is the stored matrices' `mats[i]` (the same values: a gather and signs
    of +-1), without holding n_off k^2 values.

    canon (n_canon + 1, k, k), the last zero; which (n_off + 1,) the
    canonical matrix of each offset (the last, the zero slot, the zero
    one); index (n_off + 1, k) and sign (n_off + 1, k) as `_symmetries`."""
    canon: jax.Array
    which: jax.Array
    index: jax.Array
    sign: jax.Array

    def __getitem__(self, slot):
        idx, sign = self.index[slot], self.sign[slot]
        mats = self.canon[self.which[slot][..., None, None], idx[..., :, None], idx[..., None, :]]
        return mats * sign[..., :, None] * sign[..., None, :]


@functools.lru_cache(maxsize=None)
def grid(n: int, dim: int) -> np.ndarray:
    """(n^d, d) node coordinates in the order of `tensor.product`."""
    g = np.meshgrid(*([nodes(n)] * dim), indexing="ij")
    return np.stack([a.reshape(-1) for a in g], axis=-1)


class Operators(NamedTuple):
    """Kernel-independent operators (the M2L matrices are built per level).

    m2m: (2^d, P, P) child weights -> parent weights, per child slot
    l2l: (2^d, P, P) parent local -> child local (the transposes)
    basis: (k, P) the M2L basis (`m2l_basis`), None in 2D
    """
    m2m: jax.Array
    l2l: jax.Array
    basis: jax.Array | None = None


M2L_RADIUS_PAD = 1.25


@functools.lru_cache(maxsize=None)
def _ball(n: int, dim: int) -> np.ndarray:
    """Flat indices (row-major over n^d, as `grid`) of the multi-indices j
    with |j|_2 <= n - 1 + M2L_RADIUS_PAD."""
    j = np.stack(np.meshgrid(*([np.arange(n)] * dim), indexing="ij"), -1).reshape(-1, dim)
    return np.flatnonzero(np.sqrt(np.sum(j * j, axis=1)) <= n - 1 + M2L_RADIUS_PAD)


@functools.lru_cache(maxsize=None)
def m2l_basis_numpy(n: int, dim: int) -> np.ndarray:
    """(k, P) float64: [e, m] = prod_a T_(j_e)_a(2 xi_(m_a)), the Chebyshev
    polynomials of the kept multi-indices at the nodes. Its rows take
    multipole weights to moments (nu_E = B W, B = (F^-T)_E) and its
    transpose takes truncated local coefficients to node values (L = B^T
    c_E, B^T = (F^-1)_E)."""
    t = np.cos(np.outer(np.arccos(2 * nodes(n)), np.arange(n)))   # [k, j] = T_j(2 xi_k)
    full = t
    for _ in range(dim - 1):
        full = np.einsum("mj,kl->mkjl", full, t).reshape(full.shape[0] * n, -1)
    return full[:, _ball(n, dim)].T


@functools.lru_cache(maxsize=None)
def _m2m_numpy(n: int, dim: int) -> np.ndarray:
    """(2^d, P, P) float64: [c, m, m'] = S_m(node m' of child c, in parent
    coordinates), i.e. P2M of the child's node weights as charges."""
    child_nodes = grid(n, dim) / 2
    return np.stack([interpolation((bits - 0.5) / 2.0 + child_nodes, n).T
                     for bits in lists.child_bits(dim)])


class Chebyshev:
    """The Chebyshev family's operators in `dim` dimensions (any kernel);
    its orders come from `jfmm.models.chebyshev`."""

    NAME = "chebyshev"
    SCHEME = "tree"

    def __init__(self, dim: int):
        self.dim = dim

    def __repr__(self):
        return f"Chebyshev(dim={self.dim})"

    # -------------------------------------------------------------- operators
    def operators(self, n: int, m2l_offsets, dtype) -> Operators:
        m2m = jnp.asarray(_m2m_numpy(n, self.dim), dtype)
        basis = jnp.asarray(m2l_basis_numpy(n, 3), dtype) if self.dim == 3 else None
        return Operators(m2m, jnp.swapaxes(m2m, 1, 2), basis)

    def m2l_basis(self, ops):
        """(k, P) or None: M2L runs on basis @ multipoles and its results
        return through basis.T (see the module docstring)."""
        return ops.basis

    def m2l_matrices(self, ops, kernel, side, n: int):
        """(n_off + 1, Q, Q) M2L matrices for boxes of side `side` (traced),
        the last one zero. The node matrices K_o[m, m'] = K(side |xi_m -
        xi_m' - o|) (Q = P, 2D), or in 3D F_E K_o F_E^T (Q = k), above
        STORED_M2L_BYTES as a `SymmetricM2L` indexed alike."""
        dt = ops.m2m.dtype
        if ops.basis is None:
            mats = _node_matrices(kernel, side, n, self.dim, lists.m2l_offsets(self.dim), dt)
            return jnp.concatenate([mats, jnp.zeros((1,) + mats.shape[1:], dt)])
        canon, which, index, sign = _symmetries(n)
        mats = _truncate(_truncate(_node_matrices(kernel, side, n, 3, canon, dt), n), n)
        k, n_off = index.shape[1], len(which)
        zero = len(canon)                            # the zero slot: a zero matrix, unpermuted
        held = SymmetricM2L(jnp.concatenate([mats, jnp.zeros((1, k, k), dt)]),
                            jnp.asarray(np.append(which, zero)),
                            jnp.asarray(np.vstack([index, np.arange(k, dtype=index.dtype)])),
                            jnp.asarray(np.vstack([sign, np.ones(k)]), dt))
        if not translate.stores_m2l(STORED_M2L_BYTES, n_off + 1, k, dt):
            return held
        return held[jnp.arange(n_off + 1)]          # one gather, the signs fused into it

    def p2m(self, u, q, n: int):
        """(N, K, P) per-source contributions q_i S_m(u_i)."""
        return q[:, :, None] * interpolation(u, n)[:, None, :]

    def l2p_coefficients(self, loc, n: int, gradient: bool):
        return loc[:, :, None, :]

    def m2p_basis(self, kernel, u, h, n: int, gradient: bool = False):
        """b (M, P) with phi(y) = sum_m b_m W_m for the weights W of a box of
        side h (M,) and u = (y - centre) / h outside it: K(h |u - xi_m|);
        with gradient also d b / dy (M, P, d) (else None)."""
        g = jnp.asarray(grid(n, self.dim), u.dtype)
        diff = h[:, None, None] * (u[:, None, :] - g[None])          # y - x_m
        k, dk = kernel.from_r2(jnp.sum(diff * diff, axis=-1), gradient)
        return k, (dk[..., None] * diff if gradient else None)

    def p2l_basis(self, kernel, v, h, n: int):
        """b (M, P): a unit charge at v = (x - centre) / h outside a box of
        side h (M,) adds b to the box's local node values (P2L): the
        kernel from the charge to each node, as M2L does from nodes."""
        return self.m2p_basis(kernel, v, h, n)[0]

    def l2p(self, u, coef, h, n: int, gradient: bool):
        """phi (M, K) and grad (M, K, d) from per-target weights coef (M, K, 1, P)."""
        loc = coef[:, :, 0, :]
        if not gradient:
            return jnp.einsum("mkp,mp->mk", loc, interpolation(u, n), precision=HIGHEST), None
        pairs = [basis(u[:, a], n, derivative=True) for a in range(self.dim)]
        return tensor.evaluate(loc, pairs, h, gradient)
