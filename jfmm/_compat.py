"""The JAX internals jfmm needs, imported in one place (they move between
jax releases; jfmm runs on jax 0.10 and 0.11)."""
import jax
from jax.extend.core import Literal, Primitive
from jax.interpreters import ad, batching, mlir

Tracer = getattr(jax.core, "Tracer", None)
if Tracer is None:
    from jax._src.core import Tracer

ShapedArray = getattr(jax.core, "ShapedArray", None)
if ShapedArray is None:
    from jax._src.core import ShapedArray

try:
    from jax._src.core import trace_state_clean as _top_level
except ImportError:                     # a release without it: ask with a value
    def _top_level():
        return not isinstance(jax.numpy.zeros(()), Tracer)


def tracing() -> bool:
    """Whether a transformation (jit, vmap, grad) is tracing now, asked
    without creating an array: a repeated eager call checks it every time,
    and a new array costs a device dispatch there."""
    return not _top_level()


def known_value(x):
    """x's value where it is known at trace time: tracers of eager autodiff
    (jax.grad, jax.jvp outside jit) carry their primal value as `primal`;
    x itself otherwise (under jit, vmap)."""
    v = x
    while isinstance(v, Tracer) and hasattr(v, "primal"):
        v = v.primal
    return x if isinstance(v, Tracer) else v


__all__ = ["Literal", "Primitive", "ShapedArray", "Tracer", "ad", "batching", "known_value",
           "mlir", "tracing"]
