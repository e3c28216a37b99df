"""Where the first jax.jit call's compilation goes, stage by stage, in a fresh process.

    python benchmarks/compile_stages.py --trees auto,adaptive,uniform --passes \
        --out docs/data/compile_stages.json

Per tree option, in a fresh process with JFMM_COMPILATION_CACHE=0:
`jax.jit(lambda x, q: jfmm.fmm(x, q, eps=eps, gradient=True, tree=tree))`
at --n points (3D Laplace), staged by hand as jax stages it: trace (to a
jaxpr), lower (to StableHLO; on a GPU this includes lowering each Pallas
kernel to Triton IR, timed per kernel and summed in "Pallas s") and XLA's
compilation; then the compiled call's warm median on cube and Plummer
points with the relative L2 errors of phi and grad phi on 1,000 targets
against a float64 direct sum. With --passes (its own process): each pass
of the traced adaptive tree (bounded capacities, cube points) jitted alone,
its trace + lower + compile seconds ("pass" rows).

With --lower-for cuda the call is traced with a GPU's choices (the Pallas
backend, `jax.default_backend()` answering "gpu") and lowered for that
platform only, on any machine (a CPU lowers as a GPU's host does): trace,
lower and Pallas seconds, no XLA time, run or errors. --unbound undoes
`jfmm._xla.bind_triton_dialect` first (the lowering before it).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from common import (Table, make_points, median_time, parser, reference, rel, sample)

import jfmm
from jfmm import _xla, api, configure, passes
from jfmm.ops import backend
from jfmm.tree import adaptive

COLUMNS = [
    ("tree", "tree", ""), ("n", "N", ","), ("dtype", "dtype", ""),
    ("trace_s", "trace s", ".2f"), ("lower_s", "lower s", ".2f"),
    ("pallas_s", "of it Pallas s", ".2f"), ("xla_s", "XLA s", ".2f"),
    ("total_s", "total s", lambda r: "-" if r["total_s"] is None else f"**{r['total_s']:.1f}**"),
    ("cube_ms", "cube ms", ".2f"), ("plummer_ms", "Plummer ms", ".2f"),
    ("err_phi", "err phi (cube, Plummer)", ""), ("err_grad", "err grad", ""),
]
PASS_COLUMNS = [("pass", "pass", ""), ("n", "N", ","), ("compile_s", "compile s", ".2f")]


def _time_pallas(log):
    """Record each Pallas kernel's lowering to Triton IR in log (a GPU's
    lowering does this; jax internals, so skipped where they differ)."""
    try:
        from jax._src.pallas.triton import lowering
    except ImportError:
        return
    inner = lowering.lower_jaxpr_to_triton_module

    def timed(jaxpr, *args, **kwargs):
        t0 = time.perf_counter()
        out = inner(jaxpr, *args, **kwargs)
        log[jaxpr.debug_info.func_name] += time.perf_counter() - t0
        return out

    lowering.lower_jaxpr_to_triton_module = timed


def staged(f, *args):
    """(compiled, trace s, lower s, XLA s) of jax.jit-ted f at args (arrays
    or ShapeDtypeStructs)."""
    t0 = time.perf_counter()
    traced = f.trace(*args)
    t1 = time.perf_counter()
    lowered = traced.lower()
    t2 = time.perf_counter()
    compiled = lowered.compile()
    return compiled, t1 - t0, t2 - t1, time.perf_counter() - t2


def one_tree(args, tree: str) -> dict:
    dtype = jnp.dtype(args.dtype)
    n, eps = args.n, args.eps
    log = collections.defaultdict(float)
    _time_pallas(log)
    jnp.zeros(1).block_until_ready()              # the backend's start, apart
    f = jax.jit(lambda x, q: jfmm.fmm(x, q, eps=eps, gradient=True, tree=tree))
    shapes = jax.ShapeDtypeStruct((n, 3), dtype), jax.ShapeDtypeStruct((n,), dtype)
    if args.lower_for:
        t0 = time.perf_counter()
        traced = f.trace(*shapes)
        t1 = time.perf_counter()
        traced.lower(lowering_platforms=(args.lower_for,))
        return dict(tree=tree, n=n, dtype=args.dtype, eps=eps, trace_s=t1 - t0,
                    lower_s=time.perf_counter() - t1, pallas_s=sum(log.values()),
                    pallas={k: round(v, 3) for k, v in log.items()}, xla_s=None, total_s=None,
                    lower_for=args.lower_for, bound=not args.unbound,
                    err_phi=None, err_grad=None)
    compiled, trace_s, lower_s, xla_s = staged(f, *shapes)
    row = dict(tree=tree, n=n, dtype=args.dtype, eps=eps, trace_s=trace_s, lower_s=lower_s,
               pallas_s=sum(log.values()) if log else None,
               pallas={k: round(v, 3) for k, v in log.items()}, xla_s=xla_s,
               total_s=trace_s + lower_s + xla_s, xla_flags=os.environ.get("XLA_FLAGS", ""))
    errs = []
    for kind in ("cube", "plummer"):
        rng = np.random.default_rng(args.seed)
        x64, q64 = make_points(kind, n, rng), rng.random(n) - 0.5
        x, q = jnp.asarray(x64, dtype), jnp.asarray(q64, dtype)
        if kind == "plummer" and tree == "uniform":
            continue                                  # seconds a call: not this table's point
        row[f"{kind}_ms"] = 1e3 * median_time(compiled, x, q, repeats=args.repeats)
        phi, grad = compiled(x, q)
        idx = sample(rng, n)
        xr, qr = np.asarray(x, np.float64), np.asarray(q, np.float64)
        ref, gref = reference(xr, qr, xr[idx])
        errs.append((rel(np.asarray(phi)[idx], ref), rel(np.asarray(grad)[idx], gref)))
    row["err_phi"] = ", ".join(f"{e[0]:.1e}" for e in errs)
    row["err_grad"] = ", ".join(f"{e[1]:.1e}" for e in errs)
    return row


def pass_rows(args) -> list[dict]:
    """Each pass of the traced adaptive tree compiled alone: compile s."""
    dtype, n, kern = jnp.dtype(args.dtype), args.n, jfmm.kernels.Laplace3D()
    x = jnp.asarray(make_points("cube", n, np.random.default_rng(args.seed)), dtype)
    q = jnp.ones(n, dtype)
    cfg = configure.choose_tree(configure.resolve_eager(
        x, None, kern, args.eps, None, None, None, True, "adaptive"), x, None, "adaptive")
    pl = api._new_plan(x, None, kern, cfg, bounded=True)
    t, fam, ops, p, mode = pl.tree, pl.config.family, pl.ops, pl.order, backend.current()
    qs = q[t.src_perm][:, None]
    busy = lambda t: adaptive.busy_leaves(t, t.tgt_sorted.shape[0])   # noqa: E731

    def scaled(t, pts, leaf):
        side = t.box_side(t.level)
        return (pts - t.center[leaf]) / side[leaf][:, None], side

    def near(t, c):
        return backend.near_field(kern, t.tgt_sorted, t.tgt_start, t.src_sorted, c, t.src_start,
                                  t.near, True, mode, leaves=busy(t))

    def p2m(t, c):
        u, _ = scaled(t, t.src_sorted, t.src_leaf)
        return backend.p2m(fam, u, c, t.src_start, t.src_leaf, p, mode, busy(t))

    def l2p(t, loc):
        u, side = scaled(t, t.tgt_sorted, t.tgt_leaf)
        return backend.l2p(fam, u, fam.l2p_coefficients(loc, p, True), t.tgt_start, t.tgt_leaf,
                           side, p, True, mode, busy(t))

    mult = jax.jit(lambda t, c, o: passes.adaptive_upward(
        t, c, fam, o, p, t.box_side(t.level), mode))(t, qs, ops)
    loc = jnp.zeros_like(mult)
    runs = {
        "tree build": (lambda a: api._adaptive_tree(a, None, pl.config.leaf), (x,)),
        "near field (U lists)": (near, (t, qs)),
        "P2M": (p2m, (t, qs)),
        "P2M + M2M": (lambda t, c, o: passes.adaptive_upward(t, c, fam, o, p, t.box_side(t.level),
                                                             mode), (t, qs, ops)),
        "X lists, M2L, L2L": (lambda t, m, c, o: passes.adaptive_downward(
            t, m, c, fam, o, kern, p, mode), (t, mult, qs, ops)),
        "L2P": (l2p, (t, loc)),
        "W lists": (lambda t, m: passes.w_lists(t, m, fam, kern, p, True, mode), (t, mult)),
        "all passes": (lambda t, c, o: passes.adaptive_evaluate(t, c, kern, fam, o, p, True, mode),
                       (t, qs, ops)),
    }
    rows = []
    for name, (f, a) in runs.items():
        _, *secs = staged(jax.jit(f), *a)
        rows.append(dict(**{"pass": name}, n=n, dtype=args.dtype, tree="adaptive (traced)",
                         compile_s=sum(secs)))
    return rows


def main():
    ap = parser(__doc__)
    ap.add_argument("--n", type=int, default=2 ** 20)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--eps", type=float, default=1e-5)
    ap.add_argument("--trees", default="auto,adaptive,uniform")
    ap.add_argument("--passes", action="store_true", help="each pass compiled alone")
    ap.add_argument("--lower-for", default=None, metavar="PLATFORM",
                    help="trace with a GPU's choices and lower for PLATFORM only (cuda)")
    ap.add_argument("--unbound", action="store_true",
                    help="with --lower-for: without jfmm's binding of Triton's dialect module")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.lower_for:
        jax.default_backend = lambda: "gpu"       # configure's choices are a GPU's
        backend.set_backend("pallas")
        if args.unbound:                          # before any lowering searched for it
            del sys.modules[_xla.TRITON_DIALECT]
    if args.dtype == "float64":           # float32 runs as users' do, without x64
        jax.config.update("jax_enable_x64", True)
    if args.one:                                   # the child process: one JSON row
        row = pass_rows(args) if args.one == "passes" else [one_tree(args, args.one)]
        print("ROWS " + json.dumps(row), flush=True)
        return
    env = dict(os.environ, JFMM_COMPILATION_CACHE="0")
    table = Table(f"jax.jit(fmm)'s first call by stage, {args.dtype} eps {args.eps:g}", COLUMNS)
    each = Table("each pass of the traced adaptive tree compiled alone", PASS_COLUMNS)
    for tree in args.trees.split(",") + (["passes"] if args.passes else []):
        cmd = [sys.executable, __file__, "--one", tree] + [
            a for a in sys.argv[1:] if a not in ("--passes",)]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
        rows = json.loads(next(ln for ln in out.splitlines() if ln.startswith("ROWS "))[5:])
        for row in rows:
            if "pass" in row:
                table.rows.append(each.add(row))
            else:
                table.add(row)
    table.save(args.out)


if __name__ == "__main__":
    main()
