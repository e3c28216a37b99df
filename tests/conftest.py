"""Shared test helpers: point distributions and the float64 reference.

The reference sums the inputs as the library received them: points and
charges are rounded to the working dtype, then summed in float64 with numpy,
so the error measured is the algorithm's, not the inputs' rounding.
"""
import jax
import numpy as np
import pytest

from jfmm import _reference

jax.config.update("jax_enable_x64", True)

DISTRIBUTIONS = ("cube", "sphere", "cluster")


def points(kind: str, n: int, rng, dim: int = 3) -> np.ndarray:
    """n points: uniform cube, sphere surface, or tight clusters with far outliers."""
    if kind == "cube":
        return rng.random((n, dim))
    if kind == "sphere":
        v = rng.normal(size=(n, dim))
        return 0.5 + 0.5 * v / np.linalg.norm(v, axis=1, keepdims=True)
    if kind == "cluster":
        centres = rng.random((5, dim))
        x = centres[rng.integers(0, 5, n)] + 1e-3 * rng.normal(size=(n, dim))
        k = max(1, n // 200)
        x[:k] = rng.random((k, dim)) * 20 - 10
        return x
    raise ValueError(kind)


def charges(n: int, rng, k: int | None = None) -> np.ndarray:
    """Mixed-sign charges, uniform in [-0.5, 0.5]."""
    shape = (n,) if k is None else (n, k)
    return rng.random(shape) - 0.5


def reference(sources, q, targets=None, dtype=np.float64):
    """float64 direct sum of 1/r over inputs rounded to `dtype`.

    Returns phi (M,) or (M, k) and grad (M, d) or (M, k, d); r = 0 pairs skipped.
    """
    x = np.asarray(np.asarray(sources, dtype), np.float64)
    y = x if targets is None else np.asarray(np.asarray(targets, dtype), np.float64)
    return _reference.laplace3d(x, np.asarray(np.asarray(q, dtype), np.float64), y)


def rel(a, b) -> float:
    """Relative L2 error ||a - b|| / ||b||."""
    a = np.asarray(a, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.fixture
def rng(request):
    """A fresh generator per test, seeded from entropy (printed on failure)."""
    seed = np.random.SeedSequence().entropy
    request.node.user_properties.append(("seed", seed))
    print(f"seed={seed}")
    return np.random.default_rng(seed)
