"""The 3D Chebyshev M2L in its truncated basis."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import rel

from jfmm import kernels
from jfmm.ops import chebyshev as ch
from jfmm.tree import lists

FAMILY = ch.Chebyshev(3)


@pytest.mark.parametrize("stored", [True, False])
@pytest.mark.parametrize("kernel", [kernels.Yukawa(2.0), kernels.ThinPlateSpline()])
def test_matrices_from_symmetries_equal_direct_transforms(kernel, stored, monkeypatch):
    """The 316 offsets' truncated matrices, built from 16 canonical ones by
    reflections and axis permutations, equal F_E K_o F_E^T built per offset:
    stored, and held as the canonical ones (`SymmetricM2L`, above
    STORED_M2L_BYTES) and indexed as M2L's loop over positions does."""
    monkeypatch.setattr(ch, "STORED_M2L_BYTES", {"cpu": 2 ** 62 if stored else 0,
                                                 "gpu": 2 ** 62 if stored else 0})
    n, side = 5, 0.37
    ops = FAMILY.operators(n, lists.m2l_offsets(3), jnp.float64)
    mats = FAMILY.m2l_matrices(ops, kernel, side, n)
    assert isinstance(mats, jax.Array) == stored
    slots = jnp.asarray(lists.m2l_slots(3)[:, :, :2])           # (3^3, 8, 2): some are zero
    got = mats[slots]
    nodes = ch._node_matrices(kernel, side, n, 3, lists.m2l_offsets(3), jnp.float64)
    want = ch._truncate(ch._truncate(nodes, n), n)
    want = jnp.concatenate([want, jnp.zeros((1,) + want.shape[1:])])[slots]
    k = len(ch._ball(n, 3))
    assert got.shape == slots.shape + (k, k)
    assert float(jnp.max(jnp.abs(got - want))) < 1e-14 * float(jnp.max(jnp.abs(want)))
    assert (lists.m2l_slots(3)[:, :, :2] == len(lists.m2l_offsets(3))).any()


def test_truncated_translation_matches_the_kernel(rng):
    """Multipoles of charges in one box, translated to a well-separated box
    in the truncated basis and interpolated at targets there, against the
    direct sum: as accurate as the untruncated node matrices. Errors are
    relative to sum_j |K_ij q_j| so that cancellation in a mixed-sign sum
    does not inflate them (over 200 seeds both stay below 2.7e-6)."""
    n, side = 7, 0.5
    kernel = kernels.Yukawa(1.5)
    ops = FAMILY.operators(n, lists.m2l_offsets(3), jnp.float64)
    offsets = lists.m2l_offsets(3)
    o = int(np.flatnonzero((offsets == [2, 1, 0]).all(axis=1))[0])
    x = rng.uniform(-0.5, 0.5, (40, 3))                 # source box at the offset
    y = rng.uniform(-0.5, 0.5, (30, 3))                 # target box at the origin
    q = rng.uniform(-1, 1, 40)
    w = ch.interpolation(jnp.asarray(x), n).T @ q       # P2M: node weights
    basis = ops.basis
    loc = basis.T @ (FAMILY.m2l_matrices(ops, kernel, side, n)[o] @ (basis @ w))
    full = ch._node_matrices(kernel, side, n, 3, offsets[o:o + 1], jnp.float64)[0] @ w
    r = side * np.linalg.norm(y[:, None] - x[None] - offsets[o], axis=-1)
    k = np.asarray(kernel.radial(jnp.asarray(r)))
    want, scale = k @ q, np.linalg.norm(np.abs(k) @ np.abs(q))
    interp = ch.interpolation(jnp.asarray(y), n)
    err_full = np.linalg.norm(np.asarray(interp @ full) - want) / scale
    err = np.linalg.norm(np.asarray(interp @ loc) - want) / scale
    assert err_full < 5e-6
    assert err < 5e-6


def test_p2m_with_materialized_products_matches(rng, monkeypatch):
    """The GPU backend's P2M materializes some per-point products before
    their leaf reduction (`backend.MATERIALIZE`): same multipoles, in value
    and in reverse mode."""
    from jfmm.ops import backend
    monkeypatch.setattr(backend, "MATERIALIZE", {"float64": (1, 2 ** 31)})
    n, leaves = 300, 5
    u = jnp.asarray(rng.uniform(-0.5, 0.5, (n, 3)))
    q = jnp.asarray(rng.uniform(-1, 1, (n, 2)))
    leaf = jnp.asarray(np.sort(rng.integers(0, leaves, n)).astype(np.int32))
    start = jnp.searchsorted(leaf, jnp.arange(leaves + 2), side="left").astype(jnp.int32)

    def f(mode):
        return lambda c: backend.p2m(FAMILY, u, c, start, leaf, 4, mode)

    assert rel(f("pallas")(q), np.asarray(f("jnp")(q))) < 1e-14
    w = jnp.asarray(rng.normal(size=(leaves, 2, 64)))
    g = [jax.grad(lambda c, m=m: jnp.sum(w * f(m)(c)))(q) for m in ("pallas", "jnp")]
    assert rel(g[0], np.asarray(g[1])) < 1e-14
