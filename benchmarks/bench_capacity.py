"""The largest sum a device holds: jax.jit(jfmm.fmm) at growing N.

    python benchmarks/bench_capacity.py --sizes 24,26,27,28 --out docs/data/capacity.json
    python benchmarks/bench_capacity.py --sizes 24,26 --mesh      # on a mesh of the devices

3D Laplace, float32, eps 1e-5, potential and gradient, uniform cube points
on the uniform tree. Each N runs in a fresh process, since a device's peak
memory is kept per process: the first call (compilation included), the
median of --repeats later calls, the peak memory of each device, and the
errors on 1,000 targets against a float64 direct sum. A size that fails
(out of memory) is a row that says so. With --mesh the points come split
over a mesh of the local devices (`jfmm.distributed`: each holds N / D of
them).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from common import Table, median_time, parser, reference, rel, sample
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import jfmm

COLUMNS = [
    ("n", "N", ","), ("devices", "devices", "d"), ("first_s", "first call s", ".1f"),
    ("call_ms", "call ms", ".1f"), ("peak_gb", "peak GB per device", ".2f"),
    ("err_phi", "err phi", ".2e"), ("err_grad", "err grad", ".2e"), ("fails", "fails", ""),
]


def one(log2n: int, on_mesh: bool, repeats: int, seed: int) -> dict:
    """A row for N = 2^log2n, measured in this process."""
    rng = np.random.default_rng(seed)
    n = 2 ** log2n
    x = rng.random((n, 3), dtype=np.float32)
    q = (rng.random(n, dtype=np.float32) - 0.5)
    mesh = Mesh(np.array(jax.devices()), ("x",)) if on_mesh else None
    if mesh is None:
        xs, qs = jnp.asarray(x), jnp.asarray(q)
    else:
        rows = NamedSharding(mesh, PartitionSpec("x"))
        xs, qs = jax.device_put(x, rows), jax.device_put(q, rows)
    call = jax.jit(lambda x, q: jfmm.fmm(x, q, eps=1e-5, gradient=True, tree="uniform",
                                         mesh=mesh))
    t0 = time.perf_counter()
    phi, grad = jax.block_until_ready(call(xs, qs))
    first = time.perf_counter() - t0
    ms = 1e3 * median_time(call, xs, qs, repeats=repeats)
    stats = [d.memory_stats() or {} for d in jax.local_devices()]     # None on a CPU
    peak = max(st.get("peak_bytes_in_use", np.nan) for st in stats)
    idx = sample(rng, n)
    phi, grad = np.asarray(phi)[idx], np.asarray(grad)[idx]
    del xs, qs
    ref = reference(x.astype(np.float64), q.astype(np.float64), x[idx].astype(np.float64))
    return dict(n=n, devices=len(jax.devices()) if on_mesh else 1, first_s=first, call_ms=ms,
                peak_gb=peak / 1e9, err_phi=rel(phi, ref[0]), err_grad=rel(grad, ref[1]))


def main():
    ap = parser(__doc__)
    ap.add_argument("--sizes", default="24,26", help="log2 N, comma-separated")
    ap.add_argument("--mesh", action="store_true", help="points split over the local devices")
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one is not None:
        print("ROW " + json.dumps(one(args.one, args.mesh, args.repeats, args.seed)), flush=True)
        return
    table = Table("The largest sum a device holds: jax.jit(jfmm.fmm), 3D Laplace, float32, "
                  "eps 1e-5, potential and gradient, cube points, uniform tree", COLUMNS)
    for log2n in (int(v) for v in args.sizes.split(",")):
        cmd = [sys.executable, __file__, "--one", str(log2n), "--repeats", str(args.repeats),
               "--seed", str(args.seed)] + (["--mesh"] if args.mesh else [])
        run = subprocess.run(cmd, capture_output=True, text=True)
        rows = [v for v in run.stdout.splitlines() if v.startswith("ROW ")]
        if rows:
            table.add(json.loads(rows[0][4:]))
        else:
            last = (run.stderr.strip().splitlines() or ["no output"])[-1]
            table.add(dict(n=2 ** log2n, fails=last[:120]))
    table.save(args.out)


if __name__ == "__main__":
    main()
