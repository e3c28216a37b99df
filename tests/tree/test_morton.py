import jax.numpy as jnp
import numpy as np
import pytest

from jfmm.tree import morton


@pytest.mark.parametrize("dim,level", [(2, 1), (2, 15), (3, 1), (3, 4), (3, 10)])
def test_encode_decode_roundtrip(dim, level, rng):
    c = rng.integers(0, 2 ** level, size=(500, dim)).astype(np.int32)
    keys = morton.encode(jnp.asarray(c), level)
    assert int(keys.min()) >= 0 and int(keys.max()) < 2 ** (dim * level)
    np.testing.assert_array_equal(morton.decode(keys, level, dim), c)


@pytest.mark.parametrize("dim", [2, 3])
def test_parent_is_shift_and_keys_are_a_bijection(dim):
    level = 3
    n = 2 ** (dim * level)
    coords = morton.decode(jnp.arange(n), level, dim)
    assert len(np.unique(np.asarray(coords), axis=0)) == n
    parent = morton.decode(jnp.arange(n) >> dim, level - 1, dim)
    np.testing.assert_array_equal(parent, np.asarray(coords) // 2)
