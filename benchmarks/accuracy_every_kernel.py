"""Accuracy of every kernel against eps: 2D or 3D, float64, N = 20,000
uniform points with mixed-sign charges, eps from 1e-3 to 1e-10: the family
and order `jfmm.fmm` chooses (or the ValueError it raises), the measured
relative L2 error of potential and gradient against the float64 direct sum
(all targets), and whether err phi <= eps. CPU is enough.

    python benchmarks/accuracy_every_kernel.py --dim 3 --n 20000
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jax.numpy as jnp  # noqa: E402
import jfmm  # noqa: E402
from jfmm import configure  # noqa: E402
from accuracy_rbf import label  # noqa: E402
from bench_rbf import COMMON, KERNELS  # noqa: E402
from common import rel  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dim", type=int, default=2)
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kernels", default=None, help="comma-separated indices into the list")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    n, dim = args.n, args.dim
    x = rng.random((n, dim))
    q = rng.random(n) - 0.5
    print(f"# {jax.devices()[0].device_kind}, jax {jax.__version__}, {time.strftime('%Y-%m-%d')}, "
          f"N = {n:,} uniform, {dim}D, float64")
    print("| kernel | eps | family, order | err phi | err grad | err phi <= eps | s |\n"
          "|---|---|---|---|---|---|---|")
    fails = 0
    kernels = KERNELS[dim] + COMMON
    if args.kernels:
        kernels = [kernels[int(i)] for i in args.kernels.split(",")]
    for k in kernels:
        ref, gref = jfmm.direct(x, q, kernel=k, gradient=True)
        for e in range(3, 11):
            eps = 10.0 ** -e
            try:
                cfg = configure.resolve(jnp.asarray(x), None, k, eps, None, None, None)
                order = f"{cfg.name}, {cfg.order}"
            except ValueError as err:
                print(f"| {label(k)} | {eps:g} | - | {err} | | | |")
                continue
            t0 = time.perf_counter()
            phi, g = jfmm.fmm(x, q, kernel=k, eps=eps, gradient=True)
            ok = rel(phi, ref) <= eps
            fails += not ok
            print(f"| {label(k)} | {eps:g} | {order} | {rel(phi, ref):.2e} | {rel(g, gref):.2e} | "
                  f"{'yes' if ok else '**no**'} | {time.perf_counter() - t0:.1f} |", flush=True)
    print(f"\n{fails} case(s) above eps")


if __name__ == "__main__":
    main()
