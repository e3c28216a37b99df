"""Morton (Z-order) keys for d = 2 and 3, as int32.

Bit k of axis a lands at key bit d*k + a, so the d lowest key bits name the
child slot (axis 0 lowest) and key >> d is the parent. int32 holds 10 levels
in 3D and 15 in 2D (bit 31 stays clear, so keys compare as signed ints).
"""
from __future__ import annotations

import jax.numpy as jnp

MAX_DEPTH = {2: 15, 3: 10}


def encode(coords, level: int):
    """Interleave integer box coordinates into Morton keys.

    coords: (..., d) int32 in [0, 2^level). Returns (...,) int32.
    """
    d = coords.shape[-1]
    coords = coords.astype(jnp.int32)
    key = jnp.zeros(coords.shape[:-1], jnp.int32)
    for k in range(level):
        for a in range(d):
            key = key | (((coords[..., a] >> k) & 1) << (d * k + a))
    return key


def decode(keys, level: int, d: int):
    """Inverse of `encode`: keys (...,) int32 -> coords (..., d) int32."""
    keys = keys.astype(jnp.int32)
    out = []
    for a in range(d):
        c = jnp.zeros(keys.shape, jnp.int32)
        for k in range(level):
            c = c | (((keys >> (d * k + a)) & 1) << k)
        out.append(c)
    return jnp.stack(out, axis=-1)

