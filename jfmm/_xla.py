"""How jfmm's programs compile: XLA's GPU matrix products as cuBLAS calls,
on by default for jfmm's users; Pallas kernels lowered to Triton without a
search of sys.path per operation (`bind_triton_dialect`); on a CPU, the
programs that run once per point set or order without XLA's fusion
emitters (`once`).

XLA autotunes each matrix product of a GPU program over Triton kernel
configurations when it compiles; the FMM's many translation products made
that most of a first call. On an H100 (jax 0.11.2), `jax.jit` of
`jfmm.fmm` on 2^20 Plummer points (float32, eps 1e-5, potential and
gradient) compiled in 37.3 s with them and 12.4 s without, and ran in 15.2
against 15.3 ms (docs/BENCHMARKS.md). jfmm's own top-level calls compile
that way through jit compiler options (`jfmm.ops.backend.FAST_COMPILE`),
but jax takes no compiler options inside a user's jit, so `import jfmm`
adds --xla_gpu_enable_triton_gemm=false to XLA_FLAGS, unless:
  * XLA_FLAGS already sets xla_gpu_enable_triton_gemm (the user's choice
    wins),
  * JFMM_TRITON_GEMM=1 (or on, true, yes) asks to keep XLA's default, or
  * the process's backends have started (the flags are read once, then;
    on a GPU it warns).
The flag is process-wide: the process's other GPU programs run their
matrix products through cuBLAS too. A CPU ignores it.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import sys
import warnings

import jax
from jax._src import xla_bridge

from jfmm import _compat

FLAG = "--xla_gpu_enable_triton_gemm=false"
KEEP = ("1", "on", "true", "yes")


LATE = ("jfmm was imported after jax started its GPU backend, so XLA still autotunes "
        "matrix products over Triton kernels: jitted jfmm sums compile 2-3x longer (jax.jit "
        "of jfmm.fmm at 2^20 points on an H200: 47-57 s against 19 s). Import jfmm before "
        "the first jax computation, or put " + FLAG + " in XLA_FLAGS yourself; "
        "JFMM_TRITON_GEMM=1 keeps XLA's default without this warning.")


def enable() -> bool:
    """Add FLAG to XLA_FLAGS (see the module's docstring); whether it did.
    Warns where a GPU backend started first, which the flag no longer
    reaches."""
    flags = os.environ.get("XLA_FLAGS", "")
    if (os.environ.get("JFMM_TRITON_GEMM", "").lower() in KEEP
            or "xla_gpu_enable_triton_gemm" in flags):
        return False
    if xla_bridge.backends_are_initialized():
        if jax.default_backend() == "gpu":
            warnings.warn(LATE, stacklevel=2)
        return False
    os.environ["XLA_FLAGS"] = f"{flags} {FLAG}".strip()
    return True


# A CPU compiles the programs that run once per point set or order (the
# trees' sizing, builds and work lists, the crowding check, the
# translation operators) without XLA's fusion emitters: they then compile
# in less time and run as fast. 2-core CPU, jaxlib 0.10.2, 2^16 points,
# float64, first eager jfmm.fmm, XLA time of these programs: Plummer's
# adaptive tree 3.9 -> 2.7 s, the cube's build, crowding and operators
# 0.9 -> 0.55 s. Not the passes, whose sums ran 1.5 -> 1.86 s on the cube
# without them, nor `far_share` (0.36 -> 0.48 s to compile without).
ONCE_CPU = {"xla_cpu_use_fusion_emitters": False}
_once_cpu = [True]                      # until a jaxlib refuses the option


def once(fun=None, **jit_kwargs):
    """jax.jit(fun, **jit_kwargs) compiled with ONCE_CPU where it is called
    at the top level on a CPU; inside a trace (a user's jit, grad, vmap, or
    a jfmm program calling it) and on other backends, the plain jit. Use as
    @once or @once(static_argnums=...)."""
    if fun is None:
        return functools.partial(once, **jit_kwargs)
    plain = jax.jit(fun, **jit_kwargs)
    lean = jax.jit(fun, compiler_options=ONCE_CPU, **jit_kwargs)

    @functools.wraps(fun)
    def call(*args, **kwargs):
        if _once_cpu[0] and not _compat.tracing() and jax.default_backend() == "cpu":
            try:
                return lean(*args, **kwargs)
            except jax.errors.JaxRuntimeError as e:      # a jaxlib without the option
                if "compile option" not in str(e):
                    raise
                _once_cpu[0] = False
        return plain(*args, **kwargs)

    return call


# Lowering a Pallas kernel to Triton IR reads each new operation's result
# through MLIR's Python bindings, which look for a Python module of the
# result's dialect on every read until one imports: for Triton's dialect
# ("tt") none exists, so every read searched sys.path for
# jaxlib.mlir.dialects.tt and two more names (9,274 times for one small
# uniform tree). With that name bound to the dialect's own module the
# first search succeeds. `jax.jit` of `jfmm.fmm` lowered for a GPU on 2^20
# points (on the 2-core CPU, which lowers as a GPU's host does): 6.1 ->
# 4.0 s, the Pallas kernels 3.2 -> 1.0 s, the same module text
# (docs/BENCHMARKS.md, "Lowering for a GPU, measured on the CPU").
TRITON_DIALECT = "jaxlib.mlir.dialects.tt"


def bind_triton_dialect() -> bool:
    """Bind TRITON_DIALECT to the Triton dialect's module (see above) where
    this jaxlib has that module and nothing of that name; whether it did."""
    if TRITON_DIALECT in sys.modules:
        return False
    try:
        from jax._src.lib.triton import dialect
        if importlib.util.find_spec(TRITON_DIALECT) is not None:
            return False
    except Exception:           # no Triton bindings in this jaxlib: nothing to bind
        return False
    sys.modules[TRITON_DIALECT] = dialect
    return True
