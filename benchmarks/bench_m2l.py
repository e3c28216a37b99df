"""M2L of one level on the GPU: the jnp operator (XLA products) against the
Pallas kernel, with translations per second and error.

    python benchmarks/bench_m2l.py --level 5 --orders 8,11 \
        --variants "jnp;64,128,4,2,TF32_TF32_F32_X3;64,128,4,2,F32_F32_F32" \
        --out docs/data/m2l.json

Multipoles are those of a uniform random cube at --level (32 points per
box, mixed-sign charges, 3D Laplace operators of order p). Each variant is
'jnp' (float32 products), 'bf16x6' (six bfloat16 products,
`translate._product`), either with ':loop' (one product per neighbour
position, as above GATHER_BYTES), 'xla:ALGORITHM' (the jnp operator with its products at that
`jax.lax.DotAlgorithmPreset`) or Pallas tiles 'parents,width,warps,stages,
algorithm'. Error: relative L2 of the level's locals against the jnp
operator in float64. Translations: source-target box pairs of the level.

JSON row fields: level, n, dtype, order, variant, translations, time_ms,
translations_per_s, err_local, error (a failed variant's message).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

# common puts the checkout on sys.path, before jfmm is imported.
from common import make_points, median_time, parser, rel, Table  # noqa: E402

from bench_laplace import m2l_tiles  # noqa: E402
from jfmm import passes  # noqa: E402
from jfmm.configure import Config  # noqa: E402
from jfmm.ops import laplace3d, translate  # noqa: E402
from jfmm.ops.pallas import m2l as pallas_m2l  # noqa: E402
from jfmm.tree import build, lists  # noqa: E402

COLUMNS = [
    ("order", "p", "d"), ("variant", "variant", ""),
    ("time_ms", "ms", lambda r: f"failed: {r['error']}" if r.get("error")
     else f"{r['time_ms']:.3f}"),
    ("translations_per_s", "translations/s", ".3g"), ("err_local", "err vs float64", ".2e"),
]


def translations(level: int) -> int:
    """Well-separated (source, target) box pairs at `level` of the full grid."""
    nbr = np.asarray(lists.neighbors(level - 1, 3))
    steps = pallas_m2l.steps(3)                                  # (8, n, 3)
    live = nbr[:, steps[:, :, 0]] < nbr.shape[0]                 # (B, 8, n)
    return int(live.sum())


def _patched(name: str, value, bf16x6: bool, level: int):
    """translate.m2l traced with the module constant `name` set to value."""
    def f(m, w):
        old = getattr(translate, name)
        setattr(translate, name, value)
        try:
            return translate.m2l(m, level, w, 3, bf16x6)
        finally:
            setattr(translate, name, old)
    return jax.jit(f)


def run(variant: str, level: int):
    if variant.split(":")[0] in ("jnp", "bf16x6"):
        bf16x6 = variant.startswith("bf16x6")
        if variant.endswith(":loop"):          # the loop over neighbour positions
            return _patched("GATHER_BYTES", 0, bf16x6, level)
        return jax.jit(lambda m, w: translate.m2l(m, level, w, 3, bf16x6))
    if variant.startswith("xla:"):
        return _patched("HIGHEST", getattr(jax.lax.DotAlgorithmPreset, variant[4:]), False, level)
    tiles = m2l_tiles(variant)
    return jax.jit(lambda m, w: pallas_m2l.m2l(m, level, w, 3, tiles))


def main():
    ap = parser(__doc__)
    ap.set_defaults(repeats=10)
    ap.add_argument("--level", type=int, default=5)
    ap.add_argument("--orders", default="11")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--variants", default="jnp;64,128,4,2,TF32_TF32_F32_X3")
    args = ap.parse_args()
    dtype = np.dtype(args.dtype).type
    level = args.level
    n_tr = translations(level)
    rng = np.random.default_rng(args.seed)
    n = 32 * 8 ** level
    x = jnp.asarray(make_points("cube", n, rng), dtype)
    q = jnp.asarray(rng.random((n, 1)) - 0.5, dtype)
    tree = jax.jit(build, static_argnames="depth")(x, None, depth=level)
    table = Table(f"M2L of level {level}, {n_tr:,} translations, {args.dtype}", COLUMNS)
    for p in map(int, args.orders.split(",")):
        ops = Config(laplace3d, p, 2, 0.0).operators(3, dtype)
        ops64 = Config(laplace3d, p, 2, 0.0).operators(3, jnp.float64)
        mult = passes.upward(tree, q[tree.src_perm], laplace3d, ops, p, "jnp")[level]
        want = translate.m2l(mult.astype(jnp.float64), level, ops64.m2l, 3)
        row = dict(level=level, n=n, dtype=args.dtype, order=p, translations=n_tr)
        for variant in args.variants.split(";"):
            try:
                f = run(variant, level)
                got = f(mult, ops.m2l)
                t = median_time(f, mult, ops.m2l, repeats=args.repeats)
            except Exception as e:  # noqa: BLE001  (report and go on)
                table.add(dict(row, variant=variant,
                               error=f"{type(e).__name__}: {str(e).splitlines()[0][:150]}"))
                continue
            table.add(dict(row, variant=variant, time_ms=t * 1e3, translations_per_s=n_tr / t,
                           err_local=rel(got, want)))
    table.save(args.out)


if __name__ == "__main__":
    main()
