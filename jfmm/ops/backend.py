"""The one switch between jnp operators and their Pallas kernels.

Modes: "auto" (Pallas on GPU, jnp elsewhere), "jnp", "pallas" (compiled;
GPU only), "interpret" (Pallas kernels run by the Pallas interpreter: how the
CPU tests check them). Set with `set_backend` or the JFMM_BACKEND environment
variable. The public calls resolve the mode (`current()`) when they are called
and pass it down as a static argument, so it is part of every jit cache key.
"""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp

from jfmm.ops import p2p
from jfmm.ops.pallas import p2p as pallas_p2p

MODES = ("auto", "jnp", "pallas", "interpret")
_mode = os.environ.get("JFMM_BACKEND", "auto")
_blocks = pallas_p2p.Blocks()


def set_backend(mode: str, blocks: pallas_p2p.Blocks | None = None) -> None:
    """Choose the backend (see module docstring) and, optionally, tile sizes."""
    global _mode, _blocks
    if mode not in MODES:
        raise ValueError(f"backend must be one of {MODES}, got {mode!r}")
    _mode = mode
    if blocks is not None:
        _blocks = blocks


def current() -> str:
    """The resolved mode: "jnp", "pallas" or "interpret"."""
    if _mode == "auto":
        return "pallas" if jax.default_backend() == "gpu" else "jnp"
    return _mode


def near_field(kernel, tgt_sorted, tgt_start, src_sorted, q_sorted, src_start, near,
               gradient: bool, mode: str):
    """`jfmm.ops.p2p.near_field` on backend `mode` (see `current`)."""
    if mode == "jnp":
        return p2p.near_field(kernel, tgt_sorted, tgt_start, src_sorted, q_sorted,
                              src_start, near, gradient)
    return pallas_p2p.near_field(kernel, tgt_sorted, tgt_start, src_sorted, q_sorted,
                                 src_start, near, gradient, blocks=_blocks,
                                 interpret=mode == "interpret")


def dense(kernel, targets, sources, charges, gradient: bool, mode: str):
    """All-pairs sum on backend `mode`: the Pallas path is the near-field
    kernel on a one-leaf tree whose only neighbour is itself."""
    if mode == "jnp":
        return p2p.dense(kernel, targets, sources, charges, gradient)
    m, n = targets.shape[0], sources.shape[0]
    t_start = jnp.array([0, m, m], jnp.int32)
    s_start = jnp.array([0, n, n], jnp.int32)
    return near_field(kernel, targets, t_start, sources, charges, s_start,
                      jnp.zeros((1, 1), jnp.int32), gradient, mode)
