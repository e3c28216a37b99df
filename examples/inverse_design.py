"""Inverse design: optax fits charges and positions to a target field.

    python examples/inverse_design.py --steps 5
    python examples/inverse_design.py

A hidden set of 16 charges inside the unit ball makes a potential on 400
probe points on a sphere of radius 2. We start 64 charges of value zero at
random positions inside the ball and let Adam move both their values and
their positions until the FMM potential at the probes matches the target.
Gradients with respect to charges and positions come from jax.grad through
jfmm.fmm at eps 1e-5 (two FMM calls per step). About 35 s on a 2-core CPU,
where each FMM call at this size costs ~0.4 s.
"""
import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax

import jfmm

jax.config.update("jax_enable_x64", True)


def ball(rng, n, radius):
    d = rng.normal(size=(n, 3))
    return radius * rng.random((n, 1)) ** (1 / 3) * d / np.linalg.norm(d, axis=1, keepdims=True)


def main(steps=40):
    rng = np.random.default_rng(1)
    probes = rng.normal(size=(400, 3))
    probes = jnp.asarray(2.0 * probes / np.linalg.norm(probes, axis=1, keepdims=True))
    hidden_x, hidden_q = ball(rng, 16, 0.8), rng.random(16) - 0.5
    target = jfmm.direct(hidden_x, hidden_q, probes)

    params = {"x": jnp.asarray(ball(rng, 64, 0.8)), "q": jnp.zeros(64)}

    def loss(p):
        phi = jfmm.fmm(p["x"], p["q"], probes, eps=1e-5, leaf_size=8)
        return jnp.mean((phi - target) ** 2) / jnp.mean(target ** 2)

    opt = optax.adam(3e-2)
    state = opt.init(params)

    @jax.jit
    def step(p, s):
        value, g = jax.value_and_grad(loss)(p)
        updates, s = opt.update(g, s, p)
        return optax.apply_updates(p, updates), s, value

    first = None
    for i in range(steps):
        params, state, value = step(params, state)
        first = float(value) if first is None else first
        if i % 10 == 0 or i == steps - 1:
            print(f"step {i:4d}  relative misfit {float(value):.3e}")
    check = jfmm.direct(params["x"], params["q"], probes)
    final = float(jnp.mean((check - target) ** 2) / jnp.mean(target ** 2))
    print(f"misfit fell from {first:.3e} to {final:.3e} (checked with the direct sum)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    main(ap.parse_args().steps)
