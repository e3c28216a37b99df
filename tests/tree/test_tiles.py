"""tiles.in_steps: the steps' sums against one pass over every tile, and
the step function traced once (each trace of a Pallas kernel is lowered
and compiled again on a GPU)."""
import jax
import jax.numpy as jnp
import numpy as np

from jfmm.tree import tiles


def test_in_steps_sums_every_tile_and_traces_run_once(rng):
    counts = rng.integers(0, 40, size=30)                 # leaves of 0 to 39 points
    start = jnp.asarray(np.concatenate([[0], np.cumsum(counts), [counts.sum()]]), jnp.int32)
    n, tile = int(counts.sum()), 8
    w = jnp.asarray(rng.random(n + tile))
    traces = []

    def run(leaf, t0, t1):
        traces.append(leaf.shape)
        rows = t0[:, None] + jnp.arange(tile)[None, :]
        return jnp.sum(jnp.where(rows < t1[:, None], w[rows], 0.0))

    whole = jax.jit(lambda: tiles.in_steps(run, start, n, tile, None))()
    traces.clear()
    stepped = jax.jit(lambda: tiles.in_steps(run, start, n, tile, leaves=3))()
    assert len(traces) == 1 and traces[0][0] < tiles.tile_count(n, 30, tile)
    np.testing.assert_allclose(stepped, whole, rtol=1e-12)
    np.testing.assert_allclose(whole, np.sum(np.asarray(w)[:n]), rtol=1e-12)
