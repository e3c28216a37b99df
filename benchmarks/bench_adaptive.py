"""Adaptive against uniform trees: 3D Laplace on cube, sphere, Plummer and clustered points.

    python benchmarks/bench_adaptive.py --sizes 20 --dtype float32 --eps 1e-5 \
        --out docs/data/adaptive_float32.json

Per point set and N: `jfmm.plan(points, eps, gradient=True, tree=...)` with
the uniform and the adaptive tree, and the tree "auto" picks (with the
crowding it measured, `jfmm.tree.crowding`). Times are medians after
compilation: "total" is a jitted `plan.update(points).apply(charges,
gradient=True)` (the tree rebuilt from the points, as every step of a
simulation does), "build" the update alone, "apply" the sum on a built
tree; "plan" is the first `jfmm.plan` call (sizing the adaptive tree's
capacities and compiling included). For the adaptive tree the passes are
also timed one by one (near field over U, P2M + M2M, P2L over X, M2L +
L2L, L2P, M2P over W). Errors of potential and gradient are measured on
1,000 sampled targets against a float64 direct sum of the same rounded
inputs. --uniform-max bounds the N at which the uniform tree runs on the
non-uniform sets (its near field grows like N^2 there).
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from common import (Table, first_time, floats, make_points, median_time, parser, reference,
                    rel, sample)

import jfmm
from jfmm import api, configure, passes
from jfmm.ops import backend
from jfmm.tree import adaptive, crowding

COLUMNS = [
    ("points", "points", ""), ("n", "N", ","), ("dtype", "dtype", ""), ("eps", "eps", "g"),
    ("tree", "tree", ""), ("order", "p", "d"), ("leaf", "leaf", ""), ("levels", "levels", "d"),
    ("build_ms", "build ms", ".2f"), ("apply_ms", "apply ms", ".2f"),
    ("total_ms", "total ms", lambda r: f"**{r['total_ms']:.2f}**"),
    ("plan_s", "plan s", ".1f"), ("err_phi", "err phi", ".2e"), ("err_grad", "err grad", ".2e"),
    ("auto", "auto", ""), ("crowding", "crowding", ".1f"),
    ("near_ms", "U ms", ".2f"), ("up_ms", "up ms", ".2f"), ("p2l_ms", "X ms", ".2f"),
    ("down_ms", "V ms", ".2f"), ("l2p_ms", "L2P ms", ".2f"), ("m2p_ms", "W ms", ".2f"),
]


def pass_times(pl, q, repeats):
    """Median ms of each pass on an adaptive plan's tree, each jitted alone
    (the operators passed in, as `Plan.apply` does, not baked in)."""
    t, fam, ops, p, kern = pl.tree, pl.config.family, pl.ops, pl.order, pl.kernel
    mode = backend.current()
    qs = jnp.asarray(q)[t.src_perm][:, None]
    busy = adaptive.busy_leaves(t, t.tgt_sorted.shape[0])        # as `adaptive_evaluate`
    near = jax.jit(lambda t, c: backend.near_field(kern, t.tgt_sorted, t.tgt_start, t.src_sorted,
                                                   c, t.src_start, t.near, True, mode,
                                                   leaves=busy))
    up = jax.jit(lambda t, c, o: passes.adaptive_upward(t, c, fam, o, p, t.box_side(t.level),
                                                        mode))
    mult = up(t, qs, ops)
    x_list = jax.jit(lambda t, c, m: passes.x_lists(t, c, fam, kern, p, mode, jnp.zeros_like(m)))
    down = jax.jit(lambda t, m, c, o: passes.adaptive_downward(t, m, c, fam, o, kern, p, mode))
    loc = down(t, mult, qs, ops)

    def evaluate(t, lc):
        side = t.box_side(t.level)
        leaf = t.tgt_leaf
        u = (t.tgt_sorted - t.center[leaf]) / side[leaf][:, None]
        coef = fam.l2p_coefficients(lc, p, True)
        return backend.l2p(fam, u, coef, t.tgt_start, leaf, side, p, True, mode, busy)

    w_list = jax.jit(lambda t, m: passes.w_lists(t, m, fam, kern, p, True, mode))
    ms = lambda f, *a: 1e3 * median_time(f, *a, repeats=repeats)     # noqa: E731
    return dict(near_ms=ms(near, t, qs), up_ms=ms(up, t, qs, ops),
                p2l_ms=ms(x_list, t, qs, mult), down_ms=ms(down, t, mult, qs, ops),
                l2p_ms=ms(jax.jit(evaluate), t, loc), m2p_ms=ms(w_list, t, mult))


JIT_COLUMNS = [
    ("points", "points", ""), ("n", "N", ","), ("dtype", "dtype", ""), ("eps", "eps", "g"),
    ("tree", "jit tree", ""), ("eager_ms", "eager ms", ".2f"),
    ("jit_ms", "jit ms", lambda r: f"**{r['jit_ms']:.2f}**"), ("jit_s", "jit compile s", ".1f"),
    ("build_ms", "tree ms", ".2f"), ("grad_ms", "jit(grad) ms", ".2f"),
    ("grad_s", "jit(grad) compile s", ".1f"), ("err_phi", "err phi", ".2e"),
    ("err_grad", "err grad", ".2e"), ("err_force", "err dE/dx", ".2e"),
]


KERNELS = {"laplace3d": jfmm.kernels.Laplace3D, "imq": jfmm.kernels.InverseMultiquadric,
           "yukawa": jfmm.kernels.Yukawa, "linear": jfmm.kernels.Linear}


def kernel_of(spec: str):
    """A kernel from "name" or "name:parameter" (`KERNELS`)."""
    name, _, value = spec.partition(":")
    return KERNELS[name](*([float(value)] if value else []))


def radial_reference(kernel, x64, q64, y64):
    """`reference` for any kernel: 3D Laplace by numpy, the others by
    jfmm.direct in float64 on the device (all pairs, no tree)."""
    if isinstance(kernel, jfmm.kernels.Laplace3D):
        return reference(x64, q64, y64)
    with jax.enable_x64(True):
        phi, grad = jfmm.direct(jnp.asarray(x64), jnp.asarray(q64), jnp.asarray(y64),
                                kernel=kernel, gradient=True)
        return np.asarray(phi), np.asarray(grad)


def jit_rows(args, dtype, rng):
    """The calls users write: eager `jfmm.fmm`, `jax.jit` of it and
    `jax.jit(jax.grad(energy))` with respect to the points, per point set
    (medians after compilation; the first call of each jitted function
    timed apart; "tree ms" the traced call's tree alone)."""
    kernel = kernel_of(args.kernel)
    table = Table(f"{kernel} under jax.jit, potential and gradient, {args.dtype}", JIT_COLUMNS)
    for k in (int(v) for v in args.sizes.split(",")):
        n = 2 ** k
        for eps in floats(args.eps):
            call = jax.jit(lambda x, q: jfmm.fmm(x, q, kernel=kernel, eps=eps, gradient=True))
            force = jax.jit(jax.grad(lambda x, q: 0.5 * jnp.sum(
                q * jfmm.fmm(x, q, kernel=kernel, eps=eps))))
            for kind in args.kinds.split(","):
                x64, q64 = make_points(kind, n, rng), rng.random(n) - 0.5
                x, q = jnp.asarray(x64, dtype), jnp.asarray(q64, dtype)
                idx = sample(rng, n)
                xr, qr = np.asarray(x, np.float64), np.asarray(q, np.float64)
                ref, gref = radial_reference(kernel, xr, qr, xr[idx])
                cfg = configure.choose_tree(configure.resolve_eager(
                    x, None, kernel, eps, None, None, None, True), x, None)
                seen = []                   # the configuration traced points get
                jax.eval_shape(lambda a: seen.append(configure.choose_tree(
                    configure.resolve_eager(a, None, kernel, eps, None, None, None, True),
                    a, None)) or a, x)
                crowd = float(crowding(x, None, cfg.depth))
                bar = configure.crowding_bar(3, cfg.depth)
                takes = seen[0].tree == "adaptive" and bar is not None and crowd > bar
                (phi, grad), jit_s = first_time(call, x, q)
                dx, grad_s = first_time(force, x, q)
                tree = jax.jit(lambda a: jfmm.api._adaptive_tree(a, None, seen[0].leaf))
                row = dict(points=kind, n=n, dtype=args.dtype, eps=eps,
                           tree=("adaptive" if takes else "uniform") + f" ({crowd:.0f})",
                           eager_ms=1e3 * median_time(lambda a, c: jfmm.fmm(
                               a, c, kernel=kernel, eps=eps, gradient=True),
                                                      x, q, repeats=args.repeats),
                           jit_ms=1e3 * median_time(call, x, q, repeats=args.repeats),
                           jit_s=jit_s,
                           grad_ms=1e3 * median_time(force, x, q, repeats=args.repeats),
                           grad_s=grad_s, err_phi=rel(np.asarray(phi)[idx], ref),
                           err_grad=rel(np.asarray(grad)[idx], gref),
                           err_force=rel(np.asarray(dx)[idx], qr[idx, None] * gref))
                if takes:
                    row["build_ms"] = 1e3 * median_time(tree, x, repeats=args.repeats)
                table.add(row)
                table.save(args.out)


def main():
    ap = parser(__doc__)
    ap.add_argument("--sizes", default="20", help="log2 N, comma-separated")
    ap.add_argument("--kinds", default="cube,sphere,plummer,clusters")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--eps", default="1e-5", help="comma-separated")
    ap.add_argument("--trees", default="uniform,adaptive")
    ap.add_argument("--uniform-max", type=int, default=20, help="log2 N: largest uniform run "
                    "on non-uniform points")
    ap.add_argument("--passes", action="store_true", help="time the adaptive passes one by one")
    ap.add_argument("--bounded", action="store_true",
                    help="with --passes, also on the tree of bounded capacities that the "
                    "same points get when traced (inside jit)")
    ap.add_argument("--adaptive-leaf", type=int, default=None,
                    help="leaf capacity over the uniform tree's mean occupancy "
                         "(configure.ADAPTIVE_LEAF)")
    ap.add_argument("--jit", action="store_true", help="the calls users write: eager, "
                    "jax.jit and jax.jit(jax.grad) of jfmm.fmm (`jit_rows`)")
    ap.add_argument("--kernel", default="laplace3d",
                    help=f"with --jit: one of {sorted(KERNELS)}, with :parameter")
    args = ap.parse_args()
    if args.adaptive_leaf:
        configure.ADAPTIVE_LEAF = dict.fromkeys(configure.ADAPTIVE_LEAF, args.adaptive_leaf)
    dtype = np.dtype(args.dtype)
    if dtype == np.float64:
        jax.config.update("jax_enable_x64", True)
    rng = np.random.default_rng(args.seed)
    if args.jit:
        return jit_rows(args, dtype, rng)
    table = Table(f"3D Laplace, uniform and adaptive trees, {args.dtype}", COLUMNS)
    total = jax.jit(lambda pl, x, q: pl.update(x).apply(q, gradient=True))
    build = jax.jit(lambda pl, x: pl.update(x).tree)
    apply = jax.jit(lambda pl, q: pl.apply(q, gradient=True))
    for k in (int(v) for v in args.sizes.split(",")):
        n = 2 ** k
        for kind in args.kinds.split(","):
            x64 = make_points(kind, n, rng)
            q64 = rng.random(n) - 0.5
            x, q = jnp.asarray(x64, dtype), jnp.asarray(q64, dtype)
            idx = sample(rng, n)
            xr, qr = np.asarray(x, np.float64), np.asarray(q, np.float64)
            ref, gref = reference(xr, qr, xr[idx])
            for eps in floats(args.eps):
                for tree in args.trees.split(","):
                    if tree == "uniform" and kind != "cube" and k > args.uniform_max:
                        continue
                    t0 = time.perf_counter()
                    pl = jfmm.plan(x, eps=eps, gradient=True, tree=tree)
                    jax.block_until_ready(pl.tree)
                    plan_s = time.perf_counter() - t0
                    phi, grad = total(pl, x, q)
                    row = dict(points=kind, n=n, dtype=args.dtype, eps=eps, tree=tree,
                               leaf=getattr(pl.tree, "leaf_size", None),
                               order=pl.order, levels=getattr(pl.tree, "depth", None),
                               plan_s=plan_s,
                               total_ms=1e3 * median_time(total, pl, x, q, repeats=args.repeats),
                               build_ms=1e3 * median_time(build, pl, x, repeats=args.repeats),
                               apply_ms=1e3 * median_time(apply, pl, q, repeats=args.repeats),
                               err_phi=rel(np.asarray(phi)[idx], ref),
                               err_grad=rel(np.asarray(grad)[idx], gref))
                    if tree == "adaptive":
                        cfg = configure.resolve_eager(x, None, jfmm.kernels.Laplace3D(), eps,
                                                      None, None, None, True)
                        row["crowding"] = float(crowding(x, None, cfg.depth))
                        row["auto"] = configure.choose_tree(cfg, x, None, "auto").tree
                        row["boxes"] = pl.tree.n_boxes
                        row["w"], row["x"] = pl.tree.caps.w, pl.tree.caps.x
                        if args.passes:
                            row.update(pass_times(pl, q, args.repeats))
                        if args.passes and args.bounded:
                            # the same points on the tree jit gives traced points
                            bounded = api._new_plan(x, None, pl.kernel, pl.config, bounded=True)
                            row.update({"bounded_" + key: v for key, v in
                                        pass_times(bounded, q, args.repeats).items()})
                            tree_of = jax.jit(lambda a: api._adaptive_tree(a, None,
                                                                           pl.config.leaf))
                            row["bounded_build_ms"] = 1e3 * median_time(tree_of, x,
                                                                        repeats=args.repeats)
                            row["bounded_boxes"] = bounded.tree.n_boxes
                    table.add(row)
                    table.save(args.out)  # after every row: a run cut short keeps its rows


if __name__ == "__main__":
    main()
