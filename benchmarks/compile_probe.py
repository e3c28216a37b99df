"""Compile time of the Pallas P2M / L2P kernels at order p, and of the whole
fmm() by stage (trace + lower, XLA compile, first run).

    python benchmarks/compile_probe.py P [float32|float64] [N]

N (default 4,096) sizes the whole-fmm() probe; the kernel probes use 4,096.
"""
from __future__ import annotations

import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jfmm  # noqa: E402
from jfmm.ops import backend, laplace3d  # noqa: E402
from jfmm.tree import build  # noqa: E402


def stage_times(f, *args):
    t0 = time.perf_counter()
    lowered = jax.jit(f).lower(*args)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    t3 = time.perf_counter()
    return t1 - t0, t2 - t1, t3 - t2


def main():
    p = int(sys.argv[1])
    dtype = sys.argv[2] if len(sys.argv) > 2 else "float32"
    if dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 4096
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.random((4096, 3)), dtype)
    q = jnp.asarray(rng.random((4096, 1)) - 0.5, dtype)
    t = build(x, None, 2)
    h = t.box_side(2)
    u = (t.src_sorted - t.leaf_centers(t.src_leaf)) / h
    coef = jnp.asarray(rng.normal(size=(t.n_leaves, 1, 4, p * p)), dtype)
    mode = backend.current()
    p2m = stage_times(lambda a, c: backend.p2m(laplace3d, a, c, t.src_start, t.src_leaf, p, mode),
                      u, q)
    l2p = stage_times(lambda a, c: backend.l2p(laplace3d, a, c, t.tgt_start, t.tgt_leaf, h, p,
                                               True, mode), u, coef)
    xf = jnp.asarray(rng.random((n, 3)), dtype)
    qf = jnp.asarray(rng.random(n) - 0.5, dtype)
    f = stage_times(lambda a, c: jfmm.fmm(a, c, order=p, gradient=True), xf, qf)
    fmt = lambda s: " / ".join(f"{v:.1f}" for v in s)  # noqa: E731
    print(f"| {p} | {dtype} | {n:,} | {mode} | {fmt(p2m)} | {fmt(l2p)} | {fmt(f)} |", flush=True)


if __name__ == "__main__":
    main()
