"""3D Laplace FMM benchmark: time versus N, per pass, with measured error.

    python benchmarks/bench_laplace.py --nmin 12 --nmax 20 --dtype float32 --eps 1e-5
    python benchmarks/bench_laplace.py --orders 4,6,8 --n 20000 --dtype float64

Per N: tree build, upward (P2M + M2M), downward (M2L + L2L), L2P, P2P, the
whole jitted fmm() (build included), first call (compile + run), the direct
sum's time, and the relative L2 error of potential and gradient on 1,000
sampled targets against a float64 direct sum of the same rounded inputs.
Times are medians over --repeats runs after compilation. Prints markdown rows.
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

from jfmm import passes  # noqa: E402
from jfmm.configure import Config  # noqa: E402
from jfmm.models import laplace3d as laplace3d_model  # noqa: E402
from jfmm import _reference  # noqa: E402
from jfmm.ops import backend, laplace3d  # noqa: E402
from jfmm.ops.pallas import m2l as pallas_m2l  # noqa: E402
from jfmm.ops.pallas import p2p as pallas_p2p  # noqa: E402
from jfmm.tree import build as build_tree, choose_depth, lists  # noqa: E402


def make_points(kind, n, rng):
    if kind == "cube":
        return rng.random((n, 3))
    if kind == "sphere":
        v = rng.normal(size=(n, 3))
        return 0.5 + 0.5 * v / np.linalg.norm(v, axis=1, keepdims=True)
    if kind == "plummer":
        r = 1.0 / np.sqrt(rng.random(n) ** (-2.0 / 3.0) - 1.0)
        v = rng.normal(size=(n, 3))
        return np.clip(r, 0, 100)[:, None] * v / np.linalg.norm(v, axis=1, keepdims=True)
    raise ValueError(kind)


def reference(x64, q64, y64):
    """float64 direct sum at the sampled targets: numpy for small N, else
    jfmm.direct in float64 on the device (numpy took minutes at 2^22+)."""
    if len(x64) <= 2 ** 18:
        return _reference.laplace3d(x64, q64, y64)
    with jax.enable_x64(True):
        phi, grad = jfmm.direct(jnp.asarray(x64), jnp.asarray(q64), jnp.asarray(y64),
                                gradient=True)
        return np.asarray(phi), np.asarray(grad)


def rel(a, b):
    """Relative L2 error of a against b, in float64."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def median_time(f, *args, repeats):
    jax.block_until_ready(f(*args))
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def run_one(n, kind, dtype, eps, order, repeats, direct_max, rng, leaf=None):
    x = make_points(kind, n, rng).astype(dtype)
    q = (rng.random(n) - 0.5).astype(dtype)
    xd, qd = jnp.asarray(x), jnp.asarray(q)
    kernel = jfmm.kernels.Laplace3D()
    p = order or laplace3d_model.order_for_eps(eps, dtype)
    depth = choose_depth(n, 3, leaf or laplace3d_model.leaf_size(p))
    f = jax.jit(lambda a, b: jfmm.fmm(a, b, eps=eps, gradient=True, order=order,
                                             leaf_size=leaf))

    t0 = time.perf_counter()
    phi, grad = jax.block_until_ready(f(xd, qd))
    first = time.perf_counter() - t0
    total = median_time(f, xd, qd, repeats=repeats)

    # Passes, each jitted on its own (their sum exceeds `total` by launch gaps).
    tb = jax.jit(build_tree, static_argnames="depth")
    tree = tb(xd, None, depth=depth)
    t_build = median_time(lambda a: tb(a, None, depth=depth), xd, repeats=repeats)
    ops = jax.jit(lambda: Config(laplace3d, p, depth, eps).operators(3, dtype))()
    mode = backend.current()
    qs = qd[tree.src_perm][:, None]
    # Operators enter as arguments: closed over, they would be captured as
    # (GB-sized, at high p) constants of each pass's executable.
    up = jax.jit(lambda t, c, o: passes.upward(t, c, laplace3d, o, p, mode))
    mult = up(tree, qs, ops)
    down = jax.jit(lambda t, m, o: passes.downward(t, m, laplace3d, o, kernel, p, mode))
    loc = down(tree, mult, ops)

    def l2p(t, lc):
        h = t.box_side(t.depth)
        u = (t.tgt_sorted - t.leaf_centers(t.tgt_leaf)) / h
        coef = laplace3d.l2p_coefficients(lc, p, True)
        return backend.l2p(laplace3d, u, coef, t.tgt_start, t.tgt_leaf, h, p, True, mode)

    near = jax.jit(lambda t, c: backend.near_field(
        kernel, t.tgt_sorted, t.tgt_start, t.src_sorted, c, t.src_start,
        lists.neighbors(t.depth, 3), True, mode))
    t_up = median_time(up, tree, qs, ops, repeats=repeats) if depth >= 2 else 0.0
    t_down = median_time(down, tree, mult, ops, repeats=repeats) if depth >= 2 else 0.0
    t_l2p = median_time(jax.jit(l2p), tree, loc, repeats=repeats) if depth >= 2 else 0.0
    t_p2p = median_time(near, tree, qs, repeats=repeats)

    t_direct = float("nan")
    if n <= direct_max:
        d = jax.jit(lambda a, b: jfmm.direct(a, b, gradient=True))
        t_direct = median_time(d, xd, qd, repeats=max(1, repeats // 3))

    sample = rng.choice(n, size=min(1000, n), replace=False)
    x64, q64 = x.astype(np.float64), q.astype(np.float64)
    ref, gref = reference(x64, q64, x64[sample])
    err, gerr = rel(np.asarray(phi)[sample], ref), rel(np.asarray(grad)[sample], gref)
    ms = lambda t: f"{t * 1e3:.2f}"  # noqa: E731
    return (f"| {n:,} | {kind} | {np.dtype(dtype).name} | {eps:g} | {p} | {depth} | "
            f"{ms(t_build)} | {ms(t_up)} | {ms(t_down)} | {ms(t_l2p)} | {ms(t_p2p)} | "
            f"**{ms(total)}** | {first:.1f} | {ms(t_direct)} | {err:.2e} | {gerr:.2e} |")


HEADER = ("| N | points | dtype | eps | p | depth | build ms | up ms | down ms | L2P ms | "
          "P2P ms | total ms | first call s | direct ms | err phi | err grad |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def m2l_tiles(spec: str):
    """--m2l: a `backend.M2L_CHOICES` name or 'parents,width,warps,stages[,algorithm]'."""
    if spec in backend.M2L_CHOICES:
        return spec
    f = spec.split(",")
    return pallas_m2l.Tiles(*map(int, f[:4]), *f[4:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nmin", type=int, default=12, help="log2 of the smallest N")
    ap.add_argument("--nmax", type=int, default=16, help="log2 of the largest N")
    ap.add_argument("--step", type=int, default=1, help="step of log2 N")
    ap.add_argument("--n", type=int, default=None, help="a single N (overrides nmin/nmax)")
    ap.add_argument("--dist", default="cube")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--eps", type=float, default=1e-5)
    ap.add_argument("--orders", default=None, help="comma-separated p to sweep instead of eps")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--direct-max", type=int, default=2 ** 18,
                    help="largest N at which the direct sum is timed")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--leaf", type=int, default=None, help="leaf size (default: the rule's)")
    ap.add_argument("--blocks", default=None,
                    help="Pallas P2P tiles 'T,S,warps' (default: the library's)")
    ap.add_argument("--m2l", default=None,
                    help="M2L on the GPU: bf16x6, float32, or Pallas M2L tiles "
                         "'parents,width,warps,stages[,algorithm]'")
    args = ap.parse_args()
    if args.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    dtype = np.dtype(args.dtype).type
    rng = np.random.default_rng(args.seed)
    if args.blocks:
        backend.set_backend("auto", pallas_p2p.Blocks(*map(int, args.blocks.split(","))))
    if args.m2l:
        backend.set_backend("auto", m2l=m2l_tiles(args.m2l))
    print(f"# {jax.devices()[0].device_kind}, jax {jax.__version__}, "
          f"{time.strftime('%Y-%m-%d')}, backend: {backend.current()}, "
          f"M2L: {backend.m2l_choice()}")
    print(HEADER)
    ns = [args.n] if args.n else [2 ** k for k in range(args.nmin, args.nmax + 1, args.step)]
    orders = [int(o) for o in args.orders.split(",")] if args.orders else [None]
    for n in ns:
        for order in orders:
            for kind in args.dist.split(","):
                print(run_one(n, kind, dtype, args.eps, order, args.repeats, args.direct_max, rng,
                              args.leaf),
                      flush=True)


if __name__ == "__main__":
    main()
