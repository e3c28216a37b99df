"""Restarted flexible GMRES and a linear solve that differentiates implicitly.

FGMRES (Saad 1993) is GMRES with right preconditioning in which the
preconditioner may change from step to step: here it contains inner Krylov
solves on coarser levels, so it is not one fixed linear map. Neither lineax
nor jax.scipy offers it (jax.scipy's gmres preconditions on the left and
reports no iteration count or residual), so it is written here, in
`lax.while_loop`s with static shapes (jit- and vmap-able).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp


class Convergence(NamedTuple):
    """What a solve did. iterations: preconditioned steps (matrix-vector
    products) taken; residual: the true relative residual ||b - A x|| / ||b||
    of the returned x, recomputed after the last step."""
    iterations: jax.Array
    residual: jax.Array


def fgmres(matvec: Callable, b, precondition: Callable, *, tol: float, restart: int,
           maxiter: int, recompute: bool = True):
    """Solve matvec(x) = b by restarted right-preconditioned flexible GMRES.

    b (n,); matvec, precondition: (n,) -> (n,). Stops when the relative
    residual reaches `tol` or after `maxiter` steps (tol=0: exactly maxiter
    steps, the inner solves of a multilevel preconditioner). Arnoldi by
    classical Gram-Schmidt done twice (as accurate as modified Gram-Schmidt,
    in matrix products); the least-squares problem by Givens rotations.
    A solve ends when the true residual, recomputed at a restart, is below
    tol, not when the Givens estimate first is (they drift apart when the
    preconditioner is ill-conditioned).
    Returns x (n,) and a `Convergence` (the true residual when `recompute`,
    else the Givens estimate).
    """
    n = b.shape[0]
    dtype = b.dtype
    tiny = jnp.finfo(dtype).tiny
    bnorm = jnp.linalg.norm(b)
    target = tol * bnorm
    zero = jnp.zeros((), jnp.int32)

    # One loop whose every step applies matvec once, so that it is traced
    # and compiled once (the FMM's passes dominate a solve's program): at
    # j = 0 a step takes the true residual b - A x, which ends the solve or
    # starts a cycle (the first cycle starts before the loop, from x = 0,
    # whose residual is b: no product); at j = k + 1 it is the cycle's
    # Arnoldi step k, on z = M v_k. A cycle ends at `restart` steps, at
    # maxiter, or where the Givens estimate reaches tol; the next step's
    # true residual confirms it.
    # Under vmap (several data columns) the conds become selects, and a
    # restart's step preconditions too, its result unused.
    def begin(state, z, w):
        x, steps, j, V, Z, H, cs, sn, g, estimate, done = state
        r = b - w
        beta = jnp.linalg.norm(r)
        done = (steps >= maxiter) | (beta <= target)
        V = jnp.zeros_like(V).at[0].set(r / jnp.maximum(beta, tiny))
        g = jnp.zeros_like(g).at[0].set(beta)
        return (x, steps, j + 1, V, jnp.zeros_like(Z), jnp.zeros_like(H), jnp.zeros_like(cs),
                jnp.zeros_like(sn), g, beta, done)

    def arnoldi(state, z, w):
        x, steps, j, V, Z, H, cs, sn, g, estimate, done = state
        k = j - 1
        live = (jnp.arange(restart + 1) <= k).astype(dtype)
        h = (V @ w) * live
        w = w - h @ V
        h2 = (V @ w) * live
        w = w - h2 @ V
        h = h + h2
        hn = jnp.linalg.norm(w)
        V = V.at[k + 1].set(w / jnp.maximum(hn, tiny))
        Z = Z.at[k].set(z)
        h = h.at[k + 1].set(hn)

        def rotate(i, h):
            a, c = h[i], h[i + 1]
            return h.at[i].set(cs[i] * a + sn[i] * c).at[i + 1].set(-sn[i] * a + cs[i] * c)
        h = jax.lax.fori_loop(0, k, rotate, h)
        denom = jnp.maximum(jnp.hypot(h[k], h[k + 1]), tiny)
        c, s = h[k] / denom, h[k + 1] / denom
        cs, sn = cs.at[k].set(c), sn.at[k].set(s)
        h = h.at[k].set(c * h[k] + s * h[k + 1]).at[k + 1].set(0.0)
        g = g.at[k + 1].set(-s * g[k]).at[k].set(c * g[k])
        H = H.at[:, k].set(h)
        estimate = jnp.abs(g[k + 1])
        end = (j == restart) | (steps + j >= maxiter) | (estimate <= target)

        def close(x, steps):
            used = jnp.arange(restart) < j
            R = jnp.where(used[:, None] & used[None, :], H[:restart],
                          jnp.eye(restart, dtype=dtype))
            y = jax.scipy.linalg.solve_triangular(R, jnp.where(used, g[:restart], 0.0),
                                                  lower=False)
            return x + y @ Z, steps + j

        x, steps = jax.lax.cond(end, close, lambda x, steps: (x, steps), x, steps)
        done = end & (steps >= maxiter) & (not recompute)
        return (x, steps, jnp.where(end, 0, j + 1), V, Z, H, cs, sn, g, estimate, done)

    def step(state):
        x, steps, j, V, *_ = state
        start = j == 0
        z = jax.lax.cond(start, lambda: x, lambda: precondition(V[jnp.maximum(j - 1, 0)]))
        w = matvec(z)
        return jax.lax.cond(start, begin, arnoldi, state, z, w)

    inf = jnp.asarray(jnp.inf, dtype)
    state = (jnp.zeros_like(b), zero, zero, jnp.zeros((restart + 1, n), dtype),
             jnp.zeros((restart, n), dtype), jnp.zeros((restart + 1, restart), dtype),
             jnp.zeros((restart,), dtype), jnp.zeros((restart,), dtype),
             jnp.zeros((restart + 1,), dtype), inf, jnp.zeros((), bool))
    state = begin(state, None, jnp.zeros_like(b))        # x = 0: its residual is b
    x, steps, *_, estimate, _ = jax.lax.while_loop(lambda s: ~s[-1], step, state)
    return x, Convergence(steps, estimate / jnp.maximum(bnorm, tiny))


def solve(matvec: Callable, b, precondition: Callable, *, tol: float, restart: int,
          maxiter: int, project: Callable = lambda v: v):
    """x with matvec(x) = b for a symmetric matvec, differentiable implicitly.

    b (n,). project: the orthogonal projector onto the subspace where
    matvec is invertible (matvec = project matvec project): right-hand
    sides are projected first, so that the transposed solve of reverse
    mode, whose cotangents need not lie in that subspace, solves the
    adjoint of the map b -> x. Derivatives with respect to b and to whatever matvec closes
    over (kernel parameters, smoothing) are further solves with the same
    preconditioner (`jax.lax.custom_linear_solve`), never unrolled
    iterations: memory O(n). The preconditioner's arrays are not
    differentiated. Returns x and a `Convergence`.
    """
    def run(mv, rhs):
        x, conv = fgmres(mv, project(rhs), precondition, tol=tol, restart=restart,
                         maxiter=maxiter)
        return project(x), conv

    return jax.lax.custom_linear_solve(matvec, b, run, symmetric=True, has_aux=True)
