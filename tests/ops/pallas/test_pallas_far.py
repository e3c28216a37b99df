"""The Pallas M2P and P2L kernels (interpreted) against their jnp twins on
an adaptive tree's W and X work lists (float32, as the GPU runs them by
default; the kernels' arithmetic is the same in float64)."""
import jax
import jax.numpy as jnp
import numpy as np
from conftest import charges, points, rel
from test_adaptive_fmm import scales

from jfmm import passes
from jfmm.ops import backend, far, laplace3d
from jfmm.tree import adaptive


def test_far_kernels_match_jnp(rng):
    dtype, tol = np.float32, 2e-6
    x, y = scales(120, rng, 3, 3).astype(dtype), points("sphere", 60, rng, 3).astype(dtype)
    tree = adaptive.plan_tree(jnp.asarray(x), jnp.asarray(y), 8)
    p = 6
    mult = jnp.asarray(rng.normal(size=(tree.n_boxes, 2, p * p)).astype(dtype))
    qs = jnp.asarray(charges(120, rng, 2).astype(dtype))
    for mode in ("jnp", "interpret"):
        assert backend._far_twin(laplace3d, p, mode) == (mode == "interpret")
    want = far.m2p(laplace3d, None, tree, mult, p, True)
    got = backend.far_m2p(laplace3d, None, tree, mult, p, True, "interpret")
    assert rel(got[0], want[0]) < tol and rel(got[1], want[1]) < tol
    want = far.p2l(laplace3d, None, tree, qs, p, jnp.zeros_like(mult))
    got = backend.far_p2l(laplace3d, None, tree, qs, p, mult, "interpret")
    assert rel(got - mult, want) < tol


def test_m2p_on_chunks_of_a_bounded_tree(rng, monkeypatch):
    """A bounded tree's W list runs in chunks with fewer (entry, box) pairs
    than boxes (at 2^20 points, 7,168 pairs against 64,513 boxes; here
    smaller chunks): the Pallas M2P takes coefficient sets for those pairs
    alone, and must agree with the jnp M2P of the same chunks."""
    monkeypatch.setattr(adaptive, "FAR_CHUNK", 64)
    dtype, tol = np.float32, 2e-6
    x, y = scales(120, rng, 3, 3).astype(dtype), points("sphere", 60, rng, 3).astype(dtype)
    caps = adaptive.bounded_capacities(180, 3, 8, jnp.float32, 60)
    tree = adaptive.build(jnp.asarray(x), jnp.asarray(y), 8, caps)
    assert adaptive.far_chunk(caps.w) * (2 ** 3 - 1) < tree.n_boxes
    p = 6
    mult = jnp.asarray(rng.normal(size=(tree.n_boxes, 2, p * p)).astype(dtype))
    got, want = (passes.w_lists(tree, mult, laplace3d, None, p, True, mode)
                 for mode in ("interpret", "jnp"))
    assert float(jnp.linalg.norm(want[1])) > 0
    assert rel(got[0], want[0]) < tol and rel(got[1], want[1]) < tol


def test_far_kernels_lower_to_triton():
    """The Pallas M2P and P2L lower for the cuda platform (checked on the CPU)."""
    x = jnp.asarray(scales(200, np.random.default_rng(0), 3), jnp.float32)
    tree = adaptive.plan_tree(x, None, 8)
    p = 6
    mult = jnp.zeros((tree.n_boxes, 1, p * p), jnp.float32)
    q = jnp.zeros((200, 1), jnp.float32)
    m2p = jax.jit(lambda t, m: backend.far_m2p(laplace3d, None, t, m, p, True, "pallas"))
    assert "fma.rn.f32" in m2p.trace(tree, mult).lower(lowering_platforms=("cuda",)).as_text()
    p2l = jax.jit(lambda t, c: backend.far_p2l(laplace3d, None, t, c, p, mult, "pallas"))
    p2l.trace(tree, q).lower(lowering_platforms=("cuda",))
