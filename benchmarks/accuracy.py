"""Accuracy over all targets at moderate N (CPU is enough), every distribution.

    python benchmarks/accuracy.py --n 20000 --dtype float64 --eps 1e-10
    python benchmarks/accuracy.py --dim 2 --kernel laplace2d --dtype float32 --eps 1e-5

Relative L2 error of potential and gradient of `jfmm.fmm(..., gradient=True)`
over all N targets (targets = sources) against the float64 direct sum of the
same rounded inputs. Prints markdown rows.
"""
from __future__ import annotations

import argparse
import os
import sys

import jax
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import jfmm  # noqa: E402
from conftest import DISTRIBUTIONS, charges, points, reference, rel  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--dtype", default="float64")
    ap.add_argument("--eps", type=float, default=1e-10)
    ap.add_argument("--leaf", type=int, default=None, help="leaf size (default: the rule's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dim", type=int, default=3)
    ap.add_argument("--kernel", default="laplace3d", help="a jfmm.kernels.get name")
    a = ap.parse_args()
    jax.config.update("jax_enable_x64", True)
    rng = np.random.default_rng(a.seed)
    dtype = np.dtype(a.dtype)
    kernel = jfmm.kernels.get(a.kernel)
    print(f"# {jax.devices()[0].device_kind}, jax {jax.__version__}, N = {a.n:,}, {kernel}, "
          f"{a.dim}D")
    print("| points | dtype | eps | p | depth | err phi | err grad |\n|---|---|---|---|---|---|---|")
    for kind in DISTRIBUTIONS:
        x, q = points(kind, a.n, rng, a.dim), charges(a.n, rng)
        phi, grad = jfmm.fmm(x.astype(dtype), q.astype(dtype), kernel=kernel, eps=a.eps,
                             gradient=True, leaf_size=a.leaf)
        if a.kernel == "laplace3d":
            ref, gref = reference(x, q, dtype=dtype)
        else:   # the float64 direct sum of the same rounded inputs
            xr, qr = x.astype(dtype).astype(np.float64), q.astype(dtype).astype(np.float64)
            ref, gref = jfmm.direct(xr, qr, kernel=kernel, gradient=True)
        plan = jfmm.plan(x.astype(dtype), kernel=kernel, eps=a.eps, leaf_size=a.leaf)
        print(f"| {kind} | {a.dtype} | {a.eps:g} | {plan.order} | {plan.tree.depth} | "
              f"{rel(phi, ref):.2e} | "
              f"{rel(grad, gref):.2e} |", flush=True)


if __name__ == "__main__":
    main()
