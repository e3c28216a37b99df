"""The Pallas P2P kernel (interpret mode) against the jnp specification."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import charges, points, reference, rel

import jfmm

from jfmm import kernels
from jfmm.ops import backend, p2p
from jfmm.ops.pallas import p2p as pallas_p2p
from jfmm.tree import build, lists


def _case(rng, n_src, n_tgt, crowded):
    x = rng.random((n_src, 3))
    y = rng.random((n_tgt, 3))
    if crowded:  # one leaf holds most points; many leaves are empty
        x[: n_src * 3 // 4] = 0.8 + 1e-3 * rng.random((n_src * 3 // 4, 3))
        y[: n_tgt // 2] = 0.8 + 1e-3 * rng.random((n_tgt // 2, 3))
        x[5] = y[3]  # a coincident source-target pair
    return x, y


@pytest.mark.parametrize("n_src,n_tgt,crowded,k,gradient,dtype", [
    (301, 97, True, 1, True, np.float64),
    (77, 203, False, 2, True, np.float32),
    (150, 150, True, 1, False, np.float32),
])
def test_near_field_matches_jnp(n_src, n_tgt, crowded, k, gradient, dtype, rng):
    x, y = _case(rng, n_src, n_tgt, crowded)
    q = rng.random((n_src, k)) - 0.5
    t = build(jnp.asarray(x, dtype), jnp.asarray(y, dtype), 2)
    qs = jnp.asarray(q, dtype)[t.src_perm]
    args = (kernels.Laplace3D(), t.tgt_sorted, t.tgt_start, t.src_sorted, qs, t.src_start,
            lists.neighbors(2, 3), gradient)
    want = p2p.near_field(*args)
    got = pallas_p2p.near_field(*args, blocks=pallas_p2p.Blocks(16, 8),
                                  interpret=True)
    tol = 1e-12 if dtype == np.float64 else 1e-5
    assert got[0].dtype == dtype
    assert rel(got[0], np.asarray(want[0])) < tol
    if gradient:
        assert rel(got[1], np.asarray(want[1])) < tol
    assert np.isfinite(got[0]).all()
    # tiles in steps of one leaf's worth (`tiles.in_steps`), both backends
    for mode in ("jnp", "interpret"):
        stepped = backend.near_field(*args, mode, leaves=1)
        assert rel(stepped[0], np.asarray(want[0])) < tol, mode
        if gradient:
            assert rel(stepped[1], np.asarray(want[1])) < tol, mode


@pytest.mark.parametrize("dim,level", [(3, 2), (3, 3), (2, 4)])
def test_source_ranges_cover_the_neighbours(dim, level, rng):
    """Merged ranges hold exactly the sources of the neighbour leaves, once
    each, with empty leaves (including whole empty runs) among them."""
    near = np.asarray(lists.neighbors(level, dim))
    nleaf = near.shape[0]
    counts = rng.integers(0, 4, nleaf) * (rng.random(nleaf) < 0.7)
    start = np.concatenate([[0], np.cumsum(counts), [counts.sum()]])
    s0, s1, n = map(np.asarray, p2p.source_ranges(jnp.asarray(near), jnp.asarray(start)))
    for leaf in range(nleaf):
        want = sorted(i for j in near[leaf] for i in range(start[j], start[j + 1]))
        got = sorted(i for a, b in zip(s0[leaf], s1[leaf]) for i in range(a, b))
        assert got == want
        assert (s0[leaf, n[leaf]:] == s1[leaf, n[leaf]:]).all()
    assert n.max() < near.shape[1]


def test_dense_matches_jnp(rng):
    x, y, q = rng.random((133, 3)), rng.random((70, 3)), rng.random((133, 1)) - 0.5
    x[0] = y[0]
    want = p2p.dense(kernels.Laplace3D(), jnp.asarray(y), jnp.asarray(x), jnp.asarray(q), True)
    got = backend.dense(kernels.Laplace3D(), jnp.asarray(y), jnp.asarray(x),
                        jnp.asarray(q), True, "interpret")
    assert rel(got[0], np.asarray(want[0])) < 1e-12
    assert rel(got[1], np.asarray(want[1])) < 1e-12


@pytest.mark.parametrize("case,dist", [("self", "cube"), ("self with a duplicate", "cluster"),
                                       ("targets", "cluster"), ("targets with a hit", "cube")])
def test_dense_coincidence_check(case, dist, rng, monkeypatch):
    """All pairs with the sort that limits the r = 0 select to the tiles
    that need it (forced on at this size): exact duplicates anywhere, and
    targets equal to sources, still contribute 0."""
    monkeypatch.setattr(backend, "DENSE_CHECK_RATIO", 0)
    seen = []  # the select's rows per tile, as dense passes them on
    near_field = pallas_p2p.near_field
    monkeypatch.setattr(pallas_p2p, "near_field",
                        lambda *a, **k: seen.append(k["coincide"]) or near_field(*a, **k))
    x, q = points(dist, 203, rng), charges(203, rng, 2)
    y = None
    if case == "self with a duplicate":
        x[150] = x[11]
    if case.startswith("targets"):
        y = points(dist, 71, rng)
        if case.endswith("hit"):
            y[60] = x[3]
    phi, grad = backend.dense(kernels.Laplace3D(), None if y is None else jnp.asarray(y),
                              jnp.asarray(x), jnp.asarray(q), True, "interpret")
    ref, gref = reference(x, q, y)
    assert np.isfinite(phi).all() and np.isfinite(grad).all()
    assert rel(phi, ref) < 1e-13 and rel(grad, gref) < 1e-13
    g0, g1 = map(np.asarray, seen[0])
    m, n = (203 if y is None else 71), 203
    _, t0, t1 = map(np.asarray, p2p.leaf_tiles(jnp.array([0, m, m]), m,
                                               backend._dense_blocks.targets))
    if case in ("self with a duplicate", "targets with a hit"):
        assert (g0 == 0).all() and (g1 == n).all()
    elif case == "self":
        np.testing.assert_array_equal(g0, t0)
        np.testing.assert_array_equal(g1, t1)
    else:
        assert (g1 <= g0).all()


def test_dense_to_few_targets_splits_the_sources(rng, monkeypatch):
    """Few targets sum groups of the sources side by side (forced at this
    size: 8 groups, 1,001 sources padded with zero charges): the same sums
    as a numpy direct sum, a target on a source included."""
    monkeypatch.setattr(backend, "DENSE_GROUP_SOURCES", 64)
    x, q = points("cluster", 1001, rng), charges(1001, rng, 2)
    y = points("cluster", 24, rng)
    y[5] = x[700]
    assert backend._source_groups(24, 1001) == 8
    phi, grad = backend.dense(kernels.Laplace3D(), jnp.asarray(y), jnp.asarray(x),
                              jnp.asarray(q), True, "interpret")
    ref, gref = reference(x, q, y)
    assert rel(phi, ref) < 1e-13 and rel(grad, gref) < 1e-13


def test_pair_outside_the_declared_range_is_not_silent(rng):
    """A pair at r = 0 outside the rows declared able to coincide gives a
    non-finite sum, not a silent 0 (the contract of `coincide`)."""
    x, q = rng.random((40, 3)), rng.random((40, 1)) + 0.5
    y = x[:8].copy()
    t_start = jnp.array([0, 8, 8], jnp.int32)
    s_start = jnp.array([0, 40, 40], jnp.int32)
    b = pallas_p2p.Blocks(8, 8)
    n_tiles = p2p.leaf_tiles(t_start, 8, 8)[0].shape[0]
    none = (jnp.zeros(n_tiles, jnp.int32),) * 2
    phi, _ = pallas_p2p.near_field(kernels.Laplace3D(), jnp.asarray(y), t_start, jnp.asarray(x),
                                   jnp.asarray(q), s_start, jnp.zeros((1, 1), jnp.int32), True,
                                   blocks=b, interpret=True, coincide=none)
    assert not np.isfinite(phi).any()


@pytest.mark.parametrize("kernel", [
    kernels.Laplace3D(), kernels.Gaussian(1.0), kernels.Multiquadric(2.0),
    kernels.InverseMultiquadric(1.0), kernels.InverseQuadratic(1.0),
    kernels.ThinPlateSpline(), kernels.Linear(), kernels.Cubic(), kernels.Quintic(),
    kernels.Yukawa(2.0), kernels.Laplace2D()], ids=lambda k: type(k).__name__)
def test_unguarded_pair_at_zero_is_right_or_not_finite(kernel):
    """What a pair at r = 0 outside `coincide` adds: the guarded value where
    `from_r2` is finite at 0 (the gradient factor then multiplies y - x = 0),
    else a non-finite value, so an error shows."""
    z = jnp.zeros((1,))
    k, g = kernel.pair(z, True, guard=False)
    want, _ = kernel.pair(z, True)
    if np.isfinite(k).all() and np.isfinite(g).all():
        np.testing.assert_allclose(k, want, rtol=1e-15)
    else:
        assert not (np.isfinite(k).all() and np.isfinite(g * 0.0).all())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_equal_points_share_a_leaf(dtype, rng):
    """The rule the P2P's own-leaf select rests on: a target equal to a
    source lands in the source's leaf, lattice points (box faces at several
    levels) and -0.0 included."""
    x = points("cube", 300, rng) - 0.5
    x[:60] = np.round(x[:60] * 8) / 8
    x[60:70, 0] = 0.0
    y = np.concatenate([x[::3], rng.random((40, 3))])
    y[20:24, 0] = -y[20:24, 0]                # x[60:70:3]: 0.0 -> -0.0
    assert np.signbit(y[20:24, 0]).all() and (y[:100] == x[::3]).all()
    t = build(jnp.asarray(x, dtype), jnp.asarray(y, dtype), 4)
    src_leaf = np.empty(300, int)
    src_leaf[np.asarray(t.src_perm)] = np.asarray(t.src_leaf)
    tgt_leaf = np.empty(len(y), int)
    tgt_leaf[np.asarray(t.tgt_perm)] = np.asarray(t.tgt_leaf)
    np.testing.assert_array_equal(tgt_leaf[:100], src_leaf[::3])


def test_fast_math_keeps_every_kernel_value(monkeypatch):
    """The jaxpr re-evaluation of `fast_math` changes nothing but the rsqrt
    (here swapped back to lax.rsqrt, so it runs on the CPU): nested jit,
    custom_jvp, closures, traced parameters. Equal to float32 rounding: the
    two programs compile apart, and XLA may contract multiply-adds in one
    and not the other."""
    from jfmm.ops import pallas
    monkeypatch.setattr(pallas, "_asm_rsqrt", jax.lax.rsqrt)
    r2 = jnp.asarray(np.random.default_rng(0).random((8, 16)) + 0.1, jnp.float32)
    cases = [kernels.Laplace3D(), kernels.Gaussian(1.0), kernels.Multiquadric(2.0),
             kernels.InverseMultiquadric(1.0), kernels.InverseQuadratic(1.0),
             kernels.ThinPlateSpline(), kernels.Linear(), kernels.Cubic(), kernels.Quintic(),
             kernels.Yukawa(2.0), kernels.Laplace2D(),
             kernels.Radial(jax.jit(lambda r: jax.nn.softplus(-r) * jnp.sinc(r)))]
    for k in cases:
        leaves, treedef = jax.tree_util.tree_flatten(k)
        for guard in (True, False):
            def f(params, r2):
                kk = jax.tree_util.tree_unflatten(treedef, params)
                return kk.pair(r2, True, differentiable=False, guard=guard)
            params = [jnp.asarray(v, jnp.float32) for v in leaves]
            want = f(params, r2)
            got = jax.jit(pallas.fast_math(f, False))(params, r2)
            for a, b in zip(got, want):
                np.testing.assert_allclose(a, b, rtol=1e-6, atol=0)


def test_any_coincide():
    a = np.array([[0.0, 1, 2], [0.0, 1, 3], [1, 1, 2]])
    assert not p2p.any_coincide(jnp.asarray(a))
    assert p2p.any_coincide(jnp.asarray(np.concatenate([a, a[1:2]])))
    assert not p2p.any_coincide(jnp.asarray(a), jnp.asarray(a[:, ::-1]))
    assert p2p.any_coincide(jnp.asarray(a), jnp.asarray(a[2:]))
    # -0.0 equals 0.0 even with another point sorting between them
    b = np.array([[-0.0, 1, 2], [-0.0, 1, 5], [0.0, 1, 2]])
    assert p2p.any_coincide(jnp.asarray(b))
    assert p2p.any_coincide(jnp.asarray(b[:2]), jnp.asarray(b[2:]))
    # NaN equals nothing; duplicates within one set do not count as hits
    c = np.array([[np.nan, 0, 0], [np.nan, 0, 0]])
    assert not p2p.any_coincide(jnp.asarray(c))
    assert not p2p.any_coincide(jnp.asarray(np.concatenate([a, a])), jnp.asarray(a + 7))


def test_fmm_through_interpreted_kernel(rng):
    """The public call with the Pallas kernel (interpreted) in its near field."""
    x, q = rng.random((500, 3)), rng.random(500) - 0.5
    backend.set_backend("interpret")
    try:
        phi, grad = jfmm.fmm(x, q, eps=1e-5, gradient=True, leaf_size=16)  # p = 11, depth 2
        direct = jfmm.direct(x[:100], q[:100])
    finally:
        backend.set_backend("auto")
    ref, gref = reference(x, q)
    assert rel(phi, ref) < 1e-5 and rel(grad, gref) < 1e-4
    assert rel(direct, reference(x[:100], q[:100])[0]) < 1e-13


def test_bad_backend_name():
    with pytest.raises(ValueError, match="backend"):
        backend.set_backend("cuda")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _Bump(kernels.Kernel):
    """A smooth user kernel: K(0) counts, the gradient comes from autodiff."""
    width: float

    def radial(self, r):
        return jnp.exp(-(r / self.width) ** 2)


@pytest.mark.parametrize("mode", ["jnp", "interpret"])
def test_smooth_user_kernel_direct(mode, rng):
    x, y, q = rng.random((90, 3)), rng.random((40, 3)), rng.random((90, 1)) - 0.5
    y[0] = x[0]  # r = 0 pair: K(0) = 1 included, gradient 0
    kern = _Bump(jnp.asarray(0.3))
    phi, grad = backend.dense(kern, jnp.asarray(y), jnp.asarray(x), jnp.asarray(q), True, mode)
    d = y[:, None, :] - x[None, :, :]
    e = np.exp(-(d ** 2).sum(-1) / 0.09)
    np.testing.assert_allclose(phi, e @ q, rtol=1e-12, atol=1e-14)
    want = np.einsum("tsd,sk->tkd", d * (-2 / 0.09 * e)[..., None], q)
    np.testing.assert_allclose(grad, want, rtol=1e-11, atol=1e-14)


@pytest.mark.parametrize("kernel", [
    kernels.Laplace3D(), kernels.Gaussian(1.0), kernels.Multiquadric(2.0),
    kernels.InverseMultiquadric(1.0), kernels.InverseQuadratic(1.0),
    kernels.ThinPlateSpline(), kernels.Linear(), kernels.Cubic(), kernels.Quintic(),
    kernels.Yukawa(2.0), kernels.Laplace2D(), kernels.Radial(lambda r: -jnp.cos(r))],
    ids=lambda k: type(k).__name__)
def test_kernel_lowers_to_triton(kernel):
    """Every kernel's P2P lowers for the GPU (Triton), its Hessian mode too,
    checked here by lowering for the cuda platform on the CPU: interpret
    mode alone missed that -r (Linear's K(0) = -0, a literal) did not lower."""
    d = kernel.dims[-1]
    x = jnp.zeros((64, d), jnp.float32)
    q = jnp.zeros((64, 2), jnp.float32)
    h = jax.jit(lambda a, c: backend.dense(kernel, a, a, c, False, "pallas", hessian=True))
    h.trace(x, q).lower(lowering_platforms=("cuda",))
    f = jax.jit(lambda a, c: backend.dense(kernel, a, a, c, True, "pallas"))
    text = f.trace(x, q).lower(lowering_platforms=("cuda",)).as_text()
    if kernel.dims == (3,) and type(kernel).__name__ in ("Laplace3D", "Multiquadric", "Yukawa"):
        assert "rsqrt.approx.ftz.f32" in text  # jfmm.ops.pallas.fast_math


def test_fast_math_replaces_tensor_rsqrt_only():
    """float32 1/sqrt of pair tensors becomes PTX; a scalar one (K(0) of a
    kernel with traced parameters) must not: Triton rejects inline asm
    with scalar operands only, which lowering on the CPU does not show."""
    from jfmm.ops import pallas

    def f(eps, r2):
        return kernels.InverseMultiquadric(eps).pair(r2, True, differentiable=False)

    jaxpr = jax.make_jaxpr(f)(jnp.float32(1.0), jnp.ones((8, 16), jnp.float32)).jaxpr
    eqns = [e for e in jaxpr.eqns if e.primitive is jax.lax.rsqrt_p]
    assert sorted(len(e.outvars[0].aval.shape) for e in eqns) == [0, 2]
    assert [pallas._fast_rsqrt(e) for e in eqns] == [len(e.outvars[0].aval.shape) > 0
                                                     for e in eqns]


def test_dense_with_the_coincidence_check_lowers_to_triton(monkeypatch):
    monkeypatch.setattr(backend, "DENSE_CHECK_RATIO", 0)
    x = jnp.zeros((64, 3), jnp.float32)
    q = jnp.zeros((64, 1), jnp.float32)
    for f in (lambda a, c: backend.dense(kernels.Laplace3D(), None, a, c, True, "pallas"),
              lambda a, c: backend.dense(kernels.Laplace3D(), a[:9] + 1, a, c, True, "pallas")):
        jax.jit(f).trace(x, q).lower(lowering_platforms=("cuda",))


@pytest.mark.parametrize("kernel", [kernels.Laplace3D(), kernels.Gaussian(1.0)],
                         ids=lambda k: type(k).__name__)
def test_kernel_lowers_to_triton_in_float64(kernel):
    """float64 P2P lowers too (its products are PTX fma.rn.f64)."""
    with jax.enable_x64(True):
        x = jnp.zeros((64, 3), jnp.float64)
        q = jnp.zeros((64, 1), jnp.float64)
        f = jax.jit(lambda a, c: backend.dense(kernel, a, a, c, True, "pallas"))
        assert "fma.rn.f64" in f.trace(x, q).lower(lowering_platforms=("cuda",)).as_text()


def _hessian_reference(kernel, x, q, y):
    """float64 numpy sum_i q_i (A I + B r r^T), r = y - x_i, from each
    kernel's closed-form A = K'(r)/r and B = (K''(r) - K'(r)/r)/r^2; r = 0
    pairs skipped, as the gradient's (also for smooth kernels, whose
    A(0) I they leave out)."""
    d = y[:, None, :] - x[None, :, :]
    r2 = (d * d).sum(-1)
    pos = r2 > 0
    s = np.where(pos, r2, 1.0)
    if isinstance(kernel, kernels.Laplace3D):
        a, b = -s ** -1.5, 3 * s ** -2.5
    elif isinstance(kernel, kernels.Laplace2D):
        a, b = -1 / s, 2 / s ** 2
    elif isinstance(kernel, kernels.Gaussian):
        e2 = float(kernel.epsilon) ** 2
        a = -2 * e2 * np.exp(-e2 * r2)
        b = 4 * e2 * e2 * np.exp(-e2 * r2)
    else:                                               # InverseMultiquadric
        e2 = float(kernel.epsilon) ** 2
        a, b = -e2 * (1 + e2 * r2) ** -1.5, 3 * e2 * e2 * (1 + e2 * r2) ** -2.5
    a, b = np.where(pos, a, 0.0), np.where(pos, b, 0.0)
    h = (a[..., None, None] * np.eye(y.shape[1]) + b[..., None, None] * d[..., :, None]
         * d[..., None, :])
    return np.einsum("mnij,nk->mkij", h, q)


@pytest.mark.parametrize("kernel,dim,dtype", [
    (kernels.Laplace3D(), 3, np.float64), (kernels.Gaussian(3.0), 2, np.float64),
    (kernels.InverseMultiquadric(2.0), 3, np.float32), (kernels.Laplace2D(), 2, np.float64)])
def test_hessians_match_closed_forms(kernel, dim, dtype, rng):
    """All pairs' second derivatives along the targets (Kernel.hessian_pair in
    the Pallas kernel, interpret mode; targets the sources with a duplicate,
    and apart) against numpy sums of the closed forms; the near field's
    against its jnp specification (forward mode), on a crowded tree."""
    x = points("cluster", 160, rng, dim).astype(dtype)
    x[7] = x[3]
    y = rng.random((90, dim)).astype(dtype)
    q = (rng.random((160, 2)) - 0.5).astype(dtype)
    tol = 1e-11 if dtype == np.float64 else 1e-5
    for targets in (None, y):
        got = backend.dense(kernel, targets, jnp.asarray(x), jnp.asarray(q), False, "interpret",
                            hessian=True)
        want = _hessian_reference(kernel, np.float64(x), np.float64(q),
                                  np.float64(x if targets is None else targets))
        assert got.shape == want.shape and got.dtype == dtype
        assert rel(got, want) < tol
    t = build(jnp.asarray(x), jnp.asarray(y), 2)
    args = (kernel, t.tgt_sorted, t.tgt_start, t.src_sorted, jnp.asarray(q)[t.src_perm],
            t.src_start, lists.neighbors(2, dim))
    got = backend.near_field_hessian(*args, "interpret")
    assert rel(got, np.asarray(p2p.near_field_hessian(*args))) < tol


def _curl(grad):
    """numpy curl of each column triple's gradients (M, K, 3) -> (M, K)."""
    g = grad.reshape(len(grad), -1, 3, 3)
    return np.stack([g[..., 2, 1] - g[..., 1, 2], g[..., 0, 2] - g[..., 2, 0],
                     g[..., 1, 0] - g[..., 0, 1]], axis=-1).reshape(len(grad), -1)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_curl_mode_matches_the_curl_of_gradients(dtype, rng):
    """curl=True, two charge-column triples: on a tree of depth 1 (every
    leaf a neighbour, so all pairs; a source equal to a target) against the
    numpy curl of float64 gradient sums, and on a crowded tree of depth 2
    against the curl of the jnp near field's gradient, also in steps."""
    x, y = _case(rng, 301, 97, True)
    q = charges(301, rng, 6)
    tol = 1e-12 if dtype == np.float64 else 1e-5
    for depth, want in ((1, _curl(reference(x, q, y, dtype)[1])), (2, None)):
        t = build(jnp.asarray(x, dtype), jnp.asarray(y, dtype), depth)
        args = (kernels.Laplace3D(), t.tgt_sorted, t.tgt_start, t.src_sorted,
                jnp.asarray(q, dtype)[t.src_perm], t.src_start, lists.neighbors(depth, 3))
        got = pallas_p2p.near_field(*args, False, blocks=pallas_p2p.Blocks(16, 8),
                                    interpret=True, curl=True)
        if want is None:
            want = _curl(np.asarray(p2p.near_field(*args, True)[1], np.float64))
            stepped = backend.near_field(*args, True, "interpret", leaves=1, curl=True)
            assert stepped[0] is None and rel(stepped[1], want) < tol
        else:
            got = np.asarray(got)[np.argsort(np.asarray(t.tgt_perm))]   # caller's order
        assert got.shape == (97, 6) and got.dtype == dtype
        assert rel(got, want) < tol
    with pytest.raises(ValueError, match="threes"):
        pallas_p2p.near_field(*args[:4], args[4][:, :4], *args[5:], False, interpret=True,
                              curl=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_curl_mode_lowers_to_triton(dtype):
    with jax.enable_x64(dtype == np.float64):
        t = build(jnp.zeros((64, 3), dtype), None, 1)
        q = jnp.zeros((64, 3), dtype)
        f = jax.jit(lambda q: pallas_p2p.near_field(
            kernels.Laplace3D(), t.tgt_sorted, t.tgt_start, t.src_sorted, q, t.src_start,
            lists.neighbors(1, 3), False, curl=True))
        f.trace(q).lower(lowering_platforms=("cuda",))


@pytest.mark.parametrize("kernel", [kernels.Laplace3D(), kernels.InverseMultiquadric(2.0)],
                         ids=lambda k: type(k).__name__)
def test_curl_along_matches_closed_forms(kernel, rng):
    """along=a: the curl of the gradients' derivatives along each target's
    direction, all pairs (a tree of depth 1), against numpy closed-form
    second derivatives contracted with a and curled; float64."""
    x = points("cluster", 160, rng)
    x[7] = x[3]
    y = rng.random((90, 3))
    q = charges(160, rng, 6)
    a = rng.standard_normal((90, 3))
    want = _curl(np.einsum("mkij,mj->mki", _hessian_reference(kernel, x, q, y), a))
    t = build(jnp.asarray(x), jnp.asarray(y), 1)
    got = pallas_p2p.near_field(kernel, t.tgt_sorted, t.tgt_start, t.src_sorted,
                                jnp.asarray(q)[t.src_perm], t.src_start, lists.neighbors(1, 3),
                                False, interpret=True, along=jnp.asarray(a)[t.tgt_perm])
    got = np.asarray(got)[np.argsort(np.asarray(t.tgt_perm))]
    assert got.shape == (90, 6) and rel(got, want) < 1e-12
    dense = backend.dense(kernel, jnp.asarray(y), jnp.asarray(x), jnp.asarray(q), False,
                          "interpret", along=jnp.asarray(a))
    assert rel(dense, want) < 1e-12
    assert rel(backend.dense(kernel, jnp.asarray(y), jnp.asarray(x), jnp.asarray(q), False,
                             "jnp", along=jnp.asarray(a)), want) < 1e-12


def test_curl_along_lowers_to_triton():
    with jax.enable_x64(True):
        x = jnp.zeros((64, 3), jnp.float64)
        f = jax.jit(lambda q, a: backend.dense(kernels.Laplace3D(), None, x, q, False, "pallas",
                                               along=a))
        f.trace(jnp.zeros((64, 3)), jnp.zeros((64, 3))).lower(lowering_platforms=("cuda",))
