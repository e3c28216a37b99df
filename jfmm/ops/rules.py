"""The order rule shared by the expansion families."""
from __future__ import annotations

import jax.numpy as jnp


def choose_order(eps: float, dtype, eps_floor: dict, orders, error_bound, family: str) -> int:
    """The smallest order whose assumed error is <= eps (the largest order
    if none is).

    eps_floor: {dtype name: smallest eps reached}; error_bound(order): the
    error the rule assumes; family names the family in the ValueError raised
    for an eps below the dtype's floor.
    """
    name = jnp.dtype(dtype).name
    floor = eps_floor[name]
    if eps < floor:
        hint = "; use float64 inputs with jax_enable_x64" if name == "float32" else ""
        raise ValueError(f"eps={eps:g} is below what {family} reaches in {name} "
                         f"(about {floor:.1e}){hint}")
    return min(p for p in orders if error_bound(p) <= eps or p == orders[-1])
