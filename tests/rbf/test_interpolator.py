"""jfmm.RBFInterpolator against scipy.interpolate.RBFInterpolator (float64,
its dense LU solve), numpy, finite differences, and its error paths."""
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.interpolate import RBFInterpolator as ScipyRBF

import jfmm
from jfmm.rbf import interpolator, nystrom, schwarz, system
from jfmm.rbf.interpolator import kernel_for

SCALED = {"multiquadric": 8.0, "inverse_multiquadric": 8.0, "inverse_quadratic": 8.0,
          "gaussian": 8.0}
KERNELS = ["thin_plate_spline", "linear", "cubic", "quintic", *SCALED]


def sites(kind, n, rng, dim):
    """Scattered data sites: uniform, or three clusters of different widths."""
    if kind == "uniform":
        return rng.random((n, dim))
    centres = rng.random((3, dim))
    width = np.array([0.02, 0.05, 0.1])[rng.integers(0, 3, n)]
    return centres[rng.integers(0, 3, n)] + width[:, None] * rng.normal(size=(n, dim))


def values(y, rng, k=None):
    """A smooth function plus a random polynomial-free wiggle, (n,) or (n, k)."""
    f = np.exp(-np.sum((3 * y - 1) ** 2, axis=1)) + 0.5 * np.sin(5 * y[:, 0]) * y[:, 1]
    if k is None:
        return f
    return f[:, None] * rng.normal(size=(1, k)) + rng.normal(size=(1, k))


def rel(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.fixture
def small_levels(monkeypatch):
    """Multilevel preconditioners at CPU sizes: dense at or below 150 points."""
    monkeypatch.setattr(system.Settings.__new__, "__defaults__",
                        (30, 8, 32, 128, 8, 150, True))


@pytest.mark.parametrize("dim", [2, 3])
@pytest.mark.parametrize("kernel", KERNELS)
def test_dense_matches_scipy_every_kernel(kernel, dim, rng):
    """Two dense solves of one system (ours by Cholesky on the polynomials'
    null space, scipy's LU): agreement to 1e-7, or to the system's
    conditioning where that is worse (two close points make a flat
    kernel's cond reach 1e14; the solves then differed by 1.6e-7, a
    hundredth of cond x eps; over 200 draws at most 0.015 of it)."""
    y = sites("uniform", 400, rng, dim)
    x = rng.random((100, dim))
    d = values(y, rng)
    eps = SCALED.get(kernel)
    ours = jfmm.RBFInterpolator(y, d, kernel=kernel, epsilon=eps)
    scipy = ScipyRBF(y, d, kernel=kernel, epsilon=eps)
    assert ours.method == "dense"
    np.testing.assert_array_equal(ours.powers, scipy.powers)
    r2 = np.sum((y[:, None] - y[None]) ** 2, axis=-1)
    k = np.asarray(kernel_for(kernel, eps or 1.0).pair(jnp.asarray(r2), False)[0])
    p = np.prod(y[:, None, :] ** scipy.powers[None], axis=2)
    saddle = np.block([[k, p], [p.T, np.zeros((p.shape[1], p.shape[1]))]])
    assert rel(ours(x), scipy(x)) < max(1e-7, 0.1 * np.linalg.cond(saddle) * 2.2e-16)


@pytest.mark.parametrize("case", ["indefinite", "below_degree"])
def test_dense_solve_takes_lu_where_cholesky_cannot(case, rng):
    """The dense solve factorizes by Cholesky on the polynomials' null space
    where the kernel is conditionally positive definite at its degree; with
    negative smoothing (indefinite, so Cholesky fails) or below the
    kernel's minimum degree it solves by LU, as scipy. Against numpy's
    float64 solve of the saddle system, at sites in three clusters."""
    y = sites("cluster", 300, rng, 3)
    d = values(y, rng)
    smoothing, degree = (-0.5 * rng.random(300), 1) if case == "indefinite" else (1e-3, -1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)         # scipy's: below the minimum degree
        ours = jfmm.RBFInterpolator(y, d, kernel="thin_plate_spline", smoothing=smoothing,
                                    degree=degree)
    assert ours.method == "dense"
    s = np.broadcast_to(smoothing, (300,))
    r = np.linalg.norm(y[:, None] - y[None], axis=-1)
    k = r ** 2 * np.log(np.where(r > 0, r, 1.0)) + np.diag(s)
    p = np.asarray(ours._sites[:, :0]) if degree < 0 else polynomial_at(ours, y)
    saddle = np.block([[k, p], [p.T, np.zeros((p.shape[1], p.shape[1]))]])
    want = np.linalg.solve(saddle, np.concatenate([d, np.zeros(p.shape[1])]))
    if case == "indefinite":                # Cholesky fails here, so LU answered
        c, _, _ = schwarz.null_space_solve(jnp.asarray(k), jnp.asarray(p),
                                           jnp.asarray(d[:, None]))
        assert not np.all(np.isfinite(np.asarray(c)))
    x = rng.random((50, 3))
    rx = np.linalg.norm(x[:, None] - y[None], axis=-1)
    kx = rx ** 2 * np.log(np.where(rx > 0, rx, 1.0))
    px = polynomial_at(ours, x)[:, :p.shape[1]]
    assert rel(ours(x), kx @ want[:300] + px @ want[300:]) < 1e-8


def polynomial_at(it, x):
    """The interpolator's monomials (shifted and scaled as scipy's) at x (m, d)."""
    shift, scale = np.asarray(it._shift), np.asarray(it._scale)
    return np.prod(((x - shift) / scale)[:, None, :] ** it.powers[None], axis=2)


@pytest.mark.parametrize("degree", [0, 1, 2])
def test_degrees_smoothing_and_vector_values(degree, rng):
    y = sites("uniform", 300, rng, 3)
    d = values(y, rng, k=3).reshape(300, 3, 1)
    smoothing = rng.random(300) * 1e-3
    x = rng.random((80, 3))
    for kernel in ("gaussian", "cubic"):
        if kernel == "cubic" and degree < 1:
            continue
        ours = jfmm.RBFInterpolator(y, d, smoothing=smoothing, kernel=kernel, epsilon=3.0,
                                    degree=degree)
        ref = ScipyRBF(y, d, smoothing=smoothing, kernel=kernel, epsilon=3.0, degree=degree)
        assert ours(x).shape == (80, 3, 1)
        assert rel(ours(x), ref(x)) < 1e-7


@pytest.mark.parametrize("kernel, dim, smoothing", [
    ("thin_plate_spline", 3, None), ("linear", 2, None), ("cubic", 3, None),
    ("gaussian", 3, 1e-2), ("inverse_multiquadric", 2, 1e-2)])
def test_krylov_matches_scipy(kernel, dim, smoothing, rng, small_levels):
    """The Schwarz-preconditioned Krylov solve at its default tol agrees
    with scipy's LU to 1e-7, several columns; scalar and per-point
    smoothing (None: 0 or 1e-4 at random), the positive definite kernels
    with the smoothing they converge with (the class docstring)."""
    n = 1000
    y = sites("uniform", n, rng, dim)
    d = values(y, rng, k=2)
    x = rng.random((300, dim))
    if smoothing is None:
        smoothing = np.where(rng.random(n) < 0.5, 0.0, 1e-4)
    eps = SCALED.get(kernel)
    ours = jfmm.RBFInterpolator(y, d, smoothing=smoothing, kernel=kernel, epsilon=eps,
                                method="krylov", preconditioner="schwarz")
    ref = ScipyRBF(y, d, smoothing=smoothing, kernel=kernel, epsilon=eps)(x)
    print(kernel, dim, "iterations", int(ours.iterations), "residual", float(ours.residual))
    assert len(ours._levels) >= 2 and ours.preconditioner == "schwarz"
    assert float(ours.residual) <= 1e-8
    assert rel(ours(x), ref) < 1e-7


def test_refits_keep_the_local_inverses_for_new_values_alone(rng, small_levels):
    """fit(d=...) reuses the local inverses (the preconditioner does not
    depend on d); fit(smoothing=...) rebuilds them. Both against scipy,
    on uniform sites (clustered ones: test_krylov_clustered_sites)."""
    y = sites("uniform", 1000, rng, 3)
    x = rng.random((200, 3))
    ours = jfmm.RBFInterpolator(y, values(y, rng), kernel="thin_plate_spline",
                                method="krylov")
    d2 = np.cos(4 * y[:, 1]) + y[:, 0] * y[:, 2] + rng.normal(size=1000)
    refit = ours.fit(d=d2)
    assert all(a.inverse is b.inverse for a, b in zip(refit._levels, ours._levels))
    assert rel(refit(x), ScipyRBF(y, d2, kernel="thin_plate_spline")(x)) < 1e-7
    smoother = refit.fit(smoothing=1e-3)
    assert not any(a.inverse is b.inverse for a, b in zip(smoother._levels, ours._levels))
    ref = ScipyRBF(y, d2, kernel="thin_plate_spline", smoothing=1e-3)(x)
    assert rel(smoother(x), ref) < 1e-7


@pytest.mark.parametrize("kernel, dim, epsilon, smoothing", [
    ("gaussian", 3, 3.0, 1e-5), ("inverse_multiquadric", 2, 2.0, None)])
def test_nystrom_matches_scipy(kernel, dim, epsilon, smoothing, rng):
    """Flat positive definite kernels with little smoothing (None: 1e-5 to
    1e-4 per point), where the Schwarz preconditioner stalls: the automatic
    choice takes the Nystrom one, and the solve at its default tol (1e-8)
    agrees with scipy's LU to 5e-7, two columns, uniform and clustered
    sites. The conditioning carries the residual into the values at new
    points: over 16 clustered draws the ratio of the two was 1.4-33, so
    the bound is 50 x tol. (A tighter tol is no cure: the residual of this
    system stalls near 1.4e-9 in float64 on some draws. At smoothing 1e-6
    two dense float64 solves, LU and SVD least squares, differ by 2-3e-7
    at new points.)"""
    n = 1500
    y = sites("uniform" if dim == 2 else "cluster", n, rng, dim)
    d = values(y, rng, k=2) + 1e-2 * rng.normal(size=(n, 2))
    x = sites("uniform", 300, rng, dim)
    if smoothing is None:
        smoothing = 10 ** rng.uniform(-5, -4, n)
    ours = jfmm.RBFInterpolator(y, d, smoothing=smoothing, kernel=kernel, epsilon=epsilon,
                                method="krylov")
    ref = ScipyRBF(y, d, smoothing=smoothing, kernel=kernel, epsilon=epsilon)(x)
    print(kernel, dim, "rank", ours.rank, "iterations", int(ours.iterations))
    assert ours.preconditioner == "nystrom" and 0 < ours.rank <= n // 4
    assert float(ours.residual) <= 1e-8
    assert rel(ours(x), ref) < 50 * 1e-8


def test_nystrom_factor_and_inverse(rng):
    """The pivoted Cholesky factor F and its traces against numpy: the
    weighted residual trace sum_i w_i (K - F F^T)_ii after each block, a
    positive semidefinite residual, and P^-1 = (F F^T + S)^-1 exactly."""
    n = 600
    y = rng.random((n, 3))
    k = kernel_for("gaussian", 2.0)
    smoothing = 10 ** rng.uniform(-6, -3, n)
    F, traces = nystrom.factor(k, jnp.asarray(y), jnp.asarray(1 / smoothing), 256,
                               jax.random.PRNGKey(3))
    F = np.asarray(F)
    K = np.exp(-4.0 * np.sum((y[:, None] - y[None]) ** 2, axis=-1))
    E = K - F @ F.T
    assert np.linalg.eigvalsh(E)[0] > -1e-10
    np.testing.assert_allclose(traces[-1], np.sum(np.diag(E) / smoothing), rtol=1e-6)
    assert np.all(np.diff(np.asarray(traces)) < 0)
    F128, _ = nystrom.factor(k, jnp.asarray(y), jnp.asarray(1 / smoothing), 128,
                             jax.random.PRNGKey(3))
    np.testing.assert_allclose(F128, F[:, :128], atol=1e-12)     # a prefix is the smaller factor
    r = rng.normal(size=n)
    P = F @ F.T + np.diag(smoothing)
    out = nystrom.build(jnp.asarray(F), jnp.asarray(smoothing))(jnp.asarray(r))
    assert rel(out, np.linalg.solve(P, r)) < 1e-8


@pytest.mark.optimized                   # 18 s optimized, 22 s not (alone)
def test_nystrom_iterations_nearly_independent_of_n(rng, monkeypatch):
    """Iterations to 1e-8 with the Nystrom preconditioner as N grows 10x:
    the rank grows instead, with the kernel matrix's eigenvalues above the
    smoothing, and the count stays under the bound its stopping rule sets
    (a preconditioned condition number below 10^4: 4-20 steps seen, where
    the trace crosses the target deciding within that range; direct sums:
    this measures the preconditioner)."""
    monkeypatch.setattr(system, "DIRECT_PAIRS", 2 ** 40)
    counts, ranks = {}, {}
    for n in (600, 6000):
        y = sites("uniform", n, rng, 2)
        it = jfmm.RBFInterpolator(y, values(y, rng), kernel="gaussian", epsilon=6.0,
                                  smoothing=1e-6, method="krylov", preconditioner="nystrom",
                                  tol=1e-8)
        assert it.preconditioner == "nystrom"
        counts[n], ranks[n] = int(it.iterations), it.rank
    print("iterations", counts, "ranks", ranks)
    assert max(counts.values()) <= 30 and ranks[6000] >= ranks[600]


def test_krylov_clustered_sites(rng, small_levels):
    """Clusters of three widths: more iterations (about 40 against 10 on
    uniform sites), the same agreement."""
    y = sites("cluster", 1500, rng, 3)
    d = values(y, rng)
    x = sites("cluster", 200, rng, 3)
    ours = jfmm.RBFInterpolator(y, d, kernel="linear", method="krylov", maxiter=120)
    ref = ScipyRBF(y, d, kernel="linear")(x)
    assert rel(ours(x), ref) < 1e-7


def test_new_draws_along_lines_reuse_the_solve(rng, small_levels):
    """Points along lines: the coarse levels' and subdomains' numbers vary
    from draw to draw (ties split unevenly); rounded up to buckets, with
    ghost points, draws of other counts in the same buckets have the same
    shapes (so they compile nothing) and still match scipy. (Counts on
    either side of a bucket's edge, 64 subdomains and 66, compile anew.)"""
    def draw():
        heads = rng.random((30, 2))
        y = np.concatenate([heads[rng.integers(0, 30, 1500)], rng.random((1500, 1))], axis=1)
        return y, values(y, rng)

    def shapes(it):
        leaves, structure = jax.tree_util.tree_flatten(it._levels)
        return structure, [np.shape(a) for a in leaves]

    def real(it):
        return [(int(np.sum(lev.members >= 0)), int(np.sum(lev.cores[:, 0] < len(lev.members))))
                for lev in it._levels if lev.cores is not None]

    fits, pair = [], None
    for _ in range(8):
        y, d = draw()
        it = jfmm.RBFInterpolator(y, d, kernel="linear", method="krylov")
        pair = next((f for f in fits if shapes(f) == shapes(it) and real(f) != real(it)), None)
        if pair is not None:
            break
        fits.append(it)
    assert pair is not None             # two draws of other counts, one bucket
    assert any(np.any(lev.members < 0) for lev in it._levels)          # ghosts
    x = rng.random((200, 3))
    assert rel(it(x), ScipyRBF(y, d, kernel="linear")(x)) < 1e-7


@pytest.mark.crossover
def test_solver_sums_follow_the_crossover(rng, monkeypatch):
    """Above DIRECT_PAIRS the backend's measured crossover decides between
    the direct sum and an FMM plan: 4,200 points to themselves (1.8e7
    pairs) sum directly at eps 1e-7 on the CPU, exactly (a numpy sum), and
    with no crossover measured they take a plan."""
    from jfmm import configure

    n = 4200
    assert n * n > system.DIRECT_PAIRS
    y = sites("cluster", n, rng, 3)
    q = rng.random(n) - 0.5
    k = kernel_for("linear", 1.0)
    pts = jnp.asarray(y)
    direct = system.pair_sum(pts, pts, k, 1e-7)
    assert direct.plan is None
    r = np.sqrt(np.sum((y[:, None, :] - y[None, :, :]) ** 2, axis=-1))
    assert rel(direct(jnp.asarray(q)), -r @ q) < 1e-13
    monkeypatch.setattr(configure, "DIRECT_PAIRS", {"cpu": {}, "gpu": {}})
    assert system.pair_sum(pts, pts, k, 1e-7).plan is not None


def test_coarse_levels_sum_in_float32(rng, small_levels):
    """Below the top level the direct sums only precondition and run in
    float32 (`system.COARSE`), to float32's rounding of a numpy sum; the
    top level's sums stay in the points' dtype, and the fit reaches its
    tol."""
    y = sites("cluster", 1300, rng, 3)
    ours = jfmm.RBFInterpolator(y, values(y, rng), kernel="linear", method="krylov",
                                tol=1e-10)
    levels = ours._levels
    assert len(levels) >= 3 and levels[0].own.work is None and levels[0].down.work is None
    assert ours.residual <= 1e-10
    coarse = levels[1].own
    assert coarse.plan is None and coarse.work == "float32"
    pts = np.asarray(coarse.sources)
    q = rng.random(pts.shape[0]) - 0.5
    r2 = np.sum((pts[:, None, :] - pts[None, :, :]) ** 2, axis=-1)
    want = -np.sqrt(r2) @ q
    got = coarse(jnp.asarray(q))
    assert got.dtype == jnp.float64 and 1e-9 < rel(got, want) < 1e-5


@pytest.mark.crossover
def test_solver_sums_weigh_the_order_the_plan_takes(rng, monkeypatch):
    """The crossover scales with the order the plan would take, not the
    one eps alone gives: with a crossover measured at order 6 just below
    these pairs, the order eps 1e-9 takes on these points (higher) makes
    the direct sum cheaper, exactly (a numpy sum), and order 6 does not.
    The sum keeps that order for the sums that come after it."""
    from jfmm import configure

    n, eps = 3000, 1e-9
    y = sites("cluster", n, rng, 3)
    k = kernel_for("linear", 1.0)
    monkeypatch.setattr(system, "DIRECT_PAIRS", 0)
    monkeypatch.setattr(configure, "DIRECT_PAIRS",
                        {"cpu": {("chebyshev", 3, "float64"): (n * n / 2, 1e-6, 6)}})
    assert not system.direct(k, 3, np.float64, n, n, eps)          # by eps alone
    assert not system.direct(k, 3, np.float64, n, n, eps, order=6)
    pts = jnp.asarray(y)
    order = configure.resolve_eager(pts, None, k, eps, None, None, "chebyshev",
                                    gradient=False).order
    assert order > 6 and system.direct(k, 3, np.float64, n, n, eps, order=order)
    summed = system.pair_sum(pts, pts, k, eps)
    assert summed.plan is None and summed.order == order
    q = rng.random(n) - 0.5
    r = np.sqrt(np.sum((y[:, None, :] - y[None, :, :]) ** 2, axis=-1))
    assert rel(summed(jnp.asarray(q)), -r @ q) < 1e-13


def test_krylov_with_fmm_sums(rng):
    """Above 2^24 pairs every sum is an FMM plan: agreement to the tol asked
    for (1e-6 residual with FMM eps 1e-7), with the backend's own extended
    sets (`system.EXTENDED`)."""
    n = 4200
    y = sites("uniform", n, rng, 3)
    d = values(y, rng)
    x = rng.random((4096, 3))
    ours = jfmm.RBFInterpolator(y, d, kernel="thin_plate_spline", tol=1e-6, method="krylov")
    assert ours._levels[0].own.plan is not None
    assert ours._levels[0].ext.shape[1] == system.EXTENDED[jax.default_backend()]
    ref = ScipyRBF(y, d, kernel="thin_plate_spline")(x)
    assert rel(ours(x), ref) < 1e-5


def test_iterations_nearly_independent_of_n(rng, monkeypatch, small_levels):
    """Iterations to 1e-8 as N grows 10x, both multilevel (direct sums:
    this measures the preconditioner, not the FMM)."""
    monkeypatch.setattr(system, "DIRECT_PAIRS", 2 ** 40)
    counts = {}
    for n in (400, 4000):
        y = sites("uniform", n, rng, 2)
        counts[n] = int(jfmm.RBFInterpolator(y, values(y, rng), kernel="linear",
                                             method="krylov").iterations)
    print("iterations", counts)
    assert counts[4000] <= 2 * counts[400]


def _validation_gradients(y, d, xv, fv, **opts):
    """jax.grad of a validation loss of a fit with respect to (epsilon,
    smoothing), the data values and the evaluation points, and the loss."""
    it = jfmm.RBFInterpolator(y, d, kernel="gaussian", epsilon=6.0, smoothing=1e-3, **opts)

    def loss(p, dd, x):
        return jnp.mean((it.fit(d=dd, epsilon=p[0], smoothing=p[1])(x) - fv) ** 2)
    p = jnp.asarray([6.0, 1e-3])
    return it, jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(p, d, xv), jax.jit(loss), p


def test_dense_gradients_against_finite_differences(rng):
    """The dense solve's gradients (autodiff through its Cholesky
    factorization) against central differences of its loss, which a
    dense solve evaluates to rounding."""
    y = sites("uniform", 300, rng, 3)
    d = jnp.asarray(values(y, rng))
    xv = jnp.asarray(rng.random((60, 3)))
    fv = jnp.asarray(values(np.asarray(xv), rng))
    _, (g_p, g_d, g_x), loss, p = _validation_gradients(y, d, xv, fv, method="dense")
    for i in range(2):
        h = 1e-5 * p[i]
        fd = (loss(p.at[i].add(h), d, xv) - loss(p.at[i].add(-h), d, xv)) / (2 * h)
        assert abs(g_p[i] - fd) <= 1e-5 * abs(fd)
    e = jnp.asarray(rng.normal(size=y.shape[0]))
    fd = (loss(p, d + 1e-5 * e, xv) - loss(p, d - 1e-5 * e, xv)) / 2e-5
    assert abs(g_d @ e - fd) <= 1e-5 * abs(fd)
    e = jnp.asarray(rng.normal(size=xv.shape))
    fd = (loss(p, d, xv + 1e-6 * e) - loss(p, d, xv - 1e-6 * e)) / 2e-6
    assert abs(jnp.sum(g_x * e) - fd) <= 1e-5 * abs(fd)


@pytest.mark.parametrize("preconditioner", ["schwarz", "nystrom"])
def test_krylov_gradients_against_the_dense_solve(preconditioner, rng, small_levels):
    """The Krylov solve's implicit gradients (one adjoint solve) against
    autodiff through the dense LU solve of the same system. (Finite
    differences of the Krylov loss are no reference: each solve stops at its
    own residual, and that noise over a step of 1e-8 in the smoothing
    reached 4e-5 of the derivative.)"""
    y = sites("uniform", 300, rng, 3)
    d = jnp.asarray(values(y, rng))
    xv = jnp.asarray(rng.random((60, 3)))
    fv = jnp.asarray(values(np.asarray(xv), rng))
    _, ref, _, _ = _validation_gradients(y, d, xv, fv, method="dense")
    it, grads, _, _ = _validation_gradients(y, d, xv, fv, method="krylov", tol=1e-12,
                                            preconditioner=preconditioner,
                                            rank=256 if preconditioner == "nystrom" else None)
    assert it.preconditioner == preconditioner
    for g, r in zip(grads, ref):
        assert rel(g, r) < 1e-7


def test_pytree_jit_and_complex_values(rng):
    y = sites("uniform", 200, rng, 2)
    d = values(y, rng) + 1j * values(y, rng)[::-1]
    x = rng.random((50, 2))
    ours = jfmm.RBFInterpolator(y, d, kernel="cubic")
    out = jax.jit(lambda it, x: it(x))(ours, x)
    assert jnp.iscomplexobj(out)
    assert rel(out, ScipyRBF(y, d, kernel="cubic")(x)) < 1e-7
    leaves, tree = jax.tree_util.tree_flatten(ours)
    again = jax.tree_util.tree_unflatten(tree, leaves)
    np.testing.assert_array_equal(again(x), ours(x))
    np.testing.assert_array_equal(ours(x[:37]), ours(x)[:37])    # targets padded to a size
    assert ours(x[:0]).shape == (0,) and jnp.iscomplexobj(ours(x[:0]))


def test_float32(rng):
    """float32 inputs give a float32 interpolant at float32 accuracy."""
    y = sites("uniform", 500, rng, 3).astype(np.float32)
    d = values(y, rng).astype(np.float32)
    x = rng.random((100, 3)).astype(np.float32)
    ours = jfmm.RBFInterpolator(y, d, kernel="gaussian", epsilon=5.0, smoothing=1e-4)
    out = ours(x)
    assert out.dtype == jnp.float32
    ref = ScipyRBF(y.astype(np.float64), d, kernel="gaussian", epsilon=5.0,
                   smoothing=1e-4)(x.astype(np.float64))
    assert rel(out, ref) < 1e-3
    # The Nystrom-preconditioned Krylov solve in float32 (tol 1e-4, FMM eps
    # 2e-5; condition number ~1e5, so about 1e-3 from the float64 solution),
    # with the third positive definite kernel.
    y = sites("cluster", 1500, rng, 3).astype(np.float32)
    d = values(y, rng).astype(np.float32)
    ours = jfmm.RBFInterpolator(y, d, kernel="inverse_quadratic", epsilon=3.0,
                                smoothing=1e-3, method="krylov")
    assert ours.preconditioner == "nystrom" and ours(x).dtype == jnp.float32
    ref = ScipyRBF(y.astype(np.float64), d, kernel="inverse_quadratic", epsilon=3.0,
                   smoothing=1e-3)(x.astype(np.float64))
    assert rel(ours(x), ref) < 5e-3


def test_unconverged_solve_is_loud(rng, small_levels):
    y = sites("uniform", 300, rng, 3)
    d = values(y, rng)
    with pytest.raises(RuntimeError, match="did not converge") as failed:
        jfmm.RBFInterpolator(y, d, kernel="thin_plate_spline", method="krylov", maxiter=2)
    # Only the remedies that apply: no duplicates, not a flat kernel, far from tol.
    said = str(failed.value)
    assert "method='dense' (300 points" in said
    assert not any(w in said for w in ("repeated", "flat kernels", "fmm_eps", "maxiter"))
    with pytest.raises(RuntimeError, match="Nystrom preconditioner of rank 128.*rank="):
        jfmm.RBFInterpolator(y, d, kernel="gaussian", epsilon=3.0, smoothing=1e-6,
                             method="krylov", preconditioner="nystrom", rank=100, maxiter=2)
    it = jfmm.RBFInterpolator(y, d, kernel="thin_plate_spline", method="krylov", tol=1e-4,
                              maxiter=50)
    short = jax.tree_util.tree_map(lambda v: v, it)
    short._static = short._static._replace(settings=short._static.settings._replace(maxiter=1))
    out = jax.jit(lambda it, d: it.fit(d=d)(y[:5]))(short, d)
    assert np.all(np.isnan(out))


def test_failed_krylov_solve_falls_back_to_dense(rng, small_levels, monkeypatch):
    """method='auto' above the dense size: where the Krylov solve fails and
    the matrix fits, the constructor warns and solves densely (scipy's
    answer); an explicit method='krylov' raises instead."""
    monkeypatch.setattr(interpolator, "DENSE_MAX_CPU", 200)
    monkeypatch.setattr(interpolator, "DENSE_MAX", 200)
    y, x = sites("uniform", 300, rng, 3), rng.random((50, 3))
    d = values(y, rng)
    with pytest.warns(RuntimeWarning, match="solving the 300 x 300 system densely"):
        ours = jfmm.RBFInterpolator(y, d, kernel="thin_plate_spline", maxiter=2)
    assert ours.method == "dense"
    assert rel(ours(x), ScipyRBF(y, d, kernel="thin_plate_spline")(x)) < 1e-10
    monkeypatch.setattr(interpolator, "DENSE_FALLBACK_MAX", 299)
    with pytest.raises(RuntimeError, match="did not converge") as failed:
        jfmm.RBFInterpolator(y, d, kernel="thin_plate_spline", maxiter=2)
    assert "method='dense'" not in str(failed.value)


@pytest.mark.parametrize("method", ["dense", "krylov"])
def test_duplicate_points_without_smoothing(method, rng, small_levels):
    """Duplicates with smoothing 0: dense raises like scipy; the Krylov
    solve interpolates or raises where the duplicates carry equal values
    (a consistent singular system) and raises where they do not."""
    y = sites("uniform", 400, rng, 2)
    y[10] = y[20]
    d = values(y, rng)
    if method == "krylov":
        try:
            same = jfmm.RBFInterpolator(y, d, kernel="linear", method=method, maxiter=60)
        except RuntimeError:
            pass                                  # a Krylov breakdown, reported
        else:
            np.testing.assert_allclose(same(y[:30]), d[:30], atol=1e-6)
    d[10] += 0.1
    err, says = ((np.linalg.LinAlgError, "duplicate") if method == "dense"
                 else (RuntimeError, "remove the 1 repeated data points"))
    with pytest.raises(err, match=says):
        jfmm.RBFInterpolator(y, d, kernel="linear", method=method, maxiter=40)
    ok = jfmm.RBFInterpolator(y, d, kernel="linear", smoothing=1e-6, method=method)
    assert np.all(np.isfinite(np.asarray(ok(y[:5]))))


def test_scipy_errors_and_warnings(rng):
    y = rng.random((30, 2))
    d = rng.random(30)
    with pytest.raises(ValueError, match="`kernel` must be one of"):
        jfmm.RBFInterpolator(y, d, kernel="nope")
    with pytest.raises(ValueError, match="`epsilon` must be specified"):
        jfmm.RBFInterpolator(y, d, kernel="gaussian")
    with pytest.raises(ValueError, match="at least -1"):
        jfmm.RBFInterpolator(y, d, degree=-2)
    with pytest.warns(UserWarning, match="should not be below 1"):
        jfmm.RBFInterpolator(y, d, degree=0, smoothing=1e-3)
    with pytest.raises(ValueError, match="At least 10 data points"):
        jfmm.RBFInterpolator(y[:8], d[:8], degree=3)
    with pytest.raises(ValueError, match="first axis of `d`"):
        jfmm.RBFInterpolator(y, d[:29])
    with pytest.raises(ValueError, match="smoothing"):
        jfmm.RBFInterpolator(y, d, smoothing=np.ones(3))
    with pytest.raises(ValueError, match="preconditioner must be"):
        jfmm.RBFInterpolator(y, d, method="krylov", preconditioner="jacobi")
    with pytest.raises(ValueError, match="positive definite kernel"):
        jfmm.RBFInterpolator(y, d, kernel="linear", method="krylov", preconditioner="nystrom")
    with pytest.raises(ValueError, match="smoothing > 0"):
        jfmm.RBFInterpolator(y, d, kernel="gaussian", epsilon=1.0, method="krylov",
                             preconditioner="nystrom")
    with pytest.raises(ValueError, match="rank must be"):
        jfmm.RBFInterpolator(y, d, kernel="gaussian", epsilon=1.0, smoothing=1e-3,
                             method="krylov", preconditioner="nystrom", rank=0)
    with pytest.raises(ValueError, match="At least 3 data points"):
        jfmm.RBFInterpolator(y, d, neighbors=2)
    with pytest.raises(ValueError, match="method must be"):
        jfmm.RBFInterpolator(y, d, method="local")
    with pytest.raises(ValueError, match="`x` must be a 2-dimensional array"):
        jfmm.RBFInterpolator(y, d)(y[:, 0])
    with pytest.raises(ValueError, match="NaN"):
        jfmm.RBFInterpolator(np.where(y == y[0, 0], np.nan, y), d)
    it = jfmm.RBFInterpolator(y, d)
    with pytest.raises(ValueError, match="second axis of `x`"):
        it(rng.random((5, 3)))
    with pytest.raises(TypeError, match="fit"):
        jax.grad(lambda e: jnp.sum(jfmm.RBFInterpolator(y, d, kernel="gaussian",
                                                        epsilon=e)(y)))(2.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jfmm.RBFInterpolator(y, d, kernel="linear", degree=-1)       # -1 is allowed


def line_values(y, rng):
    """Values on sites of any dimension: a smooth function of the first
    axis, a random linear part and noise-like wiggles, mixed in sign."""
    t = y @ rng.normal(size=y.shape[1])
    return np.sin(4 * t) + t * rng.normal() + 0.1 * np.cos(17 * y[:, 0])


@pytest.mark.parametrize("dim", [1, 2, 3])
def test_neighbors_match_scipy(dim, rng):
    """scipy's local interpolation (neighbors=k): each point's interpolant
    of its k nearest sites, eagerly (k-d tree) and under jit (top-k)."""
    for kind, kernel, epsilon, smoothing in [("cluster", "thin_plate_spline", None, 0.0),
                                             ("cluster", "gaussian", 3.0, 1e-3),
                                             ("uniform", "quintic", None, 0.0)]:
        # (quintic's local systems on clustered sites are too ill-conditioned
        # for two LU solves to agree to 1e-8)
        y = sites(kind, 300, rng, dim)
        d = line_values(y, rng)
        x = np.concatenate([rng.random((60, dim)), y[:10] + 1e-3])
        ours = jfmm.RBFInterpolator(y, d, neighbors=25, kernel=kernel, epsilon=epsilon,
                                    smoothing=smoothing)
        ref = ScipyRBF(y, d, neighbors=25, kernel=kernel, epsilon=epsilon,
                       smoothing=smoothing)(x)
        assert ours.neighbors == 25 and ours.method == "local"
        assert rel(ours(x), ref) < 1e-8, kernel
        if kernel == "thin_plate_spline":       # under jit: neighbours by top-k
            assert rel(jax.jit(lambda it, x: it(x))(ours, x), ref) < 1e-8
    vector = np.stack([d, -2 * d + y[:, 0]], axis=1)
    ours = jfmm.RBFInterpolator(y, vector, neighbors=12, kernel="cubic")
    first = ours(x)
    assert ours._tree() is ours._tree()                 # built once, kept
    np.testing.assert_array_equal(ours(x), first)
    assert rel(ours(x), ScipyRBF(y, vector, neighbors=12, kernel="cubic")(x)) < 1e-8
    assert jfmm.RBFInterpolator(y, d, neighbors=10 ** 6).method == "dense"   # all sites


def test_points_on_a_line_through_the_fmm(rng, small_levels, monkeypatch):
    """1-D sites: the Krylov solve and evaluation over FMM sums of the
    sites lifted into the plane, against scipy's dense solve."""
    monkeypatch.setattr(system, "DIRECT_PAIRS", 0)
    y = 3 * rng.random((500, 1))
    y[:100] = 1.5 + 0.01 * rng.random((100, 1))           # a crowded stretch
    d = line_values(y, rng)
    x = 3 * rng.random((80, 1))
    ours = jfmm.RBFInterpolator(y, d, kernel="thin_plate_spline", method="krylov", tol=1e-8)
    assert ours.y.shape == (500, 1) and ours.powers.shape == (2, 1)
    assert rel(ours(x), ScipyRBF(y, d, kernel="thin_plate_spline")(x)) < 1e-6


@pytest.mark.parametrize("kind", ["uniform", "cluster"])
def test_evaluation_through_the_fitted_field(kind, rng, monkeypatch):
    """Evaluation by the FMM sums through the data points' leaf locals,
    built once per fit (`jfmm.rbf.field`): against numpy sums of the
    coefficients inside the data's box, beyond it (the plain FMM), and
    after a refit (new coefficients, a new field)."""
    from jfmm import configure
    from jfmm.rbf import field

    monkeypatch.setattr(system, "DIRECT_PAIRS", 0)
    monkeypatch.setattr(configure, "DIRECT_PAIRS", {"cpu": {}, "gpu": {}})
    monkeypatch.setattr(field, "LEAF_SIZE", 32)
    n = 1500
    y = sites(kind, n, rng, 3)
    d = values(y, rng, 2)
    ours = jfmm.RBFInterpolator(y, d, kernel="linear", method="dense", tol=1e-4)
    eps = ours._static.fmm_eps

    def check(it, x):
        c, a = np.asarray(it._coeffs), np.asarray(it._poly)       # linear: degree 0
        far = -np.sqrt(np.sum((x[:, None, :] - y[None, :, :]) ** 2, axis=-1)) @ c
        got = np.asarray(it(x))
        assert np.linalg.norm(got - far - a) <= eps * np.linalg.norm(far)

    lo, hi = y.min(0), y.max(0)
    inside = lo + (hi - lo) * rng.random((700, 3))
    check(ours, inside)
    built = ours._field_cache
    assert isinstance(built, field.Field) and built.tree.depth >= 2
    check(ours, lo + (hi - lo) * rng.random((600, 3)))             # the same bucket
    assert ours._field_cache is built
    assert not bool(field.at(built, inside + 2 * (hi - lo))[1])
    check(ours, np.concatenate([inside[:500], lo - 0.5 * (hi - lo) * rng.random((200, 3))]))
    refit = ours.fit(d=values(y, rng, 2))
    check(refit, inside)
    assert refit._field_cache is not built
