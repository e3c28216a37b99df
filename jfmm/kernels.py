"""Kernels: radial functions K(r) as pytrees.

A kernel is a frozen dataclass registered as a pytree: numeric parameters are
leaves (traceable, differentiable), everything else is static structure.
`phi(y) = sum_i q_i K(|y - x_i|)`.

Singular kernels contribute 0 for a pair at distance 0 (so self-interaction is
excluded and coincident points are safe).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, ClassVar

import jax
import jax.numpy as jnp

from jfmm._compat import Tracer

__all__ = ["Kernel", "Gaussian", "Multiquadric", "InverseMultiquadric", "InverseQuadratic",
           "ThinPlateSpline", "Linear", "Cubic", "Quintic", "Yukawa", "Laplace2D", "Laplace3D",
           "Radial", "get"]


class Kernel:
    """Base class: subclasses define `radial(r)` and the class constants.

    singular: K(0) is excluded (the pair contributes 0).
    dims: dimensions the kernel is defined for.
    pallas: whether the Pallas near field lowers `pair` (kernels built on
    functions Triton lacks, such as incomplete gamma functions, set False
    and sum their pairs in jnp).
    """
    singular: ClassVar[bool] = False
    dims: ClassVar[tuple[int, ...]] = (2, 3)
    pallas: ClassVar[bool] = True

    def radial(self, r):
        raise NotImplementedError

    @property
    def evaluates(self) -> str:
        """The kernel whose pair evaluation this one's is, by class name:
        what its direct sum costs a pair (`configure.PAIR_COST`)."""
        return type(self).__name__

    def is_concrete(self) -> bool:
        """Whether the kernel can be evaluated eagerly: its parameters, and
        a Radial fn's closure, hold no tracers."""
        if any(isinstance(v, Tracer) for v in jax.tree_util.tree_leaves(self)):
            return False
        if type(self).radial.__module__ == __name__ and not isinstance(self, Radial):
            return True         # this module's kernels hold nothing beyond their leaves
        try:
            with jax.ensure_compile_time_eval():
                value = self.radial(jnp.ones((), jnp.float32))
        except jax.errors.JAXTypeError:          # a Radial fn closing over a tracer
            return False
        return not any(isinstance(v, Tracer) for v in jax.tree_util.tree_leaves(value))

    def at_zero(self, dtype):
        """K(0) for smooth kernels (the value a pair at distance 0 adds).

        Evaluated eagerly where the kernel is concrete: inside a Pallas
        kernel, arithmetic on a literal (-0 for Linear) does not lower to
        Triton (jax 0.10 and 0.11)."""
        if self.is_concrete():
            with jax.ensure_compile_time_eval():
                return float(self.radial(jnp.zeros((), dtype)))
        return self.radial(jnp.zeros((), dtype))

    def cutoff(self, tol: float):
        """A distance beyond which |K| <= tol max|K|, or None (no such
        distance, or parameters not concrete). Kernels that decay fast
        define it; the FMM then drops the far field where every far pair is
        beyond it."""
        return None

    def laplace_beyond(self, tol: float):
        """A distance beyond which K(r) = 1/r and K'(r) = -1/r^2 to a
        relative tol, or None (no such distance, or parameters not
        concrete). Kernels that are 1/r outside a core define it (the
        vortex cores of `jfmm.vortex`): in 3D the spherical-harmonic series
        then carry their far field, with leaves no smaller than it, so that
        every pair closer than it is in the near field (`jfmm.configure`)."""
        return None

    def value_and_derivative(self, r):
        """K(r) and dK/dr for r >= 0 (r > 0 where the kernel is singular).

        The derivative comes from forward-mode autodiff of `radial`.
        """
        return jax.jvp(self.radial, (r,), (jnp.ones_like(r),))

    def from_r2(self, r2, gradient: bool):
        """K(r) and, if gradient, K'(r) / r, from r^2 > 0 (the P2P inner loop:
        d/dy K(|y - x|) = (K'(r) / r) (y - x)). Kernels may override this
        with a cheaper closed form (every built-in kernel does: no square
        root or division where r^2 suffices; float64 square roots, divisions
        and their autodiff made the GPU near field of Multiquadric, Yukawa
        and thin-plate 3-4x slower than Laplace's)."""
        r = jnp.sqrt(r2)
        if not gradient:
            return self.radial(r), None
        k, dk = self.value_and_derivative(r)
        return k, dk / r

    def pair(self, r2, gradient: bool, differentiable: bool = True, guard: bool = True):
        """K(r) and, if gradient, K'(r) / r for any r^2 >= 0, always finite:
        at r = 0 the value is K(0) (0 for singular kernels) and the gradient
        factor 0. The P2P inner loop; safe under autodiff (double where)
        unless `differentiable` is False, which lets kernels drop selects
        that only autodiff needs (the Pallas P2P, never differentiated).
        guard=False is `from_r2` alone, for r^2 known to be > 0 (the Pallas
        P2P's source chunks that cannot hold a point equal to a target)."""
        if not guard:
            return self.from_r2(r2, gradient)
        pos = r2 > 0
        k, g = self.from_r2(jnp.where(pos, r2, 1.0), gradient)
        k = jnp.where(pos, k, 0.0 if self.singular else self.at_zero(r2.dtype))
        return k, (jnp.where(pos, g, 0.0) if gradient else None)

    def hessian_pair(self, r2, guard: bool = True):
        """(A, B) with A I + B r r^T the Hessian of K(|r|) at r^2: A = K'(r)/r
        (`pair`'s gradient factor) and B = 2 dA / d(r^2), by forward-mode
        autodiff of `pair` (both 0 at r = 0 where guard, as `pair`)."""
        factor = lambda t: self.pair(t, True, guard=guard)[1]    # noqa: E731
        a, da = jax.jvp(factor, (r2,), (jnp.ones_like(r2),))
        return a, 2 * da


def _pytree_dataclass(cls):
    """Make cls a frozen dataclass and a pytree: fields are differentiable
    leaves unless their metadata says static.

    The class itself is part of the pytree's aux data: jax 0.10's
    register_dataclass treedefs of different classes with equal fields
    compare equal, and jit then reused one kernel's executable for another
    (found by tests/test_kernels.py: a thin-plate sum returned the quintic's).
    """
    cls = dataclasses.dataclass(frozen=True)(cls)
    fields = dataclasses.fields(cls)
    data = tuple(f.name for f in fields if not f.metadata.get("static"))
    meta = tuple(f.name for f in fields if f.metadata.get("static"))

    def flatten(k):
        return [getattr(k, n) for n in data], (cls, tuple(getattr(k, n) for n in meta))

    def unflatten(aux, leaves):
        return cls(**dict(zip(data, leaves)), **dict(zip(meta, aux[1])))

    jax.tree_util.register_pytree_node(cls, flatten, unflatten)
    return cls


@_pytree_dataclass
class Laplace3D(Kernel):
    """K(r) = 1 / r, the 3D Laplace Green's function without 1/(4 pi).

    FMM3D and jaxFMM use 1/(4 pi r); divide our results by 4 pi to compare.
    Pairs at distance 0 contribute 0.
    """
    singular: ClassVar[bool] = True
    dims: ClassVar[tuple[int, ...]] = (3,)

    def radial(self, r):
        return 1.0 / r

    def from_r2(self, r2, gradient: bool):
        # One rsqrt instead of two square roots and three divisions.
        inv = jax.lax.rsqrt(r2)
        return inv, (_neg_cube(_cube_safe(inv)) if gradient else None)

    def pair(self, r2, gradient: bool, differentiable: bool = True, guard: bool = True):
        # The gradient factor comes from the already-zeroed 1/r. Outside
        # autodiff rsqrt(0) = inf needs no guard: one select per pair.
        if not guard:
            return self.from_r2(r2, gradient)
        pos = r2 > 0
        inv = jax.lax.rsqrt(jnp.where(pos, r2, 1.0) if differentiable else r2)
        inv = jnp.where(pos, inv, 0.0)
        return inv, (_neg_cube(_cube_safe(inv)) if gradient else None)


def _root(r2, gradient: bool):
    """sqrt(r2) for `from_r2`: r2 rsqrt(r2) where the gradient needs the
    rsqrt anyway or on accelerators (rsqrt is their cheap one); a CPU's
    potential alone takes the square root by itself, since its float64
    rsqrt is a square root and a division (2-core CPU, float64, all pairs of
    20,000 points under the linear kernel: 1.41 -> 0.60 s)."""
    if not gradient and jax.default_backend() == "cpu":
        return jnp.sqrt(r2)
    return r2 * jax.lax.rsqrt(r2)


def _log(x):
    """log(x) for `from_r2` (x > 0, normal or infinite): jnp.log, except for
    a CPU's float64, where XLA's logarithm does not vectorise inside the
    pair loops (2-core CPU, all pairs of 20,000 points: 1.35 s against 0.29
    s for a square root). There the exponent's bits and an atanh series of
    the mantissa in [1/sqrt 2, sqrt 2), within 3 ulp of numpy's log: 0.56 s."""
    if (jax.default_backend() != "cpu" or x.dtype != jnp.float64
            or jax.config.read("jax_disable_most_optimizations")):   # unfused, one op is fewer
        return jnp.log(x)
    return _log64(x)


@jax.custom_jvp
def _log64(x):
    bits = jax.lax.bitcast_convert_type(x, jnp.int64)
    m = jax.lax.bitcast_convert_type((bits & 0x000FFFFFFFFFFFFF) | 0x3FF0000000000000,
                                     jnp.float64)                  # x = m 2^e, m in [1, 2)
    big = m > 1.4142135623730951
    m = jnp.where(big, 0.5 * m, m)
    e = ((bits >> 52) - 1023 + big).astype(jnp.float64)
    s = (m - 1.0) / (m + 1.0)                   # log m = 2 atanh s, |s| <= 0.172
    s2 = s * s
    series = 1.0 / 23
    for k in range(10, -1, -1):
        series = series * s2 + 1.0 / (2 * k + 1)
    out = e * _LN2[0] + (e * _LN2[1] + 2.0 * s * series)
    return jnp.where((bits >> 52) >= 2047, x, out)      # inf and NaN as they are


_log64.defjvp(lambda primals, tangents: (_log64(primals[0]), tangents[0] / primals[0]))
_LN2 = (6.93147180369123816490e-01, 1.90821492927058770002e-10)   # ln 2, high and low parts


def _cube_safe(inv):
    """1/r kept where its cube is finite: -1/r^3 overflows below r = 1.8e-103
    in float64 (1.4e-13 in float32) while the gradient term (y - x)/r^3 =
    1/r^2 does not, and an infinite factor times a zero charge (the adjoint
    sum's weight at a saturated target: jax.grad of tanh of a sum) made
    NaN. Pairs that close get the factor at that distance, finite."""
    return jnp.minimum(inv, _CUBE_SAFE[jnp.dtype(inv.dtype).name])


_CUBE_SAFE = {name: float(jnp.finfo(name).max) ** (1 / 3) * 0.5
              for name in ("float16", "bfloat16", "float32", "float64")}


def _neg_cube(v):
    """-v^3 as a product with -1, which compilers fold into the multiply
    (jax's negation lowers to 0 - x in Pallas, an extra instruction)."""
    return v * v * (v * -1.0)


@_pytree_dataclass
class Gaussian(Kernel):
    """exp(-(epsilon r)^2)."""
    epsilon: float = 1.0

    def radial(self, r):
        return jnp.exp(-(self.epsilon * r) ** 2)

    def from_r2(self, r2, gradient: bool):
        e2 = self.epsilon * self.epsilon
        k = jnp.exp(-e2 * r2)
        return k, (-2 * e2 * k if gradient else None)

    def cutoff(self, tol: float):
        if isinstance(self.epsilon, Tracer) or not self.epsilon:
            return None
        return math.sqrt(math.log(1 / tol)) / abs(float(self.epsilon))


@_pytree_dataclass
class Multiquadric(Kernel):
    """-sqrt(1 + (epsilon r)^2) (scipy's sign)."""
    epsilon: float = 1.0

    def radial(self, r):
        return -jnp.sqrt(1 + (self.epsilon * r) ** 2)

    def from_r2(self, r2, gradient: bool):
        e2 = self.epsilon * self.epsilon
        t = 1 + e2 * r2
        if not gradient:
            return -_root(t, False), None
        inv = jax.lax.rsqrt(t)
        return -t * inv, -e2 * inv


@_pytree_dataclass
class InverseMultiquadric(Kernel):
    """1 / sqrt(1 + (epsilon r)^2)."""
    epsilon: float = 1.0

    def radial(self, r):
        return jax.lax.rsqrt(1 + (self.epsilon * r) ** 2)

    def from_r2(self, r2, gradient: bool):
        e2 = self.epsilon * self.epsilon
        inv = jax.lax.rsqrt(1 + e2 * r2)
        return inv, (-e2 * inv * inv * inv if gradient else None)


@_pytree_dataclass
class InverseQuadratic(Kernel):
    """1 / (1 + (epsilon r)^2)."""
    epsilon: float = 1.0

    def radial(self, r):
        return 1 / (1 + (self.epsilon * r) ** 2)

    def from_r2(self, r2, gradient: bool):
        e2 = self.epsilon * self.epsilon
        k = 1 / (1 + e2 * r2)
        return k, (-2 * e2 * k * k if gradient else None)


@_pytree_dataclass
class ThinPlateSpline(Kernel):
    """r^2 log r, 0 at r = 0."""

    def radial(self, r):
        safe = jnp.where(r > 0, r, 1.0)
        return jnp.where(r > 0, r * r * jnp.log(safe), 0.0)

    def from_r2(self, r2, gradient: bool):
        log = _log(r2)                                     # 2 log r
        return 0.5 * r2 * log, (log + 1 if gradient else None)


@_pytree_dataclass
class Linear(Kernel):
    """-r (scipy's sign)."""

    def radial(self, r):
        return -r

    def from_r2(self, r2, gradient: bool):
        if not gradient:
            return -_root(r2, False), None
        inv = jax.lax.rsqrt(r2)
        return -r2 * inv, -inv


@_pytree_dataclass
class Cubic(Kernel):
    """r^3."""

    def radial(self, r):
        return r ** 3

    def from_r2(self, r2, gradient: bool):
        r = _root(r2, gradient)
        return r2 * r, (3 * r if gradient else None)


@_pytree_dataclass
class Quintic(Kernel):
    """-r^5 (scipy's sign)."""

    def radial(self, r):
        return -r ** 5

    def from_r2(self, r2, gradient: bool):
        r3 = r2 * _root(r2, gradient)
        return -r2 * r3, (-5 * r3 if gradient else None)


@_pytree_dataclass
class Yukawa(Kernel):
    """exp(-kappa r) / r, the screened Coulomb potential; pairs at distance 0
    contribute 0."""
    singular: ClassVar[bool] = True
    kappa: float = 1.0

    def radial(self, r):
        return jnp.exp(-self.kappa * r) / r

    def from_r2(self, r2, gradient: bool):
        inv = jax.lax.rsqrt(r2)
        r = r2 * inv
        k = jnp.exp(-self.kappa * r) * inv
        return k, (-k * (self.kappa * r + 1) * inv * inv if gradient else None)


@_pytree_dataclass
class Laplace2D(Kernel):
    """-log r, the 2D Laplace Green's function without 1/(2 pi); pairs at
    distance 0 contribute 0."""
    singular: ClassVar[bool] = True
    dims: ClassVar[tuple[int, ...]] = (2,)

    def radial(self, r):
        return -jnp.log(r)

    def from_r2(self, r2, gradient: bool):
        return -0.5 * _log(r2), (-1 / r2 if gradient else None)


@_pytree_dataclass
class Radial(Kernel):
    """Any radial function a user writes: K(r) = fn(r), fn a jnp function
    (static: kernels with different fn compile separately). With
    singular=True pairs at distance 0 contribute 0; otherwise they add fn(0).
    Parameters fn closes over are constants; for differentiable parameters
    subclass Kernel with dataclass fields, as the kernels here do."""
    fn: Callable = dataclasses.field(metadata=dict(static=True))
    singular: bool = dataclasses.field(default=False, metadata=dict(static=True))

    def radial(self, r):
        return self.fn(r)


_BY_NAME = {
    "gaussian": Gaussian, "multiquadric": Multiquadric,
    "inverse_multiquadric": InverseMultiquadric, "inverse_quadratic": InverseQuadratic,
    "thin_plate_spline": ThinPlateSpline, "linear": Linear, "cubic": Cubic,
    "quintic": Quintic, "yukawa": Yukawa, "laplace2d": Laplace2D, "laplace3d": Laplace3D,
}


def get(name: str, **params) -> Kernel:
    """Kernel by name (case-insensitive; scipy's RBFInterpolator names, plus
    'yukawa', 'laplace2d', 'laplace3d'), e.g. get('gaussian', epsilon=2.0)."""
    try:
        cls = _BY_NAME[name.lower()]
    except KeyError:
        raise ValueError(f"unknown kernel {name!r}; known: {sorted(_BY_NAME)}") from None
    return cls(**params)
