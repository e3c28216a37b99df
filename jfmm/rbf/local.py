"""Local RBF interpolation (scipy's `neighbors=k`): each evaluation point
gets the interpolant of its k nearest data points alone.

For an evaluation point x with neighbours y_1..y_k (values d, smoothing s),
the local interpolant solves [[K + S, P], [P^T, 0]] [c; a] = [d; 0] with the
monomials P of the neighbours' coordinates mapped onto [-1, 1]^dim (scipy's
shift and scale, per neighbourhood), and gives sum_i c_i K(|x - y_i|) +
P(x) a. Every point's system is solved on the device, batched; the
neighbours come from a k-d tree for concrete points and from a brute-force
top-k (O(N M), jit-able) for traced ones.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jfmm._compat import Tracer
from jfmm.rbf import polynomial

# Evaluation points whose local systems are solved at once: at most BATCH,
# and at most SYSTEM_ENTRIES numbers in their matrices (traced neighbour
# searches hold BATCH x N distances).
BATCH = 2048
SYSTEM_ENTRIES = 2 ** 24


def nearest(y, x, k: int, tree):
    """Indices (M, k) int32 of the k nearest points of y (N, dim) to each
    point of x (M, dim), nearest first. tree: scipy's cKDTree of y (None
    where y is traced)."""
    if tree is not None and not isinstance(x, Tracer):
        _, idx = tree.query(np.asarray(x), k=k, workers=-1)
        return jax.device_put(np.asarray(idx).reshape(len(x), k).astype(np.int32))

    def block(xb):
        r2 = jnp.sum((xb[:, None, :] - y[None, :, :]) ** 2, axis=-1)
        return jax.lax.top_k(-r2, k)[1].astype(jnp.int32)

    return _batched(block, BATCH, x)


def _batched(f, batch: int, x, *rest):
    """f over rows of x (and of the arrays in rest) in blocks of `batch`."""
    m = x.shape[0]
    if m <= batch:
        return f(x, *rest)
    pad = (-m) % batch
    args = [jnp.concatenate([a, jnp.broadcast_to(a[:1], (pad,) + a.shape[1:])])
            .reshape((-1, batch) + a.shape[1:]) for a in (x, *rest)]
    out = jax.lax.map(lambda blk: f(*blk), tuple(args))
    return jax.tree_util.tree_map(lambda o: o.reshape((-1,) + o.shape[2:])[:m], out)


def _one(x, yn, dn, sn, kernel, powers):
    """The local interpolant of neighbours yn (k, dim) with values dn (k, S)
    and smoothing sn (k,) at x (dim,): (S,), and whether the system solved
    (its solution finite)."""
    k, r = yn.shape[0], powers.shape[0]
    lo, hi = jnp.min(yn, axis=0), jnp.max(yn, axis=0)
    shift, scale = (hi + lo) / 2, (hi - lo) / 2
    scale = jnp.where(scale == 0, 1.0, scale)
    r2 = jnp.sum((yn[:, None, :] - yn[None, :, :]) ** 2, axis=-1)
    lhs = kernel.pair(r2, False)[0] + jnp.diag(sn)
    p = polynomial.monomials((yn - shift) / scale, powers)
    lhs = jnp.block([[lhs, p], [p.T, jnp.zeros((r, r), yn.dtype)]])
    rhs = jnp.concatenate([dn, jnp.zeros((r, dn.shape[1]), dn.dtype)])
    sol = jnp.linalg.solve(lhs, rhs)
    kx = kernel.pair(jnp.sum((x - yn) ** 2, axis=-1), False)[0]
    px = polynomial.monomials(((x - shift) / scale)[None], powers)[0]
    out = kx @ sol[:k] + px @ sol[k:]
    return out, jnp.all(jnp.isfinite(sol))


def evaluate(x, y, values, smoothing, kernel, powers: np.ndarray, idx):
    """Local interpolants at x (M, dim) from the neighbours idx (M, k) of
    the data points y (N, dim) with values (N, S) and smoothing (N,).
    Returns (M, S) and a bool (M,): whether each local system solved."""
    def block(xb, ib):
        return jax.vmap(lambda xi, ii: _one(xi, y[ii], values[ii], smoothing[ii], kernel,
                                            powers))(xb, ib)
    size = idx.shape[1] + powers.shape[0]
    batch = max(1, min(BATCH, SYSTEM_ENTRIES // size ** 2))
    if jax.default_backend() == "cpu":
        # jaxlib's batched LU waits on the intra-op thread pool it shares
        # with XLA: concurrent calls (threads) deadlock it (as
        # schwarz.local_inverses).
        batch = 1
    return _batched(block, batch, x, idx)
