"""RBF interpolation with FMM sums: scipy's RBFInterpolator at any N."""
from jfmm.rbf.interpolator import RBFInterpolator

__all__ = ["RBFInterpolator"]
