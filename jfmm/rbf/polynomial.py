"""The polynomial part of an RBF interpolant, with scipy's conventions."""
from __future__ import annotations

import itertools

import jax.numpy as jnp
import numpy as np


def powers(dim: int, degree: int) -> np.ndarray:
    """Exponents (R, dim) of the monomials of total degree <= degree, in
    scipy.interpolate.RBFInterpolator's order (degree by degree, each as
    combinations with replacement of the axes); (0, dim) for degree -1."""
    rows = []
    for deg in range(degree + 1):
        for axes in itertools.combinations_with_replacement(range(dim), deg):
            rows.append(np.bincount(np.asarray(axes, np.int64), minlength=dim))
    return np.asarray(rows, np.int64).reshape(-1, dim)


def monomials(x, exponents: np.ndarray):
    """P (m, R): the monomials with `exponents` (R, d) at points x (m, d)."""
    if exponents.shape[0] == 0:
        return jnp.zeros((x.shape[0], 0), x.dtype)
    out = jnp.ones((x.shape[0], exponents.shape[0]), x.dtype)
    for axis in range(exponents.shape[1]):
        for k in range(1, int(exponents[:, axis].max()) + 1):
            out = out * jnp.where(exponents[:, axis] >= k, x[:, axis:axis + 1], 1.0)
    return out


def shift_and_scale(y: np.ndarray):
    """scipy's domain map x -> (x - shift) / scale onto [-1, 1]^d: shift the
    box centre, scale its half-widths (1 where a half-width is 0)."""
    lo, hi = y.min(axis=0), y.max(axis=0)
    scale = (hi - lo) / 2
    return (hi + lo) / 2, np.where(scale == 0, 1.0, scale)
