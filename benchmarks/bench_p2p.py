"""P2P throughput on the GPU: Pallas kernel vs the jnp operator.

    python benchmarks/bench_p2p.py --out docs/data/p2p.json

1. All-pairs (jfmm.direct's path) at N = 2^--all-n, float32, potential +
   gradient: pair interactions per second for several tile shapes.
2. The FMM near field at N = --n (default 2^20; uniform cube, eps 1e-5 tree)
   at each of --depths: time and pairs per second (pairs counted from the
   tree), Pallas tiles vs jnp.
3. The whole fmm() at N = --n with the Pallas backend and the tiles fastest
   in section 2 at its first depth, with measured error.
Errors are relative L2 on 500 sampled targets against float64 sums of the
same inputs. A Pallas case that fails (e.g. on a CPU) is a row with its error.

JSON row fields: section (all, near, fmm), n, dtype, path (pallas, jnp),
tiles, time_ms, pairs_per_s, err_phi, error (a failed case's message);
near: depth; fmm: leaf, order, eps, first_call_s.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# common puts the checkout on sys.path, before jfmm is imported.
from common import first_time, make_points, median_time, parser, rel, sample, Table, write_json

import jfmm
from jfmm import _reference, kernels
from jfmm.models import laplace3d as laplace3d_model
from jfmm.ops import backend, p2p
from jfmm.ops.pallas import p2p as pallas_p2p
from jfmm.tree import build, lists

K = kernels.Laplace3D()
EPS = 1e-5      # the whole fmm()'s requested error (section 3)


def _failed_or(fmt: str, key: str):
    """A cell: row[key] formatted, or 'failed: ...' where the case failed."""
    return lambda r: f"failed: {r['error']}" if r.get("error") else format(r[key], fmt)


ALL_COLUMNS = [("n", "N", ","), ("path", "path", ""), ("tiles", "tiles T x S, warps", ""),
               ("time_ms", "ms", _failed_or(".2f", "time_ms")),
               ("pairs_per_s", "pairs/s", ".3g"), ("err_phi", "err phi", ".1e")]
NEAR_COLUMNS = [("depth", "depth", "d"), ("path", "path", ""), ("tiles", "tiles", ""),
                ("time_ms", "ms", _failed_or(".2f", "time_ms")),
                ("pairs_per_s", "pairs/s", ".3g")]
FMM_COLUMNS = [("path", "backend", ""), ("tiles", "tiles", ""), ("leaf", "leaf size", "d"),
               ("order", "p", "d"), ("time_ms", "total ms", _failed_or(".2f", "time_ms")),
               ("first_call_s", "first call s", ".1f"), ("err_phi", "err phi", ".2e")]


def label(b) -> str:
    return (f"{b.targets} x {b.sources}, {b.num_warps}" + ("" if b.fma else ", no fma")
            + ("" if b.fast_math else ", libdevice rsqrt"))


def ref_phi(x, q, y):
    return _reference.laplace3d(x, q, y)[0]


def error_text(e: Exception) -> str:
    return str(e).splitlines()[0][:200]


def main():
    ap = parser(__doc__)
    ap.add_argument("--parts", default="all,near,fmm", help="sections to run")
    ap.add_argument("--depths", default="4,5", help="tree depths of the near-field section")
    ap.add_argument("--blocks", default="16,16,1;32,32,4;16,32,2;32,16,2",
                    help="Pallas tiles 'T,S,warps[,fma 0/1[,fast_math 0/1]];...'")
    ap.add_argument("--all-n", default="16",
                    help="log2 N of the all-pairs section, comma-separated")
    ap.add_argument("--n", type=int, default=2 ** 20, help="N of the near-field and fmm sections")
    args = ap.parse_args()
    parts = args.parts.split(",")
    rng = np.random.default_rng(args.seed)
    blocks = [pallas_p2p.Blocks(*map(int, b.split(","))) for b in args.blocks.split(";")]
    rows = []
    if "all" in parts:
        rows += all_pairs(blocks, [2 ** int(e) for e in args.all_n.split(",")], rng,
                          args.repeats)
    if {"near", "fmm"} & set(parts):
        x = jnp.asarray(make_points("cube", args.n, rng).astype(np.float32))
        q = jnp.asarray((rng.random((args.n, 1)) - 0.5).astype(np.float32))
        near_rows, best = near(x, q, blocks, [int(d) for d in args.depths.split(",")],
                               args.repeats)
        rows += near_rows
        if "fmm" in parts:
            rows += whole(x, q, best or blocks[0], rng, args.repeats)
    if args.out:
        write_json(args.out, "P2P: all pairs, near field, whole fmm()", rows)


def all_pairs(blocks, sizes, rng, repeats) -> list[dict]:
    table = Table("all pairs, float32, potential + gradient", ALL_COLUMNS)
    for n in sizes:
        x = make_points("cube", n, rng).astype(np.float32)
        q = (rng.random((n, 1)) - 0.5).astype(np.float32)
        xd, qd = jnp.asarray(x), jnp.asarray(q)
        s = rng.choice(n, min(500, n), replace=False)
        ref = ref_phi(x.astype(np.float64), q[:, 0].astype(np.float64),
                      x[s].astype(np.float64))
        base = dict(section="all", n=n, dtype="float32")
        for b in blocks:
            backend.set_backend("auto", blocks=b)  # jfmm.direct's path, these tiles
            f = jax.jit(lambda a, c: backend.dense(K, None, a, c, True, "pallas"))
            row = dict(base, path="pallas", tiles=label(b))
            try:
                t = median_time(f, xd, qd, repeats=repeats if n <= 2 ** 18 else min(repeats, 3))
            except Exception as e:  # report and go on: one run must give every number it can
                table.add(dict(row, error=error_text(e)))
                continue
            phi = np.asarray(f(xd, qd)[0])[s, 0]
            table.add(dict(row, time_ms=t * 1e3, pairs_per_s=n * n / t, err_phi=rel(phi, ref)))
        g = jax.jit(lambda a, c: p2p.dense(K, a, a, c, True))
        t = median_time(g, xd, qd, repeats=min(repeats, 3))
        table.add(dict(base, path="jnp", tiles="256 x 256", time_ms=t * 1e3,
                       pairs_per_s=n * n / t))
    return table.rows


def near(x, q, blocks, depths, repeats):
    """Near-field section: its rows and the fastest tiles at the first depth."""
    n = x.shape[0]
    table = Table(f"FMM near field, N = {n:,} uniform, float32, potential + gradient",
                  NEAR_COLUMNS)
    best = (float("inf"), None)
    for depth in depths:
        t = jax.jit(build, static_argnames="depth")(x, None, depth=depth)
        nbrs = lists.neighbors(depth, 3)
        cnt = np.diff(np.asarray(t.src_start)[: 2 ** (3 * depth) + 1])
        cnt_pad = np.append(cnt, 0)
        pairs = float((cnt * cnt_pad[np.asarray(nbrs)].sum(1)).sum())
        qs = q[t.src_perm]
        args = (K, t.tgt_sorted, t.tgt_start, t.src_sorted, qs, t.src_start, nbrs)
        base = dict(section="near", n=n, dtype="float32", depth=depth)
        for b in blocks:
            f = jax.jit(lambda *a, b=b: pallas_p2p.near_field(*a, True, blocks=b),
                        static_argnums=0)
            row = dict(base, path="pallas", tiles=label(b))
            try:
                tm = median_time(f, *args, repeats=repeats)
            except Exception as e:  # report and go on
                table.add(dict(row, error=error_text(e)))
                continue
            table.add(dict(row, time_ms=tm * 1e3, pairs_per_s=pairs / tm))
            if depth == depths[0] and tm < best[0]:
                best = (tm, b)
        f = jax.jit(lambda *a: p2p.near_field(*a, True), static_argnums=0)
        tm = median_time(f, *args, repeats=min(repeats, 3))
        table.add(dict(base, path="jnp", tiles="64", time_ms=tm * 1e3, pairs_per_s=pairs / tm))
    return table.rows, best[1]


def whole(x, q, best, rng, repeats) -> list[dict]:
    """The whole fmm() with the Pallas backend and tiles `best`."""
    n = x.shape[0]
    table = Table(f"whole fmm(), N = {n:,} uniform, float32, eps {EPS:g}, potential + gradient",
                  FMM_COLUMNS)
    xs = np.asarray(x)
    s = sample(rng, n, 500)
    ref = ref_phi(xs.astype(np.float64), np.asarray(q)[:, 0].astype(np.float64),
                  xs[s].astype(np.float64))
    p = laplace3d_model.order_for_eps(EPS, np.float32)
    for leaf in (None, 32, 64):
        backend.set_backend("pallas", best)
        f = jax.jit(lambda a, c, leaf=leaf: jfmm.fmm(a, c, eps=EPS, gradient=True,
                                                     leaf_size=leaf))
        row = dict(section="fmm", n=n, dtype="float32", eps=EPS, path="pallas",
                   tiles=label(best), leaf=leaf or laplace3d_model.leaf_size(p), order=p)
        try:
            (phi, _), first = first_time(f, x, q[:, 0])
        except Exception as e:  # report and go on
            table.add(dict(row, error=error_text(e)))
            continue
        tm = median_time(f, x, q[:, 0], repeats=repeats)
        table.add(dict(row, time_ms=tm * 1e3, first_call_s=first,
                       err_phi=rel(np.asarray(phi)[s], ref)))
    backend.set_backend("auto")
    return table.rows


if __name__ == "__main__":
    main()
