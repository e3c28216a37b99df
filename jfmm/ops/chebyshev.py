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
k per level, which limits n in 3D; compressing them further (SVD per
offset) is the way to higher orders.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jfmm.ops import rules, tensor
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


# ------------------------------------------------------------ error estimate
#
# M2M and L2L are exact on the interpolating polynomials, so the far field's
# error is the error of interpolating K(|x - y|) over the boxes of each
# level's well-separated pairs. Along a line through a box of side h, with
# K's Chebyshev coefficients c_k there, interpolation at n nodes errs by at
# most 2 sum_{k >= n} |c_k| and its derivative by (2 / h) 2 sum_{k >= n} k^2
# |c_k|. `far_field_error` takes 2d such errors per pair (one per coordinate
# of x and y), averages their squares over sample lines of every M2L offset
# and turns them into relative L2 errors of phi and grad phi with random
# mixed-sign charges:
#
#   err(n)^2 = sum_l f_l (2d)^2 mean_lines(tail_l(n)^2) / mean(K^2 over pairs)
#
# (grad: K'^2 and the derivative's tail), with f_l = min(1, (6^d - 3^d) /
# 2^(dl)) the share of pairs translated at level l (an interior box's list).

_LINE_POINTS = 48
_SAMPLES = (-0.35, 0.35)
_NOISE = 1e-14


@functools.lru_cache(maxsize=None)
def _lines(dim: int):
    """Sample lines of well-separated pairs, in box sides.

    Returns x (L, d) target points (2^d per target box, at each M2L offset
    up to symmetry: non-negative, non-increasing components), y (L, M, d)
    the M Chebyshev points of the first kind on lines through the source box
    [-1/2, 1/2]^d along each axis (2^(d-1) per axis), weight (L,) the
    offsets' multiplicities (summing to 1), T (M, M), T[k, j] = T_k(tau_j)."""
    canon = {}
    for o in np.abs(lists.m2l_offsets(dim)):
        key = tuple(sorted(o, reverse=True))
        canon[key] = canon.get(key, 0) + 1
    tau = np.cos((2 * np.arange(_LINE_POINTS) + 1) * np.pi / (2 * _LINE_POINTS))
    xs, ys, ws = [], [], []
    for o, count in canon.items():
        for v in np.ndindex(*(2,) * dim):
            x = np.array(o, float) + np.take(_SAMPLES, v)
            for a in range(dim):
                for w in np.ndindex(*(2,) * (dim - 1)):
                    y = np.repeat(np.insert(np.take(_SAMPLES, w), a, 0.0)[None],
                                  _LINE_POINTS, axis=0)
                    y[:, a] = tau / 2
                    xs.append(x)
                    ys.append(y)
                    ws.append(count)
    ws = np.array(ws, float)
    t = np.cos(np.outer(np.arange(_LINE_POINTS), np.arccos(tau)))
    return np.array(xs), np.array(ys), ws / ws.sum(), t


def _tails_squared(kernel, dim: int, side: float) -> np.ndarray:
    """(2, M + 1): the lines' mean squared error bound of interpolation
    (row 0) and of its derivative (row 1) at n = 0..M nodes, boxes of side
    `side` (float64; kernel parameters concrete)."""
    x, y, weight, t = _lines(dim)
    r = side * np.sqrt(np.sum((x[:, None, :] - y) ** 2, axis=-1))      # (L, M)
    f = np.asarray(kernel.radial(jnp.asarray(r)), np.float64)
    c = np.abs(f @ t.T) * (2.0 / _LINE_POINTS)
    c[:, 0] /= 2
    # Coefficients at float64 rounding level are noise, not truncation: the
    # order cannot lower them (float64's own floor is separate).
    c[c < _NOISE * np.max(np.abs(f), axis=1, keepdims=True)] = 0.0
    k2 = np.arange(_LINE_POINTS) ** 2
    out = np.zeros((2, _LINE_POINTS + 1))
    for row, coef in enumerate((c, c * k2 * (2.0 / side))):
        tail = 2 * np.cumsum(coef[:, ::-1], axis=1)[:, ::-1]           # n = 0..M-1
        out[row, :-1] = weight @ (tail * tail)
    return out


def pair_moments(kernel, r2, side: float, dim: int) -> tuple[float, float]:
    """mean K(r)^2 and mean K'(r)^2 over the points' pairs: sample pairs
    (squared distances r2) farther apart than side / 8, plus pairs closer
    than that as for uniform points in a root box of `side`, density
    S_d r^(d-1) / side^d, integrated over a geometric grid of r (too few
    close pairs fall in a sample for a kernel much narrower than the box;
    clustered points have more of them, so this errs low: the estimate
    high)."""
    cut = side / 8
    r2 = np.asarray(r2, np.float64)
    far = np.sqrt(r2[r2 > cut * cut])
    k, dk = kernel.value_and_derivative(jnp.asarray(far))
    sampled = [float(np.sum(np.asarray(v, np.float64) ** 2)) / r2.shape[0] for v in (k, dk)]
    steps = np.arange(240) / 4.0                      # r from cut down to cut 2^-60
    r = cut * 2.0 ** -steps
    k, dk = kernel.value_and_derivative(jnp.asarray(r))
    density = (2 * np.pi if dim == 2 else 4 * np.pi) * r ** dim / side ** dim
    dlog = np.log(2.0) / 4
    close = [float(np.sum(np.nan_to_num(np.asarray(v, np.float64) ** 2) * density) * dlog)
             for v in (k, dk)]
    return sampled[0] + close[0], sampled[1] + close[1]


def far_field_error(kernel, dim: int, root_side: float, depth: int,
                    moments: tuple[float, float], cache: dict | None = None) -> np.ndarray:
    """(2, M + 1): estimated relative L2 errors of phi (row 0) and of its
    gradient (row 1) at n = 0..M nodes per dimension, for a tree of `depth`
    over a root box of side `root_side`; moments from `pair_moments`; cache:
    {side: _tails_squared}, shared between calls. Needs concrete kernel
    parameters; evaluates in float64 (call it under jax.enable_x64)."""
    cache = {} if cache is None else cache
    total = np.zeros((2, _LINE_POINTS + 1))
    for level in range(2, depth + 1):
        side = root_side / 2 ** level
        if side not in cache:
            cache[side] = _tails_squared(kernel, dim, side)
        share = min(1.0, (6 ** dim - 3 ** dim) / 2 ** (dim * level))
        total += share * (2 * dim) ** 2 * cache[side]
    tiny = np.finfo(float).tiny
    return np.sqrt(total / np.maximum(np.array(moments), tiny)[:, None])


# Order rules per dimension. Where the kernel's parameters are concrete the
# order comes from `far_field_error` for this kernel, these points (or the
# worst root box size, where the points are traced) and the tree's depth:
# the smallest n in [min_order, max_estimated] with max(err phi, err grad /
# GRADIENT_SLACK) <= eps / ESTIMATE_MARGIN. Measured over every kernel, 2D
# and 3D, uniform and clustered points (docs/BENCHMARKS.md), the measured
# error of phi is at most 1.08 times its estimate and that of grad at most
# 0.06 times its own, so the rule keeps err phi <= 0.27 eps and err grad <=
# 3 eps. (Measured before the 3D M2L's truncated basis, which the estimate
# does not model: it added 3% to the error where measured, and the N =
# 20,000 acceptance of every kernel stayed within eps.)
# max_estimated: 2D saturates near 1e-13 (rounding) by n = 18; in 3D the
# M2L matrices hold 317 k^2 values per level (k of the n^3 multi-indices
# kept: 3.3 GB in float64 at n = 12, k = 1,142; orders above 12 are not
# measured).
#
# Otherwise (traced kernel parameters) the worst-case rule: the relative
# error assumed at n is error_scale * error_rate^n, at least 4x the worst of
# max(err phi, err grad / 10) measured over every kernel (Gaussians of three
# widths, multiquadrics, polyharmonics, Yukawa, Laplace2D), uniform and
# clustered points (benchmarks/accuracy_rbf.py, N = 4,000, float64;
# docs/accuracy_chebyshev_*.md). The worst case is the Gaussian whose width
# is about a box side. 3D orders 8-10 were measured on the seven hardest
# kernels of n = 7. Orders below min_order were not measured.
RULES = {2: dict(error_scale=2.5, error_rate=0.215, min_order=4, max_order=18,
                 max_estimated=18),
         3: dict(error_scale=1.0, error_rate=0.25, min_order=4, max_order=10,
                 max_estimated=12)}
ESTIMATE_MARGIN = 4.0
GRADIENT_SLACK = 200.0
# Rounding floors of the estimated rule (2D float64 measured: 1e-14 to 2e-13
# at n = 16-18, docs/BENCHMARKS.md).
ROUNDING_FLOOR = {"float32": 3e-6, "float64": 1e-12}
# Root box sides tried where the points are traced (the kernel's own length
# scale is unknown): 4^-10 .. 4^10.
_TRACED_SIDES = tuple(4.0 ** k for k in range(-10, 11))


def _float64():
    """A context in which jnp computes in float64 (jax.enable_x64 here,
    jax.experimental.enable_x64 in releases without it)."""
    ctx = getattr(jax, "enable_x64", None)
    if ctx is None:
        from jax.experimental import enable_x64 as ctx
    return ctx(True)


def _model_pairs(dim: int, count: int = 4096) -> np.ndarray:
    """Squared distances of `count` pairs of uniform points in the unit cube."""
    rng = np.random.default_rng(0)
    return np.sum((rng.random((count, dim)) - rng.random((count, dim))) ** 2, axis=-1)


class Chebyshev:
    """The Chebyshev family in `dim` dimensions (any kernel).

    `order_for` chooses n from an error estimate for the kernel and points;
    `order` is the worst-case rule (`RULES`) used where the kernel's
    parameters are traced.
    """

    NAME = "chebyshev"
    SCHEME = "tree"

    def __init__(self, dim: int, error_scale: float, error_rate: float, min_order: int,
                 max_order: int, max_estimated: int):
        self.dim = dim
        self.error_scale, self.error_rate = error_scale, error_rate
        self.MAX_ORDER = max(max_order, max_estimated)
        self.ORDERS = tuple(range(min_order, max_order + 1))
        self.ESTIMATED_ORDERS = tuple(range(min_order, max_estimated + 1))

    def __repr__(self):
        return f"Chebyshev(dim={self.dim})"

    # -------------------------------------------------------------- rules
    def _error_bound(self, n: int) -> float:
        return self.error_scale * self.error_rate ** n

    @property
    def EPS_FLOOR(self):
        """The worst-case rule's floor (`order_for` may reach further)."""
        worst = self._error_bound(self.ORDERS[-1])
        return {"float32": max(ROUNDING_FLOOR["float32"], worst), "float64": worst}

    def order(self, eps: float, dtype, points: float | None = None) -> int:
        """Nodes per dimension n for a relative L2 error eps by the
        worst-case rule (ValueError if eps is below what dtype or the
        largest n reaches)."""
        return rules.choose_order(eps, dtype, self.EPS_FLOOR, self.ORDERS, self._error_bound,
                                  f"the {self.dim}D Chebyshev family")

    def order_for(self, eps: float, dtype, kernel, depth_of, root_side=None,
                  pair_r2=None) -> int:
        """n for a relative L2 error eps from `far_field_error`: the
        smallest n whose estimate, max(err phi, err grad / GRADIENT_SLACK),
        is <= eps / ESTIMATE_MARGIN.

        kernel: concrete parameters; depth_of(n): the tree depth at n;
        root_side and pair_r2 (squared distances of sample pairs of the
        points): None where the points are traced, and then the worst of
        uniform points in root boxes of sides _TRACED_SIDES. ValueError if
        no n reaches eps, or eps is below the dtype's ROUNDING_FLOOR.
        """
        name = jnp.dtype(dtype).name
        if eps < ROUNDING_FLOOR[name]:
            hint = "; use float64 inputs with jax_enable_x64" if name == "float32" else ""
            raise ValueError(f"eps={eps:g} is below what the {self.dim}D Chebyshev family "
                             f"reaches in {name} (about {ROUNDING_FLOOR[name]:.1e}){hint}")
        if root_side is None:
            # The worst over box sizes; no more than the worst-case rule's n.
            try:
                cap = self.order(eps, dtype)
            except ValueError:
                cap = None
            cases = [(s, _model_pairs(self.dim) * s * s) for s in _TRACED_SIDES]
        else:
            cases = [(float(root_side), np.asarray(pair_r2, np.float64))]
        with _float64(), jax.ensure_compile_time_eval():
            moments = [pair_moments(kernel, r2, s, self.dim) for s, r2 in cases]
            estimates, cache = {}, {}
            best = None
            for n in self.ESTIMATED_ORDERS:
                depth = depth_of(n)
                if depth not in estimates:
                    estimates[depth] = np.max([far_field_error(kernel, self.dim, s, depth, m, cache)
                                               for (s, _), m in zip(cases, moments)], axis=0)
                err = estimates[depth][:, n]
                if max(err[0], err[1] / GRADIENT_SLACK) * ESTIMATE_MARGIN <= eps:
                    return n if root_side is not None or cap is None else min(n, cap)
                if root_side is None and n == cap:
                    return cap
                best = err[0] if best is None else min(best, err[0])
        raise ValueError(f"eps={eps:g} is below what the {self.dim}D Chebyshev family reaches "
                         f"for {kernel} on these points (estimated error {best:.1e} at "
                         f"n = {self.ESTIMATED_ORDERS[-1]}); use a larger eps")

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
        basis = jnp.asarray(m2l_basis_numpy(n, 3), dtype) if self.dim == 3 else None
        return Operators(m2m, jnp.swapaxes(m2m, 1, 2), basis)

    def m2l_basis(self, ops):
        """(k, P) or None: M2L runs on basis @ multipoles and its results
        return through basis.T (see the module docstring)."""
        return ops.basis

    def m2l_matrices(self, ops, kernel, side, n: int):
        """(n_off + 1, Q, Q) M2L matrices for boxes of side `side` (traced),
        the last one zero. The node matrices K_o[m, m'] = K(side |xi_m -
        xi_m' - o|) (Q = P, 2D), or in 3D F_E K_o F_E^T (Q = k)."""
        dt = ops.m2m.dtype
        if ops.basis is not None:
            canon, which, index, sign = _symmetries(n)
            mats = _truncate(_truncate(_node_matrices(kernel, side, n, 3, canon, dt), n), n)
            index = jnp.asarray(index)
            sign = jnp.asarray(sign, dt)
            # One gather of (n_off, k, k), the signs fused into it.
            mats = (mats[jnp.asarray(which)[:, None, None], index[:, :, None], index[:, None, :]]
                    * sign[:, :, None] * sign[:, None, :])
        else:
            mats = _node_matrices(kernel, side, n, self.dim, lists.m2l_offsets(self.dim), dt)
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
        return tensor.evaluate(loc, pairs, h, gradient)
