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
                                    "plan", "vortex"]
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
    with pytest.raises(ValueError, match=r"\(n, 3\) for Laplace3D.*kernels.Laplace2D\(\)"):
        f(x[:, :2], q)                       # Laplace3D is 3D only
    with pytest.raises(ValueError, match=r"\(n, 2\) for Laplace2D.*kernels.Laplace3D\(\)"):
        f(x, q, kernel=kernels.Laplace2D())
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
    for value in (np.nan, np.inf):
        bad_q = q.copy()
        bad_q[7] = value
        with pytest.raises(ValueError, match="charges contain NaN or inf"):
            f(x, bad_q)
        with pytest.raises(ValueError, match="charges contain NaN or inf"):
            f(x, jnp.asarray(bad_q))
    with pytest.raises(TypeError, match="Kernel"):
        f(x, q, kernel=object())
    with pytest.raises(ValueError, match="empty"):
        f(x[:0], q[:0])


def test_bad_eps_raises(rng):
    x, q = rng.random((50, 3)), rng.random(50)
    for eps in (0.0, -1e-3, 1.0, 10.0):
        with pytest.raises(ValueError, match=r"eps.*\(0, 1\)"):
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


def _pair_terms(x, y):
    """Numpy 1/r pair terms: K (M, N), grad K (M, N, 3) and Hessian
    (M, N, 3, 3) at y_j - x_i, zero at r = 0."""
    d = y[:, None] - x[None]
    r2 = np.sum(d * d, axis=-1)
    inv = np.where(r2 > 0, 1 / np.sqrt(np.where(r2 > 0, r2, 1)), 0)
    k, g = inv, -d * inv[..., None] ** 3
    h = (3 * d[..., :, None] * d[..., None, :] * inv[..., None, None] ** 5
         - np.eye(3) * inv[..., None, None] ** 3)
    return k, g, h


@pytest.mark.parametrize("kind", ["cube", "cluster"])
def test_direct_differentiates_against_numpy(kind, rng):
    """jax.grad, jvp and vmap of `direct` (potential and gradient outputs,
    with respect to sources, charges and targets) against numpy's closed
    forms of the 1/r sum's derivatives."""
    x, q, y = points(kind, 300, rng), charges(300, rng), points(kind, 200, rng)
    w, v = rng.standard_normal(200), rng.standard_normal((200, 3))
    k, g, h = _pair_terms(x, y)
    phi, grad = k @ q, np.einsum("jid,i->jd", g, q)
    hv = np.einsum("jide,je->jid", h, v)                          # H(y_j - x_i) v_j

    def loss(x, q, y):
        p, gr = jfmm.direct(x, q, y, gradient=True)
        return jnp.sum(w * p) + jnp.sum(v * gr)

    got = jax.grad(loss, argnums=(0, 1, 2))(*map(jnp.asarray, (x, q, y)))
    want = (-q[:, None] * (np.einsum("j,jid->id", w, g) + hv.sum(0)),
            w @ k + np.einsum("jd,jid->i", v, g),
            w[:, None] * grad + np.einsum("jide,i,je->jd", h, q, v))
    for a, b in zip(got, want):
        assert rel(a, b) < 1e-12

    dx, dq, dy = rng.standard_normal(x.shape), rng.standard_normal(300), rng.standard_normal(y.shape)
    primal, dphi = jax.jvp(lambda *a: jfmm.direct(*a), (x, q, y), (dx, dq, dy))
    assert rel(primal, phi) < 1e-13
    assert rel(dphi, k @ dq + np.sum(grad * dy, 1) - np.einsum("jid,i,id->j", g, q, dx)) < 1e-12

    shared = lambda x, q: 0.5 * jnp.sum(q * jfmm.direct(x, q))      # noqa: E731
    twice = jnp.stack([x, y[:100].repeat(3, 0)]), jnp.stack([q, q[::-1]])
    gx, gq = jax.vmap(jax.grad(shared, argnums=(0, 1)))(*twice)
    for i, (xs, qs) in enumerate(((x, q), (y[:100].repeat(3, 0), q[::-1]))):  # coincident too
        ks, gs, _ = _pair_terms(xs, xs)
        assert rel(gq[i], ks @ qs) < 1e-12
        assert rel(gx[i], qs[:, None] * np.einsum("jid,i->jd", gs, qs)) < 1e-12


def test_direct_gradients_keep_memory_linear():
    """Reverse mode, vmap over point sets and a gradient through forces of
    `direct` at N = 40,000 compile to O(N) temporaries: the pair matrix
    alone would take 6.4 GB in float32."""
    n = 40_000
    pts, q = jax.ShapeDtypeStruct((n, 3), jnp.float32), jax.ShapeDtypeStruct((n,), jnp.float32)
    energy = lambda x, q: jnp.sum(q * jfmm.direct(x, q))                      # noqa: E731
    forces = lambda x, q: jnp.sum(jfmm.direct(x, q, gradient=True)[1] ** 2)  # noqa: E731
    batched = (jax.ShapeDtypeStruct((2, n, 3), jnp.float32),
               jax.ShapeDtypeStruct((2, n), jnp.float32))
    for f, args in ((jax.grad(energy, (0, 1)), (pts, q)), (jax.grad(forces, (0, 1)), (pts, q)),
                    (jax.vmap(jax.grad(energy, (0, 1))), batched)):
        temp = jax.jit(f).lower(*args).compile().memory_analysis().temp_size_in_bytes
        assert temp < 200 * n * 4 * 3, temp


def test_plan_checks_shapes(rng):
    x = rng.random((200, 3))
    pl = jfmm.plan(x)
    with pytest.raises(ValueError, match="charges"):
        pl.apply(np.ones(199))
    with pytest.raises(ValueError, match="charges contain NaN"):
        pl.apply(np.full(200, np.nan))
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
    call = lambda y: backend.call(jits, y, mode="pallas")                  # noqa: E731
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
    ref = radial_reference(kernels.Laplace3D(), x, q, gradient=False)[0]
    assert rel(jfmm.fmm(x, q, kernel="laplace3d", eps=1e-6, leaf_size=16), ref) <= 1e-6
    assert jfmm.plan(x, kernel="Laplace3D", eps=1e-3).kernel == kernels.Laplace3D()
    ref = radial_reference(kernels.ThinPlateSpline(), x, q, gradient=False)[0]
    assert rel(jfmm.direct(x, q, kernel="thin_plate_spline"), ref) <= 1e-12
    with pytest.raises(TypeError, match=r"jfmm.kernels.get\('gaussian', epsilon="):
        jfmm.fmm(x, q, kernel="gaussian")
    with pytest.raises(ValueError, match="known"):
        jfmm.direct(x, q, kernel="gausian")
    with pytest.raises(TypeError, match="jfmm.kernels.get"):
        jfmm.plan(x, kernel=3.0)


def test_complex_charges(rng):
    """Complex charges, (N,) and (N, k): fmm, Plan.apply and direct sum real
    and imaginary parts, potential and gradient, against the float64 numpy
    sum; jax.grad with respect to complex charges and to positions matches
    that of a dense jnp sum."""
    x, y = points("cluster", 500, rng), points("sphere", 300, rng)
    q = charges(500, rng, 2) + 1j * charges(500, rng, 2)
    ref = reference(x, q.real, y)
    ref = [a + 1j * b for a, b in zip(ref, reference(x, q.imag, y))]
    opts = dict(eps=1e-4, leaf_size=16)         # low orders: this tests the complex plumbing
    for (phi, grad), cols in ((jfmm.fmm(x, q[:, 0], y, gradient=True, **opts), 0),
                              (jfmm.plan(x, y, **opts, gradient=True).apply(q, gradient=True), slice(None)),
                              (jfmm.direct(x, q, y, gradient=True), slice(None))):
        assert phi.dtype == np.complex128 and grad.dtype == np.complex128
        assert rel(phi, ref[0][:, cols]) <= 1e-4 and rel(grad, ref[1][:, cols]) <= 1e-3
    assert jfmm.direct(x.astype(np.float32), q, y.astype(np.float32)).dtype == np.complex64

    def dense(xs, qs):
        r = jnp.sqrt(jnp.sum((jnp.asarray(y)[:, None] - xs[None]) ** 2, axis=-1))
        return (1 / r) @ qs

    def loss(sum_):
        return lambda xs, qs: jnp.sum(jnp.abs(sum_(xs, qs)) ** 2)

    fast = loss(lambda xs, qs: jfmm.fmm(xs, qs, y, **opts))
    got = jax.grad(fast, argnums=(0, 1))(jnp.asarray(x), jnp.asarray(q[:, 0]))
    want = jax.grad(loss(dense), argnums=(0, 1))(jnp.asarray(x), jnp.asarray(q[:, 0]))
    assert got[1].dtype == np.complex128
    assert rel(got[0], want[0]) <= 1e-3 and rel(got[1], want[1]) <= 1e-3


def test_one_dtype_rule(rng):
    """The points' dtype decides for fmm, plan and direct alike (integer
    points: the default float, float64 here under jax_enable_x64), charges
    of any dtype are cast to it, and eps defaults by it."""
    xi = rng.integers(0, 100, (300, 3))
    x32 = points("cube", 300, rng).astype(np.float32)
    for x, q, want in ((xi, charges(300, rng).astype(np.float32), np.float64),
                       (x32, charges(300, rng), np.float32),
                       (x32, np.ones(300, np.int64), np.float32)):
        pl = jfmm.plan(x, leaf_size=16)
        outs = (jfmm.fmm(x, q, leaf_size=16), pl.apply(q), jfmm.direct(x, q))
        assert [o.dtype for o in outs] == [want] * 3
        assert pl.eps == api._configure.default_eps(kernels.Laplace3D(), 3, want)
        ref = reference(x, q, dtype=want)[0]
        assert rel(outs[0], ref) <= pl.eps and rel(outs[1], ref) <= pl.eps


def test_a_plan_for_phi_refuses_gradients(rng):
    """A plan made for phi alone (the default) has an order for phi's error:
    it refuses gradients and derivatives along point moves, loudly; a plan
    made with gradient=True gives both within eps."""
    from conftest import radial_reference

    x, q = jnp.asarray(points("cube", 4000, rng)), jnp.asarray(charges(4000, rng))
    kernel, eps = kernels.Linear(), 1e-4
    pl = jfmm.plan(x, kernel=kernel, eps=eps)
    assert pl.tree.depth >= 2
    with pytest.raises(ValueError, match="gradient=True"):
        pl.apply(q, gradient=True)
    with pytest.raises(ValueError, match="gradient=True"):
        jax.grad(lambda y: jnp.sum(pl.update(y).apply(q)))(x)
    both = jfmm.plan(x, kernel=kernel, eps=eps, gradient=True)
    assert both.order > pl.order
    phi, grad = both.apply(q, gradient=True)
    ref, gref = radial_reference(kernel, np.asarray(x), np.asarray(q))
    assert max(rel(pl.apply(q), ref), rel(phi, ref), rel(grad, gref)) <= eps


def test_more_points_a_device_than_measured_raise(monkeypatch):
    """Above api.DEVICE_POINTS points a device (sources or targets) the
    tree builds raise rather than sum (both trees, traced shapes alone);
    the direct sum's one box does not."""
    monkeypatch.setattr(api, "DEVICE_POINTS", 1000)
    x, q = jax.ShapeDtypeStruct((1001, 3), jnp.float32), jax.ShapeDtypeStruct((1001,), jnp.float32)
    y = jax.ShapeDtypeStruct((1000, 3), jnp.float32)
    for tree in ("uniform", "adaptive"):
        with pytest.raises(ValueError, match="points a device"):
            jax.eval_shape(lambda a, c: jfmm.fmm(a, c, eps=1e-4, tree=tree), x, q)
        with pytest.raises(ValueError, match="points a device"):
            jax.eval_shape(lambda a, c, b: jfmm.fmm(a, c[:1000], b, eps=1e-4, tree=tree),
                           y, q, x)
    jax.eval_shape(lambda a, c: jfmm.fmm(a, c[:1000], eps=1e-4, tree="uniform"), y, q)
    jax.eval_shape(lambda a, c: jfmm.direct(a, c), x, q)
