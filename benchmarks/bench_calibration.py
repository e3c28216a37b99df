"""3D Laplace orders as eager calls choose them: uniform, sphere and
clustered points, each dtype and eps, phi alone and phi with its gradient.

    python benchmarks/bench_calibration.py --n 1048576 --out docs/data/calibration.json

Each row: an eager `jfmm.fmm(x, q, eps=eps, gradient=...)` on the same
arrays (from the second call on, the plan made for them; tree build
included), median of --repeats calls; the order, depth and tree that plan
took; errors of phi and grad phi on 1,000 sampled targets against a
float64 direct sum of the same float32-rounded inputs. Run it on two
commits to compare their orders (docs/BENCHMARKS.md, "Calibration").
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from common import Table, make_points, parser, reference, rel, sample

import jfmm
from jfmm import api

COLUMNS = [("points", "points", ""), ("dtype", "dtype", ""), ("eps", "eps", "g"),
           ("output", "output", ""), ("tree", "tree", ""), ("order", "p", "d"),
           ("depth", "depth", "d"), ("time_ms", "ms", lambda r: f"**{r['time_ms']:.2f}**"),
           ("err_phi", "err phi", ".2e"), ("err_grad", "err grad", ".2e")]


def main():
    ap = parser(__doc__)
    ap.add_argument("--n", type=int, default=2 ** 20)
    ap.add_argument("--points", default="cube,sphere,plummer")
    ap.add_argument("--cases", default="float32:1e-4,float32:1e-5,float64:1e-6,float64:1e-8",
                    help="comma-separated dtype:eps")
    args = ap.parse_args()
    jax.config.update("jax_enable_x64", True)
    rng = np.random.default_rng(args.seed)
    table = Table(f"3D Laplace orders of eager calls, N = {args.n:,}", COLUMNS)
    for kind in args.points.split(","):
        x = make_points(kind, args.n, rng).astype(np.float32).astype(np.float64)
        q = (rng.random(args.n) - 0.5).astype(np.float32).astype(np.float64)
        idx = sample(rng, args.n)
        ref, gref = reference(x, q, x[idx])
        for case in args.cases.split(","):
            dtype, eps = case.split(":")
            xd, qd = jnp.asarray(x, dtype), jnp.asarray(q, dtype)
            for gradient in (False, True):
                f = lambda: jfmm.fmm(xd, qd, eps=float(eps), gradient=gradient)  # noqa: E731
                out = jax.block_until_ready(f())
                jax.block_until_ready(f())                 # the plan of these arrays
                times = []
                for _ in range(args.repeats):
                    t0 = time.perf_counter()
                    jax.block_until_ready(f())
                    times.append(time.perf_counter() - t0)
                config = api._PLANS[0][2].config
                phi = np.asarray(out[0] if gradient else out, np.float64)
                table.add(dict(points=kind, n=args.n, dtype=dtype, eps=float(eps),
                               output="gradient" if gradient else "potential",
                               tree=config.tree, order=config.order, depth=config.depth,
                               time_ms=1e3 * float(np.median(times)),
                               err_phi=rel(phi[idx], ref),
                               err_grad=rel(np.asarray(out[1], np.float64)[idx], gref)
                               if gradient else None))
                table.save(args.out)


if __name__ == "__main__":
    main()
