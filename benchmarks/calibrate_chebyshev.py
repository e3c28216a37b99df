"""The Chebyshev error model against measurement: for each kernel, point
distribution and order n (forced), the estimated and measured relative L2
errors of phi and grad phi (float64, errors over 1,000 targets against the
float64 direct sum, the largest over --draws random charge vectors; with
--moment-free half of them have zero sum and zero first moments, as the
weights of an RBF interpolant with a linear polynomial tail) and their
ratios, from which the model's margins are set (`jfmm.models.chebyshev`).
Beside the estimate for unknown charges, the estimate for each draw's own
charges (`configure.charge_moments` at the strided targets that
`jfmm.configure.charged` takes) and the largest ratio of measured to it,
over the random draws and over the moment-free ones (CHARGE_RATIOS).
The estimates take a uniform tree's shares: on clustered points, which
`jfmm.fmm` sums on adaptive trees, they are not the configuration's.
CPU is enough.

    python benchmarks/calibrate_chebyshev.py --dim 3 --n 8000 --orders 4-9 --out cal.json
"""
from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from common import Table, make_points, moment_free, parser, rel, sample  # noqa: E402
import jfmm  # noqa: E402
from jfmm import configure  # noqa: E402
from jfmm.models import Points, chebyshev, depth_for, strided  # noqa: E402
from bench_rbf import COMMON  # noqa: E402
from accuracy_rbf import label  # noqa: E402


def clusters(n: int, rng, dim: int) -> np.ndarray:
    """Five tight clusters (sd 1e-3) in the unit cube plus 1 in 200 points far out."""
    centres = rng.random((5, dim))
    x = centres[rng.integers(0, 5, n)] + 1e-3 * rng.normal(size=(n, dim))
    k = max(1, n // 200)
    x[:k] = rng.random((k, dim)) * 20 - 10
    return x


def estimate(kernel, x: np.ndarray, n: int, q: np.ndarray):
    """The model's (err phi, err grad) at n nodes for sources = targets = x,
    for unknown charges and (2, K) for each column of q (N, K)."""
    dim = x.shape[1]
    s = configure._pair_sample(jnp.asarray(x), None)
    points = Points(len(x), len(x), len(x), dim, None, s)
    r = chebyshev.rule(dim)
    depth = depth_for(points, r.leaf_size(n))
    y = strided(x, chebyshev.CHARGE_TARGETS)
    cache = {}                                  # the tails, shared by the estimates
    with chebyshev._float64():
        m = chebyshev.pair_moments(kernel, s.x, s.y, s.side, dim, len(x))
        err = chebyshev.far_field_error(kernel, dim, s.side, depth, m, cache)
        charged = np.array([chebyshev.far_field_error(
            kernel, dim, s.side, depth,
            configure.charge_moments(kernel, jnp.asarray(x), jnp.asarray(q[:, [c]]),
                                     jnp.asarray(y)), cache)[:, n]
            for c in range(q.shape[1])]).T
    return depth, err[0, n], err[1, n], charged


def main():
    ap = parser(__doc__, repeats=False)
    ap.add_argument("--dim", type=int, default=3)
    ap.add_argument("--n", type=int, default=8000)
    ap.add_argument("--orders", default="4-9")
    ap.add_argument("--kernels", default=None, help="comma-separated indices into the list")
    ap.add_argument("--draws", type=int, default=8, help="random charge vectors per point set")
    ap.add_argument("--moment-free", action="store_true",
                    help="half of the draws with zero sum and zero first moments")
    args = ap.parse_args()
    lo, hi = (int(v) for v in args.orders.split("-"))
    rng = np.random.default_rng(args.seed)
    kernels = COMMON if args.kernels is None else [COMMON[int(i)] for i in args.kernels.split(",")]
    table = Table(f"Chebyshev error model against measurement, {args.dim}D float64, "
                  f"N = {args.n:,}", [
                      ("kernel", "kernel", ""), ("points", "points", ""), ("order", "n", "d"),
                      ("depth", "depth", "d"), ("est_phi", "est phi", ".1e"),
                      ("err_phi", "err phi", ".1e"), ("ratio_phi", "phi / est", ".3f"),
                      ("est_grad", "est grad", ".1e"), ("err_grad", "err grad", ".1e"),
                      ("ratio_grad", "grad / est", ".4f"),
                      ("charged_phi", "phi / est for the charges (random, moment-free)",
                       lambda r: "{:.3f}, {}".format(r["charged_phi"][0], "-" if r["charged_phi"][1]
                                                     is None else f"{r['charged_phi'][1]:.3f}")),
                      ("charged_grad", "grad / est for the charges",
                       lambda r: "{:.3f}, {}".format(r["charged_grad"][0], "-" if r["charged_grad"][1]
                                                     is None else f"{r['charged_grad'][1]:.3f}"))])
    for kind in ("cube", "sphere", "cluster"):
        x = clusters(args.n, rng, args.dim) if kind == "cluster" else \
            make_points(kind, args.n, rng, args.dim)
        q = rng.random((args.n, args.draws)) - 0.5
        if args.moment_free:
            half = args.draws - args.draws // 2
            q[:, half:] = moment_free(q[:, half:], x)
        idx = sample(rng, args.n)
        xj, qj = jnp.asarray(x), jnp.asarray(q)
        for k in kernels:
            ref_phi, ref_grad = jfmm.direct(xj, qj, xj[idx], kernel=k, gradient=True)
            for n in range(lo, hi + 1):
                depth, est_phi, est_grad, charged = estimate(k, x, n, q)
                phi, grad = jfmm.fmm(xj, qj, kernel=k, gradient=True, order=n,
                                     family="chebyshev")
                errs = np.array([[rel(phi[idx, c], ref_phi[:, c]) for c in range(args.draws)],
                                 [rel(grad[idx, c], ref_grad[:, c]) for c in range(args.draws)]])
                e_phi, e_grad = errs.max(axis=1)
                ratios = errs / charged
                half = args.draws - args.draws // 2 if args.moment_free else args.draws
                by_kind = [[float(row[:half].max()), float(row[half:].max()) if half <
                            args.draws else None] for row in ratios]
                table.add(dict(kernel=label(k), points=kind, dim=args.dim, dtype="float64",
                               n=args.n, order=n, depth=depth, est_phi=est_phi, err_phi=e_phi,
                               ratio_phi=e_phi / est_phi, est_grad=est_grad, err_grad=e_grad,
                               ratio_grad=e_grad / est_grad, charged_phi=by_kind[0],
                               charged_grad=by_kind[1]))
                if max(e_phi, e_grad) < 1e-12:
                    break
    table.save(args.out)


if __name__ == "__main__":
    main()
