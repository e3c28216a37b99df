"""The configuration step: (kernel, points, eps, dtype, overrides) -> `Config`.

Every choice jfmm makes before it sums is made here, once: the expansion
family, its order and the tree depth. `fmm`, `plan` and the primitive carry
the resolved `Config`; nothing downstream decides again.

Families (each with the interface of `jfmm.ops`: operators, P2M, M2L
matrices, L2P, NAME and SCHEME; their orders from `jfmm.models`):

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
from jfmm.models import Points, Sample
from jfmm.models import chebyshev as chebyshev_model
from jfmm.models import hermite as hermite_model
from jfmm.models import laplace2d as laplace2d_model
from jfmm.models import laplace3d as laplace3d_model
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
    return chebyshev.Chebyshev(dim)


@functools.lru_cache(maxsize=None)
def gauss_family(dim: int):
    """One fast Gauss transform object per dimension (static)."""
    return hermite.GaussTransform(dim)


def _tree_family(kernel, dim: int, choice: str):
    """The tree-pass family for `choice` ("auto" or "chebyshev") and its model."""
    if choice == "auto" and isinstance(kernel, _kernels.Laplace3D):
        return laplace3d, laplace3d_model
    if choice == "auto" and isinstance(kernel, _kernels.Laplace2D):
        return laplace2d, laplace2d_model
    return chebyshev_family(dim), chebyshev_model


def resolve(sources, targets, kernel, eps, leaf_size, order, family) -> Config:
    """The `Config` of `fmm` and `plan` for prepared points.

    Laplace kernels ("auto"): their series families. A Gaussian ("auto",
    concrete epsilon and points, no order given): the near field alone
    where it suffices (`_near_only`), else the fast Gauss transform where
    its plan meets eps, else Chebyshev. Every other kernel: Chebyshev.
    Each family's order and depth come from its model (`jfmm.models`)."""
    n_src, dim = sources.shape
    n_tgt = n_src if targets is None else targets.shape[0]
    dtype = sources.dtype
    eps = DEFAULT_EPS[jnp.dtype(dtype).name] if eps is None else eps
    family = _check_family(family)
    gaussian = isinstance(kernel, _kernels.Gaussian)
    if family == "hermite" and not gaussian:
        raise ValueError(f"family 'hermite' (the fast Gauss transform) sums the Gaussian "
                         f"kernel only, got {type(kernel).__name__}")
    fam, model = _tree_family(kernel, dim, family)
    # The points' root box and sample pairs, drawn once (a host round trip)
    # for the models that use them; None for traced points or parameters.
    sampled = family == "hermite" or order is None and (gaussian or model is chebyshev_model)
    sample = _pair_sample(sources, targets) if sampled and kernel.is_concrete() else None
    points = Points(n_src, n_tgt, n_src + (0 if targets is None else n_tgt), dim, leaf_size,
                    sample)
    gauss = None
    if family == "hermite" or (family == "auto" and gaussian and order is None and eps
                               >= hermite_model.ROUNDING_FLOOR[jnp.dtype(dtype).name]):
        gauss = hermite_model.choose(kernel, eps, dtype, points, order,
                                      explicit=family == "hermite")
    if family == "hermite":
        return Config(gauss_family(dim), gauss.order, gauss.depth, eps)
    try:
        choice = model.choose(kernel, eps, dtype, points, order)
    except ValueError:
        if gauss is None:
            raise
        choice = None
    if choice is not None and family == "auto" and _near_only(kernel, sources, targets, eps,
                                                              choice.depth):
        return Config(None, choice.order, choice.depth, eps)
    if gauss is not None:
        return Config(gauss_family(dim), gauss.order, gauss.depth, eps)
    return Config(fam, choice.order, choice.depth, eps)


def _pair_sample(sources, targets, count: int = 4096):
    """The root box and `count` sample (source, target) pairs of concrete
    points (`jfmm.models.Sample`, float64), or None where they are traced."""
    pts = [sources] + ([] if targets is None else [targets])
    if not all(concrete(x) for x in pts):
        return None
    tgt = sources if targets is None else targets
    rng = np.random.default_rng(0)
    with jax.ensure_compile_time_eval():
        lo, side = _tree.root_box(sources if targets is None else jnp.concatenate(pts))
        x = np.asarray(sources[rng.integers(0, sources.shape[0], count)], np.float64)
        y = np.asarray(tgt[rng.integers(0, tgt.shape[0], count)], np.float64)
    return Sample(np.asarray(lo, np.float64), float(side), x, y)


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
