"""Public calls: direct(), fmm(), plan() and the Plan pytree."""
from __future__ import annotations

import dataclasses
import functools
import numbers
import os

import jax
import jax.numpy as jnp
import numpy as np

from jfmm import fmm as _fmm
from jfmm import kernels as _kernels
from jfmm import primitive as _primitive
from jfmm import tree as _tree
from jfmm.ops import backend, chebyshev, hermite


# ------------------------------------------------------------------ checks

def _concrete(x) -> bool:
    return not isinstance(x, _kernels.Tracer)


def _check_kernel(kernel):
    if not isinstance(kernel, _kernels.Kernel):
        raise TypeError(f"kernel must be a jfmm.kernels.Kernel, got {type(kernel).__name__}")


def _check_points(name: str, x, dims):
    x = jnp.asarray(x)
    if x.ndim != 2 or x.shape[1] not in dims:
        want = " or ".join(f"(n, {d})" for d in dims)
        raise ValueError(f"{name} must have shape {want}, got {x.shape}")
    if x.shape[0] == 0:
        raise ValueError(f"{name} is empty; pass at least one point")
    if not (jnp.issubdtype(x.dtype, jnp.floating) or jnp.issubdtype(x.dtype, jnp.integer)):
        raise TypeError(f"{name} must be real numbers, got dtype {x.dtype}")
    if _concrete(x):
        # Eager even inside a jit trace, where x may be a captured constant.
        with jax.ensure_compile_time_eval():
            finite = bool(jnp.all(jnp.isfinite(x)))
        if not finite:
            raise ValueError(f"{name} contains NaN or inf coordinates")
    return x


def _prepare(sources, charges, targets, kernel):
    """Validate and cast. Returns (sources, charges (N, K), targets | None, squeeze)."""
    _check_kernel(kernel)
    sources = _check_points("sources", sources, kernel.dims)
    if targets is not None:
        targets = _check_points("targets", targets, kernel.dims)
        if targets.shape[1] != sources.shape[1]:
            raise ValueError(f"sources are {sources.shape[1]}D but targets are "
                             f"{targets.shape[1]}D")
    charges = jnp.asarray(charges)
    if charges.ndim not in (1, 2) or charges.shape[0] != sources.shape[0]:
        raise ValueError(f"charges must have shape ({sources.shape[0]},) or "
                         f"({sources.shape[0]}, k) to match sources, got {charges.shape}")
    args = [sources, charges] + ([] if targets is None else [targets])
    dtype = jnp.result_type(*args, 0.0)
    if not jnp.issubdtype(dtype, jnp.floating) or dtype.itemsize < 4:
        dtype = jnp.result_type(jnp.float32, 0.0)
    squeeze = charges.ndim == 1
    charges = charges.astype(dtype)
    if squeeze:
        charges = charges[:, None]
    sources = sources.astype(dtype)
    targets = None if targets is None else targets.astype(dtype)
    return sources, charges, targets, squeeze


DEFAULT_EPS = {"float32": 1e-5, "float64": 1e-6}


def _resolve_eps(eps, dtype) -> float:
    """eps=None means the dtype's default: 1e-5 in float32, 1e-6 in float64."""
    if eps is None:
        return DEFAULT_EPS[jnp.dtype(dtype).name]
    return eps


def _check_eps(eps):
    if eps is None:
        return
    if not isinstance(eps, numbers.Real) or isinstance(eps, bool):
        raise TypeError(f"eps must be a Python float (it is static), got {type(eps).__name__}")
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")


def _check_family(family):
    if family is not None and family not in _fmm.FAMILIES:
        raise ValueError(f"family must be one of {_fmm.FAMILIES} or None, got {family!r}")
    return family or "auto"


def _finish(phi, grad, squeeze: bool, gradient: bool):
    if squeeze:
        phi = phi[:, 0]
        grad = None if grad is None else grad[:, 0]
    return (phi, grad) if gradient else phi


# ------------------------------------------------------------------ direct

@functools.partial(jax.jit, static_argnames=("gradient", "mode"))
def _direct(sources, charges, targets, kernel, gradient, mode):
    return backend.dense(kernel, targets, sources, charges, gradient, mode)


def direct(sources, charges, targets=None, kernel=_kernels.Laplace3D(), gradient=False):
    """Exact sum phi(y_j) = sum_i q_i K(|y_j - x_i|), tiled.

    sources (N, d); charges (N,) or (N, k); targets (M, d) or None for the
    sources themselves. Returns phi (M,) or (M, k), and with gradient=True
    also grad (M, d) or (M, k, d), the gradient with respect to the target.
    Memory O((N + M) tile); O(N M) work.
    """
    sources, charges, targets, squeeze = _prepare(sources, charges, targets, kernel)
    phi, grad = _direct(sources, charges, targets, kernel, gradient, backend.current())
    return _finish(phi, grad, squeeze, gradient)


# ------------------------------------------------------------------ fmm

def _order(family, eps, dtype, order, points=None):
    """The order given (range-checked), else the family's rule; points:
    sqrt(N M) of the point sets (the 3D Laplace rule's rare-pair tail
    depends on it)."""
    if order is None:
        return family.order(eps, dtype, points)
    if not isinstance(order, numbers.Integral) or not 1 <= order <= family.MAX_ORDER:
        raise ValueError(f"order must be an int in [1, {family.MAX_ORDER}], got {order!r}")
    return int(order)


def _fmm_eval(sources, charges, targets, kernel, p, depth, gradient, mode, family):
    """Build the tree and bind the FMM primitive: phi (M, K), grad (M, K, d) or None."""
    tree = _tree.build(sources, targets, depth)
    fam = _fmm.family_for(kernel, tree.dim, family)
    ops = _fmm.operators(fam, p, tree.dim, sources.dtype) if depth >= 2 and fam else None
    return _evaluate(tree, ops, kernel, charges, p, gradient, mode, family)


def _evaluate(tree, ops, kernel, charges, p, gradient, mode, family):
    outs = _primitive.fmm_sum(tree, ops, kernel, {0: charges}, int(gradient), p, mode, family)
    return outs[0], (outs[1] if gradient else None)


# XLA's Triton GEMM autotuning made a first call at N = 2^20 take about 23 s
# against 5 s without it, at the same run time (H200; docs/BENCHMARKS.md).
# jax accepts compiler options only on a top-level jit, so jfmm's own
# top-level GPU calls (an eager fmm, Plan.apply) compile without it; inside
# a user's jit the process's XLA_FLAGS rule (README, "On a GPU"), and a
# user's XLA_FLAGS setting of it always wins.
_FAST_COMPILE = {"xla_gpu_enable_triton_gemm": False}


def _jits(fun, static: tuple):
    """(jit, jit with _FAST_COMPILE) of fun."""
    return (jax.jit(fun, static_argnames=static),
            jax.jit(fun, static_argnames=static, compiler_options=_FAST_COMPILE))


def _call(jits, *args, mode: str, **static):
    """jits[1] for a top-level GPU call, else jits[0]: traced arguments (a
    user's jit, grad, vmap) take the plain one (under grad the one with
    options ran its forward pass before jax refused it), and so does a call
    inside a user's jit on constants, where jax raises."""
    plain, fast = jits
    if (mode != "pallas" or "xla_gpu_enable_triton_gemm" in os.environ.get("XLA_FLAGS", "")
            or not all(map(_concrete, jax.tree_util.tree_leaves(args)))):
        return plain(*args, mode=mode, **static)
    try:
        return fast(*args, mode=mode, **static)
    except ValueError as e:          # inside a user's jit: no compiler options
        if "compiler_options" not in str(e):
            raise
    return plain(*args, mode=mode, **static)


_fmm_jits = _jits(_fmm_eval, ("p", "depth", "gradient", "mode", "family"))


def _depth(n_src, n_tgt, dim, leaf_size, family, p):
    leaf = family.leaf_size(p) if leaf_size is None else int(leaf_size)
    if leaf < 1:
        raise ValueError(f"leaf_size must be >= 1, got {leaf_size}")
    return _tree.choose_depth(max(n_src, n_tgt), dim, leaf)


def _pair_sample(sources, targets, count: int = 4096):
    """The root box and `count` sample (source, target) pairs of concrete
    points (`jfmm.ops.hermite.Sample`, float64), or None where they are
    traced."""
    pts = [sources] + ([] if targets is None else [targets])
    if not all(_concrete(x) for x in pts):
        return None
    tgt = sources if targets is None else targets
    rng = np.random.default_rng(0)
    with jax.ensure_compile_time_eval():
        lo, side = _tree.root_box(sources if targets is None else jnp.concatenate(pts))
        x = np.asarray(sources[rng.integers(0, sources.shape[0], count)], np.float64)
        y = np.asarray(tgt[rng.integers(0, tgt.shape[0], count)], np.float64)
    return hermite.Sample(np.asarray(lo, np.float64), float(side), x, y)


def _configure(sources, targets, kernel, eps, leaf_size, order, family):
    """The static choices of `fmm` and `plan` for prepared points: eps
    (resolved), the family choice (a `jfmm.fmm.FAMILIES` name or "near")
    and its family object, the order p and the tree depth.

    "auto" for a Gaussian with concrete epsilon and points: the near field
    alone where it suffices (`_near_only`), else the fast Gauss transform
    where its plan meets eps (its depth is the transform's grid level), else
    Chebyshev. The Chebyshev order comes from its error estimate for this
    kernel and these points where the kernel's parameters are concrete
    (`Chebyshev.order_for`; the worst root box size where the points are
    traced), else from the family's worst-case rule."""
    dim = sources.shape[1]
    eps = _resolve_eps(eps, sources.dtype)
    family = _check_family(family)
    # The points' root box and sample pairs, drawn once (a host round trip)
    # for the estimates that use them; None for traced points or kernel
    # parameters, and where no estimate needs them.
    estimated = family == "hermite" or order is None and (
        isinstance(kernel, _kernels.Gaussian)
        or isinstance(_fmm.family_for(kernel, dim, family), chebyshev.Chebyshev))
    sample = _pair_sample(sources, targets) if estimated and kernel.is_concrete() else None
    gauss = _gauss_plan(sources, targets, kernel, eps, order, family, sample)
    if family == "hermite":
        return eps, family, _fmm.gauss_family(dim), gauss.order, gauss.level
    try:
        fam, p, depth = _chebyshev_or_laplace(sources, targets, kernel, eps, leaf_size, order,
                                              family, sample)
    except ValueError:
        if gauss is None:
            raise
        fam = None
    if fam is not None and family == "auto" and _near_only(kernel, sources, targets, eps,
                                                           depth):
        return eps, "near", None, p, depth
    if gauss is not None:
        return eps, "hermite", _fmm.gauss_family(dim), gauss.order, gauss.level
    return eps, family, fam, p, depth


def _chebyshev_or_laplace(sources, targets, kernel, eps, leaf_size, order, family, sample):
    """(family object, order, depth) of the FMM families for `family`
    ("auto" or "chebyshev"); sample: `_pair_sample` or None."""
    n_src, dim = sources.shape
    n_tgt = n_src if targets is None else targets.shape[0]
    fam = _fmm.family_for(kernel, dim, family)
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
    if explicit:
        _fmm.family_for(kernel, dim, family)            # raises unless a Gaussian
    elif (not isinstance(kernel, _kernels.Gaussian) or order is not None
          or eps < hermite.ROUNDING_FLOOR[jnp.dtype(sources.dtype).name]):
        return None
    if sample is None:
        if explicit:
            raise ValueError("family 'hermite' needs concrete points and epsilon (its grid "
                             "and order depend on their values): call it outside jit, or "
                             "use family='chebyshev'")
        return None
    fgt = _fmm.gauss_family(dim)
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
    if cut is None or depth < 2 or not all(_concrete(x) for x in pts):
        return False
    with jax.ensure_compile_time_eval():
        both = jnp.concatenate(pts)
        extent = float(jnp.max(jnp.max(both, axis=0) - jnp.min(both, axis=0)))
    return extent / 2 ** depth >= cut


def fmm(sources, charges, targets=None, kernel=_kernels.Laplace3D(), eps=None,
        gradient=False, *, leaf_size=None, order=None, family=None):
    """Fast multipole sum phi(y_j) = sum_i q_i K(|y_j - x_i|).

    Same arguments and shapes as `direct`, plus eps, the requested relative
    L2 error of phi over the targets (the order is chosen from eps, kernel
    and dtype; an eps the dtype cannot reach raises ValueError; None means
    1e-5 in float32 and 1e-6 in float64, float32's floor being about 2e-6),
    leaf_size,
    the mean points per leaf the tree depth aims at, and order, which
    overrides the expansion order chosen from eps.

    jit-able with eps, gradient, leaf_size and the kernel's structure static;
    array sizes follow from input shapes alone, so no input of given shapes
    can overflow anything. Non-finite coordinates raise eagerly and give NaN
    results under jit.

    Every JAX transformation works with respect to sources, charges and
    targets (jfmm.primitive): jax.grad of the potential costs two FMM calls
    with gradient (the forward one and its adjoint, the FMM with sources and
    targets swapped), memory O(N + M); vmap over charges is one call with
    more charge columns; jax.jvp, jacfwd, Hessian-vector products and reverse
    mode through gradient=True outputs differentiate the approximation in
    forward mode (slower: jnp near field, one pass per derivative direction).
    Derivatives with respect to kernel parameters (e.g. Gaussian epsilon)
    cost one forward-mode pass per parameter.

    Families (`jfmm.fmm.family_for`): spherical harmonics for Laplace3D,
    complex Taylor/Laurent series for Laplace2D, Chebyshev interpolation
    for every other kernel, 2D and 3D; the order comes from eps, or from
    `order` (for Chebyshev: nodes per dimension). Laplace: a measured error
    table with a margin of 4. Chebyshev: where the kernel's parameters are
    concrete, an error estimate for this kernel, these points and this
    tree (`jfmm.ops.chebyshev.far_field_error`, a margin of 4 over it; under
    jit with traced points, the worst over root box sizes), so smooth
    kernels get low orders and eps reaches 1e-12 in float64 where the
    kernel allows (ValueError where no order up to 18 in 2D, 12 in 3D
    does); with traced parameters, the worst-case rule over all kernels
    (down to 2.4e-12 in 2D, 9.5e-7 in 3D). The order depends on the
    points' extent only for kernels with a length scale; `Plan.update`
    keeps the plan's order. Smallest eps: 3D Laplace 8.4e-11, 2D Laplace
    4.8e-14; float32 3e-6 everywhere. family="chebyshev" overrides
    the choice (any kernel; None or "auto" chooses as above).

    Gaussians (concrete epsilon and points, no `order`): one so narrow
    that it falls below 0.1 eps within one leaf side is summed over
    neighbouring leaves alone (no expansions); otherwise the fast Gauss
    transform (`jfmm.ops.hermite`: Hermite expansions on one grid level,
    no near field) where its error estimate meets eps within its grid
    budget (float32: eps >= 2e-5, its rounding floor), else Chebyshev.
    family="hermite" asks for the transform (it raises where no plan meets
    eps). Inside jit with traced points the
    transform's grid level cannot be chosen, so a Gaussian gets Chebyshev:
    to keep the transform under jit, make a plan outside it (`plan`) and
    call `Plan.update(points)` and `Plan.apply` inside.
    """
    _check_eps(eps)
    sources, charges, targets, squeeze = _prepare(sources, charges, targets, kernel)
    eps, family, _, p, depth = _configure(sources, targets, kernel, eps, leaf_size, order,
                                          family)
    phi, grad = _call(_fmm_jits, sources, charges, targets, kernel, p=p, depth=depth,
                      gradient=gradient, mode=backend.current(), family=family)
    return _finish(phi, grad, squeeze, gradient)


# ------------------------------------------------------------------ plan

@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["tree", "kernel", "ops"],
                   meta_fields=["p", "eps", "family"])
@dataclasses.dataclass(frozen=True)
class Plan:
    """A built tree plus operators, to apply to many charge vectors.

    Static (changing them recompiles): p, eps, family, and the tree's depth
    and dim.
    Arrays: the tree, the kernel's parameters, the translation operators.

    overflow: always False for the uniform-depth tree, which has no capacity
    that data can exceed; the field is part of the Plan contract so that
    adaptive trees (capacities sized from data) can report an overflow.
    """
    tree: _tree.Tree
    kernel: _kernels.Kernel
    ops: object
    p: int
    eps: float
    family: str = "auto"

    @property
    def overflow(self):
        return jnp.zeros((), bool)

    def apply(self, charges, gradient=False):
        """phi (and grad) for charges (N,) or (N, k); see `fmm`."""
        charges = jnp.asarray(charges)
        n = self.tree.src_perm.shape[0]
        if charges.ndim not in (1, 2) or charges.shape[0] != n:
            raise ValueError(f"charges must have shape ({n},) or ({n}, k), got {charges.shape}")
        squeeze = charges.ndim == 1
        charges = charges.astype(self.tree.src_sorted.dtype)
        if squeeze:
            charges = charges[:, None]
        phi, grad = _call(_apply_jits, self, charges, gradient=gradient,
                          mode=backend.current())
        return _finish(phi, grad, squeeze, gradient)

    def update(self, sources, targets=None):
        """Rebuild the tree for new points of the same shapes (jit-able).

        The family, order and depth stay the plan's, chosen for the points
        it was made with: kernels with a length scale (Chebyshev's order,
        the fast Gauss transform's grid level and order) keep their
        accuracy for new points of about the same extent, not for points
        spread much wider."""
        sources = _check_points("sources", sources, self.kernel.dims)
        if sources.shape != self.tree.src_sorted.shape:
            raise ValueError(f"update needs sources of shape {self.tree.src_sorted.shape}, "
                             f"got {sources.shape}")
        if targets is not None:
            targets = _check_points("targets", targets, self.kernel.dims)
            if targets.shape != self.tree.tgt_sorted.shape:
                raise ValueError(f"update needs targets of shape {self.tree.tgt_sorted.shape}, "
                                 f"got {targets.shape}")
        dtype = self.tree.src_sorted.dtype
        tree = _build_jit(sources.astype(dtype),
                          None if targets is None else targets.astype(dtype), self.tree.depth)
        return dataclasses.replace(self, tree=tree)


def _apply(plan_, charges, gradient, mode):
    return _evaluate(plan_.tree, plan_.ops, plan_.kernel, charges, plan_.p, gradient, mode,
                     plan_.family)


_apply_jits = _jits(_apply, ("gradient", "mode"))


_build_jit = jax.jit(_tree.build, static_argnames=("depth",))


def plan(sources, targets=None, kernel=_kernels.Laplace3D(), eps=None, *, leaf_size=None,
         order=None, family=None):
    """Build the tree and operators once; see `Plan.apply` and `Plan.update`."""
    _check_eps(eps)
    # float32 charges: the plan's dtype is the points' (float64 only for
    # float64 points, even with jax_enable_x64, where jnp.zeros would be
    # float64 and promote float32 points).
    dummy = jnp.zeros(jnp.shape(sources)[:1], jnp.float32)
    sources, _, targets, _ = _prepare(sources, dummy, targets, kernel)
    eps, family, fam, p, depth = _configure(sources, targets, kernel, eps, leaf_size, order,
                                            family)
    tree = _build_jit(sources, targets, depth)
    ops = None
    if depth >= 2 and fam is not None:
        ops = _fmm.operators(fam, p, sources.shape[1], sources.dtype)
    return Plan(tree, kernel, ops, p, eps, family)
