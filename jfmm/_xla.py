"""XLA's GPU matrix products as cuBLAS calls, on by default for jfmm's users.

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
  * the process's backends have started (the flags are read once, then).
The flag is process-wide: the process's other GPU programs run their
matrix products through cuBLAS too. A CPU ignores it.
"""
from __future__ import annotations

import os

from jax._src import xla_bridge

FLAG = "--xla_gpu_enable_triton_gemm=false"
KEEP = ("1", "on", "true", "yes")


def enable() -> bool:
    """Add FLAG to XLA_FLAGS (see the module's docstring); whether it did."""
    flags = os.environ.get("XLA_FLAGS", "")
    if (os.environ.get("JFMM_TRITON_GEMM", "").lower() in KEEP
            or "xla_gpu_enable_triton_gemm" in flags or xla_bridge.backends_are_initialized()):
        return False
    os.environ["XLA_FLAGS"] = f"{flags} {FLAG}".strip()
    return True
