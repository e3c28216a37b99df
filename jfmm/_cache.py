"""JAX's persistent compilation cache, on by default for jfmm's users.

A fit or a sum compiles for seconds (an RBF fit of 10^5 points about 25 s
on an H200, docs/BENCHMARKS.md); with the cache on disk a second process
running the same script loads those programs instead. jfmm turns it on when
it is imported, unless the process already set a cache directory
(`jax_compilation_cache_dir`, or JAX_COMPILATION_CACHE_DIR) or the
environment says JFMM_COMPILATION_CACHE=0. JFMM_COMPILATION_CACHE=<path>
picks the folder; the default is $XDG_CACHE_HOME/jfmm/xla (~/.cache/jfmm/xla).
The setting is jax's, process-wide: other programs of the process are cached
there too. Every program is kept, however short its compilation: a fit
compiles about a hundred small ones besides the solve, and loading them
from disk took an RBF constructor of 10^5 points in a second process from
17.6 s (jax's threshold, 0.5 s) to 10.8 s (H200, docs/BENCHMARKS.md).
"""
from __future__ import annotations

import os

import jax

MIN_COMPILE_SECONDS = 0.0
OFF = ("0", "off", "false", "no")


def folder() -> str | None:
    """Where jfmm would keep compiled programs, or None where it leaves the
    cache alone."""
    choice = os.environ.get("JFMM_COMPILATION_CACHE", "")
    if choice.lower() in OFF:
        return None
    if jax.config.jax_compilation_cache_dir or os.environ.get(
            "JAX_COMPILATION_CACHE_DIR"):
        return None
    if choice:
        return choice
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "jfmm", "xla")


def enable() -> None:
    """Turn the cache on (see the module's docstring)."""
    path = folder()
    if path is None:
        return
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
