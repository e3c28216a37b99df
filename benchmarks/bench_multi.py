"""Several GPUs: strong and weak scaling of the sharded FMM (jfmm.distributed).

    python benchmarks/bench_multi.py --out docs/data/multi.json          # the GPUs there are
    python benchmarks/bench_multi.py --emulate 1,2,4,8 \
        --out docs/data/multi_emulated.json                              # one GPU

3D Laplace, float32, eps 1e-5, potential and gradient; uniform cube points
on the uniform tree, or with --points plummer an adaptive tree.

Real runs: a mesh over the first D GPUs, D = 1, 2, 4, ... up to the GPUs
present; strong scaling at N = 2^--strong, weak scaling at 2^--weak points
per GPU. Times are medians after compilation: "total" a jitted
`plan.update(points).apply(charges, gradient=True)` (the tree rebuilt, as
each step of a simulation does), "build" the update alone, "apply" the sum
on a built tree; efficiency is T_1 / (D T_D) (strong) or T_1 / T_D (weak).
Errors of phi and grad on 1,000 sampled targets against a float64 direct
sum. "MB in" is what each device receives per apply (the count in
jfmm.distributed's docstring), "MB a device" what the compiled `total`
allocates on each device (arguments, outputs, temporaries).

--emulate (one GPU): one device's share of the sum on D devices, that is
`jfmm.distributed`'s shard function run alone with its collectives replaced
by stand-ins of the same shapes (all-gathers by tiled copies, the psum by
nothing): the compute of strong scaling without the exchange, for every
shard. "total" is then the single GPU's tree build plus the slowest
shard, and efficiency that of the apply alone, T_1 / (D T_shard).
"""
from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
from common import Table, make_points, median_time, parser, reference, rel, sample
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import jfmm
from jfmm import distributed
from jfmm.ops import backend

COLUMNS = [
    ("scaling", "scaling", ""), ("devices", "GPUs", "d"), ("n", "N", ","),
    ("order", "p", "d"), ("depth", "depth", "d"),
    ("build_ms", "build ms", ".2f"), ("apply_ms", "apply ms", ".2f"),
    ("total_ms", "total ms", lambda r: f"**{r['total_ms']:.2f}**"),
    ("efficiency", "efficiency", ".2f"), ("mb_in", "MB in", ".0f"),
    ("mb_device", "MB a device", ".0f"),
    ("err_phi", "err phi", ".2e"), ("err_grad", "err grad", ".2e"),
    ("shard_ms", "slowest shard ms", ".2f"), ("shard_mean_ms", "mean shard ms", ".2f"),
]


def traffic_mb(pl, n_dev: int, k: int = 1) -> float:
    """MB each of n_dev devices receives per apply: on the uniform tree the
    charges to the sorted order, the sources and charges round the ring and
    the results back (on adaptive trees the point all-gather), the ring
    all-reduce of the leaf (adaptive: every box's) multipoles, the
    all-gathers of each level's locals (on the uniform tree with D dividing
    2^d: a reduce-scatter of the leaf multipoles, the gather of the leaf
    locals, and the multipoles of the parents bordering each device's box
    of each level), and on adaptive trees the all-reduce of the X lists'
    locals and the reduce-scatter of the W lists' sums (jfmm.distributed)."""
    cfg, tree = pl.config, pl.tree
    share = (n_dev - 1) / n_dev
    s = tree.src_sorted.dtype.itemsize
    n, m = tree.src_sorted.shape[0], tree.tgt_sorted.shape[0]
    total = n * (tree.dim + k) * s
    if cfg.tree == "adaptive":        # the whole tree, targets included, on every device
        total += m * tree.dim * s
        boxes = tree.n_boxes
        windowed = tree.offsets[tree.depth + 1] - tree.offsets[2]
    else:                             # the charges sorted, the results unsorted
        total += (n * k + m * k * (1 + tree.dim)) * s
        boxes = 2 ** (tree.dim * cfg.depth)
        windowed = sum(2 ** (tree.dim * lv) for lv in range(2, cfg.depth + 1))
    if cfg.family is not None and tree.depth >= 2:
        coef = jax.eval_shape(lambda: cfg.family.p2m(tree.src_sorted[:1], jnp.ones((1, k)),
                                                     cfg.order)).shape[2]
        basis = cfg.family.m2l_basis(pl.ops)
        comp = coef if basis is None else basis.shape[0]
        total += (2 * boxes * coef + windowed * comp) * k * s
        nc = 2 ** tree.dim
        if cfg.tree != "adaptive" and n_dev > 1 and nc % n_dev == 0:
            # The M2L's multipoles: the parents bordering each device's box alone.
            halo = sum(sum(distributed.halo_counts(lv - 1, tree.dim, n_dev))
                       for lv in range(2, cfg.depth + 1))
            total += (nc * halo / share - windowed) * comp * k * s
        if cfg.tree == "adaptive":    # the X lists' locals summed, the W lists' sums scattered
            total += (2 * boxes * coef + tree.tgt_sorted.shape[0] * (1 + tree.dim)) * k * s
    return share * total / 1e6


def measure(x, q, mesh, repeats: int, rng, tree: str) -> dict:
    """A row of times and errors on `mesh` (None: one GPU, no mesh)."""
    if mesh is None:
        xs, qs = jnp.asarray(x), jnp.asarray(q)
    else:
        sharding = NamedSharding(mesh, PartitionSpec("x"))
        xs, qs = jax.device_put(x, sharding), jax.device_put(q, sharding)
    pl = jfmm.plan(xs, eps=1e-5, gradient=True, tree=tree, mesh=mesh)
    total = jax.jit(lambda p, x, q: p.update(x).apply(q, gradient=True))
    build = jax.jit(lambda p, x: p.update(x).tree)
    apply = jax.jit(lambda p, q: p.apply(q, gradient=True))
    phi, grad = apply(pl, qs)
    idx = sample(rng, len(x))
    ref = reference(x.astype(np.float64), q.astype(np.float64), x[idx].astype(np.float64))
    n_dev = 1 if mesh is None else mesh.devices.size
    return dict(n=len(x), devices=n_dev, order=pl.order, depth=pl.tree.depth,
                total_ms=1e3 * median_time(total, pl, xs, qs, repeats=repeats),
                build_ms=1e3 * median_time(build, pl, xs, repeats=repeats),
                apply_ms=1e3 * median_time(apply, pl, qs, repeats=repeats),
                err_phi=rel(np.asarray(phi)[idx], ref[0]),
                err_grad=rel(np.asarray(grad)[idx], ref[1]),
                mb_in=traffic_mb(pl, n_dev), mb_device=device_mb(total, pl, xs, qs))


def device_mb(f, *args) -> float:
    """MB one device holds for jitted f(*args): its arguments, outputs and
    temporaries as XLA's compiled program allocates them (per device on a
    mesh), not a measured peak."""
    mem = f.lower(*args).compile().memory_analysis()
    return (mem.argument_size_in_bytes + mem.output_size_in_bytes
            + mem.temp_size_in_bytes) / 1e6


@contextlib.contextmanager
def local_collectives(me, n_dev: int):
    """jax.lax's collectives as one device's stand-ins while tracing. A
    ring step keeps the device's own block: the near field's pairs follow
    the leaf table of the block's origin, so the work (not the values) is
    that of the real ring."""
    names = ("axis_index", "all_gather", "psum", "psum_scatter", "ppermute")
    saved = [getattr(jax.lax, k) for k in names]
    jax.lax.axis_index = lambda name: me
    jax.lax.all_gather = lambda x, axis_name, tiled=False: jnp.concatenate([x] * n_dev)
    jax.lax.psum = lambda x, axis_name: x
    jax.lax.psum_scatter = lambda x, axis_name, tiled=False: x[:x.shape[0] // n_dev]
    jax.lax.ppermute = lambda x, axis_name, perm: x
    try:
        yield
    finally:
        for k, f in zip(names, saved):
            setattr(jax.lax, k, f)


def shard_times(pl, q, n_dev: int, repeats: int) -> list[float]:
    """Milliseconds of each device's share of `pl.apply(q, gradient=True)`
    on n_dev devices, computed alone (`local_collectives`)."""
    tree, cfg = pl.tree, pl.config
    pad = lambda a, edge: distributed._pad(a, n_dev, edge)          # noqa: E731
    q = jnp.asarray(q)[:, None]
    if cfg.tree == "adaptive":
        arrays = (pad(tree.src_sorted, True), pad(q[tree.src_perm], False),
                  pad(tree.src_leaf, True), pad(tree.tgt_sorted, True), pad(tree.tgt_leaf, True))
        whole, shard = (tree, (pl.ops, pl.kernel)), distributed._adaptive_shard
        static = dict(n=tree.src_sorted.shape[0])
    else:
        perm = lambda p: distributed._pad_perm(p, n_dev)              # noqa: E731
        arrays = (pad(tree.src_sorted, True), perm(tree.src_perm), pad(tree.src_leaf, True),
                  pad(tree.tgt_sorted, True), perm(tree.tgt_perm), pad(tree.tgt_leaf, True),
                  pad(q, False))
        whole = (tree.src_start, tree.tgt_start, tree.lo, tree.side, (pl.ops, pl.kernel))
        shard, static = distributed._shard, {}
    rows = len(arrays)

    @jax.jit
    def one(me, *args):
        local = [jax.lax.dynamic_slice_in_dim(a, me * (a.shape[0] // n_dev), a.shape[0] // n_dev)
                 for a in args[:rows]]
        with local_collectives(me, n_dev):
            return shard(*local, *args[rows:], config=cfg, depth=tree.depth, dim=tree.dim,
                         axis="x", n_dev=n_dev, gradient=True, mode=backend.current(),
                         **static)

    return [1e3 * median_time(one, jnp.int32(s), *arrays, *whole, repeats=repeats)
            for s in range(n_dev)]


def main():
    ap = parser(__doc__)
    ap.add_argument("--strong", type=int, default=24, help="log2 N of strong scaling")
    ap.add_argument("--weak", type=int, default=22,
                    help="log2 N per GPU of weak scaling (0: no weak scaling)")
    ap.add_argument("--emulate", default=None,
                    help="device counts to emulate on one GPU (1,2,4,8); else real meshes")
    ap.add_argument("--points", default="cube", choices=("cube", "plummer"),
                    help="cube: the uniform tree; plummer: an adaptive one")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    tree = "uniform" if args.points == "cube" else "adaptive"
    table = Table(f"3D Laplace on several GPUs, float32, eps 1e-5, {args.points} points, "
                  f"{tree} tree", COLUMNS)
    gpus = len(jax.devices())

    def pointset(n):
        return (make_points(args.points, n, rng).astype(np.float32),
                (rng.random(n) - 0.5).astype(np.float32))

    if args.emulate:
        x, q = pointset(2 ** args.strong)
        table.add(dict(measure(x, q, None, args.repeats, rng, tree), scaling="no mesh"))
        one = measure(x, q, Mesh(np.array(jax.devices()[:1]), ("x",)), args.repeats, rng, tree)
        table.add(dict(one, scaling="mesh of 1"))
        pl = jfmm.plan(x, eps=1e-5, gradient=True, tree=tree)
        for d in (int(v) for v in args.emulate.split(",")):
            shards = shard_times(pl, q, d, args.repeats)
            table.add(dict(one, scaling="emulated", devices=d, apply_ms=None,
                           total_ms=one["build_ms"] + max(shards), shard_ms=max(shards),
                           shard_mean_ms=float(np.mean(shards)), mb_in=traffic_mb(pl, d),
                           efficiency=one["apply_ms"] / (d * max(shards))))
    else:
        counts = [d for d in (1, 2, 4, 8) if d <= gpus]
        for scaling in ("strong", "weak") if args.weak else ("strong",):
            base = None
            for d in counts:
                x, q = pointset(2 ** args.strong if scaling == "strong" else d * 2 ** args.weak)
                row = measure(x, q, Mesh(np.array(jax.devices()[:d]), ("x",)), args.repeats, rng,
                              tree)
                base = base or row["total_ms"]
                row.update(scaling=scaling, efficiency=base / row["total_ms"]
                           / (d if scaling == "strong" else 1))
                table.add(row)
    table.save(args.out)


if __name__ == "__main__":
    main()
