"""Two coaxial vortex rings leapfrogging, with jfmm.vortex.

    pip install "jfmm[examples]"                 # matplotlib for the picture (from a clone: ".[examples]")
    python examples/vortex_rings.py              # 2 x 128 elements, 300 RK4 steps (CPU)
    python examples/vortex_rings.py --n 16384 --tracers 1048576 --leaf-size 64   # a GPU

About 40 s on a 2-core CPU at the default size, compilation included.

Two rings of radius 1 and circulation 1, 0.6 apart on a common axis, each
a filament of n elements with a Rosenhead-Moore core of 0.1. The rear ring
contracts and speeds up in the field of the front ring, which widens and
slows down; the rear one passes through, and they swap roles. Elements move
with the Biot-Savart velocity, strengths change by stretching, optional
passive tracers follow the flow; RK4 steps in `jax.lax.scan` under `jax.jit`.

Prints the linear impulse I = 1/2 sum x x alpha and the kinetic energy over
time (invariants of the Euler equations, which these closed filaments
should keep), then the drift of a short run
whose sums go through the FMM's far field (leaf size --leaf-size, eps
--compare-eps) beside the same run with every pair summed directly. Saves vortex_rings.png: side views
of the rings at a few times, and the rings' radii and positions against time.
"""
import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from jfmm import vortex

jax.config.update("jax_enable_x64", True)
CORE, SMOOTHING = 0.1, "rosenhead_moore"


def ring(n, z):
    t = 2 * np.pi * (np.arange(n) + 0.5) / n
    x = np.stack([np.cos(t), np.sin(t), np.full(n, z)], -1)
    alpha = 2 * np.pi / n * np.stack([-np.sin(t), np.cos(t), np.zeros(n)], -1)
    return x, alpha


def initial(n, tracers, rng):
    (x1, a1), (x2, a2) = ring(n, 0.0), ring(n, 0.6)
    r = 1.6 * np.sqrt(rng.random(tracers))
    t = 2 * np.pi * rng.random(tracers)
    tr = np.stack([r * np.cos(t), r * np.sin(t), -0.5 + 1.6 * rng.random(tracers)], -1)
    return vortex.State(jnp.asarray(np.concatenate([x1, x2])),
                        jnp.asarray(np.concatenate([a1, a2])), jnp.asarray(tr))


def simulate(state, dt, steps, every, leaf_size, eps, scheme="rk4"):
    """States and their energies every `every` steps: a scan of scans, one jit."""
    def one(s, _):
        return vortex.step(s, dt, core=CORE, smoothing=SMOOTHING, eps=eps, scheme=scheme,
                           leaf_size=leaf_size), None

    def chunk(s, _):
        s = jax.lax.scan(one, s, None, length=every)[0]
        return s, (s, vortex.energy(s.positions, s.strengths, core=CORE, smoothing=SMOOTHING,
                                    eps=eps, leaf_size=leaf_size))

    return jax.jit(lambda s: jax.lax.scan(chunk, s, None, length=steps // every)[1])(state)


def diagnostics(states, energy, n):
    imp = jax.vmap(vortex.impulse)(states.positions, states.strengths)
    radius = jnp.linalg.norm(states.positions[..., :2], axis=-1)
    rings = (slice(0, n), slice(n, 2 * n))
    return (np.asarray(imp), np.asarray(energy),
            np.stack([np.asarray(radius[:, r].mean(1)) for r in rings], -1),
            np.stack([np.asarray(states.positions[:, r, 2].mean(1)) for r in rings], -1))


def figure(states, n, times, radii, zs, path):
    try:
        import matplotlib
    except ImportError:
        print("no picture: matplotlib is not installed (pip install 'jfmm[examples]')")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    picks = np.linspace(0, len(times) - 1, 4).astype(int)
    fig = plt.figure(figsize=(12, 6.5))
    for k, i in enumerate(picks):
        ax = fig.add_subplot(2, 4, k + 1)
        tr = np.asarray(states.tracers[i])
        if len(tr):
            ax.scatter(tr[:, 0], tr[:, 2], s=0.3, c="0.7", lw=0, rasterized=True)
        x = np.asarray(states.positions[i])
        ax.scatter(x[:n, 0], x[:n, 2], s=4, c="tab:blue", label="ring 1")
        ax.scatter(x[n:, 0], x[n:, 2], s=4, c="tab:red", label="ring 2")
        ax.set_title(f"t = {times[i]:.1f}")
        mid = float(x[:, 2].mean())
        ax.set_xlim(-1.7, 1.7)
        ax.set_ylim(mid - 1.2, mid + 1.2)
        ax.set_xlabel("x")
        ax.set_ylabel("z")
        ax.set_aspect("equal")
        if k == 0:
            ax.legend(loc="lower left", fontsize=8)
    for col, (data, label) in enumerate(((radii, "mean radius"), (zs, "mean z"))):
        ax = fig.add_subplot(2, 2, 3 + col)
        ax.plot(times, data[:, 0], c="tab:blue", label="ring 1")
        ax.plot(times, data[:, 1], c="tab:red", label="ring 2")
        ax.set_xlabel("t")
        ax.set_ylabel(label)
        ax.legend()
    fig.suptitle(f"Leapfrogging vortex rings: {2 * n} elements, Rosenhead-Moore core {CORE}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=128, help="elements per ring")
    p.add_argument("--tracers", type=int, default=500)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--dt", type=float, default=0.05)
    p.add_argument("--every", type=int, default=10, help="steps between saved states")
    p.add_argument("--eps", type=float, default=1e-6)
    p.add_argument("--leaf-size", type=int, default=4,
                   help="of the FMM run beside the direct one (small: a far field at small n)")
    p.add_argument("--compare-steps", type=int, default=10)
    p.add_argument("--compare-eps", type=float, default=1e-4,
                   help="eps of that comparison (its stretching sums at eps / 5 through "
                        "Chebyshev's far field: tighter ones compile far longer on a CPU)")
    p.add_argument("--out", default="vortex_rings.png")
    args = p.parse_args()

    state = initial(args.n, args.tracers, np.random.default_rng(0))
    t0 = time.perf_counter()
    states, energy = simulate(state, args.dt, args.steps, args.every, None, args.eps)
    jax.block_until_ready(states)
    print(f"{2 * args.n} elements, {args.tracers} tracers, {args.steps} RK4 steps: "
          f"{time.perf_counter() - t0:.1f} s (compilation included)")
    times = args.dt * args.every * np.arange(1, args.steps // args.every + 1)
    imp, energy, radii, zs = diagnostics(states, energy, args.n)
    imp0 = np.asarray(vortex.impulse(state.positions, state.strengths))
    e0 = float(vortex.energy(state.positions, state.strengths, core=CORE, smoothing=SMOOTHING,
                             eps=args.eps))
    print("     t    I_z        |I - I0|/|I0|   E          E/E0 - 1    radii")
    for i in np.linspace(0, len(times) - 1, 6).astype(int):
        print(f"{times[i]:6.2f}  {imp[i, 2]:.6f}  {np.linalg.norm(imp[i] - imp0) / np.linalg.norm(imp0):.2e}"
              f"        {energy[i]:.6f}  {energy[i] / e0 - 1:+.2e}   {radii[i, 0]:.3f} {radii[i, 1]:.3f}")
    passes = np.sum(np.diff(np.sign(zs[:, 1] - zs[:, 0])) != 0)
    print(f"the rings passed through each other {passes} time(s)")

    # A short horizon through the FMM's far field beside the direct sum
    # (forward Euler, elements only: the least to compile).
    steps, elements = args.compare_steps, state._replace(tracers=state.tracers[:0])
    runs = {name: simulate(elements, args.dt, steps, steps, leaf, args.compare_eps, "euler")[0]
            for name, leaf in (("fmm", args.leaf_size), ("direct", 2 * args.n))}
    for name, s in runs.items():
        drift = np.linalg.norm(np.asarray(vortex.impulse(s.positions[-1], s.strengths[-1]))
                               - imp0) / np.linalg.norm(imp0)
        print(f"{name:6s} after {steps} Euler steps: impulse drift {drift:.2e}")
    gap = float(jnp.max(jnp.abs(runs["fmm"].positions[-1] - runs["direct"].positions[-1])))
    print(f"largest element position difference fmm - direct: {gap:.2e}")
    figure(states, args.n, times, radii, zs, args.out)


if __name__ == "__main__":
    main()
