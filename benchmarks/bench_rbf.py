"""Every kernel through jfmm.fmm at large N, beside 3D Laplace and the direct sum.

    python benchmarks/bench_rbf.py --n 1048576 --dim 3 --dtype float32 --eps 1e-4 \
        --out docs/data/kernels_3d.json

Per kernel: the median time of the jitted sum with potential and gradient
(its plan made with the charges, as an eager jfmm.fmm call chooses;
--no-charges: without them, as inside jit)
(--potential: the potential alone, its order chosen for phi's error alone;
tree build included, after compilation; the tree build alone beside it),
the first eager jfmm.fmm call (choices, compilation and run), and the relative
L2 error of potential and gradient on 1,000 sampled targets against a
float64 direct sum of the same rounded inputs. The direct sum (potential and
gradient, same backend) is timed at --direct-n points and scaled by
(N / direct-n)^2 to N, said so in the table.

JSON row fields: n, kernel, dim, points, dtype, eps, family, order, depth,
total_ms, build_ms, first_call_s, direct_ms (scaled to N), direct_n, speedup
(direct_ms / total_ms), err_phi, err_grad; with --profile also up_ms,
m2l_matrices_ms, down_ms, l2p_ms, near_ms and near_pairs_per_s.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# common puts the checkout on sys.path, before jfmm is imported.
from common import first_time, make_points, median_time, parser, rel, sample, Table

import jfmm
from accuracy_rbf import label
from jfmm import configure, passes
from jfmm.models import Unreachable
from jfmm import kernels as K
from jfmm.ops import backend, translate
from jfmm.tree import build as build_tree, lists

KERNELS = {2: [K.Laplace2D()], 3: [K.Laplace3D()]}
COMMON = [K.Gaussian(1.0), K.Gaussian(10.0), K.Multiquadric(1.0), K.InverseMultiquadric(1.0),
          K.InverseQuadratic(1.0), K.ThinPlateSpline(), K.Linear(), K.Cubic(), K.Quintic(),
          K.Yukawa(2.0)]

COLUMNS = [
    ("kernel", "kernel", ""),
    ("family", "family, order, depth", lambda r: f"{r['family']}, {r['order']}, {r['depth']}"),
    ("total_ms", "fmm ms", lambda r: f"**{r['total_ms']:.2f}**"), ("build_ms", "tree ms", ".2f"),
    ("first_call_s", "first call s", ".1f"), ("direct_ms", "direct ms (scaled)", ".0f"),
    ("speedup", "speed-up", lambda r: f"{r['speedup']:.0f}x"),
    ("err_phi", "err phi", ".2e"), ("err_grad", "err grad", ".2e"),
]


def chosen(x, kernel, eps, traced: bool, gradient: bool) -> tuple[str, int, int]:
    """(family, order, depth) `jfmm.fmm` chooses for points x, concrete or traced."""
    out = []
    if traced:
        jax.make_jaxpr(lambda a: out.append(configure.resolve(
            a, None, kernel, eps, None, None, None, gradient=True)) or a)(x)
    else:
        out.append(configure.resolve(x, None, kernel, eps, None, None, None, gradient=gradient))
    return out[0].name, out[0].order, out[0].depth


def main():
    ap = parser(__doc__)
    ap.add_argument("--n", type=int, default=2 ** 16)
    ap.add_argument("--dim", type=int, default=3)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--eps", type=float, default=1e-4)
    ap.add_argument("--direct-n", type=int, default=2 ** 16)
    ap.add_argument("--kernels", default=None, help="comma-separated indices into the list")
    ap.add_argument("--gather-bytes", type=int, default=None,
                    help="override jfmm.ops.translate.GATHER_BYTES (the M2L formulation)")
    ap.add_argument("--orders", choices=("points", "traced"), default="points",
                    help="family and order chosen for these points (jfmm.plan, then "
                         "Plan.update and apply timed under jit) or inside jit, where the "
                         "points are traced (jfmm.fmm timed under jit)")
    ap.add_argument("--family", default=None, help="override the family (with --orders points)")
    ap.add_argument("--order", type=int, default=None,
                    help="override the order (with --orders points)")
    ap.add_argument("--no-charges", action="store_true",
                    help="plans made without the charges (the order any charges get)")
    ap.add_argument("--potential", action="store_true",
                    help="the potential alone (default: potential and gradient)")
    ap.add_argument("--profile", action="store_true",
                    help="also time each pass of the FMM families (a row per kernel)")
    args = ap.parse_args()
    if args.gather_bytes:
        translate.GATHER_BYTES = args.gather_bytes
    jax.config.update("jax_enable_x64", True)      # the float64 references
    dtype = np.dtype(args.dtype).type
    rng = np.random.default_rng(args.seed)
    n, dim, eps = args.n, args.dim, args.eps
    x = make_points("cube", n, rng, dim).astype(dtype)
    q = (rng.random(n) - 0.5).astype(dtype)
    xd, qd = jnp.asarray(x), jnp.asarray(q)
    s = sample(rng, n)
    x64, q64 = jnp.asarray(x, jnp.float64), jnp.asarray(q, jnp.float64)
    nd = min(args.direct_n, n)
    scale = (n / nd) ** 2
    grad_on = not args.potential
    kernels = KERNELS[dim] + COMMON
    if args.kernels:
        kernels = [kernels[int(i)] for i in args.kernels.split(",")]
    table = Table(f"every kernel, N = {n:,} uniform, {dim}D, {args.dtype}, eps {eps:g}, "
                  f"{'potential' if args.potential else 'potential and gradient'}; "
                  f"direct timed at N = {nd:,} and scaled by {scale:g}", COLUMNS)
    for k in kernels:
        if args.orders == "traced":
            try:
                fam, order, depth = chosen(xd, k, eps, True, grad_on)
            except Unreachable as e:     # eps below what this dtype reaches for the kernel
                print(f"# {label(k)}: raises: {e}", flush=True)
                continue
            f = jax.jit(lambda a, c, k=k: jfmm.fmm(a, c, kernel=k, eps=eps, gradient=grad_on))
            timed = (xd, qd)
        else:
            # The choices made eagerly for these points (as jfmm.fmm does),
            # the tree rebuilt and the sum evaluated inside jit.
            try:
                pl = jfmm.plan(xd, kernel=k, eps=eps, family=args.family, order=args.order,
                               gradient=grad_on, charges=None if args.no_charges else qd)
            except Unreachable as e:
                print(f"# {label(k)}: raises: {e}", flush=True)
                continue
            fam, order, depth = pl.family, pl.order, pl.tree.depth
            f = jax.jit(lambda p_, a, c: p_.update(a).apply(c, gradient=grad_on))
            timed = (pl, xd, qd)
        # An eager call: choices, compilation, run.
        _, first = first_time(lambda: jfmm.fmm(xd, qd, kernel=k, eps=eps, gradient=grad_on,
                                               family=args.family, order=args.order))
        out = jax.block_until_ready(f(*timed))
        phi, grad = out if grad_on else (out, None)
        t = median_time(f, *timed, repeats=args.repeats)
        tree = jax.jit(lambda a, depth=depth: build_tree(a, None, depth))
        t_tree = median_time(tree, xd, repeats=args.repeats)
        d = jax.jit(lambda a, c, k=k: jfmm.direct(a, c, kernel=k, gradient=grad_on))
        td = median_time(d, xd[:nd], qd[:nd], repeats=3) * scale
        ref, gref = jfmm.direct(x64, q64, x64[s], kernel=k, gradient=True)
        row = dict(n=n, kernel=label(k), dim=dim, points="cube", dtype=args.dtype, eps=eps,
                   family=fam, order=order, depth=depth, total_ms=t * 1e3,
                   build_ms=t_tree * 1e3, first_call_s=first, direct_ms=td * 1e3, direct_n=nd,
                   speedup=td / t, err_phi=rel(phi[s], ref),
                   err_grad=rel(grad[s], gref) if grad_on else None)
        profiled = args.profile and args.orders == "points" and fam not in ("hermite", "near")
        if profiled:
            row.update(profile(pl, qd, args.repeats))
        table.add(row)
        if profiled:
            print(profile_line(row), flush=True)
    table.save(args.out)


def profile(pl, q, repeats: int) -> dict:
    """Per-pass medians (ms) for plan pl: P2M + M2M (up), the M2L matrices
    of every level, M2L + L2L (down, matrices included), L2P and the near
    field, and the near field's pairs per second; each pass jitted alone, so
    their sum exceeds the whole call's time by launch gaps."""
    tree, k, p, ops = pl.tree, pl.kernel, pl.order, pl.ops
    family = pl.config.family
    mode = backend.current()
    qs = q[tree.src_perm][:, None]
    up = jax.jit(lambda t, c, o: passes.upward(t, c, family, o, p, mode))
    mult = up(tree, qs, ops)
    mats = jax.jit(lambda t, o, kk: [family.m2l_matrices(o, kk, t.box_side(level), p)
                                     for level in range(2, t.depth + 1)])
    down = jax.jit(lambda t, m, o, kk: passes.downward(t, m, family, o, kk, p, mode))
    loc = down(tree, mult, ops, k)

    def l2p(t, lc):
        h = t.box_side(t.depth)
        u = (t.tgt_sorted - t.leaf_centers(t.tgt_leaf)) / h
        coef = family.l2p_coefficients(lc, p, True)
        return backend.l2p(family, u, coef, t.tgt_start, t.tgt_leaf, h, p, True, mode)

    near = jax.jit(lambda t, c, kk: backend.near_field(
        kk, t.tgt_sorted, t.tgt_start, t.src_sorted, c, t.src_start,
        lists.neighbors(t.depth, t.dim), True, mode))
    out = {"up_ms": median_time(up, tree, qs, ops, repeats=repeats),
           "m2l_matrices_ms": median_time(mats, tree, ops, k, repeats=repeats),
           "down_ms": median_time(down, tree, mult, ops, k, repeats=repeats),
           "l2p_ms": median_time(jax.jit(l2p), tree, loc, repeats=repeats),
           "near_ms": median_time(near, tree, qs, k, repeats=repeats)}
    pairs = float(jnp.sum(_near_pairs(tree)))
    return {**{key: t * 1e3 for key, t in out.items()},
            "near_pairs_per_s": pairs / out["near_ms"]}


def profile_line(r: dict) -> str:
    """The markdown line under a kernel's row with its per-pass times."""
    return (f"|   passes (ms): up {r['up_ms']:.2f} / M2L matrices {r['m2l_matrices_ms']:.2f} / "
            f"down {r['down_ms']:.2f} / L2P {r['l2p_ms']:.2f} / near {r['near_ms']:.2f} "
            f"({r['near_pairs_per_s']:.2e} pairs/s) |||||||||")


def _near_pairs(tree):
    """Target-source pairs of the near field (per target leaf, its
    neighbours' sources)."""
    nb = lists.neighbors(tree.depth, tree.dim)
    src = jnp.diff(tree.src_start)[:-1]
    tgt = jnp.diff(tree.tgt_start)[:-1]
    counts = jnp.concatenate([src, jnp.zeros((1,), src.dtype)])
    return tgt.astype(jnp.float64) * jnp.sum(counts[nb], axis=1)


if __name__ == "__main__":
    main()
