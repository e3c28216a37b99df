"""The configuration step: (kernel, points, eps, dtype, overrides) -> `Config`.

Every choice jfmm makes before it sums is made here, once: the expansion
family, its order and the tree depth. `fmm`, `plan` and the primitive carry
the resolved `Config`; nothing downstream decides again.

Families (each with the interface of `jfmm.ops`: operators, P2M, M2L
matrices, L2P, and NAME, SCHEME, MAX_ORDER, leaf_size, order):

    laplace3d   spherical harmonics, Laplace3D ("auto")
    laplace2d   complex Taylor/Laurent series, Laplace2D ("auto")
    chebyshev   Chebyshev interpolation, every kernel, 2D and 3D
    hermite     the fast Gauss transform, Gaussians only (SCHEME "grid":
                one grid level, no tree passes or near field)
    None        the near field alone (a Gaussian negligible beyond
                neighbouring leaves)
"""
from __future__ import annotations

import dataclasses
import functools
import numbers

import jax
import jax.numpy as jnp
import numpy as np

from jfmm import kernels as _kernels
from jfmm import tree as _tree
from jfmm._compat import Tracer
from jfmm.ops import chebyshev, hermite, laplace2d, laplace3d
from jfmm.tree import lists

FAMILIES = ("auto", "chebyshev", "hermite")
DEFAULT_EPS = {"float32": 1e-5, "float64": 1e-6}


@dataclasses.dataclass(frozen=True)
class Config:
    """A resolved configuration (hashable: a static argument of jit).

    family: the family object (None: near field only); order: its order
    (for Chebyshev, nodes per dimension); depth: the tree depth (for the
    Gauss transform, its grid level); eps: the requested error."""
    family: object
    order: int
    depth: int
    eps: float

    @property
    def name(self) -> str:
        """The family's name, or "near"."""
        return "near" if self.family is None else self.family.NAME

    def operators(self, dim: int, dtype):
        """The family's translation operators at this order, or None (near
        field only; a tree of depth < 2 has no well-separated boxes)."""
        if self.family is None or self.depth < 2:
            return None
        return self.family.operators(self.order, lists.m2l_offsets(dim), dtype)


def concrete(x) -> bool:
    """Whether x is a value (not a tracer)."""
    return not isinstance(x, Tracer)


def check_eps(eps):
    if eps is None:
        return
    if not isinstance(eps, numbers.Real) or isinstance(eps, bool):
        raise TypeError(f"eps must be a Python float (it is static), got {type(eps).__name__}")
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")


def _check_family(family) -> str:
    if family is not None and family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES} or None, got {family!r}")
    return family or "auto"


@functools.lru_cache(maxsize=None)
def chebyshev_family(dim: int):
    """One Chebyshev family object per dimension (static: used as a cache key)."""
    return chebyshev.Chebyshev(dim, **chebyshev.RULES[dim])


@functools.lru_cache(maxsize=None)
def gauss_family(dim: int):
    """One fast Gauss transform object per dimension (static)."""
    return hermite.GaussTransform(dim)


def _tree_family(kernel, dim: int, choice: str):
    """The tree-pass family for `choice` ("auto" or "chebyshev")."""
    if choice == "auto" and isinstance(kernel, _kernels.Laplace3D):
        return laplace3d
    if choice == "auto" and isinstance(kernel, _kernels.Laplace2D):
        return laplace2d
    return chebyshev_family(dim)


def resolve(sources, targets, kernel, eps, leaf_size, order, family) -> Config:
    """The `Config` of `fmm` and `plan` for prepared points.

    "auto" for a Gaussian with concrete epsilon and points: the near field
    alone where it suffices (`_near_only`), else the fast Gauss transform
    where its plan meets eps (its depth is the transform's grid level), else
    Chebyshev. The Chebyshev order comes from its error estimate for this
    kernel and these points where the kernel's parameters are concrete
    (`Chebyshev.order_for`; the worst root box size where the points are
    traced), else from the family's worst-case rule."""
    dim = sources.shape[1]
    eps = DEFAULT_EPS[jnp.dtype(sources.dtype).name] if eps is None else eps
    family = _check_family(family)
    if family == "hermite" and not isinstance(kernel, _kernels.Gaussian):
        raise ValueError(f"family 'hermite' (the fast Gauss transform) sums the Gaussian "
                         f"kernel only, got {type(kernel).__name__}")
    # The points' root box and sample pairs, drawn once (a host round trip)
    # for the estimates that use them; None for traced points or kernel
    # parameters, and where no estimate needs them.
    estimated = family == "hermite" or order is None and (
        isinstance(kernel, _kernels.Gaussian)
        or isinstance(_tree_family(kernel, dim, family), chebyshev.Chebyshev))
    sample = _pair_sample(sources, targets) if estimated and kernel.is_concrete() else None
    gauss = _gauss_plan(sources, targets, kernel, eps, order, family, sample)
    if family == "hermite":
        return Config(gauss_family(dim), gauss.order, gauss.level, eps)
    try:
        fam, p, depth = _tree_choice(sources, targets, kernel, eps, leaf_size, order, family,
                                     sample)
    except ValueError:
        if gauss is None:
            raise
        fam = None
    if fam is not None and family == "auto" and _near_only(kernel, sources, targets, eps,
                                                           depth):
        return Config(None, p, depth, eps)
    if gauss is not None:
        return Config(gauss_family(dim), gauss.order, gauss.level, eps)
    return Config(fam, p, depth, eps)


def _order(family, eps, dtype, order, points=None) -> int:
    """The order given (range-checked), else the family's rule; points:
    sqrt(N M) of the point sets (the 3D Laplace rule's rare-pair tail
    depends on it)."""
    if order is None:
        return family.order(eps, dtype, points)
    if not isinstance(order, numbers.Integral) or not 1 <= order <= family.MAX_ORDER:
        raise ValueError(f"order must be an int in [1, {family.MAX_ORDER}], got {order!r}")
    return int(order)


def _depth(n_src: int, n_tgt: int, dim: int, leaf_size, family, p: int) -> int:
    leaf = family.leaf_size(p) if leaf_size is None else int(leaf_size)
    if leaf < 1:
        raise ValueError(f"leaf_size must be >= 1, got {leaf_size}")
    return _tree.choose_depth(max(n_src, n_tgt), dim, leaf)


def _pair_sample(sources, targets, count: int = 4096):
    """The root box and `count` sample (source, target) pairs of concrete
    points (`jfmm.ops.hermite.Sample`, float64), or None where they are
    traced."""
    pts = [sources] + ([] if targets is None else [targets])
    if not all(concrete(x) for x in pts):
        return None
    tgt = sources if targets is None else targets
    rng = np.random.default_rng(0)
    with jax.ensure_compile_time_eval():
        lo, side = _tree.root_box(sources if targets is None else jnp.concatenate(pts))
        x = np.asarray(sources[rng.integers(0, sources.shape[0], count)], np.float64)
        y = np.asarray(tgt[rng.integers(0, tgt.shape[0], count)], np.float64)
    return hermite.Sample(np.asarray(lo, np.float64), float(side), x, y)


def _tree_choice(sources, targets, kernel, eps, leaf_size, order, family, sample):
    """(family object, order, depth) of the tree-pass families for `family`
    ("auto" or "chebyshev"); sample: `_pair_sample` or None."""
    n_src, dim = sources.shape
    n_tgt = n_src if targets is None else targets.shape[0]
    fam = _tree_family(kernel, dim, family)
    if order is None and isinstance(fam, chebyshev.Chebyshev) and kernel.is_concrete():
        side, r2 = (None, None) if sample is None else (
            sample.side, np.sum((sample.y - sample.x) ** 2, axis=-1))
        p = fam.order_for(eps, sources.dtype, kernel,
                          lambda n: _depth(n_src, n_tgt, dim, leaf_size, fam, n), side, r2)
    else:
        p = _order(fam, eps, sources.dtype, order, (n_src * n_tgt) ** 0.5)
    return fam, p, _depth(n_src, n_tgt, dim, leaf_size, fam, p)


def _gauss_plan(sources, targets, kernel, eps, order, family, sample):
    """The fast Gauss transform's (level, order) for these points
    (`GaussTransform.plan`), or None where "auto" should use another
    family: not a Gaussian, traced epsilon or points, an order given, eps
    below the transform's rounding floor, or no plan meets eps.
    family="hermite" raises instead."""
    if family not in ("auto", "hermite"):
        return None
    dim = sources.shape[1]
    explicit = family == "hermite"
    if not explicit and (not isinstance(kernel, _kernels.Gaussian) or order is not None
                         or eps < hermite.ROUNDING_FLOOR[jnp.dtype(sources.dtype).name]):
        return None
    if sample is None:
        if explicit:
            raise ValueError("family 'hermite' needs concrete points and epsilon (its grid "
                             "and order depend on their values): call it outside jit, or "
                             "use family='chebyshev'")
        return None
    fgt = gauss_family(dim)
    if order is not None:
        _order(fgt, eps, sources.dtype, order)                  # range check
    n_points = sources.shape[0] + (0 if targets is None else targets.shape[0])
    choice = fgt.plan(eps, sources.dtype, float(kernel.epsilon), sample, n_points, order)
    if choice is None and explicit:
        raise ValueError(f"eps={eps:g} is below what the fast Gauss transform reaches for "
                         f"{kernel} on these points (order <= {hermite.MAX_ORDER}, grid of at "
                         f"most {hermite.GRID_VALUES} coefficients); use family='chebyshev' "
                         f"or a larger eps")
    return choice


def _near_only(kernel, sources, targets, eps, depth) -> bool:
    """Whether the far field is negligible: every pair of non-adjacent
    leaves is farther apart than the kernel's cutoff for 0.1 eps (the leaf
    side, at least the points' extent / 2^depth, exceeds it). Decided only
    where the kernel's parameters and the points are concrete."""
    cut = kernel.cutoff(0.1 * eps)
    pts = [sources] + ([] if targets is None else [targets])
    if cut is None or depth < 2 or not all(concrete(x) for x in pts):
        return False
    with jax.ensure_compile_time_eval():
        both = jnp.concatenate(pts)
        extent = float(jnp.max(jnp.max(both, axis=0) - jnp.min(both, axis=0)))
    return extent / 2 ** depth >= cut
