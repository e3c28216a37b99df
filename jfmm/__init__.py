"""jfmm: fast multipole sums in JAX (jit, vmap, grad), with Pallas GPU kernels."""
from jfmm import _cache, _xla, kernels, vortex
from jfmm.api import Plan, direct, fmm, plan
from jfmm.rbf import RBFInterpolator

__all__ = ["Plan", "RBFInterpolator", "direct", "fmm", "kernels", "plan", "vortex"]
__version__ = "0.1.0"

_cache.enable()
_xla.enable()
_xla.bind_triton_dialect()
