"""Accuracy of the Chebyshev family per kernel and order (CPU, float64).

    python benchmarks/accuracy_rbf.py --dim 2 --orders 4,6,8 --n 4000

For each kernel (several shape parameters), point distribution and n (nodes
per dimension): relative L2 error of potential and gradient over all targets
against jfmm.direct, with the tree depth forced to at least 2. Prints
markdown rows and, last, the worst max(err phi, err grad / 10) per n.
"""
from __future__ import annotations

import argparse
import os
import sys

import jax

jax.config.update("jax_enable_x64", True)
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jfmm  # noqa: E402
from jfmm import kernels as K  # noqa: E402

KERNELS = [K.Gaussian(0.5), K.Gaussian(2.0), K.Gaussian(8.0), K.Multiquadric(1.0),
           K.Multiquadric(8.0), K.InverseMultiquadric(1.0), K.InverseMultiquadric(8.0),
           K.InverseQuadratic(1.0), K.InverseQuadratic(8.0), K.ThinPlateSpline(), K.Linear(),
           K.Cubic(), K.Quintic(), K.Yukawa(1.0), K.Yukawa(8.0)]


def points(kind, n, dim, rng):
    if kind == "cube":
        return rng.random((n, dim))
    centres = rng.random((4, dim))
    return centres[rng.integers(0, 4, n)] + 0.05 * rng.normal(size=(n, dim))


def label(k):
    v = [f"{float(x):g}" for x in jax.tree_util.tree_leaves(k)]
    return type(k).__name__ + (f"({v[0]})" if v else "")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dim", type=int, default=2)
    ap.add_argument("--orders", default="4,6,8")
    ap.add_argument("--n", type=int, default=4000)
    ap.add_argument("--leaf", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    kernels = KERNELS + ([K.Laplace2D()] if args.dim == 2 else [])
    leaf = args.leaf or (args.n // 4 ** args.dim // 2)
    worst = {}
    print("| kernel | points | n | err phi | err grad |\n|---|---|---|---|---|")
    for kind in ("cube", "cluster"):
        x = points(kind, args.n, args.dim, rng)
        q = rng.random(args.n) - 0.5
        for k in kernels:
            ref, gref = jfmm.direct(x, q, kernel=k, gradient=True)
            for n in map(int, args.orders.split(",")):
                phi, g = jfmm.fmm(x, q, kernel=k, order=n, leaf_size=leaf, gradient=True)
                e = float(np.linalg.norm(phi - ref) / np.linalg.norm(ref))
                eg = float(np.linalg.norm(g - gref) / np.linalg.norm(gref))
                worst[n] = max(worst.get(n, 0.0), e, eg / 10)
                print(f"| {label(k)} | {kind} | {n} | {e:.2e} | {eg:.2e} |", flush=True)
    print("\nworst max(err phi, err grad / 10) per n:",
          {n: f"{v:.1e}" for n, v in sorted(worst.items())})


if __name__ == "__main__":
    main()
