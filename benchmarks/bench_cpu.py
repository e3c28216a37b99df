"""jfmm on the CPU beside FMM3D (fmm3dpy), one fresh process per point set.

    pip install fmm3dpy
    python benchmarks/bench_cpu.py --sizes 16,18 --points cube,plummer \
        --out docs/data/cpu_fmm3d.json

3D Laplace, potential and gradient, float64 (jax_enable_x64), eps 1e-6 by
default, charges uniform in [-0.5, 0.5]. Each (points, N) runs in a
process of its own with jfmm's compilation cache off (JFMM_COMPILATION_CACHE=0),
so "first s" is what a script's first call costs: configuration,
compilation, tree and sums. Then, in that process: the eager call again
with new charges on the same points (from the third call on: the plan
the second call makes, what a loop of eager calls costs), `jax.jit` of the call (first call and warm median),
and fmm3dpy's lfmm3d on the same points and charges (median). Errors on
1,000 sampled targets against a float64 numpy direct sum.

JSON row fields: points, n, eps, family, order, depth, first_s,
eager_ms, jit_first_s, jit_ms, fmm3d_ms, err_phi, err_grad, fmm3d_err_phi,
fmm3d_err_grad (jfmm's errors are the eager call's).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np

# common puts the checkout on sys.path, before jfmm is imported.
from common import Table, make_points, parser, reference, rel, sample

COLUMNS = [
    ("points", "points", ""), ("n", "N", ","), ("eps", "eps", "g"),
    ("order", "family, order, depth",
     lambda r: f"{r['family']}, {r['order']}, {r['depth']}"),
    ("first_s", "first call s", ".1f"), ("eager_ms", "eager, new charges ms", ".0f"),
    ("jit_first_s", "jit first s", ".1f"), ("jit_ms", "jit ms", ".0f"),
    ("fmm3d_ms", "fmm3dpy ms", ".0f"),
    ("err_phi", "err phi, grad", lambda r: f"{r['err_phi']:.1e}, {r['err_grad']:.1e}"),
    ("fmm3d_err_phi", "fmm3dpy err phi, grad",
     lambda r: f"{r['fmm3d_err_phi']:.1e}, {r['fmm3d_err_grad']:.1e}"),
]


def measure(kind: str, n: int, eps: float, repeats: int, seed: int) -> dict:
    """One point set, in this (fresh) process."""
    import fmm3dpy
    import jax
    jax.config.update("jax_enable_x64", True)
    import jfmm

    rng = np.random.default_rng(seed)
    x = make_points(kind, n, rng)
    q, q2 = rng.random(n) - 0.5, rng.random(n) - 0.5
    xd, qd, qd2 = (jax.device_put(a) for a in (x, q, q2))
    s = sample(rng, n)

    def timed(f, *args):
        t0 = time.perf_counter()
        out = jax.block_until_ready(f(*args))
        return out, time.perf_counter() - t0

    call = lambda a, b: jfmm.fmm(a, b, eps=eps, gradient=True)  # noqa: E731
    (phi, grad), first = timed(call, xd, qd)
    timed(call, xd, qd2)                   # the second call makes the points' plan
    eager = np.median([timed(call, xd, c)[1] for c in [qd, qd2] * repeats])
    jitted = jax.jit(call)
    _, jit_first = timed(jitted, xd, qd)
    jit = np.median([timed(jitted, xd, qd)[1] for _ in range(repeats)])

    src, charges = np.ascontiguousarray(x.T), np.ascontiguousarray(q)
    out = fmm3dpy.lfmm3d(eps=eps, sources=src, charges=charges, pg=2)
    scale = 4 * np.pi                      # FMM3D sums q / (4 pi r); jfmm q / r
    fmm3d = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fmm3dpy.lfmm3d(eps=eps, sources=src, charges=charges, pg=2)
        fmm3d.append(time.perf_counter() - t0)

    ref_phi, ref_grad = reference(x, q, x[s])
    pl = jfmm.plan(xd, eps=eps, gradient=True)
    return dict(points=kind, n=n, eps=eps, family=pl.family, order=pl.order,
                depth=pl.tree.depth, first_s=first, eager_ms=1e3 * eager,
                jit_first_s=jit_first, jit_ms=1e3 * jit, fmm3d_ms=1e3 * float(np.median(fmm3d)),
                err_phi=rel(np.asarray(phi)[s], ref_phi), err_grad=rel(np.asarray(grad)[s], ref_grad),
                fmm3d_err_phi=rel(scale * out.pot[s], ref_phi),
                fmm3d_err_grad=rel(scale * out.grad[:, s].T, ref_grad))


def main():
    ap = parser(__doc__)
    ap.add_argument("--sizes", default="16", help="log2 N, comma-separated")
    ap.add_argument("--points", default="cube,plummer")
    ap.add_argument("--eps", type=float, default=1e-6)
    ap.add_argument("--one", default=None, help="(internal) kind:n, measured in this process")
    args = ap.parse_args()
    if args.one:
        kind, n = args.one.split(":")
        print(json.dumps(measure(kind, int(n), args.eps, args.repeats, args.seed)))
        return
    os.environ["JAX_PLATFORMS"] = "cpu"
    table = Table(f"3D Laplace on the CPU beside fmm3dpy, float64, eps {args.eps:g}", COLUMNS)
    env = dict(os.environ, JFMM_COMPILATION_CACHE="0", JAX_PLATFORMS="cpu")
    for log_n in (int(v) for v in args.sizes.split(",")):
        for kind in args.points.split(","):
            run = subprocess.run([sys.executable, __file__, "--one", f"{kind}:{2 ** log_n}",
                                  "--eps", str(args.eps), "--repeats", str(args.repeats),
                                  "--seed", str(args.seed)],
                                 env=env, capture_output=True, text=True)
            if run.returncode:
                print(run.stderr[-3000:], file=sys.stderr)
                continue
            table.add(json.loads(run.stdout.strip().splitlines()[-1]))
    table.save(args.out)


if __name__ == "__main__":
    main()
