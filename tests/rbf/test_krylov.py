"""FGMRES (jfmm.rbf.krylov) against numpy's dense solve, with a
preconditioner that changes from step to step."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jfmm.rbf import krylov


def system(rng, n=60):
    """A (n, n) with eigenvalues in the disc of radius about 1 around 3, b,
    and the inverse of a perturbation of A (a preconditioner)."""
    a = rng.normal(size=(n, n)) / np.sqrt(n) + 3 * np.eye(n)
    return a, rng.normal(size=n), np.linalg.inv(a + 0.3 * rng.normal(size=(n, n)) / np.sqrt(n))


@pytest.mark.parametrize("restart, maxiter, tol", [(30, 300, 1e-10), (3, 300, 1e-10),
                                                   (2, 100, 1e-8)])
def test_fgmres_solves_and_reports_its_residual(rng, restart, maxiter, tol):
    """Restarted or not, the solution meets tol against numpy's solve, and
    the reported residual is the true one of the returned x; matvec is
    traced once (one compiled copy of the FMM's passes in a solve)."""
    a, b, m = system(rng)
    traced = []

    def matvec(x):
        traced.append(1)
        return jnp.asarray(a) @ x

    # A preconditioner that varies: the inverse of a perturbed matrix,
    # scaled by the vector's norm (flexible GMRES allows it).
    def precondition(v):
        return jnp.asarray(m) @ v * (1 + 0.1 * jnp.tanh(jnp.linalg.norm(v)))

    solve = jax.jit(lambda b: krylov.fgmres(matvec, b, precondition, tol=tol,
                                            restart=restart, maxiter=maxiter))
    x, conv = solve(jnp.asarray(b))
    assert len(traced) == 1
    x = np.asarray(x)
    true = np.linalg.norm(b - a @ x) / np.linalg.norm(b)
    assert true <= tol and np.isclose(float(conv.residual), true, rtol=1e-4)
    assert 0 < int(conv.iterations) < maxiter
    assert np.linalg.norm(x - np.linalg.solve(a, b)) <= 100 * tol * np.linalg.norm(x)


def test_fgmres_stops_at_maxiter(rng):
    """At maxiter it stops and reports the true residual, above tol; with
    tol 0 and no recomputation (a multilevel preconditioner's inner solves)
    it takes exactly maxiter steps and reports the Givens estimate."""
    a, b, m = system(rng)
    mv, pc = (lambda x: jnp.asarray(a) @ x), (lambda v: jnp.asarray(m) @ v)
    x, conv = krylov.fgmres(mv, jnp.asarray(b), lambda v: v, tol=1e-12, restart=3, maxiter=4)
    true = np.linalg.norm(b - a @ np.asarray(x)) / np.linalg.norm(b)
    assert int(conv.iterations) == 4 and true > 1e-12
    assert np.isclose(float(conv.residual), true, rtol=1e-10)
    x, conv = krylov.fgmres(mv, jnp.asarray(b), pc, tol=0.0, restart=8, maxiter=8,
                            recompute=False)
    true = np.linalg.norm(b - a @ np.asarray(x)) / np.linalg.norm(b)
    assert int(conv.iterations) == 8
    assert np.isclose(float(conv.residual), true, rtol=1e-6)


def test_fgmres_under_vmap(rng):
    """Columns that converge at different steps, solved together."""
    a, b, m = system(rng)
    rhs = np.stack([b, a @ np.ones(len(b))], axis=1)
    solve = jax.vmap(lambda b: krylov.fgmres(lambda x: jnp.asarray(a) @ x, b,
                                             lambda v: jnp.asarray(m) @ v, tol=1e-10,
                                             restart=5, maxiter=200), in_axes=1, out_axes=(1, 0))
    x, conv = solve(jnp.asarray(rhs))
    np.testing.assert_allclose(np.asarray(x), np.linalg.solve(a, rhs), rtol=1e-8, atol=1e-8)
    assert np.all(np.asarray(conv.residual) <= 1e-10)
