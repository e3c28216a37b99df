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

import collections
import dataclasses
import functools
import numbers

import jax
import jax.numpy as jnp
import numpy as np

from jfmm import _compat
from jfmm import kernels as _kernels
from jfmm import tree as _tree
from jfmm._compat import Tracer, known_value
from jfmm.tree import adaptive as _adaptive
from jfmm.models import Points, Sample, Unreachable, check_floor, depth_for, strided
from jfmm.models import chebyshev as chebyshev_model
from jfmm.models import hermite as hermite_model
from jfmm.models import laplace2d as laplace2d_model
from jfmm.models import laplace3d as laplace3d_model
from jfmm.ops import backend, chebyshev, hermite, laplace2d, laplace3d
from jfmm.tree import lists

FAMILIES = ("auto", "chebyshev", "hermite")
TREES = ("auto", "uniform", "adaptive")
# tree="auto" on concrete points builds an adaptive tree where the uniform
# tree of the chosen depth would do this many times the near-field work it
# does on evenly spread points (`jfmm.tree.crowding`). H100, 3D Laplace,
# 2^20 points, float32 eps 1e-5 (docs/BENCHMARKS.md, "Adaptive tree"): a
# sphere's surface (crowding 4.4) ran 9.2 ms on the uniform tree and 24 on
# the adaptive one, Plummer (1,180) 808 against 30, clusters (530) 357
# against 44; the bar sits between them, where nothing was measured.
# Shallower trees cannot reach it (`crowding_bar`).
CROWDING = 20.0
# An adaptive tree's leaves hold at most this many times the uniform tree's
# mean points per leaf, by dtype (larger leaves: more pairs for the near
# field, fewer boxes for M2L). H200, 3D Laplace, 2^20 points, total ms at
# 2, 4, 8, 16 times (docs/BENCHMARKS.md, "Adaptive tree"): float32 eps 1e-5
# Plummer -, 13.1, 11.9, 12.8, clusters -, 16.1, 14.1, 15.1; float64 eps
# 1e-8 Plummer 72.6, 76.7, 96.0, -, clusters -, 95.9, 106.7, -.
ADAPTIVE_LEAF = {"float32": 8, "float64": 2}
DEFAULT_EPS = {"float32": 1e-5, "float64": 1e-6}


def floor(kernel, dim: int, dtype, family: str = "auto") -> float:
    """The smallest eps every call of this kernel, dimension, dtype and
    family reaches: its family's floor; for a kernel summed as 1/r beyond
    a core, the series' over CORE_RATIO (traced points)."""
    dt = jnp.dtype(dtype).name
    if family == "hermite":
        return hermite_model.ROUNDING_FLOOR[dt]
    least = _FLOORS[_tree_family(kernel, dim, family)[0].NAME][dt]
    return least / CORE_RATIO if family == "auto" and _cored(kernel, dim) else least


def default_eps(kernel, dim: int, dtype, family: str = "auto") -> float:
    """eps where the caller gives none: DEFAULT_EPS, or the `floor` where
    that is higher (float32: 2e-5 for Chebyshev and the fast Gauss
    transform)."""
    return max(DEFAULT_EPS[jnp.dtype(dtype).name], floor(kernel, dim, dtype, family))


@dataclasses.dataclass(frozen=True)
class Config:
    """A resolved configuration (hashable: a static argument of jit).

    family: the family object (None: near field only); order: its order
    (for Chebyshev, nodes per dimension); depth: the tree depth (for the
    Gauss transform, its grid level); eps: the requested error; gradient:
    False where the order keeps phi's error alone within eps (a plan for
    phi alone refuses gradients and derivatives along point moves), True
    where grad phi's too (a caller's order: asked for either); tree:
    "uniform" (depth levels) or "adaptive" (`jfmm.tree.adaptive`, leaves of
    at most `leaf` points that are not coincident; depth is then the
    uniform tree's, which the orders were chosen for); mesh: None, or the
    one-axis `jax.sharding.Mesh` whose devices share the work
    (`jfmm.distributed`); reach: where a family's own kernel stands in
    for the caller's beyond a distance (`Kernel.laplace_beyond`), that
    distance: leaves must be at least as large (uniform trees only; a
    plan's points that break it give NaN); fallback: for traced points
    with a reach, the configuration for points whose leaves come out
    smaller than the reach or whose ratio is below `ratio` (the series at a
    lower ratio, or the direct sum; `jfmm.api` chooses at run time,
    `series_fit`), or for traced points on an adaptive tree the
    uniform configuration for points that do not crowd it (`crowded`);
    ratio: for traced points with a reach, the ratio of the sums' norms
    (`core_ratio`) the order was chosen for: the series sum the points
    only where theirs is no smaller (`series_fit`);
    check: the Chebyshev estimate at this order, with
    which the sums check their own charges (`models.chebyshev.ChargeCheck`;
    None for other families and a caller's order; jitted sums take it as
    arrays beside `static`)."""
    family: object
    order: int
    depth: int
    eps: float
    gradient: bool = True
    tree: str = "uniform"
    leaf: int = 0
    mesh: object = None
    reach: float = 0.0
    fallback: Config | None = None
    ratio: float = 0.0
    check: object = None

    def with_mesh(self, mesh) -> Config:
        """This configuration (and its fallback) on `mesh`."""
        fallback = None if self.fallback is None else self.fallback.with_mesh(mesh)
        return dataclasses.replace(self, mesh=mesh, fallback=fallback)

    @property
    def static(self) -> Config:
        """This configuration without its check's values (and its
        fallback's): the static argument of jit, shared by configurations
        that differ in them alone."""
        fallback = None if self.fallback is None else self.fallback.static
        return dataclasses.replace(self, check=None, fallback=fallback)

    @property
    def check_arrays(self):
        """The check (`ChargeCheck`) as arrays, or None."""
        return None if self.check is None else self.check.arrays()

    @property
    def name(self) -> str:
        """The family's name, or "near"."""
        return "near" if self.family is None else self.family.NAME

    @property
    def last(self) -> Config:
        """The configuration at the end of the fallback chain: the one
        that serves every extent of the points."""
        return self if self.fallback is None else self.fallback.last

    def operators(self, dim: int, dtype):
        """The family's translation operators at this order, or None (near
        field only; a tree of depth < 2 has no well-separated boxes)."""
        if self.family is None or self.depth < 2:
            return None
        return self.family.operators(self.order, lists.m2l_offsets(dim), dtype)


def eager(f, *args):
    """f(*args) of concrete arguments as a value, also inside a user's
    trace (where a jitted f would be staged into it). Outside one, a
    jitted f compiles and runs as one program: under
    ensure_compile_time_eval each constant computation inside it (index
    tables, Morton codes) would run op by op, each op compiled alone."""
    if not _compat.tracing():
        return f(*args)
    with jax.ensure_compile_time_eval():
        return f(*args)


def concrete(x) -> bool:
    """Whether x is a value (not a tracer)."""
    return not isinstance(x, Tracer)


def check_eps(eps):
    if eps is None:
        return
    if not isinstance(eps, numbers.Real) or isinstance(eps, bool):
        raise TypeError(f"eps must be a Python float (it is static), got {type(eps).__name__}")
    if not 0 < eps < 1:
        raise ValueError(f"eps, the relative error asked for, must be in (0, 1), got {eps}")


def _check_tree(tree) -> str:
    if tree not in TREES:
        raise ValueError(f"tree must be one of {TREES}, got {tree!r}")
    return tree


def choose_tree(config: Config, sources, targets, tree: str = "auto", order=None) -> Config:
    """The configuration on the tree `tree` asks for ("auto": adaptive
    where the points crowd the uniform tree, `crowding_bar`). Only the series
    and Chebyshev families with far fields run on adaptive trees (the fast
    Gauss transform has its grid; the near field alone and the direct sum
    keep the uniform boxes their choice was made for; "auto" keeps float32
    Chebyshev gradients on it, whose rounding grows with the depth,
    `chebyshev.gradient_rounding`). Traced points get a tree of bounded
    capacities (`jfmm.api`), "auto" with the uniform configuration as its
    fallback, taken at run time where the points do not crowd (`crowded`),
    except where they cannot (a tree this shallow); float32 Chebyshev
    kernels keep the uniform tree there. order: the caller's."""
    tree = _check_tree(tree)
    pts = [sources] + ([] if targets is None else [targets])
    fits = (config.family is not None and config.family.SCHEME == "tree"
            and config.depth >= 2 and not config.reach)
    if tree == "uniform" or not fits:
        if tree == "adaptive" and config.reach:
            raise ValueError("tree='adaptive' is not available for kernels summed as 1/r "
                             "beyond a core (Kernel.laplace_beyond): their leaves must "
                             "not be smaller than the core; use tree='uniform'")
        if tree == "adaptive":
            raise ValueError(f"tree='adaptive' needs a far field of the series or Chebyshev "
                             f"families; this call sums with {config.name!r} "
                             f"(depth {config.depth})")
        return config
    traced = not all(concrete(x) for x in pts)
    if traced and config.name == "chebyshev" and jnp.dtype(sources.dtype) == jnp.float32:
        # Traced points bound the gradient's error, and float32 Chebyshev
        # gradients round beyond eps on deep leaves (`gradient_rounding`),
        # which their unknown scale cannot rule out.
        if tree == "adaptive":
            raise ValueError("tree='adaptive' on traced float32 points serves the Laplace "
                             "series: float32 Chebyshev gradients round beyond eps on deep "
                             "leaves; use float64 points, or make an adaptive plan outside "
                             "jit with jfmm.plan(..., tree='adaptive') and move its points "
                             "inside with Plan.update")
        return config
    bar = crowding_bar(sources.shape[1], config.depth)
    if traced and tree == "auto" and bar is None:
        # A tree this shallow keeps the uniform tree whatever the points, so
        # only it is compiled.
        return config
    if traced:
        # A tree of bounded capacities (`adaptive.bounded_capacities`), which
        # holds any points of these shapes; "auto" takes it at run time where
        # the points crowd the uniform tree (`jfmm.api`), else the uniform one.
        adaptive = on_tree(dataclasses.replace(config, tree="adaptive",
                                               leaf=adaptive_leaf(config, sources, targets)),
                           None, None, sources, targets, order)
        if tree == "adaptive":
            return adaptive
        return dataclasses.replace(adaptive, fallback=config)
    if tree == "auto":
        # Deep adaptive leaves put float32 Chebyshev gradients out of reach
        # (`chebyshev.gradient_rounding`): those keep the uniform tree.
        if (config.name == "chebyshev" and config.gradient
                and jnp.dtype(sources.dtype) == jnp.float32):
            return config
        if bar is None:
            return config
        crowded = float(eager(_tree.crowding, sources, targets, config.depth)) > bar
        if not crowded:
            return config
    return dataclasses.replace(config, tree="adaptive",
                               leaf=adaptive_leaf(config, sources, targets))


def crowding_bar(dim: int, depth: int) -> float | None:
    """The crowding above which "auto" takes the adaptive tree over the
    uniform one of `depth`: CROWDING, or on trees too shallow to reach it
    half the most there is (all points in one leaf's neighbourhood), where
    the near field holds half of all pairs. None below depth 3: the near
    field holds most pairs whatever the points. 2-core CPU, float64 eps
    1e-6, 2^16 points at depth 3 (most 19): Plummer (crowding 18.9) 43.7 s
    on the uniform tree, 10.6 on the adaptive one; clusters (18.2) 33.3
    against 8.9; the cube (0.9) 6.3 against 6.6, a sphere (1.1) 7.8
    against 6.5. At 2^14, depth 2, Plummer took 6.1 s on either."""
    if depth < 3:
        return None
    return min(CROWDING, 2.0 ** (dim * depth) / 3.0 ** dim / 2)


def adaptive_leaf(config: Config, sources, targets) -> int:
    """An adaptive tree's leaf size: `ADAPTIVE_LEAF` times the mean points
    per leaf of the uniform tree of the configuration's depth."""
    count = max(x.shape[0] for x in [sources] + ([] if targets is None else [targets]))
    factor = ADAPTIVE_LEAF["float64" if sources.dtype == jnp.float64 else "float32"]
    return max(8, factor * -(-count // 2 ** (sources.shape[1] * config.depth)))


# The far field's share of sum 1/r^2 (`laplace3d.far_share`) on evenly
# spread points, per depth of the uniform tree from 2: a fixed draw of
# 16,384 points in the unit cube (numpy's default_rng(0).random((16384,
# 3)), float32); 1 from depth 8 on, where that draw's leaves hold a point
# or two. A table, because computing it compiled far_share once per depth
# (0.43 s each on the 2-core CPU) in every first call of a process.
CUBE_SHARE = (0.27483356, 0.57484913, 0.77093321, 0.88599855, 0.94966048, 0.98385388)


def cube_share(depth: int) -> float:
    """`CUBE_SHARE` at `depth` (>= 2)."""
    return CUBE_SHARE[depth - 2] if depth - 2 < len(CUBE_SHARE) else 1.0


def on_uniform(config: Config, kernel, sources, targets, order=None,
               leaf_size=None) -> Config:
    """The configuration for concrete points on a uniform tree: the 3D
    Laplace series' order from an error weighed by the far field's share of
    the sums (`laplace3d.far_factor`): where the points crowd the tree's
    leaves (a sphere's surface, clusters) the near field, which is exact,
    carries most of them. The depth follows the order (unless `leaf_size`
    is given), and the share is that of the tree the order is chosen for,
    the larger of the sum's and its adjoint's. Never a higher order; a
    caller's `order`, traced points, cored kernels and trees of depth < 2
    keep theirs."""
    pts = [sources] + ([] if targets is None else [targets])
    if (config.tree != "uniform" or config.name != "laplace3d" or order is not None
            or config.reach or config.depth < 2 or not all(concrete(x) for x in pts)):
        return config
    n_src, dim = sources.shape
    n_tgt = n_src if targets is None else targets.shape[0]
    points = Points(n_src, n_tgt, n_src + (0 if targets is None else n_tgt), dim, leaf_size,
                    None)

    def order_at(depth):
        share = float(eager(laplace3d_model.far_share, sources, targets, depth))
        far = laplace3d_model.far_factor(share, cube_share(depth))
        return min(config.order, laplace3d_model.order_for_eps(
            config.eps, sources.dtype, (n_src * n_tgt) ** 0.5, config.gradient, far))

    p, depth = order_at(config.depth), config.depth
    moved = depth_for(points, laplace3d_model.leaf_size(p))
    if moved != depth and moved >= 2:       # the order for the tree it takes
        p, depth = order_at(moved), moved
    return dataclasses.replace(config, order=p, depth=depth)


def on_tree(config: Config, tree, kernel, sources, targets, order=None,
            charged=None) -> Config:
    """The configuration for a built adaptive tree: the Chebyshev family's
    order from the error of the levels this tree translates at, weighed by
    the pairs it translates there (`adaptive.pair_shares`; a kernel with a
    length scale errs most on boxes of about that size, which a clustered
    tree may hold far below the uniform tree's depth). The series families'
    errors do not depend on the box size: their order stands, as does a
    caller's `order`, except the 2D series' gradient on adaptive trees,
    which errs more than on the uniform trees its table was measured on
    (`laplace2d.on_adaptive`), and the 3D series, whose potential errs
    2.5-2.7x its typical error there (1.8-1.9x on uniform trees) and whose
    gradient, in small sets, errs most at a target beside a dense cluster:
    the larger margins of `laplace3d.order_for_eps(adaptive=True)`.
    charged: as in `resolve`."""
    if config.tree != "adaptive" or config.family is None or order is not None:
        return config
    if config.name == "laplace2d":
        return dataclasses.replace(config, order=laplace2d_model.on_adaptive(config.order,
                                                                             config.gradient))
    if config.name == "laplace3d":
        n_tgt = sources.shape[0] if targets is None else targets.shape[0]
        p = laplace3d_model.order_for_eps(config.eps, sources.dtype,
                                          (sources.shape[0] * n_tgt) ** 0.5, config.gradient,
                                          adaptive=True)
        return dataclasses.replace(config, order=max(p, config.order))
    if config.name != "chebyshev" or tree is None:
        # Traced points (no tree yet): the order chosen for the worst of
        # root boxes over 20 decades bounds the error on boxes of any size.
        return config
    kernel = known_kernel(kernel)
    if not kernel.is_concrete():
        return config
    shares = np.asarray(eager(_adaptive.pair_shares, tree), np.float64)
    levels = {level: float(v) for level, v in enumerate(shares) if v > 0}
    n_src, dim = sources.shape
    n_tgt = n_src if targets is None else targets.shape[0]
    sample = _pair_sample(sources, targets)
    side = float(tree.side)
    with chebyshev_model._float64(), jax.ensure_compile_time_eval():
        few = jnp.asarray(sample.y[:256])
        moments = chebyshev_model.exact_moments(kernel, jnp.asarray(sources, few.dtype), few,
                                                sample.x, sample.y, side, dim)
    points = Points(n_src, n_tgt, n_src + (0 if targets is None else n_tgt), dim, None,
                    sample, (side, levels, moments), charged)
    choice = chebyshev_model.choose(kernel, config.eps, sources.dtype, points, None,
                                    config.gradient)
    return dataclasses.replace(config, order=choice.order, check=choice.check)


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


def _cored(kernel, dim: int) -> bool:
    """Whether a kernel other than Laplace3D is 1/r beyond a distance
    (`Kernel.laplace_beyond`): the 3D series carry its far field."""
    return (dim == 3 and not isinstance(kernel, _kernels.Laplace3D)
            and kernel.laplace_beyond(0.5) is not None)


def _tree_family(kernel, dim: int, choice: str):
    """The tree-pass family for `choice` ("auto" or "chebyshev") and its model."""
    if choice == "auto" and (isinstance(kernel, _kernels.Laplace3D) or _cored(kernel, dim)):
        return laplace3d, laplace3d_model
    if choice == "auto" and isinstance(kernel, _kernels.Laplace2D):
        return laplace2d, laplace2d_model
    return chebyshev_family(dim), chebyshev_model


def resolve(sources, targets, kernel, eps, leaf_size, order, family, sample=False,
            gradient=True, tree="auto", charged=None) -> Config:
    """The `Config` of `fmm` and `plan` for prepared points.

    Below the direct sum's crossover (`DIRECT_PAIRS`; "auto", no order,
    leaf size or tree given): the near field of a one-box tree, i.e. every
    pair.
    Laplace kernels ("auto"): their series families. A Gaussian ("auto",
    concrete epsilon and points, no order given): the near field alone
    where it suffices (`_near_only`), else the fast Gauss transform where
    its plan meets eps, else Chebyshev. Every other kernel: Chebyshev.
    Each family's order and depth come from its model (`jfmm.models`).
    sample: the points' `_pair_sample` where the caller drew it already.
    gradient: whether grad phi's error must be within eps too (each
    family's model then chooses for the larger of the two errors).
    Kernel parameters differentiated eagerly (jax.grad outside jit) choose
    by their values (`known_kernel`). charged: the moments of the charges
    to be summed (`charged`), for the Chebyshev family's estimate, or
    their `hermite.Cancellation` for the fast Gauss transform's."""
    kernel = known_kernel(kernel)
    n_src, dim = sources.shape
    n_tgt = n_src if targets is None else targets.shape[0]
    dtype = sources.dtype
    family = _check_family(family)
    eps = default_eps(kernel, dim, dtype, family) if eps is None else eps
    gaussian = isinstance(kernel, _kernels.Gaussian)
    if family == "hermite" and not gaussian:
        raise ValueError(f"family 'hermite' (the fast Gauss transform) sums the Gaussian "
                         f"kernel only, got {type(kernel).__name__}")
    fam, model = _tree_family(kernel, dim, family)
    if _direct(kernel, dim, dtype, n_src, n_tgt, eps, order, leaf_size, family, tree):
        check_floor(eps, dtype, _FLOORS[fam.NAME], f"the {fam.NAME} family")
        return Config(None, 1, 0, eps)
    # The points' root box and sample pairs, drawn once (a host round trip)
    # for the models that use them; None for traced points or parameters.
    if sample is False:
        sample = _pair_sample(sources, targets) if _sampled(kernel, dim, order, family) else None
    cancel = charged if isinstance(charged, hermite_model.Cancellation) else None
    points = Points(n_src, n_tgt, n_src + (0 if targets is None else n_tgt), dim, leaf_size,
                    sample, charged=None if cancel is not None else charged)
    gauss = None
    if _tries_gauss(kernel, family, dtype, eps) and (family == "hermite" or order is None):
        gauss = hermite_model.choose(kernel, eps, dtype, points, order, gradient,
                                      explicit=family == "hermite", cancel=cancel)
    if family == "hermite":
        return Config(gauss_family(dim), gauss.order, gauss.depth, eps, gradient)
    if family == "auto" and _cored(kernel, dim):    # its own eps for the series' order
        return _core_config(kernel, eps, order, gradient, sources, targets, points)
    try:
        choice = model.choose(kernel, eps, dtype, points, order, gradient)
    except ValueError:
        if gauss is None:
            raise
        choice = None
    if choice is not None and family == "auto" and _near_only(kernel, sources, targets, eps,
                                                              choice.depth):
        return Config(None, choice.order, choice.depth, eps)
    if gauss is not None:
        return Config(gauss_family(dim), gauss.order, gauss.depth, eps, gradient)
    return Config(fam, choice.order, choice.depth, eps, gradient, check=choice.check)


# A kernel that is 1/r beyond a core has the series' far field but sums
# smaller than 1/r's near it, so the series' absolute error is a larger
# share of them: the series run at eps times the ratio of the sums' norms
# (`core_ratio`). Traced points assume CORE_RATIO, and the series sum them
# only where their own ratio is no smaller. Below it, where all pairs
# would number at least SERIES_FALLBACK_PAIRS, the series at LOW_RATIO
# (about three orders more) take them: crowded points' ratios fall as they
# grow (two vortex rings of 2^15, 2^18 and 2^20 elements in filaments,
# core 0.02: 0.24, 0.09-0.15, 0.017), and all pairs of 2^18 cost 10x the
# series (H200, float64, stretching: 1,573 ms against 154). Else all pairs.
CORE_RATIO = 0.1
LOW_RATIO = 0.01
SERIES_FALLBACK_PAIRS = 2 ** 32
_RATIO_TARGETS = 256


def core_ratio(kernel, sources, targets, gradient: bool):
    """The norm of the sums of random charges with `kernel` over that with
    1/r (of phi, and the smaller with grad phi's where `gradient`): sqrt of
    the mean over up to 256 evenly strided targets of sum_i K(r_i)^2 (and
    K'(r_i)^2) over every source, in [0, 1] (a scalar array; jit-able)."""
    y = strided(sources if targets is None else targets, _RATIO_TARGETS)
    sources, y = jax.lax.stop_gradient((sources, y))
    ratio = (chebyshev_model.square_sums(kernel, sources, y)
             / chebyshev_model.square_sums(_kernels.Laplace3D(), sources, y))
    ratio = jnp.minimum(ratio[0], ratio[1]) if gradient else ratio[0]
    return jnp.sqrt(jnp.clip(jnp.nan_to_num(ratio), 0.0, 1.0))


def _core_config(kernel, eps: float, order, gradient: bool, sources, targets,
                 points: Points) -> Config:
    """The series configuration of a kernel that is 1/r beyond `reach`
    (to 0.1 eps), at eps times the points' `core_ratio` (concrete points;
    Chebyshev's configuration where the series cannot reach that) or
    CORE_RATIO (traced). Leaves at least `reach` large, so that the near
    field holds every pair the series would get wrong: points known at
    trace time (concrete, or under eager autodiff) take fewer levels where
    their leaves would be smaller (at depth < 2 all pairs are near);
    traced points keep the depth, and where their leaves or ratio turn out
    smaller take the series at a lower ratio or all pairs (`_traced_core`,
    `series_fit`; Chebyshev's interpolation errs across the compact core's
    kink)."""
    dim, dtype = sources.shape[1], sources.dtype
    reach = kernel.laplace_beyond(0.1 * eps)
    pts = [known_value(x) for x in (sources, targets) if x is not None]
    known = all(concrete(x) for x in pts)
    ratio = CORE_RATIO
    if known:
        with jax.ensure_compile_time_eval():
            ratio = float(core_ratio(kernel, *(known_value(x) for x in (sources, targets)),
                                     gradient))
    if order is None and eps * ratio < laplace3d_model.EPS_FLOOR[jnp.dtype(dtype).name]:
        choice = chebyshev_model.choose(kernel, eps, dtype, points, None, gradient)
        return Config(chebyshev_family(dim), choice.order, choice.depth, eps, gradient,
                      check=choice.check)
    if not known:
        return _traced_core(kernel, eps, dtype, points, order, gradient, reach)
    choice = laplace3d_model.choose(kernel, eps * ratio, dtype, points, order, gradient)
    depth = choice.depth
    with jax.ensure_compile_time_eval():
        side = float(_tree.root_box(jnp.concatenate(pts))[1])
    while depth >= 2 and side / 2 ** depth < reach:
        depth -= 1
    return Config(laplace3d, choice.order, depth, eps, gradient, reach=reach)


def _traced_core(kernel, eps: float, dtype, points: Points, order, gradient: bool,
                 reach: float) -> Config:
    """`_core_config` of traced points: the series at eps times CORE_RATIO,
    falling back (`series_fit`) to the series at LOW_RATIO where all pairs
    would number SERIES_FALLBACK_PAIRS or more and the family reaches it
    (no caller's order), then to all pairs. Each series at the depth its
    order takes for the count."""
    fallback = Config(None, 1, 0, eps)
    ratios = [CORE_RATIO]
    if (order is None and points.n_src * points.n_tgt >= SERIES_FALLBACK_PAIRS
            and eps * LOW_RATIO >= laplace3d_model.EPS_FLOOR[jnp.dtype(dtype).name]):
        ratios.append(LOW_RATIO)
    for ratio in reversed(ratios):
        choice = laplace3d_model.choose(kernel, eps * ratio, dtype, points, order, gradient)
        fallback = Config(laplace3d, choice.order, choice.depth, eps, gradient, reach=reach,
                          fallback=fallback, ratio=ratio)
    return fallback


# Traced points are judged by at most this many of them (`crowded`).
CROWDING_SAMPLE = 2 ** 16


def crowded(config: Config, sources, targets):
    """Whether traced points crowd the uniform tree of the fallback's depth
    (`jfmm.tree.crowding` of an evenly strided sample of at most
    CROWDING_SAMPLE of each above `crowding_bar`): where an adaptive
    configuration with a uniform fallback takes its adaptive tree. A
    traced bool; under vmap one for the whole batch (any member crowded:
    the adaptive tree for all), so that `lax.cond` runs one branch."""
    def few(x):
        return None if x is None else x[::max(1, -(-x.shape[0] // CROWDING_SAMPLE))]

    pts = jax.lax.stop_gradient((few(sources), few(targets)))
    bar = crowding_bar(sources.shape[1], config.fallback.depth)
    return _whole_batch(_tree.crowding(*pts, config.fallback.depth) > bar)


@jax.custom_batching.custom_vmap
def _whole_batch(flag):
    return flag


@_whole_batch.def_vmap
def _whole_batch_rule(axis_size, in_batched, flag):
    return jnp.any(flag) if in_batched[0] else flag, False


def series_fit(config: Config, kernel, sources, targets):
    """Whether a configuration with a fallback sums these (traced) points
    with its series: the uniform tree of its depth has leaves no smaller
    than its reach (the root box is the tree's), and their `core_ratio`
    is at least the configuration's ratio. A traced bool."""
    both = sources if targets is None else jnp.concatenate([sources, targets])
    leaves = jax.lax.stop_gradient(_tree.root_box(both)[1]) / 2 ** config.depth
    return (leaves >= config.reach) & (core_ratio(kernel, sources, targets, config.gradient)
                                       >= config.ratio)


def _sampled(kernel, dim: int, order, family: str) -> bool:
    """Whether `resolve`'s models take a sample of the points' pairs."""
    gaussian = isinstance(kernel, _kernels.Gaussian)
    chebyshev = _tree_family(kernel, dim, family)[1] is chebyshev_model
    cored = family == "auto" and _cored(kernel, dim)
    return kernel.is_concrete() and (family == "hermite" or cored
                                      or order is None and (gaussian or chebyshev))


# Charges known when the configuration is made (eager `fmm` calls, `plan`
# given charges) are summed directly at chebyshev.CHARGE_TARGETS strided
# targets for the Chebyshev estimate's denominator
# (`charge_moments`); the moments are rounded down to a power of
# sqrt(2), so that repeated calls with like charges find their
# configuration remembered.


def uses_charges(kernel, sources, targets, family, order, eps=None, leaf_size=None,
                 tree="auto") -> bool:
    """Whether `charged` measures charges for this kernel, family, order
    and the points' shapes and dtype (decided without the charges): not
    below the direct sum's crossover, where their sums would cost more
    than the call."""
    return _charge_measure(kernel, sources, targets, family, order, eps, leaf_size,
                           tree) is not None


def _charge_measure(kernel, sources, targets, family, order, eps, leaf_size, tree):
    """What `charged` measures: "gauss" where the fast Gauss transform is
    tried (`hermite.Cancellation`), "chebyshev" for the Chebyshev
    estimate's moments, or None (see `uses_charges`)."""
    kernel = known_kernel(kernel)
    fam = _check_family(family)
    (n_src, dim), dtype = sources.shape, sources.dtype
    n_tgt = n_src if targets is None else targets.shape[0]
    eps = default_eps(kernel, dim, dtype, fam) if eps is None else eps
    # The parameters' values, not Kernel.is_concrete: that evaluates the
    # kernel, a device call on every eager call.
    if (order is not None or not all(concrete(v) for v in jax.tree_util.tree_leaves(kernel))
            or _direct(kernel, dim, dtype, n_src, n_tgt, eps, order, leaf_size, family, tree)):
        return None
    if _tries_gauss(kernel, fam, dtype, eps):
        return "gauss"
    if (fam != "hermite" and _tree_family(kernel, dim, fam)[1] is chebyshev_model
            and not (fam == "auto" and (_cored(kernel, dim)
                                        or isinstance(kernel, _kernels.Gaussian)))):
        return "chebyshev"
    return None


def _tries_gauss(kernel, family: str, dtype, eps: float) -> bool:
    """Whether `resolve` tries the fast Gauss transform (given no order):
    asked for, or a Gaussian under "auto" at an eps it may reach; its
    charges are then measured (`hermite.Cancellation`)."""
    return isinstance(kernel, _kernels.Gaussian) and (
        family == "hermite"
        or family == "auto" and eps >= hermite_model.ROUNDING_FLOOR[jnp.dtype(dtype).name])


def charge_moments(kernel, sources, q, targets=None):
    """`chebyshev.least_moments` of charges q (N, K): their sums at
    chebyshev.CHARGE_TARGETS strided targets (None: the sources) over
    every source by the direct sum's kernel (`backend.dense`), in one
    jitted call (op by op, the moments' few reductions cost a GPU several
    ms of launches)."""
    return chebyshev_model.least_moments(
        _charge_log_moments(kernel, sources, q, sources if targets is None else targets,
                            backend.current()))


@functools.partial(jax.jit, static_argnames=("mode",))
def _charge_log_moments(kernel, sources, q, targets, mode):
    y = strided(targets, chebyshev_model.CHARGE_TARGETS)
    phi, grad = backend.dense(kernel, y, sources, q, True, mode)
    return chebyshev_model.log_moments(kernel, phi, grad, q)


def charged(sources, targets, kernel, q, family, order, eps=None, leaf_size=None,
            tree="auto"):
    """The Chebyshev estimate's moments for charges q (N, K) of the points'
    dtype (rounded down), for the fast Gauss transform their
    `hermite.Cancellation` (rounded up), or None where they are not used:
    a caller's order, traced kernel parameters, points or charges, a
    family other than these, and below the direct sum's crossover
    (`uses_charges`). sources and targets: jax arrays of floats
    (otherwise None is returned)."""
    pts = [sources] + ([] if targets is None else [targets])
    if (_compat.tracing() or not concrete(q)
            or not all(isinstance(x, jax.Array) and concrete(x)
                       and jnp.issubdtype(x.dtype, jnp.floating) for x in pts)):
        return None
    measure = _charge_measure(kernel, sources, targets, family, order, eps, leaf_size, tree)
    if measure is None:
        return None
    kernel = known_kernel(kernel)
    if measure == "gauss":
        ratios = _gauss_ratios(kernel, sources, q, sources if targets is None else targets)
        # Up to a power of sqrt(2), at least 1 (NaN: 1): like charges share a configuration.
        return hermite_model.Cancellation(*(float(2.0 ** (np.ceil(2 * np.log2(r)) / 2))
                                            if r > 1 else 1.0
                                            for r in np.asarray(ratios, np.float64)))
    moments = charge_moments(kernel, sources, q, targets)
    if moments is None or not all(np.isfinite(m) and m > 0 for m in moments):
        return None
    return tuple(float(2.0 ** (np.floor(2 * np.log2(m)) / 2)) for m in moments)


def _gauss_ratios(kernel, sources, q, targets):
    """(phi, grad): the largest over charge columns of ||sqrt(sum_j q_j^2
    K_ij^2)|| / ||phi|| at chebyshev.CHARGE_TARGETS strided targets (the
    norm over them), and likewise with the gradient's |grad K|."""
    return _gauss_ratio_sums(kernel, sources, q, targets, backend.current())


@functools.partial(jax.jit, static_argnames=("mode",))
def _gauss_ratio_sums(kernel, sources, q, targets, mode):
    """`_gauss_ratios` in float32 (a ratio is wanted) by the direct sum's
    kernels: K^2 is the Gaussian of sqrt(2) epsilon, and |grad K|^2 = 4
    epsilon^4 |y - x|^2 K^2, whose sum expands into the sums of q^2, q^2 x
    and q^2 |x|^2 against K^2."""
    sources, q = sources.astype(jnp.float32), q.astype(jnp.float32)
    y = strided(targets, chebyshev_model.CHARGE_TARGETS).astype(jnp.float32)
    dense = functools.partial(backend.dense_few, mode=mode)
    phi, grad = dense(kernel, y, sources, q, True)
    k, d = q.shape[1], sources.shape[1]
    q2 = q * q                                                        # (N, K)
    r2x = jnp.sum(sources * sources, axis=1)
    weights = jnp.concatenate([q2, (q2[:, :, None] * sources[:, None, :]).reshape(-1, k * d),
                               q2 * r2x[:, None]], axis=1)
    eps = jnp.asarray(kernel.epsilon, y.dtype)
    s = dense(type(kernel)(eps * np.float32(np.sqrt(2.0))), y, sources, weights, False)[0]
    rs, sx, sr = s[:, :k], s[:, k:k + k * d].reshape(-1, k, d), s[:, k + k * d:]
    e2 = eps * eps
    rsg = 4 * e2 * e2 * (jnp.sum(y * y, axis=1)[:, None] * rs
                         - 2 * jnp.einsum("md,mkd->mk", y, sx) + sr)
    phi_norm = jnp.sqrt(jnp.sum(phi * phi, axis=0))                   # (K,)
    grad_norm = jnp.sqrt(jnp.sum(grad * grad, axis=(0, 2)))
    return (jnp.max(jnp.sqrt(jnp.sum(rs, axis=0)) / phi_norm),
            jnp.max(jnp.sqrt(jnp.sum(jnp.maximum(rsg, 0), axis=0)) / grad_norm))


def checked(config: Config, check, kernel, tree, charges, phi, grad=None, mode="jnp"):
    """Sums checked against their own charges: (phi, grad, ok). check: the
    configuration's `ChargeCheck` as arrays (`Config.check_arrays`), or
    None. Columns whose estimated error with these charges' moments (taken
    from the sums themselves, `chebyshev.log_moments`) exceeds eps, and
    what the order was chosen for, are summed directly at the same strided
    targets (`within_at_samples`); those whose error there exceeds
    SAMPLED_SHARE eps are NaN. ok: a bool array, whether none is (None
    without a check: nothing for an eager call to wait for).
    charges (N, K), phi (M, K), grad (M, K, d) or None, in the caller's
    order; tree: the sums' (uniform or adaptive); mode: the backend's
    (`backend.current`). jit-able; no gradient flows through the check."""
    if check is None:
        return phi, grad, None
    few = functools.partial(strided, count=chebyshev_model.CHARGE_TARGETS)
    charges, side = jax.lax.stop_gradient((charges, tree.side))
    sums = jax.lax.stop_gradient((phi, grad))
    log_m = chebyshev_model.log_moments(
        kernel, few(sums[0]), None if grad is None else few(sums[1]), charges)
    good = check.passes(config.eps, side, log_m)
    good = good | jnp.isnan(log_m)               # NaN charges or points: NaN already
    good = good | jax.lax.cond(
        jnp.all(good), lambda: jnp.zeros_like(good),
        lambda: within_at_samples(config.eps, kernel, tree, charges, *sums, mode))
    phi = jnp.where(good[0], phi, jnp.nan)
    if grad is not None:
        grad = jnp.where(good[1][:, None], grad, jnp.nan)
    return phi, grad, jnp.all(good[0]) & jnp.all(good[1] | (grad is None))


# The model's check (`ChargeCheck.passes`) assumes uniform points where
# they are traced: clustered points' far field is far smaller (2D
# InverseMultiquadric(1), 600 points over three orders of scale, eps 1e-6:
# errors 1e-11 to 4e-9 where 1 draw of random charges in 6 was flagged),
# so what it flags is summed directly at its strided targets. An error
# there within this share of eps passes.
SAMPLED_SHARE = 0.5


def within_at_samples(eps: float, kernel, tree, charges, phi, grad, mode):
    """(2, K) bool: whether phi's (row 0) and grad's (row 1) relative L2
    errors at chebyshev.CHARGE_TARGETS strided sorted targets, against the
    direct sum there over every source, are within SAMPLED_SHARE eps (grad
    None: row 1 True). charges (N, K), phi (M, K), grad (M, K, d), in the
    caller's order."""
    at = strided(jnp.arange(tree.tgt_perm.shape[0]), chebyshev_model.CHARGE_TARGETS)
    exact = backend.dense_few(kernel, tree.tgt_sorted[at], tree.src_sorted,
                              charges[tree.src_perm], grad is not None, mode)
    caller = tree.tgt_perm[at]

    def within(approx, ref):                      # (T, K, ...) -> (K,)
        axes = tuple(i for i in range(ref.ndim) if i != 1)
        err = jnp.sqrt(jnp.sum((approx - ref) ** 2, axis=axes))
        return err <= SAMPLED_SHARE * eps * jnp.sqrt(jnp.sum(ref ** 2, axis=axes))

    ok_phi = within(phi[caller], exact[0])
    ok_grad = jnp.ones_like(ok_phi) if grad is None else within(grad[caller], exact[1])
    return jnp.stack([ok_phi, ok_grad])


def raise_unchecked(ok, config: Config):
    """Raise Unreachable where eager sums failed their check (`checked`);
    under jit they are NaN."""
    if ok is not None and concrete(ok) and not bool(ok):
        raise Unreachable(
            f"eps={config.eps:g} is not met for these charges at the order chosen "
            f"(n = {config.order}): they cancel in phi more than the charges it was "
            f"chosen for (random ones, or a plan's charges=), and the error estimate "
            f"with their own phi exceeds eps. Call jfmm.fmm eagerly with them, make "
            f"the plan with jfmm.plan(..., charges=) of charges like them, or ask for "
            f"a smaller eps")


# Repeated eager calls: configurations remembered (LRU).
CACHE_ENTRIES = 32
_RESOLVED: collections.OrderedDict = collections.OrderedDict()


def _remember(cache: collections.OrderedDict, key, make):
    if key in cache:
        cache.move_to_end(key)
        return cache[key]
    value = cache[key] = make()
    if len(cache) > CACHE_ENTRIES:
        cache.popitem(last=False)
    return value


def known_kernel(kernel):
    """The kernel with each parameter's value where it is known at trace
    time (tracers of jax.grad or jax.jvp outside jit); for choosing orders
    only, the sums keep the caller's kernel."""
    return jax.tree_util.tree_map(known_value, kernel)


def kernel_key(kernel):
    """A hashable key of a kernel's structure and concrete parameter values,
    or None (traced parameters, unhashable structure)."""
    leaves, treedef = jax.tree_util.tree_flatten(kernel)
    if not all(concrete(v) for v in leaves):
        return None
    key = (treedef, tuple((np.shape(v), np.asarray(v).tobytes()) for v in leaves))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def resolve_eager(sources, targets, kernel, eps, leaf_size, order, family,
                  gradient=True, tree="auto", charged=None) -> Config:
    """`resolve` for concrete points and kernel, remembered for repeated
    calls. The key holds everything `resolve` reads: the kernel's values,
    the shapes, dtype, eps and overrides, and where the choice depends on
    the points (a model's sample, a Gaussian's extent) their root box and
    sample pairs, so a hit returns what `resolve` would. Traced inputs
    resolve anew; traced points, which a transformation may move, bound the
    gradient's error whatever `gradient` says. charged: see `resolve`."""
    kernel = known_kernel(kernel)
    kernel_values = kernel_key(kernel)
    pts = [sources] + ([] if targets is None else [targets])
    traced = not all(concrete(x) for x in pts)
    if kernel_values is None or traced:
        gradient = gradient or traced
        return resolve(sources, targets, kernel, eps, leaf_size, order, family,
                       gradient=gradient, tree=tree)
    sample, (n_src, dim) = None, sources.shape
    n_tgt = n_src if targets is None else targets.shape[0]
    eps_ = default_eps(kernel, dim, sources.dtype, _check_family(family)) if eps is None else eps
    direct = _direct(kernel, dim, sources.dtype, n_src, n_tgt, eps_, order, leaf_size, family,
                     tree)
    if not direct and (_sampled(kernel, dim, order, _check_family(family))
                       or isinstance(kernel, _kernels.Gaussian)):
        sample = _pair_sample(sources, targets)
    where = None if sample is None else (sample.lo.tobytes(), sample.side, sample.x.tobytes(),
                                         sample.y.tobytes())
    key = (kernel_values, sources.shape, None if targets is None else targets.shape,
           jnp.dtype(sources.dtype).name, eps, leaf_size, order, family, where, gradient,
           tree == "auto", charged)
    return _remember(_RESOLVED, key, lambda: resolve(sources, targets, kernel, eps, leaf_size,
                                                     order, family, sample, gradient, tree,
                                                     charged))


# Source-target pairs below which the direct sum (all pairs of a one-box
# tree) beats the FMM, per backend and (family, dim, dtype), the eps they
# were measured at and the order the FMM took there, and for some the
# kernel they were measured with: the crossover of repeated eager calls
# measured by benchmarks/bench_crossover.py (docs/BENCHMARKS.md; the CPU's
# float64 Chebyshev entry from warm plans against warm direct sums, as the
# RBF solver calls them). Combinations not measured keep the FMM. At
# another order the pairs scale with its power `PAIRS_POWER`; where the
# order is not known yet, with that of the order the eps alone gives
# (`_order_proxy`); for another kernel, with `PAIR_COST`.
DIRECT_PAIRS = {
    "cpu": {("laplace3d", 3, "float32"): (2 ** 26, 1e-5, 10),
            ("laplace3d", 3, "float64"): (2 ** 27, 1e-6, 13),
            ("chebyshev", 3, "float32"): (2 ** 27, 1e-4, 6),
            ("chebyshev", 3, "float64"): (2 ** 29.8, 1e-6, 8, "Linear"),
            ("laplace2d", 2, "float64"): (2 ** 22, 1e-6, 11)},
    "gpu": {("laplace3d", 3, "float32"): (2 ** 31.5, 1e-5, 10),
            ("laplace3d", 3, "float64"): (2 ** 31, 1e-6, 13),
            ("chebyshev", 3, "float32"): (2 ** 33, 1e-4, 6),
            ("chebyshev", 3, "float64"): (2 ** 33, 1e-6, 8),
            ("laplace2d", 2, "float32"): (2 ** 30, 1e-5, 9),
            ("laplace2d", 2, "float64"): (2 ** 28.5, 1e-6, 11),
            ("chebyshev", 2, "float32"): (2 ** 32, 1e-4, 6),
            ("chebyshev", 2, "float64"): (2 ** 30.5, 1e-6, 8)},
}

# The crossover's pairs grow like order^k: the crossover's N grows like the
# FMM's time per point. 3D Laplace: p^1.5, pairs p^3 (float64 on the H100
# crossed at ~48k points at p = 14 and ~200k at p = 36); 2D Laplace taken
# alike. Chebyshev: n^d per point (its n^d coefficients per box), pairs
# n^2d (2-core CPU, 3D, linear, float64, warm plans: about 2^29.8, 2^31.4
# and 2^32.1 pairs at n = 8, 10 and 11).
PAIRS_POWER = {"laplace3d": lambda dim: 3, "laplace2d": lambda dim: 3,
               "chebyshev": lambda dim: 2 * dim}

# A kernel's cost per pair in the direct sum, relative, per backend and
# dtype where measured (2-core CPU, float64, all pairs of 2x10^4 points,
# jitted: linear 619 ms, cubic 602, multiquadric 595, inverse quadratic
# 530, quintic 712, inverse multiquadric 1,015, thin-plate spline 1,980,
# Gaussian 2,266; in another run linear 564, the vortex cores
# Rosenhead-Moore 923 and Winckelmans 1,106). The crossover's pairs scale
# as 1 / cost against the cost of the kernel an entry was measured with:
# at these sizes much of the FMM's time does not depend on the kernel (its
# far field at a fixed depth), so the direct sum's N scales as
# 1 / sqrt(cost). Measured: the thin-plate spline's direct sum beat the
# order-8 plan at 12,000 points (675 against 876 ms) and lost at 20,000
# (1,980 against 1,483), about 2^28 pairs against the linear kernel's
# 2^29.8. Kernels not listed cost what that kernel does.
PAIR_COST = {"cpu": {"float64": {"Linear": 1.0, "Cubic": 0.97, "Multiquadric": 0.96,
                                 "InverseQuadratic": 0.86, "Quintic": 1.15,
                                 "InverseMultiquadric": 1.64, "ThinPlateSpline": 3.2,
                                 "Gaussian": 3.66, "RosenheadMoore": 1.64,
                                 "Winckelmans": 1.96}}}


def _cost_ratio(entry: tuple, kernel, backend: str, dtype) -> float:
    """Cost per pair of the kernel a DIRECT_PAIRS entry was measured with
    over this kernel's (`Kernel.evaluates`); 1 where either is not known."""
    costs = PAIR_COST.get(backend, {}).get(jnp.dtype(dtype).name, {})
    name = kernel.evaluates
    if len(entry) < 4 or entry[3] not in costs or name not in costs:
        return 1.0
    return costs[entry[3]] / costs[name]


def _order_proxy(name: str, dim: int, eps: float, dtype) -> int:
    """An order for eps known without the points: the series families'
    own, Chebyshev's worst-case rule's (its largest order below its floor)."""
    if name == "laplace3d":
        return laplace3d_model.order_for_eps(eps, dtype)
    if name == "laplace2d":
        return laplace2d_model.order_for_eps(eps, dtype)
    rule = chebyshev_model.rule(dim)
    try:
        return rule.order(eps, dtype)
    except ValueError:
        return rule.ORDERS[-1]


# The direct sum keeps the eps floors of the family it stands in for, so
# that an eps raises or not whatever N is.
_FLOORS = {"laplace3d": laplace3d_model.EPS_FLOOR, "laplace2d": laplace2d_model.EPS_FLOOR,
           "chebyshev": chebyshev_model.ROUNDING_FLOOR}


def below_crossover(kernel, dim: int, dtype, n_src: int, n_tgt: int, eps: float,
                    family: str = "auto", order: int | None = None) -> bool:
    """Whether the direct sum beats the FMM of `family` ("auto": the
    kernel's own) at these sizes (`DIRECT_PAIRS`, scaled to this kernel's
    cost per pair: `PAIR_COST`); order: the FMM's, where known (else the
    order eps alone gives stands for it)."""
    name = _tree_family(kernel, dim, family)[0].NAME
    backend = "cpu" if jax.default_backend() == "cpu" else "gpu"
    entry = DIRECT_PAIRS[backend].get((name, dim, jnp.dtype(dtype).name))
    if entry is None:
        return False
    pairs, measured_eps, measured_order = entry[:3]
    pairs *= _cost_ratio(entry, kernel, backend, dtype)
    try:
        if order is None:
            order, measured_order = (_order_proxy(name, dim, e, dtype)
                                     for e in (eps, measured_eps))
        elif eps < _FLOORS[name][jnp.dtype(dtype).name]:
            return False
    except ValueError:                  # eps below the family's floor: it raises
        return False
    return n_src * n_tgt < pairs * (order / measured_order) ** PAIRS_POWER[name](dim)


def _direct(kernel, dim: int, dtype, n_src: int, n_tgt: int, eps: float, order, leaf_size,
            family, tree="auto") -> bool:
    """Whether "auto" (no order, leaf size or tree given) sums directly:
    fewer source-target pairs than DIRECT_PAIRS for this backend, the
    kernel's tree family, dim and dtype, scaled to eps."""
    if (family not in (None, "auto") or order is not None or leaf_size is not None
            or tree != "auto"):
        return False
    return below_crossover(kernel, dim, dtype, n_src, n_tgt, eps)


@functools.lru_cache(maxsize=64)
def _sample_indices(n_src: int, n_tgt: int, count: int):
    """The sample pairs' source and target indices (fixed: seed 0)."""
    rng = np.random.default_rng(0)
    return rng.integers(0, n_src, count), rng.integers(0, n_tgt, count)


@jax.jit
def _sample_arrays(sources, targets, i, j):
    """Root box of sources and targets (None: the sources), and the sample's rows."""
    lo, side = _tree.root_box(sources if targets is None else
                              jnp.concatenate([sources, targets]))
    return lo, side, sources[i], (sources if targets is None else targets)[j]


def _pair_sample(sources, targets, count: int = 4096):
    """The root box and `count` sample (source, target) pairs of concrete
    points (`jfmm.models.Sample`, float64), or None where they are traced.
    One device call and one transfer (eager calls pay it every time)."""
    pts = [sources] + ([] if targets is None else [targets])
    if not all(concrete(x) for x in pts):
        return None
    n_tgt = sources.shape[0] if targets is None else targets.shape[0]
    i, j = _sample_indices(sources.shape[0], n_tgt, count)
    lo, side, x, y = jax.device_get(eager(_sample_arrays, sources, targets, i, j))
    return Sample(np.asarray(lo, np.float64), float(side), np.asarray(x, np.float64),
                  np.asarray(y, np.float64))


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
