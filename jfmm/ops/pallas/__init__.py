"""Pallas kernels, each with the signature of the jnp operator it accelerates."""


def compiler_params(num_warps: int, interpret: bool):
    """Triton compiler parameters of a GPU kernel (None in interpret mode)."""
    if interpret:
        return None
    from jax.experimental.pallas import triton as plgpu
    return plgpu.CompilerParams(num_warps=num_warps, num_stages=1)
