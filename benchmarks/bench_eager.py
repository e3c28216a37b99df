"""Repeated eager jfmm.fmm calls against a plan's apply, per kernel.

    python benchmarks/bench_eager.py --n 1048576 --out docs/data/eager.json

What a user meets who calls `jfmm.fmm` again and again with the same
kernel, shapes, dtype and eps (same points): per kernel and dtype the
median of repeated eager calls (after a first one) on one charge array,
and on a new charge array each call (eager calls take the charges'
moments once per array: `configure.charged`), beside `jfmm.plan` once and
the median of `Plan.apply` (potential only, 3D uniform points), and of
`Plan.apply` without its check of the charges (`configure.checked`: the
check's cost); the relative L2 error of each on 1,000 sampled targets
against a float64 direct sum.

JSON row fields: n, kernel, dim, points, dtype, eps, family, order, depth,
eager_ms, eager_new_ms, apply_ms, unchecked_ms, ratio (eager / apply),
err_eager, err_apply.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

# common puts the checkout on sys.path, before jfmm is imported.
from common import make_points, median_time, parser, rel, sample, Table

import jfmm
from jfmm import kernels as K
from bench_rbf import COMMON

# Every 3D kernel of bench_rbf in float32 (3D Laplace at its headline eps)
# and float64.
CASES = ([(K.Laplace3D(), "float32", 1e-5)] + [(k, "float32", 1e-4) for k in COMMON]
         + [(k, "float64", 1e-6) for k in [K.Laplace3D()] + COMMON])

COLUMNS = [
    ("kernel", "kernel", ""), ("dtype", "dtype", ""), ("eps", "eps", "g"),
    ("family", "family, order, depth", lambda r: f"{r['family']}, {r['order']}, {r['depth']}"),
    ("eager_ms", "eager fmm ms", ".2f"), ("eager_new_ms", "new charges ms", ".2f"),
    ("apply_ms", "plan.apply ms", ".2f"), ("unchecked_ms", "unchecked ms", ".2f"),
    ("ratio", "eager / apply", ".2f"), ("err_eager", "err eager", ".2e"),
    ("err_apply", "err apply", ".2e"),
]


def main():
    ap = parser(__doc__)
    ap.add_argument("--n", type=int, default=2 ** 16)
    ap.add_argument("--cases", default=None, help="comma-separated indices into the list")
    args = ap.parse_args()
    jax.config.update("jax_enable_x64", True)      # the float64 references
    rng = np.random.default_rng(args.seed)
    n = args.n
    cases = CASES if not args.cases else [CASES[int(i)] for i in args.cases.split(",")]
    table = Table(f"repeated eager calls against Plan.apply, N = {n:,} uniform, 3D, "
                  "potential", COLUMNS)
    x64 = make_points("cube", n, rng)
    s = sample(rng, n)
    for kernel, dtype, eps in cases:
        x = jnp.asarray(x64.astype(dtype))
        q = jnp.asarray((rng.random(n) - 0.5).astype(dtype))
        eager = lambda c, k=kernel, e=eps: jfmm.fmm(x, c, kernel=k, eps=e)  # noqa: E731
        t_eager = median_time(eager, q, repeats=args.repeats)
        pl = jfmm.plan(x, kernel=kernel, eps=eps, charges=q)     # the order fmm takes for q
        t_apply = median_time(pl.apply, q, repeats=args.repeats)
        bare = dataclasses.replace(pl, check=None)
        t_bare = median_time(bare.apply, q, repeats=args.repeats)
        t_new = median_time(lambda c: eager(c + 0), q, repeats=args.repeats)   # a new array
        xs = np.asarray(x, np.float64)
        ref = jfmm.direct(jnp.asarray(xs), jnp.asarray(q, jnp.float64), jnp.asarray(xs[s]),
                          kernel=kernel)
        table.add(dict(n=n, kernel=str(kernel), dim=3, points="cube", dtype=dtype, eps=eps,
                       family=pl.family, order=pl.order, depth=pl.tree.depth,
                       eager_ms=t_eager * 1e3, eager_new_ms=t_new * 1e3,
                       apply_ms=t_apply * 1e3, unchecked_ms=t_bare * 1e3,
                       ratio=t_eager / t_apply, err_eager=rel(np.asarray(eager(q))[s], ref),
                       err_apply=rel(np.asarray(pl.apply(q))[s], ref)))
    table.save(args.out)


if __name__ == "__main__":
    main()
