"""Gravitational N-body with forces from jax.grad of the FMM energy.

    python examples/nbody.py            # N = 256, 20 steps on a CPU; 2^14, 200 on a GPU
    python examples/nbody.py --n 1024

About 20 s on a 2-core CPU at the default size (eps 1e-5 there: at 1e-6
the orders that keep a few hundred points' gradients within eps, 18-20,
made it 60 s; at N = 256 with leaf size 8 each FMM call costs ~0.3 s,
where the direct sum costs a millisecond:
the example shows the FMM's gradients, not its speed, which starts above
~10^4 points on a CPU).

Leapfrog (kick-drift-kick) for a cold Plummer-like cluster, masses 1/N,
G = 1, no softening. The FMM energy E = -1/2 sum_i m_i phi(x_i), with
phi = sum_j m_j / r, is differentiated by jax.grad, whose reverse rule is two
FMM calls. The same integration with jfmm.direct runs beside it; the script
prints both energy drifts and how far the two runs drift apart.
"""
import argparse

import jax
import jax.numpy as jnp
import numpy as np

import jfmm

jax.config.update("jax_enable_x64", True)


def integrate(potential, x, v, m, dt, steps):
    energy = lambda pos: -0.5 * jnp.sum(m * potential(pos, m))  # noqa: E731
    force = jax.grad(lambda pos: -energy(pos))                   # F = -dE/dx

    def step(state, _):
        pos, vel = state
        vel = vel + 0.5 * dt * force(pos) / m[:, None]
        pos = pos + dt * vel
        vel = vel + 0.5 * dt * force(pos) / m[:, None]
        e = energy(pos) + 0.5 * jnp.sum(m[:, None] * vel ** 2)
        return (pos, vel), e

    (x, v), e = jax.lax.scan(step, (x, v), None, length=steps)
    return x, e


def main():
    gpu = jax.default_backend() != "cpu"
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2 ** 14 if gpu else 256)
    ap.add_argument("--steps", type=int, default=200 if gpu else 20)
    ap.add_argument("--eps", type=float, default=1e-8 if gpu else 1e-5)
    ap.add_argument("--dt", type=float, default=1e-3)
    ap.add_argument("--leaf-size", type=int, default=64 if gpu else 8,
                    help="small on a CPU so that N = 256 still gets a tree of depth 2")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    r = 1.0 / np.sqrt(rng.random(args.n) ** (-2.0 / 3.0) - 1.0)
    d = rng.normal(size=(args.n, 3))
    x = jnp.asarray(np.minimum(r, 5.0)[:, None] * d / np.linalg.norm(d, axis=1, keepdims=True))
    v = jnp.zeros_like(x)
    m = jnp.full(args.n, 1.0 / args.n)

    fmm_pot = lambda pos, q: jfmm.fmm(pos, q, eps=args.eps, leaf_size=args.leaf_size)  # noqa: E731
    direct_pot = lambda pos, q: jfmm.direct(pos, q)                       # noqa: E731
    run = jax.jit(integrate, static_argnums=(0, 5))
    xf, ef = run(fmm_pot, x, v, m, args.dt, args.steps)
    xd, ed = run(direct_pot, x, v, m, args.dt, args.steps)
    ef, ed = np.asarray(ef), np.asarray(ed)
    print(f"N = {args.n}, {args.steps} leapfrog steps of dt = {args.dt} (float64), "
          f"FMM eps = {args.eps:g}")
    print(f"relative energy drift, FMM:    {abs(ef[-1] - ef[0]) / abs(ef[0]):.3e}")
    print(f"relative energy drift, direct: {abs(ed[-1] - ed[0]) / abs(ed[0]):.3e}")
    print(f"max |E_fmm - E_direct| / |E|:  {np.max(np.abs(ef - ed)) / abs(ed[0]):.3e}")
    print(f"max position difference after the run: {float(jnp.max(jnp.abs(xf - xd))):.3e}")


if __name__ == "__main__":
    main()
