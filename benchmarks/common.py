"""What the benchmarks share: options, timing, points, references, output.

Every benchmark builds its parser with `parser(__doc__)` (--repeats, --seed,
--out), times with `median_time` and writes through a `Table`: a markdown row
printed as each measurement is made and, with --out, one JSON file

    {"environment": environment(), "title": ..., "rows": [row, ...]}

that benchmarks/plot.py draws from. Row fields: `n`, the configuration
(`kernel`, `dim`, `points`, `dtype`, `eps`, `family`, `order`, `depth`),
per-call times in milliseconds (`*_ms`), first calls and compilations in
seconds (`*_s`), relative L2 errors (`err_phi`, `err_grad`, ...); a value
not measured is null.
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

import jfmm  # noqa: E402
from jfmm import _reference  # noqa: E402


def parser(doc: str, repeats: bool = True) -> argparse.ArgumentParser:
    """An argument parser described by the first line of `doc`, with the
    shared options --repeats (unless repeats is False), --seed and --out."""
    ap = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    if repeats:
        ap.add_argument("--repeats", type=int, default=5, help="timed calls per median")
    ap.add_argument("--seed", type=int, default=0, help="seed of the points and charges")
    ap.add_argument("--out", default=None, help="JSON file to write (default: print only)")
    return ap


def floats(spec: str) -> list[float]:
    """A comma-separated list of floats ('1e-3,1e-4')."""
    return [float(v) for v in spec.split(",")]


def median_time(f, *args, repeats: int) -> float:
    """Seconds per call of f(*args): one call to compile, then the median of
    `repeats` calls, each waited for."""
    jax.block_until_ready(f(*args))
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def kernel_times(f, *args, repeats: int = 3, top: int = 20) -> list[tuple[str, float, float]]:
    """The `top` device kernels of f(*args) by time: (HLO op name, ms per
    call, launches per call), from a `jax.profiler` trace of `repeats`
    calls after a first. On a GPU run with
    XLA_FLAGS=--xla_gpu_enable_command_buffer= for one row per kernel (XLA's
    command buffers otherwise launch many as one); empty where no device
    kernels are traced (a CPU)."""
    jax.block_until_ready(f(*args))
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            for _ in range(repeats):
                jax.block_until_ready(f(*args))
        data = jax.profiler.ProfileData.from_file(
            glob.glob(f"{d}/**/*.xplane.pb", recursive=True)[0])
    total, count = collections.Counter(), collections.Counter()
    for plane in data.planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        for line in plane.lines:
            if line.name.startswith("Stream"):
                for ev in line.events:
                    name = dict(ev.stats).get("hlo_op", ev.name)
                    total[name] += ev.duration_ns / 1e6 / repeats
                    count[name] += 1 / repeats
    return [(k, v, count[k]) for k, v in total.most_common(top)]


def first_time(f, *args):
    """(f(*args), seconds) of one call, waited for: the first call of a
    jitted f is its compilation plus one run."""
    t0 = time.perf_counter()
    out = jax.block_until_ready(f(*args))
    return out, time.perf_counter() - t0


def rel(a, b) -> float:
    """Relative L2 error of a against b, in float64."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def make_points(kind: str, n: int, rng, dim: int = 3) -> np.ndarray:
    """n points, float64: "cube" (uniform in [0, 1]^dim), "sphere" (uniform on
    the sphere, or circle, of radius 0.5 about the cube's centre) or
    "plummer" (Plummer's model, radii clipped at 100; 3D only) or
    "clusters" (5 Gaussian clusters of sd 0.01 in [0, 1]^dim, 2% of the
    points uniform over [0, 10]^dim)."""
    if kind == "cube":
        return rng.random((n, dim))
    if kind == "sphere":
        v = rng.normal(size=(n, dim))
        return 0.5 + 0.5 * v / np.linalg.norm(v, axis=1, keepdims=True)
    if kind == "plummer" and dim == 3:
        r = 1.0 / np.sqrt(rng.random(n) ** (-2.0 / 3.0) - 1.0)
        v = rng.normal(size=(n, 3))
        return np.clip(r, 0, 100)[:, None] * v / np.linalg.norm(v, axis=1, keepdims=True)
    if kind == "clusters":
        x = rng.random((5, dim))[rng.integers(0, 5, n)] + 0.01 * rng.normal(size=(n, dim))
        out = rng.random(n) < 0.02
        x[out] = 10 * rng.random((int(out.sum()), dim))
        return x
    raise ValueError(f"points {kind!r} in {dim}D: use cube, sphere, clusters or (3D) plummer")


def moment_free(q: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Charges q (N, k) at points x (N, d) projected to zero sum and zero
    first moments sum_i q_i x_i, as the weights of an RBF interpolant with a
    linear polynomial tail are."""
    p = np.hstack([np.ones((x.shape[0], 1)), x])
    return q - p @ np.linalg.lstsq(p, q, rcond=None)[0]


def sample(rng, n: int, k: int = 1000) -> np.ndarray:
    """min(k, n) distinct indices: the targets errors are measured on."""
    return rng.choice(n, size=min(k, n), replace=False)


REFERENCE_CHUNK = 2 ** 26


def reference(x64, q64, y64):
    """3D Laplace potential and gradient at y64 by a float64 direct sum:
    numpy for small N, else jfmm.direct in float64 on the device (numpy took
    minutes at 2^22 and more), over chunks of REFERENCE_CHUNK sources."""
    if len(x64) <= 2 ** 18:
        return _reference.laplace3d(x64, q64, y64)
    phi, grad = 0.0, 0.0
    with jax.enable_x64(True):
        for s in range(0, len(x64), REFERENCE_CHUNK):        # memory O(chunk) on the device
            p, g = jfmm.direct(jnp.asarray(x64[s:s + REFERENCE_CHUNK]),
                               jnp.asarray(q64[s:s + REFERENCE_CHUNK]), jnp.asarray(y64),
                               gradient=True)
            phi, grad = phi + np.asarray(p), grad + np.asarray(g)
    return phi, grad


def _commit() -> str | None:
    """Short hash of the checkout's HEAD ($JFMM_COMMIT where the tree was
    copied without its git folder), or None."""
    if os.environ.get("JFMM_COMMIT"):
        return os.environ["JFMM_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def environment() -> dict:
    """Where and with what the numbers were measured (read when called: set
    the backend before)."""
    from jfmm.ops import backend
    current, m2l = (getattr(backend, name, None) for name in ("current", "m2l_choice"))
    dev = jax.devices()[0]
    return {"device": dev.device_kind, "platform": dev.platform, "jax": jax.__version__,
            "date": time.strftime("%Y-%m-%d"), "commit": _commit(),
            "backend": current() if current else None,
            # the M2L formulation is a GPU choice; the CPU runs the jnp one
            "m2l": str(m2l()) if m2l and dev.platform == "gpu" else None}


def _plain(v):
    """v as a JSON value: numpy scalars as Python numbers, NaN as null."""
    if isinstance(v, (np.integer, np.bool_)):
        return v.item()
    if isinstance(v, (float, np.floating)):
        v = float(v)
        return None if math.isnan(v) else v
    if isinstance(v, (list, tuple)):
        return [_plain(u) for u in v]
    if isinstance(v, dict):
        return {k: _plain(u) for k, u in v.items()}
    return v


def write_json(out: str, title: str, rows: list[dict], append: bool = False) -> None:
    """Write {"environment", "title", "rows"} to `out` (its folder created);
    with append, after the rows already in `out` if it exists."""
    rows = [_plain(r) for r in rows]
    if append and os.path.exists(out):
        with open(out) as fh:
            rows = json.load(fh)["rows"] + rows
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as fh:
        json.dump({"environment": environment(), "title": title, "rows": rows}, fh, indent=1)
    print(f"wrote {out}", flush=True)


class Table:
    """Rows printed as markdown when added (the title and header once) and
    kept for `save`.

    columns: (key, header, format) triples; format is a format spec for
    row[key] ('.2f', ',') or a function of the whole row returning the cell.
    A missing, None or NaN value prints '-'."""

    def __init__(self, title: str, columns):
        self.title, self.columns, self.rows = title, columns, []
        self._printed = False

    def add(self, row: dict) -> dict:
        if not self._printed:
            env = environment()
            print(f"# {self.title}\n# {env['device']}, jax {env['jax']}, {env['date']}, "
                  f"commit {env['commit']}, backend {env['backend']}, M2L {env['m2l']}")
            print("| " + " | ".join(h for _, h, _ in self.columns) + " |")
            print("|" + "---|" * len(self.columns), flush=True)
            self._printed = True
        print("| " + " | ".join(self._cell(row, k, f) for k, _, f in self.columns) + " |",
              flush=True)
        self.rows.append(row)
        return row

    @staticmethod
    def _cell(row, key, fmt) -> str:
        if callable(fmt):
            return fmt(row)
        v = row.get(key)
        if v is None or isinstance(v, float) and math.isnan(v):
            return "-"
        return format(v, fmt)

    def save(self, out: str | None, append: bool = False) -> None:
        """Write the rows to `out` as JSON (nothing if out is None)."""
        if out:
            write_json(out, self.title, self.rows, append)
