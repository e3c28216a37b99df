"""The FMM sharded over a mesh of CPU host devices (conftest makes 4)
against the float64 numpy sums and the single-device FMM."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import charges, points, radial_reference, reference, rel
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

import jfmm
from jfmm import configure
from jfmm import kernels as K
from jfmm.ops import backend
from jfmm.tree import adaptive

pytestmark = pytest.mark.skipif(jax.device_count() < 4, reason="needs 4 host devices "
                                "(conftest sets --xla_force_host_platform_device_count=4)")


def mesh_of(n_dev: int, axis_type=AxisType.Auto) -> Mesh:
    return Mesh(np.array(jax.devices()[:n_dev]), ("x",), axis_types=(axis_type,))


def spans(x, n_dev: int) -> np.ndarray:
    """The leaves (of the Morton order) each device's share of the sorted
    points runs over: a measure of its spatial extent."""
    pl = jfmm.plan(x, eps=1e-6, tree="uniform", leaf_size=16)
    leaf = np.asarray(pl.tree.src_leaf)
    return np.array([c[-1] - c[0] + 1 for c in np.array_split(leaf, n_dev)])


def lopsided(n: int, rng) -> np.ndarray:
    """Half the points in one tight cluster, half spread over the cube:
    the devices holding the cluster span a few leaves, the others most."""
    x = rng.random((n, 3))
    x[: n // 2] = 0.02 + 1e-3 * rng.normal(size=(n // 2, 3))   # first in Morton order
    return x


@pytest.mark.parametrize("n_dev,dist", [(1, "cube"), (2, "lopsided"), (3, "sphere"),
                                        (4, "lopsided")])
def test_laplace3d_every_mesh_size(rng, n_dev, dist):
    """Potential and gradient within eps of the direct sum, and equal to
    the single-device FMM to rounding, on 1 to 4 devices; the point count
    does not divide evenly, and on lopsided points the devices' Morton
    ranges differ in extent by an order of magnitude."""
    n = 3001
    x = lopsided(n, rng) if dist == "lopsided" else points(dist, n, rng)
    q = charges(n, rng)
    if dist == "lopsided":
        widths = spans(x, n_dev)
        assert widths.max() > 10 * widths.min()
    mesh = mesh_of(n_dev)
    phi, grad = jfmm.fmm(x, q, eps=1e-4, gradient=True, mesh=mesh, tree="uniform", leaf_size=16)
    one = jfmm.fmm(x, q, eps=1e-4, gradient=True, tree="uniform", leaf_size=16)
    exact = reference(x, q)
    assert rel(phi, exact[0]) < 1e-4
    assert rel(grad, exact[1]) < 1e-4
    assert rel(phi, np.asarray(one[0])) < 1e-13
    assert rel(grad, np.asarray(one[1])) < 1e-13
    assert phi.sharding.mesh.devices.size == n_dev


def test_build_over_the_mesh(rng):
    """`distributed.build` from points split over 1 to 4 devices gives
    `tree.build`'s tree array for array (ties in a leaf in the caller's
    order), its per-point arrays split over the mesh."""
    from jfmm import distributed
    from jfmm.tree import uniform

    n = 1200
    x, y = lopsided(n, rng), points("sphere", 600, rng)
    x[7] = x[3]                                       # coincident points keep their order
    for n_dev in (1, 2, 3, 4):
        mesh = mesh_of(n_dev)
        rows = NamedSharding(mesh, PartitionSpec("x"))
        for targets in (None, y):
            split = None if targets is None else jax.device_put(targets, rows)
            got = jax.jit(distributed.build, static_argnums=(2, 3))(
                jax.device_put(x, rows), split, 4, mesh)
            want = uniform.build(jnp.asarray(x), None if targets is None else
                                 jnp.asarray(targets), 4)
            for name in ("lo", "side", "src_perm", "src_sorted", "src_start", "src_leaf",
                         "tgt_perm", "tgt_sorted", "tgt_start", "tgt_leaf", "finite"):
                assert np.array_equal(getattr(got, name), getattr(want, name)), (n_dev, name)
            assert got.shared == (targets is None)
            assert got.src_sorted.sharding.spec == PartitionSpec("x")


def test_no_device_holds_every_point(rng):
    """On points whose count divides over the mesh, the sum and its
    gradient in the points move blocks of N / D rows between devices, no
    more (no collective of all N), within eps of the float64 sums."""
    import re

    n, n_dev = 2400, 4
    x, q = points("cluster", n, rng), charges(n, rng)
    mesh = mesh_of(n_dev)
    rows = NamedSharding(mesh, PartitionSpec("x"))
    xs, qs = jax.device_put(x, rows), jax.device_put(q, rows)

    def energy(x, q):
        return jnp.dot(q, jfmm.fmm(x, q, eps=1e-6, mesh=mesh, tree="uniform", leaf_size=16))

    fn = jax.jit(jax.value_and_grad(energy))
    hlo = fn.lower(xs, qs).compile().as_text()
    moved = re.findall(r"= \w+\[(\d+)[\],][^=]*? (?:all-gather|all-to-all|collective-permute|"
                       r"all-reduce|reduce-scatter)(?:-start)?\(", hlo)
    assert moved and max(int(r) for r in moved) <= max(n // n_dev, 8 ** 2), sorted(moved)[-5:]
    e, dx = fn(xs, qs)
    phi, grad = reference(x, q)
    assert abs(float(e) - q @ phi) < 1e-6 * abs(q) @ np.abs(phi)
    assert rel(dx, 2 * q[:, None] * grad) < 1e-6


@pytest.mark.parametrize("kernel,dim", [(K.Laplace3D(), 3), (K.Laplace2D(), 2)])
def test_adaptive_tree(rng, kernel, dim):
    """An adaptive plan on 3 devices (sources half in a cluster, half
    spread, in 3D; conftest's clusters in 2D; targets on a sphere):
    potential and gradient against the float64 sums and the single-device
    plan, and jax.grad in the charges (the adjoint sum on the swapped
    tree, W and X lists exchanged)."""
    n, m = 2001, 1001
    x = points("cluster", n, rng, dim)
    if dim == 3:
        x = rng.random((n, 3))
        x[: n // 2] = 0.3 + 0.02 * rng.normal(size=(n // 2, 3))
    y, q = points("sphere", m, rng, dim), charges(n, rng)
    eps = 1e-5
    opts = dict(eps=eps, gradient=True, tree="adaptive", leaf_size=16)
    pl = jfmm.plan(x, y, kernel, mesh=mesh_of(3), **opts)
    assert pl.config.tree == "adaptive" and pl.tree.depth >= 4
    phi, grad = pl.apply(q, gradient=True)
    one = jfmm.plan(x, y, kernel, **opts).apply(q, gradient=True)
    exact = radial_reference(kernel, x, q, y)
    assert rel(phi, exact[0]) < eps
    assert rel(grad, exact[1]) < eps
    assert rel(phi, np.asarray(one[0])) < 1e-12
    w = rng.standard_normal(m)
    got = jax.jit(jax.grad(lambda c, p: jnp.dot(w, p.apply(c))))(jnp.asarray(q), pl)
    assert rel(got, radial_reference(kernel, y, w, x, gradient=False)[0]) < 2 * eps


@pytest.mark.parametrize("kernel,dim,eps,dist", [
    (K.Laplace2D(), 2, 1e-8, "cluster"),
    (K.InverseMultiquadric(2.0), 3, 1e-4, "sphere"),
    (K.ThinPlateSpline(), 2, 1e-6, "cube"),
    (K.Gaussian(6.0), 3, 1e-6, "cube"),
])
def test_families_with_targets(rng, kernel, dim, eps, dist):
    """Every family (complex series, Chebyshev in 2D and 3D, the fast Gauss
    transform) on 3 devices, with targets apart from the sources. The plan
    is made for its charges: one for random charges checks them against a
    conservative estimate, and on a draw of CI's raised Unreachable."""
    n, m = 2001, 1502
    x, y, q = points(dist, n, rng, dim), points(dist, m, rng, dim), charges(n, rng, 2)
    pl = jfmm.plan(x, y, kernel, eps, mesh=mesh_of(3), leaf_size=16, gradient=True,
                   charges=q)
    if isinstance(kernel, K.Gaussian):
        assert pl.family == "hermite"
    else:
        assert pl.config.depth >= 2
    phi, grad = pl.apply(q, gradient=True)
    exact = radial_reference(kernel, x, q, y)
    assert rel(phi, exact[0]) < eps
    assert rel(grad, exact[1]) < 10 * eps


def test_near_field_alone_and_one_leaf(rng):
    """A tree of one leaf (the all-pairs sum) and the near field alone."""
    x, y, q = points("cube", 40, rng), points("cube", 31, rng), charges(40, rng)
    phi = jfmm.fmm(x, q, y, eps=1e-6, mesh=mesh_of(4))
    assert rel(phi, reference(x, q, y)[0]) < 1e-13
    g = K.Gaussian(40.0)
    x, q = points("cube", 1000, rng), charges(1000, rng)
    pl = jfmm.plan(x, None, g, 1e-6, mesh=mesh_of(4))
    assert pl.family == "near" and pl.config.depth >= 2
    assert rel(pl.apply(q), radial_reference(g, x, q, gradient=False)[0]) < 1e-6


def test_float32(rng):
    n = 4003
    x, q = points("cluster", n, rng).astype(np.float32), charges(n, rng).astype(np.float32)
    phi, grad = jfmm.fmm(x, q, eps=1e-5, gradient=True, mesh=mesh_of(4), leaf_size=16)
    assert phi.dtype == jnp.float32
    exact = reference(x, q, dtype=np.float32)
    assert rel(phi, exact[0]) < 1e-5
    assert rel(grad, exact[1]) < 1e-5


def test_grad_and_vmap(rng):
    """Reverse mode through the sharded sum (its adjoint is the sum with
    sources and targets swapped, sharded too), vmap over charge vectors
    and over point sets, against numpy: d/dq of w . phi(y) is G(x, y) w.
    The point counts divide over the mesh (`distributed.build`)."""
    n, m = 1200, 804
    x, y = points("cube", n, rng), points("cluster", m, rng)
    mesh = mesh_of(3)
    w = rng.standard_normal(m)

    def loss(q):
        return jnp.dot(w, jfmm.fmm(x, q, y, eps=1e-4, mesh=mesh, leaf_size=16))

    got = jax.grad(loss)(jnp.asarray(charges(n, rng)))
    assert rel(got, reference(y, w, x)[0]) < 1e-4
    qs = charges(n, rng, 3).T
    batched = jax.vmap(lambda q: jfmm.fmm(x, q, y, eps=1e-4, mesh=mesh, leaf_size=16))(qs)
    assert rel(batched, reference(x, qs.T, y)[0].T) < 1e-4
    xs = np.stack([x, points("sphere", n, rng)])               # vmap over point sets
    sets = jax.vmap(lambda p: jfmm.fmm(p, qs[0], eps=1e-4, mesh=mesh, tree="uniform",
                                       leaf_size=16))(xs)
    for got, p in zip(sets, xs):
        assert rel(got, reference(p, qs[0])[0]) < 1e-4


def test_jit_update_and_placement(rng, monkeypatch):
    """Traced points inside jit (the bounded adaptive tree where they crowd
    the uniform one, chosen at run time), a plan moved with `update` under
    jit, and inputs sharded over a mesh of Explicit axes (jax.make_mesh's
    default): results split over the devices."""
    n = 2400
    mesh = mesh_of(4)
    x, q = points("sphere", n, rng), charges(n, rng)
    taken, crowded = [], configure.crowded

    def spy(*args):                     # the run-time choice of tree
        flag = crowded(*args)
        jax.debug.callback(taken.append, flag)
        return flag

    monkeypatch.setattr(configure, "crowded", spy)
    monkeypatch.setattr(adaptive, "BOUNDED_LEVELS", 4)       # fewer levels to compile
    # depth 3; eps 1e-4, whose lower order compiles in half the time
    f = jax.jit(lambda x, q: jfmm.fmm(x, q, eps=1e-4, mesh=mesh, leaf_size=4))
    for kind, crowds in (("sphere", False), ("cluster", True)):
        x = points(kind, n, rng)
        taken.clear()
        phi = f(x, q)
        jax.effects_barrier()
        assert rel(phi, reference(x, q)[0]) < 1e-4, kind
        assert phi.sharding.spec == PartitionSpec("x")
        assert taken and all(bool(t) == crowds for t in taken), (kind, taken)
    pl = jfmm.plan(x, eps=1e-4, mesh=mesh, leaf_size=16)
    x2 = points("cube", n, rng)
    moved = jax.jit(lambda p, x, q: p.update(x).apply(q))(pl, x2, q)
    assert rel(moved, reference(x2, q)[0]) < 1e-4
    explicit = mesh_of(4, AxisType.Explicit)
    xs, qs = (jax.device_put(jnp.asarray(a), NamedSharding(explicit, PartitionSpec("x")))
              for a in (x, q))
    got = jfmm.fmm(xs, qs, eps=1e-4, mesh=explicit, leaf_size=16)
    assert rel(got, reference(x, q)[0]) < 1e-4
    assert got.sharding.spec == PartitionSpec("x")
    moved = jfmm.plan(xs, eps=1e-4, mesh=explicit, leaf_size=16).update(xs).apply(q)
    assert rel(moved, reference(x, q)[0]) < 1e-4
    # Python lists, and an array committed to one device, as without a mesh.
    assert rel(jfmm.fmm(x.tolist(), q.tolist(), eps=1e-4, mesh=mesh, leaf_size=16),
               reference(x, q)[0]) < 1e-4
    one = jax.device_put(jnp.asarray(x), jax.devices()[0])
    assert rel(jfmm.fmm(one, q, eps=1e-4, mesh=mesh_of(3), leaf_size=16),
               reference(x, q)[0]) < 1e-4


def test_work_list_windows():
    """Each device's window of a bounded tree's W or X list is a whole
    number of the chunks its loop takes (`adaptive.far_chunk`; a traced
    tree='adaptive' call on 3 devices failed there), and the windows
    together hold the list in order, dead entries after it."""
    from jfmm import distributed
    from jfmm.tree import adaptive
    for length, n_dev in [(513024, 3), (4096, 4), (1000, 3), (24, 2)]:
        work = jnp.arange(length, dtype=jnp.int32)
        wins = [np.asarray(distributed._window(work, me, n_dev, True)) for me in range(n_dev)]
        width = wins[0].shape[0]
        assert width % adaptive.far_chunk(width) == 0 and width * n_dev >= length
        joined = np.concatenate(wins)
        assert np.array_equal(joined[:length], np.arange(length))
        assert np.all(joined[length:] == np.iinfo(np.int32).max)
    # unbounded trees run the whole window at once: no more padding than needed
    assert distributed._window(jnp.arange(1000, dtype=jnp.int32), 0, 3, False).shape[0] == 334


def test_m2l_halo_matches_the_whole_level(rng):
    """Each device's M2L from its window of a level's multipoles and the
    parents around it that the others send (`distributed._halo_m2l`)
    equals its window of the M2L over the whole level, in 2D and 3D, on 2
    and 4 devices, at the first levels (where the grown boxes cover most
    of the grid) and below; the bytes sent are those parents alone."""
    import re

    from jax.sharding import PartitionSpec as P

    from jfmm import distributed
    from jfmm.ops import translate
    from jfmm.tree import lists
    k, p = 2, 3
    for dim, level, n_dev in [(3, 2, 4), (3, 4, 2), (3, 5, 4), (2, 3, 4), (2, 6, 2), (2, 6, 4)]:
        nc = 2 ** dim
        mult = rng.standard_normal((nc ** level, k, p))
        mats = rng.standard_normal((len(lists.m2l_offsets(dim)) + 1, p, p))
        mats[-1] = 0
        grouped = mult.reshape((-1, nc, k, p))
        whole = translate.m2l_blocks(grouped, lists.neighbors(level - 1, dim), mats, dim)
        body = functools.partial(distributed._window_m2l, level=level, mats=mats, dim=dim,
                                 axis="x", n_dev=n_dev, mode="jnp", windows=True)
        fn = jax.jit(jax.shard_map(body, mesh=mesh_of(n_dev), in_specs=P("x"),
                                   out_specs=P("x"), check_vma=False))
        assert rel(fn(mult), np.asarray(whole)) < 1e-13, (dim, level, n_dev)
        sent = re.findall(r"= f64\[(\d+),\d+,\d+,\d+\]\{[^}]*\} collective-permute",
                          fn.lower(mult).compile().as_text())
        assert sent and sum(map(int, sent)) < nc ** (level - 1), (sent, dim, level, n_dev)


def test_pallas_kernels_in_shards(rng):
    """The Pallas near field, P2M and L2P (interpreted) inside the shards."""
    n = 600
    x, q = points("cluster", n, rng), charges(n, rng)
    backend.set_backend("interpret")
    try:
        phi, grad = jfmm.fmm(x, q, eps=1e-6, gradient=True, mesh=mesh_of(2), leaf_size=16)
    finally:
        backend.set_backend("auto")
    exact = reference(x, q)
    assert rel(phi, exact[0]) < 1e-6
    assert rel(grad, exact[1]) < 1e-6


def test_bad_meshes(rng):
    x, q = points("cube", 100, rng), charges(100, rng)
    two = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("a", "b"))
    with pytest.raises(ValueError, match="one axis"):
        jfmm.fmm(x, q, mesh=two)
    with pytest.raises(ValueError, match="one axis"):
        jfmm.plan(x, mesh="x")
    explicit = mesh_of(2, AxisType.Explicit)
    xs = jax.device_put(jnp.asarray(x), NamedSharding(explicit, PartitionSpec("x")))
    with pytest.raises(ValueError, match="Auto"):
        jax.jit(lambda x: jfmm.fmm(x, q, mesh=explicit))(xs)
    with pytest.raises(ValueError, match="Auto"):
        jax.grad(lambda x: jnp.sum(jfmm.fmm(x, q, mesh=explicit)))(xs)
    with jax.set_mesh(explicit), pytest.raises(ValueError, match="set_mesh"):
        jfmm.fmm(x, q, mesh=explicit)


def test_two_processes(rng):
    """Two processes of two devices each, one mesh over jax.distributed
    (the many-hosts path, gloo collectives on the CPU): potential, gradient
    and jax.grad of an energy in the charges and the points against the
    float64 direct sum."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = str(s.getsockname()[1])
    worker = os.path.join(os.path.dirname(__file__), "multihost_worker.py")
    seed = str(rng.integers(2 ** 31))
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    procs = [subprocess.Popen([sys.executable, worker, port, str(i), seed], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    line = next(v for v in outs[0].splitlines() if v.startswith("errors"))
    errors = [float(v) for v in line.split()[1:]]
    assert max(errors) < 1e-4, line


def test_points_a_device_over_the_mesh(monkeypatch):
    """api.DEVICE_POINTS counts the points a device holds: 4,000 split
    over 4 devices pass a bound of 1,000, 4,004 (which do not split, every
    device holds them) do not."""
    from jfmm import api
    monkeypatch.setattr(api, "DEVICE_POINTS", 1000)
    mesh = mesh_of(4)
    for n, ok in ((4000, True), (4004, False)):
        shapes = (jax.ShapeDtypeStruct((n, 3), jnp.float32), jax.ShapeDtypeStruct((n,), jnp.float32))
        call = lambda a, c: jfmm.fmm(a, c, eps=1e-4, tree="uniform", mesh=mesh)  # noqa: E731
        if ok:
            jax.eval_shape(call, *shapes)
        else:
            with pytest.raises(ValueError, match="points a device"):
                jax.eval_shape(call, *shapes)
