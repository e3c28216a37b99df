"""The Schwarz preconditioner: coarse points against numpy, extended sets
searched on the device against scipy's k-d tree on the host, local
inverses against numpy's (float64, fresh draws)."""
import jax.numpy as jnp
import numpy as np
import pytest

from jfmm.rbf import schwarz
from jfmm.rbf.interpolator import kernel_for


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
def test_median_groups_are_the_whole_trees_leaves(kind, rng):
    """Subtrees built apart (in threads) give the leaves of scipy's one
    balanced k-d tree over all points, in its depth-first order."""
    from scipy.spatial import cKDTree

    x = cloud(kind, 20000, rng)
    tree = cKDTree(x, leafsize=32, balanced_tree=True, compact_nodes=True)
    want, stack = [], [tree.tree]
    while stack:
        node = stack.pop()
        if node.split_dim == -1:
            want.append(np.sort(tree.indices[node.start_idx:node.end_idx]))
        else:
            stack += [node.greater, node.lesser]
    got = schwarz.median_groups(x, 32)
    assert len(got) == len(want) > schwarz.PARTS
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.sort(g), w)


@pytest.mark.parametrize("kind", ["uniform", "clusters", "lines"])
def test_coarse_points_against_numpy(kind, rng):
    """Per quarter of each core (median splits), the point nearest its
    centroid; ties along lines split in order. In numpy (as on the CPU and
    for small levels) and on the device."""
    x = cloud(kind, 5001, rng)
    groups = schwarz.padded(schwarz.median_groups(x, 32), 32, -1)
    want = []
    for row in groups:
        for part in reference_splits(x, row[row >= 0], 2):
            if len(part):
                want.append(part[np.argmin(np.sum((x[part] - x[part].mean(0)) ** 2, 1))])
    np.testing.assert_array_equal(schwarz.coarsen(x, groups, 4), np.sort(want))
    on_device = np.asarray(schwarz._nearest_on_device(x, groups.astype(np.int32), parts=4))
    np.testing.assert_array_equal(np.sort(on_device[on_device >= 0]), np.sort(want))


@pytest.mark.parametrize("kind", ["uniform", "clusters", "lines"])
@pytest.mark.parametrize("candidates", [64, 2])
def test_extended_sets_are_the_nearest_points(kind, candidates, rng):
    """Every core's extended set: its core, then the points nearest its
    centroid outside it, the same as the k-d tree's, whether the device
    search is exact (32 candidate cores) or falls back (2)."""
    x = cloud(kind, 6000, rng)
    groups = schwarz.padded(schwarz.median_groups(x, 32), 32, -1)
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


@pytest.mark.parametrize("device", [True, False])
def test_subdomains_padded_to_a_bucket(device, rng):
    """With a sentinel and a row count beyond the level's own (its ghost
    points and subdomains): the same sets with n replaced by the sentinel,
    then rows of the sentinel alone."""
    x = cloud("lines", 3000, rng)
    n = len(x)
    groups = schwarz.padded(schwarz.median_groups(x, 32), 32, -1)
    cores, ext = (np.asarray(a) for a in schwarz._subdomains_host(x, groups, 256))
    sentinel, rows = n + 77, len(groups) + 5
    pc, pe = (np.asarray(a) for a in schwarz.subdomains(
        x, groups, 256, device=device, sentinel=sentinel, rows=rows))
    assert pc.shape == (rows, 32) and pe.shape == (rows, 256)
    np.testing.assert_array_equal(pc[:len(groups)], np.where(cores == n, sentinel, cores))
    np.testing.assert_array_equal(np.sort(pe[:len(groups)], 1),
                                  np.sort(np.where(ext == n, sentinel, ext), 1))
    assert np.all(pc[len(groups):] == sentinel) and np.all(pe[len(groups):] == sentinel)


def test_small_sets_take_what_there_is(rng):
    """Fewer points than an extended set: sets of n columns, each its core
    (padded with the sentinel n) and the nearest points outside it, as the
    k-d tree's."""
    x = rng.random((100, 3))
    groups = schwarz.padded(schwarz.median_groups(x, 32), 32, -1)
    cores, ext = schwarz.subdomains(x, groups, 256, device=True)
    host = np.asarray(schwarz._subdomains_host(x, groups, 256)[1])
    ext = np.asarray(ext)
    assert ext.shape == host.shape == (len(groups), 100)
    np.testing.assert_array_equal(np.sort(ext, 1), np.sort(host, 1))
    for g, row in enumerate(ext):
        inside = set(groups[g][groups[g] >= 0])
        assert not inside & set(row[32:]) and len(set(row[row < 100])) == len(row[row < 100])


@pytest.mark.parametrize("kind", ["uniform", "lines"])
@pytest.mark.parametrize("kernel, degree", [("linear", 1), ("thin_plate_spline", 1),
                                            ("linear", -1)])
def test_local_inverses_against_numpy(kind, kernel, degree, rng):
    """Each subdomain's rows of its local saddle system's inverse, against
    numpy's float64 inverse of [[K + s, P], [P^T, 0]] (P: 1, x, y, z, or
    none), stored in float32 for float64 points (they are the solver's
    largest arrays; a preconditioner needs no more), and the restricted
    solves they give. A set of fewer points than it holds (the last)
    leaves its padding's columns zero. The kernels at their minimum degree
    factorize by Cholesky on the polynomials' null space; the linear
    kernel without a polynomial (below its minimum degree) is indefinite,
    and takes LU."""
    n, core, m_ext = 200, 16, 48
    x = cloud(kind, n, rng)
    smoothing = rng.random(n) * 1e-3
    groups = schwarz.padded(schwarz.median_groups(x, core), core, -1)
    cores, ext = (np.array(a) for a in schwarz.subdomains(x, groups, m_ext))
    ext[-1, m_ext // 2:] = n                                 # a short set
    powers = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]])[:4 if degree == 1 else 0]
    G = schwarz.local_inverses(kernel_for(kernel, 1.0), jnp.asarray(x),
                               jnp.asarray(smoothing), jnp.asarray(ext), core, powers,
                               definite=degree >= 0)
    assert G.dtype == jnp.float32 and G.shape == (len(groups), core, m_ext)
    want = np.zeros(G.shape)
    for i, e in enumerate(ext):
        at = np.flatnonzero(e < n)                       # the set's points' slots
        pts = x[e[at]]
        r = np.linalg.norm(pts[:, None] - pts[None], axis=-1)
        k = -r if kernel == "linear" else r ** 2 * np.log(np.where(r > 0, r, 1.0))
        k = k + np.diag(smoothing[e[at]])
        p = np.concatenate([np.ones((len(at), 1)), pts], axis=1)[:, :len(powers)]
        s = np.block([[k, p], [p.T, np.zeros((len(powers), len(powers)))]])
        rows = at[at < core]                             # the core's points' slots
        want[i][np.ix_(rows, at)] = np.linalg.inv(s)[:len(rows), :len(at)]
    G = np.where((cores < n)[:, :, None], np.asarray(G), 0.0)   # padding slots: unused
    assert np.max(np.abs(G - want)) <= 1e-5 * np.max(np.abs(want))
    r = rng.random(n) - 0.5
    z = schwarz.restricted_solves(jnp.asarray(G, jnp.float32), jnp.asarray(cores),
                                  jnp.asarray(ext), jnp.asarray(r))
    assert z.dtype == np.float64
    rp = np.append(r, 0.0)
    z_want = np.zeros(n + 1)
    z_want[cores] = np.einsum("dme,de->dm", want, rp[ext])
    assert np.linalg.norm(np.asarray(z) - z_want[:n]) <= 1e-5 * np.linalg.norm(z_want)
