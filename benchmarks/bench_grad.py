"""Reverse-mode gradients through jfmm.fmm (or jfmm.direct) against the
forward call.

    python benchmarks/bench_grad.py --n 1048576 --dtype float32 --eps 1e-5 \
        --out docs/data/grad_float32.json
    python benchmarks/bench_grad.py --sum direct --n 131072 --out docs/data/grad_direct.json

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

--sum direct differentiates `jfmm.direct` instead (eps unused).

JSON row fields: loss (forward, energy or probe), sum, call, n, kernel, dim,
points, dtype, eps, first_call_s (compilation + first run), time_ms, ratio
(to the forward call), temp_mb, and the errors of that call: err_phi,
err_grad (forward), err_dx, err_dq (energy, probe), err_dy (probe).
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

# common puts the checkout on sys.path, before jfmm is imported.
from common import make_points, median_time, parser, reference, rel, sample, Table

import jfmm

# Error fields and their names in the table, per loss.
ERRORS = {"forward": (("err_phi", "phi"), ("err_grad", "grad")),
          "energy": (("err_dx", "dE/dx"), ("err_dq", "dE/dq")),
          "probe": (("err_dx", "dL/dx"), ("err_dq", "dL/dq"), ("err_dy", "dL/dy"))}
COLUMNS = [
    ("call", "call", ""), ("first_call_s", "first call s", ".1f"),
    ("time_ms", "median ms", lambda r: f"**{r['time_ms']:.2f}**"),
    ("ratio", "ratio to forward", ".2f"), ("temp_mb", "temp MB", ".0f"),
    ("errors", "errors", lambda r: ", ".join(f"{name} {r[key]:.1e}"
                                             for key, name in ERRORS[r["loss"]])),
]


def compiled(f, *args):
    """(compiled jit of f, seconds to compile + first run, temp bytes or NaN)."""
    t0 = time.perf_counter()
    c = jax.jit(f).lower(*args).compile()
    jax.block_until_ready(c(*args))
    first = time.perf_counter() - t0
    mem = c.memory_analysis()
    temp = getattr(mem, "temp_size_in_bytes", float("nan")) if mem is not None else float("nan")
    return c, first, temp


def main():
    ap = parser(__doc__)
    ap.add_argument("--n", type=int, default=2 ** 16)
    ap.add_argument("--dist", default="cube", help="points: cube, sphere or plummer")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--eps", type=float, default=1e-5)
    ap.add_argument("--sum", default="fmm", choices=("fmm", "direct"))
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
    s = sample(rng, n)
    x64, y64, q64, w64 = (v.astype(np.float64) for v in (x, y, q, w))
    ref, gref = reference(x64, q64, x64[s])                  # phi, grad phi at x_s
    psi, gpsi = reference(y64, w64, x64[s])                  # adjoint field at x_s
    _, gy = reference(x64, q64, y64[s])                      # grad phi at y_s

    def summed(*a, **kw):
        if args.sum == "direct":
            return jfmm.direct(*a, **kw)
        return jfmm.fmm(*a, eps=eps, **kw)

    def forward(a, c):
        return summed(a, c, gradient=True)

    def energy(a, c):
        return 0.5 * jnp.sum(c * summed(a, c))

    def probe(a, c, b):
        return jnp.sum(wd * summed(a, c, b))

    # (loss, description, function, arguments, errors of its outputs)
    calls = [
        ("forward", "forward, phi + grad (targets = sources)", forward, (xd, qd),
         lambda o: dict(err_phi=rel(o[0][s], ref), err_grad=rel(o[1][s], gref))),
        ("energy", "grad of energy w.r.t. x, q", jax.grad(energy, argnums=(0, 1)), (xd, qd),
         lambda o: dict(err_dx=rel(o[0][s], q64[s, None] * gref), err_dq=rel(o[1][s], ref))),
        ("probe", "grad of probe loss w.r.t. x, q, y", jax.grad(probe, argnums=(0, 1, 2)),
         (xd, qd, yd),
         lambda o: dict(err_dx=rel(o[0][s], q64[s, None] * gpsi), err_dq=rel(o[1][s], psi),
                        err_dy=rel(o[2][s], w64[s, None] * gy))),
    ]
    table = Table(f"gradients through jfmm.{args.sum}, N = M = {n:,} {args.dist}, {args.dtype}, "
                  f"eps {eps:g}", COLUMNS)
    t_fwd = None
    for loss, name, f, fargs, errors in calls:
        c, first, temp = compiled(f, *fargs)
        t = median_time(c, *fargs, repeats=args.repeats)
        t_fwd = t_fwd or t
        out = [np.asarray(o) for o in c(*fargs)]
        table.add(dict(loss=loss, sum=args.sum, call=name, n=n, kernel="Laplace3D", dim=3, points=args.dist,
                       dtype=args.dtype, eps=eps, first_call_s=first, time_ms=t * 1e3,
                       ratio=t / t_fwd, temp_mb=temp / 2 ** 20, **errors(out)))
    table.save(args.out)


if __name__ == "__main__":
    main()
