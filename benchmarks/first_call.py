"""First-call time of the eager public calls, in a fresh process.

    python benchmarks/first_call.py --kernel laplace3d --dtype float32 --eps 1e-5 \
        --out docs/data/first_call.json

One configuration per process (compilation caches start empty); with --out
the row is appended to the file's rows if it exists, so one file collects a
process per configuration. KERNEL: a `jfmm.kernels.get` name (laplace3d,
yukawa with kappa 2, ...). Times, at --n uniform points (default 2^20) with
potential and gradient (--points: their distribution, default the cube): the first eager `jfmm.fmm` call (choices,
compilation, run), the second (same shapes: choices and run), `jfmm.plan`
plus the first `Plan.apply`, and the second apply; and the relative L2 error
of the potential on 1,000 sampled targets against a float64 direct sum.
Prints one markdown row, with XLA_FLAGS. --programs K also lists the
programs the first `jfmm.fmm` call compiles (jax's compile log): per
jitted function its compilations, tracing, lowering to MLIR and XLA
seconds, the K longest in XLA printed and all kept in the row.

JSON row fields: kernel, n, dim, points, dtype, eps, family, order, depth,
xla_flags, first_fmm_s, second_fmm_ms, plan_first_apply_s, second_apply_ms,
err_phi; with --programs, programs: [{name, count, trace_s, lower_s, xla_s}].
"""
from __future__ import annotations

import collections
import contextlib
import logging
import os
import re

import jax
import numpy as np

# common puts the checkout on sys.path, before jfmm is imported.
from common import first_time, make_points, parser, rel, sample, Table

import jfmm

COLUMNS = [
    ("kernel", "kernel", ""), ("points", "points", ""), ("n", "N", ","),
    ("dtype", "dtype", ""), ("eps", "eps", "g"), ("xla_flags", "XLA_FLAGS", lambda r: r["xla_flags"] or "(none)"),
    ("first_fmm_s", "first fmm s", ".1f"), ("second_fmm_ms", "second fmm ms", ".0f"),
    ("plan_first_apply_s", "plan + first apply s", ".1f"),
    ("second_apply_ms", "second apply ms", ".1f"), ("err_phi", "err phi", ".2e"),
]


_LOGGED = {"trace_s": r"Finished tracing (?:\+ transforming )?(.*) for p?jit in ([0-9.e-]+) sec",
           "lower_s": r"Finished jaxpr to MLIR module conversion (.*) in ([0-9.e-]+) sec",
           "xla_s": r"Finished XLA compilation of (.*) in ([0-9.e-]+) sec"}


@contextlib.contextmanager
def compile_log():
    """Collects the programs compiled inside the block: yields a list that
    then holds {name, count, trace_s, lower_s, xla_s} per jitted function
    compiled (tracing includes the functions it calls), longest XLA
    compilation first."""
    seen = collections.defaultdict(lambda: dict(count=0, trace_s=0.0, lower_s=0.0, xla_s=0.0))

    class Handler(logging.Handler):
        def emit(self, record):
            message = record.getMessage()
            for key, pattern in _LOGGED.items():
                found = re.search(pattern, message)
                if found:
                    name = found.group(1)
                    row = seen[name if key != "trace_s" else f"jit({name})"]
                    row[key] += float(found.group(2))
                    row["count"] += key == "xla_s"

    handler, logger = Handler(logging.DEBUG), logging.getLogger("jax")
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False              # the records are counted, not printed
    out = []
    try:
        with jax.log_compiles(True):
            yield out
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate
        # functions traced inside others alone are part of those
        out.extend(sorted(({"name": k, **v} for k, v in seen.items() if v["count"]),
                          key=lambda r: -r["xla_s"]))


def print_programs(programs, top: int) -> None:
    total = lambda key: sum(r[key] for r in programs)  # noqa: E731
    print(f"{sum(r['count'] for r in programs)} compilations of {len(programs)} functions: "
          f"tracing {total('trace_s'):.2f} s, lowering {total('lower_s'):.2f} s, "
          f"XLA {total('xla_s'):.2f} s")
    print("| function | compilations | tracing s | lowering s | XLA s |\n|---|---|---|---|---|")
    for r in programs[:top]:
        print(f"| {r['name']} | {r['count']} | {r['trace_s']:.2f} | {r['lower_s']:.2f} | "
              f"{r['xla_s']:.2f} |")


def main():
    ap = parser(__doc__, repeats=False)
    ap.add_argument("--kernel", default="laplace3d", help="a jfmm.kernels.get name")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--eps", type=float, default=1e-5)
    ap.add_argument("--n", type=int, default=2 ** 20)
    ap.add_argument("--points", default="cube", help="cube, sphere, plummer or clusters")
    ap.add_argument("--programs", type=int, default=0, metavar="K",
                    help="list the programs the first call compiles (the K longest printed)")
    args = ap.parse_args()
    name, dtype, eps, n = args.kernel, np.dtype(args.dtype).type, args.eps, args.n
    jax.config.update("jax_enable_x64", True)
    kernel = jfmm.kernels.get(name, **({"kappa": 2.0} if name == "yukawa" else {}))
    rng = np.random.default_rng(args.seed)
    x = make_points(args.points, n, rng).astype(dtype)
    q = (rng.random(n) - 0.5).astype(dtype)
    xd, qd = jax.device_put(x), jax.device_put(q)
    fmm = lambda: jfmm.fmm(xd, qd, kernel=kernel, eps=eps, gradient=True)  # noqa: E731
    with compile_log() if args.programs else contextlib.nullcontext([]) as programs:
        (phi, _), first = first_time(fmm)
    _, second = first_time(fmm)
    pl, t_plan = first_time(lambda: jfmm.plan(xd, kernel=kernel, eps=eps, gradient=True))
    _, apply1 = first_time(lambda: pl.apply(qd, gradient=True))
    _, apply2 = first_time(lambda: pl.apply(qd, gradient=True))
    s = sample(rng, n)
    ref = jfmm.direct(x.astype(np.float64), q.astype(np.float64), x[s].astype(np.float64),
                      kernel=kernel)
    table = Table("first calls, fresh process", COLUMNS)
    table.add(dict(kernel=str(kernel), n=n, dim=3, points=args.points, dtype=args.dtype, eps=eps,
                   family=pl.family, order=pl.order, depth=pl.tree.depth,
                   xla_flags=os.environ.get("XLA_FLAGS", ""), first_fmm_s=first,
                   second_fmm_ms=second * 1e3, plan_first_apply_s=t_plan + apply1,
                   second_apply_ms=apply2 * 1e3, err_phi=rel(np.asarray(phi)[s], ref),
                   **({"programs": programs} if args.programs else {})))
    table.save(args.out, append=True)
    if args.programs:
        print_programs(programs, args.programs)


if __name__ == "__main__":
    main()
