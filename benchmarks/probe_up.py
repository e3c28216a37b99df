"""Probe: the jnp Chebyshev P2M (per-point tensor products reduced per leaf
by segment_sum) on the GPU by order n, with the products fused into the
reduction (as XLA chooses) and materialized first (optimization barrier).

    python benchmarks/probe_up.py
"""
import importlib
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from jfmm.tree import build  # noqa: E402

driver = importlib.import_module("jfmm.fmm")


def med(f, *a):
    jax.block_until_ready(f(*a))
    ts = []
    for _ in range(5):
        t = time.perf_counter()
        jax.block_until_ready(f(*a))
        ts.append(time.perf_counter() - t)
    return np.median(ts) * 1e3


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
        row.append(f"n={p}: {med(fused, u, q):.2f} / {med(barrier, u, q):.2f}")
    print(jnp.dtype(dt).name, "fused / barrier ms:", " | ".join(row), flush=True)
