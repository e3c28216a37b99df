"""A/B: the jitted jfmm.fmm (order given) against Plan.update + apply under
jit (plan as an argument, and closed over), N = 2^20 uniform 3D, potential
and gradient. Prints median ms per kernel and path.

    python benchmarks/plan_probe.py float32 1e-4 [float32|bf16x6]   (the M2L products)
"""
from __future__ import annotations

import os
import sys

import jax
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jfmm  # noqa: E402
from bench_laplace import median_time  # noqa: E402
from jfmm import kernels as K  # noqa: E402


def main():
    dtype, eps = np.dtype(sys.argv[1]).type, float(sys.argv[2])
    jax.config.update("jax_enable_x64", True)
    rng = np.random.default_rng(0)
    n = 2 ** 20
    x = jax.numpy.asarray(rng.random((n, 3)).astype(dtype))
    q = jax.numpy.asarray((rng.random(n) - 0.5).astype(dtype))
    from jfmm.ops import backend
    if len(sys.argv) > 3:
        backend.set_backend("auto", m2l=sys.argv[3])
    for k in (K.Laplace3D(), K.Multiquadric(1.0), K.Yukawa(2.0)):
        pl = jfmm.plan(x, kernel=k, eps=eps)
        fmm = jax.jit(lambda a, c, k=k, p=pl.p: jfmm.fmm(a, c, kernel=k, eps=eps, gradient=True,
                                                          order=p))
        arg = jax.jit(lambda p_, a, c: p_.update(a).apply(c, gradient=True))
        closed = jax.jit(lambda a, c, pl=pl: pl.update(a).apply(c, gradient=True))
        apply_only = jax.jit(lambda p_, c: p_.apply(c, gradient=True))
        t = [median_time(fmm, x, q, repeats=7), median_time(arg, pl, x, q, repeats=7),
             median_time(closed, x, q, repeats=7), median_time(apply_only, pl, q, repeats=7)]
        print(f"| {k} | p {pl.p} depth {pl.tree.depth} | fmm {t[0] * 1e3:.2f} | plan arg "
              f"{t[1] * 1e3:.2f} | plan closed {t[2] * 1e3:.2f} | apply only {t[3] * 1e3:.2f} |",
              flush=True)


if __name__ == "__main__":
    main()
