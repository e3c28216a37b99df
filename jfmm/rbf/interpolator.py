# Over 400 lines: scipy's checks and errors, the pytree and fit() of one public class.
"""RBFInterpolator: scipy's interpolator, solved and evaluated with the FMM."""
from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jfmm import api, kernels
from jfmm._compat import Tracer
from jfmm.models import Unreachable
from jfmm.ops import backend, p2p
from jfmm.models.chebyshev import ROUNDING_FLOOR
from jfmm.rbf import field, local, nystrom, polynomial, schwarz, system

# Up to this many data points the system is solved densely, as scipy does;
# on the CPU up to DENSE_MAX_CPU: a second constructor at 8,000 3D points
# (thin-plate, default tol, 2-core CPU) took 2.8 s densely against the
# Krylov solve's 5.4 s, and at 12,000 9.1 against 11.9 s.
DENSE_MAX = 4096
DENSE_MAX_CPU = 8192


def _dense_max() -> int:
    return DENSE_MAX_CPU if jax.default_backend() == "cpu" else DENSE_MAX


# Where the Krylov solve of method='auto' fails, up to this many points
# the constructor solves densely instead (a float64 matrix of 2.1 GB).
DENSE_FALLBACK_MAX = 16384


@dataclasses.dataclass(frozen=True)
class Scaled(kernels.Kernel):
    """K(epsilon r) for a kernel without a shape parameter (scipy applies
    epsilon to every kernel; for these it only rescales)."""
    base: kernels.Kernel
    epsilon: float = 1.0

    @property
    def evaluates(self) -> str:
        return self.base.evaluates

    def radial(self, r):
        return self.base.radial(self.epsilon * r)

    def from_r2(self, r2, gradient: bool):
        e2 = self.epsilon * self.epsilon
        k, g = self.base.from_r2(e2 * r2, gradient)
        return k, (None if g is None else e2 * g)


jax.tree_util.register_dataclass(Scaled, data_fields=["base", "epsilon"], meta_fields=[])

# scipy's kernels: (jfmm kernel class, needs epsilon, minimum degree).
KERNELS = {
    "linear": (kernels.Linear, False, 0),
    "thin_plate_spline": (kernels.ThinPlateSpline, False, 1),
    "cubic": (kernels.Cubic, False, 1),
    "quintic": (kernels.Quintic, False, 2),
    "multiquadric": (kernels.Multiquadric, True, 0),
    "inverse_multiquadric": (kernels.InverseMultiquadric, True, -1),
    "inverse_quadratic": (kernels.InverseQuadratic, True, -1),
    "gaussian": (kernels.Gaussian, True, -1),
}
# The strictly positive definite ones (a Nystrom preconditioner needs A >= 0).
POSITIVE_DEFINITE = ("inverse_multiquadric", "inverse_quadratic", "gaussian")
# Smoothing (against K(0) = 1) from which 'auto' prefers Schwarz to a Nystrom
# factor that only loosely bounds the condition number: measured on uniform
# 3D points (docs/BENCHMARKS.md), Schwarz converged at 1e-2 for every kernel
# tried, 1.6-3x faster than such a factor, and failed at 1e-4 past 10^4 points.
SCHWARZ_SMOOTHING = 1e-3


def kernel_for(name: str, epsilon):
    """The jfmm kernel K(epsilon r) of scipy's kernel `name`."""
    cls, scaled, _ = KERNELS[name]
    return cls(epsilon) if scaled else Scaled(cls(), epsilon)


class Static(NamedTuple):
    """What does not change when parameters are traced (changing it
    recompiles)."""
    kernel: str
    degree: int
    powers: tuple
    d_shape: tuple
    complex: bool
    method: str
    fmm_eps: float
    order: int | None
    settings: system.Settings | None
    dim: int
    neighbors: int | None


def _on_device(a):
    """a as a jax array (of jax's dtype for it), host arrays by one
    device_put: jnp.asarray compiles a small program per shape."""
    if isinstance(a, jax.Array):
        return a
    a = np.asarray(a)
    return jax.device_put(a.astype(jnp.result_type(a.dtype)))


def _lift(x):
    """Points on a line as points of the plane (distances unchanged), so
    that 1-D data take the 2D sums: (n, 1) -> (n, 2); others unchanged.
    numpy arrays stay numpy."""
    if x.shape[1] != 1:
        return x
    xp = jnp if isinstance(x, jax.Array) else np
    return xp.concatenate([x, xp.zeros_like(x)], axis=1)


def _lift_powers(exponents: np.ndarray) -> np.ndarray:
    """Monomial exponents of 1-D points for their lifted copies (the
    second axis to the power 0): (R, 1) -> (R, 2); others unchanged."""
    if exponents.shape[1] != 1:
        return exponents
    return np.concatenate([exponents, np.zeros_like(exponents)], axis=1)


def _degree(degree, kernel: str, min_degree: int) -> int:
    """scipy's rule: the kernel's minimum degree (at least 0) by default;
    -1 or at least the minimum, else a warning."""
    if degree is None:
        return max(min_degree, 0)
    degree = int(degree)
    if degree < -1:
        raise ValueError("`degree` must be at least -1.")
    if -1 < degree < min_degree:
        warnings.warn(f"`degree` should not be below {min_degree} except -1 when "
                      f"`kernel` is '{kernel}'. The interpolant may not be uniquely "
                      f"solvable, and the smoothing parameter may have an "
                      f"unintuitive effect.", UserWarning, stacklevel=3)
    return degree


def _hierarchy(y: np.ndarray, points, smoothing, kernel, exponents, fmm_eps: float,
               settings, chosen: bool):
    """The Krylov solve's levels, and the FMM eps they were built for."""
    while True:
        try:
            return system.hierarchy(y, points, smoothing, kernel, exponents, fmm_eps,
                                    settings), fmm_eps
        except Unreachable as e:
            # The default below what the FMM reaches on these points (flat
            # kernels, little smoothing): its best, with a margin for new
            # evaluation points; the solve's convergence check says whether
            # that suffices.
            if not chosen or e.reachable is None or 1.5 * e.reachable <= fmm_eps:
                raise
            fmm_eps = 1.5 * e.reachable


def _default_tol(dtype, condition: float | None = None) -> float:
    """1e-8 in float64, 1e-4 in float32. With a known condition number
    (lambda_max / smoothing, the Nystrom path) float64 asks for what that
    allows, down to 1e-10: eps_64 condition / 4. The residual's rounding
    floor varies by draw: on 1,500 clustered 3D sites (Gaussian, epsilon 3,
    smoothing 1e-5, condition ~5e7) it lay between eps_64 condition / 300
    and / 17 in 25 draws, and above / 10 in one draw of CI's, where a tol
    of / 10 could not be met. Errors against scipy at new points were as
    large at / 4 as at / 10 (up to 7e-8 and 6e-8 in 40 and 25 draws): the
    conditioning, not the residual, sets them."""
    if jnp.dtype(dtype) != jnp.float64:
        return 1e-4
    if condition is None:
        return 1e-8
    return float(np.clip(np.finfo(np.float64).eps * condition / 4, 1e-10, 1e-8))


class RBFInterpolator:
    """Radial basis function interpolator, scipy's, with O(N) sums.

    Arguments, defaults, kernel names and errors are those of
    `scipy.interpolate.RBFInterpolator`:

    y (N, dim) data points (dim 1, 2 or 3; any dim for the dense solve and
    `neighbors`; points on a line are summed as points of the plane); d
    (N, ...) data values (real or complex); smoothing: float or (N,) array
    added to the diagonal;
    kernel: 'thin_plate_spline' (default), 'linear', 'cubic', 'quintic',
    'multiquadric', 'inverse_multiquadric', 'inverse_quadratic',
    'gaussian', each evaluated at epsilon r (epsilon required for the last
    four; 1 by default otherwise); degree: of the added polynomial, by
    default the kernel's minimum (linear, multiquadric 0; thin-plate,
    cubic 1; quintic 2; else 0), -1 for none; a degree below the minimum
    warns. The polynomial is in (x - shift) / scale, the data's bounding
    box mapped onto [-1, 1]^dim. `neighbors=k` (k < N): scipy's local
    interpolation, no global solve; each evaluation point gets the
    interpolant of its k nearest data points (`jfmm.rbf.local`: a k-d tree
    for concrete points, a top-k over all pairs under jit; the k x k
    systems solved batched on the device); k >= N is the global
    interpolant.

    The interpolant s(x) = sum_i c_i K(epsilon |x - y_i|) + P(x) a solves
    (K + diag(smoothing)) c + P a = d, P^T c = 0.

    Solve (keyword-only extras; scipy has none): `method` 'dense' (the
    whole system: Cholesky on the polynomials' null space where the kernel
    is conditionally positive definite at its degree, else LU as scipy;
    the default up to N = 4096, 8192 on the CPU) or 'krylov'
    (the default above): flexible GMRES on the moment-projected system
    (`jfmm.rbf.system`), every product an FMM sum of a plan built once
    (family, order and tree fixed), with the `preconditioner`:
    'schwarz', multilevel restricted additive Schwarz (`jfmm.rbf.schwarz`);
    'nystrom', P = F F^T + diag(smoothing) with F (N, rank) from randomly
    pivoted Cholesky (`jfmm.rbf.nystrom`; positive definite kernels with
    smoothing > 0 only; `rank` rounded up to a multiple of 128, or searched
    for: the least bounding the preconditioned condition number by 10^4,
    else the largest allowed where it bounds it by 10^6; allowed: an
    N x rank factor in 40% of the device's memory, at most N / 2); or
    'auto' (default): Nystrom for the positive definite kernels with
    concrete smoothing > 0 everywhere where
    the search finds a rank of at most N / 4 (one bounding the condition
    number by 10^6 only where the smoothing is below 1e-3 somewhere: above,
    Schwarz converges faster), else Schwarz. The solve stops
    at relative residual of the moment-projected system <= tol (default
    1e-8 in float64, with Nystrom down to 1e-10 where the condition
    number allows it; 1e-4 in float32) or after maxiter steps (default 300)
    and raises RuntimeError where tol is not reached (under a trace the
    coefficients become NaN instead). `fmm_eps`: the FMM's relative error
    (default tol / 10, at least 2e-5 in float32; with Nystrom also at most
    10 smoothing / the kernel matrix's largest eigenvalue, since the FMM's
    error is not preconditioned, or 1.5 times the least eps the FMM reaches
    on the points where that is more). `iterations` and `residual` report
    the solve (0 and the dense solve's residual for 'dense').

    Calling interp(x) with x (M, dim) evaluates s at M points by one FMM
    sum (the direct sum below 2^24 pairs, in chunks as scipy's) plus the
    polynomial, compiled once per size bucket of M (256, then steps of
    at most 1.5x); it returns (M, ...) like d. float32 or float64 follow
    the inputs (float64 needs jax_enable_x64).

    Compiled code: the local inverses and the solve (Krylov iterations,
    polynomial part) are two jitted programs per static configuration (N,
    kernel, degree, dtype, solver settings, the FMM plans' shapes, the
    coarse levels' size buckets), shared by the constructor, eager `fit`
    calls and later interpolators of the same configuration; `fit(d=...)`
    alone reuses the inverses. jfmm keeps compiled programs on disk between
    processes (`jfmm._cache`). What each stage costs (H200, 10^6 points: a
    second constructor's host set-up 1.0-1.6 s, local inverses 0.4 s, the
    solve 0.6-1.4 s; a fresh process compiles for about 20 s) is in
    docs/BENCHMARKS.md, "RBF interpolation as a user calls it".

    Differentiable: the object is a pytree (arrays are leaves) and passes
    through jax.jit. `interp(x)` differentiates with respect to x and the
    coefficients; `interp.fit(d=..., epsilon=..., smoothing=...)` solves
    again with new values on the same trees and plans, jit-able and
    differentiable with respect to all three: the Krylov solve by
    implicit differentiation (one adjoint solve with the same
    preconditioner, memory O(N)). The constructor needs concrete y and
    epsilon (they fix the trees and the FMM order); its `d` and
    `smoothing` may be traced. The FMM order chosen for the constructor's
    epsilon is kept by `fit`: tune epsilon within a factor of a few of it,
    or construct anew.

    Duplicate data points with smoothing 0 make the system singular: the
    dense solve raises numpy.linalg.LinAlgError (as scipy); the Krylov
    solve may still interpolate where the duplicates carry equal values
    (the system is then consistent; else GMRES breaks down and it raises
    RuntimeError) and raises where they do not. With smoothing > 0 duplicates are fine.

    Convergence of the Krylov solve, measured (docs/BENCHMARKS.md, uniform
    3D points, residual 1e-6): 5-6 iterations for the linear kernel and
    6-7 for the thin-plate spline from 10^4 to 10^6 points, more on
    clustered points (Schwarz). The positive definite kernels need
    smoothing > 0 above 4,096 points: local ones (a width of about the
    point spacing or less) converge under Schwarz, flat ones (a width of
    many spacings) under Nystrom, whose rank grows with the number of the
    kernel matrix's eigenvalues above the smoothing (the inverse
    multiquadric of epsilon 5, smoothing 1e-6, 10^5 uniform points in the
    unit cube: rank 13,184, 9 iterations). Between the two (for example
    the Gaussian of epsilon 12 with smoothing 1e-4) the rank needed
    approaches N: past the memory budget the constructor raises; up to
    4,096 points (8,192 on the CPU) the dense solve serves every case. Flat kernels with tiny smoothing are ill-conditioned in
    themselves (condition number ~ the largest eigenvalue / smoothing):
    the coefficients, and scipy's, are determined only to about that
    times float64's rounding.
    """

    def __init__(self, y, d, neighbors=None, smoothing=0.0, kernel="thin_plate_spline",
                 epsilon=None, degree=None, *, tol=None, maxiter=300, fmm_eps=None,
                 method="auto", preconditioner="auto", rank=None):
        asked = dict(y=y, d=d, neighbors=neighbors, smoothing=smoothing, kernel=kernel,
                     epsilon=epsilon, degree=degree)
        if isinstance(y, Tracer):
            raise TypeError("y must be concrete (the trees are built from its values); "
                            "differentiate with respect to d, epsilon and smoothing through "
                            "`fit`, and with respect to evaluation points through `__call__`")
        y_np = np.asarray(y)
        if y_np.ndim != 2:
            raise ValueError("`y` must be a 2-dimensional array.")
        n, dim = y_np.shape
        if not np.all(np.isfinite(y_np)):
            raise ValueError("y contains NaN or inf coordinates")
        # Host arrays stay on the host until their dtype is known: each eager
        # jnp conversion compiles a small program in a fresh process.
        d = d if isinstance(d, jax.Array) else np.asarray(d)
        if d.ndim == 0 or d.shape[0] != n:
            raise ValueError(f"Expected the first axis of `d` to have length {n}.")
        real_d = d.real.dtype if jnp.iscomplexobj(d) else d.dtype
        dtype = jnp.result_type(getattr(y, "dtype", y_np.dtype), real_d, 0.0)
        if not jnp.issubdtype(dtype, jnp.floating) or jnp.dtype(dtype).itemsize < 4:
            dtype = jnp.result_type(jnp.float32, 0.0)
        d = _on_device(d)
        xp = jnp if isinstance(smoothing, Tracer) else np
        smoothing = xp.asarray(smoothing, dtype)
        if smoothing.ndim == 0:
            smoothing = xp.full((n,), smoothing, dtype)
        elif smoothing.shape != (n,):
            raise ValueError(f"Expected `smoothing` to be a scalar or have shape ({n},).")
        if xp is np:
            smoothing = jax.device_put(smoothing)
        if not isinstance(kernel, str) or kernel.lower() not in KERNELS:
            raise ValueError(f"`kernel` must be one of {set(KERNELS)}.")
        kernel = kernel.lower()
        _, scaled, min_degree = KERNELS[kernel]
        if epsilon is None:
            if scaled:
                raise ValueError("`epsilon` must be specified if `kernel` is not one of "
                                 f"{ {k for k, v in KERNELS.items() if not v[1]} }.")
            epsilon = 1.0
        if isinstance(epsilon, Tracer):
            raise TypeError("epsilon must be concrete in the constructor (the FMM order is "
                            "chosen from it); to differentiate with respect to epsilon, "
                            "construct with a concrete value and call `fit(epsilon=...)`")
        epsilon = float(epsilon)
        degree = _degree(degree, kernel, min_degree)
        if neighbors is not None:
            neighbors = int(min(neighbors, n))
        exponents = polynomial.powers(dim, degree)
        if exponents.shape[0] > (n if neighbors is None else neighbors):
            raise ValueError(f"At least {exponents.shape[0]} data points are required when "
                             f"`degree` is {degree} and the number of dimensions is {dim}.")
        asked_method = method
        if method == "auto":
            method = "dense" if n <= _dense_max() else "krylov"
        if method not in ("dense", "krylov"):
            raise ValueError(f"method must be 'auto', 'dense' or 'krylov', got {method!r}")
        if neighbors is not None and neighbors < n:
            method = "local"
        if method == "krylov" and dim > 3:
            raise ValueError(f"above {_dense_max()} data points (the Krylov solve over FMM "
                             f"sums) y must have 1, 2 or 3 columns, got {dim}; pass "
                             "neighbors= for local interpolation in more dimensions")
        if preconditioner not in ("auto", "schwarz", "nystrom"):
            raise ValueError("preconditioner must be 'auto', 'schwarz' or 'nystrom', got "
                             f"{preconditioner!r}")
        sites = _lift(jnp.asarray(y_np, dtype))
        lifted = _lift_powers(exponents)
        k = kernel_for(kernel, epsilon)
        largest = None
        if method == "krylov":
            preconditioner, rank, largest = _preconditioner(preconditioner, rank, kernel,
                                                            sites, smoothing, k)
        condition = largest / float(jnp.min(smoothing)) if largest else None
        tol = _default_tol(dtype, condition) if tol is None else float(tol)
        floor = ROUNDING_FLOOR[jnp.dtype(dtype).name]          # the Chebyshev family's
        chosen = fmm_eps is None
        if chosen:
            fmm_eps = max(tol / 10, floor)
            if largest:
                # The FMM's error, A's relative perturbation, is not
                # preconditioned: keep it below 10 smoothing / lambda_max.
                fmm_eps = max(min(fmm_eps, 10 * float(jnp.min(smoothing)) / largest), floor)
        fmm_eps = float(fmm_eps)
        if not (tol > 0 and fmm_eps > 0 and int(maxiter) >= 1):
            raise ValueError("tol and fmm_eps must be > 0 and maxiter >= 1")

        shift, scale = polynomial.shift_and_scale(np.asarray(sites, np.float64))
        settings = levels = None
        order = None
        if method == "krylov":
            settings = system.Settings(tol=tol, maxiter=int(maxiter),
                                       preconditioner=preconditioner, rank=rank, seed=0,
                                       definite=degree >= min_degree)
            levels, fmm_eps = _hierarchy(np.asarray(sites, np.float64), sites, smoothing, k,
                                         lifted, fmm_eps, settings, chosen)
            order = levels[0].own.order
        elif method == "dense" and sites.shape[1] in (2, 3) and n * n > system.DIRECT_PAIRS:
            order = api.plan(sites, kernel=k, eps=fmm_eps, family="chebyshev").order
        is_complex = bool(jnp.iscomplexobj(d))
        self._static = Static(kernel, degree, tuple(map(tuple, exponents.tolist())),
                              tuple(d.shape[1:]), is_complex, method, fmm_eps, order, settings,
                              dim, neighbors)
        self._sites = sites
        self._shift = jax.device_put(np.asarray(shift, dtype))
        self._scale = jax.device_put(np.asarray(scale, dtype))
        self.d, self.smoothing = d, smoothing
        self.epsilon = jax.device_put(np.asarray(epsilon, dtype))
        # The sums' kernel with epsilon as an array, as `fit` leaves it: one
        # compiled solve serves the constructor and every refit.
        self._levels = (None if levels is None
                        else system.with_kernel(levels, kernel_for(kernel, self.epsilon)))
        self._coeffs = self._poly = self.iterations = self.residual = None
        fitted = _fit(_prepare(self, self.epsilon, smoothing), d, self.epsilon, smoothing)
        self.__dict__.update(fitted.__dict__)
        if asked_method == "auto" and self._failed() and n <= DENSE_FALLBACK_MAX:
            warnings.warn(f"the Krylov solve did not converge ({self._failure()}); "
                          f"solving the {n} x {n} system densely instead",
                          RuntimeWarning, stacklevel=2)
            self.__init__(**asked, method="dense")
            return
        self._raise_if_failed()         # _fit's own check ran under its trace

    # ------------------------------------------------------------ scipy's names
    @property
    def kernel(self) -> str:
        return self._static.kernel

    @property
    def degree(self) -> int:
        return self._static.degree

    @property
    def y(self):
        """The data points (N, dim)."""
        return self._sites[:, :self._static.dim]

    @property
    def powers(self) -> np.ndarray:
        return np.asarray(self._static.powers, np.int64).reshape(-1, self._static.dim)

    @property
    def neighbors(self) -> int | None:
        """scipy's: the nearest data points each evaluation uses (at most
        N), or None for the global interpolant."""
        return self._static.neighbors

    @property
    def d_shape(self) -> tuple:
        return self._static.d_shape

    @property
    def method(self) -> str:
        return self._static.method

    @property
    def preconditioner(self) -> str | None:
        """'schwarz' or 'nystrom' (the Krylov solve's), None for 'dense'."""
        st = self._static.settings
        return None if st is None else st.preconditioner

    @property
    def rank(self) -> int:
        """The Nystrom preconditioner's rank (0 without one)."""
        st = self._static.settings
        return 0 if st is None else st.rank

    # ------------------------------------------------------------ solve
    def fit(self, d=None, epsilon=None, smoothing=None) -> RBFInterpolator:
        """A new interpolator for new data values d (N, ...), epsilon or
        smoothing (scalar or (N,)), on this one's points, trees, FMM order
        and solver settings. jit-able and differentiable with respect to
        all three. Raises like the constructor where the solve fails
        (under a trace its coefficients are NaN instead). Eager calls run
        compiled programs shared by every interpolator of the same shapes
        and settings: the local inverses of the preconditioner (kept where
        only d changes) and the solve."""
        st = self._static
        n, dtype = self._sites.shape[0], self._sites.dtype
        d = self.d if d is None else _on_device(d)
        if d.shape[:1] != (n,) or tuple(d.shape[1:]) != st.d_shape:
            raise ValueError(f"d must have shape {(n,) + st.d_shape}, got {d.shape}")
        same = epsilon is None and smoothing is None     # the same preconditioner
        epsilon = self.epsilon if epsilon is None else jnp.asarray(epsilon, dtype)
        smoothing = self.smoothing if smoothing is None else jnp.asarray(smoothing, dtype)
        smoothing = jnp.broadcast_to(smoothing, (n,))
        new = self._unsolved()
        if not same:
            new = _prepare(new, epsilon, smoothing)
        new = _fit(new, d, epsilon, smoothing)
        new._raise_if_failed()          # eager calls only; traced: NaN coefficients
        return new

    def _unsolved(self) -> RBFInterpolator:
        """This interpolator without its coefficients, as the constructor
        hands it to `_fit`: one compiled solve serves the constructor and
        every refit."""
        new = object.__new__(RBFInterpolator)
        new.__dict__.update(self.__dict__)
        new.__dict__.pop("_field_cache", None)      # of the old coefficients
        new._coeffs = new._poly = new.iterations = new.residual = None
        return new

    def _values(self, d):
        """d as real columns (N, S) of the working dtype (complex: real
        parts, then imaginary parts)."""
        values = d.reshape(d.shape[0], -1)
        if self._static.complex:
            values = jnp.concatenate([values.real, values.imag], axis=1)
        return values.astype(self._sites.dtype)

    def _solve(self, d, epsilon, smoothing):
        """fit's solve (traced, under `_fit`'s jit): the coefficients c
        (N, S) and a (R, S) (None for the local method), the iterations
        and the residual."""
        st = self._static
        zero = jnp.zeros((), self._sites.dtype)
        if st.method == "local":             # solved at each evaluation
            return None, None, jnp.zeros((), jnp.int32), zero
        values = self._values(d)
        k = kernel_for(st.kernel, epsilon)
        exponents = _lift_powers(self.powers)
        p = polynomial.monomials((self._sites - self._shift) / self._scale, exponents)
        if st.method == "dense":
            c, a, residual = _dense_solve(self._sites, values, smoothing, k, p,
                                          st.degree >= KERNELS[st.kernel][2])
            return c, a, jnp.zeros((), jnp.int32), residual
        # On levels of this epsilon and smoothing (`_prepare`).
        c, a, iterations, residual = _krylov_solve(self._levels, values, p, st.settings)
        failed = ~(residual <= st.settings.tol)
        return jnp.where(failed, jnp.nan, c), jnp.where(failed, jnp.nan, a), iterations, residual

    def _raise_if_failed(self):
        res = self.residual
        if isinstance(res, Tracer) or self.method == "local":
            return
        if self.method == "dense":
            if not bool(jnp.all(jnp.isfinite(self._coeffs))) or float(res) > 1e-4:
                raise np.linalg.LinAlgError(self._singular_message())
            return
        if self._failed():
            raise RuntimeError(f"the RBF solve did not converge ({self._failure()}). "
                               f"What may help: {'; '.join(self._remedies())}")

    def _failed(self) -> bool:
        """Whether a concrete Krylov solve stopped short of tol."""
        res = self.residual
        return (self.method == "krylov" and not isinstance(res, Tracer)
                and not float(res) <= self._static.settings.tol)

    def _failure(self) -> str:
        return (f"relative residual {float(self.residual):.2e} after {int(self.iterations)} "
                f"iterations, tol {self._static.settings.tol:g}, "
                f"{self._describe_preconditioner()}")

    def _describe_preconditioner(self) -> str:
        if self.preconditioner == "nystrom":
            return f"Nystrom preconditioner of rank {self.rank}"
        return "Schwarz preconditioner"

    def _remedies(self) -> list[str]:
        """What may make a failed Krylov solve converge: only those that
        apply to this solve."""
        st, res, n = self._static, float(self.residual), self.y.shape[0]
        out = []
        if not res > 100 * st.settings.tol:
            more = (f"raise maxiter ({st.settings.maxiter}) or "
                    if int(self.iterations) >= st.settings.maxiter else "")
            out.append(f"{more}loosen tol: the residual came within 100x of tol")
        if not res > 100 * st.fmm_eps:
            out.append(f"lower fmm_eps: the FMM's error ({st.fmm_eps:g}) bounds the residual "
                       f"reachable")
        unsmoothed = np.asarray(self.smoothing) == 0
        if unsmoothed.any():
            pts = np.asarray(self.y)[unsmoothed]
            repeated = pts.shape[0] - np.unique(pts, axis=0).shape[0]
            if repeated:
                out.append(f"add smoothing > 0 or remove the {repeated} repeated data points "
                           f"(duplicates with smoothing 0 make the system singular)")
        if self.kernel in POSITIVE_DEFINITE:
            if self.preconditioner == "nystrom":
                out.append(f"raise the Nystrom rank (rank=, now {self.rank})")
            else:
                out.append("flat kernels (wide against the point spacing) need smoothing > 0 "
                           "and preconditioner='nystrom' with a rank near the number of the "
                           "kernel matrix's eigenvalues above the smoothing (rank=)")
        if n <= DENSE_FALLBACK_MAX:
            out.append(f"method='dense' ({n} points: an {n} x {n} matrix)")
        if not out:
            out.append("add smoothing > 0 (the system may be too ill-conditioned for the "
                       "Krylov solve at this size)")
        return out

    def _singular_message(self, points=None) -> str:
        """scipy's message for a singular system on `points` (the data
        points by default)."""
        points = np.asarray(self.y if points is None else points)
        shift, scale = polynomial.shift_and_scale(points)
        p = np.asarray(polynomial.monomials((points - shift) / scale, self.powers))
        if p.shape[1] and np.linalg.matrix_rank(p) < p.shape[1]:
            return ("Singular matrix. The matrix of monomials evaluated at the data point "
                    f"coordinates does not have full column rank "
                    f"({np.linalg.matrix_rank(p)}/{p.shape[1]}).")
        return ("Singular matrix (duplicate data points with smoothing 0, or a kernel "
                "below its minimum degree).")

    # ------------------------------------------------------------ evaluate
    def __call__(self, x):
        """The interpolant at x (M, dim): (M, ...) like d. Sums over all
        data points (the direct sum below 2^24 pairs, in chunks as scipy's,
        or below the backend's crossover), or with `neighbors` the local
        interpolants. By the FMM, the first eager call builds the data
        points' leaf expansions (`jfmm.rbf.field`, kept with this fit) and
        every later one sums from them: only its points' near field and
        L2P run (points beyond the data's bounding box, and traced points,
        take an FMM plan of their own). Compiled once per size bucket of M
        (M padded to 256, or the next 2^k or 1.5 x 2^k)."""
        # Host points stay numpy until padded to their size bucket: eager jnp
        # operations compiled a small program per M.
        x = x if isinstance(x, jax.Array) else np.asarray(x)
        st = self._static
        if x.ndim != 2:
            raise ValueError("`x` must be a 2-dimensional array.")
        if x.shape[1] != st.dim:
            raise ValueError(f"Expected the second axis of `x` to have length {st.dim}.")
        x = x.astype(self._sites.dtype)
        m = x.shape[0]
        if m == 0:
            cols = int(np.prod(st.d_shape, dtype=int)) * (2 if st.complex else 1)
            out = jnp.zeros((0, cols), self._sites.dtype)
        elif st.method == "local":
            out = self._local(x)
        else:
            n, lifted = self._sites.shape[0], _lift(x)
            budget = max(x.size + self._sites.size + self.d.size, 1_000_000)
            if n * _bucket(m) <= system.DIRECT_PAIRS or lifted.shape[1] > 3:
                coeffs = jnp.concatenate([self._coeffs, self._poly])
                out = self._chunk_evaluator(x, self.y, None, None, coeffs,
                                            memory_budget=budget)
            else:
                out = self._far(lifted)
        if st.complex:
            half = out.shape[1] // 2
            out = out[:, :half] + 1j * out[:, half:]
        return out.reshape((m,) + st.d_shape)

    def _chunk_evaluator(self, x, y, shift, scale, coeffs, memory_budget=1_000_000):
        """scipy's evaluation in chunks of x (Q, dim) of at most
        memory_budget / (N + R) rows: K(x, y) c + P(x) a with coeffs
        (N + R, S) = [c; a], the polynomial in this interpolator's
        coordinates (shift and scale are scipy's arguments; None here)."""
        n, r = y.shape[0], self.powers.shape[0]
        rows = memory_budget // (n + r) + 1
        k = kernel_for(self._static.kernel, self.epsilon)
        dim = y.shape[1]
        args = (y, self._shift[:dim], self._scale[:dim], coeffs[:n], coeffs[n:], k)
        chunks = []
        for start in range(0, x.shape[0], rows):
            part = x[start:start + rows]
            chunks.append(_direct(_padded(part), *args,
                                  powers=self._static.powers)[:part.shape[0]])
        return jnp.concatenate(chunks) if len(chunks) > 1 else chunks[0]

    def _far(self, lifted):
        """The sum from the data points (the FMM, or the direct sum below
        the crossover: `system.direct`) plus the polynomial at lifted
        points (M, D)."""
        st, m = self._static, lifted.shape[0]
        k = kernel_for(st.kernel, self.epsilon)
        padded = _padded(lifted)
        concrete = not isinstance(padded, Tracer)
        built = concrete and self.__dict__.get("_field_cache") is not None
        if not built and system.direct(k, padded.shape[1], padded.dtype, self._sites.shape[0],
                                       padded.shape[0], st.fmm_eps, st.order):
            out = api.direct(self._sites, self._coeffs, padded, kernel=k)
        else:
            fitted = self._field() if concrete else None
            out, inside = (None, False) if fitted is None else field.at(fitted, padded)
            if not bool(inside):        # no field, or points beyond the data's box
                out = api.fmm(self._sites, self._coeffs, padded, kernel=k, eps=st.fmm_eps,
                              family="chebyshev", order=st.order)
        powers = tuple(map(tuple, _lift_powers(self.powers).tolist()))
        return _plus_polynomial(out, padded, self._shift, self._scale, self._poly,
                                powers=powers)[:m]

    def _field(self):
        """The data points' sum, ready for new points (`field.Field`),
        built by the first eager evaluation that sums by the FMM and kept;
        None for traced coefficients or where the FMM has no far field."""
        if isinstance(self._coeffs, Tracer) or isinstance(self.epsilon, Tracer):
            return None
        if "_field_cache" not in self.__dict__:
            st = self._static
            top = None if self._levels is None else self._levels[0].own.plan
            self._field_cache = field.build(self._sites, self._coeffs,
                                            kernel_for(st.kernel, self.epsilon), st.fmm_eps,
                                            top)
        return self._field_cache

    def _local(self, x):
        """scipy's `neighbors` evaluation: each point's local interpolant."""
        st, m = self._static, x.shape[0]
        padded = _padded(x)
        idx = local.nearest(self.y, padded, st.neighbors, tree=self._tree())
        out, ok = _local(padded, self.y, self._values(self.d), self.smoothing,
                         kernel_for(st.kernel, self.epsilon), idx, powers=st.powers)
        out, ok = out[:m], ok[:m]
        if not isinstance(ok, Tracer) and not bool(jnp.all(ok)):
            bad = int(np.argmin(np.asarray(ok)))
            raise np.linalg.LinAlgError(self._singular_message(self.y[idx[bad]]))
        return out

    def _tree(self):
        """scipy's k-d tree of the data points, built by the first eager
        `neighbors` evaluation and kept (0.6 s at 10^6 points on the 2-core
        CPU); None for traced points."""
        if isinstance(self._sites, Tracer):
            return None
        if self.__dict__.get("_kdtree") is None:
            from scipy.spatial import cKDTree

            self._kdtree = cKDTree(np.asarray(self.y))
        return self._kdtree

    def __repr__(self):
        return (f"RBFInterpolator(N={self.y.shape[0]}, dim={self.y.shape[1]}, "
                f"kernel={self.kernel!r}, degree={self.degree}, method={self.method!r})")


_LEAVES = ("_sites", "d", "epsilon", "smoothing", "_shift", "_scale", "_coeffs", "_poly",
           "_levels", "iterations", "residual")


def _flatten(it):
    return [getattr(it, k) for k in _LEAVES], it._static


def _unflatten(static, leaves):
    it = object.__new__(RBFInterpolator)
    it.__dict__.update(zip(_LEAVES, leaves))
    it._static = static
    return it


jax.tree_util.register_pytree_node(RBFInterpolator, _flatten, _unflatten)


def _fit(it, d, epsilon, smoothing):
    """`it` fitted to d, epsilon and smoothing: the solve as one compiled
    program per shapes, settings and backend mode, shared by the
    constructor, eager `fit` calls and every interpolator of the same
    static configuration (on a GPU compiled without Triton GEMM
    autotuning, as the FMM's own calls). It returns the solve's results
    alone, so that nothing else is copied."""
    solved = backend.call(_fit_jits, it, d, epsilon, smoothing, mode=backend.current())
    new = object.__new__(RBFInterpolator)
    new.__dict__.update(it.__dict__)
    new.d, new.epsilon, new.smoothing = d, epsilon, smoothing
    new._coeffs, new._poly, new.iterations, new.residual = solved
    return new


def _solve(it, d, epsilon, smoothing, mode):
    return it._solve(d, epsilon, smoothing)


_fit_jits = backend.jits(_solve, ("mode",))


def _prepare(it, epsilon, smoothing):
    """`it` with its Krylov levels for epsilon and smoothing (N,): their
    sums' kernel, smoothing and local inverses (`system.with_parameters`;
    those last two by one compiled program); other methods unchanged. A
    program of its own, so that a refit for new data values alone reuses
    them (H200, 10^6 points: 1.0-1.2 s of a 2.0-2.8 s refit rebuilt them)."""
    if it._levels is None:
        return it
    parts = backend.call(_parameters_jits, it._levels, epsilon, smoothing,
                         static=(it._static.kernel, it._static.settings),
                         powers=tuple(map(tuple, _lift_powers(it.powers).tolist())),
                         mode=backend.current())
    new = object.__new__(RBFInterpolator)
    new.__dict__.update(it.__dict__)
    new._levels = system.assembled(it._levels, kernel_for(it._static.kernel, epsilon), parts)
    return new


def _parameters(levels, epsilon, smoothing, static, powers, mode):
    kernel, settings = static
    exponents = np.asarray(powers, np.int64).reshape(-1, levels[0].points.shape[1])
    return system.parameters(levels, kernel_for(kernel, epsilon), smoothing, exponents,
                             settings)


_parameters_jits = backend.jits(_parameters, ("static", "powers", "mode"))


def _direct(x, y, shift, scale, c, a, kernel, powers):
    return backend.call(_direct_jits, x, y, shift, scale, c, a, kernel, powers=powers,
                        mode=backend.current())


def _direct_sum(x, y, shift, scale, c, a, kernel, powers, mode):
    """K(x, y) c + P((x - shift) / scale) a: x (M, dim), y (N, dim), c (N, S),
    a (R, S), powers (R, dim) as nested tuples (any dim)."""
    exponents = np.asarray(powers, np.int64).reshape(-1, x.shape[1])
    r2 = jnp.sum((x[:, None, :] - y[None, :, :]) ** 2, axis=-1)
    p = polynomial.monomials((x - shift) / scale, exponents)
    return kernel.pair(r2, False)[0] @ c + p @ a


_direct_jits = backend.jits(_direct_sum, ("powers", "mode"))


def _local(x, y, values, smoothing, kernel, idx, powers):
    return backend.call(_local_jits, x, y, values, smoothing, kernel, idx, powers=powers,
                        mode=backend.current())


def _local_sums(x, y, values, smoothing, kernel, idx, powers, mode):
    exponents = np.asarray(powers, np.int64).reshape(-1, y.shape[1])
    return local.evaluate(x, y, values, smoothing, kernel, exponents, idx)


_local_jits = backend.jits(_local_sums, ("powers", "mode"))


def _preconditioner(choice: str, rank, name: str, points, smoothing, kernel):
    """The Krylov solve's preconditioner, Nystrom rank and the kernel
    matrix's largest eigenvalue (None where unknown) for the user's
    `choice`: 'auto' takes Nystrom where the kernel is positive definite,
    the smoothing concrete and positive, and a rank of at most N / 4 within
    the memory budget brings the preconditioned condition number's bound
    below `nystrom.TARGET` (beyond N / 4 the factor costs like a dense
    solve and Schwarz is tried); else Schwarz."""
    if choice == "schwarz":
        return "schwarz", 0, None
    concrete = not isinstance(smoothing, Tracer)
    positive = concrete and bool(np.all(np.asarray(smoothing) > 0))
    if choice == "nystrom":
        if name not in POSITIVE_DEFINITE:
            raise ValueError(f"the Nystrom preconditioner needs a positive definite kernel "
                             f"({', '.join(POSITIVE_DEFINITE)}), not {name!r}")
        if concrete and not positive:
            raise ValueError("the Nystrom preconditioner needs smoothing > 0 at every point")
        if rank is None and not concrete:
            raise ValueError("pass rank= for the Nystrom preconditioner with traced smoothing")
    elif name not in POSITIVE_DEFINITE or not positive:
        return "schwarz", 0, None
    n, itemsize = points.shape[0], jnp.dtype(points.dtype).itemsize
    if rank is not None:
        rank = -(-int(rank) // nystrom.BLOCK) * nystrom.BLOCK
        if not 0 < rank <= n:
            raise ValueError(f"rank must be between 1 and the number of points {n} "
                             f"(rounded up to a multiple of {nystrom.BLOCK})")
        largest = (nystrom.largest_eigenvalue(kernel, points, jax.random.PRNGKey(0))
                   if concrete else None)
        return "nystrom", rank, largest
    limit = nystrom.max_rank(n, itemsize)
    if choice == "auto":
        limit = min(limit, n // 4 // nystrom.BLOCK * nystrom.BLOCK)
    found = nystrom.choose_rank(kernel, points, smoothing, limit, jax.random.PRNGKey(0))
    loose = found.trace > nystrom.TARGET
    if found.rank and not (choice == "auto" and loose
                           and float(jnp.min(smoothing)) >= SCHWARZ_SMOOTHING):
        return "nystrom", found.rank, found.largest
    if choice == "auto":
        return "schwarz", 0, None
    if limit < nystrom.BLOCK:
        raise ValueError(f"too few points ({n}) or too little memory for a Nystrom "
                         f"preconditioner of rank {nystrom.BLOCK}")
    return "nystrom", limit, found.largest


def _padded(x):
    """x (m, d) padded with copies of its first row to `_bucket(m)` rows, so
    that evaluations of other sizes reuse the compiled programs (numpy x
    padded on the host, then put on the device)."""
    m = x.shape[0]
    xp = jnp if isinstance(x, jax.Array) else np
    out = xp.concatenate([x, xp.broadcast_to(x[:1], (_bucket(m) - m, x.shape[1]))])
    return out if xp is jnp else jax.device_put(out)


@functools.partial(jax.jit, static_argnames=("powers",))
def _plus_polynomial(out, x, shift, scale, poly, powers):
    """out (M, S) + P((x - shift) / scale) a, x (M, D), a (R, S), powers
    (R, D) as nested tuples: one program per size bucket of M."""
    exponents = np.asarray(powers, np.int64).reshape(-1, x.shape[1])
    return out + polynomial.monomials((x - shift) / scale, exponents) @ poly


def _bucket(m: int) -> int:
    """The evaluation size for m targets: 256, or the next 2^k or 1.5 x 2^k
    (at most half as much work again)."""
    size = 256
    while size < m:
        size = size * 3 // 2 if size & (size - 1) == 0 else size * 4 // 3
    return size


def _dense_solve(y, values, smoothing, kernel, p, definite: bool):
    """The whole system [[K + S, P], [P^T, 0]] solved densely: by Cholesky
    on the polynomials' null space where the kernel is (conditionally)
    positive definite at its degree (`schwarz.null_space_solve`, half of
    LU's arithmetic), else, or where that fails (a factorization that is
    not positive definite, monomials of deficient rank), by LU as scipy.
    2-core CPU, 8,000 3D points: LU 3.9 s, Cholesky 1.8 s. Returns
    c (N, S), a (R, S) and the relative residual of the solve."""
    n, r = y.shape[0], p.shape[1]
    r2 = p2p.squared_distances(y, y)
    lhs = kernel.pair(r2, False)[0] + jnp.diag(smoothing)

    def lu():
        saddle = jnp.block([[lhs, p], [p.T, jnp.zeros((r, r), y.dtype)]])
        rhs = jnp.concatenate([values, jnp.zeros((r, values.shape[1]), y.dtype)])
        sol = jnp.linalg.solve(saddle, rhs)
        return sol[:n], sol[n:]

    if definite:
        c, a, norms = schwarz.null_space_solve(lhs, p, values)
        full_rank = jnp.all(norms > n * jnp.finfo(y.dtype).eps * jnp.max(norms, initial=0.0))
        c, a = jax.lax.cond(full_rank & jnp.all(jnp.isfinite(c)), lambda: (c, a), lu)
    else:
        c, a = lu()
    misfit = jnp.concatenate([lhs @ c + p @ a - values, p.T @ c])
    residual = jnp.linalg.norm(misfit) / jnp.maximum(jnp.linalg.norm(values),
                                                     jnp.finfo(y.dtype).tiny)
    return c, a, residual


def _krylov_solve(levels, values, p, settings):
    """Per data column: the projected solve, then the polynomial part by
    least squares on d - (A + S) c. Returns c (N, S), a (R, S), the most
    iterations and the worst relative residual over the columns."""
    top = levels[0]

    def column(v):
        c, conv = system.solve(levels, v, settings)
        return c, conv.iterations, conv.residual

    def columns(f, v, out_axes):
        # One column (the common case) without vmap: tracing through the
        # batching interpreter lengthened the solve's trace.
        if v.shape[1] == 1:
            return jax.tree_util.tree_map(jnp.expand_dims, f(v[:, 0]), out_axes)
        return jax.vmap(f, in_axes=1, out_axes=out_axes)(v)

    c, iterations, residual = columns(column, values, (1, 0, 0))
    if p.shape[1]:
        rest = values - columns(lambda col: system.apply(top, col), c, 1)
        a = jnp.linalg.lstsq(p, rest)[0]
    else:
        a = jnp.zeros((0, values.shape[1]), values.dtype)
    return c, a, jnp.max(iterations), jnp.max(residual)
