# Over 400 lines: harmonics, translation and derivative tables of one family belong together.
"""3D Laplace expansions in a real solid-harmonic basis (1/|r|, no 1/(4 pi)).

Convention (Dehnen-type normalisation; identities checked numerically in
tests/ops/test_laplace3d.py). For m >= 0,

    Y_n^m(x) = (-i)^m r^n P_n^m(cos t) e^{i m phi} / (n + m)!        (regular)
    T_n^m(x) = (-i)^m (n - m)! P_n^m(cos t) e^{i m phi} / r^(n + 1)  (irregular)

with P_n^m the associated Legendre function without the Condon-Shortley
phase, and Y_n^{-m} = (-1)^m conj(Y_n^m), likewise T. In this normalisation
the addition theorems carry no sign factors:

    1 / |x - y|    = sum_{n,m} conj(Y_n^m(y)) T_n^m(x)            |y| < |x|
    Y_n^m(x + y)   = sum_{k,l} Y_k^l(x) Y_{n-k}^{m-l}(y)
    T_n^m(x - y)   = sum_{k,l} conj(Y_k^l(y)) T_{n+k}^{m+l}(x)    |y| < |x|

Both families come from trig-free recurrences in x, y, z (the
REFERENCES.md recurrences up to the phase (-1)^n i^m):

    Y_m^m = (y - i x) / (2m) Y_{m-1}^{m-1}
    Y_n^m = ((2n - 1) z Y_{n-1}^m - r^2 Y_{n-2}^m) / ((n + m)(n - m))
    T_m^m = (2m - 1) (y - i x) / r^2 T_{m-1}^{m-1}
    T_n^m = ((2n - 1) z T_{n-1}^m - ((n - 1)^2 - m^2) T_{n-2}^m) / r^2

Coefficients are stored as p^2 reals: for each degree n, Re of m = 0, then
(Re, Im) of m = 1..n; index n^2 + (0 | 2m - 1 | 2m). Negative m follow from
the symmetry above.

Scaled expansions (box side h, box-local coordinates u = (x - centre) / h)
keep every coefficient O(1) in float32 and make all translation operators
independent of the level:

    multipole  M_n^m = sum_i q_i conj(Y_n^m(u_i))
    local      phi(y) = (1/h) sum_{n,m} L_n^m conj(Y_n^m(u)),  u = (y - w) / h
    M2L        L_k^l = (-1)^k sum_{j,s} M_j^s T_{j+k}^{s+l}(t),  t = (w - z) / h
    M2M        M_n^m(parent) = sum_{k,l} 2^-k M_k^l(child) conj(Y_{n-k}^{m-l}(d))
    L2L        L_a^b(child) = 2^-(a+1) sum_{k,l} L_k^l(parent) conj(Y_{k-a}^{l-b}(d))

where d = (child centre - parent centre) / (parent side).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jfmm import _xla
from jfmm.ops import translate
from jfmm.tree import lists

DIM = 3
NAME = "laplace3d"
SCHEME = "tree"          # upward and downward passes over the tree, plus the near field


def _index(n: int, m: int, part: int) -> int:
    """Flat index of (degree n, order m >= 0, part 0=Re 1=Im)."""
    return n * n + (0 if m == 0 else 2 * m - 1 + part)


@functools.lru_cache(maxsize=None)
def _recurrence_tables(p: int, irregular: bool):
    """Static tables for `_harmonics`.

    Returns a, b: (p, p) coefficients of the three-term recurrence in n
    (row n, column m; zero where m >= n), diag: (p,) factor of the diagonal
    step, and layout: (p^2,) positions of the real layout in the flattened
    (n, m, re/im) array.
    """
    a, b, diag = np.zeros((p, p)), np.zeros((p, p)), np.zeros(p)
    for n in range(1, p):
        diag[n] = (2 * n - 1) if irregular else 1.0 / (2 * n)
        for m in range(n):
            if irregular:
                a[n, m], b[n, m] = 2 * n - 1, (n - 1) ** 2 - m * m
            else:
                a[n, m], b[n, m] = (2 * n - 1) / ((n + m) * (n - m)), 1.0 / ((n + m) * (n - m))
    layout = []
    for n in range(p):
        layout.append((n * p) * 2)
        for m in range(1, n + 1):
            layout += [(n * p + m) * 2, (n * p + m) * 2 + 1]
    return a, b, diag, np.array(layout, np.int32)


def _harmonics(x, p: int, irregular: bool):
    """Regular (Y) or irregular (T) solid harmonics in the real layout.

    x: (..., 3). Returns (..., p^2) holding Re/Im of Y_n^m or T_n^m, m >= 0.
    A scan over the degree n runs the trig-free recurrences (module
    docstring) for all orders m at once, so the program size does not grow
    with p. The irregular family needs x != 0.
    """
    x0, x1, x2 = x[..., 0], x[..., 1], x[..., 2]
    r2 = x0 * x0 + x1 * x1 + x2 * x2
    a, b, diag, layout = _recurrence_tables(p, irregular)
    dt = x.dtype
    if irregular:
        inv_r2 = 1.0 / r2
        first = jnp.sqrt(inv_r2)
        za, rb, dscale = (x2 * inv_r2)[..., None], inv_r2[..., None], inv_r2[..., None]
    else:
        first = jnp.ones_like(r2)
        za, rb, dscale = x2[..., None], r2[..., None], 1.0
    m_idx = jnp.arange(p)
    e0 = (m_idx == 0).astype(dt)
    prev1 = (first[..., None] * e0, jnp.zeros(x.shape[:-1] + (p,), dt))
    prev2 = (jnp.zeros_like(prev1[0]), jnp.zeros_like(prev1[0]))

    def step(carry, row):
        (p1r, p1i), (p2r, p2i) = carry
        n, an, bn, dn = row
        # Diagonal: (y - i x) * prev1[n - 1], shifted into column n.
        sr = jnp.roll(p1r, 1, axis=-1)
        si = jnp.roll(p1i, 1, axis=-1)
        dr = dn * dscale * (x1[..., None] * sr + x0[..., None] * si)
        di = dn * dscale * (x1[..., None] * si - x0[..., None] * sr)
        nr = an * za * p1r - bn * rb * p2r
        ni = an * za * p1i - bn * rb * p2i
        on_diag = m_idx == n
        nr = jnp.where(m_idx < n, nr, jnp.where(on_diag, dr, 0.0))
        ni = jnp.where(m_idx < n, ni, jnp.where(on_diag, di, 0.0))
        return ((nr, ni), (p1r, p1i)), (nr, ni)

    rows = (jnp.arange(1, p), jnp.asarray(a[1:], dt), jnp.asarray(b[1:], dt),
            jnp.asarray(diag[1:], dt))
    _, (re, im) = jax.lax.scan(step, (prev1, prev2), rows)     # (p - 1, ..., p)
    re = jnp.concatenate([prev1[0][None], re])
    im = jnp.concatenate([prev1[1][None], im])
    both = jnp.stack([re, im], axis=-1)                         # (p, ..., p, 2)
    both = jnp.moveaxis(both, 0, -3).reshape(x.shape[:-1] + (2 * p * p,))
    return both[..., layout]


def regular(x, p: int):
    """Y_n^m(x), n < p, in the real layout. x: (..., 3) -> (..., p^2)."""
    return _harmonics(x, p, irregular=False)


def irregular(x, p: int):
    """T_n^m(x), n < p, in the real layout. x: (..., 3), x != 0 -> (..., p^2)."""
    return _harmonics(x, p, irregular=True)


def regular_stream(u0, u1, u2, p: int, fma=None):
    """Yield (flat index, Y) for the regular harmonics, n < p, real layout.

    Unrolled: the same recurrences as `regular`, column by column (order m,
    then degree n), so that only a few values are live at a time; consumers
    use each value as it comes (the Pallas P2M and L2P kernels). u0, u1, u2:
    arrays of one shape; Y_0^0 comes as the Python float 1.0. fma(a, b, c)
    computes a * b + c (Pallas kernels pass one that rounds once).
    """
    fma = fma or (lambda a, b, c: a * b + c)
    r2 = fma(u2, u2, fma(u1, u1, u0 * u0))
    neg_u0 = -u0
    d_re, d_im = 1.0, None                      # Y_m^m; None stands for 0
    for m in range(p):
        if m:                                   # Y_m^m = (u1 - i u0) / (2m) Y_{m-1}^{m-1}
            s = 1.0 / (2 * m)
            if d_im is None:
                d_re, d_im = (s * d_re) * u1, (-s * d_re) * u0
            else:
                d_re, d_im = s * fma(u1, d_re, u0 * d_im), s * fma(u1, d_im, neg_u0 * d_re)
        cur, prev = (d_re, d_im), (None, None)
        for n in range(m, p):
            if n > m:                           # three-term recurrence in n
                a = (2 * n - 1) / ((n + m) * (n - m))
                b = 1.0 / ((n + m) * (n - m))
                nxt = tuple(None if c is None else
                            (a * u2 * c if q is None else fma(a * u2, c, (-b * r2) * q))
                            for c, q in zip(cur, prev))
                cur, prev = nxt, cur
            yield _index(n, m, 0), cur[0]
            if m:
                yield _index(n, m, 1), cur[1]


def irregular_stream(u0, u1, u2, p: int, fma=None):
    """Yield (flat index, T) for the irregular harmonics, n < p, real layout:
    `irregular` unrolled column by column as `regular_stream` does (the
    Pallas M2P and P2L kernels). u0, u1, u2: arrays of one shape, not all 0."""
    fma = fma or (lambda a, b, c: a * b + c)
    r2 = fma(u2, u2, fma(u1, u1, u0 * u0))
    inv_r2 = 1.0 / r2
    neg_u0 = -u0
    d_re, d_im = jax.lax.rsqrt(r2), None          # T_m^m; None stands for 0
    for m in range(p):
        if m:                                   # T_m^m = (2m - 1) (u1 - i u0) / r^2 T_{m-1}^{m-1}
            s = (2 * m - 1) * inv_r2
            if d_im is None:
                d_re, d_im = s * (u1 * d_re), s * (neg_u0 * d_re)
            else:
                d_re, d_im = s * fma(u1, d_re, u0 * d_im), s * fma(u1, d_im, neg_u0 * d_re)
        cur, prev = (d_re, d_im), (None, None)
        for n in range(m, p):
            if n > m:                           # three-term recurrence in n
                a, b = 2 * n - 1, (n - 1) ** 2 - m * m
                nxt = tuple(None if c is None else
                            (a * u2 * c * inv_r2 if q is None
                             else fma(a * u2, c, (-b) * q) * inv_r2)
                            for c, q in zip(cur, prev))
                cur, prev = nxt, cur
            yield _index(n, m, 0), cur[0]
            if m:
                yield _index(n, m, 1), cur[1]


def _conj_sign(p: int) -> np.ndarray:
    """+1 on real parts, -1 on imaginary parts: conj in the real layout."""
    s = np.ones(p * p)
    for n in range(p):
        for m in range(1, n + 1):
            s[_index(n, m, 1)] = -1.0
    return s


def _pair_weight(p: int) -> np.ndarray:
    """w with sum_{n,m=-n..n} A_n^m conj(B_n^m) = sum_i w_i a_i b_i for
    coefficient sets with the real-expansion symmetry (1 on m = 0, 2 else)."""
    w = 2.0 * np.ones(p * p)
    for n in range(p):
        w[n * n] = 1.0
    return w


# ---------------------------------------------------------------- operators
#
# Every translation has the form out_n^m = sum_{k,l} c(n, k) in_k^l g(h),
# with g = H_a^b or conj(H_a^b) for a harmonic table H of the shift vector,
# a and b linear in (n, m, k, l). Folding in_k^{-l} = (-1)^l conj(in_k^l)
# and H^{-b} = (-1)^b conj(H^b) turns it into a real p^2 x p^2 matrix whose
# every entry is c1 * h[i1] + c2 * h[i2], h being H in the real layout with a
# trailing zero. The (i, c) tables depend on p alone and are built once.


def _flat_index(n, m, part):
    """`_index` over arrays."""
    return n * n + np.where(m == 0, 0, 2 * m - 1 + part)


def _h_part(a, b, want_im, conj, size: int):
    """(index into real-layout H, sign) giving Re/Im of (conj?) H_a^b, over
    integer arrays a, b and boolean arrays want_im, conj (index `size`,
    sign 0 where the harmonic is zero)."""
    neg = b < 0                                   # H^{-b} = (-1)^b conj(H^b)
    sign = np.where(neg & (b % 2 == 1), -1.0, 1.0)
    conj = conj ^ neg
    b = np.abs(b)
    index = _flat_index(a, b, want_im.astype(np.int64))
    sign = np.where(want_im & conj, -sign, sign)
    zero = (a < 0) | (b > a) | (want_im & (b == 0))
    return np.where(zero, size, index), np.where(zero, 0.0, sign)


@functools.lru_cache(maxsize=None)
def _translation_tables(p: int, kind: str):
    """Static gather tables idx (2, p^2, p^2) int32 and coef (2, p^2, p^2):
    entry (r, c) of the matrix is sum_t coef[t, r, c] * h[idx[t, r, c]].

    kind: 'm2m' | 'l2l' | 'shift' (L2L without the change of box size) |
    'm2l'. The source table H has orders < p for m2m/l2l/shift (regular)
    and < 2p - 1 for m2l (irregular).
    """
    q = 2 * p - 1 if kind == "m2l" else p
    size, P = q * q, p * p
    # Every (n, m, k, l) with 0 <= m <= n < p, 0 <= l <= k < p.
    deg = np.arange(p)
    nm = np.array([(n, m) for n in deg for m in range(n + 1)])
    out, inp = np.repeat(nm, len(nm), axis=0), np.tile(nm, (len(nm), 1))
    n, m, k, l = out[:, 0], out[:, 1], inp[:, 0], inp[:, 1]

    def g(sign_l):
        """(c, a, b, conj) of the complex coefficient of in_k^(sign_l l) in out_n^m."""
        ll = sign_l * l
        if kind == "m2m":
            return 2.0 ** -k, n - k, m - ll, True
        if kind == "l2l":
            return 2.0 ** -(n + 1.0), k - n, ll - m, True
        if kind == "shift":
            return np.ones(len(n)), k - n, ll - m, True
        return (-1.0) ** n, k + n, ll + m, False  # m2l: out index (n, m) <- in (k, l)

    gp, gm = g(1), g(-1)
    sl = np.where(l % 2 == 1, -1.0, 1.0)
    a_col, b_col = _flat_index(k, l, 0), _flat_index(k, l, 1)
    parts = []                          # (want_im, row, col, term, scale) per case

    def add(mask, want_im, row, col, term, scale):
        c, a, b, conj = term
        parts.append((mask, np.broadcast_to(want_im, n.shape), row, col,
                       np.broadcast_to(c, n.shape), a, b, conj,
                       np.broadcast_to(scale, n.shape)))

    zero_l = l == 0
    for out_im in (False, True):
        row = _flat_index(n, m, int(out_im))
        rows = np.ones_like(zero_l) if not out_im else m > 0
        # l = 0: Re/Im out += g a
        add(rows & zero_l, out_im, row, a_col, gp, 1.0)
        if not out_im:   # Re: a (gr + g'r) + b (-gi + g'i), g' = (-1)^l g(m, -l)
            terms = ((False, a_col, gp, 1.0), (False, a_col, gm, sl),
                     (True, b_col, gp, -1.0), (True, b_col, gm, sl))
        else:            # Im: a (gi + g'i) + b (gr - g'r)
            terms = ((True, a_col, gp, 1.0), (True, a_col, gm, sl),
                     (False, b_col, gp, 1.0), (False, b_col, gm, -sl))
        for want_im, col, term, scale in terms:
            add(rows & ~zero_l, want_im, row, col, term, scale)

    rows_, cols_, vals_, hidx_ = [], [], [], []
    for mask, want_im, row, col, c, a, b, conj, scale in parts:
        i, s_ = _h_part(a[mask], b[mask], want_im[mask], np.full(mask.sum(), conj), size)
        v = c[mask] * s_ * scale[mask]
        nz = v != 0.0
        rows_.append(row[mask][nz]), cols_.append(col[mask][nz])
        vals_.append(v[nz]), hidx_.append(i[nz])
    row, col = np.concatenate(rows_), np.concatenate(cols_)
    val, hid = np.concatenate(vals_), np.concatenate(hidx_)
    flat = row * P + col
    order = np.argsort(flat, kind="stable")
    flat, val, hid = flat[order], val[order], hid[order]
    first = np.r_[True, flat[1:] != flat[:-1]]
    slot = np.where(first, 0, 1)             # at most two terms land on one entry
    assert np.all(first | np.r_[True, first[:-1]]), "three terms on one matrix entry"
    idx = np.full((2, P * P), size, np.int32)
    coef = np.zeros((2, P * P))
    idx[slot, flat] = hid
    coef[slot, flat] = val
    return idx.reshape(2, P, P), coef.reshape(2, P, P)


def _apply_tables(h, p: int, kind: str):
    """Real translation matrices from harmonic tables.

    h: (..., q^2) real-layout harmonics of the shift vectors.
    Returns (..., p^2, p^2) matrices acting on coefficient vectors (out = A @ in).
    """
    idx, coef = _translation_tables(p, kind)
    hz = jnp.concatenate([h, jnp.zeros(h.shape[:-1] + (1,), h.dtype)], axis=-1)
    # The barrier keeps XLA from constant-folding the (large) matrices at
    # compile time: building them at run time is a cheap gather.
    hz, c = jax.lax.optimization_barrier((hz, jnp.asarray(coef, h.dtype)))
    return hz[..., idx[0]] * c[0] + hz[..., idx[1]] * c[1]


@functools.partial(jax.tree_util.register_dataclass, data_fields=["h"], meta_fields=["p"])
@dataclasses.dataclass(frozen=True)
class M2LFromHarmonics:
    """M2L matrices built where they are indexed, from the irregular
    harmonics of the offsets h (n_off + 1, (2p - 1)^2) (the last row zero):
    `self[i]` is the stored matrices' `m2l[i]` (in float64 the same
    products, so the same values) without holding n_off P^2 values
    (p = 36, float64: 4.3 GB)."""
    h: jax.Array
    p: int

    def __getitem__(self, index):
        return _apply_tables(self.h[index], self.p, "m2l")


# Above this many bytes (per backend) the M2L matrices are built per use
# (M2LFromHarmonics) in M2L's loop over neighbour positions, which gathers
# each position's matrices anyway (`translate.m2l`). p = 36, float64, at
# N = 2^20: the CPU ran faster so, the H100's downward pass 25% slower
# (136 against 111 ms), so the GPU keeps them up to 8 GiB.
STORED_M2L_BYTES = {"cpu": 2 ** 29, "gpu": 2 ** 33}


class Operators(NamedTuple):
    """Translation operators for one order p (level independent).

    m2m: (2^d, P, P)    child multipole -> parent multipole, per child slot
    l2l: (2^d, P, P)    parent local -> child local, per child slot
    m2l: (n_off + 1, P, P) source multipole -> target local, per M2L offset
                        (offsets in target-box sides); the last one is zero.
                        Above STORED_M2L_BYTES an M2LFromHarmonics, indexed
                        alike.
    """
    m2m: jax.Array
    l2l: jax.Array
    m2l: jax.Array | M2LFromHarmonics


def operators(p: int, m2l_offsets: np.ndarray, dtype) -> Operators:
    """Build the translation operators for order p.

    m2l_offsets: (n_off, 3) integer offsets (source centre minus target
    centre, in box sides). The M2L shift vector is t = target - source.
    Built in float64 where available, then cast, so float32 operators are
    correctly rounded; in one compiled program (built op by op, they took
    some 70 small compilations).
    """
    dtype = jnp.dtype(dtype)
    unstored = not translate.stores_m2l(STORED_M2L_BYTES, len(m2l_offsets) + 1, p * p, dtype)
    return _operators(p, jnp.asarray(m2l_offsets), dtype, unstored)


@_xla.once(static_argnums=(0, 2, 3))
def _operators(p: int, m2l_offsets, dtype, unstored: bool) -> Operators:
    work = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
    d = jnp.asarray((lists.child_bits(DIM) - 0.5) / 2.0, work)  # child centre - parent centre, in parent sides
    m2m = _apply_tables(regular(d, p), p, "m2m")
    l2l = _apply_tables(regular(d, p), p, "l2l")
    t = -jnp.asarray(m2l_offsets, work)
    h = irregular(t, 2 * p - 1)
    h = jnp.concatenate([h, jnp.zeros((1, h.shape[1]), work)])        # the zero operator
    if unstored:
        m2l = M2LFromHarmonics(h.astype(dtype), p)
    else:
        m2l = _apply_tables(h, p, "m2l").astype(dtype)
    return Operators(m2m.astype(dtype), l2l.astype(dtype), m2l)


def m2l_basis(ops: Operators):
    """None: M2L acts on the expansions themselves (see jfmm.ops)."""
    return None


def m2l_matrices(ops: Operators, kernel, side, p: int):
    """M2L matrices at a level: scaled expansions make them level (and so
    side) independent; kernel is Laplace3D."""
    return ops.m2l


def p2m(u, q, p: int):
    """Multipole coefficients of point charges.

    u: (n, 3) box-local scaled positions (x - centre) / h; q: (n, K).
    Returns (n, K, p^2) per-point contributions (sum them per box).
    """
    y = regular(u, p) * jnp.asarray(_conj_sign(p), u.dtype)
    return q[:, :, None] * y[:, None, :]


@functools.lru_cache(maxsize=None)
def _derivative_tables(p: int):
    """Sparse maps from local coefficients to those of d phi / d u_a.

    Shifting a local expansion's centre by t gives coefficients
    S(t) L with S linear in the harmonics Y(t) (kind 'shift'); d/dt at t = 0
    keeps only the degree-1 harmonics, which are linear: Y_1^0 = z,
    Y_1^1 = (y - i x) / 2. So D_a = S built from Y_1(e_a), exactly, and
    d phi / d u_a = sum (D_a L) conj(Y(u)). Each row of D_a has a few
    non-zeros; returns idx (3, P, nnz) int32 and coef (3, P, nnz) float64.
    """
    P = p * p
    tidx, tcoef = _translation_tables(p, "shift")
    dense = []
    for a in range(3):
        h = np.zeros(P + 1)
        if p > 1:
            h[1] = 1.0 if a == 2 else 0.0          # Y_1^0 = z
            h[2] = 0.5 if a == 1 else 0.0          # Re Y_1^1 = y / 2
            h[3] = -0.5 if a == 0 else 0.0         # Im Y_1^1 = -x / 2
        dense.append(h[tidx[0]] * tcoef[0] + h[tidx[1]] * tcoef[1])
    dense = np.stack(dense)                        # (3, P, P)
    nnz = max(1, int((dense != 0).sum(axis=2).max()))
    idx = np.zeros((3, P, nnz), np.int32)
    coef = np.zeros((3, P, nnz))
    for a in range(3):
        for r in range(P):
            cols = np.flatnonzero(dense[a, r])
            idx[a, r, :len(cols)] = cols
            coef[a, r, :len(cols)] = dense[a, r, cols]
    return idx, coef


def l2p_coefficients(loc, p: int, gradient: bool):
    """Per-box coefficient sets that L2P evaluates: (B, K, 1 or 4, P).

    loc: (B, K, P) local expansions. With gradient, the sets of the three
    derivatives follow the potential's (see `_derivative_tables`).
    """
    if not gradient:
        return loc[:, :, None, :]
    idx, coef = _derivative_tables(p)
    d = jnp.sum(loc[:, :, idx] * jnp.asarray(coef, loc.dtype), axis=-1)  # (B, K, 3, P)
    return jnp.concatenate([loc[:, :, None, :], d], axis=2)


def l2p(u, coef, h, p: int, gradient: bool):
    """Evaluate local expansions at targets.

    u: (n, 3) scaled target positions (y - centre) / h; coef: (n, K, E, P)
    from `l2p_coefficients` (E = 4 with gradient, else 1); h: scalar box
    side. Returns phi (n, K) and, if gradient, grad (n, K, 3) = d phi / d y.
    """
    wy = regular(u, p) * jnp.asarray(_pair_weight(p), u.dtype)
    out = jnp.einsum("nkep,np->nke", coef, wy, precision=jax.lax.Precision.HIGHEST)
    h = jnp.reshape(h, jnp.shape(h) + (1,))                   # a scalar, or one per target
    phi = out[:, :, 0] / h
    if not gradient:
        return phi, None
    return phi, out[:, :, 1:] / (h * h)[..., None]


def _degree_sign(p: int) -> np.ndarray:
    """(-1)^n on every coefficient of degree n."""
    return np.concatenate([np.full(2 * n + 1, (-1.0) ** n) for n in range(p)])


@functools.lru_cache(maxsize=None)
def _irregular_derivative_tables(p: int):
    """Gather tables for the derivatives of the irregular harmonics of
    degree < p from those of degree <= p (real layout): d/du_a T_i =
    sum_k coef[a, i, k] T'[idx[a, i, k]], T' with a trailing zero. From
    d/dz T_n^m = -T_{n+1}^m and (d/dx +- i d/dy) T_n^m = -i T_{n+1}^{m+-1}
    (checked against jax.jacfwd in tests/ops/test_laplace3d.py), with
    T^{-1} = -conj(T^1)."""
    zero = (p + 1) ** 2
    idx = np.full((3, p * p, 2), zero, np.int32)
    coef = np.zeros((3, p * p, 2))

    def part(n, m, im):
        """(index, sign) of Re (im 0) or Im (im 1) of T_n^m, any m."""
        if m < 0:                                  # T^-m = (-1)^m conj(T^m)
            sign = (-1.0) ** m * (-1.0 if im else 1.0)
            return (zero, 0.0) if (im and m == 0) else (_index(n, -m, im), sign)
        return (zero, 0.0) if (im and m == 0) else (_index(n, m, im), 1.0)

    for n in range(p):
        for m in range(n + 1):
            for im in (0, 1) if m else (0,):
                i = _index(n, m, im)
                a_re, a_im = part(n + 1, m + 1, 0), part(n + 1, m + 1, 1)
                b_re, b_im = part(n + 1, m - 1, 0), part(n + 1, m - 1, 1)
                # x: -i/2 (A + B): Re = (A_im + B_im) / 2, Im = -(A_re + B_re) / 2
                # y: -(A - B) / 2: Re = -(A_re - B_re) / 2, Im = -(A_im - B_im) / 2
                terms = {0: ((a_im, 0.5), (b_im, 0.5)) if not im else ((a_re, -0.5), (b_re, -0.5)),
                         1: ((a_re, -0.5), (b_re, 0.5)) if not im else ((a_im, -0.5), (b_im, 0.5))}
                for axis, pair in terms.items():
                    for k, ((j, sign), c) in enumerate(pair):
                        idx[axis, i, k], coef[axis, i, k] = j, sign * c
                idx[2, i, 0], coef[2, i, 0] = _index(n + 1, m, im), -1.0
    return idx, coef


def m2p_basis(kernel, u, h, p: int, gradient: bool = False):
    """b (n, p^2) with phi(y) = sum_i b_i M_i for the multipole M of a box
    of side h (n,) and u = (y - centre) / h outside it (M2P: the sum of
    `m2p` as a product), and with gradient its derivatives in y (n, p^2, 3)
    (else None)."""
    w = jnp.asarray(_pair_weight(p) * _conj_sign(p), u.dtype)
    t = irregular(u, p + 1 if gradient else p)
    b = t[:, :p * p] * w / h[:, None]
    if not gradient:
        return b, None
    idx, coef = _irregular_derivative_tables(p)
    tz = jnp.concatenate([t, jnp.zeros((t.shape[0], 1), t.dtype)], axis=1)
    g = jnp.sum(tz[:, idx] * jnp.asarray(coef, t.dtype), axis=-1)        # (n, 3, P)
    return b, jnp.swapaxes(g, 1, 2) * (w / (h * h)[:, None])[:, :, None]


def m2p_coefficients(mult, p: int, gradient: bool):
    """Per-box coefficient sets (B, K, E, Q) that M2P evaluates against the
    irregular harmonics of degree < p + gradient (Q of them): phi =
    sum_j c[0, j] T_j(u) / h and, with gradient (E = 4), d phi / d y_a =
    sum_j c[1 + a, j] T_j(u) / h^2 (the derivative tables of `m2p_basis`
    applied to the multipoles instead of the harmonics: each derivative
    coefficient gathers at most three multipole coefficients)."""
    w = jnp.asarray(_pair_weight(p) * _conj_sign(p), mult.dtype)
    m = mult * w
    if not gradient:
        return m[:, :, None, :]
    q = (p + 1) ** 2
    idx, coef = _m2p_derivative_gathers(p)
    mz = jnp.pad(m, ((0, 0), (0, 0), (0, 1)))                   # index p^2: zero
    d = jnp.sum(mz[:, :, idx] * jnp.asarray(coef, m.dtype), axis=-1)    # (B, K, 3, Q)
    m = jnp.pad(m, ((0, 0), (0, 0), (0, q - p * p)))
    return jnp.concatenate([m[:, :, None, :], d], axis=2)


@functools.lru_cache(maxsize=None)
def _m2p_derivative_gathers(p: int):
    """`_irregular_derivative_tables` read the other way: the multipole
    coefficients (3, Q, nnz) each derivative coefficient j gathers (p^2
    where none) and their weights, Q = (p + 1)^2."""
    fwd_idx, fwd_coef = _irregular_derivative_tables(p)
    q = (p + 1) ** 2
    terms = [[[] for _ in range(q)] for _ in range(3)]
    for a in range(3):
        for i in range(p * p):
            for j, c in zip(fwd_idx[a, i], fwd_coef[a, i]):
                if c != 0.0 and j < q:
                    terms[a][j].append((i, c))
    nnz = max(1, max(len(t) for ta in terms for t in ta))
    idx = np.full((3, q, nnz), p * p, np.int32)
    coef = np.zeros((3, q, nnz))
    for a in range(3):
        for j, t in enumerate(terms[a]):
            for k, (i, c) in enumerate(t):
                idx[a, j, k], coef[a, j, k] = i, c
    return idx, coef


def p2l_basis(kernel, v, h, p: int):
    """b (n, p^2): a unit charge at v = (x - centre) / h outside a box of
    side h (n,) adds b to the box's local expansion (P2L: M2L of the
    charge's own multipole, degree 0 alone, by t = -v)."""
    return irregular(-v, p) * jnp.asarray(_degree_sign(p), v.dtype)


def m2p(u, mult, h, p: int):
    """Evaluate multipole expansions at far points (used in checks).

    u: (n, 3) scaled positions (y - centre) / h, |u| > box radius;
    mult: (n, K, p^2). Returns phi (n, K).
    """
    w = jnp.asarray(_pair_weight(p) * _conj_sign(p), u.dtype)
    # sum_{n,m} M T = sum w_i * M_i * conj-signed T_i, T/h scaled by h^-(n+1) / h^-n
    return jnp.einsum("nkp,np->nk", mult * w, irregular(u, p),
                      precision=jax.lax.Precision.HIGHEST) / h
