"""Pallas kernels, each with the signature of the jnp operator it accelerates."""
import jax
import jax.numpy as jnp

from jfmm._compat import Literal


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
    product followed by a sum is two instructions; PTX's fma is one
    (docs/design.md, "Near field"). In interpret mode (CPU) it is the plain expression. Python scalars
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


def _asm_rsqrt(x):
    from jax.experimental.pallas import triton as plgpu
    return plgpu.elementwise_inline_asm(
        "rsqrt.approx.ftz.f32 $0, $1;", args=[x], constraints="=r,r", pack=1,
        result_shape_dtypes=[jax.ShapeDtypeStruct(x.shape, x.dtype)])[0]


def _fast_rsqrt(eqn) -> bool:
    """Whether `fast_math` replaces this equation: a float32 rsqrt of a
    tensor (Triton's inline asm takes no scalar-only operands: a kernel
    parameter's 1/sqrt, as in InverseMultiquadric, stays libdevice's)."""
    aval = eqn.outvars[0].aval
    return (eqn.primitive is jax.lax.rsqrt_p and aval.dtype == jnp.float32
            and len(aval.shape) > 0)


# Call primitives whose body `_substituted` enters (custom rules dropped: the
# P2P kernel is never differentiated).
_CALLS = ("pjit", "jit", "closed_call", "custom_jvp_call", "custom_vjp_call")


def _substituted(jaxpr, consts, args):
    """Evaluate a jaxpr, float32 rsqrt as `_asm_rsqrt` (nested jit and
    custom_jvp bodies too; other primitives bind unchanged)."""
    env = dict(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))

    def read(v):
        return v.val if isinstance(v, Literal) else env[v]

    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        sub = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
        if _fast_rsqrt(eqn):
            outs = [_asm_rsqrt(ins[0])]
        elif eqn.primitive.name in _CALLS and sub is not None:
            outs = _substituted(sub.jaxpr, sub.consts, ins)
        else:
            outs = eqn.primitive.bind(*ins, **eqn.params)
            outs = outs if eqn.primitive.multiple_results else [outs]
        env.update(zip(eqn.outvars, outs))
    return [read(v) for v in jaxpr.outvars]


def fast_math(fn, interpret: bool):
    """fn(*args) with its float32 1/sqrt as PTX rsqrt.approx.ftz.f32, for a
    Pallas GPU kernel's body (in interpret mode fn itself).

    libdevice's rsqrtf, which jax's rsqrt lowers to, scales subnormal inputs
    around the hardware reciprocal square root; the ftz form is the one
    instruction (same approximation, error <= 2^-22.9 relative; subnormal
    inputs flush to 0, so a float32 pair closer than 1e-19 gets 1/r = inf
    even where the r = 0 select runs). fn is traced to a jaxpr and
    re-evaluated with the substitution, so any kernel's expression gets it.
    """
    if interpret:
        return fn

    def wrapped(*args):
        flat, in_tree = jax.tree_util.tree_flatten(args)
        closed, shapes = jax.make_jaxpr(
            lambda *f: fn(*jax.tree_util.tree_unflatten(in_tree, f)), return_shape=True)(*flat)
        outs = _substituted(closed.jaxpr, closed.consts, flat)
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(shapes), outs)

    return wrapped
