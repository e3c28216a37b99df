"""Are the chosen orders the smallest that meet eps? For each kernel, point
set and (dtype, eps): the order `jfmm.plan` chooses (tree "auto"), its
measured error, and the error one order below on the same tree. The issue's
criterion: the error at the chosen order within eps and either at least
eps / 5 or, one order below, above eps ("tight"); else "loose" (an order
could be saved) or "over" (above eps). Errors: relative L2 over 1,000
sampled targets against a float64 `jfmm.direct` sum, the worst of --draws
mixed-sign charge vectors (points and charges rounded to float32 for
every dtype); "potential": an eager `jfmm.fmm` call for phi alone and
phi's error, "gradient": with gradient=True and the larger of phi's and
grad phi's errors. The direct-sum crossover is switched off, so every row sums
by its family. CPU is enough.

    python benchmarks/calibrate_orders.py --dim 3 --n 16384 --out cal.json
"""
from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from common import Table, make_points, parser, rel, sample  # noqa: E402
import jfmm  # noqa: E402
from jfmm import configure  # noqa: E402
from bench_rbf import COMMON, KERNELS  # noqa: E402
from accuracy_rbf import label  # noqa: E402
from calibrate_chebyshev import clusters  # noqa: E402

COLUMNS = [("kernel", "kernel", ""), ("points", "points", ""), ("dtype", "dtype", ""),
           ("eps", "eps", "g"), ("output", "output", ""),
           ("family", "family, tree", lambda r: f"{r['family']}, {r['tree']}"),
           ("order", "order", "d"), ("err", "err", ".1e"), ("err_below", "err one below", ".1e"),
           ("verdict", "verdict", "")]


def verdict(eps: float, err: float, below: float | None) -> str:
    """"over", "tight" or "loose" (below: the error one order below; None
    where the family has no lower order)."""
    if err > eps:
        return "over"
    if err >= eps / 5 or below is None or below > eps:
        return "tight"
    return "loose"


LOWEST = {"laplace3d": 3, "laplace2d": 3, "chebyshev": 4, "hermite": 1}


def error(out, idx, ref, gradient: bool) -> float:
    """The worst over charge columns of phi's (and grad phi's) relative error."""
    phi = np.asarray(out[0] if gradient else out, np.float64)[idx]
    errs = [rel(phi[:, c], ref[0][:, c]) for c in range(phi.shape[1])]
    if gradient:
        grad = np.asarray(out[1], np.float64)[idx]
        errs += [rel(grad[:, c], ref[1][:, c]) for c in range(phi.shape[1])]
    return max(errs)


def chosen(x, k, eps: float, gradient: bool):
    """The configuration an eager `jfmm.fmm` call takes for these points."""
    c = configure.resolve_eager(x, None, k, eps, None, None, None, gradient)
    return configure.on_uniform(configure.choose_tree(c, x, None), k, x, None)


def main():
    ap = parser(__doc__, repeats=False)
    ap.add_argument("--dim", type=int, default=3)
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--cases", default="float32:1e-4,float64:1e-6",
                    help="comma-separated dtype:eps")
    ap.add_argument("--points", default="cube,sphere,cluster")
    ap.add_argument("--outputs", default="potential,gradient")
    ap.add_argument("--kernels", default=None, help="comma-separated indices into the list")
    ap.add_argument("--draws", type=int, default=2, help="random charge vectors per point set")
    args = ap.parse_args()
    configure.DIRECT_PAIRS = {"cpu": {}, "gpu": {}}
    rng = np.random.default_rng(args.seed)
    kernels = KERNELS[args.dim] + COMMON
    if args.kernels:
        kernels = [kernels[int(i)] for i in args.kernels.split(",")]
    table = Table(f"chosen orders against one below, {args.dim}D, N = {args.n:,}", COLUMNS)
    for kind in args.points.split(","):
        x = clusters(args.n, rng, args.dim) if kind == "cluster" else \
            make_points(kind, args.n, rng, args.dim)
        # float32 inputs: the reference sums the same rounded values
        x = x.astype(np.float32).astype(np.float64)
        q = (rng.random((args.n, args.draws)) - 0.5).astype(np.float32).astype(np.float64)
        idx = sample(rng, args.n)
        for k in kernels:
            ref = [np.asarray(v) for v in jfmm.direct(jnp.asarray(x), jnp.asarray(q),
                                                        jnp.asarray(x[idx]), kernel=k,
                                                        gradient=True)]
            for case in args.cases.split(","):
                dtype, eps = case.split(":")
                eps = float(eps)
                xd, qd = jnp.asarray(x, dtype), jnp.asarray(q, dtype)
                for output in args.outputs.split(","):
                    grad = output == "gradient"
                    try:
                        c = chosen(xd, k, eps, grad)
                    except ValueError as e:          # below the family's floor
                        print(f"# {label(k)} {kind} {dtype} {eps:g} {output}: {e}")
                        continue
                    err = error(jfmm.fmm(xd, qd, kernel=k, eps=eps, gradient=grad), idx, ref,
                                grad)
                    below = None
                    if c.family is not None and c.order > LOWEST.get(c.name, c.order):
                        leaf = max(1, -(-args.n // 2 ** (args.dim * c.depth)))
                        try:
                            out = jfmm.fmm(xd, qd, kernel=k, eps=eps, gradient=grad,
                                           order=c.order - 1, leaf_size=leaf, tree=c.tree,
                                           family=None if c.name in ("laplace3d", "laplace2d")
                                           else c.name)
                            below = error(out, idx, ref, grad)
                        except ValueError as e:
                            print(f"# one below: {e}")
                    table.add(dict(kernel=label(k), points=kind, dim=args.dim, dtype=dtype,
                                   eps=eps, output=output, n=args.n, family=c.name,
                                   tree=c.tree, order=c.order, depth=c.depth, err=err,
                                   err_below=below, verdict=verdict(eps, err, below)))
    table.save(args.out)


if __name__ == "__main__":
    main()
