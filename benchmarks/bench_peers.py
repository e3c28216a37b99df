"""jfmm beside jaxFMM (and the direct sum) in one process, same points and charges.

    python benchmarks/bench_peers.py --n 1048576 --jaxfmm-path peers/jaxfmm
    python benchmarks/bench_peers.py --n 1048576 --x64 --eps 1e-10 --tols 1e-6

jaxFMM is not a dependency: pass the folder that holds its package (an
unpacked wheel works). Uniform cube, charges uniform in [-0.5, 0.5).
Per code and accuracy setting: the first call (setup or compile, plus run),
the median time after it, and the relative L2 error of the potential (and of
the gradient where computed) on 1,000 sampled targets against a float64
direct sum. jaxFMM's kernel is 1/(4 pi r); its results are multiplied by
4 pi before comparing. jaxFMM builds its tree once per geometry in its setup
(`jaxfmm.plan`), so its median excludes the tree build; jfmm's includes it.
float32 unless --x64 (jaxFMM needs x64 below its float32 floor of ~1.5e-3).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jfmm  # noqa: E402
from bench_laplace import median_time, reference, rel  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2 ** 16)
    ap.add_argument("--x64", action="store_true", help="float64 for both codes")
    ap.add_argument("--eps", default="1e-5,1e-3", help="jfmm eps values")
    ap.add_argument("--tols", default="5e-3,2e-3", help="jaxFMM err_tol values")
    ap.add_argument("--jaxfmm-path", default=None, help="folder holding the jaxfmm package")
    ap.add_argument("--phi-only", action="store_true", help="skip the gradient / field runs")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.x64:
        jax.config.update("jax_enable_x64", True)
    dt = np.float64 if args.x64 else np.float32
    rng = np.random.default_rng(args.seed)
    n = args.n
    x = rng.random((n, 3)).astype(dt)
    q = (rng.random(n) - 0.5).astype(dt)
    sample = rng.choice(n, 1000, replace=False)
    ref_phi, ref_grad = reference(x.astype(np.float64), q.astype(np.float64),
                                  x[sample].astype(np.float64))
    xd, qd = jnp.asarray(x), jnp.asarray(q)
    print(f"# {jax.devices()[0].device_kind}, jax {jax.__version__}, "
          f"{time.strftime('%Y-%m-%d')}, N = {n:,} uniform cube, {np.dtype(dt).name}\n")
    print("| code | setting | outputs | first call s | median ms | err phi | err grad |")
    print("|---|---|---|---|---|---|---|")

    for eps in map(float, args.eps.split(",")):
        for gradient in (False,) if args.phi_only else (False, True):
            f = jax.jit(lambda a, c, e=eps, g=gradient: jfmm.fmm(a, c, eps=e, gradient=g))
            t0 = time.perf_counter()
            out = jax.block_until_ready(f(xd, qd))
            first = time.perf_counter() - t0
            t = median_time(f, xd, qd, repeats=args.repeats)
            phi, grad = out if gradient else (out, None)
            eg = f"{rel(np.asarray(grad)[sample], ref_grad):.2e}" if gradient else "-"
            print(f"| jfmm | eps {eps:g} | {'phi, grad' if gradient else 'phi'} | {first:.1f} "
                  f"| {t * 1e3:.2f} | {rel(np.asarray(phi)[sample], ref_phi):.2e} | {eg} |",
                  flush=True)

    if args.jaxfmm_path:
        sys.path.insert(0, args.jaxfmm_path)
        import jaxfmm
        for tol in map(float, args.tols.split(",")):
            for field in (False,) if args.phi_only else (False, True):
                t0 = time.perf_counter()
                try:
                    f = jaxfmm.plan(xd, err_tol=tol, field=field, verbose=False)
                    out = jax.block_until_ready(f(qd))
                except Exception as e:  # report and go on: one run must give every number
                    print(f"| jaxFMM {jaxfmm_version()} | err_tol {tol:g} | "
                          f"{'-grad' if field else 'phi'} | failed: {str(e).splitlines()[0][:150]} |")
                    continue
                first = time.perf_counter() - t0
                t = median_time(f, qd, repeats=args.repeats)
                val = 4 * math.pi * np.asarray(out, np.float64)
                if field:   # jaxFMM's field is -grad phi
                    ep, eg = "-", f"{rel(-val[sample], ref_grad):.2e}"
                else:
                    ep, eg = f"{rel(val[sample], ref_phi):.2e}", "-"
                print(f"| jaxFMM {jaxfmm_version()} | err_tol {tol:g} | "
                      f"{'-grad' if field else 'phi'} | {first:.1f} (setup) | {t * 1e3:.2f} "
                      f"| {ep} | {eg} |", flush=True)

    f = jax.jit(lambda a, c: jfmm.direct(a, c, gradient=True))
    if n <= 2 ** 20:
        t = median_time(f, xd, qd, repeats=3)
        phi, grad = f(xd, qd)
        print(f"| jfmm.direct | all pairs | phi, grad | - | {t * 1e3:.2f} | "
              f"{rel(np.asarray(phi)[sample], ref_phi):.2e} | "
              f"{rel(np.asarray(grad)[sample], ref_grad):.2e} |")


def jaxfmm_version():
    from importlib import metadata
    try:
        return metadata.version("jaxfmm")
    except metadata.PackageNotFoundError:
        import jaxfmm
        return getattr(jaxfmm, "__version__", "?")


if __name__ == "__main__":
    main()
