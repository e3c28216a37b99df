"""jfmm: fast multipole sums in JAX (jit, vmap, grad), with Pallas GPU kernels."""
from jfmm import kernels
from jfmm.api import Plan, direct, fmm, plan

__all__ = ["Plan", "direct", "fmm", "kernels", "plan"]
__version__ = "0.1.0"
