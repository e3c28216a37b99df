"""Kernels: radial functions K(r) as pytrees.

A kernel is a frozen dataclass registered as a pytree: numeric parameters are
leaves (traceable, differentiable), everything else is static structure.
`phi(y) = sum_i q_i K(|y - x_i|)`.

Singular kernels contribute 0 for a pair at distance 0 (so self-interaction is
excluded and coincident points are safe).
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

__all__ = ["Kernel", "Laplace3D", "get"]


class Kernel:
    """Base class: subclasses define `radial(r)` and the class constants.

    singular: K(0) is excluded (the pair contributes 0).
    dims: dimensions the kernel is defined for.
    """
    singular: ClassVar[bool] = False
    dims: ClassVar[tuple[int, ...]] = (2, 3)

    def radial(self, r):
        raise NotImplementedError

    def value_and_derivative(self, r):
        """K(r) and dK/dr for r >= 0 (r > 0 where the kernel is singular).

        The derivative comes from forward-mode autodiff of `radial`.
        """
        return jax.jvp(self.radial, (r,), (jnp.ones_like(r),))

    def from_r2(self, r2, gradient: bool):
        """K(r) and, if gradient, K'(r) / r, from r^2 > 0 (the P2P inner loop:
        d/dy K(|y - x|) = (K'(r) / r) (y - x)). Kernels may override this
        with a cheaper closed form."""
        r = jnp.sqrt(r2)
        if not gradient:
            return self.radial(r), None
        k, dk = self.value_and_derivative(r)
        return k, dk / r


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
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
        return inv, (-inv * inv * inv if gradient else None)


_BY_NAME = {"laplace3d": Laplace3D}


def get(name: str, **params) -> Kernel:
    """Kernel by name (case-insensitive), e.g. get('laplace3d')."""
    try:
        cls = _BY_NAME[name.lower()]
    except KeyError:
        raise ValueError(f"unknown kernel {name!r}; known: {sorted(_BY_NAME)}") from None
    return cls(**params)
