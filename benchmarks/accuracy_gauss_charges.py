"""The fast Gauss transform's error on random charges that cancel at the targets.

    python benchmarks/accuracy_gauss_charges.py --draws 200 --seed 12345 \
        --out docs/data/gauss_charges.json

3D Gaussian(0.3), eps 1e-4: 1,500 clustered sources (the test suite's
clusters, spanning about [-10, 10]), 400 targets in a cube apart from most
of them, charges uniform in [-0.5, 0.5], a fresh draw of each per row of
the loop; `jfmm.fmm(..., family="hermite")` called eagerly as a script
writes it, in float32 and float64, with and without the gradient, against
a float64 numpy sum. Random charges on these points cancel at the targets
by a ratio that varies from draw to draw (`hermite.Cancellation`); one
row per (dtype, gradient): the largest and the 99th-percentile relative
error of phi over the draws, how many exceed eps, and the orders chosen.

    python benchmarks/accuracy_gauss_charges.py --cost 16,18,20,22

What measuring the charges costs instead: 3D Gaussian(4) on uniform
points, float32 eps 1e-4 and float64 eps 1e-6, potential and gradient;
per log2 N the median time of the measurement (`configure._gauss_ratios`,
compiled) beside `Plan.apply` and the plan made with charges=, each after
one call to compile.
"""
from __future__ import annotations

import os
import sys
import time

import jax
import numpy as np
from common import Table, median_time, parser

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from conftest import charges, points, radial_reference, rel  # noqa: E402

import jfmm  # noqa: E402
from jfmm import configure  # noqa: E402
from jfmm import kernels as K  # noqa: E402

COLUMNS = [
    ("dtype", "dtype", ""), ("gradient", "gradient", ""), ("draws", "draws", "d"),
    ("err_max", "largest error", ".2e"), ("err_p99", "99th percentile", ".2e"),
    ("over_eps", "draws over eps", "d"), ("orders", "orders chosen (draws)", ""),
]


COST_COLUMNS = [
    ("n", "N", ","), ("dtype", "dtype", ""), ("eps", "eps", "g"), ("order", "order", "d"),
    ("measure_ms", "measuring the charges ms", ".2f"), ("apply_ms", "Plan.apply ms", ".2f"),
    ("plan_ms", "jfmm.plan(charges=) ms", ".1f"),
]


def cost(sizes: list[int], seed: int, repeats: int, out: str | None) -> None:
    """The measurement's time beside the sum's (see the module's docstring)."""
    # conftest, imported for its point sets, turns XLA's optimisations off for the suite
    jax.config.update("jax_disable_most_optimizations", False)
    kern = K.Gaussian(4.0)
    table = Table("Fast Gauss transform: measuring the charges, 3D Gaussian(4), uniform points, "
                  "potential and gradient", COST_COLUMNS)
    rng = np.random.default_rng(seed)
    for log2n in sizes:
        n = 2 ** log2n
        for dtype, eps in ((np.float32, 1e-4), (np.float64, 1e-6)):     # conftest: x64 on
            x = jax.device_put(rng.random((n, 3)).astype(dtype))
            q = jax.device_put((rng.random((n, 1)) - 0.5).astype(dtype))
            ratios = lambda: configure._gauss_ratios(kern, x, q, x)        # noqa: E731
            measure = median_time(ratios, repeats=repeats)
            made = lambda a, c: jfmm.plan(a, kernel=kern, eps=eps, gradient=True,  # noqa: E731
                                          family="hermite", charges=c)
            pl = made(x, q[:, 0])
            plan_s = []
            for _ in range(repeats):                     # new arrays: no plan kept for them
                a, c = jax.block_until_ready((x + 0, q[:, 0] * 1))
                t0 = time.perf_counter()
                jax.block_until_ready(made(a, c).tree)
                plan_s.append(time.perf_counter() - t0)
            apply = median_time(lambda c: pl.apply(c, gradient=True), q[:, 0], repeats=repeats)
            table.add(dict(n=n, dtype=np.dtype(dtype).name, eps=eps, order=pl.order,
                           measure_ms=1e3 * measure, apply_ms=1e3 * apply,
                           plan_ms=1e3 * float(np.median(plan_s))))
    table.save(out)


def main():
    ap = parser(__doc__)
    ap.add_argument("--draws", type=int, default=200, help="random draws of points and charges")
    ap.add_argument("--cost", default=None,
                    help="log2 N, comma-separated: time the measurement instead")
    args = ap.parse_args()
    if args.cost:
        cost([int(v) for v in args.cost.split(",")], args.seed, args.repeats, args.out)
        return
    kern, eps = K.Gaussian(0.3), 1e-4
    errs, orders = {}, {}
    for child in np.random.SeedSequence(args.seed).spawn(args.draws):
        rng = np.random.default_rng(child)
        x, q = points("cluster", 1500, rng, 3), charges(1500, rng)
        y = points("cube", 400, rng, 3) * 1.2 - 0.1
        x, q, y = (np.asarray(a, np.float32) for a in (x, q, y))
        ref = radial_reference(kern, *(np.asarray(a, np.float64) for a in (x, q, y)),
                               gradient=False)[0]
        for dtype in (np.float32, np.float64):
            a = [np.asarray(v, dtype) for v in (x, q, y)]
            for gradient in (False, True):
                out = jfmm.fmm(*a, kernel=kern, eps=eps, gradient=gradient, family="hermite")
                key = (np.dtype(dtype).name, gradient)
                errs.setdefault(key, []).append(rel(out[0] if gradient else out, ref))
                order = jfmm.plan(a[0], a[2], kernel=kern, eps=eps, family="hermite",
                                  gradient=gradient, charges=a[1]).order
                orders.setdefault(key, []).append(order)
    table = Table(f"Fast Gauss transform, 3D Gaussian(0.3), eps {eps:g}, clustered sources, "
                  f"targets apart, random charges, eager calls", COLUMNS)
    for (dtype, gradient), e in errs.items():
        e = np.asarray(e)
        values, counts = np.unique(orders[(dtype, gradient)], return_counts=True)
        table.add(dict(dtype=dtype, gradient=str(gradient), draws=len(e), err_max=float(e.max()),
                       err_p99=float(np.quantile(e, 0.99)), over_eps=int(np.sum(e > eps)),
                       orders=", ".join(f"{v} ({c})" for v, c in zip(values, counts))))
    table.save(args.out)


if __name__ == "__main__":
    main()
