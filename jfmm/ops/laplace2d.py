"""2D Laplace expansions as complex Laurent and Taylor series (-log r, no 1/(2 pi)).

The series of the 2D FMM of Greengard and Rokhlin (J. Comput. Phys. 73,
325-348, 1987, section 2), in box-scaled coordinates. A point is a complex
number z = x + i y and -log|z - z'| = Re(-log(z - z')). A box has centre c
and side h; its scaled coordinate is w = (z - c) / h. Order p keeps the
degrees k = 0..p-1 of every series. With d = (child centre - parent centre)
/ (parent side) and tau = (target centre - source centre) / h for an M2L pair
(tau = -offset of jfmm.tree.lists.m2l_offsets):

    P2M   M_0 = sum_i q_i,   M_k = sum_i q_i w_i^k / k                (k >= 1)
    M2P   phi(z) = -M_0 log h + Re[-M_0 log t + sum_{k>=1} M_k t^-k],  t = (z - c) / h
    M2M   M_0 = M'_0,  M_k = M'_0 d^k / k + sum_{j=1}^k C(k, j) (j / k) d^(k-j) 2^-j M'_j
    M2L   L_0 = -M_0 (log h + log|tau|) + sum_{k>=1} M_k tau^-k
          L_l = (-1)^l [M_0 / (l tau^l) + sum_{k>=1} C(k+l-1, l) M_k tau^-(k+l)]
    L2L   L'_j = 2^-j sum_{l>=j} C(l, j) d^(l-j) L_l
    L2P   phi(z) = Re f(s),  f(s) = sum_l L_l s^l,  s = (z - c) / h
          grad phi = (Re f'(s), -Im f'(s)) / h,  f'(s) = sum_l (l + 1) L_{l+1} s^l

(primes: the child's expansion, of side h / 2). M2M and L2L are exact; the
series follow from log(1 - x) = -sum x^k / k and the binomial series of
(1 + x)^-k. Only M2L depends on the level, through the rank-one term
-M_0 log h (log is not scale invariant): `operators` holds the matrices for
h = 1 and `m2l_matrices` adds the term for the level's side.

Storage: P = 2p reals per expansion, (Re, Im) of degree k at 2k, 2k + 1.
Slot 1, the imaginary part of degree 0, is always zero: M_0 is real, and
Im L_0 never reaches the real field, so no operator writes it. Each complex
operator A acts on this layout as the real matrix with 2x2 blocks
[[Re A, -Im A], [Im A, Re A]]. Scaled coefficients stay O(1) in float32:
|w| <= sqrt(2)/2 inside a box and |tau| >= 2.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jfmm.tree import lists

DIM = 2
NAME = "laplace2d"
SCHEME = "tree"          # upward and downward passes over the tree, plus the near field
HIGHEST = jax.lax.Precision.HIGHEST


# ---------------------------------------------------------------- operators

def _realify(a: np.ndarray) -> np.ndarray:
    """Complex (..., p, p) -> real (..., 2p, 2p) acting on the (Re, Im) layout,
    with the row of Im degree 0 cleared (see module docstring)."""
    p = a.shape[-1]
    out = np.zeros(a.shape[:-2] + (p, 2, p, 2))
    out[..., :, 0, :, 0] = a.real
    out[..., :, 0, :, 1] = -a.imag
    out[..., :, 1, :, 0] = a.imag
    out[..., :, 1, :, 1] = a.real
    out = out.reshape(a.shape[:-2] + (2 * p, 2 * p))
    out[..., 1, :] = 0.0
    return out


@functools.lru_cache(maxsize=None)
def _binomials(n: int) -> np.ndarray:
    """(n, n) float64 table C[a, b] = binomial(a, b) (0 where b > a)."""
    return np.array([[math.comb(a, b) for b in range(n)] for a in range(n)], np.float64)


def _m2m_complex(d: complex, p: int) -> np.ndarray:
    """(p, p) complex M2M from a child at d (parent sides) to the parent."""
    c = _binomials(p)
    a = np.zeros((p, p), np.complex128)
    a[0, 0] = 1.0
    for k in range(1, p):
        a[k, 0] = d ** k / k
        for j in range(1, k + 1):
            a[k, j] = c[k, j] * (j / k) * d ** (k - j) * 2.0 ** -j
    return a


def _l2l_complex(d: complex, p: int) -> np.ndarray:
    """(p, p) complex L2L from a parent to its child at d (parent sides)."""
    c = _binomials(p)
    a = np.zeros((p, p), np.complex128)
    for j in range(p):
        for l in range(j, p):
            a[j, l] = 2.0 ** -j * c[l, j] * d ** (l - j)
    return a


def _m2l_complex(tau: np.ndarray, p: int) -> np.ndarray:
    """(n, p, p) complex M2L for target-minus-source shifts tau (n,) in box
    sides, at box side h = 1."""
    c = _binomials(2 * p)
    l, k = np.arange(p)[:, None], np.arange(p)[None, :]
    t = tau[:, None, None]
    sign = (-1.0) ** l
    lk = np.maximum(l + k - 1, 0)
    a = sign * c[lk, l] * t ** -(l + k)                             # k >= 1 columns
    lpos = np.maximum(l, 1)
    a[:, :, 0] = (sign / lpos * t ** -lpos)[:, :, 0]                 # M_0 -> L_l, l >= 1
    a[:, 0, 0] = -np.log(np.abs(tau))
    return a


class Operators(NamedTuple):
    """Translation matrices for one order p, P = 2p (level independent).

    m2m: (4, P, P)          child multipole -> parent multipole, per child slot
    l2l: (4, P, P)          parent local -> child local, per child slot
    m2l: (n_off + 1, P, P)  source multipole -> target local per M2L offset, for
                            boxes of side 1 (`m2l_matrices` adds the level's
                            term); the last one is zero.
    """
    m2m: jax.Array
    l2l: jax.Array
    m2l: jax.Array


@functools.lru_cache(maxsize=None)
def _operators_numpy(p: int, offsets: tuple) -> tuple:
    bits = lists.child_bits(DIM)
    ds = [complex(*((b - 0.5) / 2.0)) for b in bits]
    m2m = _realify(np.stack([_m2m_complex(d, p) for d in ds]))
    l2l = _realify(np.stack([_l2l_complex(d, p) for d in ds]))
    o = np.asarray(offsets, np.float64).reshape(-1, DIM)
    m2l = _realify(_m2l_complex(-(o[:, 0] + 1j * o[:, 1]), p))
    m2l = np.concatenate([m2l, np.zeros((1, 2 * p, 2 * p))])
    return m2m, l2l, m2l


def operators(p: int, m2l_offsets: np.ndarray, dtype) -> Operators:
    """Build the translation operators for order p.

    m2l_offsets: (n_off, 2) integer offsets (source centre minus target
    centre, in box sides). Built in numpy float64, then cast, so float32
    operators are correctly rounded.
    """
    offs = tuple(map(tuple, np.asarray(m2l_offsets).tolist()))
    return Operators(*(jnp.asarray(a, dtype) for a in _operators_numpy(p, offs)))


def m2l_basis(ops: Operators):
    """None: M2L acts on the expansions themselves (see jfmm.ops)."""
    return None


def m2l_matrices(ops: Operators, kernel, side, p: int):
    """(n_off + 1, P, P) M2L matrices for boxes of side `side` (traced scalar):
    ops.m2l plus the rank-one term L_0 += -log(side) M_0 on every offset but
    the zero one. kernel is Laplace2D (no parameters)."""
    corr = -jnp.log(jnp.asarray(side, ops.m2l.dtype))
    return ops.m2l.at[:-1, 0, 0].add(corr)


# ---------------------------------------------------------------- P2M, L2P

def powers(u, p: int):
    """(Re, Im) of s^k, k < p, for s = u_0 + i u_1: u (..., 2) -> (..., 2p).

    A scan over k (program size independent of p).
    """
    x, y = u[..., 0], u[..., 1]

    def step(carry, _):
        re, im = carry
        return (re * x - im * y, re * y + im * x), carry

    start = (jnp.ones_like(x), jnp.zeros_like(x))
    _, (re, im) = jax.lax.scan(step, start, None, length=p)         # (p, ...) each
    both = jnp.stack([re, im], axis=-1)                             # (p, ..., 2)
    return jnp.moveaxis(both, 0, -2).reshape(u.shape[:-1] + (2 * p,))


def _p2m_scale(p: int) -> np.ndarray:
    """1 on degree 0, 1/k on degree k; 0 on slot 1."""
    k = np.arange(p, dtype=np.float64)
    s = np.repeat(1.0 / np.maximum(k, 1.0), 2)
    s[1] = 0.0
    return s


def p2m(u, q, p: int):
    """Multipole coefficients of point charges (M_k = q w^k / k, M_0 = q).

    u: (N, 2) box-local scaled positions (x - centre) / h; q: (N, K).
    Returns (N, K, 2p) per-source contributions (the driver sums them per leaf).
    """
    w = powers(u, p) * jnp.asarray(_p2m_scale(p), u.dtype)
    return q[:, :, None] * w[:, None, :]


def l2p_coefficients(loc, p: int, gradient: bool):
    """Per-box coefficient sets that L2P evaluates as Re sum c_l s^l:
    (B, K, 1 or 3, 2p).

    loc: (B, K, 2p) local expansions. With gradient, the sets f' and i f'
    follow the potential's (Re(i f') = -Im f'): D_l = (l + 1) L_{l+1}.
    """
    if not gradient:
        return loc[:, :, None, :]
    scale = jnp.asarray(np.repeat(np.arange(1, p, dtype=np.float64), 2), loc.dtype)
    d = loc[..., 2:] * scale
    d = jnp.concatenate([d, jnp.zeros(loc.shape[:-1] + (2,), loc.dtype)], axis=-1)
    di = jnp.stack([-d[..., 1::2], d[..., 0::2]], axis=-1).reshape(d.shape)
    return jnp.stack([loc, d, di], axis=2)


def _re_weights(u, p: int):
    """v with Re sum_l c_l s^l = sum_i v_i c_i in the (Re, Im) layout: (..., 2p)."""
    sign = jnp.asarray(np.tile([1.0, -1.0], p), u.dtype)
    return powers(u, p) * sign


def l2p(u, coef, h, p: int, gradient: bool):
    """Evaluate local expansions at targets.

    u: (M, 2) scaled target positions (y - centre) / h; coef: (M, K, E, 2p)
    from `l2p_coefficients` (E = 3 with gradient, else 1), already gathered
    per target; h: scalar box side. Returns phi (M, K) and, if gradient,
    grad (M, K, 2) = d phi / d y, else None.
    """
    out = jnp.einsum("mkep,mp->mke", coef, _re_weights(u, p), precision=HIGHEST)
    phi = out[:, :, 0]
    if not gradient:
        return phi, None
    return phi, out[:, :, 1:] / jnp.reshape(h, jnp.shape(h) + (1, 1))


def m2p(u, mult, h, p: int):
    """Evaluate multipole expansions at far points (used in checks).

    u: (M, 2) scaled positions (y - centre) / h, |u| > box radius;
    mult: (M, K, 2p); h: box side. Returns phi (M, K).
    """
    r2 = jnp.sum(u * u, axis=-1)
    inv = u * jnp.asarray([1.0, -1.0], u.dtype) / r2[:, None]        # 1 / t
    series = jnp.einsum("mkp,mp->mk", mult.at[..., :2].set(0.0), _re_weights(inv, p),
                        precision=HIGHEST)
    return series - mult[..., 0] * (jnp.log(h) + 0.5 * jnp.log(r2))[:, None]


def _inverse(u):
    """(Re, Im) of 1 / s for s = u_0 + i u_1: u (..., 2)."""
    r2 = jnp.sum(u * u, axis=-1, keepdims=True)
    return u * jnp.asarray([1.0, -1.0], u.dtype) / r2


def m2p_basis(kernel, u, h, p: int, gradient: bool = False):
    """b (M, 2p) with phi(z) = sum_i b_i M_i for the multipole M of a box of
    side h (M,) and u = (z - centre) / h outside it (M2P: `m2p` as a
    product), and with gradient its derivatives in z (M, 2p, 2) (else
    None): d/dx Re f = Re f', d/dy Re f = -Im f', f' of M_k t^-k being
    -k M_k t^(-k-1) and of -M_0 log t being -M_0 / t."""
    log_r = 0.5 * jnp.log(jnp.sum(u * u, axis=-1))
    pw = powers(_inverse(u), p + 1)                                 # t^-k, k <= p
    b = pw[:, :2 * p] * jnp.asarray(np.tile([1.0, -1.0], p), u.dtype)
    b = b.at[:, 0].set(-(jnp.log(h) + log_r)).at[:, 1].set(0.0)
    if not gradient:
        return b, None
    re, im = pw[:, 2::2], pw[:, 3::2]                               # t^-(k+1), k < p
    k = jnp.asarray(np.maximum(np.arange(p), 1.0), u.dtype)         # -M_0 / t at k = 0
    gx = jnp.stack([-k * re, k * im], axis=-1).reshape(re.shape[0], -1)
    gy = jnp.stack([k * im, k * re], axis=-1).reshape(re.shape[0], -1)
    g = jnp.stack([gx.at[:, 1].set(0.0), gy.at[:, 1].set(0.0)], axis=-1)
    return b, g / h[:, None, None]


def p2l_basis(kernel, v, h, p: int):
    """b (M, 2p): a unit charge at v = (x - centre) / h outside a box of
    side h (M,) adds b to the box's local expansion (P2L):
    -log|z - x| = -log h - log|tau| + Re sum_l (-1)^l (s / tau)^l / l with
    tau = -v, s the target's scaled coordinate."""
    log_tau = 0.5 * jnp.log(jnp.sum(v * v, axis=-1))
    k = np.arange(p, dtype=np.float64)
    scale = np.repeat((-1.0) ** k / np.maximum(k, 1.0), 2)
    b = powers(_inverse(-v), p) * jnp.asarray(scale, v.dtype)
    return b.at[:, 0].set(-(jnp.log(h) + log_tau)).at[:, 1].set(0.0)
