"""The one switch between jnp operators and their Pallas kernels.

Modes: "auto" (Pallas on GPU, jnp elsewhere), "jnp", "pallas" (compiled;
GPU only), "interpret" (Pallas kernels run by the Pallas interpreter: how the
CPU tests check them). Set with `set_backend` or the JFMM_BACKEND environment
variable. The public calls resolve the mode (`current()`) when they are called
and pass it down as a static argument, so it is part of every jit cache key.

On the Pallas backends the M2L stays XLA's grouped products, with float32
products as exact products of bfloat16 pieces on tensor cores (the fastest
measured, and as accurate as float32 products; `translate.m2l`); the Pallas
M2L kernel is an option (`set_backend(m2l=...)`).
"""
from __future__ import annotations

import math
import os

import jax
import jax.numpy as jnp

from jfmm._compat import Tracer
from jfmm.ops import chebyshev, far, laplace3d, p2p, translate
from jfmm.ops.pallas import far as pallas_far
from jfmm.ops.pallas import laplace3d as pallas_laplace3d
from jfmm.ops.pallas import m2l as pallas_m2l
from jfmm.ops.pallas import p2p as pallas_p2p
from jfmm.tree import tiles

MODES = ("auto", "jnp", "pallas", "interpret")
# Expansion families with Pallas P2M / L2P kernels, and the largest order
# they are used for (above it the jnp operators run; the kernels unroll
# their harmonics up to `pallas_laplace3d.UNROLLED_MAX` and loop above, so
# every order of the 3D Laplace family: H100, float64, 2^20, p = 30: P2M
# 65.6 -> 3.7 ms, L2P 66.5 -> 3.4 ms against the jnp operators).
# JFMM_PALLAS_MAX_ORDER overrides it (benchmarks).
_PALLAS_FAMILIES = {laplace3d: pallas_laplace3d}
PALLAS_MAX_ORDER = int(os.environ.get("JFMM_PALLAS_MAX_ORDER", 36))
# The same for the M2P and P2L kernels of adaptive trees (jfmm.ops.pallas.far):
# their jnp twins store points x boxes x p^2 values, so the Pallas ones
# serve higher orders (H100, float64 eps 1e-8, p = 22, Plummer 2^20: the
# whole sum 2,687 ms with the jnp twins, 148 ms with these kernels).
FAR_PALLAS_MAX_ORDER = int(os.environ.get("JFMM_FAR_PALLAS_MAX_ORDER", 24))
_mode = os.environ.get("JFMM_BACKEND", "auto")
_blocks = pallas_p2p.Blocks()
# All pairs (jfmm.direct): one long source range per tile, where 8 x 32 tiles
# beat the near field's 8 x 16 (docs/design.md, "Near field").
_dense_blocks = pallas_p2p.Blocks(8, 32)
# Second derivatives (6 sums a charge column in 3D): 8 x 8 tiles. H100,
# float64, all pairs of 2^15 vortex elements, 3 columns, the second
# derivatives (a jvp's tangent, its primal unused): 11.6 ms against
# 14.2-14.3 at 8 x 16, 16 x 8, 4 x 32, 16 x 16 and 36.8 at 8 x 32.
_hessian_blocks = pallas_p2p.Blocks(8, 8)
# The M2L of the Pallas backends: "bf16x6" (the jnp operator with its
# float32 products as six bfloat16 products on tensor cores), "float32" (the
# jnp operator as on the CPU) or Pallas M2L tiles.
M2L_CHOICES = ("bf16x6", "float32")
_m2l: str | pallas_m2l.Tiles = "bf16x6"


def set_backend(mode: str, blocks: pallas_p2p.Blocks | None = None,
                m2l: pallas_m2l.Tiles | str | None = None) -> None:
    """Choose the backend (see module docstring) and, optionally, the tile
    sizes of the Pallas P2P (near field, all pairs and their second
    derivatives alike) and the M2L
    of the Pallas backends (one of M2L_CHOICES or Pallas M2L tiles). Tiles
    and the M2L choice are read when a call is traced and are not part of
    jit cache keys: they apply to functions traced afterwards (all give the
    same sums to within their measured errors)."""
    global _mode, _blocks, _dense_blocks, _hessian_blocks, _m2l
    if mode not in MODES:
        raise ValueError(f"backend must be one of {MODES}, got {mode!r}")
    _mode = mode
    if blocks is not None:
        _blocks = _dense_blocks = _hessian_blocks = blocks
    if m2l is not None:
        if not isinstance(m2l, pallas_m2l.Tiles) and m2l not in M2L_CHOICES:
            raise ValueError(f"m2l must be one of {M2L_CHOICES} or Tiles, got {m2l!r}")
        _m2l = m2l


def m2l_choice() -> str | pallas_m2l.Tiles:
    """The M2L of the Pallas backends (see `set_backend`)."""
    return _m2l


def current() -> str:
    """The resolved mode: "jnp", "pallas" or "interpret"."""
    if _mode == "auto":
        return "pallas" if jax.default_backend() == "gpu" else "jnp"
    return _mode


def near_field(kernel, tgt_sorted, tgt_start, src_sorted, q_sorted, src_start, near,
               gradient: bool, mode: str, blocks: pallas_p2p.Blocks | None = None,
               leaves: int | None = None, curl: bool = False, ranges=None, active=None):
    """`jfmm.ops.p2p.near_field` on backend `mode` (see `current`); jnp for
    kernels the Pallas kernel cannot lower (`Kernel.pallas`). leaves: the
    leaves with targets in most trees, where far fewer than the slots
    (`tiles.in_steps`). curl=True: (None, `p2p.curl` of the gradient), which
    the Pallas kernel sums alone. ranges: the neighbours' source ranges
    (`p2p.source_ranges`), where made already; active: the target leaves to
    sum at, the others left 0 (`tiles.in_steps`)."""
    m = tgt_sorted.shape[0]
    if mode == "jnp" or not kernel.pallas:
        phi, grad = tiles.in_steps(
            lambda *t: p2p.near_field(kernel, tgt_sorted, tgt_start, src_sorted, q_sorted,
                                      src_start, near, gradient or curl, tiles=t, ranges=ranges),
            tgt_start, m, p2p.TILE, leaves, active)
        return (None, p2p.curl(grad)) if curl else (phi, grad)
    blocks = blocks or _blocks
    out = tiles.in_steps(
        lambda *t: pallas_p2p.near_field(kernel, tgt_sorted, tgt_start, src_sorted, q_sorted,
                                         src_start, near, gradient and not curl, blocks=blocks,
                                         interpret=mode == "interpret", tiles=t, curl=curl,
                                         ranges=ranges),
        tgt_start, m, blocks.targets, leaves, active)
    return (None, out) if curl else out


def near_field_along(kernel, tgt_sorted, tgt_start, src_sorted, q_sorted, src_start, near,
                     along, mode: str, leaves: int | None = None):
    """The curl of the near field's gradient differentiated along each
    target's direction along (M, d), sorted as the targets: (M, K)
    (`pallas_p2p.near_field`'s along; jnp: forward mode through
    `jfmm.ops.p2p.near_field`). leaves: as `near_field`."""
    m = tgt_sorted.shape[0]
    along = along.astype(tgt_sorted.dtype)
    if mode == "jnp" or not kernel.pallas:
        def run(*t):
            grad = lambda y: p2p.near_field(kernel, y, tgt_start, src_sorted,  # noqa: E731
                                            q_sorted, src_start, near, True, tiles=t)[1]
            return p2p.curl(jax.jvp(grad, (tgt_sorted,), (along,))[1])
        return tiles.in_steps(run, tgt_start, m, p2p.TILE, leaves)
    return tiles.in_steps(
        lambda *t: pallas_p2p.near_field(kernel, tgt_sorted, tgt_start, src_sorted, q_sorted,
                                         src_start, near, False, blocks=_blocks,
                                         interpret=mode == "interpret", tiles=t, along=along),
        tgt_start, m, _blocks.targets, leaves)


def near_field_hessian(kernel, tgt_sorted, tgt_start, src_sorted, q_sorted, src_start, near,
                       mode: str):
    """`jfmm.ops.p2p.near_field_hessian` on backend `mode`."""
    if mode == "jnp" or not kernel.pallas:
        return p2p.near_field_hessian(kernel, tgt_sorted, tgt_start, src_sorted, q_sorted,
                                      src_start, near)
    return pallas_p2p.near_field(kernel, tgt_sorted, tgt_start, src_sorted, q_sorted, src_start,
                                 near, False, blocks=_hessian_blocks,
                                 interpret=mode == "interpret", hessian=True)


# All pairs run with the r = 0 select everywhere unless there are this many
# pairs per point: below it the coincidence check's sort of the N + M points
# would cost more than skipping the select saves (about 15% of a pair's time).
DENSE_CHECK_RATIO = 2 ** 14


def dense(kernel, targets, sources, charges, gradient: bool, mode: str, hessian: bool = False,
          curl: bool = False, along=None):
    """All-pairs sum on backend `mode` (targets None: the sources themselves);
    hessian: its second derivatives along the targets alone (M, K, d, d)
    (`jfmm.ops.p2p.dense_hessian`); curl: (None, the curl (M, K)), as
    `near_field`; along (M, d): the curl of the gradient's derivative along
    each target's direction (M, K) (`near_field_along`).

    The Pallas path is the near-field kernel on a one-leaf tree whose only
    neighbour is itself. Where N M >= DENSE_CHECK_RATIO (N + M), a sort finds
    whether any target equals a source (other than itself); if none does,
    only the source chunks that hold a tile's own rows (targets None) keep
    the r = 0 select. Few separate targets split the sources into groups
    summed side by side (`_source_groups`)."""
    y = sources if targets is None else targets
    if (mode == "jnp" or not kernel.pallas) and hessian:
        return p2p.dense_hessian(kernel, y, sources, charges)
    if (mode == "jnp" or not kernel.pallas) and along is not None:
        return p2p.curl(jax.jvp(lambda t: p2p.dense(kernel, t, sources, charges, True)[1],
                                (y,), (along.astype(y.dtype),))[1])
    if mode == "jnp" or not kernel.pallas:
        phi, grad = p2p.dense(kernel, y, sources, charges, gradient or curl)
        return (None, p2p.curl(grad)) if curl else (phi, grad)
    m, n = y.shape[0], sources.shape[0]
    one = targets is None or hessian or curl or along is not None
    groups = 1 if one else _source_groups(m, n)
    if groups > 1:
        return _dense_groups(kernel, targets, sources, charges, gradient, mode, groups)
    out = _pallas_dense(kernel, targets, sources, charges, gradient, mode, hessian, curl, along)
    return (None, out) if curl else out


def dense_few(kernel, targets, sources, charges, gradient: bool, mode: str):
    """`dense` at a few hundred targets (the models' and checks' samples):
    on the jnp backend `p2p.dense_few`'s scan over source chunks, which
    compiles faster and, at so few targets, runs as fast; else `dense`."""
    if mode == "jnp":
        return p2p.dense_few(kernel, targets, sources, charges, gradient)
    return dense(kernel, targets, sources, charges, gradient, mode)


def _pallas_dense(kernel, targets, sources, charges, gradient: bool, mode: str, hessian: bool,
                  curl: bool = False, along=None):
    """`dense` by the Pallas near-field kernel, in one group of sources."""
    y = sources if targets is None else targets
    m, n = y.shape[0], sources.shape[0]
    t_start = jnp.array([0, m, m], jnp.int32)
    s_start = jnp.array([0, n, n], jnp.int32)
    blocks = _hessian_blocks if hessian else _dense_blocks
    _, t0, t1 = p2p.leaf_tiles(t_start, m, blocks.targets)
    g0, g1 = jnp.zeros_like(t0), jnp.full_like(t1, n)        # every source row
    check = m * n >= DENSE_CHECK_RATIO * (m + n)
    if check and targets is None:                           # else a tile's own rows
        dup = p2p.any_coincide(sources)
        g0, g1 = jnp.where(dup, g0, t0), jnp.where(dup, g1, t1)
    elif check:                                             # else none
        g1 = jnp.where(p2p.any_coincide(sources, targets), g1, 0)
    return pallas_p2p.near_field(kernel, y, t_start, sources, charges, s_start,
                                 jnp.zeros((1, 1), jnp.int32), gradient, blocks=blocks,
                                 interpret=mode == "interpret", coincide=(g0, g1),
                                 hessian=hessian, curl=curl, along=along)


# Few targets: one tile of targets per program walks every source, and too
# few programs fill a GPU. The sources split into groups summed side by side
# until there are about DENSE_PROGRAMS (tile, group) programs, each group
# at least DENSE_GROUP_SOURCES long. H100, 256 targets, 2^20 sources, phi and
# grad: Multiquadric(1) float32 14.0 ms in one group, 1.40 in 16, 0.55 in
# 64, 0.50 in 256; float64 27.6, 2.27, 1.29, 1.27.
DENSE_PROGRAMS = 2048
DENSE_GROUP_SOURCES = 2 ** 14


def _source_groups(m: int, n: int) -> int:
    """How many groups the sources of an all-pairs sum to m targets split into."""
    tiles = -(-m // _dense_blocks.targets)
    groups = 1
    while groups * tiles < DENSE_PROGRAMS and n // (2 * groups) >= DENSE_GROUP_SOURCES:
        groups *= 2
    return groups


def _dense_groups(kernel, targets, sources, charges, gradient: bool, mode: str, groups: int):
    """`dense` over `groups` equal groups of the sources (padded with zero
    charges at the first source), summed."""
    pad = -sources.shape[0] % groups
    sources = jnp.concatenate([sources, jnp.broadcast_to(sources[:1], (pad, sources.shape[1]))])
    charges = jnp.concatenate([charges, jnp.zeros((pad, charges.shape[1]), charges.dtype)])
    xs = sources.reshape(groups, -1, sources.shape[1])
    qs = charges.reshape(groups, -1, charges.shape[1])
    phi, grad = jax.vmap(lambda x, q: _pallas_dense(kernel, targets, x, q, gradient, mode,
                                                    False))(xs, qs)
    return phi.sum(0), (grad.sum(0) if gradient else None)


def m2l(mult, level: int, mats, dim: int, mode: str):
    """`jfmm.ops.translate.m2l` on backend `mode`."""
    if mode == "jnp" or _m2l in M2L_CHOICES or not isinstance(mats, jax.Array):
        return translate.m2l(mult, level, mats, dim, bf16x6=mode != "jnp" and _m2l == "bf16x6")
    return pallas_m2l.m2l(mult, level, mats, dim, _m2l, interpret=mode == "interpret")


def m2l_blocks(grouped, cols, mats, dim: int, mode: str):
    """`jfmm.ops.translate.m2l_blocks` on backend `mode` (the Pallas M2L
    tiles serve the dense grid alone; blocks take the bf16x6 products)."""
    return translate.m2l_blocks(grouped, cols, mats, dim,
                                bf16x6=mode != "jnp" and _m2l != "float32")


def _far_twin(family, p: int, mode: str) -> bool:
    """Whether the Pallas M2P and P2L serve this family and order."""
    return _family_twin(family, p, mode, FAR_PALLAS_MAX_ORDER) is not None


def far_m2p(family, kernel, tree, mult, p: int, gradient: bool, mode: str):
    """`jfmm.ops.far.m2p` (the W list of an adaptive tree) on backend `mode`."""
    if not _far_twin(family, p, mode):
        return far.m2p(family, kernel, tree, mult, p, gradient)
    t0, t1, boxes = far.entries(tree, tree.w_tile, tree.w_pos, tree.tgt_start,
                                tree.tgt_sorted.shape[0])
    center, side = tree.center, tree.box_side(tree.level)
    if boxes.size < tree.n_boxes:
        # Fewer (entry, box) pairs than boxes (a bounded tree's chunk of
        # the list): coefficient sets for those pairs alone, not every slot.
        # (Gathers that fill the sentinel's rows with zeros: no per-chunk
        # copy of the whole multipole array with a zero row appended.)
        flat = boxes.reshape(-1)
        take = lambda a: jnp.take(a, flat, axis=0, mode="fill", fill_value=0)  # noqa: E731
        mult, center, side = take(mult), take(center), take(side)
        boxes = jnp.where(flat < tree.n_boxes, jnp.arange(flat.shape[0], dtype=flat.dtype),
                          flat.shape[0]).reshape(boxes.shape)
    return pallas_far.m2p(tree.tgt_sorted, laplace3d.m2p_coefficients(mult, p, gradient),
                          center, side, (t0, t1), boxes, gradient,
                          interpret=mode == "interpret")


def far_p2l(family, kernel, tree, q_sorted, p: int, into, mode: str):
    """`jfmm.ops.far.p2l` (the X list of an adaptive tree, added to the
    locals `into`) on backend `mode`."""
    if not _far_twin(family, p, mode):
        return far.p2l(family, kernel, tree, q_sorted, p, into)
    t0, t1, boxes = far.entries(tree, tree.x_tile, tree.x_pos, tree.src_start,
                                tree.src_sorted.shape[0])
    return pallas_far.p2l(tree.src_sorted, q_sorted, tree.center, tree.box_side(tree.level),
                          (t0, t1), boxes, p, into, interpret=mode == "interpret")


def _family_twin(family, p: int, mode: str, max_order: int = PALLAS_MAX_ORDER):
    """The family's Pallas kernels module where they serve order p, else None."""
    if mode == "jnp" or p > max_order:
        return None
    return _PALLAS_FAMILIES.get(family)


# The jnp P2M and L2P make K x P (or K x E x P) values per point; above this
# many in all they run over chunks of points, so that memory stays O(N)
# (docs/design.md, "P2M and L2P memory"). JFMM_CHUNK_VALUES overrides it.
CHUNK_VALUES = int(os.environ.get("JFMM_CHUNK_VALUES", 2 ** 30))


# On the GPU the Chebyshev P2M's per-point products of P in [lo, hi) values
# are materialized before the per-leaf segment_sum: XLA's fusion of the two
# ran 10-25x slower at those widths (docs/design.md, "P2M and L2P memory").
# JFMM_MATERIALIZE_VALUES overrides lo for both dtypes.
_lo = int(os.environ.get("JFMM_MATERIALIZE_VALUES", 700))
MATERIALIZE = {"float32": (_lo, 2 ** 31), "float64": (_lo, 1000)}


def _chunk(n: int, per_point: int) -> int | None:
    """Points per chunk (a power of 2), or None when one pass fits."""
    if n * per_point <= CHUNK_VALUES:
        return None
    return max(1, 2 ** int(math.log2(max(1, CHUNK_VALUES // per_point))))


def p2m(family, u, q, start, leaf_of, p: int, mode: str, leaves: int | None = None):
    """Leaf multipoles (n_leaves, K, P) of sorted sources on backend `mode`.

    u: (N, d) scaled box-local positions; q: (N, K); start: (n_leaves + 2,)
    leaf ranges; leaf_of: (N,) leaf of each source; leaves: as in
    `near_field` (the Pallas kernels' tiles).
    """
    twin = _family_twin(family, p, mode)
    if twin is not None:
        tile = twin.p2m_tile(u.shape[0], start.shape[0] - 2)
        return tiles.in_steps(lambda *t: twin.p2m(u, q, start, p, mode == "interpret", tiles=t,
                                                  tile=tile),
                              start, u.shape[0], tile, leaves)
    n_leaves = start.shape[0] - 2
    out = jax.eval_shape(lambda: family.p2m(u[:1], q[:1], p))
    lo, hi = MATERIALIZE.get(out.dtype.name, (0, 0))
    barrier = (mode == "pallas" and isinstance(family, chebyshev.Chebyshev)
               and lo <= out.shape[2] < hi)

    def leaves(uu, qq, ll):
        v = family.p2m(uu, qq, p)
        v = jax.lax.optimization_barrier(v) if barrier else v
        return jax.ops.segment_sum(v, ll, n_leaves, indices_are_sorted=True)

    c = _chunk(u.shape[0], out.shape[1] * out.shape[2])
    if c is None:
        return leaves(u, q, leaf_of)
    pad = -u.shape[0] % c
    # Padding: zero charges, leaf ids kept sorted.
    xs = [p2p.pad_rows(a, pad, fill).reshape((-1, c) + a.shape[1:])
          for a, fill in ((u, 0), (q, 0), (leaf_of, n_leaves - 1))]
    init = jnp.zeros((n_leaves,) + out.shape[1:], out.dtype)
    total, _ = jax.lax.scan(lambda acc, x: (acc + leaves(*x), None), init, xs)
    return total


def l2p(family, u, loc, start, leaf_of, h, p: int, gradient: bool, mode: str,
        leaves: int | None = None):
    """The leaves' local expansions loc (n_leaves, K, P) at their sorted
    targets on backend `mode`: phi (M, K), grad (M, K, d) or None. h: the
    leaves' side, a scalar or one per leaf (n_leaves,); leaves: as in
    `near_field`. The jnp path evaluates the sets of `family.l2p_coefficients`
    (1 + d per expansion with the gradient), made for every leaf at once;
    the Pallas path takes the leaves' expansions (it makes the sets itself),
    in steps of tiles for the tiles' own leaves where every leaf's sets
    would exceed L2P_VALUES values (at 2^29 points, depth 8, they took 72
    GiB)."""
    twin = _family_twin(family, p, mode)
    sets = loc.shape[1] * (1 + u.shape[1] * gradient)
    if twin is not None and loc.shape[0] * sets * loc.shape[2] > L2P_VALUES:
        def run(leaf, t0, t1):
            rows = jnp.take(loc, leaf, axis=0, mode="fill", fill_value=0)
            sides = h if jnp.ndim(h) == 0 else jnp.take(h, leaf, mode="fill", fill_value=1)
            own = jnp.arange(leaf.shape[0], dtype=leaf.dtype)       # tile i: rows[i]
            return twin.l2p(u, rows, start, sides, p, gradient, mode == "interpret",
                            tiles=(own, t0, t1))
        return tiles.in_steps(run, start, u.shape[0], twin.TILE, leaves,
                              max_tiles=L2P_VALUES // (sets * loc.shape[2]))
    if twin is not None:
        return tiles.in_steps(
            lambda *t: twin.l2p(u, loc, start, h, p, gradient, mode == "interpret", tiles=t),
            start, u.shape[0], twin.TILE, leaves)
    coef = family.l2p_coefficients(loc, p, gradient)
    m = u.shape[0]
    per_leaf = jnp.ndim(h) > 0
    c = _chunk(m, math.prod(coef.shape[1:]))
    if c is None:
        return family.l2p(u, coef[leaf_of], h[leaf_of] if per_leaf else h, p, gradient)
    pad = -m % c
    uc = p2p.pad_rows(u, pad).reshape((-1, c) + u.shape[1:])
    lc = p2p.pad_rows(leaf_of, pad).reshape(-1, c)
    phi, grad = jax.lax.map(
        lambda x: family.l2p(x[0], coef[x[1]], h[x[1]] if per_leaf else h, p, gradient), (uc, lc))
    phi = phi.reshape((-1,) + phi.shape[2:])[:m]
    return phi, (grad.reshape((-1,) + grad.shape[2:])[:m] if gradient else None)


# Above this many values of every leaf's coefficient sets the Pallas L2P
# runs in steps of tiles, gathering the tiles' own leaves' expansions (every
# leaf's sets at once up to 2^24 points at p = 12, 1.5e8).
L2P_VALUES = 2 ** 29


# jfmm's own top-level GPU calls compile without XLA's Triton GEMM
# autotuning (first call 5 s against 23 s at 2^20: docs/design.md,
# "Compilation") where the process's XLA_FLAGS leave it on (`jfmm._xla`
# turns it off at import unless told not to); a user's XLA_FLAGS setting of
# it always wins.
FAST_COMPILE = {"xla_gpu_enable_triton_gemm": False}


def jits(fun, static: tuple):
    """(jit, jit with FAST_COMPILE) of fun."""
    return (jax.jit(fun, static_argnames=static),
            jax.jit(fun, static_argnames=static, compiler_options=FAST_COMPILE))


def variants(jits, args, mode: str) -> tuple:
    """The jitted variants of `jits` (from `jits()`) to try in order: the
    one with FAST_COMPILE first for a top-level GPU call on concrete
    arguments, else the plain one alone. Traced arguments (a user's jit,
    grad, vmap) take the plain one (under grad the one with options ran its
    forward pass before jax refused it); inside a user's jit on constants
    jax refuses compiler options with a ValueError, and the caller goes on
    to the plain one."""
    plain, fast = jits
    if (mode != "pallas" or "xla_gpu_enable_triton_gemm" in os.environ.get("XLA_FLAGS", "")
            or any(isinstance(x, Tracer) for x in jax.tree_util.tree_leaves(args))):
        return (plain,)
    return (fast, plain)


def call(jits, *args, mode: str, **static):
    """Call the first of `variants` that jax accepts, passing `mode` and
    the static arguments."""
    *first, last = variants(jits, args, mode)
    for f in first:
        try:
            return f(*args, mode=mode, **static)
        except ValueError as e:          # inside a user's jit: no compiler options
            if "compiler_options" not in str(e):
                raise
    return last(*args, mode=mode, **static)
