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

    def cycle(state):
        x, steps, *_ = state
        r = b - matvec(x)
        beta = jnp.linalg.norm(r)
        V = jnp.zeros((restart + 1, n), dtype).at[0].set(r / jnp.maximum(beta, tiny))
        Z = jnp.zeros((restart, n), dtype)
        H = jnp.zeros((restart + 1, restart), dtype)
        cs = jnp.zeros((restart,), dtype)
        sn = jnp.zeros((restart,), dtype)
        g = jnp.zeros((restart + 1,), dtype).at[0].set(beta)

        def arnoldi(inner):
            j, V, Z, H, cs, sn, g = inner
            z = precondition(V[j])
            w = matvec(z)
            live = (jnp.arange(restart + 1) <= j).astype(dtype)
            h = (V @ w) * live
            w = w - h @ V
            h2 = (V @ w) * live
            w = w - h2 @ V
            h = h + h2
            hn = jnp.linalg.norm(w)
            V = V.at[j + 1].set(w / jnp.maximum(hn, tiny))
            Z = Z.at[j].set(z)
            h = h.at[j + 1].set(hn)

            def rotate(i, h):
                a, c = h[i], h[i + 1]
                return h.at[i].set(cs[i] * a + sn[i] * c).at[i + 1].set(-sn[i] * a + cs[i] * c)
            h = jax.lax.fori_loop(0, j, rotate, h)
            denom = jnp.maximum(jnp.hypot(h[j], h[j + 1]), tiny)
            c, s = h[j] / denom, h[j + 1] / denom
            cs, sn = cs.at[j].set(c), sn.at[j].set(s)
            h = h.at[j].set(c * h[j] + s * h[j + 1]).at[j + 1].set(0.0)
            g = g.at[j + 1].set(-s * g[j]).at[j].set(c * g[j])
            return j + 1, V, Z, H.at[:, j].set(h), cs, sn, g

        def more(inner):
            j, *_, g = inner
            return (j < restart) & (steps + j < maxiter) & (jnp.abs(g[j]) > target)

        j, V, Z, H, cs, sn, g = jax.lax.while_loop(more, arnoldi, (0, V, Z, H, cs, sn, g))
        used = jnp.arange(restart) < j
        R = jnp.where(used[:, None] & used[None, :], H[:restart], jnp.eye(restart, dtype=dtype))
        y = jax.scipy.linalg.solve_triangular(R, jnp.where(used, g[:restart], 0.0), lower=False)
        return x + y @ Z, steps + j, beta, jnp.abs(g[j]), j

    def again(state):
        _, steps, beta, _, _ = state
        return (steps < maxiter) & (beta > target)

    # A cycle runs while the true residual at its start is above target, so
    # a Givens estimate that reached it ends the solve only once confirmed.
    inf = jnp.asarray(jnp.inf, dtype)
    x, steps, beta, estimate, last = jax.lax.while_loop(
        again, cycle, (jnp.zeros_like(b), 0, inf, inf, 0))
    if recompute:           # x moved after beta was taken unless the last cycle took no step
        residual = jax.lax.cond(last == 0, lambda: beta,
                                lambda: jnp.linalg.norm(b - matvec(x)))
    else:
        residual = estimate
    return x, Convergence(steps, residual / jnp.maximum(bnorm, tiny))


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
