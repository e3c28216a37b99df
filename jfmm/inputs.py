"""Input checks and casts of the public calls: shapes, dtypes, finite
coordinates, and the shapes of the results."""
from __future__ import annotations

import dataclasses
import sys
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jfmm import _compat, kernels
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
    # Only a trace can hold a tracer: eager calls skip the kernel's evaluation.
    if isinstance(kernel, kernels.Radial) and _compat.tracing() and not kernel.is_concrete():
        raise TypeError("this Radial kernel's fn closes over a traced value (a jit, grad or "
                        "vmap argument): a Radial fn's parameters must be constants; for "
                        "traced or differentiable ones subclass jfmm.kernels.Kernel with "
                        "dataclass fields (see jfmm.kernels.Radial)")
    return kernel


# The kernel to name where points of another dimension come to one that
# is defined in one dimension only.
_OTHER_DIM = {"Laplace3D": "jfmm.kernels.Laplace2D()", "Laplace2D": "jfmm.kernels.Laplace3D()"}


def check_points(name: str, x, dims, kernel=None):
    """x as an (n, d) array with d in dims (those of `kernel`, named in the
    message, where given); raises for other shapes, for dtypes that are not
    real numbers and for non-finite concrete values. Warns once where
    float64 data meets jax without x64 (`warn_float64`)."""
    warn_float64(x)
    raw, x = x, jnp.asarray(x)
    if x.ndim != 2 or x.shape[1] not in dims:
        want = " or ".join(f"(n, {d})" for d in dims)
        what = "" if kernel is None else f" for {type(kernel).__name__}"
        other = _OTHER_DIM.get(type(kernel).__name__)
        hint = (f": for {x.shape[1]}D points pass kernel={other}"
                if other and x.ndim == 2 and x.shape[1] in (2, 3) else "")
        raise ValueError(f"{name} must have shape {want}{what}, got {x.shape}{hint}")
    if x.shape[0] == 0:
        raise ValueError(f"{name} is empty; pass at least one point")
    if not (jnp.issubdtype(x.dtype, jnp.floating) or jnp.issubdtype(x.dtype, jnp.integer)):
        raise TypeError(f"{name} must be real numbers, got dtype {x.dtype}")
    if concrete(x) and not _finite(raw if _same(raw, x) else x):
        raise ValueError(f"{name} contains NaN or inf coordinates")
    return x


_WARNED_FLOAT64 = []


def warn_float64(x):
    """Warn once per process where a float64 array meets jax without
    jax_enable_x64, which would compute in float32 without a word."""
    if (not _WARNED_FLOAT64 and getattr(x, "dtype", None) == np.float64
            and not jax.config.jax_enable_x64):
        _WARNED_FLOAT64.append(True)
        warnings.warn("float64 input is computed in float32, since jax's x64 mode is off: "
                      "call jax.config.update('jax_enable_x64', True) at start-up for "
                      "float64 sums (or pass float32 arrays to silence this)",
                      stacklevel=_outside_jfmm())


def _outside_jfmm() -> int:
    """The stacklevel of the first frame outside jfmm (the user's call)."""
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_globals.get("__name__", "").startswith("jfmm"):
        frame, level = frame.f_back, level + 1
    return level


def _same(raw, x) -> bool:
    """Whether raw is a numpy array of x's dtype (checked on the host)."""
    return isinstance(raw, np.ndarray) and raw.dtype == x.dtype


@jax.jit
def _all_finite(x):
    """One program per shape, not an isfinite and a reduction (each a GPU
    compilation of a first call)."""
    return jnp.all(jnp.isfinite(x))


def _finite(x) -> bool:
    """Whether every value of a concrete array is finite (numpy arrays on
    the host, jax arrays on their device)."""
    if isinstance(x, np.ndarray):
        return bool(np.isfinite(x).all())
    with jax.ensure_compile_time_eval():             # eager even inside a jit trace
        return bool(_all_finite(x))


def working_dtype(*points):
    """The dtype the sums run in, the one rule of `fmm`, `plan` and
    `direct`: the points' dtype (sources and targets promoted together).
    Integer points take jax's default float (float64 under
    jax_enable_x64, else float32), half precision float32. Charges are
    cast to it (complex charges to its complex type)."""
    dtype = jnp.result_type(*points)
    if not jnp.issubdtype(dtype, jnp.floating):
        return jnp.dtype(jax.dtypes.canonicalize_dtype(jnp.float64))
    return dtype if dtype.itemsize >= 4 else jnp.dtype(jnp.float32)


class Layout(NamedTuple):
    """How the caller's charges map onto the real (N, K) columns summed:
    squeeze for (N,) charges, complex for complex ones (real parts in
    columns :k, imaginary parts in k:)."""
    squeeze: bool
    complex: bool


def charges_of(charges, n: int, dtype):
    """charges (n,) or (n, k), real or complex -> ((n, K) of dtype, Layout);
    non-finite concrete charges raise."""
    warn_float64(charges)
    raw, charges = charges, jnp.asarray(charges)
    if charges.ndim not in (1, 2) or charges.shape[0] != n:
        raise ValueError(f"charges must have shape ({n},) or ({n}, k) to match sources, "
                         f"got {charges.shape}")
    check_finite_charges(raw, charges)
    layout = Layout(charges.ndim == 1, jnp.iscomplexobj(charges))
    if layout.squeeze:
        charges = charges[:, None]
    if layout.complex:
        charges = jnp.concatenate([jnp.real(charges), jnp.imag(charges)], axis=1)
    return charges.astype(dtype), layout


def check_finite_charges(raw, charges=None):
    """Raise where concrete charges hold NaN or inf (raw: the caller's
    array; charges: it as a jax array, where already converted)."""
    charges = raw if charges is None else charges
    if concrete(charges) and not _finite(raw if _same(raw, charges) else jnp.asarray(charges)):
        raise ValueError("charges contain NaN or inf; the sums of such charges are NaN")


def points_of(sources, targets, kernel):
    """Validate the points and cast them to `working_dtype`: (sources,
    targets | None)."""
    kernel = kernel_of(kernel)
    sources = check_points("sources", sources, kernel.dims, kernel)
    if targets is not None:
        targets = check_points("targets", targets, kernel.dims, kernel)
        if targets.shape[1] != sources.shape[1]:
            raise ValueError(f"sources are {sources.shape[1]}D but targets are "
                             f"{targets.shape[1]}D")
    dtype = working_dtype(sources, *([] if targets is None else [targets]))
    return sources.astype(dtype), None if targets is None else targets.astype(dtype)


def prepare(sources, charges, targets, kernel):
    """Validate and cast. Returns (sources, charges (N, K), targets | None,
    Layout), all in `working_dtype`."""
    sources, targets = points_of(sources, targets, kernel)
    charges, layout = charges_of(charges, sources.shape[0], sources.dtype)
    return sources, charges, targets, layout


def finish(phi, grad, layout: Layout, gradient):
    """The sums (M, K) and (M, K, d) in the caller's charge layout; with
    gradient="curl" the curl grad (M, K) alone (columns in threes: never
    squeezed)."""
    if gradient == "curl":
        if layout.complex:
            k = grad.shape[1] // 2
            grad = jax.lax.complex(grad[:, :k], grad[:, k:])
        return grad
    if layout.complex:
        k = phi.shape[1] // 2
        phi = jax.lax.complex(phi[:, :k], phi[:, k:])
        grad = None if grad is None else jax.lax.complex(grad[:, :k], grad[:, k:])
    if layout.squeeze:
        phi = phi[:, 0]
        grad = None if grad is None else grad[:, 0]
    return (phi, grad) if gradient else phi
