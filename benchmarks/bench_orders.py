"""The orders the configuration chooses, and what they cost: per kernel, the
potential alone and with its gradient (a plan for each), the family, order
and depth, the median time of the jitted Plan.update + apply (tree build
included, after compilation) and the relative L2 errors on 1,000 sampled
targets against the float64 direct sum of the same rounded inputs (uniform
points unless --points says otherwise).

    python benchmarks/bench_orders.py --n 1048576 --dim 3 --cases float32:1e-4,float64:1e-6 \
        --out docs/data/orders_3d.json

On commits before `jfmm.plan` took `gradient`, both rows use the one plan.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from common import Table, make_points, median_time, parser, rel, sample

import jfmm
from bench_rbf import COMMON, KERNELS
from accuracy_rbf import label

COLUMNS = [("kernel", "kernel", ""), ("dtype", "dtype", ""), ("eps", "eps", "g"),
           ("gradient", "gradient", ""),
           ("family", "family, order, depth", lambda r: f"{r['family']}, {r['order']}, {r['depth']}"),
           ("total_ms", "ms", ".2f"), ("err_phi", "err phi", ".2e"), ("err_grad", "err grad", ".2e")]


def make_plan(x, kernel, eps, gradient):
    try:
        return jfmm.plan(x, kernel=kernel, eps=eps, gradient=gradient)
    except TypeError:                   # before plans took `gradient`
        return jfmm.plan(x, kernel=kernel, eps=eps)


def main():
    ap = parser(__doc__)
    ap.add_argument("--n", type=int, default=2 ** 16)
    ap.add_argument("--dim", type=int, default=3)
    ap.add_argument("--cases", default="float32:1e-4,float64:1e-6", help="dtype:eps,...")
    ap.add_argument("--kernels", default=None, help="comma-separated indices into the list")
    ap.add_argument("--points", default="cube", help="common.make_points's point set")
    args = ap.parse_args()
    jax.config.update("jax_enable_x64", True)      # the float64 references
    rng = np.random.default_rng(args.seed)
    n, dim = args.n, args.dim
    x = make_points(args.points, n, rng, dim)
    q = rng.random(n) - 0.5
    s = sample(rng, n)
    kernels = KERNELS[dim] + COMMON
    if args.kernels:
        kernels = [kernels[int(i)] for i in args.kernels.split(",")]
    table = Table(f"orders and times, N = {n:,} {args.points}, {dim}D", COLUMNS)
    for case in args.cases.split(","):
        dtype, eps = case.split(":")
        eps = float(eps)
        xd, qd = jnp.asarray(x, dtype), jnp.asarray(q, dtype)
        x64, q64 = jnp.asarray(xd, jnp.float64), jnp.asarray(qd, jnp.float64)
        for k in kernels:
            ref, gref = jfmm.direct(x64, q64, x64[s], kernel=k, gradient=True)
            for gradient in (False, True):
                row = dict(n=n, kernel=label(k), dim=dim, points=args.points, dtype=dtype,
                           eps=eps, gradient=gradient)
                try:
                    pl = make_plan(xd, k, eps, gradient)
                except ValueError as e:        # eps out of reach (float32 gradients)
                    print(f"# {label(k)} {dtype} {eps:g} gradient={gradient}: {e}")
                    table.add(dict(row, family="raises", order=None, depth=None,
                                   total_ms=float("nan"), err_phi=None, err_grad=None))
                    continue
                f = jax.jit(lambda p_, a, c, g=gradient: p_.update(a).apply(c, gradient=g))
                out = f(pl, xd, qd)
                phi, grad = out if gradient else (out, None)
                t = median_time(f, pl, xd, qd, repeats=args.repeats)
                table.add(dict(row, family=pl.family, order=pl.order, depth=pl.tree.depth,
                               total_ms=t * 1e3, err_phi=rel(phi[s], ref),
                               err_grad=rel(grad[s], gref) if gradient else None))
                del pl, f, out
    table.save(args.out)


if __name__ == "__main__":
    main()
