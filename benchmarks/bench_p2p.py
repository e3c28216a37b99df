"""P2P throughput on the GPU: Pallas kernel vs the jnp operator.

    python benchmarks/bench_p2p.py

1. All-pairs (jfmm.direct's path) at N = 2^16 and 2^17, float32, potential +
   gradient: pair interactions per second for several tile shapes.
2. The FMM near field at N = 2^20 (uniform cube, eps 1e-5 tree): time and
   pairs per second (pairs counted from the tree), Pallas tiles vs jnp.
3. The whole fmm() at N = 2^20 with each backend, with measured error.
Errors are relative L2 against float64 sums of the same inputs.
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
from jfmm import _reference, kernels  # noqa: E402
from jfmm.ops import backend, p2p  # noqa: E402
from jfmm.ops.pallas import p2p as pallas_p2p  # noqa: E402
from jfmm.tree import build, lists  # noqa: E402
from jfmm.models import laplace3d as laplace3d_model  # noqa: E402
from bench_laplace import median_time  # noqa: E402

K = kernels.Laplace3D()


def label(b):
    return (f"{b.targets} x {b.sources}, {b.num_warps}" + ("" if b.fma else ", no fma")
            + ("" if b.fast_math else ", libdevice rsqrt"))


def ref_phi(x, q, y):
    return _reference.laplace3d(x, q, y)[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="all,near,fmm", help="sections to run")
    ap.add_argument("--depths", default="4,5", help="tree depths of the near-field section")
    ap.add_argument("--blocks", default="16,16,1;32,32,4;16,32,2;32,16,2",
                    help="Pallas tiles 'T,S,warps[,fma 0/1[,fast_math 0/1]];...'")
    ap.add_argument("--all-n", default="16", help="log2 N of the all-pairs section, comma-separated")
    args = ap.parse_args()
    parts = args.parts.split(",")
    rng = np.random.default_rng(0)
    print(f"# {jax.devices()[0].device_kind}, jax {jax.__version__}, {time.strftime('%Y-%m-%d')}")
    blocks = [pallas_p2p.Blocks(*map(int, b.split(","))) for b in args.blocks.split(";")]
    if "all" in parts:
        all_pairs(blocks, [2 ** int(e) for e in args.all_n.split(",")], rng)
    if not {"near", "fmm"} & set(parts):
        return
    x, q, best = near(blocks, [int(d) for d in args.depths.split(",")], rng)
    if "fmm" in parts:
        whole(x, q, best or blocks[0], rng)


def all_pairs(blocks, sizes, rng):
    print("\n## all pairs, float32, potential + gradient\n")
    print("| N | path | tiles T x S, warps | ms | pairs/s | err phi |\n|---|---|---|---|---|---|")
    for n in sizes:
        x = rng.random((n, 3)).astype(np.float32)
        q = (rng.random((n, 1)) - 0.5).astype(np.float32)
        xd, qd = jnp.asarray(x), jnp.asarray(q)
        sample = rng.choice(n, 500, replace=False)
        ref = ref_phi(x.astype(np.float64), q[:, 0].astype(np.float64), x[sample].astype(np.float64))
        for b in blocks:
            backend.set_backend("auto", blocks=b)  # jfmm.direct's path, these tiles
            f = jax.jit(lambda a, c: backend.dense(K, None, a, c, True, "pallas"))
            try:
                t = median_time(f, xd, qd, repeats=5 if n <= 2 ** 18 else 3)
            except Exception as e:  # report and go on: one run must give every number it can
                print(f"| {n:,} | pallas | {b} | failed: {str(e).splitlines()[0][:200]} |")
                continue
            phi = np.asarray(f(xd, qd)[0])[sample, 0]
            err = np.linalg.norm(phi - ref) / np.linalg.norm(ref)
            print(f"| {n:,} | pallas | {label(b)} | {t * 1e3:.2f} | "
                  f"{n * n / t:.3g} | {err:.1e} |", flush=True)
        g = jax.jit(lambda a, c: p2p.dense(K, a, a, c, True))
        t = median_time(g, xd, qd, repeats=3)
        print(f"| {n:,} | jnp | 256 x 256 | {t * 1e3:.2f} | {n * n / t:.3g} | - |", flush=True)


def near(blocks, depths, rng):
    """Near-field section; returns the points, charges and the fastest tiles
    at the first depth."""
    print("\n## FMM near field, N = 2^20 uniform, float32, potential + gradient\n")
    n = 2 ** 20
    x = jnp.asarray(rng.random((n, 3)).astype(np.float32))
    q = jnp.asarray((rng.random((n, 1)) - 0.5).astype(np.float32))
    print("| depth | path | tiles | ms | pairs/s |\n|---|---|---|---|---|")
    best = (float("inf"), None)
    for depth in depths:
        t = jax.jit(build, static_argnames="depth")(x, None, depth=depth)
        near = lists.neighbors(depth, 3)
        cnt = np.diff(np.asarray(t.src_start)[: 2 ** (3 * depth) + 1])
        nb = np.asarray(near)
        cnt_pad = np.append(cnt, 0)
        pairs = float((cnt * cnt_pad[nb].sum(1)).sum())
        qs = q[t.src_perm]
        args = (K, t.tgt_sorted, t.tgt_start, t.src_sorted, qs, t.src_start, near, True)
        for b in blocks:
            f = jax.jit(lambda *a, b=b: pallas_p2p.near_field(*a[:1], *a[1:], True, blocks=b),
                        static_argnums=0)
            try:
                tm = median_time(f, *args[:-1], repeats=5)
            except Exception as e:
                print(f"| {depth} | pallas | {b} | failed: {str(e).splitlines()[0][:200]} |")
                continue
            print(f"| {depth} | pallas | {label(b)} | {tm * 1e3:.2f} | "
                  f"{pairs / tm:.3g} |", flush=True)
            if depth == depths[0] and tm < best[0]:
                best = (tm, b)
        f = jax.jit(lambda *a: p2p.near_field(*a, True), static_argnums=0)
        tm = median_time(f, *args[:-1], repeats=3)
        print(f"| {depth} | jnp | 64 | {tm * 1e3:.2f} | {pairs / tm:.3g} |", flush=True)
    return x, q, best[1]


def whole(x, q, best, rng):
    n = x.shape[0]
    print("\n## whole fmm(), N = 2^20 uniform, float32, eps 1e-5, potential + gradient\n")
    print("| backend | leaf size | p | total ms | first call s | err phi |\n|---|---|---|---|---|---|")
    xs = np.asarray(x)
    sample = rng.choice(n, 500, replace=False)
    ref = ref_phi(xs.astype(np.float64), np.asarray(q)[:, 0].astype(np.float64),
                  xs[sample].astype(np.float64))
    print(f"(Pallas tiles: the fastest at the first depth, {label(best)})\n")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "best_blocks"), "w") as fh:
            b = best
            fh.write(f"{b.targets},{b.sources},{b.num_warps}")
    for mode in ("pallas",):
        for leaf in (None, 32, 64):
            backend.set_backend(mode, best)
            f = jax.jit(lambda a, c, leaf=leaf: jfmm.fmm(a, c, eps=1e-5, gradient=True,
                                                         leaf_size=leaf))
            t0 = time.perf_counter()
            try:
                phi = np.asarray(jax.block_until_ready(f(x, q[:, 0]))[0])
            except Exception as e:
                print(f"| {mode} | {leaf} | failed: {str(e).splitlines()[0][:200]} |")
                continue
            first = time.perf_counter() - t0
            tm = median_time(f, x, q[:, 0], repeats=5)
            err = np.linalg.norm(phi[sample] - ref) / np.linalg.norm(ref)
            print(f"| {mode} | {leaf or laplace3d_model.leaf_size(11)} | 11 | {tm * 1e3:.2f} | "
                  f"{first:.1f} | {err:.2e} |", flush=True)
    backend.set_backend("auto")


if __name__ == "__main__":
    main()
