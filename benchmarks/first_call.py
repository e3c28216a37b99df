"""First-call time of the eager public calls, in a fresh process.

    python benchmarks/first_call.py KERNEL DTYPE EPS [N]

KERNEL: a `jfmm.kernels.get` name (laplace3d, yukawa, ...). Times, at N
uniform points (default 2^20) with potential and gradient: the first eager
`jfmm.fmm` call (choices, compilation, run), the second (same shapes: choices
and run), `jfmm.plan` plus the first `Plan.apply`, and the second apply;
and the relative L2 error of the potential on 1,000 sampled targets against
a float64 direct sum. Prints one markdown row, with XLA_FLAGS.
"""
from __future__ import annotations

import os
import sys
import time

import jax
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jfmm  # noqa: E402


def timed(f):
    t0 = time.perf_counter()
    out = jax.block_until_ready(f())
    return out, time.perf_counter() - t0


def main():
    name, dtype, eps = sys.argv[1], np.dtype(sys.argv[2]).type, float(sys.argv[3])
    n = int(sys.argv[4]) if len(sys.argv) > 4 else 2 ** 20
    jax.config.update("jax_enable_x64", True)
    kernel = jfmm.kernels.get(name, **({"kappa": 2.0} if name == "yukawa" else {}))
    rng = np.random.default_rng(0)
    x = rng.random((n, 3)).astype(dtype)
    q = (rng.random(n) - 0.5).astype(dtype)
    xd, qd = jax.device_put(x), jax.device_put(q)
    (phi, _), first = timed(lambda: jfmm.fmm(xd, qd, kernel=kernel, eps=eps, gradient=True))
    _, second = timed(lambda: jfmm.fmm(xd, qd, kernel=kernel, eps=eps, gradient=True))
    pl, t_plan = timed(lambda: jfmm.plan(xd, kernel=kernel, eps=eps))
    _, apply1 = timed(lambda: pl.apply(qd, gradient=True))
    _, apply2 = timed(lambda: pl.apply(qd, gradient=True))
    s = rng.choice(n, 1000, replace=False)
    ref = jfmm.direct(x.astype(np.float64), q.astype(np.float64), x[s].astype(np.float64),
                      kernel=kernel)
    err = np.linalg.norm(np.asarray(phi, np.float64)[s] - ref) / np.linalg.norm(ref)
    flags = os.environ.get("XLA_FLAGS", "") or "(none)"
    print(f"| {kernel} | {np.dtype(dtype).name} | {eps:g} | {flags} | {first:.1f} | "
          f"{second * 1e3:.0f} | {(t_plan + apply1):.1f} | {apply2 * 1e3:.1f} | {err:.2e} |",
          flush=True)


if __name__ == "__main__":
    main()
