"""Vortex particle methods: Biot-Savart velocities, stretching and time steps.

Vortex elements at x_i with vector strengths alpha_i (3D) induce

    u(y) = -(1/4 pi) sum_i f(|y - x_i|) (y - x_i) x alpha_i,

f(r) = 1/r^3 for the singular law, a smoothed f for a vortex core of size s.
Every f is -G'(r)/r for a stream kernel G, so u is the curl of the vector
potential psi_k(y) = (1/4 pi) sum_i alpha_ik G(|y - x_i|): one `jfmm.fmm`
call with the three strength components as charge columns and
gradient="curl" gives every velocity (its near field sums the curl alone).
The velocity gradient and stretching come from the same call
differentiated along the target (`jfmm.primitive`: second derivatives of
the approximation, `jfmm.passes.hessian`; the stretching, along each
element's strength, `jfmm.passes.curl_along`); these take the FMM from
2^28 pairs on even where `jfmm.fmm` would sum all pairs (`_second_leaf`).

Cores (`smoothing=`), with f and the stream kernel G (rho = r / s):

| smoothing | f(r) | G(r) | family |
|---|---|---|---|
| "singular" | 1/r^3 | 1/r | 3D Laplace series |
| "rosenhead_moore" | (r^2 + s^2)^(-3/2) | (r^2 + s^2)^(-1/2) | Chebyshev |
| "winckelmans" | (r^2 + 5/2 s^2) (r^2 + s^2)^(-5/2) | (r^2 + 3/2 s^2) (r^2 + s^2)^(-3/2) | Chebyshev |
| "gaussian" | (1 - exp(-rho^3)) / r^3 | (1 - exp(-rho^3)) / r + Gamma(2/3, rho^3) / s | 3D Laplace series, core near field |
| "polynomial" | rho^2 / r^3 (r <= s), 1/r^3 beyond | (2 - rho) / s (r <= s), 1/r beyond | 3D Laplace series, core near field |

("polynomial" is the compact smoothing of Hu, Gumerov and Duraiswami with
c = 1; Gamma(a, x) is the upper incomplete gamma function.) Each G goes
through `jfmm.fmm` with eps, so the far field is held within eps by that
family's error model (`jfmm.configure.resolve`): eps bounds the relative L2
error of grad psi, of which u is a signed sum of components, within the
limits `jfmm.fmm` states (float32 Chebyshev gradients on deep trees: a
level fewer, or an error where eps is below their rounding; traced
points, as in `step`, get orders from a rule for any points). The last
two cores are 1/r beyond a distance R (s, and for the Gaussian core
where G'' is 2/r^3 to eps/10: (1 + 3x/2) exp(-x) < eps/10, x = (R/s)^3;
`Kernel.laplace_beyond`): the spherical-harmonic
series carry their far field and the near field sums G itself, on leaves
no smaller than R, at eps times the ratio of the sums' norms to 1/r's
(`jfmm.configure.core_ratio`: a core makes them smaller). Points known
when the sum is set up take fewer levels where needed and their own
ratio; for traced points (`step` under jit) the series assume a ratio of
0.1; where the points' ratio is smaller, series at a ratio of 0.01 sum
them (where all pairs would number 2^32 or more: crowded elements' ratios
fall as they grow), and all pairs where the leaves come out smaller than
R or the ratio smaller still (`jfmm.configure.series_fit`; each is
compiled).
Pairs at distance 0 are left out: the singular law's self
term, and a smoothed core's own term, which is 0 for u and, in the velocity
gradient, the antisymmetric -f(0)/(4 pi) [alpha]x, which does not stretch.

In 2D, point vortices with circulations Gamma_i move with
u(y) = (1/2 pi) sum_i Gamma_i z x (y - x_i) / |y - x_i|^2 (`velocity_2d`),
from the 2D Laplace family.
"""
from __future__ import annotations

import math
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import gammaincc

from jfmm import api, configure
from jfmm._compat import Tracer
from jfmm.kernels import Kernel, Laplace2D, Laplace3D, _pytree_dataclass
from jfmm.models import Unreachable
from jfmm.models import laplace3d as laplace3d_model
from jfmm.ops import p2p

__all__ = ["CORES", "State", "energy", "impulse", "step", "stream_kernel", "stretching", "velocity",
           "velocity_2d"]

CORES = ("singular", "rosenhead_moore", "winckelmans", "gaussian", "polynomial")
_GAMMA_2_3 = math.gamma(2.0 / 3.0)


@_pytree_dataclass
class RosenheadMoore(Kernel):
    """G(r) = 1 / sqrt(r^2 + core^2), the Rosenhead-Moore stream kernel."""
    core: float = 1.0

    def radial(self, r):
        return jax.lax.rsqrt(r * r + self.core * self.core)

    def from_r2(self, r2, gradient: bool):
        inv = jax.lax.rsqrt(r2 + self.core * self.core)
        return inv, (-inv * inv * inv if gradient else None)


@_pytree_dataclass
class Winckelmans(Kernel):
    """G(r) = (r^2 + 3/2 core^2) / (r^2 + core^2)^(3/2), the stream kernel of
    Winckelmans and Leonard's high-order algebraic core."""
    core: float = 1.0

    def radial(self, r):
        return self.from_r2(r * r, False)[0]

    def from_r2(self, r2, gradient: bool):
        s2 = self.core * self.core
        inv = jax.lax.rsqrt(r2 + s2)
        inv3 = inv * inv * inv
        return (r2 + 1.5 * s2) * inv3, (-(r2 + 2.5 * s2) * inv3 * inv * inv
                                        if gradient else None)


def _one_minus_exp_over(x):
    """(1 - exp(-x)) / x for x >= 0, smooth at 0 (double where: autodiff-safe)."""
    small = x < 1e-3
    xs = jnp.where(small, 1.0, x)
    return jnp.where(small, 1 - x / 2 + x * x / 6 - x * x * x / 24, -jnp.expm1(-xs) / xs)


@_pytree_dataclass
class GaussianCore(Kernel):
    """G(r) = (1 - exp(-rho^3)) / r + Gamma(2/3, rho^3) / core, rho = r / core:
    the stream kernel whose velocity factor is (1 - exp(-rho^3)) / r^3.
    Its value needs the incomplete gamma function, which the Pallas near
    field does not lower: its near field runs in jnp."""
    pallas: ClassVar[bool] = False
    core: float = 1.0

    def radial(self, r):
        rho = r / self.core
        x = rho ** 3
        # d/dx Gamma(2/3, x) is infinite at 0: guarded so autodiff stays finite
        pos = x > 0
        upper = jnp.where(pos, gammaincc(2.0 / 3.0, jnp.where(pos, x, 1.0)), 1.0)
        return (rho * rho * _one_minus_exp_over(x) + _GAMMA_2_3 * upper) / self.core

    def laplace_beyond(self, tol: float):
        # With x = rho^3, |G - 1/r| r and |G' + 1/r^2| r^2 are at most
        # exp(-x) (Gamma(2/3, x) <= x^(-1/3) exp(-x)) and |G'' - 2/r^3| r^3 / 2
        # is (1 + 3x/2) exp(-x): the x where that falls to tol, by fixed point.
        if isinstance(self.core, Tracer):
            return None
        x = math.log(1 / tol)
        for _ in range(20):
            x = math.log((1 + 1.5 * x) / tol)
        return float(self.core) * x ** (1 / 3)

    def from_r2(self, r2, gradient: bool):
        k = self.radial(jnp.sqrt(r2))
        if not gradient:
            return k, None
        s = self.core
        x = (r2 / (s * s)) ** 1.5
        return k, -_one_minus_exp_over(x) / (s * s * s)


@_pytree_dataclass
class PolynomialCore(Kernel):
    """G(r) = (2 - r / core) / core inside the core, 1 / r beyond: the stream
    kernel of the compact smoothing (r / core)^2 / r^3 (c = 1)."""
    core: float = 1.0

    def radial(self, r):
        return self.from_r2(r * r, False)[0]

    def laplace_beyond(self, tol: float):
        return None if isinstance(self.core, Tracer) else float(self.core)

    def from_r2(self, r2, gradient: bool):
        s = self.core
        inside = r2 < s * s
        inv = jax.lax.rsqrt(jnp.where(r2 > 0, r2, s * s))
        k = jnp.where(inside, (2 - r2 * inv / s) / s, inv)
        if not gradient:
            return k, None
        return k, jnp.where(inside, -inv / (s * s), -inv * inv * inv)


def stream_kernel(smoothing: str = "singular", core=0.0) -> Kernel:
    """The stream kernel G of a core (see the module docstring)."""
    if smoothing not in CORES:
        raise ValueError(f"smoothing must be one of {CORES}, got {smoothing!r}")
    known = not isinstance(core, Tracer)
    if smoothing == "singular":
        if known and np.any(np.asarray(core) != 0):
            raise ValueError(f"the singular law has no core; got core={core} "
                             "(choose a smoothing, e.g. 'rosenhead_moore')")
        return Laplace3D()
    if known and not np.all(np.asarray(core) > 0):
        raise ValueError(f"smoothing {smoothing!r} needs a core size > 0, got {core}")
    return {"rosenhead_moore": RosenheadMoore, "winckelmans": Winckelmans,
            "gaussian": GaussianCore, "polynomial": PolynomialCore}[smoothing](core)


def _check(sources, strengths, targets, dim: int):
    sources = jnp.asarray(sources)
    strengths = jnp.asarray(strengths)
    if sources.ndim != 2 or sources.shape[1] != dim:
        raise ValueError(f"sources must have shape (N, {dim}), got {sources.shape}")
    want = (sources.shape[0], 3) if dim == 3 else (sources.shape[0],)
    if strengths.shape != want:
        raise ValueError(f"strengths must have shape {want}, got {strengths.shape}")
    if targets is not None:
        targets = jnp.asarray(targets)
        if targets.ndim != 2 or targets.shape[1] != dim:
            raise ValueError(f"targets must have shape (M, {dim}), got {targets.shape}")
    return sources, strengths, targets


def _and_gradient(f, y):
    """f(y) (M, k) of a function of each target alone, and its derivative
    (M, k, d) with respect to that target: forward mode along the d axes."""
    eye = jnp.eye(y.shape[1], dtype=y.dtype)
    v, dv = jax.vmap(lambda e: jax.jvp(f, (y,), (jnp.broadcast_to(e, y.shape),)),
                     out_axes=(None, 0))(eye)
    return v, jnp.moveaxis(dv, 0, -1)


# Second derivatives of the sums (velocity gradient, stretching) err
# several times more than the first: CPU, 800 points in a box, compact
# core, eps 1e-6, sums at eps / 2.5: stretching 0.28-0.73e-6 against
# velocity 0.03-0.19e-6 over 12 draws. Their sums run at eps / 5, or at
# the family's floor, or what its estimate reaches, where that is higher.
_SECOND = 5.0
# Below _SECOND_TAIL pairs (N M) the factor grows like the 3D Laplace
# series' tail (`laplace3d._error_bound`: one pair near facing corners sets
# the error, and its share falls like 1 / sqrt(sqrt(N M))): boxes of 0.1
# with core 0.02 on the FMM, eps 1e-6 at eps / 5, stretching up to 1.09 eps
# at 4,096 points (H200, 8 draws; 0.50 eps at eps / 10) and 1.13 eps at
# 1,200 (CPU, eps 1e-4, one draw in about 30), against 0.35 eps at 2^18.
_SECOND_TAIL = 2.0 ** 30


# Second derivatives over all pairs cost several times their gradients
# (the Hessian terms of three columns), so where `jfmm.fmm` would sum all
# pairs (below its crossover, measured for gradients) they take the FMM
# on leaves of _SECOND_LEAF points from _SECOND_PAIRS pairs on: H200,
# float64, two rings of 2^15 elements (core 0.02, eps 1e-6), stretching
# 17.4 ms at depth 3 against 26.5 over all pairs (leaves of 4-16 points,
# depth 4: 39.6 ms).
_SECOND_PAIRS, _SECOND_LEAF = 2 ** 28, 32
# Above the crossover the series' leaves are _SECOND_WEIGHT times smaller
# than a gradient's (`laplace3d.leaf_size` of the order): their near field
# runs twice (the gradient and its derivative) against one far field. H200,
# float64, eps 1e-6, compact core 0.02, stretching of 2^18 elements, depth
# 4 against the gradient's 3: rings 126 against 155 ms, a cube 89 against
# 116; 2^21 on a cube, depth 5 against 4: 869 against 1,063 ms.
_SECOND_WEIGHT = 2.5


def _second_leaf(leaf_size, kernel, eps, sources, targets):
    """The leaf size of a second-derivative sum: the caller's, or
    _SECOND_LEAF where `jfmm.fmm` would sum at least _SECOND_PAIRS pairs
    directly, or for the 3D Laplace series the leaf of its order over
    _SECOND_WEIGHT."""
    n, m = sources.shape[0], (sources if targets is None else targets).shape[0]
    if leaf_size is not None or n * m < _SECOND_PAIRS:
        return leaf_size
    eps_ = configure.default_eps(kernel, 3, sources.dtype) if eps is None else eps
    if configure.below_crossover(kernel, 3, sources.dtype, n, m, eps_):
        return _SECOND_LEAF
    made = []                           # the configuration of traced points of these shapes
    try:
        jax.eval_shape(lambda s, t: made.append(configure.resolve(s, t, kernel, eps_, None, None,
                                                                  "auto")), sources, targets)
    except ValueError:                  # the sum raises it, or retries (`_grad_psi`)
        return None
    if made[0].name != "laplace3d":
        return None
    return max(1, round(laplace3d_model.leaf_size(made[0].order) / _SECOND_WEIGHT))


def _second(eps, kernel, dtype, dim=3, pairs=None):
    """The eps of a sum whose second derivatives must meet eps, over `pairs`
    (N M; None: a set large enough for _SECOND alone)."""
    if eps is None:
        return None
    least = configure.floor(kernel, dim, dtype)
    tail = 1.0 if pairs is None else max(1.0, (_SECOND_TAIL / pairs) ** 0.25)
    return eps if eps <= least else max(eps / (_SECOND * tail), least)


def _grad_psi(sources, strengths, targets, kernel, eps, leaf_size, loosest=None,
              curl=False):
    """grad psi (M, 3, 3) with [m, k, j] = d psi_k / d y_j at the targets,
    or (curl) its curl u (M, 3) alone (`jfmm.fmm`'s gradient="curl"): at
    eps, or where the family's estimate does not reach it (`Unreachable`),
    at 1.5 times what it reaches, up to `loosest`."""
    def grad(eps):
        if curl:
            return api.fmm(sources, strengths, targets, kernel, eps, gradient="curl",
                           leaf_size=leaf_size) / (4 * jnp.pi)
        return api.fmm(sources, strengths, targets, kernel, eps, gradient=True,
                       leaf_size=leaf_size)[1] / (4 * jnp.pi)
    try:
        return grad(eps)
    except Unreachable as e:
        if loosest is None or e.reachable is None or 1.5 * e.reachable > loosest:
            raise
        return grad(1.5 * e.reachable)


def velocity(sources, strengths, targets=None, *, core=0.0, smoothing="singular", eps=None,
             gradient=False, leaf_size=None):
    """Biot-Savart velocity of vortex elements (3D).

    sources (N, 3) element positions; strengths (N, 3) vector strengths
    alpha_i (circulation times length); targets (M, 3), or None for the
    elements themselves. core: the core size s (0 for "singular");
    smoothing: one of `CORES` (module docstring: f, G and the family each
    uses); eps: the requested relative L2 error of the velocity's
    ingredients, as `jfmm.fmm` (None: its default for the dtype);
    leaf_size: as `jfmm.fmm`.

    Returns u (M, 3); with gradient=True also the velocity gradient (M, 3, 3)
    with [m, i, j] = d u_i / d y_j, from the FMM's second derivatives
    (`jfmm.primitive`, `jfmm.passes.hessian`; on a GPU the time of
    several velocity sums: docs/BENCHMARKS.md, "Vortex methods").
    That sum runs at eps / 5 (lower below 2^30 pairs, where one pair's
    error weighs more: `_second`), which keeps the second derivatives within
    eps too (with eps=None, or where the family's floor
    (`jfmm.configure.floor`) or its estimate for the points stops above
    that, the sum runs at the default or there, and they may err several
    times more).
    jit-able (eps and smoothing static) and differentiable (through
    `jfmm.fmm`'s rules).
    """
    sources, strengths, targets = _check(sources, strengths, targets, 3)
    kernel = stream_kernel(smoothing, core)
    if not gradient:
        return _grad_psi(sources, strengths, targets, kernel, eps, leaf_size, curl=True)
    second = _second(eps, kernel, sources.dtype,
                     pairs=sources.shape[0] * (sources if targets is None else targets).shape[0])
    leaf_size = _second_leaf(leaf_size, kernel, second, sources, targets)
    return _and_gradient(lambda t: p2p.curl(_grad_psi(sources, strengths, t, kernel, second,
                                                      leaf_size, eps)),
                         sources if targets is None else targets)


def stretching(sources, strengths, *, core=0.0, smoothing="singular", eps=None,
               leaf_size=None):
    """Velocity u (N, 3) at the elements and their stretching (alpha_n . grad) u
    (N, 3): d alpha / dt of the classical scheme. One FMM sum of the curl
    (`jfmm.fmm`'s gradient="curl") differentiated along each element's own
    strength, at eps / 5 or lower (as `velocity`): its near field sums
    three terms a pair from the kernel's second derivatives and its far
    field differentiates the L2P along alpha_n (`jfmm.passes.curl_along`;
    reverse mode through it takes the second derivatives of
    `velocity(gradient=True)`)."""
    sources, strengths, _ = _check(sources, strengths, None, 3)
    kernel = stream_kernel(smoothing, core)
    second = _second(eps, kernel, sources.dtype, pairs=sources.shape[0] ** 2)
    leaf_size = _second_leaf(leaf_size, kernel, second, sources, None)
    return jax.jvp(lambda t: _grad_psi(sources, strengths, t, kernel, second, leaf_size, eps,
                                       curl=True), (sources,), (strengths.astype(sources.dtype),))


def velocity_2d(sources, circulations, targets=None, *, eps=None, gradient=False,
                leaf_size=None):
    """Point-vortex velocity in 2D: u(y) = (1/2 pi) sum_i Gamma_i z x (y - x_i) / r^2.

    sources (N, 2); circulations (N,); targets (M, 2) or None (the vortices
    themselves, self term excluded). Returns u (M, 2) and, with
    gradient=True, du (M, 2, 2) with [m, i, j] = d u_i / d y_j. The stream
    function psi = (1/2 pi) sum_i Gamma_i (-log r) comes from the 2D Laplace
    family with eps as in `jfmm.fmm`; u = (d psi/dy, -d psi/dx). du, second
    derivatives of psi, comes from a sum at eps / 5 as in `velocity`.
    """
    sources, circulations, targets = _check(sources, circulations, targets, 2)
    at = _second(eps, Laplace2D(), sources.dtype, dim=2) if gradient else eps

    def u_at(t):
        _, g = api.fmm(sources, circulations, t, Laplace2D(), at, gradient=True,
                       leaf_size=leaf_size)
        g = g / (2 * jnp.pi)
        return jnp.stack([g[:, 1], -g[:, 0]], axis=-1)

    if not gradient:
        return u_at(targets)
    return _and_gradient(u_at, sources if targets is None else targets)


class State(NamedTuple):
    """Vortex elements (positions (N, 3), strengths (N, 3)) and passive
    tracers (P, 3), possibly P = 0: the carry of `step`."""
    positions: jax.Array
    strengths: jax.Array
    tracers: jax.Array


def _rates(state: State, core, smoothing, eps, leaf_size):
    """d/dt of every field of the state: element and tracer velocities, and
    stretching."""
    u, stretch = stretching(state.positions, state.strengths, core=core, smoothing=smoothing,
                            eps=eps, leaf_size=leaf_size)
    if state.tracers.shape[0]:
        ut = velocity(state.positions, state.strengths, state.tracers, core=core,
                      smoothing=smoothing, eps=eps, leaf_size=leaf_size)
    else:
        ut = state.tracers
    return State(u, stretch, ut)


_TABLEAUX = {"euler": ((), (1.0,)),
             "rk2": (((0.5,),), (0.0, 1.0)),
             "rk4": (((0.5,), (0.0, 0.5), (0.0, 0.0, 1.0)), (1 / 6, 1 / 3, 1 / 3, 1 / 6))}


def step(state: State, dt, *, core=0.0, smoothing="singular", eps=None, scheme="rk4",
         leaf_size=None):
    """One explicit time step of the vortex particle method.

    Elements move with their velocity, strengths change by stretching
    (classical scheme, d alpha/dt = (alpha . grad) u), tracers move with
    the flow. scheme: "euler", "rk2" (midpoint) or "rk4"; each stage is one
    `stretching` sum at the elements plus one `velocity` sum at the tracers.
    A pure function of arrays: use it in `jax.lax.scan` under `jax.jit`
    (traced points use the uniform tree and the rule-based orders of
    `jfmm.fmm`), and differentiate through it. leaf_size: as `jfmm.fmm`.
    """
    if scheme not in _TABLEAUX:
        raise ValueError(f"scheme must be one of {tuple(_TABLEAUX)}, got {scheme!r}")
    rows, weights = _TABLEAUX[scheme]

    def shifted(ks, coef):         # in each field's dtype, so a scan's carry keeps it
        return jax.tree_util.tree_map(
            lambda s, *k: s + (dt * sum(c * kk for c, kk in zip(coef, k) if c)).astype(s.dtype),
            state, *ks)

    ks = [_rates(state, core, smoothing, eps, leaf_size)]
    for coef in rows:
        ks.append(_rates(shifted(ks, coef), core, smoothing, eps, leaf_size))
    return shifted(ks, weights)


def impulse(positions, strengths):
    """Linear impulse I = 1/2 sum_i x_i x alpha_i (3,): an invariant of the
    Euler equations, which vortex particles keep only as far as their
    vorticity stays divergence-free (closed, resolved filaments): a
    diagnostic, not a guarantee."""
    return 0.5 * jnp.sum(jnp.cross(positions, strengths), axis=0)


def energy(positions, strengths, *, core, smoothing="rosenhead_moore", eps=None,
           leaf_size=None):
    """Kinetic energy E = 1/2 sum_i alpha_i . psi(x_i) of a smoothed core
    (1/(8 pi) sum_ij alpha_i . alpha_j G(r_ij), self pairs included; for the
    singular law it is not defined)."""
    if smoothing == "singular":
        raise ValueError("the kinetic energy of singular vortex elements is infinite; "
                         "choose a smoothed core")
    kernel = stream_kernel(smoothing, core)
    psi = api.fmm(positions, strengths, None, kernel, eps, leaf_size=leaf_size) / (4 * jnp.pi)
    return 0.5 * jnp.sum(strengths * psi)
