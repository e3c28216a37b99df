"""Error models and planners: how each expansion family chooses its order
and tree depth for a kernel, eps, dtype and the points.

Every family's model is a module here with one entry point,

    choose(kernel, eps, dtype, points, order=None, gradient=True) -> Choice | None

(None: the family declines these points, and the configuration step tries
another). `points` describes the point sets without their arrays (`Points`);
`order` is a caller's override, range-checked; `gradient`: whether grad
phi's error must be within eps too, not only phi's. jfmm.configure pairs each
family with its model; the operators stay in jfmm.ops.
"""
from __future__ import annotations

import numbers
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from jfmm.tree import choose_depth


class Sample(NamedTuple):
    """Concrete points' root box and sample (source, target) pairs (float64)."""
    lo: np.ndarray        # (d,)
    side: float
    x: np.ndarray         # (S, d) sources of the sample pairs
    y: np.ndarray         # (S, d) their targets


class Points(NamedTuple):
    """The point sets a model chooses for: sizes (n_tgt = n_src where the
    targets are the sources), the points stored (n_src, or n_src + n_tgt
    for separate targets), dimension, the mean points per leaf asked for
    (None: the family's own), a `Sample` (None where the points are
    traced), and for an adaptive tree (root side, {level: share of the
    source-target pairs translated there} (`adaptive.pair_shares`), the
    kernel's moments over its points (`chebyshev.exact_moments`)); None: a
    uniform tree's; charged: the moments of the charges to be summed
    (`configure.charge_moments`), None where they are not known."""
    n_src: int
    n_tgt: int
    n_points: int
    dim: int
    leaf_size: int | None
    sample: Sample | None
    shares: tuple | None = None
    charged: tuple | None = None


class Choice(NamedTuple):
    """A family's order and tree depth (for the fast Gauss transform, its
    grid level); check: the Chebyshev estimate kept for the sums' check
    of their charges (`chebyshev.ChargeCheck`), None elsewhere."""
    order: int
    depth: int
    check: object = None


def strided(points, count: int = 256):
    """Up to `count` of the points (M, d), evenly strided: the targets at
    which the models sum over every source (jit-able)."""
    return points[::max(1, points.shape[0] // count)][:count]


def checked_order(order, max_order: int) -> int | None:
    """A caller's order, range-checked; None where none was given."""
    if order is None:
        return None
    if not isinstance(order, numbers.Integral) or not 1 <= order <= max_order:
        raise ValueError(f"order must be an int in [1, {max_order}], got {order!r}")
    return int(order)


def depth_for(points: Points, leaf_size: int) -> int:
    """The tree depth for the points at the caller's leaf size, else `leaf_size`."""
    leaf = leaf_size if points.leaf_size is None else int(points.leaf_size)
    if leaf < 1:
        raise ValueError(f"leaf_size must be >= 1, got {points.leaf_size}")
    return choose_depth(max(points.n_src, points.n_tgt), points.dim, leaf)


class Unreachable(ValueError):
    """An eps below what a family reaches on the points; `reachable`: the
    smallest eps its estimate reaches there (None where unknown)."""

    def __init__(self, message: str, reachable: float | None = None):
        super().__init__(message)
        self.reachable = reachable


def check_floor(eps: float, dtype, eps_floor: dict, family: str):
    """ValueError for an eps below the dtype's floor ({dtype name: smallest
    eps reached}); family names the family in the message."""
    name = jnp.dtype(dtype).name
    floor = eps_floor[name]
    if eps < floor:
        hint = "; use float64 inputs with jax_enable_x64" if name == "float32" else ""
        raise ValueError(f"eps={eps:g} is below what {family} reaches in {name} "
                         f"(about {floor:.1e}){hint}")


def choose_order(eps: float, dtype, eps_floor: dict, orders, error_bound, family: str) -> int:
    """The smallest order whose assumed error is <= eps (the largest order
    if none is); error_bound(order): the error the rule assumes. Raises
    (`check_floor`) for an eps below the dtype's floor."""
    check_floor(eps, dtype, eps_floor, family)
    return min(p for p in orders if error_bound(p) <= eps or p == orders[-1])


def series_choice(order_for_eps, max_order: int, leaf_size, eps: float, dtype, points: Points,
                  order: int | None, gradient: bool) -> Choice:
    """The Laplace series families' choice: the order from eps for
    sqrt(N M) point pairs, of phi or also of grad phi (or `order`,
    range-checked), the depth from its leaf size."""
    p = checked_order(order, max_order)
    if p is None:
        p = order_for_eps(eps, dtype, (points.n_src * points.n_tgt) ** 0.5, gradient)
    return Choice(p, depth_for(points, leaf_size(p)))

