"""The float32 default path, as a user without jax_enable_x64 meets it (and
the one warning that float64 data is computed in float32).

conftest turns float64 on for the other tests, so this runs in a fresh
process with the flag off: fmm, plan and direct on float64 numpy inputs
(cast to float32), potential and gradient, 3D Laplace and a Chebyshev kernel,
against the float64 numpy reference of the rounded inputs."""
import json
import os
import subprocess
import sys

import numpy as np
from conftest import charges, points, radial_reference, rel

from jfmm import kernels as K

SCRIPT = r"""
import json, sys
import numpy as np
import jax
import jfmm
from jfmm import kernels as K
assert not jax.config.jax_enable_x64
data = np.load(sys.argv[1])
x, q, y = data["x"], data["q"], data["y"]
out = {}
import warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    jfmm.fmm(x, q, y)
    jfmm.fmm(x, q, y)
out["warnings"] = [str(w.message) for w in caught]
for name, kern in (("laplace", K.Laplace3D()), ("imq", K.InverseMultiquadric(2.0))):
    phi, grad = jfmm.fmm(x, q, y, kernel=kern, gradient=True)
    pl = jfmm.plan(x, y, kernel=kern)
    dphi = jfmm.direct(x, q, y, kernel=kern)
    out[name] = dict(dtype=[str(phi.dtype), str(grad.dtype), str(dphi.dtype), str(pl.tree.src_sorted.dtype)],
                     eps=pl.eps, phi=np.asarray(phi).tolist(), grad=np.asarray(grad).tolist(),
                     plan=np.asarray(pl.apply(q)).tolist(), direct=np.asarray(dphi).tolist())
print(json.dumps(out))
"""


def test_float32_without_x64(rng, tmp_path):
    x, q, y = points("cluster", 3000, rng), charges(3000, rng), points("cube", 400, rng)
    np.savez(tmp_path / "in.npz", x=x, q=q, y=y)
    env = dict(os.environ, JAX_ENABLE_X64="0", JAX_PLATFORMS="cpu")
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "in.npz")], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    # float64 data without x64: one warning per process, naming the switch.
    assert len(out["warnings"]) == 1
    assert "jax.config.update('jax_enable_x64', True)" in out["warnings"][0]
    x32, q32, y32 = (np.float32(a) for a in (x, q, y))
    for name, kern in (("laplace", K.Laplace3D()), ("imq", K.InverseMultiquadric(2.0))):
        got = out[name]
        assert got["dtype"] == ["float32"] * 4
        eps = 1e-5 if name == "laplace" else 2e-5      # float32's default; Chebyshev's floor
        assert got["eps"] == eps
        ref, gref = radial_reference(kern, x32, q32, y32)
        assert rel(got["phi"], ref) <= eps, (name, rel(got["phi"], ref))
        assert rel(got["grad"], gref) <= 1e-4, (name, rel(got["grad"], gref))
        assert rel(got["plan"], ref) <= eps
        assert rel(got["direct"], ref) <= 1e-5                     # float32 rounding of 3,000 terms
