"""3D Laplace FMM benchmark: time versus N (or eps, or order), per pass, with measured error.

    python benchmarks/bench_laplace.py --nmin 12 --nmax 20 --dtype float32 --eps 1e-5 \
        --out docs/data/laplace_float32.json
    python benchmarks/bench_laplace.py --n 1048576 --dtype float64 --eps 1e-4,1e-6,1e-8,1e-10
    python benchmarks/bench_laplace.py --orders 4,6,8 --n 20000 --dtype float64

Per N, eps (comma-separated: a sweep in one process), order and point
distribution: tree build, upward (P2M + M2M), downward (M2L + L2L), L2P, P2P,
the whole jitted fmm() (build included), first call (compile + run), the
direct sum's time up to --direct-max, and the relative L2 error of potential
and gradient on 1,000 sampled targets against a float64 direct sum of the
same rounded inputs. Times are medians over --repeats runs after compilation.

JSON row fields: n, kernel, dim, points, dtype, eps, family, order, depth,
leaf, build_ms, up_ms, down_ms, l2p_ms, p2p_ms, total_ms, first_call_s,
direct_ms (null above --direct-max), err_phi, err_grad.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# common puts the checkout on sys.path, before jfmm is imported.
from common import (floats, first_time, make_points, median_time, parser, reference, rel,
                    sample, Table)

import jfmm
from jfmm import configure, passes
from jfmm.models import laplace3d as laplace3d_model
from jfmm.ops import backend, laplace3d
from jfmm.ops.pallas import m2l as pallas_m2l
from jfmm.ops.pallas import p2p as pallas_p2p
from jfmm.tree import build as build_tree, lists

COLUMNS = [
    ("n", "N", ","), ("points", "points", ""), ("dtype", "dtype", ""), ("eps", "eps", "g"),
    ("order", "p", "d"), ("depth", "depth", "d"), ("build_ms", "build ms", ".2f"),
    ("up_ms", "up ms", ".2f"), ("down_ms", "down ms", ".2f"), ("l2p_ms", "L2P ms", ".2f"),
    ("p2p_ms", "P2P ms", ".2f"), ("total_ms", "total ms", lambda r: f"**{r['total_ms']:.2f}**"),
    ("first_call_s", "first call s", ".1f"), ("direct_ms", "direct ms", ".2f"),
    ("err_phi", "err phi", ".2e"), ("err_grad", "err grad", ".2e"),
]


def pass_times(xd, qd, cfg, dtype, repeats):
    """Median seconds of each pass of `cfg`'s sum, each jitted on its own
    (their sum exceeds the whole call's time by launch gaps)."""
    p, depth = cfg.order, cfg.depth
    kernel = jfmm.kernels.Laplace3D()
    tb = jax.jit(build_tree, static_argnames="depth")
    tree = tb(xd, None, depth=depth)
    times = {"build": median_time(lambda a: tb(a, None, depth=depth), xd, repeats=repeats)}
    mode = backend.current()
    qs = qd[tree.src_perm][:, None]
    near = jax.jit(lambda t, c: backend.near_field(
        kernel, t.tgt_sorted, t.tgt_start, t.src_sorted, c, t.src_start,
        lists.neighbors(t.depth, 3), True, mode))
    times["p2p"] = median_time(near, tree, qs, repeats=repeats)
    if depth < 2:                        # no well-separated boxes: the near field is all
        return dict(times, up=0.0, down=0.0, l2p=0.0)
    ops = jax.jit(lambda: cfg.operators(3, dtype))()
    # Operators enter as arguments: closed over, they would be captured as
    # (GB-sized, at high p) constants of each pass's executable.
    up = jax.jit(lambda t, c, o: passes.upward(t, c, laplace3d, o, p, mode))
    mult = up(tree, qs, ops)
    down = jax.jit(lambda t, m, o: passes.downward(t, m, laplace3d, o, kernel, p, mode))
    loc = down(tree, mult, ops)

    def l2p(t, lc):
        h = t.box_side(t.depth)
        u = (t.tgt_sorted - t.leaf_centers(t.tgt_leaf)) / h
        coef = laplace3d.l2p_coefficients(lc, p, True)
        return backend.l2p(laplace3d, u, coef, t.tgt_start, t.tgt_leaf, h, p, True, mode)

    times["up"] = median_time(up, tree, qs, ops, repeats=repeats)
    times["down"] = median_time(down, tree, mult, ops, repeats=repeats)
    times["l2p"] = median_time(jax.jit(l2p), tree, loc, repeats=repeats)
    return times


def run_one(n, kind, dtype, eps, order, repeats, direct_max, rng, leaf=None) -> dict:
    x = make_points(kind, n, rng).astype(dtype)
    q = (rng.random(n) - 0.5).astype(dtype)
    xd, qd = jnp.asarray(x), jnp.asarray(q)
    # The family, order and depth fmm() chooses for these points.
    cfg = configure.resolve(xd, None, jfmm.kernels.Laplace3D(), eps, leaf, order, None)
    f = jax.jit(lambda a, b: jfmm.fmm(a, b, eps=eps, gradient=True, order=order,
                                      leaf_size=leaf))
    (phi, grad), first = first_time(f, xd, qd)
    total = median_time(f, xd, qd, repeats=repeats)
    passes_s = pass_times(xd, qd, cfg, dtype, repeats)

    t_direct = None
    if n <= direct_max:
        d = jax.jit(lambda a, b: jfmm.direct(a, b, gradient=True))
        t_direct = median_time(d, xd, qd, repeats=max(1, repeats // 3)) * 1e3

    s = sample(rng, n)
    x64, q64 = x.astype(np.float64), q.astype(np.float64)
    ref, gref = reference(x64, q64, x64[s])
    return dict(n=n, kernel="Laplace3D", dim=3, points=kind, dtype=np.dtype(dtype).name,
                eps=eps, family=cfg.name, order=cfg.order, depth=cfg.depth,
                leaf=leaf or laplace3d_model.leaf_size(cfg.order),
                **{f"{k}_ms": passes_s[k] * 1e3 for k in ("build", "up", "down", "l2p", "p2p")},
                total_ms=total * 1e3, first_call_s=first, direct_ms=t_direct,
                err_phi=rel(np.asarray(phi)[s], ref), err_grad=rel(np.asarray(grad)[s], gref))


def m2l_tiles(spec: str):
    """--m2l: a `backend.M2L_CHOICES` name or 'parents,width,warps,stages[,algorithm]'."""
    if spec in backend.M2L_CHOICES:
        return spec
    f = spec.split(",")
    return pallas_m2l.Tiles(*map(int, f[:4]), *f[4:])


def main():
    ap = parser(__doc__)
    ap.add_argument("--nmin", type=int, default=12, help="log2 of the smallest N")
    ap.add_argument("--nmax", type=int, default=16, help="log2 of the largest N")
    ap.add_argument("--step", type=int, default=1, help="step of log2 N")
    ap.add_argument("--n", type=int, default=None, help="a single N (overrides nmin/nmax)")
    ap.add_argument("--dist", default="cube", help="points, comma-separated: cube,sphere,plummer")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--eps", default="1e-5", help="requested error, comma-separated to sweep")
    ap.add_argument("--orders", default=None, help="comma-separated p to sweep instead of eps")
    ap.add_argument("--direct-max", type=int, default=2 ** 18,
                    help="largest N at which the direct sum is timed")
    ap.add_argument("--leaf", type=int, default=None, help="leaf size (default: the rule's)")
    ap.add_argument("--blocks", default=None,
                    help="Pallas P2P tiles 'T,S,warps' (default: the library's)")
    ap.add_argument("--m2l", default=None,
                    help="M2L on the GPU: bf16x6, float32, or Pallas M2L tiles "
                         "'parents,width,warps,stages[,algorithm]'")
    args = ap.parse_args()
    if args.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    dtype = np.dtype(args.dtype).type
    rng = np.random.default_rng(args.seed)
    if args.blocks:
        backend.set_backend("auto", pallas_p2p.Blocks(*map(int, args.blocks.split(","))))
    if args.m2l:
        backend.set_backend("auto", m2l=m2l_tiles(args.m2l))
    table = Table(f"3D Laplace FMM, {args.dtype}", COLUMNS)
    ns = [args.n] if args.n else [2 ** k for k in range(args.nmin, args.nmax + 1, args.step)]
    orders = [int(o) for o in args.orders.split(",")] if args.orders else [None]
    for n in ns:
        for order in orders:
            for eps in floats(args.eps):
                for kind in args.dist.split(","):
                    table.add(run_one(n, kind, dtype, eps, order, args.repeats,
                                      args.direct_max, rng, args.leaf))
    table.save(args.out)


if __name__ == "__main__":
    main()
