"""Input checks and casts of the public calls: shapes, dtypes, finite
coordinates, and the shapes of the results."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jfmm import kernels
from jfmm.configure import concrete


def kernel_of(kernel) -> kernels.Kernel:
    """kernel, or the kernel of a parameter-free kernel's name ('laplace3d',
    'thin_plate_spline', ...); names of kernels with parameters raise a
    TypeError that shows the `jfmm.kernels.get` call to use."""
    if isinstance(kernel, str):
        k = kernels.get(kernel)                 # unknown names: ValueError listing them
        params = [f.name for f in dataclasses.fields(k)]
        if params:
            raise TypeError(f"kernel {kernel!r} has parameters ({', '.join(params)}): pass "
                            f"jfmm.kernels.get({kernel!r}, {params[0]}=...)")
        return k
    if not isinstance(kernel, kernels.Kernel):
        raise TypeError(f"kernel must be a jfmm.kernels.Kernel or the name of one without "
                        f"parameters, got {type(kernel).__name__}; jfmm.kernels.get(name, "
                        f"**params) builds any of them")
    return kernel


def check_points(name: str, x, dims):
    """x as an (n, d) array with d in dims; raises for other shapes, for
    dtypes that are not real numbers and for non-finite concrete values."""
    x = jnp.asarray(x)
    if x.ndim != 2 or x.shape[1] not in dims:
        want = " or ".join(f"(n, {d})" for d in dims)
        raise ValueError(f"{name} must have shape {want}, got {x.shape}")
    if x.shape[0] == 0:
        raise ValueError(f"{name} is empty; pass at least one point")
    if not (jnp.issubdtype(x.dtype, jnp.floating) or jnp.issubdtype(x.dtype, jnp.integer)):
        raise TypeError(f"{name} must be real numbers, got dtype {x.dtype}")
    if concrete(x):
        # Eager even inside a jit trace, where x may be a captured constant.
        with jax.ensure_compile_time_eval():
            finite = bool(jnp.all(jnp.isfinite(x)))
        if not finite:
            raise ValueError(f"{name} contains NaN or inf coordinates")
    return x


def working_dtype(*arrays):
    """The dtype the sums run in: the arrays' result type with Python
    floats, float32 at least (integers and half precision take float32, or
    float64 under jax_enable_x64)."""
    dtype = jnp.result_type(*arrays, 0.0)
    if not jnp.issubdtype(dtype, jnp.floating) or dtype.itemsize < 4:
        dtype = jnp.result_type(jnp.float32, 0.0)
    return dtype


def prepare(sources, charges, targets, kernel):
    """Validate and cast. Returns (sources, charges (N, K), targets | None, squeeze)."""
    kernel = kernel_of(kernel)
    sources = check_points("sources", sources, kernel.dims)
    if targets is not None:
        targets = check_points("targets", targets, kernel.dims)
        if targets.shape[1] != sources.shape[1]:
            raise ValueError(f"sources are {sources.shape[1]}D but targets are "
                             f"{targets.shape[1]}D")
    charges = jnp.asarray(charges)
    if charges.ndim not in (1, 2) or charges.shape[0] != sources.shape[0]:
        raise ValueError(f"charges must have shape ({sources.shape[0]},) or "
                         f"({sources.shape[0]}, k) to match sources, got {charges.shape}")
    dtype = working_dtype(sources, charges, *([] if targets is None else [targets]))
    squeeze = charges.ndim == 1
    charges = charges.astype(dtype)
    if squeeze:
        charges = charges[:, None]
    sources = sources.astype(dtype)
    targets = None if targets is None else targets.astype(dtype)
    return sources, charges, targets, squeeze


def finish(phi, grad, squeeze: bool, gradient: bool):
    if squeeze:
        phi = phi[:, 0]
        grad = None if grad is None else grad[:, 0]
    return (phi, grad) if gradient else phi
