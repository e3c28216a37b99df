"""Probe: the jnp Chebyshev P2M (per-point tensor products reduced per leaf
by segment_sum) on the GPU by order n, with the products fused into the
reduction (as XLA chooses) and materialized first (optimization barrier).

    python benchmarks/probe_up.py
"""
import importlib
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
from bench_laplace import median_time  # noqa: E402
from jfmm.tree import build  # noqa: E402

driver = importlib.import_module("jfmm.fmm")

rng = np.random.default_rng(0)
n = 2 ** 20
fam = driver.chebyshev_family(3)
for dt in (jnp.float64, jnp.float32):
    x = jnp.asarray(rng.random((n, 3)), dt)
    q = jnp.asarray(rng.random((n, 1)) - 0.5, dt)
    tree = jax.jit(build, static_argnames="depth")(x, None, depth=4)
    u = (tree.src_sorted - tree.leaf_centers(tree.src_leaf)) / tree.box_side(4)
    row = []
    for p in range(4, 12):
        fused = jax.jit(lambda u, q, p=p: jax.ops.segment_sum(
            fam.p2m(u, q, p), tree.src_leaf, 4096, indices_are_sorted=True))
        barrier = jax.jit(lambda u, q, p=p: jax.ops.segment_sum(
            jax.lax.optimization_barrier(fam.p2m(u, q, p)), tree.src_leaf, 4096,
            indices_are_sorted=True))
        ms = [median_time(f, u, q, repeats=5) * 1e3 for f in (fused, barrier)]
        row.append(f"n={p}: {ms[0]:.2f} / {ms[1]:.2f}")
    print(jnp.dtype(dt).name, "fused / barrier ms:", " | ".join(row), flush=True)
