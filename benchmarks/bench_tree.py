"""Adaptive against uniform trees: build time and the work their lists imply.

    python benchmarks/bench_tree.py --sizes 18,20,22 --out docs/data/tree_gpu.json

Per point set (cube, sphere, Plummer, clusters with outliers; 3D) and N:
the adaptive tree (`jfmm.tree.adaptive`, leaf size --leaf) sized from the
points (`capacities`, host loop, first call and again) and built under jit
(median after compilation); its levels, box slots, leaves and largest leaf;
and the interactions its U, V, W, X lists hold: near-field pairs per point
(sum over target leaves of targets x sources in their U lists, / N) and the
counts of V, W and X entries. Beside it the uniform tree that
`jfmm.plan(points, eps=1e-5)` builds for 3D Laplace: depth, largest leaf,
near-field pairs per point and M2L pairs.
"""
import time

import jax
import jax.numpy as jnp
import numpy as np
from common import Table, make_points, median_time, parser

import jfmm
from jfmm.tree import adaptive, lists


@jax.jit
def adaptive_work(tree):
    """Near-field pairs, and V, W, X entries of the adaptive tree."""
    total = tree.n_boxes
    src = jnp.diff(tree.src_start)[:total]
    tgt = jnp.diff(tree.tgt_start)[:total]
    src_ext = jnp.concatenate([src, jnp.zeros(1, src.dtype)])
    u = adaptive.u_list(tree)
    near = jnp.sum(tgt.astype(jnp.float64 if jax.config.jax_enable_x64 else jnp.float32)
                   * src_ext[u].sum(axis=1))
    count = lambda a: jnp.sum(a < total)              # noqa: E731
    return near, count(adaptive.v_list(tree)[0]), count(adaptive.w_list(tree)), \
        count(adaptive.x_list(tree))


def uniform_work(tree):
    """Near-field pairs of a uniform tree, its largest leaf, and a bound on
    its M2L pairs: occupied boxes of levels 2 and below, 6^d - 3^d each."""
    d, depth = tree.dim, tree.depth
    counts = np.diff(np.asarray(tree.src_start))[: 2 ** (d * depth)]
    near_table = np.asarray(lists.neighbors(depth, d))
    ext = np.concatenate([counts, [0]])
    near = float(np.sum(counts.astype(np.float64) * ext[near_table].sum(axis=1)))
    occupied = np.nonzero(counts)[0]
    m2l = sum(len(np.unique(occupied >> (d * (depth - level)))) * (6 ** d - 3 ** d)
              for level in range(2, depth + 1))
    return near, m2l, int(counts.max())


def main():
    ap = parser(__doc__)
    ap.add_argument("--sizes", default="16,18,20", help="log2 N, comma-separated")
    ap.add_argument("--kinds", default="cube,sphere,plummer,clusters")
    ap.add_argument("--leaf", type=int, default=64)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    table = Table("Adaptive and uniform trees, 3D", [
        ("points", "points", ""), ("n", "N", ","), ("levels", "levels", ""),
        ("slots", "box slots", ","), ("leaves", "leaves", ","), ("max_leaf", "max leaf", ""),
        ("sizing_first_s", "sizing first (s)", ".2f"), ("sizing_s", "sizing (s)", ".2f"),
        ("build_ms", "build (ms)", ".1f"), ("near_per_point", "near/pt", ".0f"),
        ("v", "V", ","), ("w", "W", ","), ("x", "X", ","),
        ("uniform_depth", "uniform depth", ""), ("uniform_max_leaf", "uniform max leaf", ""),
        ("uniform_near_per_point", "uniform near/pt", ".0f"),
        ("uniform_m2l_bound", "uniform M2L bound", ",")])
    for kind in args.kinds.split(","):
        for k in (int(v) for v in args.sizes.split(",")):
            n = 2 ** k
            x = jnp.asarray(make_points(kind, n, rng), jnp.float32)
            t = time.perf_counter()
            caps = adaptive.capacities(x, None, args.leaf)
            first = time.perf_counter() - t
            t = time.perf_counter()
            adaptive.capacities(x, None, args.leaf)
            again = time.perf_counter() - t
            build = jax.jit(adaptive.build, static_argnums=(1, 2, 3))
            tree = build(x, None, args.leaf, caps)
            build_s = median_time(build, x, None, args.leaf, caps, repeats=args.repeats)
            near, v, w, xl = (float(a) for a in adaptive_work(tree))
            sizes = np.diff(np.asarray(tree.src_start))[:tree.n_boxes]
            uni = jfmm.plan(x, eps=1e-5).tree
            u_near, u_m2l, u_max = uniform_work(uni)
            table.add(dict(points=kind, n=n, leaf_size=args.leaf, levels=len(caps),
                           slots=sum(caps), leaves=int(np.asarray(tree.leaf).sum()),
                           max_leaf=int(sizes.max()), overflow=bool(tree.overflow),
                           sizing_first_s=first, sizing_s=again, build_ms=build_s * 1e3,
                           near_per_point=near / n, v=int(v), w=int(w), x=int(xl),
                           uniform_depth=uni.depth, uniform_max_leaf=u_max,
                           uniform_near_per_point=u_near / n, uniform_m2l_bound=u_m2l))
    table.save(args.out)


if __name__ == "__main__":
    main()
