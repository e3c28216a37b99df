"""The GPU M2L paths against the jnp specification: the bfloat16-piece
products of `translate.m2l(bf16x6=True)` (the GPU default) and the Pallas
M2L kernel (interpret mode), plus the public call through both."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import charges, points, reference, rel

import jfmm
from jfmm.ops import backend, laplace2d, laplace3d, translate
from jfmm.ops.pallas import m2l as pallas_m2l
from jfmm.tree import lists


def _operands(rng, dim, level, k, p, dtype):
    """Random multipoles of a level and random operators (the last one zero)."""
    n_off = len(lists.m2l_offsets(dim))
    mult = jnp.asarray(rng.normal(size=(2 ** (dim * level), k, p)), dtype)
    mats = jnp.asarray(rng.normal(size=(n_off + 1, p, p)), dtype).at[-1].set(0)
    return mult, mats


@pytest.mark.parametrize("dim,level,k,p,width,dtype", [
    (3, 2, 1, 16, 16, np.float64),   # 8 parents: one tile padded to 16
    (3, 3, 2, 9, 16, np.float32),    # P padded 9 -> 16, two charge vectors
    (2, 4, 1, 24, 16, np.float64),   # P = 24 -> 32: two coefficient chunks in and out
])
def test_pallas_m2l_matches_jnp(dim, level, k, p, width, dtype, rng):
    mult, mats = _operands(rng, dim, level, k, p, dtype)
    want = translate.m2l(mult, level, mats, dim)
    got = pallas_m2l.m2l(mult, level, mats, dim, pallas_m2l.Tiles(parents=16, width=width),
                         interpret=True)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert rel(got, want) < (1e-13 if dtype == np.float64 else 1e-6)


def test_bf16_split_is_exact(rng):
    x = (rng.normal(size=10000) * 10.0 ** rng.integers(-20, 20, 10000)).astype(np.float32)
    pieces = translate.bf16_split(jnp.asarray(x))
    assert all(h.dtype == jnp.bfloat16 for h in pieces)
    total = sum(np.asarray(h, np.float64) for h in pieces[::-1])
    np.testing.assert_array_equal(total, x.astype(np.float64))


@pytest.mark.parametrize("dim,level,p", [(3, 3, 6), (2, 4, 12)])
def test_bf16x6_m2l_is_float32_accurate(dim, level, p, rng):
    """Six bfloat16 products, on a level's real operators: as accurate as
    float32 products against float64 (the tensor cores' short sums are the
    GPU's part, measured in benchmarks/bench_m2l.py)."""
    family = laplace3d if dim == 3 else laplace2d
    ops64 = family.operators(p, lists.m2l_offsets(dim), jnp.float64)
    size = ops64.m2l.shape[-1]
    mult = jnp.asarray(rng.normal(size=(2 ** (dim * level), 2, size)))
    want = translate.m2l(mult, level, ops64.m2l, dim)
    m32, w32 = mult.astype(jnp.float32), ops64.m2l.astype(jnp.float32)
    f32 = rel(translate.m2l(m32, level, w32, dim), want)
    split = rel(translate.m2l(m32, level, w32, dim, bf16x6=True), want)
    assert split < 2 * f32 + 1e-7 and split < 1e-6


@pytest.mark.parametrize("kind", ["cube", "cluster"])
def test_fmm_float32_through_gpu_m2l(kind, rng):
    """The public call on the GPU code path (interpreted), float32, eps 1e-5:
    bfloat16-piece M2L by default, then the Pallas M2L kernel."""
    x, q = points(kind, 3000, rng).astype(np.float32), charges(3000, rng).astype(np.float32)
    ref, _ = reference(x, q)
    try:
        for m2l in ("bf16x6", pallas_m2l.Tiles(parents=16, width=16)):
            backend.set_backend("interpret", m2l=m2l)
            phi = jfmm.fmm(jnp.asarray(x), jnp.asarray(q), eps=1e-5, leaf_size=64)
            assert phi.dtype == jnp.float32 and rel(phi, ref) < 1e-5, m2l
    finally:
        backend.set_backend("auto", m2l="bf16x6")


def test_bad_m2l_choice():
    with pytest.raises(ValueError, match="m2l"):
        backend.set_backend("auto", m2l="tf32")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_pallas_m2l_lowers_to_triton(dtype):
    """The Pallas M2L lowers for the cuda platform (checked on the CPU)."""
    with jax.enable_x64(dtype == "float64"):
        p = 36
        mult = jax.ShapeDtypeStruct((8 ** 3, 1, p), dtype)
        mats = jax.ShapeDtypeStruct((len(lists.m2l_offsets(3)) + 1, p, p), dtype)
        f = jax.jit(lambda m, w: pallas_m2l.m2l(m, 3, w, 3))
        text = f.trace(mult, mats).lower(lowering_platforms=("cuda",)).as_text()
        assert "xla.gpu.triton" in text


def test_gpu_m2l_paths_vmap(rng):
    """Both GPU M2L paths batch over point sets (vmap), as the primitive's
    batching rule needs."""
    mult, mats = _operands(rng, 3, 2, 1, 9, np.float32)
    batch = jnp.stack([mult, -2 * mult[::-1]])
    want = jax.vmap(lambda m: translate.m2l(m, 2, mats, 3))(batch)
    split = jax.vmap(lambda m: translate.m2l(m, 2, mats, 3, bf16x6=True))(batch)
    tiles = pallas_m2l.Tiles(parents=16, width=16)
    kernel = jax.vmap(lambda m: pallas_m2l.m2l(m, 2, mats, 3, tiles, interpret=True))(batch)
    assert rel(split, want) < 1e-6 and rel(kernel, want) < 1e-6
