"""Errors for charges with zero sum and zero first moments beside random ones.

    python benchmarks/accuracy_moment_free.py --n 1048576 --out moment_free.json

The weights of an RBF interpolant with a linear polynomial tail have zero
sum and zero first moments sum_i q_i x_i. Where the kernel is smooth over
the points' extent such charges cancel in phi's largest modes, so |phi| is
far smaller than for random charges while the far field's truncation error
is not: eps, a relative error, is harder to meet. Per kernel, points and
(dtype, eps): the order an eager `jfmm.fmm` call chooses (potential only)
and the worst relative L2 error over --draws random charge vectors and over
--draws moment-free ones (each drawn at random and projected), on 1,000
sampled targets against a float64 direct sum of the same rounded inputs;
beside them the moment-free error of `jfmm.direct` in the same dtype (its
rounding alone).

JSON row fields: n, kernel, dim, points, dtype, eps, family, order, depth,
err_random, err_moment_free (the worst over the draws of each),
err_direct (the direct sum's, moment-free).
"""
from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from common import Table, make_points, moment_free, parser, rel, sample  # noqa: E402
import jfmm  # noqa: E402
from jfmm import configure, kernels as K  # noqa: E402
from accuracy_rbf import label  # noqa: E402
from calibrate_orders import chosen  # noqa: E402

KERNELS = [K.Gaussian(1.0), K.Multiquadric(1.0), K.InverseMultiquadric(1.0),
           K.InverseQuadratic(1.0), K.ThinPlateSpline(), K.Linear(), K.Cubic()]
COLUMNS = [("kernel", "kernel", ""), ("points", "points", ""), ("dtype", "dtype", ""),
           ("eps", "eps", "g"),
           ("family", "family, order, depth", lambda r: f"{r['family']}, {r['order']}, {r['depth']}"),
           ("err_random", "err random", ".1e"), ("err_moment_free", "err moment-free", ".1e"),
           ("over", "moment-free / eps", ".2f"), ("err_direct", "direct, moment-free", ".1e")]


def main():
    ap = parser(__doc__, repeats=False)
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--dim", type=int, default=3)
    ap.add_argument("--points", default="cube,sphere")
    ap.add_argument("--cases", default="float32:1e-4,float64:1e-6", help="dtype:eps, comma-separated")
    ap.add_argument("--draws", type=int, default=2)
    args = ap.parse_args()
    configure.DIRECT_PAIRS = {"cpu": {}, "gpu": {}}       # every row sums by its family
    rng = np.random.default_rng(args.seed)
    table = Table(f"random and moment-free charges, N = {args.n:,}, {args.dim}D, potential",
                  COLUMNS)
    laplace = K.Laplace3D() if args.dim == 3 else K.Laplace2D()
    for kind in args.points.split(","):
        x = make_points(kind, args.n, rng, args.dim).astype(np.float32).astype(np.float64)
        q = rng.random((args.n, 2 * args.draws)) - 0.5
        q[:, args.draws:] = moment_free(q[:, args.draws:], x)
        q = q.astype(np.float32).astype(np.float64)
        idx = sample(rng, args.n)
        for k in [laplace] + KERNELS:
            ref = np.asarray(jfmm.direct(jnp.asarray(x), jnp.asarray(q), jnp.asarray(x[idx]),
                                         kernel=k))
            for case in args.cases.split(","):
                dtype, eps = case.split(":")
                eps = float(eps)
                xd, qd = jnp.asarray(x, dtype), jnp.asarray(q, dtype)
                c = chosen(xd, k, eps, False)
                phi = np.asarray(jfmm.fmm(xd, qd, kernel=k, eps=eps), np.float64)[idx]
                errs = [rel(phi[:, j], ref[:, j]) for j in range(q.shape[1])]
                free = max(errs[args.draws:])
                direct = np.asarray(jfmm.direct(xd, qd, xd[idx], kernel=k), np.float64)
                by_direct = max(rel(direct[:, j], ref[:, j]) for j in range(args.draws, q.shape[1]))
                table.add(dict(n=args.n, kernel=label(k), dim=args.dim, points=kind, dtype=dtype,
                               eps=eps, family=c.name, order=c.order, depth=c.depth,
                               err_random=max(errs[:args.draws]), err_moment_free=free,
                               over=free / eps, err_direct=by_direct))
    table.save(args.out)


if __name__ == "__main__":
    main()
