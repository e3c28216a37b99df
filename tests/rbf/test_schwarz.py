"""The Schwarz preconditioner's geometry: median splits against numpy,
extended sets searched on the device against scipy's k-d tree on the
host (float64, fresh draws)."""
import numpy as np
import pytest

from jfmm.rbf import schwarz


def cloud(kind, n, rng):
    if kind == "uniform":
        return rng.random((n, 3))
    if kind == "clusters":          # three clusters over two decades of width
        centres = rng.random((3, 3))
        width = np.array([0.002, 0.02, 0.2])[rng.integers(0, 3, n)]
        return centres[rng.integers(0, 3, n)] + width[:, None] * rng.normal(size=(n, 3))
    heads = rng.random((40, 2))     # points along vertical lines
    return np.concatenate([heads[rng.integers(0, 40, n)], rng.random((n, 1))], axis=1)


def reference_splits(x, idx, levels):
    """Median splits in numpy, recursively: each group split at its median
    rank along its widest axis (ties in the group's order), `levels` times."""
    if levels == 0:
        return [idx]
    pts = x[idx]
    axis = np.argmax(pts.max(0) - pts.min(0))
    order = idx[np.argsort(pts[:, axis], kind="stable")]
    half = len(idx) // 2
    return reference_splits(x, order[:half], levels - 1) + \
        reference_splits(x, order[half:], levels - 1)


@pytest.mark.parametrize("kind", ["uniform", "clusters", "lines"])
@pytest.mark.parametrize("n", [3000, 4096, 5001])
def test_median_splits_against_numpy(kind, n, rng):
    """Cores and coarse points against a recursive numpy split: 2^L cores
    of floor or ceil n / 2^L points (L fixed by n), each point in one core,
    and per quarter of a core the point nearest its centroid."""
    x = cloud(kind, n, rng)
    groups, coarse = (np.asarray(a) for a in schwarz.median_splits(x, 32, 4))
    depth = int(np.ceil(np.log2(n / 32)))
    assert groups.shape == (2 ** depth, 32)
    ref = reference_splits(x, np.arange(n), depth)
    for row, want in zip(groups, ref):
        np.testing.assert_array_equal(np.sort(row[row >= 0]), np.sort(want))
    np.testing.assert_array_equal(np.sort(groups[groups >= 0]), np.arange(n))
    nearest = []
    for part in reference_splits(x, np.arange(n), depth + 2):
        d = np.sum((x[part] - x[part].mean(0)) ** 2, axis=1)
        nearest.append(part[np.argmin(d)])
    np.testing.assert_array_equal(coarse, np.sort(nearest))


def test_median_splits_have_shapes_fixed_by_n(rng):
    """Two draws of points along lines (many tied coordinates): the same
    shapes, so that a second fit of the same size compiles nothing."""
    a, b = (schwarz.median_splits(cloud("lines", 5000, rng), 32, 4) for _ in range(2))
    assert [v.shape for v in a] == [v.shape for v in b]


@pytest.mark.parametrize("kind", ["uniform", "clusters", "lines"])
@pytest.mark.parametrize("candidates", [64, 2])
def test_extended_sets_are_the_nearest_points(kind, candidates, rng):
    """Every core's extended set: its core, then the points nearest its
    centroid outside it, the same as the k-d tree's, whether the device
    search is exact (32 candidate cores) or falls back (2)."""
    x = cloud(kind, 6000, rng)
    groups = np.asarray(schwarz.median_splits(x, 32, 4)[0])
    cores, ext = schwarz.subdomains(x, groups, 256, candidates=candidates, device=True)
    host_cores, host_ext = schwarz._subdomains_host(x, groups, 256)
    np.testing.assert_array_equal(cores, host_cores)
    assert ext.shape == host_ext.shape == (len(groups), 256)
    ext, host_ext = np.asarray(ext), np.asarray(host_ext)
    np.testing.assert_array_equal(ext[:, :32], host_ext[:, :32])
    # The same points (ties in distance may order them differently).
    np.testing.assert_array_equal(np.sort(ext[:, 32:], 1), np.sort(host_ext[:, 32:], 1))
    # Independently: the extra points are the nearest outside the core.
    valid = groups >= 0
    centres = (x[np.where(valid, groups, 0)] * valid[..., None]).sum(1) / valid.sum(1)[:, None]
    for g in rng.choice(len(groups), 20, replace=False):
        d = np.sum((x - centres[g]) ** 2, axis=1)
        d[groups[g][valid[g]]] = np.inf
        np.testing.assert_array_equal(np.sort(ext[g, 32:]), np.sort(np.argsort(d)[:224]))


def test_small_sets_take_what_there_is(rng):
    """Fewer points than an extended set: sets of n columns, each its core
    (padded with the sentinel n) and the nearest points outside it, as the
    k-d tree's."""
    x = rng.random((100, 3))
    groups = np.asarray(schwarz.median_splits(x, 32, 4)[0])
    cores, ext = schwarz.subdomains(x, groups, 256, device=True)
    host = np.asarray(schwarz._subdomains_host(x, groups, 256)[1])
    ext = np.asarray(ext)
    assert ext.shape == host.shape == (len(groups), 100)
    np.testing.assert_array_equal(np.sort(ext, 1), np.sort(host, 1))
    for g, row in enumerate(ext):
        inside = set(groups[g][groups[g] >= 0])
        assert not inside & set(row[32:]) and len(set(row[row < 100])) == len(row[row < 100])
