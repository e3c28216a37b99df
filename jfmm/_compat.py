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

__all__ = ["Literal", "Primitive", "ShapedArray", "Tracer", "ad", "batching", "mlir"]
