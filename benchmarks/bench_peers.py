"""jfmm beside jaxFMM (and the direct sum) in one process, same points and charges.

    python benchmarks/bench_peers.py --n 1048576 --jaxfmm-path peers/jaxfmm \
        --out docs/data/peers_float32.json
    python benchmarks/bench_peers.py --n 1048576 --x64 --eps 1e-10 --tols 1e-6 \
        --jaxfmm-path peers/jaxfmm --out docs/data/peers_float64.json
    python benchmarks/bench_peers.py --n 1048576 --points plummer --eps 1e-5 \
        --tols 2e-3 --jaxfmm-path peers/jaxfmm --out docs/data/peers_plummer.json

jaxFMM is not a dependency: pass the folder that holds its package (an
unpacked wheel works); without --jaxfmm-path only jfmm and the direct sum
run. Points: `common.make_points` (--points, the uniform cube by default),
charges uniform in [-0.5, 0.5). On the cube jfmm runs as a jitted
`jfmm.fmm` (traced points: the uniform tree); on other points as
`jfmm.plan(points, eps, tree="auto")` and a jitted `plan.update(points)
.apply(charges)`, so that clustered points get the adaptive tree, rebuilt
in every timed call (its first-call time includes the plan). Per code and accuracy
setting: the first call (setup or compile, plus run), the median time after
it, and the relative L2 error of the potential (and of the gradient where
computed) on 1,000 sampled targets against a float64 direct sum. jaxFMM's
kernel is 1/(4 pi r); its results are multiplied by 4 pi before comparing.
jaxFMM builds its tree once per geometry in its setup (`jaxfmm.plan`), so
its median excludes the tree build; jfmm's includes it. float32 unless --x64
(jaxFMM needs x64 below its float32 floor of ~1.5e-3).

JSON row fields: code (jfmm, jaxFMM, jfmm.direct), version, setting, eps
(jfmm) or err_tol (jaxFMM), outputs (phi; phi, grad; -grad), n, kernel,
dim, points, dtype, first_call_s (jaxFMM: its setup, plan and first call),
time_ms, err_phi, err_grad, error (a failed call's message).
"""
from __future__ import annotations

import functools
import math
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

# common puts the checkout on sys.path, before jfmm is imported.
from common import (floats, first_time, make_points, median_time, parser, reference, rel,
                    sample, Table)

import jfmm


def _first(r: dict) -> str:
    if r.get("error"):
        return f"failed: {r['error']}"
    if r["first_call_s"] is None:
        return "-"
    return f"{r['first_call_s']:.1f}" + (" (setup)" if r["code"] == "jaxFMM" else "")


COLUMNS = [
    ("code", "code", lambda r: " ".join(v for v in (r["code"], r.get("version")) if v)),
    ("setting", "setting", ""), ("outputs", "outputs", ""),
    ("first_call_s", "first call s", _first), ("time_ms", "median ms", ".2f"),
    ("err_phi", "err phi", ".2e"), ("err_grad", "err grad", ".2e"),
]


def load_jaxfmm(path: str):
    """The jaxfmm module from the folder `path`, or exit saying why not."""
    if not os.path.isdir(path):
        sys.exit(f"--jaxfmm-path {path!r}: no such folder (it should hold the jaxfmm package)")
    sys.path.insert(0, path)
    try:
        import jaxfmm
    except ImportError as e:
        sys.exit(f"--jaxfmm-path {path!r}: cannot import jaxfmm ({e})")
    return jaxfmm


def jaxfmm_version(jaxfmm) -> str:
    from importlib import metadata
    try:
        return metadata.version("jaxfmm")
    except metadata.PackageNotFoundError:
        return getattr(jaxfmm, "__version__", "?")


def main():
    ap = parser(__doc__)
    ap.add_argument("--n", type=int, default=2 ** 16)
    ap.add_argument("--x64", action="store_true", help="float64 for both codes")
    ap.add_argument("--eps", default="1e-5,1e-3", help="jfmm eps values")
    ap.add_argument("--tols", default="5e-3,2e-3", help="jaxFMM err_tol values")
    ap.add_argument("--jaxfmm-path", default=None, help="folder holding the jaxfmm package")
    ap.add_argument("--phi-only", action="store_true", help="skip the gradient / field runs")
    ap.add_argument("--points", default="cube", help="point set (common.make_points)")
    args = ap.parse_args()
    jaxfmm = load_jaxfmm(args.jaxfmm_path) if args.jaxfmm_path else None
    if args.x64:
        jax.config.update("jax_enable_x64", True)
    dt = np.float64 if args.x64 else np.float32
    rng = np.random.default_rng(args.seed)
    n = args.n
    x = make_points(args.points, n, rng).astype(dt)
    q = (rng.random(n) - 0.5).astype(dt)
    s = sample(rng, n)
    ref_phi, ref_grad = reference(x.astype(np.float64), q.astype(np.float64),
                                  x[s].astype(np.float64))
    xd, qd = jnp.asarray(x), jnp.asarray(q)
    base = dict(n=n, kernel="Laplace3D", dim=3, points=args.points, dtype=np.dtype(dt).name)
    table = Table(f"jfmm beside jaxFMM, N = {n:,}, {args.points} points, {np.dtype(dt).name}",
                  COLUMNS)
    if jaxfmm is None:
        print("(jaxFMM not run: no --jaxfmm-path)", flush=True)
    gradients = (False,) if args.phi_only else (False, True)

    for eps in floats(args.eps):
        for gradient in gradients:
            if args.points == "cube":
                f = jax.jit(lambda a, c, e=eps, g=gradient: jfmm.fmm(a, c, eps=e, gradient=g))
                out, first = first_time(f, xd, qd)
            else:
                pl, first_plan = first_time(lambda e=eps, g=gradient: jfmm.plan(
                    xd, eps=e, gradient=g, tree="auto"))
                run = jax.jit(lambda pl, a, c, g=gradient: pl.update(a).apply(c, gradient=g))
                f = functools.partial(run, pl)
                out, first = first_time(f, xd, qd)
                first += first_plan
            t = median_time(f, xd, qd, repeats=args.repeats)
            phi, grad = out if gradient else (out, None)
            table.add(dict(code="jfmm", version=None, setting=f"eps {eps:g}", eps=eps,
                           outputs="phi, grad" if gradient else "phi", **base,
                           first_call_s=first, time_ms=t * 1e3,
                           err_phi=rel(np.asarray(phi)[s], ref_phi),
                           err_grad=rel(np.asarray(grad)[s], ref_grad) if gradient else None))

    if jaxfmm is not None:
        version = jaxfmm_version(jaxfmm)
        for tol in floats(args.tols):
            for field in gradients:
                row = dict(code="jaxFMM", version=version, setting=f"err_tol {tol:g}",
                           err_tol=tol, outputs="-grad" if field else "phi", **base,
                           first_call_s=None, time_ms=None, err_phi=None, err_grad=None)
                try:
                    f, first = first_time(lambda: jaxfmm.plan(xd, err_tol=tol, field=field,
                                                              verbose=False))
                    out, first_apply = first_time(f, qd)
                except Exception as e:  # report and go on: one run must give every number
                    table.add(dict(row, error=str(e).splitlines()[0][:150]))
                    continue
                t = median_time(f, qd, repeats=args.repeats)
                val = 4 * math.pi * np.asarray(out, np.float64)
                if field:   # jaxFMM's field is -grad phi
                    row["err_grad"] = rel(-val[s], ref_grad)
                else:
                    row["err_phi"] = rel(val[s], ref_phi)
                table.add(dict(row, first_call_s=first + first_apply, time_ms=t * 1e3))

    if n <= 2 ** 20:
        f = jax.jit(lambda a, c: jfmm.direct(a, c, gradient=True))
        t = median_time(f, xd, qd, repeats=3)
        phi, grad = f(xd, qd)
        table.add(dict(code="jfmm.direct", version=None, setting="all pairs",
                       outputs="phi, grad", **base, first_call_s=None, time_ms=t * 1e3,
                       err_phi=rel(np.asarray(phi)[s], ref_phi),
                       err_grad=rel(np.asarray(grad)[s], ref_grad)))
    table.save(args.out)


if __name__ == "__main__":
    main()
