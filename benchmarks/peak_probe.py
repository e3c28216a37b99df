"""Achievable float32 FMA rate of a Pallas (Triton) kernel on this GPU.

    python benchmarks/peak_probe.py

Each program keeps 8 independent (T, S) accumulators in registers and runs
a loop of a * acc + b on them, written as a product and a sum, and with
jfmm.ops.pallas.fma (PTX fma): the practical ceiling for register-resident
float32 arithmetic in Pallas, against which the P2P kernel is read, and a
check of whether the compiler contracts a * x + b into one instruction.
"""
import os
import sys

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench_laplace import median_time  # noqa: E402
from jfmm.ops.pallas import compiler_params, fma  # noqa: E402


def probe(t, s, warps, use_fma, steps=2048, n_acc=8, progs=132 * 64):
    def kern(a_ref, o_ref):
        a = a_ref[...]
        b = a * 0.5

        def body(_, acc):
            if use_fma:
                return tuple(fma(x, a, b, False) for x in acc)
            return tuple(x * a + b for x in acc)

        acc = jax.lax.fori_loop(0, steps, body, tuple(a + k for k in range(n_acc)))
        o_ref[pl.program_id(0)] = sum(acc)

    a = jnp.full((t, s), 0.999, jnp.float32)
    f = jax.jit(lambda a: pl.pallas_call(
        kern, out_shape=jax.ShapeDtypeStruct((progs, t, s), jnp.float32), grid=(progs,),
        compiler_params=compiler_params(warps, False))(a))
    sec = median_time(f, a, repeats=5)
    return 2.0 * progs * t * s * steps * n_acc / sec


if __name__ == "__main__":
    print(f"# {jax.devices()[0].device_kind}, jax {jax.__version__}\n")
    print("| tile T x S, warps | a * x + b | jfmm.ops.pallas.fma |\n|---|---|---|")
    for t, s, w in [(8, 16, 1), (8, 32, 1), (32, 32, 4)]:
        print(f"| {t} x {s}, {w} | {probe(t, s, w, False):.3g} | {probe(t, s, w, True):.3g} |",
              flush=True)
