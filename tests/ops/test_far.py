"""M2P and P2L of every tree family against direct sums: a box's
multipole evaluated at points outside it (and the gradient there), and
charges outside a box turned into its local expansion; the 3D Laplace
M2P derivative tables against jax.jacfwd."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import radial_reference, rel

from jfmm import configure
from jfmm import kernels as K
from jfmm.ops import laplace2d, laplace3d

FAMILIES = {"laplace3d": (laplace3d, K.Laplace3D(), 3, 14),
            "laplace2d": (laplace2d, K.Laplace2D(), 2, 20),
            "chebyshev3d": (configure.chebyshev_family(3), K.InverseMultiquadric(2.0), 3, 8),
            "chebyshev2d": (configure.chebyshev_family(2), K.ThinPlateSpline(), 2, 14)}


def _far_shell(rng, n, dim, lo, hi):
    """n points with max-norm in [lo, hi] (box-side units, the box at 0)."""
    v = rng.uniform(-hi, hi, size=(4 * n, dim))
    keep = (np.abs(v).max(axis=1) >= lo)
    return v[keep][:n]


@pytest.mark.parametrize("name", list(FAMILIES))
def test_m2p_and_p2l_match_direct_sums(name, rng):
    """A box of side h at c: sources inside give a multipole (P2M), which
    M2P evaluates at points 1.5 to 3 box sides away (the W list's
    geometry); sources that far give a local expansion (P2L), which L2P
    evaluates inside."""
    family, kernel, dim, p = FAMILIES[name]
    h, c = 0.37, rng.random(dim)
    inside = rng.uniform(-0.5, 0.5, size=(60, dim))
    outside = _far_shell(rng, 80, dim, 1.5, 3.0)
    q = rng.random(60) - 0.5
    mult = jnp.sum(family.p2m(jnp.asarray(inside), jnp.asarray(q)[:, None], p), axis=0)
    hs = jnp.full(80, h)
    b, g = family.m2p_basis(kernel, jnp.asarray(outside), hs, p, gradient=True)
    ref, gref = radial_reference(kernel, c + h * inside, q, c + h * outside)
    assert rel(b @ mult[0], ref) < 1e-4
    assert rel(jnp.einsum("npa,p->na", g, mult[0]), gref) < 1e-3
    q2 = rng.random(80) - 0.5
    basis = family.p2l_basis(kernel, jnp.asarray(outside), hs, p)
    loc = (jnp.asarray(q2) @ basis)[None, None]                  # (1, K, P)
    coef = family.l2p_coefficients(loc, p, True)[0]
    phi, grad = family.l2p(jnp.asarray(inside), jnp.broadcast_to(coef, (60,) + coef.shape), h, p,
                           True)
    ref, gref = radial_reference(kernel, c + h * outside, q2, c + h * inside)
    assert rel(phi[:, 0], ref) < 1e-4
    assert rel(grad[:, 0], gref) < 1e-3


def test_laplace3d_m2p_derivatives_match_autodiff(rng):
    """d/dy of the M2P sum by the derivative tables (as the bases and as
    coefficient sets from the multipoles) equals jax.jacfwd."""
    p, n = 9, 40
    u = jnp.asarray(_far_shell(rng, n, 3, 1.5, 3.0))
    h = jnp.asarray(rng.random(n) + 0.5)
    mult = jnp.asarray(rng.normal(size=(n, 2, p * p)))
    b, g = laplace3d.m2p_basis(None, u, h, p, gradient=True)

    def phi(y):
        return jnp.einsum("np,nkp->nk", laplace3d.m2p_basis(None, y / h[:, None], h, p)[0], mult)

    want = jnp.moveaxis(jax.jacfwd(lambda y: phi(y).sum(0))(u * h[:, None]), 0, 1)
    assert rel(jnp.einsum("npa,nkp->nka", g, mult), want) < 1e-12
    coef = laplace3d.m2p_coefficients(mult, p, True)
    out = jnp.einsum("nkeq,nq->nke", coef, laplace3d.irregular(u, p + 1))
    assert rel(out[:, :, 1:] / (h * h)[:, None, None], want) < 1e-12
    assert rel(out[:, :, 0] / h[:, None], jnp.einsum("np,nkp->nk", b, mult)) < 1e-12
    stream = np.zeros((n, p * p))
    for j, t in laplace3d.irregular_stream(u[:, 0], u[:, 1], u[:, 2], p):
        stream[:, j] = t
    assert rel(stream, laplace3d.irregular(u, p)) < 1e-14
