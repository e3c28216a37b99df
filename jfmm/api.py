"""Public calls: direct(), fmm(), plan() and the Plan pytree."""
from __future__ import annotations

import dataclasses
import functools
import weakref

import jax
import jax.numpy as jnp
import numpy as np

from jfmm import _compat, _xla
from jfmm import configure as _configure
from jfmm import distributed as _distributed
from jfmm import inputs as _inputs
from jfmm import kernels as _kernels
from jfmm import primitive as _primitive
from jfmm import tree as _tree
from jfmm.configure import Config
from jfmm.ops import backend
from jfmm.ops import p2p as _p2p
from jfmm.tree import adaptive as _adaptive


# ------------------------------------------------------------------ direct

# The direct sum as the FMM primitive on a one-box tree (near field only),
# so that its jvp, transpose and batching rules are direct sums too.
_DIRECT = Config(None, 1, 0, 0.5)


@functools.partial(jax.jit, static_argnames=("gradient", "mode"))
def _direct(sources, charges, targets, kernel, gradient, mode):
    q, layout = _inputs.charges_of(charges, sources.shape[0], sources.dtype)
    phi, grad, _ = _fmm_eval(sources, q, targets, kernel, None, _DIRECT, gradient, mode)
    return _inputs.finish(phi, grad, layout, gradient)


def direct(sources, charges, targets=None, kernel=_kernels.Laplace3D(), gradient=False):
    """Exact sum phi(y_j) = sum_i q_i K(|y_j - x_i|), tiled.

    sources (N, d); charges (N,) or (N, k), real or complex; targets (M, d)
    or None for the sources themselves. Returns phi (M,) or (M, k), and with
    gradient=True also grad (M, d) or (M, k, d), the gradient with respect
    to the target. Memory O((N + M) tile); O(N M) work.

    Transformations are direct sums themselves (it is the FMM primitive on
    a tree of one box, `jfmm.primitive`): jax.grad with respect to charges
    and points, jvp and vmap keep memory O(N + M); a gradient through a
    gradient=True output sums dipoles in forward mode on the jnp backend.

    dtype (the rule of `fmm`, `plan` and `direct` alike): the sums run in
    the points' dtype (sources and targets promoted together; integer
    points in jax's default float, float64 under jax_enable_x64; float16
    and bfloat16 in float32), and charges are cast to it, so float32 points
    give float32 results whatever the charges. Complex charges sum their
    real and imaginary parts as separate columns and give a complex result
    (gradients too).
    """
    kernel = _inputs.kernel_of(kernel)
    sources, targets = _inputs.points_of(sources, targets, kernel)
    _inputs.check_finite_charges(charges)
    return _direct(sources, charges, targets, kernel, gradient, backend.current())


# ------------------------------------------------------------------ fmm

def _fmm_eval(sources, charges, targets, kernel, check, config, gradient, mode):
    """Build the tree and bind the FMM primitive (`_bind`; config static,
    `Config.static`, and check its `Config.check_arrays`).
    A configuration with a fallback (traced points, `Config.fallback`)
    sums with it where its own does not fit the points
    (`configure.series_fit`)."""
    if config.fallback is not None:
        run = functools.partial(_fmm_eval, sources, charges, targets, kernel,
                                gradient=gradient, mode=mode)
        fits = (_configure.crowded(config, sources, targets) if config.tree == "adaptive"
                else _configure.series_fit(config, kernel, sources, targets))
        # Only Chebyshev configurations have checks, and their fallback (the
        # uniform tree's) has the same order: the same check serves both.
        return jax.lax.cond(fits, lambda: run(check, dataclasses.replace(config, fallback=None)),
                            lambda: run(check, config.fallback))
    if config.tree == "adaptive":
        tree = _adaptive_tree(sources, targets, config.leaf)
    else:
        tree = _uniform_tree(sources, targets, config.depth, config.mesh)
    return _bind(tree, config.operators(tree.dim, sources.dtype), kernel, charges, config, check,
                 gradient, mode)


# The most points one device's sums have been measured right at (2^28 on
# one H200, and a device's share of 2^29 on two); at 2^29 on one H200 they
# came back inf, not out of memory, and the cause is not found.
DEVICE_POINTS = 2 ** 28


def _check_capacity(sources, targets, split: int = 1):
    """ValueError where a device would hold more than DEVICE_POINTS of the
    sources or targets (split: the devices they divide over)."""
    most = max(x.shape[0] for x in (sources, targets) if x is not None) // split
    if most > DEVICE_POINTS:
        raise ValueError(
            f"{most:,} points a device: jfmm's sums are measured right up to "
            f"{DEVICE_POINTS:,} points a device and came back wrong at 2^29 on one "
            f"GPU; split them over several devices (mesh=, counts that divide over it)")


def _uniform_tree(sources, targets, depth: int, mesh=None):
    """The uniform tree, built over the mesh's devices (each holding its
    share of the points, `distributed.build`) where the point counts
    divide over it."""
    split = mesh is not None and _distributed.splits(mesh, sources, targets)
    if depth:                                         # depth 0: the direct sum's one box
        _check_capacity(sources, targets, mesh.devices.size if split else 1)
    if split:
        return _distributed.build(sources, targets, depth, mesh)
    return _tree.build(sources, targets, depth)


def _adaptive_tree(sources, targets, leaf: int, build=_adaptive.build):
    """The adaptive tree of traced points: capacities from their shapes
    alone (`adaptive.bounded_capacities`), which hold any points. build:
    `_adaptive_jit` for concrete points (one program, not op by op)."""
    _check_capacity(sources, targets)
    n = sources.shape[0] + (0 if targets is None else targets.shape[0])
    caps = _adaptive.bounded_capacities(n, sources.shape[1], leaf, sources.dtype,
                                        None if targets is None else targets.shape[0])
    return build(sources, targets, leaf, caps)


def _bind(tree, ops, kernel, charges, config, check, gradient, mode):
    """phi (M, K), grad (M, K, d) or None, and whether they pass the
    check of the charges (`configure.checked`: NaN where they do not;
    None without a check). gradient="curl": (None, the curl (M, K), ok),
    summed alone where nothing is checked (the check reads phi)."""
    if gradient == "curl" and check is None:
        outs = _primitive.fmm_sum(tree, ops, kernel, {0: charges}, 1, config, mode, curl=True)
        return None, outs[0], None
    outs = _primitive.fmm_sum(tree, ops, kernel, {0: charges}, int(bool(gradient)), config,
                              mode)
    phi, grad, ok = _configure.checked(config, check, kernel, tree, charges, outs[0],
                                       outs[1] if gradient else None, mode)
    return (None, _p2p.curl(grad), ok) if gradient == "curl" else (phi, grad, ok)


def _check_output(gradient, dim: int, charges) -> bool:
    """Whether `gradient` asks for the curl; a ValueError for anything but
    False, True and "curl", and for a curl of 2D points or of charges not
    in columns of three."""
    if isinstance(gradient, str):
        if gradient != "curl":
            raise ValueError(f'gradient must be False, True or "curl", got {gradient!r}')
        cols = np.shape(charges)[1:]
        if dim != 3 or len(cols) != 1 or cols[0] % 3:
            raise ValueError(f'gradient="curl" takes 3D points and charges (N, 3k), got '
                             f'{dim}D points and charges of shape {np.shape(charges)}')
        return True
    if gradient not in (False, True):
        raise ValueError(f'gradient must be False, True or "curl", got {gradient!r}')
    return False


_fmm_jits = backend.jits(_fmm_eval, ("config", "gradient", "mode"))


def fmm(sources, charges, targets=None, kernel=_kernels.Laplace3D(), eps=None,
        gradient=False, *, leaf_size=None, order=None, family=None, tree="auto", mesh=None):
    """Fast multipole sum phi(y_j) = sum_i q_i K(|y_j - x_i|).

    Same arguments and shapes as `direct` (kernel: a `jfmm.kernels` kernel,
    or the name of one without parameters), plus eps, the requested relative
    L2 error of phi over the targets, and of grad phi where gradient=True or
    the points are traced (a transformation may move them; the rounding of
    float32 Chebyshev gradients grows with the tree's depth where the kernel
    is flat over the leaves, `models.chebyshev.gradient_rounding`: for
    concrete points a uniform tree takes a level fewer where that suffices,
    and an eps below it raises; traced points are not checked; float64
    Chebyshev gradients err up to 2e-11 in 2D) (None:
    1e-5 in float32, or the family's floor where higher, 1e-6 in float64; an
    eps the dtype cannot reach raises ValueError), leaf_size, the mean
    points per leaf the tree depth aims at, and order, which overrides the
    expansion order chosen from eps. gradient="curl" (3D, charges (N, 3k))
    returns, instead of phi and grad, the curl of each triple of charge
    columns' gradients, (M, 3k) (complex charges: complex curls): for
    vector potentials psi = (phi_0, phi_1, phi_2), curl psi, the
    Biot-Savart law (`jfmm.vortex`), at the gradient's order (eps holds
    for the gradient; the curl's absolute L2 error is at most sqrt(2)
    times the gradient's); its near field sums the curl alone (on a GPU
    three sums a pair and triple, where potential and gradient take 12).

    jit-able with eps, gradient, leaf_size, tree and the kernel's structure static;
    array sizes follow from input shapes alone, so no input of given shapes
    can overflow anything. Non-finite coordinates or charges raise eagerly
    (under jit they give NaN results), as does an eps outside (0, 1); float64
    data with jax's x64 mode off warns once (it is computed in float32).
    Eager calls remember their choices (`configure.resolve_eager`) and keep
    the plan they sum through for later calls on the same jax arrays, or
    the same numpy arrays with the same values: a repeated call costs
    about a `Plan.apply`.

    The charges: eps is relative to phi, which charges that cancel by
    construction make small (zero sum and first moments: the weights of an
    RBF interpolant with a linear polynomial tail) while the far field's
    error stays. Where an eager call's charges are known (and in a plan
    made with `charges=`), the Chebyshev family chooses its order for
    them: it sums them directly at 256 targets and divides its error
    estimate by their phi (`configure.charged`; remembered for the same
    charge arrays). Random charges then take lower orders than for unknown
    charges, cancelling ones the higher orders they need (measured within
    eps on such charges at 8,192 and 2^20 points, where the order for
    unknown charges erred up to 17 eps), and in float32, whose rounding is
    relative to the terms summed, cancelling charges raise where rounding
    alone would exceed eps (use float64). The fast Gauss transform likewise
    chooses its order for known charges that cancel at those targets more
    than random ones would (`hermite.Cancellation`: random charges on
    clustered sources, summed at targets apart, had erred up to 3.6 eps
    in 1% of draws); later eager calls with new charges on the same
    points keep the order. Inside jit, under vmap or grad
    with respect to the charges, and in plans made without `charges=`, the
    order is chosen for charges that do not cancel by construction, and
    the sums check their own charges (`configure.checked`): from phi and
    grad phi at the same 256 targets, the error estimate with these
    charges; a charge column whose estimate exceeds eps (and what the
    order was chosen for) is summed directly at those targets, and where
    its error there exceeds eps / 2 it comes back NaN under jit and raises
    `Unreachable` eagerly (moment-free charges, which erred up to 17 eps at
    such orders, were flagged or within eps). Make the plan with `charges=` like those to
    be summed, or ask for a smaller eps, to keep them. Laplace's series and
    the fast Gauss transform measured within eps on both kinds.

    Every JAX transformation works with respect to sources, charges and
    targets (jfmm.primitive): jax.grad of the potential costs two FMM calls
    with gradient (the forward one and its adjoint, the FMM with sources and
    targets swapped, at the forward call's order: where sources and targets
    are spread very differently its error may exceed eps, measured up to
    3.1 eps on an adaptive tree of clustered sources and targets on a
    sphere), memory O(N + M); vmap over charges is one call with
    more charge columns; jax.jvp, jacfwd, Hessian-vector products and reverse
    mode through gradient=True outputs differentiate the approximation:
    second derivatives of charges' sums on one device's uniform tree from
    the kernel's Hessian terms in the near field (Pallas on a GPU) and the
    L2P in forward mode, other orders in forward mode through the jnp near
    field (slower, one pass per derivative direction); pairs at distance 0
    add nothing to any derivative.
    Derivatives with respect to kernel parameters (e.g. Gaussian epsilon)
    cost one forward-mode pass per parameter; outside jit the parameters'
    values choose the order, inside it a rule for any value (`order=`
    reaches below its floor).

    Trees: tree="uniform" cuts the root box into equal leaves, depth levels
    deep; tree="adaptive" splits boxes while they hold more than a leaf's
    points (`jfmm.tree.adaptive`), so clustered points cost about what
    uniform ones do; "auto" (the default) builds an adaptive tree where the
    points crowd the uniform one (`configure.choose_tree`). Which tree each
    path takes: an eager call and a plan build an adaptive tree sized from
    their concrete points (an eager call on new points of shapes an
    earlier call sized one for takes, for the Laplace series on one
    device, the traced points' tree below, compiled once for a run of such
    calls); a traced call (inside jit, grad with respect to
    the points, vmap over point sets) builds one whose capacities follow
    from the shapes alone (`adaptive.bounded_capacities`: where a level runs
    out of room the most crowded boxes split first and larger leaves
    remain, so no input of given shapes overflows it) and, with "auto",
    decides at run time between it and the uniform tree by the same
    crowding (both are compiled; under vmap over point sets the batch takes
    one, the adaptive tree where any member crowds). Chebyshev kernels take
    it in float64 at the order of the worst root box (their traced order
    on any tree, higher than a built tree's: a jitted call on 2^20 Plummer
    points costs about twice the eager one), and so do calls on a mesh.
    Traced points keep the uniform tree for float32 Chebyshev kernels
    (their gradients round beyond eps on deep leaves) and where the
    uniform tree is too shallow for any points to crowd it: there make an
    adaptive plan outside jit and move its points with `Plan.update`.

    Families and orders (`jfmm.configure.resolve`): spherical harmonics for
    Laplace3D, complex series for Laplace2D, the fast Gauss transform or
    the near field alone for Gaussians where they meet eps, Chebyshev
    interpolation for every other kernel (family="chebyshev" forces it,
    family="hermite" asks for the Gauss transform); below the crossover
    measured per backend (`configure.DIRECT_PAIRS`) the direct sum. Orders come from each
    family's error model for eps, or from `order` (for Chebyshev: nodes per
    dimension); the 3D Laplace series' error weighed by the share of the
    sums its far field carries on these points (`configure.on_uniform`:
    crowded points, on a sphere's surface or in clusters, take lower
    orders; plans keep orders for any points). Smallest eps, each tested
    at that value: float64 3D Laplace 8.5e-11, 2D Laplace 4.8e-14,
    Chebyshev 1e-12 in 2D and 1e-10 in 3D where the kernel's estimate
    reaches them; float32 3e-6 for the
    Laplace series, 2e-5 for Chebyshev and the fast Gauss transform.
    Inside jit with traced points a Gaussian gets Chebyshev: to keep the
    transform under jit, make a plan outside it and call `Plan.update` and
    `Plan.apply` inside.

    Several devices: mesh, a `jax.sharding.Mesh` with one axis, splits the
    work over its devices (`jfmm.distributed`): the same tree, order and
    error as on one device, on uniform and adaptive trees, the results
    split over the mesh by rows (where the rows divide evenly). On the
    uniform tree with point counts that divide over the mesh each device
    holds only its share of the points; adaptive trees, and tree="auto"
    inside jit, hold every point on every device. Points and charges may
    come sharded over the mesh or not; on a mesh with Explicit axes
    (`jax.make_mesh`'s default) only eager calls take sharded inputs
    (under jit, grad or vmap pass them unsharded or on Auto axes), and not
    inside `jax.set_mesh` of it. jit, jax.grad in charges and points, and
    vmap over charges and point sets work on the sharded call. A device
    holds at most `DEVICE_POINTS` (2^28) sources or targets: more raise
    ValueError (2^29 on one H200 came back wrong; on two, split, right).
    """
    _configure.check_eps(eps)
    kernel = _inputs.kernel_of(kernel)
    output = "curl" if _check_output(gradient, np.shape(sources)[-1], charges) else gradient
    gradient = bool(gradient)       # the order and plans: a curl's are the gradient's
    if mesh is not None:
        mesh = _distributed.check_mesh(mesh)
        sources, charges, targets = (_distributed.on_mesh(x, mesh)
                                     for x in (sources, charges, targets))
    else:
        sources, targets = _device_points(sources), _device_points(targets)
    # The same jax arrays as a checked earlier call: its plan, without checks.
    opts = (eps, leaf_size, order, family, gradient, tree)
    charged = _charged(sources, targets, charges, kernel, mesh, *opts[:4], tree, measure=False)
    if charged is _UNMEASURED:
        # New charges on the points of earlier calls: the last plan made for
        # them, whose sums check these charges (`configure.checked`); only
        # where they cancel more than its order allows are they measured.
        latest = _eager_plan(sources, targets, kernel, *opts, mesh=mesh, make=False,
                             charged=_ANY)
        if latest is not None:
            try:
                return latest.apply(charges, output)
            except _configure.Unreachable:
                pass
        charged = _charged(sources, targets, charges, kernel, mesh, *opts[:4], tree)
    known = _eager_plan(sources, targets, kernel, *opts, mesh=mesh, make=False,
                        charged=charged)
    if known is not None:
        return known.apply(charges, output)
    given = (sources, targets)
    sources, q, targets, layout = _inputs.prepare(sources, charges, targets, kernel)
    if sources is given[0] and targets is given[1]:     # jax arrays of the working dtype
        remembered = _eager_plan(sources, targets, kernel, *opts, mesh=mesh, charged=charged)
        if remembered is not None:
            return remembered.apply(charges, output)
    else:                                               # prepared: new arrays
        charged = _charged(sources, targets, q, kernel, mesh, *opts[:4], tree)
    config = _configure.resolve_eager(sources, targets, kernel, *opts,     # remembered
                                      charged=charged)
    config = _configure.choose_tree(config, sources, targets, tree, order)
    config = _configure.on_uniform(config, kernel, sources, targets, order,
                                   leaf_size).with_mesh(mesh)
    if all(_configure.concrete(x) for x in (sources, targets) if x is not None):
        # Concrete points: their plan (an adaptive tree sized from them, and
        # the order for it), kept for the next call on these arrays and
        # applied as it will apply it: one compiled program for both.
        pl = _new_plan(sources, targets, kernel, config, order, charged,
                       bounded=_moved(sources, targets, config))
        if sources is given[0] and targets is given[1]:
            _keep_plan(sources, targets, pl, _plan_options(kernel, *opts, mesh, targets, charged))
        return pl.apply(charges if hasattr(charges, "shape") else jnp.asarray(charges),
                        output)
    phi, grad, ok = backend.call(_fmm_jits, sources, q, targets, kernel, config.check_arrays,
                                 config=config.static, gradient=output,
                                 mode=backend.current())
    _configure.raise_unchecked(ok, config)
    return _inputs.finish(phi, grad, layout, output)


_HOST_POINTS = []    # (numpy array weak reference, its values then, their jax array), recent


def _device_points(x):
    """The jax array of numpy points x: the one an earlier eager call made
    from this very numpy array if its values are those it had then
    (compared in full: numpy arrays change in place), so that calls on the
    same numpy points find their plan (`_eager_plan`) as calls on the same
    jax arrays do. x itself where it is not a numpy array of floats."""
    if not (isinstance(x, np.ndarray) and x.ndim == 2 and x.dtype.kind == "f"):
        return x
    for ref, values, arr in _HOST_POINTS:
        if ref() is x and np.array_equal(values, x):
            return arr
    _inputs.warn_float64(x)
    arr = jnp.asarray(x)
    _forget_points(x)
    _HOST_POINTS.insert(0, (weakref.ref(x, _forget_points), x.copy(), arr))
    del _HOST_POINTS[4:]
    return arr


def _forget_points(gone):
    """Drop the `_HOST_POINTS` entry of a numpy array (or of its weak
    reference, once the array is freed)."""
    _HOST_POINTS[:] = [e for e in _HOST_POINTS if e[0] is not gone and e[0]() is not gone]


def _same_arrays(refs, arrays) -> bool:
    """Whether the weak references hold these very jax arrays (immutable:
    the same objects hold the same values)."""
    return len(refs) == len(arrays) and all(r() is x for r, x in zip(refs, arrays))


_CHARGED = []     # (charges, sources, targets weak references, options, moments), recent


_UNMEASURED, _ANY = object(), object()


def _charged(sources, targets, charges, kernel, mesh, eps, leaf_size, order, family, tree,
             measure=True):
    """`configure.charged` for a call's charges, as given (None on a mesh
    of several processes, or where the points are not yet jax arrays of
    floats); remembered for the same jax arrays (immutable) and options, so
    that repeated calls do not sum them again. measure=False: _UNMEASURED
    where it would sum them."""
    if (not isinstance(sources, jax.Array)
            or mesh is not None and not (_configure.concrete(sources)
                                         and sources.is_fully_addressable)
            or not _configure.uses_charges(kernel, sources, targets, family, order, eps,
                                           leaf_size, tree)):
        return None
    arrays = (charges, sources) + (() if targets is None else (targets,))
    options = (_configure.kernel_key(kernel), family, eps, leaf_size, order, tree)
    held = isinstance(charges, jax.Array) and options[0] is not None
    for refs, opts, value in _CHARGED if held else ():
        if opts == options and _same_arrays(refs, arrays):
            return value
    if not measure:
        return _UNMEASURED
    try:
        q, _ = _inputs.charges_of(charges, sources.shape[0], sources.dtype)
    except (ValueError, TypeError):     # `prepare` says what is wrong
        return None
    value = _configure.charged(sources, targets, kernel, q, family, order, eps, leaf_size,
                               tree)
    if held and not _compat.tracing() and _configure.concrete(charges):
        _CHARGED.insert(0, (tuple(map(weakref.ref, arrays)), options, value))
        del _CHARGED[4:]
    return value


_PLANS = []      # (sources, targets weak references, options, Plan) of recent eager calls


def _eager_plan(sources, targets, kernel, eps, leaf_size, order, family, gradient, tree,
                mesh=None, make=True, charged=None):
    """The Plan of eager calls on these very jax arrays (immutable, so the
    same objects hold the same points) with the same kernel values and
    options and moments of the charges (`configure.charged`; _ANY: the
    latest plan for any): the one an eager call made and kept on first
    sight of these points (`_keep_plan`), or else made here on the second
    sight (make=False: only one made before); None on the first or where
    anything is traced."""
    pts = (sources,) if targets is None else (sources, targets)
    options = _plan_options(kernel, eps, leaf_size, order, family, gradient, tree, mesh,
                            targets, charged)
    if (options[0] is None or _compat.tracing()
            or not all(isinstance(x, jax.Array) and _configure.concrete(x) for x in pts)):
        return None
    seen = False                        # these points and options, other charges
    for i, (refs, opts, pl) in enumerate(_PLANS):
        if opts[:-1] != options[:-1] or not _same_arrays(refs, pts):
            continue
        if charged is _ANY and pl is not None or opts == options:
            break
        seen = True
    else:
        if not make or charged is _ANY:
            return None
        refs, pl, i = tuple(map(weakref.ref, pts)), None, 0
        _PLANS.insert(0, (refs, options, None))
        del _PLANS[4:]
        if not seen:                    # first sight: remembered, no plan yet
            return None
    if pl is None and make:
        pl = _plan(sources, targets, kernel, eps, leaf_size, order, family, gradient, tree,
                   mesh, fixed=True, charged=charged)
        _PLANS[i] = (refs, options, pl)
    return pl


def _plan_options(kernel, eps, leaf_size, order, family, gradient, tree, mesh, targets,
                  charged) -> tuple:
    """What besides the points an eager call's plan is kept under."""
    return (_configure.kernel_key(kernel), eps, leaf_size, order, family, gradient, tree, mesh,
            targets is None, charged)


def _keep_plan(sources, targets, pl, options: tuple):
    """Keep pl, made by an eager call on first sight of these points, as
    their plan (`_eager_plan`; options from `_plan_options`), so that the
    next call on them compiles and builds nothing."""
    pts = (sources,) if targets is None else (sources, targets)
    for i, (refs, opts, held) in enumerate(_PLANS):
        if held is None and opts == options and _same_arrays(refs, pts):
            _PLANS[i] = (refs, opts, pl)
            return


# ------------------------------------------------------------------ plan

@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["tree", "kernel", "ops", "check", "extent"],
                   meta_fields=["config"])
@dataclasses.dataclass(frozen=True)
class Plan:
    """A built tree plus operators, to apply to many charge vectors.

    Static (changing them recompiles): the configuration (family, order,
    depth, eps, tree kind: `jfmm.configure.Config`) and the tree's static
    sizes (dim; an adaptive tree's leaf size and capacities).
    Arrays: the tree, the kernel's parameters, the translation operators,
    and the values of the check of the charges (`configure.checked`; None
    for families without one).

    overflow: whether the tree's points need more room than it was sized
    for: an adaptive tree sets it when `update` moves the points beyond
    its capacities; a plan of a kernel with a length scale summed by the
    Chebyshev FMM or the fast Gauss transform when `update` spreads the
    points over a root box more than EXTENT_SLACK times as wide as the one
    its order was chosen for (`extent`; None for scale-free kernels). A
    plan that overflowed returns NaN under jit and raises from an eager
    `apply`, as does a plan
    of a kernel summed as 1/r beyond a core (`Kernel.laplace_beyond`)
    whose points `update` packed so tightly that its leaves are smaller
    than the core, and (per charge column) a Chebyshev plan applied to
    charges that cancel beyond what its order holds eps for (`fmm`).
    """
    tree: _tree.Tree | _adaptive.AdaptiveTree
    kernel: _kernels.Kernel
    ops: object
    config: Config
    check: object = None
    extent: jax.Array | None = None

    order = property(lambda self: self.config.order)
    eps = property(lambda self: self.config.eps)
    family = property(lambda self: self.config.name, doc="the family's name, or 'near'")

    @property
    def overflow(self):
        return _overflow(self)

    def apply(self, charges, gradient=False):
        """phi (and grad) for charges (N,) or (N, k), or with gradient="curl"
        the curl alone; see `fmm`."""
        curl = _check_output(gradient, self.tree.dim, charges)
        if gradient and not self.config.gradient:
            raise ValueError("this plan's order keeps phi's error within eps, not the "
                             "gradient's: make it with jfmm.plan(..., gradient=True)")
        overflow = getattr(self.tree, "overflow", False)      # uniform trees: never
        if _configure.concrete(overflow) and bool(overflow):
            raise RuntimeError("the points moved beyond the capacities this plan's adaptive "
                               "tree was sized for (Plan.update): make a new plan from them "
                               "with jfmm.plan(...)")
        if self.extent is not None and _configure.concrete(self.tree.side) \
                and _configure.concrete(self.extent) and _beyond_now(self):
            raise RuntimeError(f"the points (Plan.update) spread over a root box of side "
                               f"{float(self.tree.side):.4g}, wider than the "
                               f"{float(self.extent) / EXTENT_SLACK:.4g} this plan's order was "
                               f"chosen for (the kernel has a length scale, so its accuracy "
                               f"does not carry over): make a new plan from them with "
                               f"jfmm.plan(...)")
        if (self.config.reach and self.config.family is not None and self.tree.depth >= 2
                and _configure.concrete(self.tree.side)
                and float(self.tree.box_side(self.tree.depth)) < self.config.reach):
            raise RuntimeError(f"the points (Plan.update) leave leaves smaller than "
                               f"{self.config.reach:.3g}, within which the kernel is not 1/r "
                               "(Kernel.laplace_beyond): make a new plan from them with "
                               "jfmm.plan(...)")
        _inputs.check_finite_charges(charges)
        if self.config.mesh is not None:
            charges = _distributed.on_mesh(charges, self.config.mesh)
        phi, grad, ok = backend.call(_apply_jits, self, charges, gradient=gradient,
                                     mode=backend.current())
        _configure.raise_unchecked(ok, self.config)
        return grad if curl else (phi, grad) if gradient else phi

    def update(self, sources, targets=None):
        """Rebuild the tree for new points of the same shapes (jit-able).

        An adaptive tree keeps its capacities and sets `overflow` where the
        new points need more. The family, order and depth stay the plan's,
        chosen for the points
        it was made with: kernels with a length scale (Chebyshev's order,
        the fast Gauss transform's grid level and order) keep their
        accuracy for new points of about the same extent, and set
        `overflow` for points spread wider (`extent`)."""
        def checked(name, x, like):
            x = _inputs.check_points(name, x, self.kernel.dims, self.kernel)
            if x.shape != like.shape:
                raise ValueError(f"update needs {name} of shape {like.shape}, got {x.shape}")
            return x.astype(like.dtype)

        if self.config.mesh is not None:
            sources, targets = (_distributed.on_mesh(x, self.config.mesh)
                                for x in (sources, targets))
        sources = checked("sources", sources, self.tree.src_sorted)
        targets = None if targets is None else checked("targets", targets, self.tree.tgt_sorted)
        if isinstance(self.tree, _adaptive.AdaptiveTree):
            tree = _adaptive_jit(sources, targets, self.tree.leaf_size, self.tree.caps)
        else:
            tree = _build_jit(sources, targets, self.tree.depth, self.config.mesh)
        return dataclasses.replace(self, tree=tree)


# A plan of a kernel with a length scale serves points whose root box is at
# most this much wider than its own (`Plan.extent`). Gaussian of epsilon 2,
# 30,000 points in the unit cube, eps 1e-4, float64 (fast Gauss
# transform): error 9.3e-6 as planned, 1.1e-5 at 1.05x, 1.9e-5 at 1.2x,
# 1.5e-4 at 2x, 6.8e-4 at 3x.
EXTENT_SLACK = 1.05


def _extent(config: Config, kernel, tree):
    """The widest root box a plan serves, or None: scale-free kernels
    (no parameters: Laplace, polyharmonics, thin-plate) and the series
    families serve any."""
    scaled = isinstance(kernel, _kernels.Radial) or bool(dataclasses.fields(kernel))
    if config.name not in ("chebyshev", "hermite") or not scaled:
        return None
    return EXTENT_SLACK * tree.side


def _beyond(plan_):
    """Whether the plan's points spread wider than its `extent` (a bool array)."""
    if plan_.extent is None:
        return jnp.zeros((), bool)
    return plan_.tree.side > plan_.extent


def _beyond_now(plan_) -> bool:
    """`_beyond` of concrete arrays, eagerly (also inside a jit trace)."""
    with jax.ensure_compile_time_eval():
        return bool(_beyond(plan_))


def _overflow(plan_):
    return getattr(plan_.tree, "overflow", jnp.zeros((), bool)) | _beyond(plan_)


def _apply(plan_, charges, gradient, mode):
    """The plan's sums of charges (N,) or (N, k), real or complex, in their
    layout (the casts and reshapes inside the jit: an eager call of a small
    plan costs about a direct sum's); NaN where the points spread beyond
    the plan's extent."""
    q, layout = _inputs.charges_of(charges, plan_.tree.src_perm.shape[0],
                                   plan_.tree.src_sorted.dtype)
    phi, grad, ok = _bind(plan_.tree, plan_.ops, plan_.kernel, q, plan_.config, plan_.check,
                          gradient, mode)
    if plan_.extent is not None:
        beyond = _beyond(plan_)
        nan = jnp.asarray(jnp.nan, grad.dtype if phi is None else phi.dtype)
        phi = None if phi is None else jnp.where(beyond, nan, phi)
        grad = None if grad is None else jnp.where(beyond, nan, grad)
    if gradient == "curl":
        return None, _inputs.finish(phi, grad, layout, "curl"), ok
    return (*_inputs.finish(phi, grad, layout, True), ok)


_apply_jits = backend.jits(_apply, ("gradient", "mode"))
_build_jit = _xla.once(_uniform_tree, static_argnames=("depth", "mesh"))
_adaptive_jit = _adaptive.build_jit


# (shapes, dtype, leaf size) of the adaptive trees eager calls have sized
# from their points (`_moved`).
_SIZED = set()


def _moved(sources, targets, config: Config) -> bool:
    """Whether an eager call's adaptive tree of the 2D or 3D Laplace series
    on one device takes the capacities of traced points (`adaptive.bounded_capacities`):
    where an earlier call sized one from other points of these shapes. A
    run of eager calls on new points (time steps outside jit) then compiles
    one tree, where a tree sized from each point set compiled its own (H200,
    2^20 Plummer points, new points each call: 21 s a call). The first
    point set of its shapes keeps the tighter tree sized from it."""
    if (config.tree != "adaptive" or config.name not in ("laplace3d", "laplace2d")
            or config.mesh is not None):
        return False
    key = (sources.shape, None if targets is None else targets.shape, sources.dtype.name,
           config.leaf)
    seen = key in _SIZED
    _SIZED.add(key)
    return seen


def _new_plan(sources, targets, kernel, config: Config, order=None, charged=None,
              bounded=False) -> Plan:
    """The plan of a configuration: its tree (an adaptive one sized from
    these concrete points, and the order for it, or with bounded: the
    tree of traced points) and operators. A plan keeps one family: of a
    configuration with a fallback (traced points), the last of its chain
    (`Config.last`), which serves every extent."""
    config = config.last
    concrete = all(_configure.concrete(x) for x in (sources, targets) if x is not None)
    if config.tree == "adaptive" and (bounded or not concrete):
        # Capacities from the shapes; traced points' order was chosen for them.
        if bounded:
            config = _configure.on_tree(config, None, kernel, sources, targets, order, charged)
        tree = _adaptive_tree(sources, targets, config.leaf,
                              _adaptive_jit if concrete else _adaptive.build)
    elif config.tree == "adaptive":
        tree = _adaptive.plan_tree(sources, targets, config.leaf)
        config = _configure.on_tree(config, tree, kernel, sources, targets, order, charged)
    else:
        tree = _build_jit(sources, targets, config.depth, config.mesh)
    return Plan(tree, kernel, config.operators(sources.shape[1], sources.dtype), config.static,
                config.check_arrays, _extent(config, kernel, tree))


def plan(sources, targets=None, kernel=_kernels.Laplace3D(), eps=None, *, leaf_size=None,
         order=None, family=None, gradient=False, tree="auto", mesh=None, charges=None):
    """Build the tree and operators once; see `Plan.apply` and `Plan.update`.
    gradient=True: an order whose gradients (`apply(q, gradient=True)`,
    derivatives along point moves) meet eps too; else phi's alone. tree:
    "uniform", "adaptive" or "auto"; mesh: the devices to shard over (see
    `fmm`). The order serves any points of these sizes that `update` may
    bring (for kernels with a length scale, of about the same extent); an
    eager `fmm` call may take a lower one for crowded points
    (`configure.on_uniform`).

    charges (N,) or (N, k), optional: charges like those the plan will
    sum. The Chebyshev family then chooses its order for how they cancel
    (`fmm`): random charges take lower orders than a plan made without
    them, which holds for any charges that do not cancel by construction;
    charges that do (RBF weights with a polynomial tail) take the higher
    order they need. Applied to charges that cancel more than those, the
    sums are checked as in `fmm`: NaN under jit, `Unreachable` eagerly,
    where the error estimate for them exceeds eps. On a mesh of several
    processes the charges are not looked at."""
    return _plan(sources, targets, kernel, eps, leaf_size, order, family, gradient, tree, mesh,
                 charges=charges)


def _plan(sources, targets, kernel, eps, leaf_size, order, family, gradient, tree, mesh,
          fixed=False, charged=None, charges=None):
    """`plan`; fixed: for these points alone (eager calls' plans), whose
    3D Laplace order may weigh their far field's share (`on_uniform`);
    charged: `configure.charged` of the charges, where the caller has it,
    else of `charges` (None: none given)."""
    _configure.check_eps(eps)
    kernel = _inputs.kernel_of(kernel)
    if mesh is not None:
        mesh = _distributed.check_mesh(mesh)
        sources, targets = (_distributed.on_mesh(x, mesh) for x in (sources, targets))
    sources, targets = _inputs.points_of(sources, targets, kernel)
    if charges is not None and charged is None:
        q, _ = _inputs.charges_of(charges, sources.shape[0], sources.dtype)   # checked
        charged = _charged(sources, targets, q, kernel, mesh, eps, leaf_size, order, family,
                           tree)
    config = _configure.resolve_eager(sources, targets, kernel, eps, leaf_size, order, family,
                                      gradient, tree, charged)
    config = _configure.choose_tree(config, sources, targets, tree, order)
    if fixed:
        config = _configure.on_uniform(config, kernel, sources, targets, order, leaf_size)
    return _new_plan(sources, targets, kernel, config.with_mesh(mesh), order, charged)
