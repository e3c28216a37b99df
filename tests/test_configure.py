"""The configuration step (jfmm.configure) and the models it asks
(jfmm.models): what each kernel resolves to, concrete or traced, and the
errors of bad requests. No sums here: their accuracy is tested per family."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import charges, points, radial_reference

from jfmm import configure
from jfmm import tree as tree_
from jfmm import kernels as K
from jfmm.models import checked_order
from jfmm.models import laplace3d as laplace3d_model

NAMES = {"laplace3d", "laplace2d", "chebyshev", "hermite", "near"}


def resolve(x, kernel, eps=1e-6, order=None, family=None, leaf_size=None):
    return configure.resolve(x, None, kernel, eps, leaf_size, order, family)


def traced(x, kernel, eps=1e-6):
    """The Config resolved inside jit, where the points are tracers."""
    out = []
    jax.make_jaxpr(lambda a: out.append(resolve(a, kernel, eps)) or a)(x)
    return out[0]


@pytest.mark.parametrize("dim", [2, 3])
def test_every_kernel_resolves_to_one_family(dim, rng):
    """A Config with a family object (no "auto" string), an order and a
    depth, from concrete and from traced points; hashable, so it can be a
    static argument of jit."""
    x = jnp.asarray(points("cube", 3000, rng, dim))
    laplace = K.Laplace3D() if dim == 3 else K.Laplace2D()
    for kernel in [laplace, K.Gaussian(2.0), K.Multiquadric(1.0), K.ThinPlateSpline(),
                   K.Yukawa(2.0)]:
        for cfg in (resolve(x, kernel), traced(x, kernel)):
            assert cfg.name in NAMES, cfg
            assert not isinstance(cfg.family, str)
            assert isinstance(cfg.order, int) and cfg.order >= 1
            assert isinstance(cfg.depth, int) and cfg.depth >= 0
            copy = configure.Config(**{f.name: getattr(cfg, f.name)
                                       for f in dataclasses.fields(cfg)})
            assert copy == cfg and hash(copy) == hash(cfg)
        if kernel is laplace:   # series families: the order depends on eps and dtype only
            assert resolve(x, kernel) == traced(x, kernel)
            assert resolve(x, kernel).name == ("laplace3d" if dim == 3 else "laplace2d")


def test_laplace_order_grows_as_eps_falls():
    orders = [laplace3d_model.order_for_eps(eps, np.float64)
              for eps in (1e-2, 1e-4, 1e-6, 1e-8, 1e-10)]
    assert orders == sorted(orders) and orders[0] < orders[-1]
    assert laplace3d_model.order_for_eps(1e-5, np.float32) <= laplace3d_model.order_for_eps(
        1e-5, np.float64)


def test_far_share_is_not_carried_by_a_few_close_pairs(rng):
    """One pair 1e-7 apart among sphere points carries nearly all of sum
    1/r^2, yet adds to |phi| only as much as its two charges allow: the far
    field's share, which sets 3D Laplace's order on uniform trees, keeps
    about the value it had before the two points met (it fell 10^6-fold
    when every pair counted)."""
    x = points("sphere", 2400, rng)
    share = lambda a: float(laplace3d_model.far_share(jnp.asarray(a), None, 2))  # noqa: E731
    before = share(x)
    x[1] = x[0] + 1e-7
    assert share(x) == pytest.approx(before, rel=0.2)


def test_cube_share_table_is_far_share_of_its_draw():
    """`configure.CUBE_SHARE` is `far_share` of the draw it names, at the
    depths of small and large trees, and 1 past its end."""
    x = jnp.asarray(np.random.default_rng(0).random((16384, 3)), jnp.float32)
    for depth in (2, 4, 7):
        share = float(laplace3d_model.far_share(x, None, depth))
        assert configure.cube_share(depth) == pytest.approx(share, rel=1e-6)
    assert float(laplace3d_model.far_share(x, None, 8)) == pytest.approx(1.0, abs=1e-6)
    assert configure.cube_share(9) == 1.0


def test_overrides_are_kept_and_checked(rng):
    x = jnp.asarray(points("cube", 2000, rng))
    assert resolve(x, K.Laplace3D(), order=7).order == 7
    assert resolve(x, K.Laplace3D(), leaf_size=500).depth < resolve(x, K.Laplace3D(),
                                                                     leaf_size=10).depth
    cfg = resolve(x, K.Laplace3D(), family="chebyshev")
    assert cfg.name == "chebyshev"
    assert resolve(x, K.Gaussian(3.0), family="hermite").name == "hermite"
    with pytest.raises(ValueError, match="order must be an int"):
        resolve(x, K.Laplace3D(), order=0)
    with pytest.raises(ValueError, match="family must be one of"):
        resolve(x, K.Laplace3D(), family="taylor")
    with pytest.raises(ValueError, match="Gaussian kernel only"):
        resolve(x, K.Linear(), family="hermite")
    with pytest.raises(ValueError, match="order must be an int"):
        checked_order(2.5, 10)
    assert checked_order(None, 10) is None and checked_order(np.int64(4), 10) == 4


@pytest.mark.parametrize("kernel,dtype", [(K.Laplace3D(), np.float32), (K.Laplace3D(), np.float64),
                                          (K.Multiquadric(1.0), np.float32)])
def test_eps_below_the_floor_raises(kernel, dtype, rng):
    x = jnp.asarray(points("cube", 1000, rng), dtype)
    with pytest.raises(ValueError, match="eps"):
        resolve(x, kernel, eps=1e-14)


def test_repeated_eager_calls_reuse_choices(rng, monkeypatch):
    """A repeated eager call resolves once; moved or redistributed points of
    the same shapes resolve again, and every call is within eps of a
    float64 numpy sum. The charges' moments (`configure.charged`) are part
    of what is remembered."""
    from conftest import radial_reference

    import jfmm

    calls = []
    real = configure.resolve
    monkeypatch.setattr(configure, "resolve", lambda *a, **k: calls.append(1) or real(*a, **k))
    kernel, eps = K.InverseMultiquadric(3.0), 1e-6
    x = points("cube", 1500, rng)
    q = rng.random(1500) - 0.5
    for pts, resolves in [(x, 1), (x, 1), (2 * x, 2), (points("cluster", 1500, rng), 3)]:
        phi = jfmm.fmm(jnp.asarray(pts), jnp.asarray(q), kernel=kernel, eps=eps)
        ref = radial_reference(kernel, pts, q, gradient=False)[0]
        assert np.linalg.norm(phi - ref) / np.linalg.norm(ref) < eps
        assert len(calls) == resolves
        charged = configure.charged(jnp.asarray(pts), None, kernel, jnp.asarray(q)[:, None],
                                    None, None, eps)
        cfg = configure.resolve_eager(jnp.asarray(pts), None, kernel, eps, None, None, None,
                                      gradient=False, charged=charged)
        assert len(calls) == resolves
        assert cfg == real(jnp.asarray(pts), None, kernel, eps, None, None, None, gradient=False,
                           charged=charged)
    # The same points under jit resolve and build inside the trace: the
    # result of a plan made without charges, which jit cannot see.
    y = jnp.asarray(points("sphere", 1500, rng))
    q = jnp.asarray(rng.random(1500) - 0.5)
    eager = jfmm.plan(y, kernel=kernel, eps=eps, gradient=True).apply(q)  # traced points: the
    jitted = jax.jit(lambda a, c: jfmm.fmm(a, c, kernel=kernel, eps=eps))(y, q)  # gradient's order
    np.testing.assert_allclose(jitted, eager, rtol=0, atol=1e-9 * float(jnp.max(jnp.abs(eager))))


@pytest.mark.crossover
def test_direct_sum_below_the_crossover(rng):
    """Below the measured crossover "auto" sums directly (the near field of
    a one-box tree), exactly; overrides and larger sets keep the FMM."""
    import jfmm

    n = 300
    x, q = points("cluster", n, rng), rng.random(n) - 0.5
    for kernel in (K.Laplace3D(), K.Multiquadric(2.0)):
        cfg = resolve(jnp.asarray(x), kernel)
        assert cfg.name == "near" and cfg.depth == 0
        phi = jfmm.fmm(jnp.asarray(x), jnp.asarray(q), kernel=kernel)
        ref = jfmm.direct(jnp.asarray(x), jnp.asarray(q), kernel=kernel)
        np.testing.assert_allclose(phi, ref, rtol=1e-12, atol=1e-12)
        assert resolve(jnp.asarray(x), kernel, family="chebyshev").name == "chebyshev"
        assert resolve(jnp.asarray(x), kernel, leaf_size=16).depth > 0
        assert traced(jnp.asarray(x), kernel).name == "near"
    big = jnp.zeros((2 ** 15, 3))
    assert resolve(big, K.Laplace3D()).name == "laplace3d"


def test_crossover_scales_with_the_kernels_cost_per_pair(monkeypatch):
    """An entry measured with one kernel crosses at pairs / (cost ratio)
    for another (`PAIR_COST`): a kernel costing 3.2x crosses at a 3.2nd of
    the pairs, a cheaper one later; a kernel with a length scale wrapped
    around another (`base`) costs what it wraps; a kernel or dtype without
    a cost keeps the entry's pairs."""
    from jfmm.rbf.interpolator import kernel_for

    pairs = 2.0 ** 30
    monkeypatch.setattr(configure, "DIRECT_PAIRS",
                        {"cpu": {("chebyshev", 3, "float64"): (pairs, 1e-6, 8, "Linear"),
                                 ("chebyshev", 3, "float32"): (pairs, 1e-4, 8, "Linear")},
                         "gpu": {}})
    monkeypatch.setattr(configure, "PAIR_COST", {"cpu": {"float64": {
        "Linear": 1.0, "ThinPlateSpline": 3.2, "InverseQuadratic": 0.5}}})

    def crosses(kernel, ratio, dtype=np.float64, eps=1e-6):
        n = int(np.sqrt(pairs * ratio))
        return (configure.below_crossover(kernel, 3, dtype, n - 8, n - 8, eps, "chebyshev", 8)
                and not configure.below_crossover(kernel, 3, dtype, n + 8, n + 8, eps,
                                                  "chebyshev", 8))

    assert jax.default_backend() == "cpu"
    assert crosses(K.Linear(), 1.0) and crosses(K.ThinPlateSpline(), 1 / 3.2)
    assert crosses(K.InverseQuadratic(1.0), 2.0)
    assert crosses(kernel_for("thin_plate_spline", 2.0), 1 / 3.2)      # scaled: its base
    assert crosses(K.Gaussian(1.0), 1.0)                                 # no cost measured
    assert crosses(K.ThinPlateSpline(), 1.0, np.float32, 1e-4)           # no float32 costs


def test_eager_calls_on_the_same_arrays_reuse_one_plan(rng):
    """Eager calls on the same jax arrays apply the Plan made by the second
    (tree included); a new array of equal values makes its own. Both within
    eps of a float64 numpy sum."""
    from conftest import radial_reference

    import jfmm
    from jfmm import api

    kernel, eps = K.Gaussian(4.0), 1e-6
    x = jnp.asarray(points("sphere", 1500, rng))
    for pts in (x, x, x, jnp.array(x)):     # first sight, plan made, plan found, new array
        q = rng.random(1500) - 0.5
        phi, grad = jfmm.fmm(pts, jnp.asarray(q), kernel=kernel, eps=eps, gradient=True)
        assert phi.shape == (1500,) and grad.shape == (1500, 3)
        ref, gref = radial_reference(kernel, np.asarray(pts), q)
        assert np.linalg.norm(phi - ref) / np.linalg.norm(ref) < eps
        assert np.linalg.norm(grad - gref) / np.linalg.norm(gref) < 10 * eps
    opts = (eps, None, None, None, True, "auto")
    first = api._eager_plan(x, None, kernel, *opts)
    assert first is api._eager_plan(x, None, kernel, *opts)
    assert first is not api._eager_plan(jnp.array(x), None, kernel, *opts)
    assert first is not api._eager_plan(x, None, K.Gaussian(5.0), *opts)


def test_remembered_plans_stay_out_of_transformations(rng):
    """Inside jit, vmap or grad an eager call on remembered concrete points
    does not take (or make) the remembered plan."""
    from jfmm import _compat, api

    assert not _compat.tracing()
    seen = []
    jax.jit(lambda v: seen.append(_compat.tracing()) or v)(1.0)
    jax.vmap(lambda v: seen.append(_compat.tracing()) or v)(jnp.ones(2))
    jax.grad(lambda v: seen.append(_compat.tracing()) or v)(1.0)
    assert seen == [True, True, True]
    x = jnp.asarray(points("cube", 300, rng))
    opts = (1e-6, None, None, None, False, "auto")
    api._eager_plan(x, None, K.Gaussian(4.0), *opts)
    assert api._eager_plan(x, None, K.Gaussian(4.0), *opts) is not None
    assert jax.jit(lambda: api._eager_plan(x, None, K.Gaussian(4.0), *opts) is None)()


def test_row_top_keeps_ties(rng):
    """`laplace3d.row_top` (the far share's largest near pairs) against
    numpy's sort, on rows full of ties."""
    v = np.round(rng.random((37, 300)) * 20) / 20
    got = np.asarray(laplace3d_model.row_top(jnp.asarray(v), 8))
    assert np.array_equal(np.sort(got, axis=1), np.sort(v, axis=1)[:, -8:])


def test_within_at_samples(rng):
    """The direct check at strided targets (`configure.within_at_samples`):
    sums off the float64 numpy sum by 0.3 eps relative at every target
    pass, by 0.7 eps do not, per column and for phi and grad apart (the
    jnp scan and the Pallas sum, interpreted)."""
    kernel, eps, n = K.Multiquadric(1.0), 1e-6, 700
    x, q = points("cluster", n, rng, 3), charges(n, rng, 2)
    tree = tree_.build(jnp.asarray(x), None, 2)
    ref, gref = radial_reference(kernel, x, q)
    sign = rng.choice([-1.0, 1.0], size=(n, 1))
    off = 1 + eps * sign * np.array([0.3, 0.7])                  # (n, 2): per column
    for phi, grad, want, mode in ((ref * off, gref, [[True, False], [True, True]], "jnp"),
                                  (ref, gref * off[..., None], [[True, True], [True, False]],
                                   "interpret"),
                                  (ref * off, None, [[True, False], [True, True]], "jnp")):
        ok = configure.within_at_samples(eps, kernel, tree, jnp.asarray(q), jnp.asarray(phi),
                                         None if grad is None else jnp.asarray(grad), mode)
        assert np.array_equal(np.asarray(ok), want)
