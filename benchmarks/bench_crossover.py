"""Eager jfmm.fmm against eager jfmm.direct at small N: where the FMM pays.

    python benchmarks/bench_crossover.py --nmin 6 --nmax 16 --out docs/data/crossover.json

Per kernel, dtype and N = 2^nmin .. 2^nmax (uniform 2D or 3D points, potential
only, targets = sources): the median time of repeated eager `jfmm.fmm`
calls (new charges, same points) with the direct-sum crossover switched
off (`configure.DIRECT_PAIRS`), of eager `jfmm.direct` calls, and of the
default `jfmm.fmm` (which sums directly below the crossover), and the
FMM's relative L2 error against a float64 direct sum. The crossover is
where fmm_ms meets direct_ms; auto_ms should be the smaller of the two.

JSON row fields: n, kernel, dim, points, dtype, eps, family, order, depth,
fmm_ms, direct_ms, ratio (fmm / direct), auto (the default's family),
auto_ms, err_phi.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# common puts the checkout on sys.path, before jfmm is imported.
from common import make_points, median_time, parser, rel, sample, Table

import jfmm
from jfmm import configure
from jfmm import kernels as K

CASES = [(K.Laplace3D(), "float32", 1e-5, 3), (K.Laplace3D(), "float64", 1e-6, 3),
         (K.InverseMultiquadric(5.0), "float32", 1e-4, 3), (K.Linear(), "float64", 1e-6, 3),
         (K.Gaussian(10.0), "float64", 1e-6, 3), (K.Laplace2D(), "float64", 1e-6, 2),
         (K.Laplace2D(), "float32", 1e-5, 2), (K.Linear(), "float64", 1e-6, 2),
         (K.InverseMultiquadric(5.0), "float32", 1e-4, 2)]

COLUMNS = [
    ("kernel", "kernel", ""), ("dtype", "dtype", ""), ("eps", "eps", "g"), ("n", "N", ","),
    ("family", "family, order, depth", lambda r: f"{r['family']}, {r['order']}, {r['depth']}"),
    ("fmm_ms", "fmm ms", ".3f"), ("direct_ms", "direct ms", ".3f"),
    ("ratio", "fmm / direct", ".2f"), ("auto", "default", ""), ("auto_ms", "default ms", ".3f"),
    ("err_phi", "err phi", ".2e"),
]


def main():
    ap = parser(__doc__)
    ap.add_argument("--nmin", type=int, default=6)
    ap.add_argument("--nmax", type=int, default=16)
    ap.add_argument("--step", type=int, default=2, help="log2 N step")
    ap.add_argument("--cases", default=None, help="comma-separated indices into the list")
    args = ap.parse_args()
    jax.config.update("jax_enable_x64", True)      # the float64 references
    rng = np.random.default_rng(args.seed)
    cases = CASES if not args.cases else [CASES[int(i)] for i in args.cases.split(",")]
    table = Table("eager fmm against eager direct, uniform points, potential", COLUMNS)
    crossover = configure.DIRECT_PAIRS
    for kernel, dtype, eps, dim in cases:
        for log_n in range(args.nmin, args.nmax + 1, args.step):
            n = 2 ** log_n
            x = jnp.asarray(make_points("cube", n, rng, dim).astype(dtype))
            q = jnp.asarray((rng.random(n) - 0.5).astype(dtype))
            f = lambda c, k=kernel, e=eps, x=x: jfmm.fmm(x, c, kernel=k, eps=e)  # noqa: E731
            d = lambda c, k=kernel, x=x: jfmm.direct(x, c, kernel=k)             # noqa: E731
            t_direct = median_time(d, q, repeats=args.repeats)
            t_auto = median_time(f, q, repeats=args.repeats)
            auto = jfmm.plan(x, kernel=kernel, eps=eps).family
            configure.DIRECT_PAIRS = {"cpu": {}, "gpu": {}}
            t_fmm = median_time(f, q, repeats=args.repeats)
            pl = jfmm.plan(x, kernel=kernel, eps=eps)
            s = sample(rng, n)
            xs = np.asarray(x, np.float64)
            ref = jfmm.direct(jnp.asarray(xs), jnp.asarray(q, jnp.float64),
                              jnp.asarray(xs[s]), kernel=kernel)
            table.add(dict(n=n, kernel=str(kernel), dim=dim, points="cube", dtype=dtype,
                           eps=eps, family=pl.family, order=pl.order, depth=pl.tree.depth,
                           fmm_ms=t_fmm * 1e3, direct_ms=t_direct * 1e3,
                           ratio=t_fmm / t_direct, auto=auto, auto_ms=t_auto * 1e3,
                           err_phi=rel(np.asarray(f(q))[s], ref)))
            configure.DIRECT_PAIRS = crossover
    table.save(args.out)


if __name__ == "__main__":
    main()
