"""Pallas kernels, each with the signature of the jnp operator it accelerates."""
import jax
import jax.numpy as jnp


def compiler_params(num_warps: int, interpret: bool, num_stages: int = 1):
    """Triton compiler parameters of a GPU kernel (None in interpret mode)."""
    if interpret:
        return None
    from jax.experimental.pallas import triton as plgpu
    return plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages)


_FMA = {"float32": ("fma.rn.f32 $0, $1, $2, $3;", "=r,r,r,r"),
        "float64": ("fma.rn.f64 $0, $1, $2, $3;", "=d,d,d,d")}


def fma(a, b, c, interpret: bool):
    """a * b + c rounded once, inside a Pallas GPU kernel.

    XLA compiles Pallas kernels without floating-point contraction, so a
    product followed by a sum is two instructions (a Pallas loop of a * x + b
    reached 2.8e13 flop/s on an H200, 42% of the float32 peak); PTX's fma is
    one. In interpret mode (CPU) it is the plain expression. Python scalars
    and arrays broadcast as in a * b + c."""
    if interpret:
        return a * b + c
    dt = jnp.result_type(a, b, c)
    a, b, c = jnp.broadcast_arrays(*(jnp.asarray(v, dt) for v in (a, b, c)))
    if dt.name not in _FMA:
        return a * b + c
    from jax.experimental.pallas import triton as plgpu
    asm, constraints = _FMA[dt.name]
    return plgpu.elementwise_inline_asm(
        asm, args=[a, b, c], constraints=constraints, pack=1,
        result_shape_dtypes=[jax.ShapeDtypeStruct(a.shape, dt)])[0]
