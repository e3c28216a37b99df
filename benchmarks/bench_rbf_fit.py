"""RBF fits at scale: jfmm.RBFInterpolator on 3D scattered Franke-type data.

    python benchmarks/bench_rbf_fit.py --sizes 10000 100000 1000000 \
        --kernels linear thin_plate_spline cubic --out rbf_fit.json

Per (kernel, N): the set-up (host geometry of the preconditioner and the
FMM plans), the first fit (compilation included), then the median of
`--repeat` fits after compilation (`fit` under jit: local inverses and the
preconditioned solve), the iteration count, the relative residual and the
relative RMS error at 2,000 new points against the function itself.
Uniform points in the unit cube, float64, tol 1e-6 by default. Writes JSON
(one record per run) for docs/BENCHMARKS.md. With the Nystrom
preconditioner, `rank_search_s` times its rank search alone (compiled);
the construction and `fit` rebuild the factor at the rank found.
"""
import argparse
import itertools
import json
import platform
import time

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)

import jfmm  # noqa: E402
from jfmm.rbf import system  # noqa: E402
from jfmm.rbf.interpolator import _preconditioner as choose_preconditioner  # noqa: E402
from jfmm.rbf.interpolator import kernel_for  # noqa: E402

EPSILON = {"gaussian": 5.0, "inverse_multiquadric": 5.0, "multiquadric": 5.0,
           "inverse_quadratic": 5.0}


def franke3d(x: np.ndarray) -> np.ndarray:
    """A 3D Franke-type test function on [0, 1]^3: two Gaussian bumps, a
    ridge and a dip (Franke's 2D function with z in the exponents)."""
    x0, x1, x2 = (9 * x[:, k] for k in range(3))
    return (0.75 * np.exp(-((x0 - 2) ** 2 + (x1 - 2) ** 2 + (x2 - 2) ** 2) / 4)
            + 0.75 * np.exp(-(x0 + 1) ** 2 / 49 - (x1 + 1) / 10 - (x2 + 1) / 10)
            + 0.5 * np.exp(-((x0 - 7) ** 2 + (x1 - 3) ** 2 + (x2 - 5) ** 2) / 4)
            - 0.2 * np.exp(-(x0 - 4) ** 2 - (x1 - 7) ** 2 - (x2 - 5) ** 2))


def data(n: int, seed: int = 0):
    """n scattered points, their values, 2,000 test points and their values."""
    rng = np.random.default_rng(seed)
    y = rng.random((n, 3))
    x = rng.random((2000, 3))
    return y, franke3d(y), x, franke3d(x)


def rms_error(pred, exact) -> float:
    return float(np.sqrt(np.mean((np.asarray(pred) - exact) ** 2) / np.mean(exact ** 2)))


def gradient_cost(interp, x, fx, repeat: int) -> dict:
    """Median times of a validation loss's value and gradient with respect
    to (epsilon, smoothing) against a fit, both compiled."""
    import jax.numpy as jnp

    def loss(p):
        return jnp.mean((interp.fit(epsilon=p[0], smoothing=p[1])(x) - fx) ** 2)

    p = jnp.asarray([float(interp.epsilon), 1e-8])
    grad = jax.jit(jax.value_and_grad(loss))
    fit = jax.jit(lambda p: interp.fit(epsilon=p[0], smoothing=p[1])._coeffs)
    out = {}
    for name, f in (("fit", fit), ("value_and_grad", grad)):
        jax.block_until_ready(f(p))
        times = []
        for _ in range(repeat):
            t = time.perf_counter()
            jax.block_until_ready(f(p))
            times.append(time.perf_counter() - t)
        out["grad_" + name + "_s"] = float(np.median(times))
    out["grad_over_fit"] = out["grad_value_and_grad_s"] / out["grad_fit_s"]
    return out


def run(kernel: str, n: int, tol: float, repeat: int, grad: bool = False,
        epsilon: float | None = None, smoothing: float = 0.0, maxiter: int = 300,
        preconditioner: str = "auto") -> dict:
    y, d, x, fx = data(n)
    eps = EPSILON.get(kernel) if epsilon is None else epsilon
    opts = dict(kernel=kernel, epsilon=eps, smoothing=smoothing, tol=tol, maxiter=maxiter,
                preconditioner=preconditioner)
    t0 = time.perf_counter()
    interp = jfmm.RBFInterpolator(y, d, **opts)
    jax.block_until_ready(interp._coeffs)
    first = time.perf_counter() - t0
    refit = jax.jit(lambda it, d: it.fit(d=d))
    jax.block_until_ready(refit(interp, d)._coeffs)
    times = []
    for _ in range(repeat):     # each refit's factor let go (at 10^6, 40% of memory)
        t = time.perf_counter()
        jax.block_until_ready(refit(interp, d)._coeffs)
        times.append(time.perf_counter() - t)
    t = time.perf_counter()
    jax.block_until_ready(jfmm.RBFInterpolator(y, d, **opts)._coeffs)
    construct = time.perf_counter() - t
    setup = construct
    if interp.method == "krylov":      # the host geometry and FMM plans alone
        st = interp._static
        t = time.perf_counter()
        levels = system.hierarchy(y, interp.y, interp.smoothing,
                                  kernel_for(kernel, interp.epsilon), interp.powers,
                                  st.fmm_eps, st.settings)
        jax.block_until_ready(levels)
        setup = time.perf_counter() - t
    search = 0.0
    if interp.preconditioner == "nystrom":     # the constructor's choice, compiled
        t = time.perf_counter()
        choose_preconditioner(preconditioner, None, kernel, interp.y, interp.smoothing,
                              kernel_for(kernel, eps))     # a Python float, as the constructor's
        search = time.perf_counter() - t
    t = time.perf_counter()
    pred = jax.block_until_ready(interp(x))
    evaluate = time.perf_counter() - t
    extra = gradient_cost(interp, x, fx, repeat) if grad else {}
    return dict(kernel=kernel, n=n, tol=tol, epsilon=eps, smoothing=smoothing,
                method=interp.method, preconditioner=interp.preconditioner,
                rank=interp.rank, rank_search_s=search, fmm_eps=interp._static.fmm_eps,
                **extra,
                levels=[int(l.points.shape[0]) for l in (interp._levels or [])],
                iterations=int(interp.iterations), residual=float(interp.residual),
                rms_error=rms_error(pred, fx), first_call_s=first,
                construct_s=construct, setup_s=setup,
                fit_s=float(np.median(times)), evaluate_2000_s=evaluate,
                device=str(jax.devices()[0].device_kind), jax=jax.__version__,
                host=platform.node())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--kernels", nargs="+", default=["linear", "thin_plate_spline"])
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--epsilon", type=float, nargs="+", default=[None],
                    help="shape parameters (default: 5 for the kernels that need one)")
    ap.add_argument("--smoothing", type=float, nargs="+", default=[0.0])
    ap.add_argument("--maxiter", type=int, default=300)
    ap.add_argument("--preconditioner", default="auto", choices=["auto", "schwarz", "nystrom"])
    ap.add_argument("--grad", action="store_true",
                    help="also time a validation loss's gradient in (epsilon, smoothing)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    for kernel, eps, smoothing, n in itertools.product(args.kernels, args.epsilon,
                                                       args.smoothing, args.sizes):
        try:
            row = run(kernel, n, args.tol, args.repeat, args.grad, eps, smoothing,
                      args.maxiter, args.preconditioner)
        except Exception as e:          # a failed solve is a result too
            row = dict(kernel=kernel, n=n, tol=args.tol, epsilon=eps, smoothing=smoothing,
                       error=str(e)[:300])
        print(json.dumps(row), flush=True)
        rows.append(row)
        if args.out:                    # after every row: a cut-off run keeps its rows
            with open(args.out, "w") as fh:
                json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
