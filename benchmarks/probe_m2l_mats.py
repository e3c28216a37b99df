"""Probe: building the truncated 3D Chebyshev M2L matrices of one level
(n = 8, 10; float64 and float32): the gather as one advanced index against
a gather along the offsets and two take_along_axis (ms, medians).

    python benchmarks/probe_m2l_mats.py
"""
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from jfmm import kernels  # noqa: E402
from jfmm.ops import chebyshev as ch  # noqa: E402


def med(f, *a):
    jax.block_until_ready(f(*a))
    ts = []
    for _ in range(5):
        t = time.perf_counter()
        jax.block_until_ready(f(*a))
        ts.append(time.perf_counter() - t)
    return np.median(ts) * 1e3


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
        c = ch._truncate(ch._truncate(ch._node_matrices(kernels.Yukawa(2.0), 0.0625, n, 3, canon, dt), n), n)
        a = jax.jit(three_steps)(c, *args)
        b = jax.jit(one_gather)(c, *args)
        assert float(jnp.max(jnp.abs(a - b))) == 0.0
        print(f"{jnp.dtype(dt).name} n={n}: three steps {med(jax.jit(three_steps), c, *args):.2f} ms, "
              f"one gather {med(jax.jit(one_gather), c, *args):.2f} ms", flush=True)
