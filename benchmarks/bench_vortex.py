"""Vortex methods: Biot-Savart velocities and vortex-ring RK4 steps (jfmm.vortex).

    python benchmarks/bench_vortex.py --out docs/data/vortex.json

Velocity rows: N elements with random strengths on a cube, u at the
elements themselves, `jax.jit(vortex.velocity)` (the tree built inside, from
traced points: what a time step does), median after compilation; the
error is the relative L2 error of u on 1,000 sampled elements against a
float64 Biot-Savart sum written here in jnp (chunked over the sources).
Step rows: two coaxial rings, each a bundle of filaments (elements spread
over a core disk of radius 0.1), plus tracers in a cylinder around them; one
jitted `vortex.step` (RK4: four stages, each a `stretching` sum at the
elements and a `velocity` sum at the tracers), and the error of the
velocities a first stage computes, at sampled tracers (or elements where
there are none), as above.
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from common import Table, floats, kernel_times, median_time, parser, rel, sample, write_json

from jfmm import vortex

COLUMNS = [
    ("case", "case", ""), ("smoothing", "core", ""), ("n", "elements", ","),
    ("m", "targets", ","), ("dtype", "dtype", ""), ("eps", "eps", "g"),
    ("time_ms", "time ms", lambda r: f"**{r['time_ms']:.1f}**"),
    ("first_s", "first call s", ".1f"), ("err_u", "err", ".2e"),
]


def biot_savart(x, a, y, smoothing, core, chunk=2 ** 16):
    """float64 u at y by a chunked jnp sum (pairs at distance 0 skipped)."""
    x, a, y = (jnp.asarray(v, jnp.float64) for v in (x, a, y))

    def part(u, xa):
        xs, as_ = xa
        d = y[:, None, :] - xs[None]
        r2 = jnp.sum(d * d, -1)
        if smoothing == "singular":
            f = jnp.where(r2 > 0, r2 ** -1.5, 0.0)
        elif smoothing == "rosenhead_moore":
            f = (r2 + core * core) ** -1.5
        elif smoothing == "polynomial":         # (r/core)^2 / r^3 inside the core
            f = jnp.where(r2 >= core * core, jnp.where(r2 > 0, r2, 1.0) ** -1.5,
                          jnp.where(r2 > 0, jax.lax.rsqrt(jnp.where(r2 > 0, r2, 1.0)), 0.0)
                          / (core * core))
        else:
            raise ValueError(f"no reference for smoothing {smoothing!r}")
        return u - jnp.einsum("mn,mni->mi", f, jnp.cross(d, as_[None])) / (4 * jnp.pi), None

    pad = -len(x) % chunk
    xs = jnp.concatenate([x, jnp.full((pad, 3), 1e6)]).reshape(-1, chunk, 3)
    as_ = jnp.concatenate([a, jnp.zeros((pad, 3))]).reshape(-1, chunk, 3)
    return jax.lax.scan(part, jnp.zeros_like(y), (xs, as_))[0]


def reference_u(x, a, y, smoothing, core):
    with jax.enable_x64(True):
        return np.asarray(jax.jit(biot_savart, static_argnums=(3,))(x, a, y, smoothing, core))


def reference_stretching(x, a, y, along, smoothing, core):
    """float64 (along_m . grad) u at y_m: `biot_savart` differentiated along
    the targets in forward mode."""
    def f(x, a, y, along):
        return jax.jvp(lambda t: biot_savart(x, a, t, smoothing, core), (y,), (along,))[1]
    with jax.enable_x64(True):
        return np.asarray(jax.jit(f)(x, a, y, along))


def velocity_row(table, n, dtype, eps, smoothing, core, repeats, rng, profile=False):
    x = rng.random((n, 3))
    a = rng.standard_normal((n, 3)) / n
    xd, ad = jnp.asarray(x, dtype), jnp.asarray(a, dtype)
    f = jax.jit(lambda x_, a_: vortex.velocity(x_, a_, core=core, smoothing=smoothing, eps=eps))
    t0 = time.perf_counter()
    u = np.asarray(jax.block_until_ready(f(xd, ad)))
    first = time.perf_counter() - t0
    t = median_time(f, xd, ad, repeats=repeats)
    i = sample(rng, n)
    x64, a64 = np.asarray(xd, np.float64), np.asarray(ad, np.float64)
    err = rel(u[i], reference_u(x64, a64, x64[i], smoothing, core))
    table.add(dict(case="velocity", smoothing=smoothing, n=n, m=n, dtype=dtype, eps=eps,
                   time_ms=1e3 * t, first_s=first, err_u=err))
    if profile:
        kernels = kernel_times(f, xd, ad)
        print(f"device kernels of the row above ({sum(v for _, v, _ in kernels):.1f} ms "
              f"in the {len(kernels)} longest):" if kernels else "no device kernels traced")
        for name, ms, launches in kernels:
            print(f"  {ms:9.3f} ms  x{launches:<5.0f} {name}")


def rings(n, rng, core_radius=0.1):
    """Two coaxial rings of radius 1, 0.6 apart, circulation 1 each, of n/2
    elements: filaments spread uniformly over the core disk."""
    half = n // 2
    fil = 64
    per = half // fil
    rho = core_radius * np.sqrt(rng.random(fil))
    phi = 2 * np.pi * rng.random(fil)
    t = 2 * np.pi * (np.arange(per) + 0.5) / per
    radius = np.broadcast_to(1 + rho[:, None] * np.cos(phi)[:, None], (fil, per))
    z = np.broadcast_to(rho[:, None] * np.sin(phi)[:, None], (fil, per))
    pos = np.stack([radius * np.cos(t), radius * np.sin(t), z], -1).reshape(-1, 3)
    tangent = np.stack([-np.sin(t), np.cos(t), np.zeros_like(t)], -1)
    strength = (2 * np.pi * radius[..., None] / per / fil * tangent).reshape(-1, 3)
    x = np.concatenate([pos, pos + [0, 0, 0.6]])
    return x, np.concatenate([strength, strength])


def ring_state(n, m, dtype, rng):
    """Two rings of n elements (`rings`) and m tracers in a cylinder about them."""
    x, a = rings(n, rng)
    r, th = 1.6 * np.sqrt(rng.random(m)), 2 * np.pi * rng.random(m)
    tr = np.stack([r * np.cos(th), r * np.sin(th), -0.5 + 1.6 * rng.random(m)], -1)
    return vortex.State(*(jnp.asarray(v, dtype) for v in (x, a, tr)))


def part_rows(table, n, m, dtype, eps, smoothing, core, repeats, rng):
    """The two sums of a step's stage, timed alone: stretching at the
    elements (its error against `reference_stretching` at sampled
    elements), velocity at the tracers (its error is the step row's)."""
    state = ring_state(n, m, dtype, rng)
    parts = {"stretching": lambda s: vortex.stretching(s.positions, s.strengths, core=core,
                                                       smoothing=smoothing, eps=eps),
             "tracer velocity": lambda s: vortex.velocity(s.positions, s.strengths, s.tracers,
                                                          core=core, smoothing=smoothing,
                                                          eps=eps)}
    for case, f in parts.items():
        if case == "tracer velocity" and not m:
            continue
        f = jax.jit(f)
        t0 = time.perf_counter()
        jax.block_until_ready(f(state))
        first = time.perf_counter() - t0
        t = median_time(f, state, repeats=repeats)
        err = None
        if case == "stretching":
            i = sample(rng, n)
            x64, a64 = (np.asarray(v, np.float64) for v in (state.positions, state.strengths))
            err = rel(np.asarray(f(state)[1])[i],
                      reference_stretching(x64, a64, x64[i], a64[i], smoothing, core))
        table.add(dict(case=case, smoothing=smoothing, n=n, m=m if case != "stretching" else n,
                       dtype=dtype, eps=eps, time_ms=1e3 * t, first_s=first, err_u=err))


def step_row(table, n, m, dtype, eps, smoothing, core, repeats, rng):
    state = ring_state(n, m, dtype, rng)
    f = jax.jit(lambda s: vortex.step(s, 0.01, core=core, smoothing=smoothing, eps=eps))
    t0 = time.perf_counter()
    jax.block_until_ready(f(state))
    first = time.perf_counter() - t0
    t = median_time(f, state, repeats=repeats)
    # The error of the step's own sums: u at every tracer (or element), as
    # a stage computes it, sampled (a call at the samples alone would be
    # configured for fewer targets).
    y = state.tracers if m else None
    u = jax.jit(lambda s, y_: vortex.velocity(s.positions, s.strengths, y_, core=core,
                                              smoothing=smoothing, eps=eps))(state, y)
    y = state.positions if y is None else y
    i = sample(rng, len(y))
    err = rel(np.asarray(u)[i], reference_u(np.asarray(state.positions, np.float64),
                             np.asarray(state.strengths, np.float64),
                             np.asarray(y, np.float64)[i], smoothing, core))
    table.add(dict(case="RK4 step", smoothing=smoothing, n=n, m=m, dtype=dtype, eps=eps,
                   time_ms=1e3 * t, first_s=first, err_u=err))


def main():
    ap = parser(__doc__)
    ap.add_argument("--sizes", default="1000000,10000000", help="velocity rows' N")
    ap.add_argument("--dtypes", default="float32,float64")
    ap.add_argument("--eps32", type=float, default=1e-5)
    ap.add_argument("--eps64", type=float, default=1e-8)
    ap.add_argument("--steps", default="32768:1048576,1048576:0",
                    help="elements:tracers of the step rows")
    ap.add_argument("--step-eps", type=floats, default=[1e-6])
    ap.add_argument("--step-dtype", default="float64")
    ap.add_argument("--core", type=float, default=0.02, help="the step rows' core size")
    ap.add_argument("--smoothing", type=lambda v: v.split(","), default=["rosenhead_moore"],
                    help="the step rows' cores, comma-separated")
    ap.add_argument("--velocity-smoothing", type=lambda v: v.split(","), default=["singular"],
                    help="the velocity rows' cores, comma-separated (a smoothed one of size "
                         "--core)")
    ap.add_argument("--parts", action="store_true",
                    help="also time a stage's two sums alone for each step row")
    ap.add_argument("--skip", default="", help="'velocity' or 'step'")
    ap.add_argument("--profile", action="store_true",
                    help="print each velocity row's longest device kernels (`kernel_times`; "
                         "set XLA_FLAGS=--xla_gpu_enable_command_buffer=)")
    args = ap.parse_args()
    jax.config.update("jax_enable_x64", True)
    rng = np.random.default_rng(args.seed)
    table = Table("Vortex methods (jfmm.vortex)", COLUMNS)
    save = (lambda: write_json(args.out, table.title, table.rows)) if args.out else (lambda: None)
    if "velocity" not in args.skip:
        for dtype in args.dtypes.split(","):
            eps = args.eps32 if dtype == "float32" else args.eps64
            for n in map(int, args.sizes.split(",")):
                for smoothing in args.velocity_smoothing:
                    core = 0.0 if smoothing == "singular" else args.core
                    velocity_row(table, n, dtype, eps, smoothing, core, args.repeats, rng,
                                 args.profile)
                    save()
    if "step" not in args.skip:
        for spec in args.steps.split(","):
            n, m = map(int, spec.split(":"))
            for eps in args.step_eps:
                for smoothing in args.smoothing:
                    step_row(table, n, m, args.step_dtype, eps, smoothing, args.core,
                             args.repeats, rng)
                    save()
                    if args.parts:
                        part_rows(table, n, m, args.step_dtype, eps, smoothing, args.core,
                                  args.repeats, rng)
                        save()


if __name__ == "__main__":
    main()
