"""Nystrom preconditioner for flat positive definite kernels with smoothing.

A flat kernel (a width of many point spacings) has few large eigenvalues
and a long tail of tiny ones: with smoothing S the system A + S is
ill-conditioned only through the few. A low-rank approximation A ~ F F^T
from randomly pivoted Cholesky (Chen, Epperly, Tropp and Webber, CPAM 2024:
pivots drawn in proportion to the residual diagonal, here in blocks) gives
the preconditioner P = F F^T + S, inverted exactly by the Woodbury
identity (the Nystrom PCG of Frangella, Tropp and Udell, SIMAX 2023, with a
diagonal shift). With E = A - F F^T >= 0, P^-1/2 (A + S) P^-1/2 =
I + P^-1/2 E P^-1/2 and P >= S, so its condition number is at most
1 + tr(S^-1/2 E S^-1/2): the rank is grown until that trace, which the
factorisation tracks for free, falls below `TARGET`.

The cost is the factor: n x rank numbers (one such array, rotated in place
into the preconditioner) and about n rank^2 flops; the rank grows with the
number of the kernel matrix's eigenvalues above the smoothing, slowly with
n. Kernels that are local against the point spacing need a rank near n and
are left to the Schwarz preconditioner (`jfmm.rbf.schwarz`).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

# Stop growing the rank where tr(S^-1/2 E S^-1/2) is below this: about 40
# FGMRES steps to a relative residual of 1e-8 (dense trials, 4,000-8,000 points).
TARGET = 1e4
# Where no rank within the limit reaches TARGET, the limit itself may serve
# if its trace is below this: the trace bounds the condition number loosely
# (inverse multiquadric, 10^5 points: 8 steps at a trace above TARGET).
LOOSE = 1e6
BLOCK = 128             # pivots drawn at once
FIRST = 256             # the first rank tried; each try doubles it
ROW_BLOCKS = 16         # row blocks of the factor's Gram matrix and rotation


class Nystrom(NamedTuple):
    """P^-1 for P = F F^T + diag(s), F (n, r), by Woodbury: with
    F^T S^-1 F = W diag(lam) W^T and H = F W,
    P^-1 = S^-1 - S^-1 H diag(1 / (1 + lam)) H^T S^-1.
    H (n, r), coef (r,) = 1 / (1 + lam), inv (n,) = 1 / s."""
    H: jax.Array
    coef: jax.Array
    inv: jax.Array

    def __call__(self, r):
        """P^-1 r, r (n,)."""
        u = self.inv * r
        return u - self.inv * (self.H @ (self.coef * (self.H.T @ u)))


def _columns(kernel, points, pivots):
    """K(|x_i - x_p|) for all i and the pivots p: (n, b). The squared distance
    from the dot product (n x b memory); exactly 0 on the diagonal."""
    x2 = jnp.sum(points * points, axis=1)
    r2 = x2[:, None] + x2[pivots][None, :] - 2 * points @ points[pivots].T
    r2 = jnp.where(jnp.arange(points.shape[0])[:, None] == pivots[None, :], 0.0,
                   jnp.maximum(r2, 0.0))
    return kernel.pair(r2, False)[0]


@functools.partial(jax.jit, static_argnames=("rank",))
def factor(kernel, points, weights, rank: int, key):
    """Randomly pivoted Cholesky in blocks of `BLOCK`: F (n, rank) with
    K ~ F F^T, and after each block the weighted trace of the residual,
    sum_i w_i (K - F F^T)_ii, (rank / BLOCK,). rank a multiple of BLOCK.
    Pivots are drawn without replacement within a block (Gumbel top-k on
    the residual diagonal); a block's columns are orthogonalised by its
    pivot matrix's eigendecomposition, dropping directions at rounding."""
    n, dtype = points.shape[0], points.dtype
    blocks = rank // BLOCK
    tiny = jnp.finfo(dtype).eps * BLOCK
    zero = jnp.zeros((1,), dtype)
    diag0 = jnp.full((n,), kernel.pair(zero, False)[0][0], dtype)

    def step(i, state):
        F, diag, traces = state
        gumbel = -jnp.log(-jnp.log(jax.random.uniform(jax.random.fold_in(key, i), (n,), dtype,
                                                       minval=jnp.finfo(dtype).tiny)))
        logd = jnp.where(diag > 0, jnp.log(jnp.where(diag > 0, diag, 1.0)), -jnp.inf)
        pivots = jax.lax.top_k(logd + gumbel, BLOCK)[1]
        G = _columns(kernel, points, pivots) - F @ F[pivots].T
        C = G[pivots]
        w, V = jnp.linalg.eigh((C + C.T) / 2)
        keep = w > tiny * jnp.maximum(w[-1], 0.0)
        new = G @ (V * jnp.where(keep, jax.lax.rsqrt(jnp.where(keep, w, 1.0)), 0.0))
        F = jax.lax.dynamic_update_slice(F, new, (0, i * BLOCK))
        diag = jnp.maximum(diag - jnp.sum(new * new, axis=1), 0.0)
        return F, diag, traces.at[i].set(jnp.sum(weights * diag))

    F = jnp.zeros((n, rank), dtype)
    traces = jnp.zeros((blocks,), dtype)
    F, _, traces = jax.lax.fori_loop(0, blocks, step, (F, diag0, traces))
    return F, traces


def build(F, smoothing) -> Nystrom:
    """The preconditioner of F (n, r) and smoothing (n,) > 0 (not
    differentiated). The Gram matrix's eigendecomposition (r x r) in place
    of an SVD of S^-1/2 F: 5-8x faster on an H100 at r = 2048-4480, and
    where rounding blurs its small eigenvalues (below eps lam_max) the
    factor 1 / (1 + lam) is 1 to that accuracy in float64. Gram matrix and
    H = F W go through row blocks, H written over F's buffer, so that the
    factor is the one n x r array held (where the caller lets F go)."""
    F, smoothing = jax.lax.stop_gradient((F, smoothing))
    inv = 1 / smoothing
    n, r = F.shape
    rows = max(n // ROW_BLOCKS, 1)
    full = n // rows * rows                 # the rows beyond go in one static block

    def gram(i, acc):
        f = jax.lax.dynamic_slice_in_dim(F, i * rows, rows)
        return acc + f.T @ (f * jax.lax.dynamic_slice_in_dim(inv, i * rows, rows)[:, None])

    acc = jax.lax.fori_loop(0, n // rows, gram, jnp.zeros((r, r), F.dtype))
    acc = acc + F[full:].T @ (F[full:] * inv[full:, None])
    lam, W = jnp.linalg.eigh(acc)

    def rotate(i, H):
        f = jax.lax.dynamic_slice_in_dim(H, i * rows, rows)
        return jax.lax.dynamic_update_slice_in_dim(H, f @ W, i * rows, 0)

    H = jax.lax.fori_loop(0, n // rows, rotate, F)
    H = H.at[full:].set(H[full:] @ W)
    return Nystrom(H, 1 / (1 + jnp.maximum(lam, 0.0)), inv)


class Choice(NamedTuple):
    """What `choose_rank` found: the rank (0: none within the limit), the
    weighted residual trace there, and the kernel matrix's largest
    eigenvalue (that of the first block's factor, a close lower bound)."""
    rank: int
    trace: float
    largest: float


def choose_rank(kernel, points, smoothing, max_rank: int, key) -> Choice:
    """The rank (a multiple of BLOCK, at most max_rank) at which
    tr(S^-1/2 E S^-1/2) first falls below TARGET, trying FIRST, 2 FIRST, ...
    (a try's prefix is the factor of every smaller rank); else max_rank
    where the trace there is below LOOSE; else 0. Stops early where the
    decay over the last doubling, extrapolated, would leave the trace at
    max_rank above LOOSE (host; concrete inputs)."""
    weights = 1.0 / smoothing
    rank = min(FIRST, max_rank)
    if rank < BLOCK:
        return Choice(0, float("inf"), float("nan"))
    largest = None
    while True:
        F = None                            # the last try's factor goes first
        F, traces = factor(kernel, points, weights, rank, key)
        traces = np.asarray(traces)
        if largest is None:                 # every try shares the first block
            largest = _largest(F[:, :BLOCK])
        hit = np.nonzero(traces <= TARGET)[0]
        if hit.size:
            return Choice(int(hit[0] + 1) * BLOCK, float(traces[hit[0]]), largest)
        if rank >= max_rank:
            if traces[-1] <= LOOSE:
                return Choice(rank, float(traces[-1]), largest)
            break
        # The traces fall about geometrically in the rank: extrapolate the
        # last doubling's rate per block.
        half = traces[len(traces) // 2 - 1] if len(traces) >= 2 else np.inf
        rate = (traces[-1] / half) ** (1 / max(len(traces) - len(traces) // 2, 1))
        if not 0 < rate < 1 or traces[-1] * rate ** ((max_rank - rank) / BLOCK) > LOOSE:
            break
        rank = min(2 * rank, max_rank)
    return Choice(0, float(traces[-1]), largest)


def _largest(first) -> float:
    """The largest eigenvalue of F F^T for the first block's columns (n, BLOCK)."""
    return float(jnp.linalg.eigvalsh(first.T @ first)[-1])


def largest_eigenvalue(kernel, points, key) -> float:
    """The kernel matrix's largest eigenvalue, from one block of pivots (a
    close lower bound; host, concrete inputs)."""
    weights = jnp.ones((points.shape[0],), points.dtype)
    return _largest(factor(kernel, points, weights, BLOCK, key)[0])


def max_rank(n: int, itemsize: int, budget: int | None = None) -> int:
    """The largest rank (a multiple of BLOCK, at most n / 2) whose n x rank
    factor fits in `budget` bytes: by default 40% of the device's memory
    where jax reports it (a refit holds the old factor beside the new one),
    else 1.5 GiB."""
    if budget is None:
        budget = 3 << 29
        try:
            limit = jax.devices()[0].memory_stats().get("bytes_limit")
            budget = limit * 2 // 5 if limit else budget
        except Exception:       # backends without memory_stats
            pass
    rank = min(budget // (n * itemsize), n // 2)
    return int(rank // BLOCK * BLOCK)
