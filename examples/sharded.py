"""The FMM sum split over several devices with `mesh=`.

    python examples/sharded.py                 # 4 CPU host devices where no GPUs are
    python examples/sharded.py --n 4000000     # on a machine with several GPUs

Builds a one-axis mesh over the devices there are (on a CPU, four host
devices made by XLA_FLAGS before jax starts), shards points and charges
over it, and computes potential and gradient with `jfmm.fmm(...,
mesh=mesh)`, then forces by `jax.grad` of the energy through the sharded
sum. It prints how the results are laid out over the devices and the
error against a float64 direct sum at 1,000 targets. About 30 s on a
2-core CPU at the default size.
"""
import argparse
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

import jfmm  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=40_000)
    args = ap.parse_args()
    mesh = Mesh(np.array(jax.devices()), ("x",))
    print(f"mesh of {mesh.devices.size} {jax.devices()[0].platform} devices")
    rng = np.random.default_rng(0)
    rows = NamedSharding(mesh, PartitionSpec("x"))
    x = jax.device_put(rng.random((args.n, 3), dtype=np.float32), rows)
    q = jax.device_put(rng.random(args.n, dtype=np.float32) - 0.5, rows)

    phi, grad = jfmm.fmm(x, q, eps=1e-5, gradient=True, mesh=mesh)
    print("potential laid out as", phi.sharding.spec, "over",
          sorted({s.device.id for s in phi.addressable_shards}))

    def energy(x, q):
        return 0.5 * jnp.dot(q, jfmm.fmm(x, q, eps=1e-5, mesh=mesh))
    dq = jax.jit(jax.grad(energy, argnums=1))(x, q)   # the adjoint sum, sharded too: phi

    idx = rng.choice(args.n, 1000, replace=False)
    xs, qs = np.asarray(x, np.float64), np.asarray(q, np.float64)
    d = xs[idx, None] - xs[None]
    r = np.linalg.norm(d, axis=-1)
    inv = np.divide(1.0, r, out=np.zeros_like(r), where=r > 0)
    exact_phi = inv @ qs
    exact_grad = -np.einsum("tsd,ts,s->td", d, inv ** 3, qs)
    err = lambda a, b: np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b)  # noqa: E731
    print(f"error at 1,000 targets: potential {err(phi[idx], exact_phi):.2e}, gradient "
          f"{err(grad[idx], exact_grad):.2e}, jax.grad of the energy "
          f"{err(dq[idx], exact_phi):.2e} (eps 1e-5)")


if __name__ == "__main__":
    main()
