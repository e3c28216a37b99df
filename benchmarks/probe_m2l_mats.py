"""Probe: building the truncated 3D Chebyshev M2L matrices of one level
(n = 8, 10; float64 and float32): the gather as one advanced index against
a gather along the offsets and two take_along_axis (ms, medians).

    python benchmarks/probe_m2l_mats.py
"""
import os
import sys

import jax
import jax.numpy as jnp

jax.config.update("jax_enable_x64", True)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
from bench_laplace import median_time  # noqa: E402
from jfmm import kernels  # noqa: E402
from jfmm.ops import chebyshev as ch  # noqa: E402


def three_steps(mats, which, index, sign):
    mats = mats[which]
    mats = jnp.take_along_axis(mats, index[:, :, None], axis=1)
    mats = jnp.take_along_axis(mats, index[:, None, :], axis=2)
    return mats * sign[:, :, None] * sign[:, None, :]


def one_gather(mats, which, index, sign):
    return (mats[which[:, None, None], index[:, :, None], index[:, None, :]]
            * sign[:, :, None] * sign[:, None, :])


for dt in (jnp.float64, jnp.float32):
    for n in (8, 10):
        canon, which, index, sign = ch._symmetries(n)
        args = (jnp.asarray(which), jnp.asarray(index), jnp.asarray(sign, dt))
        nodes = ch._node_matrices(kernels.Yukawa(2.0), 0.0625, n, 3, canon, dt)
        c = ch._truncate(ch._truncate(nodes, n), n)
        a = jax.jit(three_steps)(c, *args)
        b = jax.jit(one_gather)(c, *args)
        assert float(jnp.max(jnp.abs(a - b))) == 0.0
        ms = [median_time(jax.jit(f), c, *args, repeats=5) * 1e3 for f in (three_steps, one_gather)]
        print(f"{jnp.dtype(dt).name} n={n}: three steps {ms[0]:.2f} ms, one gather {ms[1]:.2f} ms",
              flush=True)
