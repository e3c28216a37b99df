"""The jnp pair tile, `p2p.pairwise`, in each of its layouts against a
float64 numpy sum: one (T, S, d) array where XLA's optimisations are off
(the suite's default), one (T, S) array per axis and the stacked (d, T, S)
array where they are on."""
import jax
import numpy as np
import pytest
from conftest import rel

from jfmm import kernels as K
from jfmm.ops import p2p


@pytest.mark.optimized
@pytest.mark.parametrize("dim", [2, 3])
def test_pairwise_layouts_match_numpy(dim, rng):
    y, x = rng.random((64, dim)), rng.random((48, dim))
    x[5] = y[7]                                     # a pair at r = 0 is skipped
    q, mask = rng.random((48, 2)) - 0.5, rng.random(48) < 0.8
    d = y[:, None] - x[None]
    r = np.linalg.norm(d, axis=-1)
    inv = np.divide(1.0, r, out=np.zeros_like(r), where=r > 0)
    qm = np.where(mask[:, None], q, 0)
    if dim == 3:                                    # 1/r
        kernel, k, factor = K.Laplace3D(), inv, -inv ** 3
    else:                                           # -log r
        kernel, k, factor = K.Laplace2D(), -np.log(np.where(r > 0, r, 1.0)), -inv ** 2
    want_phi = k @ qm
    want_grad = np.einsum("tsd,ts,sk->tkd", d, factor, qm)
    before = jax.config.read("jax_disable_most_optimizations")
    try:
        for unoptimised in (True, False):
            jax.config.update("jax_disable_most_optimizations", unoptimised)
            for stacked in (False, True):
                phi, grad = jax.jit(lambda a, b, c, m: p2p.pairwise(kernel, a, b, c, m, True,
                                                                      stacked))(y, x, q, mask)
                assert rel(phi, want_phi) < 1e-13 and rel(grad, want_grad) < 1e-13
    finally:
        jax.config.update("jax_disable_most_optimizations", before)
