"""Reverse-mode gradients through jfmm.fmm against the forward call.

    python benchmarks/bench_grad.py --n 1048576 --dtype float32 --eps 1e-5

Two losses, each differentiated with jax.grad with respect to every input:

  energy   E(x, q) = 1/2 sum_i q_i phi(x_i)          (targets = sources)
  probe    L(x, q, y) = sum_j w_j phi(y_j)          (targets != sources)

beside the forward call with potential and gradient. Times are medians after
compilation (tree builds included: the backward pass builds the swapped
tree); temp memory is XLA's estimate for each compiled program. Errors are
relative L2 on 1,000 sampled points against a float64 direct sum:
dE/dq_i = phi(x_i), dE/dx_i = q_i grad phi(x_i); dL/dy_j = w_j grad phi(y_j),
dL/dq_i = psi(x_i), dL/dx_i = q_i grad psi(x_i) with psi the potential of
charges w at y.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jfmm  # noqa: E402
from bench_laplace import make_points, median_time, reference, rel  # noqa: E402


def compiled(f, *args):
    """(jitted f, seconds to compile + first run, temp bytes)."""
    jf = jax.jit(f)
    t0 = time.perf_counter()
    c = jf.lower(*args).compile()
    jax.block_until_ready(c(*args))
    first = time.perf_counter() - t0
    mem = c.memory_analysis()
    temp = getattr(mem, "temp_size_in_bytes", float("nan")) if mem is not None else float("nan")
    return c, first, temp


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2 ** 16)
    ap.add_argument("--dist", default="cube")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--eps", type=float, default=1e-5)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    dtype = np.dtype(args.dtype).type
    rng = np.random.default_rng(args.seed)
    n, eps = args.n, args.eps
    x = make_points(args.dist, n, rng).astype(dtype)
    y = make_points(args.dist, n, rng).astype(dtype)
    q = (rng.random(n) - 0.5).astype(dtype)
    w = (rng.random(n) - 0.5).astype(dtype)
    xd, yd, qd, wd = map(jnp.asarray, (x, y, q, w))
    print(f"# {jax.devices()[0].device_kind}, jax {jax.__version__}, {time.strftime('%Y-%m-%d')}, "
          f"N = M = {n:,} {args.dist}, {args.dtype}, eps {eps:g}")
    print("| call | first call s | median ms | ratio to forward | temp MB | errors |\n"
          "|---|---|---|---|---|---|")

    def forward(a, c):
        return jfmm.fmm(a, c, eps=eps, gradient=True)

    def energy(a, c):
        return 0.5 * jnp.sum(c * jfmm.fmm(a, c, eps=eps))

    def probe(a, c, b):
        return jnp.sum(wd * jfmm.fmm(a, c, b, eps=eps))

    rows = []
    f, first, temp = compiled(forward, xd, qd)
    t_fwd = median_time(f, xd, qd, repeats=args.repeats)
    phi, grad = f(xd, qd)
    rows.append(("forward, phi + grad (targets = sources)", first, t_fwd, temp, (phi, grad)))
    ge, first, temp = compiled(jax.grad(energy, argnums=(0, 1)), xd, qd)
    rows.append(("grad of energy w.r.t. x, q", first,
                 median_time(ge, xd, qd, repeats=args.repeats), temp, ge(xd, qd)))
    gp, first, temp = compiled(jax.grad(probe, argnums=(0, 1, 2)), xd, qd, yd)
    rows.append(("grad of probe loss w.r.t. x, q, y", first,
                 median_time(gp, xd, qd, yd, repeats=args.repeats), temp, gp(xd, qd, yd)))

    s = rng.choice(n, size=min(1000, n), replace=False)
    x64, y64, q64, w64 = (v.astype(np.float64) for v in (x, y, q, w))
    ref, gref = reference(x64, q64, x64[s])                  # phi, grad phi at x_s
    psi, gpsi = reference(y64, w64, x64[s])                  # adjoint field at x_s
    _, gy = reference(x64, q64, y64[s])                      # grad phi at y_s
    errs = [
        f"phi {rel(phi[s], ref):.1e}, grad {rel(grad[s], gref):.1e}",
        f"dE/dx {rel(rows[1][4][0][s], q64[s, None] * gref):.1e}, "
        f"dE/dq {rel(rows[1][4][1][s], ref):.1e}",
        f"dL/dx {rel(rows[2][4][0][s], q64[s, None] * gpsi):.1e}, "
        f"dL/dq {rel(rows[2][4][1][s], psi):.1e}, "
        f"dL/dy {rel(rows[2][4][2][s], w64[s, None] * gy):.1e}",
    ]
    for (name, first, t, temp, _), err in zip(rows, errs):
        print(f"| {name} | {first:.1f} | **{t * 1e3:.2f}** | {t / t_fwd:.2f} | "
              f"{temp / 2 ** 20:.0f} | {err} |", flush=True)


if __name__ == "__main__":
    main()
