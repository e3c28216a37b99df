"""Where the P2P kernel's instructions go: SASS of the all-pairs loop and
timings of variants that each drop one part of the per-pair work.

    python benchmarks/p2p_probe.py

Variants (float32, potential + gradient; targets are not the sources, so no
pair coincides and every variant gives finite sums):
  base      the kernel as it is
  ftz       1/sqrt as PTX rsqrt.approx.ftz.f32 (libdevice's rsqrt handles
            subnormal inputs with extra instructions)
  noguard   no r = 0 select (unsafe where points coincide)
  ftz+noguard
SASS comes from XLA's PTX dump compiled with the ptxas found on the machine.
"""
from __future__ import annotations

import glob
import os
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from jfmm import kernels  # noqa: E402
from jfmm.ops.pallas import p2p as pallas_p2p  # noqa: E402
from jfmm.tree import build, lists  # noqa: E402
from bench_laplace import median_time  # noqa: E402

K = kernels.Laplace3D()
_rsqrt = jax.lax.rsqrt
_pair = kernels.Laplace3D.pair


def rsqrt_ftz(x):
    if x.dtype != jnp.float32:
        return _rsqrt(x)
    from jax.experimental.pallas import triton as plgpu
    return plgpu.elementwise_inline_asm(
        "rsqrt.approx.ftz.f32 $0, $1;", args=[x], constraints="=r,r", pack=1,
        result_shape_dtypes=[jax.ShapeDtypeStruct(x.shape, x.dtype)])[0]


def pair_noguard(self, r2, gradient, differentiable=True):
    inv = jax.lax.rsqrt(r2)
    return inv, (inv * inv * (inv * -1.0) if gradient else None)


def variant(name):
    jax.lax.rsqrt = rsqrt_ftz if "ftz" in name else _rsqrt
    kernels.Laplace3D.pair = pair_noguard if "noguard" in name else _pair


VARIANTS = ["base", "ftz", "noguard", "ftz+noguard"]


def tool(name):
    hits = sorted(glob.glob(f"/usr/local/cuda*/bin/{name}") + glob.glob(
        f"/usr/**/site-packages/**/bin/{name}", recursive=True) + glob.glob(
        f"/usr/local/lib/python3*/**/bin/{name}", recursive=True))
    return hits[0] if hits else None


def sass(name, blocks, n=4096):
    """SASS of the all-pairs kernel at these tiles, written to $OUT."""
    out = os.environ.get("OUT", "out")
    d = tempfile.mkdtemp()
    x = jnp.asarray(np.random.default_rng(1).random((n, 3)), jnp.float32)
    y = x + 0.5
    q = jnp.ones((n, 1), jnp.float32)
    s = jnp.array([0, n, n], jnp.int32)
    f = jax.jit(lambda y, x, q: pallas_p2p.near_field(
        K, y, s, x, q, s, jnp.zeros((1, 1), jnp.int32), True, blocks=blocks))
    hlo = f.lower(y, x, q).compile()  # noqa: F841 (compiled with the dump flags below)
    ptxas, disasm = tool("ptxas"), tool("cuobjdump")
    ptx = sorted(glob.glob(os.path.join(os.environ["DUMPDIR"], "*.ptx")))
    print(f"ptxas {ptxas}, cuobjdump {disasm}, {len(ptx)} ptx files")
    with open(os.path.join(out, "sass.txt"), "a") as fh:
        for p in ptx:
            if "rsqrt" not in open(p).read():
                continue
            cubin = os.path.join(d, "k.cubin")
            r = subprocess.run([ptxas, "-arch=sm_90a", "-O3", p, "-o", cubin],
                               capture_output=True, text=True)
            if r.returncode:
                fh.write(f"ptxas failed on {p}: {r.stderr[:2000]}\n")
                continue
            r = subprocess.run([disasm, "-sass", cubin], capture_output=True, text=True)
            fh.write(f"\n\n######## {name} {blocks} {os.path.basename(p)}\n{r.stdout}")
    for p in ptx:
        os.remove(p)


def all_pairs(n, blocks, rng):
    x = jnp.asarray(rng.random((n, 3)), jnp.float32)
    y = jnp.asarray(rng.random((n, 3)) + 1e-3, jnp.float32)
    q = jnp.asarray(rng.random((n, 1)) - 0.5, jnp.float32)
    s = jnp.array([0, n, n], jnp.int32)
    f = jax.jit(lambda y, x, q: pallas_p2p.near_field(
        K, y, s, x, q, s, jnp.zeros((1, 1), jnp.int32), True, blocks=blocks))
    t = median_time(f, y, x, q, repeats=5 if n <= 2 ** 18 else 3)
    phi = np.asarray(f(y, x, q)[0])[:200, 0]
    xd, qd, yd = (np.asarray(a, np.float64) for a in (x, q, y))
    r = np.linalg.norm(yd[:200, None] - xd[None], axis=-1)
    ref = (qd[None, :, 0] / r).sum(1)
    return t, n * n / t, np.linalg.norm(phi - ref) / np.linalg.norm(ref)


def near(depth, blocks, x, q):
    t = jax.jit(build, static_argnames="depth")(x, None, depth=depth)
    nb = lists.neighbors(depth, 3)
    cnt = np.diff(np.asarray(t.src_start)[: 2 ** (3 * depth) + 1])
    pairs = float((cnt * np.append(cnt, 0)[np.asarray(nb)].sum(1)).sum())
    qs = q[t.src_perm]
    f = jax.jit(lambda *a: pallas_p2p.near_field(K, *a, True, blocks=blocks))
    args = (t.tgt_sorted, t.tgt_start, t.src_sorted, qs, t.src_start, nb)
    tm = median_time(f, *args, repeats=5)
    return tm, pairs / tm


def main():
    rng = np.random.default_rng(0)
    print(f"# {jax.devices()[0].device_kind}, jax {jax.__version__}")
    parts = sys.argv[1].split(",") if len(sys.argv) > 1 else ["sass", "all", "near"]
    shapes = [pallas_p2p.Blocks(8, 32), pallas_p2p.Blocks(8, 16)]
    if "sass" in parts:
        for v in ("base", "ftz+noguard"):
            variant(v)
            sass(v, shapes[0])
    if "all" in parts:
        print("\n| variant | N | tiles | ms | pairs/s | err |\n|---|---|---|---|---|---|")
        for n in (2 ** 16, 2 ** 20):
            for b in shapes + [pallas_p2p.Blocks(16, 32), pallas_p2p.Blocks(16, 64, 4)]:
                for v in VARIANTS:
                    variant(v)
                    t, rate, err = all_pairs(n, b, rng)
                    print(f"| {v} | {n} | {b.targets}x{b.sources},{b.num_warps} | {t * 1e3:.2f} "
                          f"| {rate:.3g} | {err:.1e} |", flush=True)
    if "near" in parts:
        print("\n| variant | depth | tiles | ms | pairs/s |\n|---|---|---|---|---|")
        n = 2 ** 20
        x = jnp.asarray(rng.random((n, 3)), jnp.float32)
        q = jnp.asarray(rng.random((n, 1)) - 0.5, jnp.float32)
        for depth in (4, 5):
            for b in shapes:
                for v in VARIANTS:
                    variant(v)
                    tm, rate = near(depth, b, x, q)
                    print(f"| {v} | {depth} | {b.targets}x{b.sources},{b.num_warps} | "
                          f"{tm * 1e3:.2f} | {rate:.3g} |", flush=True)
    variant("base")


if __name__ == "__main__":
    main()
