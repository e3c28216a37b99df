"""Public surface, input checking, dtypes and the direct sum."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import charges, points, reference, rel

import jfmm
from jfmm import api, kernels
from jfmm.ops import backend


def test_public_names_frozen():
    assert sorted(jfmm.__all__) == ["Plan", "RBFInterpolator", "direct", "fmm", "kernels",
                                    "plan"]
    assert kernels.__all__ == [
        "Kernel", "Gaussian", "Multiquadric", "InverseMultiquadric", "InverseQuadratic",
        "ThinPlateSpline", "Linear", "Cubic", "Quintic", "Yukawa", "Laplace2D", "Laplace3D",
        "Radial", "get"]


def test_kernel_is_pytree_and_get_by_name():
    assert jax.tree_util.tree_leaves(kernels.Laplace3D()) == []
    assert isinstance(kernels.get("Laplace3D"), kernels.Laplace3D)
    with pytest.raises(ValueError, match="unknown kernel"):
        kernels.get("nope")


@pytest.mark.parametrize("call", ["fmm", "direct"])
def test_bad_input_raises_clearly(call, rng):
    f = getattr(jfmm, call)
    x, q = rng.random((50, 3)), rng.random(50)
    with pytest.raises(ValueError, match="shape"):
        f(x[:, :2], q)                       # Laplace3D is 3D only
    with pytest.raises(ValueError, match="shape"):
        f(x[None], q)
    with pytest.raises(ValueError, match="charges"):
        f(x, q[:49])
    with pytest.raises(ValueError, match="targets"):
        f(x, q, rng.random((5, 2)))
    bad = x.copy()
    bad[3, 0] = np.inf
    with pytest.raises(ValueError, match="NaN or inf"):
        f(bad, q)
    bad[3, 0] = np.nan
    with pytest.raises(ValueError, match="NaN or inf"):
        f(x, q, bad)
    with pytest.raises(TypeError, match="Kernel"):
        f(x, q, kernel=object())
    with pytest.raises(ValueError, match="empty"):
        f(x[:0], q[:0])


def test_bad_eps_raises(rng):
    x, q = rng.random((50, 3)), rng.random(50)
    for eps in (0.0, -1e-3):
        with pytest.raises(ValueError, match="eps"):
            jfmm.fmm(x, q, eps=eps)
    with pytest.raises(ValueError, match="float32"):
        jfmm.fmm(x.astype(np.float32), q.astype(np.float32), eps=1e-9)
    with pytest.raises(ValueError, match="float64"):
        jfmm.fmm(x, q, eps=1e-17)
    with pytest.raises(ValueError, match="order"):
        jfmm.fmm(x, q, order=0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("call", ["fmm", "direct"])
def test_dtype_preserved(dtype, call, rng):
    x, q = points("cube", 300, rng).astype(dtype), charges(300, rng).astype(dtype)
    phi, grad = getattr(jfmm, call)(x, q, gradient=True)
    assert phi.dtype == dtype and grad.dtype == dtype
    int_q = jfmm.fmm(x, np.ones(300, np.int32))
    assert int_q.dtype == dtype


@pytest.mark.parametrize("kind", ["cube", "cluster"])
def test_direct_matches_reference(kind, rng):
    x, q, y = points(kind, 700, rng), charges(700, rng, k=2), points("cube", 333, rng)
    phi, grad = jfmm.direct(x, q, y, gradient=True)
    ref, gref = reference(x, q, y)
    assert phi.shape == (333, 2) and grad.shape == (333, 2, 3)
    assert rel(phi, ref) < 1e-13 and rel(grad, gref) < 1e-13


def test_plan_checks_shapes(rng):
    x = rng.random((200, 3))
    pl = jfmm.plan(x)
    with pytest.raises(ValueError, match="charges"):
        pl.apply(np.ones(199))
    with pytest.raises(ValueError, match="shape"):
        pl.update(rng.random((201, 3)))


def test_top_level_gpu_calls_compile_with_their_options(monkeypatch):
    """jfmm's top-level GPU calls use the jit with compiler options; traced
    arguments (jit, grad, vmap) and calls inside a user's jit on constants
    the plain one; a user's XLA_FLAGS setting of the option wins."""
    monkeypatch.setenv("XLA_FLAGS", "")
    used = []

    def spy(name, f):
        return lambda *a, **k: used.append(name) or f(*a, **k)

    plain, fast = backend.jits(lambda x, mode: 2 * x, ("mode",))
    jits = (spy("plain", plain), spy("fast", fast))
    call = lambda y: api._call(jits, y, mode="pallas")                     # noqa: E731
    x = jnp.arange(3.0)
    np.testing.assert_array_equal(call(x), 2 * x)
    assert used == ["fast"]
    for transform in (jax.jit, jax.grad, jax.vmap):
        used.clear()
        f = (lambda y: jnp.sum(call(y))) if transform is jax.grad else call
        transform(f)(x)
        assert used == ["plain"], transform
    used.clear()
    np.testing.assert_array_equal(jax.jit(lambda: call(x))(), 2 * x)   # x a constant
    assert used == ["fast", "plain"]
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_enable_triton_gemm=true")
    used.clear()
    call(x)
    assert used == ["plain"]


def test_kernel_names(rng):
    """Parameter-free kernels by name in fmm, plan and direct, against a
    float64 numpy sum; a kernel with parameters named as a string says how
    to build it; unknown names list the known ones."""
    from conftest import radial_reference

    x, q = points("cluster", 400, rng), charges(400, rng)
    ref = radial_reference(kernels.Laplace3D(), x, q)[0]
    assert rel(jfmm.fmm(x, q, kernel="laplace3d", eps=1e-6, leaf_size=16), ref) <= 1e-6
    assert jfmm.plan(x, kernel="Laplace3D", eps=1e-3).kernel == kernels.Laplace3D()
    ref = radial_reference(kernels.ThinPlateSpline(), x, q)[0]
    assert rel(jfmm.direct(x, q, kernel="thin_plate_spline"), ref) <= 1e-12
    with pytest.raises(TypeError, match=r"jfmm.kernels.get\('gaussian', epsilon="):
        jfmm.fmm(x, q, kernel="gaussian")
    with pytest.raises(ValueError, match="known"):
        jfmm.direct(x, q, kernel="gausian")
    with pytest.raises(TypeError, match="jfmm.kernels.get"):
        jfmm.plan(x, kernel=3.0)
