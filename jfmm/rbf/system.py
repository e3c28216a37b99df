"""The RBF system on a hierarchy of point sets, for the Krylov solve.

The interpolation conditions (A + S) c + P a = d, P^T c = 0 are solved in
the subspace of coefficients with vanishing moments: with U an orthonormal
basis of range(P) and Pi = I - U U^T, Pi (A + S) Pi c = Pi d, then
a = (P^T P)^-1 P^T (d - (A + S) c). For the kernels at or above their
minimum polynomial degree Pi (A + S) Pi is positive definite there.

Preconditioners: the multilevel Schwarz one (`jfmm.rbf.schwarz`), or for
flat positive definite kernels with smoothing a Nystrom one
(`jfmm.rbf.nystrom`) on the data points alone.

Levels (Schwarz): level 0 holds the data points; level l + 1 a coarse
subset of level l (`schwarz.coarsen`); the last level is solved densely. Every sum
between point sets is one `PairSum`: an FMM `Plan` built once (tree,
family, order), or the direct sum where that is cheaper.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jfmm import api, configure
from jfmm._compat import Tracer
from jfmm.rbf import krylov, nystrom, schwarz

# Direct sums at or below this many pairs whatever the backend; above it
# the backend's measured crossover decides (`configure.below_crossover`).
DIRECT_PAIRS = 2 ** 24


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["plan", "sources", "targets", "kernel"],
                   meta_fields=["order", "work"])
@dataclasses.dataclass(frozen=True)
class PairSum:
    """phi(targets) = sum over sources of K(|t - s|) q: an FMM plan, or
    (plan None) the direct sum of sources (n, d) to targets (m, d). order:
    the Chebyshev order the FMM takes (or would take) for these points,
    None where none was asked for (pairs too few, or below the crossover by
    eps alone). work: the dtype a direct sum runs in (None: the points'),
    where it only preconditions (`COARSE`)."""
    plan: api.Plan | None
    sources: jax.Array
    targets: jax.Array
    kernel: object
    order: int | None = None
    work: str | None = None

    def __call__(self, q):
        if self.plan is not None:
            return self.plan.apply(q)
        if self.work is None:
            return api.direct(self.sources, q, self.targets, kernel=self.kernel)
        def cast(a):
            floating = jnp.issubdtype(jnp.result_type(a), jnp.floating)
            return jnp.asarray(a, self.work) if floating else a
        kernel = jax.tree_util.tree_map(cast, self.kernel)
        return api.direct(cast(self.sources), cast(q), cast(self.targets),
                          kernel=kernel).astype(q.dtype)

    def with_kernel(self, kernel) -> PairSum:
        plan = None if self.plan is None else dataclasses.replace(self.plan, kernel=kernel)
        return dataclasses.replace(self, plan=plan, kernel=kernel)


def pair_sum(sources, targets, kernel, eps: float, order: int | None = None,
             work: str | None = None) -> PairSum:
    """A `PairSum`, built once: the direct sum below the crossover at the
    FMM's order (in dtype `work` where given), else the FMM family
    "chebyshev" (every RBF kernel) with the order chosen for eps, or
    given."""
    n, m = sources.shape[0], targets.shape[0]
    dim, dtype = sources.shape[1], sources.dtype
    same = targets is sources
    plan, chosen = None, order
    if not direct(kernel, dim, dtype, n, m, eps, order):
        if order is None:       # the plan's own choice (remembered: the plan finds it again)
            chosen = configure.resolve_eager(sources, None if same else targets, kernel, eps,
                                             None, None, "chebyshev", gradient=False).order
        if not direct(kernel, dim, dtype, n, m, eps, chosen):
            plan = api.plan(sources, None if same else targets, kernel=kernel, eps=eps,
                            family="chebyshev", order=order)
            # Krylov vectors cancel as they will: the solve's residual, not the
            # plan's check of the charges (`configure.checked`), judges them.
            plan = dataclasses.replace(plan, check=None)
            chosen = plan.order
    return PairSum(plan, sources, targets, kernel, chosen,
                   None if plan is not None or work == jnp.dtype(sources.dtype).name else work)


def direct(kernel, dim: int, dtype, n: int, m: int, eps: float,
           order: int | None = None) -> bool:
    """Whether n sources to m targets sum directly: up to DIRECT_PAIRS
    pairs, or below the backend's crossover with the Chebyshev FMM of
    this order (None: the order eps alone gives). 2-core CPU, linear,
    float64, 2x10^4 points: the direct sum 0.50 s, the FMM 0.68 s at
    order 8 and 3.8 s at order 11."""
    return n * m <= DIRECT_PAIRS or configure.below_crossover(
        kernel, dim, dtype, n, m, eps, family="chebyshev", order=order)


class Level(NamedTuple):
    """One level of n_l points (D subdomains of n_core points, extended to
    m_ext). Arrays:
      points (n_l, d), members (n_l,) int32: their positions among the
      data points (-1 for ghosts, below), smoothing (n_l,), basis (n_l, R):
      orthonormal basis of the monomials at the points (zero rows at
      ghosts); own: PairSum of the level to itself;
      down: PairSum from the next level's points to these (None on the
      last level); sub (n_{l+1},) int32: the next level's points' positions
      here (n_l for its ghosts); cores (D, n_core), ext (D, m_ext) int32
      (sentinel n_l; rows past the subdomains' number all sentinel);
      inverse: (D, n_core, m_ext) local inverse rows, on the last level
      the dense (n_l, n_l) coefficient block of the inverse, or with the
      Nystrom preconditioner (one level) a `nystrom.Nystrom`.

    Below the top level, n_l and D are rounded up to `bucket` sizes, so
    that new points of the same number (whose median splits differ where
    coordinates tie) reuse the compiled solve: the extra points are
    ghosts, copies of a real point whose coefficients stay zero (the
    operator, the basis and the sums to them are zero there).
    """
    points: jax.Array
    members: jax.Array
    smoothing: jax.Array
    basis: jax.Array
    own: PairSum | None
    down: PairSum | None
    sub: jax.Array | None
    cores: jax.Array | None
    ext: jax.Array | None
    inverse: jax.Array | None


class Settings(NamedTuple):
    """Static solver settings (changing them recompiles). preconditioner:
    "schwarz" or "nystrom" (of `rank`, its pivots drawn from `seed`)."""
    tol: float
    maxiter: int
    preconditioner: str
    rank: int
    seed: int
    restart: int = 30
    inner: int = 8              # FGMRES steps of each coarse level's solve
    core: int = 64              # points a subdomain owns
    extended: int | None = None  # points a subdomain solves on (None: the backend's, EXTENDED)
    ratio: int = 16             # fine points per coarse point (core / ratio a power of 2)
    coarsest: int = 2000        # dense solve at or below this many points
    definite: bool = True       # kernel (conditionally) positive definite at its degree


# Points a subdomain solves on, by backend. H200: 256 let the iterations
# grow 2.7x from 10^4 to 10^6 points, 512 kept them at 5-8. 2-core CPU, a
# second constructor with 384 against 512 (a local factorization costs
# m^3): linear, 2x10^4 uniform points 6.5 s against 8.3 s (5 iterations
# both), 5x10^4 18.6 s against 21.4 s (6 both); thin-plate along 2,000
# lines, 2x10^4 points, 14.7 s against 19.3 s (8 iterations against 9);
# 256 took 6.5 s and 6 iterations at 2x10^4.
EXTENDED = {"cpu": 384, "gpu": 512}


def extended(settings: Settings) -> int:
    """The extended sets' size: the settings', or the backend's."""
    if settings.extended is not None:
        return settings.extended
    return EXTENDED["cpu" if jax.default_backend() == "cpu" else "gpu"]


# The dtype of the direct sums on the coarse levels, which only precondition
# (the top level's sums are the system's own). H200, 10^6 points, float64:
# the coarse level's solve took 188 ms of the thin-plate spline's 244 ms an
# iteration, its float64 logarithms most of it.
COARSE = "float32"


def _projector(points: np.ndarray, exponents, real: np.ndarray, dtype):
    """U (n, R) on the device, of `dtype`: an orthonormal basis of the
    monomials at the points (n, d) where `real` (n,) bool, zero rows
    elsewhere. On the host in float64 (no program to compile per level)."""
    p = np.prod(points[:, None, :] ** np.asarray(exponents)[None], axis=2) * real[:, None]
    if p.shape[1]:
        p = np.linalg.qr(p)[0]
    return jax.device_put(p.astype(dtype))


def bucket(n: int, least: int = 8) -> int:
    """n rounded up to a multiple of 2^k, k three bits below n's top bit
    (at most 1/8 more; powers of 2 stay), and of `least`: the sizes of the
    coarse levels (least 64) and of the subdomain lists. Points along
    lines vary them from one draw to the next: 2x10^4 points along 2,000
    lines in 3D had coarse levels of 132 or 144 points, 33 or 36 subdomains.
    Counts on either side of a bucket's edge still differ (64 subdomains
    or 66 of 1,500 points along 30 lines: ties only add subdomains to a
    balanced tree's power of 2), and those draws compile anew.
    """
    step = max(1 << max((n - 1).bit_length() - 3, 0), least)
    return -(-n // step) * step


def _ghosted(a: np.ndarray, size: int, fill=None) -> np.ndarray:
    """a (n, ...) continued to `size` rows with `fill`, or copies of a[0]."""
    extra = np.broadcast_to(a[:1] if fill is None else np.asarray(fill, a.dtype),
                            (size - len(a),) + a.shape[1:])
    return np.concatenate([a, extra])


def _rows(a, idx: np.ndarray):
    """a[idx] for a device array a (the smoothing, which may be traced)
    and host indices: gathered on the host where a is concrete (eager
    indexing compiled about five small programs per level and array;
    jnp.asarray of a numpy array compiles one, jax.device_put none)."""
    if isinstance(a, Tracer):
        return a[idx]
    return jax.device_put(np.asarray(a)[idx])


def hierarchy(y: np.ndarray, points, smoothing, kernel, exponents, eps: float,
              settings: Settings) -> tuple[Level, ...]:
    """The levels for data points y (n, d) (host copy, float64), their
    device copy `points` and smoothing (n,), without local inverses
    (`with_parameters` adds them). Host work: median splits, and k-NN
    queries below `schwarz.DEVICE_SEARCH` points or on the CPU."""
    idx, order, levels = np.arange(len(y)), None, []
    if settings.preconditioner == "nystrom":
        own = pair_sum(points, points, kernel, eps)
        return (Level(points, jnp.arange(len(y), dtype=jnp.int32), smoothing,
                      _projector(y, exponents, np.ones(len(y), bool), points.dtype), own,
                      *[None] * 5),)
    while True:
        here = y[idx]                   # this level's real points on the host, float64
        size = bucket(len(idx), 64) if levels else len(idx)
        ghosted = _ghosted(here, size)
        pts = jax.device_put(ghosted.astype(points.dtype))
        smooth = _rows(smoothing, _ghosted(idx, size))
        members = _ghosted(idx, size, -1)
        last = len(idx) <= settings.coarsest
        own = down = sub = cores = ext = None
        work = COARSE if levels else None   # sums below the top level precondition
        if not last or not levels:
            own = pair_sum(pts, pts, kernel, eps, order, work)
            order = own.order           # the given one, or what the first level chose
        if not last:
            groups = schwarz.padded(schwarz.median_groups(here, settings.core),
                                    settings.core, -1)
            # Both padded, so that new points of the same number coarsen by
            # the same program.
            local = schwarz.coarsen(ghosted, _ghosted(groups, bucket(len(groups)), -1),
                                    settings.core // settings.ratio)
            coarse = bucket(len(local), 64)
            sub = jax.device_put(_ghosted(local, coarse, size).astype(np.int32))
            down = pair_sum(jax.device_put(_ghosted(here[local], coarse).astype(points.dtype)),
                            pts, kernel, eps, order, work)
            cores, ext = schwarz.subdomains(here, groups, extended(settings), sentinel=size,
                                            rows=bucket(len(groups)))
        levels.append(Level(pts, jax.device_put(members.astype(np.int32)), smooth,
                            _projector(ghosted, exponents, members >= 0, points.dtype),
                            own, down, sub, cores, ext, None))
        if last:
            break
        idx = idx[local]
    return tuple(levels)


def with_kernel(levels, kernel):
    """Levels whose sums take `kernel` (the same kernel with other
    parameters)."""
    return tuple(lev._replace(own=None if lev.own is None else lev.own.with_kernel(kernel),
                              down=None if lev.down is None else lev.down.with_kernel(kernel))
                 for lev in levels)


def with_parameters(levels, kernel, smoothing, exponents, settings: Settings):
    """Levels for a kernel (new parameters) and smoothing (n,) of the data
    points: the sums take the kernel, the local inverses or the Nystrom
    factor are rebuilt (not differentiated: they only precondition)."""
    return assembled(levels, kernel, parameters(levels, kernel, smoothing, exponents,
                                                settings))


def assembled(levels, kernel, parts):
    """Levels whose sums take `kernel`, with each level's smoothing and
    inverse from `parts` (what `parameters` returns)."""
    return tuple(lev._replace(smoothing=s, inverse=inv)
                 for lev, (s, inv) in zip(with_kernel(levels, kernel), parts))


def parameters(levels, kernel, smoothing, exponents, settings: Settings):
    """Each level's smoothing and local inverses (or Nystrom factor, or
    dense inverse on the last level) for a kernel and smoothing (n,) of the
    data points: what `with_parameters` replaces, ((n_l,), inverse) pairs."""
    out = []
    frozen = jax.lax.stop_gradient(kernel)
    for lev in levels:
        smooth = smoothing[lev.members]
        s = jax.lax.stop_gradient(smooth)
        if settings.preconditioner == "nystrom":
            F, _ = nystrom.factor(frozen, lev.points, 1 / s, settings.rank,
                                  jax.random.PRNGKey(settings.seed))
            inv = nystrom.build(F, s)
        elif lev.ext is None:
            inv = schwarz.coarsest_inverse(frozen, lev.points, s, exponents, lev.members >= 0)
        else:
            inv = schwarz.local_inverses(frozen, lev.points, s, lev.ext, settings.core,
                                         exponents, definite=settings.definite)
        out.append((smooth, inv))
    return tuple(out)


def project(basis, v):
    """Pi v = v - U U^T v (v (n,))."""
    if basis.shape[1] == 0:
        return v
    return v - basis @ (basis.T @ v)


def apply(level: Level, c):
    """(A + S) c on a level, c (n_l,) (zero at its ghosts, as is the result)."""
    return jnp.where(level.members >= 0, level.own(c) + level.smoothing * c, 0)


def operator(level: Level, c):
    """Pi (A + S) Pi c."""
    basis = jax.lax.stop_gradient(level.basis)
    return project(basis, apply(level, project(basis, c)))


def precondition(levels, l: int, r, settings: Settings):
    """An approximate solution z (n_l,) of Pi (A + S) Pi z = r on level l:
    the coarse level's solution, then restricted additive Schwarz on the
    residual it leaves (multiplicative between levels)."""
    lev = jax.lax.stop_gradient(levels[l])
    if isinstance(lev.inverse, nystrom.Nystrom):
        return project(lev.basis, lev.inverse(r))
    if lev.ext is None:
        return lev.inverse @ r
    coarse = _solve_level(levels, l + 1, r.at[lev.sub].get(mode="fill", fill_value=0),
                          settings)
    here = jnp.zeros_like(r).at[lev.sub].set(coarse, mode="drop")
    r1 = r - project(lev.basis, jnp.where(lev.members >= 0, lev.down(coarse), 0)
                     + lev.smoothing * here)
    z = here
    z = z + schwarz.restricted_solves(lev.inverse, lev.cores, lev.ext, r1)
    return project(lev.basis, z)


def _solve_level(levels, l: int, r, settings: Settings):
    """Level l's problem for the residual r: dense on the last level, else
    `settings.inner` FGMRES steps preconditioned by the level below."""
    lev = jax.lax.stop_gradient(levels[l])
    if lev.ext is None:
        return lev.inverse @ r
    b = project(lev.basis, r)
    x, _ = krylov.fgmres(lambda c: operator(lev, c), b,
                         lambda v: precondition(levels, l, v, settings), tol=0.0,
                         restart=settings.inner, maxiter=settings.inner, recompute=False)
    return x


def solve(levels, d, settings: Settings):
    """Coefficients c (n,) with vanishing moments solving the projected
    system for data d (n,), and a `krylov.Convergence`."""
    top = levels[0]
    basis = jax.lax.stop_gradient(top.basis)
    return krylov.solve(lambda c: operator(top, c), project(basis, d),
                        lambda v: precondition(levels, 0, v, settings), tol=settings.tol,
                        restart=settings.restart, maxiter=settings.maxiter,
                        project=lambda v: project(basis, v))
