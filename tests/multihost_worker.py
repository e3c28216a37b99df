"""One process of tests/test_distributed.py's two-process run (not a test
module): `python multihost_worker.py PORT PROCESS_ID`. Two processes of two
CPU devices each form one mesh of four over jax.distributed (gloo
collectives); each holds half of every sharded array. Process 0 prints the
errors of the sharded sum, its gradient and the derivatives of an energy
against a float64 numpy direct sum."""
import os
import sys

import compile_settings

port, pid = sys.argv[1], int(sys.argv[2])
compile_settings.use(2)                 # the suite's, on two devices
import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=pid)
jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import jfmm  # noqa: E402
from jfmm import _reference  # noqa: E402

mesh = Mesh(np.array(jax.devices()), ("x",))
rows = NamedSharding(mesh, PartitionSpec("x"))
rng = np.random.default_rng(int(sys.argv[3]))         # the same points in both processes
n = 1200
x = rng.random((n, 3))
x[: n // 3] = 0.7 + 0.05 * rng.normal(size=(n // 3, 3))   # uneven shards
q = rng.random(n) - 0.5
xs, qs = (jax.make_array_from_callback(a.shape, rows, lambda i, a=a: a[i]) for a in (x, q))
phi, grad = jfmm.fmm(xs, qs, eps=1e-4, gradient=True, mesh=mesh, tree="uniform", leaf_size=16)
# The energy's derivatives: 2 phi in the charges, 2 q grad phi in the points.
energy = lambda p, c: jnp.dot(c, jfmm.fmm(p, c, eps=1e-4, mesh=mesh, tree="uniform",  # noqa: E731
                                          leaf_size=16))
dx, dq = jax.jit(jax.grad(energy, argnums=(0, 1)))(xs, qs)
got = [multihost_utils.process_allgather(a, tiled=True) for a in (phi, grad, dq, dx)]
if pid == 0:
    ref_phi, ref_grad = _reference.laplace3d(x, q, x)
    err = lambda a, b: np.linalg.norm(a - b) / np.linalg.norm(b)  # noqa: E731
    print("errors", err(got[0], ref_phi), err(got[1], ref_grad), err(got[2], 2 * ref_phi),
          err(got[3], 2 * q[:, None] * ref_grad), flush=True)
