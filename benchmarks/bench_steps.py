"""Eager jfmm.fmm calls on new points every call: time steps outside jit.

    python benchmarks/bench_steps.py --kinds cube,plummer --out docs/data/steps.json

A script that moves its points and calls `jfmm.fmm` again, eagerly, each
step: per point distribution, one after another in one process (3D
Laplace, potential and gradient, float32 eps 1e-5 unless set), the first
call, the median of
calls on new points (a fresh draw each, moved to the device before the
clock starts), the median of a second call on each new point set with
other charges, and the second call of the first set. Errors of the last
step's potential on 1,000 sampled targets against a float64 direct sum.

JSON row fields: points, n, dtype, eps, first_s, new_ms, again_ms,
second_s, err_phi.
"""
from __future__ import annotations

import jax
import numpy as np

# common puts the checkout on sys.path, before jfmm is imported.
from common import first_time, make_points, parser, reference, rel, sample, Table

import jfmm

COLUMNS = [
    ("points", "points", ""), ("n", "N", ","), ("dtype", "dtype", ""), ("eps", "eps", "g"),
    ("first_s", "first call s", ".1f"), ("second_s", "its second call s", ".2f"),
    ("new_ms", "new points each call ms", lambda r: f"**{r['new_ms']:.1f}**"),
    ("again_ms", "again on them ms", ".1f"), ("err_phi", "err phi", ".1e"),
]


def main():
    ap = parser(__doc__)
    ap.add_argument("--n", type=int, default=2 ** 20)
    ap.add_argument("--kinds", default="cube,plummer")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--eps", type=float, default=1e-5)
    ap.add_argument("--steps", type=int, default=12)
    args = ap.parse_args()
    dtype = np.dtype(args.dtype)
    if dtype == np.float64:
        jax.config.update("jax_enable_x64", True)
    rng = np.random.default_rng(args.seed)
    n, eps = args.n, args.eps
    table = Table(f"eager calls on new points each step, {args.dtype}", COLUMNS)
    for kind in args.kinds.split(","):
        q = jax.device_put((rng.random(n) - 0.5).astype(dtype))
        call = lambda x, c: jfmm.fmm(x, c, eps=eps, gradient=True)   # noqa: E731
        new, again = [], []
        for step in range(args.steps):
            x = jax.block_until_ready(jax.device_put(make_points(kind, n, rng).astype(dtype)))
            (phi, _), t_new = first_time(call, x, q)
            _, t_again = first_time(call, x, 2 * q)
            new.append(t_new)
            again.append(t_again)
        s = sample(rng, n)
        x64 = np.asarray(x, np.float64)
        ref, _ = reference(x64, np.asarray(q, np.float64), x64[s])
        table.add(dict(points=kind, n=n, dtype=args.dtype, eps=eps, first_s=new[0],
                       second_s=again[0], new_ms=1e3 * float(np.median(new[1:])),
                       again_ms=1e3 * float(np.median(again[1:])),
                       err_phi=rel(np.asarray(phi)[s], ref)))
        table.save(args.out)


if __name__ == "__main__":
    main()
