"""RBF fits by peer codes on CPU, on the same data as bench_rbf_fit.py.

    pip install ferreus_rbf==0.3.0      # not a jfmm dependency
    python benchmarks/bench_rbf_peers.py --out docs/data/rbf_peers_cpu.json

Peers: scipy.interpolate.RBFInterpolator (dense LU solve, default arguments
but the kernel) at N = 2,000, 5,000, 10,000 (sizes whose dense system would
need more than ~8 GB are skipped), and ferreus_rbf (domain-decomposition
preconditioned FGMRES with a black-box FMM, defaults, relative tolerance
1e-6) at N = 10,000, 50,000, 200,000. Kernels 'linear' (-r, constant drift)
and 'thin_plate_spline' (r^2 log r, linear drift) in both codes. With
--jfmm-sizes, jfmm.RBFInterpolator at the same tolerance beside them.

Per (peer, kernel, N): the median wall-clock fit over `--repeat` fits (one
fit above N = 10,000), the evaluation at the 2,000 test points of
bench_rbf_fit.data and the relative RMS error there against the function
itself. Both peers use every core (OpenBLAS / rayon thread pools). Writes
JSON (one record per run) and prints each record as a JSON line.
"""
import argparse
import json
import os
import platform
import sys
import time

import numpy as np
import scipy
from scipy.interpolate import RBFInterpolator

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_rbf_fit import data, rms_error  # noqa: E402


def fit_scipy(y, d, kernel):
    return RBFInterpolator(y, d, kernel=kernel), {}


def fit_ferreus(y, d, kernel):
    import ferreus_rbf as fr
    from ferreus_rbf.interpolant_config import (Drift, FittingAccuracy, FittingAccuracyType,
                                                InterpolantSettings, RBFKernelType)
    from ferreus_rbf.progress import Progress
    kind, drift = {"linear": (RBFKernelType.Linear, Drift.Constant),
                   "thin_plate_spline": (RBFKernelType.ThinPlateSpline, Drift.Linear)}[kernel]
    settings = InterpolantSettings(kind, drift=drift, fitting_accuracy=FittingAccuracy(
        1e-6, FittingAccuracyType.Relative))
    events = []
    interp = fr.RBFInterpolator(y, d, settings, progress_callback=Progress(events.append))
    iters = [e for e in events if type(e).__name__ == "SolverIteration"]
    info = dict(iterations=len(iters), residual=iters[-1].residual if iters else None)
    return interp.evaluate, info


def fit_jfmm(y, d, kernel):
    import jax
    jax.config.update("jax_enable_x64", True)
    import jfmm
    interp = jfmm.RBFInterpolator(y, d, kernel=kernel, tol=1e-6)
    jax.block_until_ready(interp._coeffs)
    return interp, dict(method=interp.method, iterations=int(interp.iterations),
                        residual=float(interp.residual))


def version(peer):
    if peer == "scipy":
        return scipy.__version__
    if peer == "jfmm":
        import jax
        return f"jax {jax.__version__}"
    from importlib.metadata import version as v
    return v("ferreus_rbf")


def run(peer, kernel, n, repeat):
    fit = {"scipy": fit_scipy, "ferreus_rbf": fit_ferreus, "jfmm": fit_jfmm}[peer]
    y, d, x, fx = data(n)
    times, first = [], {}
    if peer == "jfmm":          # the process's first fit compiles: kept apart
        t = time.perf_counter()
        fit(y, d, kernel)
        first = dict(first_fit_s=time.perf_counter() - t)
    for _ in range(repeat if n <= 10_000 else 1):
        t = time.perf_counter()
        interp, info = fit(y, d, kernel)
        times.append(time.perf_counter() - t)
    t = time.perf_counter()
    pred = np.asarray(interp(x))
    evaluate = time.perf_counter() - t
    return dict(peer=peer, version=version(peer), kernel=kernel, n=n,
                fit_s=float(np.median(times)), fit_runs=len(times), **first,
                evaluate_2000_s=evaluate, rms_error=rms_error(pred, fx), **info,
                threads=os.cpu_count(), host=platform.node())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scipy-sizes", type=int, nargs="+", default=[2_000, 5_000, 10_000])
    ap.add_argument("--ferreus-sizes", type=int, nargs="+", default=[10_000, 50_000, 200_000])
    ap.add_argument("--jfmm-sizes", type=int, nargs="+", default=[],
                    help="jfmm.RBFInterpolator (tol 1e-6, float64) in the same run; its "
                         "first fit in the process (compilation included) is first_fit_s")
    ap.add_argument("--kernels", nargs="+", default=["linear", "thin_plate_spline"])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    for peer, sizes in (("scipy", args.scipy_sizes), ("ferreus_rbf", args.ferreus_sizes),
                        ("jfmm", args.jfmm_sizes)):
        for kernel in args.kernels:
            for n in sizes:
                if peer == "scipy" and 3 * 8 * (n + 4) ** 2 > 8e9:   # matrix, LU, slack
                    continue
                try:
                    row = run(peer, kernel, n, args.repeat)
                except Exception as e:          # a failed fit is a result too
                    row = dict(peer=peer, kernel=kernel, n=n, error=str(e)[:300])
                print(json.dumps(row), flush=True)
                rows.append(row)
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
