"""Every family at the smallest eps `jfmm.fmm`'s docstring states, against
the float64 numpy reference (3D Laplace's float64 floor is in test_fmm)."""
import numpy as np
import pytest
from conftest import charges, points, radial_reference, rel

import jfmm
from jfmm import kernels as K


@pytest.mark.parametrize("kernel,dim,kind,eps,dtype,n,leaf", [
    (K.Laplace2D(), 2, "sphere", 4.8e-14, np.float64, 1200, None),
    (K.Multiquadric(1.0), 2, "cube", 1e-12, np.float64, 1200, 8),
    (K.Quintic(), 3, "cube", 1e-10, np.float64, 1500, 16),
    (K.Laplace3D(), 3, "cluster", 3e-6, np.float32, 2000, None),
    (K.Laplace2D(), 2, "cube", 3e-6, np.float32, 2000, None),
    (K.Multiquadric(1.0), 3, "sphere", 1e-5, np.float32, 2000, 32),
    (K.Gaussian(3.0), 2, "cluster", 1e-5, np.float32, 2000, None),
], ids=lambda v: type(v).__name__ if isinstance(v, K.Kernel) else None)
def test_smallest_stated_eps(kernel, dim, kind, eps, dtype, n, leaf, rng):
    x = np.asarray(points(kind, n, rng, dim), dtype)
    q = np.asarray(charges(n, rng), dtype)
    pl = jfmm.plan(x, kernel=kernel, eps=eps, leaf_size=leaf, gradient=True)
    assert pl.tree.depth >= 2                     # a far field to approximate
    phi, grad = pl.apply(q, gradient=True)
    assert phi.dtype == dtype
    ref, gref = radial_reference(kernel, np.float64(x), np.float64(q), None)
    assert rel(phi, ref) <= eps, rel(phi, ref)
    assert rel(grad, gref) <= 10 * eps, rel(grad, gref)
