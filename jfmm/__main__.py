"""`python -m jfmm`: run the 3D Laplace FMM on random points and check it.

2^20 points on a GPU, 2^16 on a CPU (override with --n). Prints the first-call
time (compile + run), the median time after compilation, and the relative L2
error of potential and gradient on 1,000 sampled targets against a float64
direct sum of the same (rounded) inputs.

On a GPU the first call compiles without XLA's Triton GEMM autotuning, as
every jitted program of a process that imported jfmm (`jfmm._xla`; README,
"On a GPU").
"""
from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

import jfmm
from jfmm import _reference


def main(argv=None):
    gpu = jax.default_backend() != "cpu"
    ap = argparse.ArgumentParser(prog="python -m jfmm", description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2 ** 20 if gpu else 2 ** 16)
    ap.add_argument("--eps", type=float, default=1e-5)
    ap.add_argument("--float64", action="store_true", help="enable x64 and use float64")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.float64:
        jax.config.update("jax_enable_x64", True)
    dtype = np.float64 if args.float64 else np.float32

    rng = np.random.default_rng(args.seed)
    x = rng.random((args.n, 3)).astype(dtype)
    q = (rng.random(args.n) - 0.5).astype(dtype)
    xd, qd = jnp.asarray(x), jnp.asarray(q)
    f = jax.jit(lambda a, b: jfmm.fmm(a, b, eps=args.eps, gradient=True))

    t0 = time.perf_counter()
    phi, grad = jax.block_until_ready(f(xd, qd))
    first = time.perf_counter() - t0
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        jax.block_until_ready(f(xd, qd))
        times.append(time.perf_counter() - t0)

    sample = rng.choice(args.n, size=min(1000, args.n), replace=False)
    ref, gref = _reference.laplace3d(x, q, x[sample])
    err = np.linalg.norm(np.asarray(phi)[sample] - ref) / np.linalg.norm(ref)
    gerr = np.linalg.norm(np.asarray(grad)[sample] - gref) / np.linalg.norm(gref)
    print(f"jfmm {jfmm.__version__} on {jax.devices()[0].device_kind} (jax {jax.__version__})")
    print(f"N = {args.n:,} uniform cube, mixed-sign charges, {np.dtype(dtype).name}, "
          f"eps = {args.eps:g}, potential + gradient")
    if gpu:
        print(f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')}")
    print(f"first call (compile + run): {first:.2f} s")
    print(f"median of 5 after compile:  {np.median(times) * 1e3:.1f} ms")
    print(f"relative L2 error on {len(sample)} targets: potential {err:.2e}, gradient {gerr:.2e}")
    ok = err <= args.eps
    print("OK: error within eps" if ok else "FAIL: error above eps")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
