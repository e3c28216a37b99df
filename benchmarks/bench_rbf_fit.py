"""RBF fits at scale: jfmm.RBFInterpolator on 3D scattered Franke-type data.

    python benchmarks/bench_rbf_fit.py --sizes 10000 100000 1000000 \
        --kernels linear thin_plate_spline cubic --out rbf_fit.json
    python benchmarks/bench_rbf_fit.py --user --sizes 100000 1000000 \
        --points uniform boreholes terrain --out rbf_user.json

--user measures what a user's script sees, each case in a fresh process
(`user_case`): the first constructor (compilation included, with the time
spent compiling beside it), a second constructor on new data of the same
size, an eager refit, evaluation at 10^4 and 10^6 new points (first call
of the size and warm), the iterations, the RMS error at the 10^4 points
and the peak device memory (of the first constructor, and of the whole
process, whose second constructor and stages hold two fits at once);
with --second-process each case runs again in a new process sharing the
first one's persistent compilation cache.

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
import os
import platform
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)

import jfmm  # noqa: E402
from jfmm.rbf import system  # noqa: E402
from jfmm.rbf.interpolator import _preconditioner as choose_preconditioner  # noqa: E402
from jfmm.rbf.interpolator import _lift_powers, kernel_for  # noqa: E402

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


def user_data(n: int, points: str, rng):
    """n sites of `points` ('uniform' in the unit cube; 'boreholes': along
    2,000 vertical lines; 'terrain': on a surface z = h(x, y)) and the
    issue's test function f = sin(3x) cos(2y) + z^2 at them."""
    if points == "uniform":
        y = rng.random((n, 3))
    elif points == "boreholes":
        heads = rng.random((2000, 2))
        y = np.concatenate([heads[rng.integers(0, 2000, n)], rng.random((n, 1))], axis=1)
    elif points == "terrain":
        xy = rng.random((n, 2))
        y = np.concatenate([xy, 0.5 + 0.2 * (np.sin(3 * xy[:, :1]) * np.cos(2 * xy[:, 1:]))],
                           axis=1)
    else:
        raise ValueError(points)
    return y, user_function(y)


def user_function(x):
    return np.sin(3 * x[:, 0]) * np.cos(2 * x[:, 1]) + x[:, 2] ** 2


def user_case(kernel: str, n: int, points: str, tol: float) -> dict:
    """One fresh process's calls, as a user's script makes them."""
    from jax import monitoring
    compiled = [0.0]

    def listen(event, duration, **_):
        if event.endswith("backend_compile_duration") or event.endswith("trace_duration"):
            compiled[0] += duration
    monitoring.register_event_duration_secs_listener(listen)
    rng = np.random.default_rng(0)
    out = dict(kernel=kernel, n=n, points=points, tol=tol)

    def timed(name, f):
        before, t = compiled[0], time.perf_counter()
        r = jax.block_until_ready(f())
        out[name + "_s"] = time.perf_counter() - t
        out[name + "_compile_s"] = compiled[0] - before
        return r

    y, d = user_data(n, points, rng)
    it = timed("construct", lambda: jfmm.RBFInterpolator(y, d, kernel=kernel, tol=tol))
    # The first constructor's peak alone: the later calls hold two fits at once.
    stats = jax.devices()[0].memory_stats() or {}
    out["construct_peak_gb"] = stats.get("peak_bytes_in_use", 0) / 2 ** 30
    y2, d2 = user_data(n, points, rng)
    it = timed("construct_again", lambda: jfmm.RBFInterpolator(y2, d2, kernel=kernel,
                                                               tol=tol))
    out.update(iterations=int(it.iterations), residual=float(it.residual),
               method=it.method, levels=[int(l.points.shape[0]) for l in it._levels or []])
    timed("refit", lambda: it.fit(d=2 * d2 + 1)._coeffs)
    if it.method == "krylov":          # the stages of construct_again
        st, k = it._static, kernel_for(kernel, it.epsilon)
        exponents = _lift_powers(it.powers)
        timed("setup", lambda: system.hierarchy(np.asarray(it._sites), it._sites,
                                                it.smoothing, k, exponents, st.fmm_eps,
                                                st.settings))
        inverses = jax.jit(lambda levels, k, s: system.with_parameters(levels, k, s,
                                                                       exponents, st.settings))
        timed("local_inverses_first", lambda: inverses(it._levels, k, it.smoothing))
        timed("local_inverses", lambda: inverses(it._levels, k, it.smoothing))
    for m, repeat in ((10_000, 5), (1_000_000, 2)):
        x = rng.random((m, 3)) if points == "uniform" else user_data(m, points, rng)[0]
        pred = timed(f"evaluate_{m}_first", lambda: it(x))
        times = []
        for _ in range(repeat):
            t = time.perf_counter()
            jax.block_until_ready(it(x))
            times.append(time.perf_counter() - t)
        out[f"evaluate_{m}_s"] = float(np.median(times))
        if m == 10_000:
            out["rms_error"] = rms_error(pred, user_function(x))
    out["field"] = it.__dict__.get("_field_cache") is not None    # evaluation's path
    stats = jax.devices()[0].memory_stats() or {}
    out.update(peak_memory_gb=stats.get("peak_bytes_in_use", 0) / 2 ** 30,
               device=str(jax.devices()[0].device_kind), jax=jax.__version__,
               host=platform.node())
    return out


def user_runs(args) -> list:
    """Every (kernel, N, points) case in a fresh process (twice with
    --second-process, the second sharing the first's compilation cache)."""
    rows = []
    for kernel, n, points in itertools.product(args.kernels, args.sizes, args.points):
        cache = tempfile.mkdtemp(prefix="jfmm-cache-")
        for run in range(2 if args.second_process else 1):
            t = time.perf_counter()
            env = dict(os.environ, JFMM_COMPILATION_CACHE=cache)
            done = subprocess.run([sys.executable, __file__, "--user-case", kernel, str(n),
                                   points, str(args.tol)], env=env, capture_output=True,
                                  text=True)
            lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
            row = (json.loads(lines[-1]) if lines else
                   dict(kernel=kernel, n=n, points=points, error=done.stderr[-300:]))
            row.update(process=run, process_s=time.perf_counter() - t)
            print(json.dumps(row), flush=True)
            rows.append(row)
            if args.out:
                with open(args.out, "w") as fh:
                    json.dump(rows, fh, indent=1)
    return rows


def main():
    if sys.argv[1:2] == ["--user-case"]:
        kernel, n, points, tol = sys.argv[2:6]
        print(json.dumps(user_case(kernel, int(n), points, float(tol))), flush=True)
        return
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
    ap.add_argument("--user", action="store_true",
                    help="what a user's script sees, each case in a fresh process")
    ap.add_argument("--points", nargs="+", default=["uniform"],
                    choices=["uniform", "boreholes", "terrain"])
    ap.add_argument("--second-process", action="store_true",
                    help="with --user: each case again in a second process, same cache")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.user:
        user_runs(args)
        return
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
