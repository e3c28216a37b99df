"""The FMM on adaptive trees against the float64 numpy sum: every tree
family on clustered, degenerate and mixed point sets, the counting FMM,
capacities that overflow under Plan.update, derivatives, and the choice
between uniform and adaptive trees."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import charges, points, radial_reference, rel
from test_fmm import _Counting, _One

import jfmm
from jfmm import api, configure, passes
from jfmm import kernels as K
from jfmm.tree import adaptive, crowding, lists


def scales(n, rng, dim, orders: int = 6):
    """Clusters whose widths span `orders` orders of magnitude, and 5%
    outliers 10x farther out."""
    centres = rng.random((3, dim))
    width = 10.0 ** -rng.integers(1, orders + 1, n)
    x = centres[rng.integers(0, 3, n)] + width[:, None] * rng.normal(size=(n, dim))
    x[: n // 20] = rng.random((n // 20, dim)) * 10
    return x


def two_far(n, rng, dim):
    """Two tight clusters 1,000 of their widths apart."""
    x = 1e-3 * rng.normal(size=(n, dim))
    x[n // 2:] += 1.0
    return x


def flat(n, rng, dim, axes: int):
    """Points on a line (axes 1) or a plane (axes 2) through the cube."""
    x = np.full((n, dim), 0.5)
    x[:, :axes] = rng.random((n, axes))
    return x


def scales_and_duplicates(n, rng, dim):
    """`scales` (3 orders) with a quarter of the points in groups of 20
    coincident ones."""
    x = scales(n, rng, dim, 3)
    x[-(n // 4):] = np.repeat(x[-(n // 4):][::20], 20, axis=0)[:n // 4]
    return x


# (kernel, dim, eps, dtype, sources, targets or None, leaf size): every tree
# family, targets = sources and != sources, float64 and float32.
CASES = {
    "laplace3d-scales": (K.Laplace3D(), 3, 1e-4, np.float64, scales, None, 8),
    "laplace3d-duplicates-to-uniform-f32": (K.Laplace3D(), 3, 1e-5, np.float32,
                                            scales_and_duplicates,
                                            lambda n, r, d: r.random((n // 2, d)), 8),
    "laplace2d-line-to-two-far": (K.Laplace2D(), 2, 1e-9, np.float64,
                                  lambda n, r, d: flat(n, r, d, 1), two_far, 4),
    "chebyshev3d-plane": (K.InverseMultiquadric(3.0), 3, 1e-4, np.float64,
                          lambda n, r, d: flat(n, r, d, 2), None, 8),
    "chebyshev2d-scales-to-sphere": (K.ThinPlateSpline(), 2, 1e-8, np.float64,
                                     lambda n, r, d: scales(n, r, d, 3),
                                     lambda n, r, d: points("sphere", n // 2, r, d), 8),
}


@pytest.mark.parametrize("case", list(CASES))
def test_matches_the_direct_sum(case, rng):
    kernel, dim, eps, dtype, make_src, make_tgt, leaf = CASES[case]
    x = make_src(300, rng, dim).astype(dtype)
    y = None if make_tgt is None else make_tgt(300, rng, dim).astype(dtype)
    q = charges(300, rng).astype(dtype)
    pl = jfmm.plan(x, y, kernel=kernel, eps=eps, leaf_size=leaf, gradient=True, tree="adaptive")
    assert pl.config.tree == "adaptive" and pl.tree.depth >= 3 and not bool(pl.overflow)
    phi, grad = pl.apply(q, gradient=True)
    assert phi.dtype == dtype
    ref, gref = radial_reference(kernel, x, q, y)
    assert rel(phi, ref) <= eps, rel(phi, ref)
    assert rel(grad, gref) <= 10 * eps, rel(grad, gref)


def test_2d_gradient_beside_tight_clusters():
    """A CI draw (conftest's 5 clusters of width 1e-3, targets on a circle)
    whose clusters each sum like one large charge at the worst geometry of
    its translations: grad 1.07e-5 at eps 1e-5 with one order above the
    2D table's, within eps with the two that `laplace2d.on_adaptive` adds."""
    rng = np.random.default_rng(65994926134990604761038423713051755844)
    x = points("cluster", 2001, rng, 2)
    y, q = points("sphere", 1001, rng, 2), charges(2001, rng)
    pl = jfmm.plan(x, y, K.Laplace2D(), eps=1e-5, gradient=True, tree="adaptive", leaf_size=16)
    phi, grad = pl.apply(q, gradient=True)
    ref, gref = radial_reference(K.Laplace2D(), x, q, y)
    assert rel(phi, ref) <= 1e-5
    assert rel(grad, gref) <= 1e-5, rel(grad, gref)


def test_counting_fmm_covers_every_pair_once(rng):
    """Unit charges and K = 1 through operators that pass counts on: every
    target receives each source once, through U, V, W and X alike."""
    x, y = scales(400, rng, 3), points("cube", 200, rng, 3)
    tree = adaptive.plan_tree(jnp.asarray(x), jnp.asarray(y), 8)
    n_w = int(np.sum(np.asarray(tree.w_tile) < len(adaptive.far_tiles(tree.tgt_start, 200)[0])))
    n_x = int(np.sum(np.asarray(tree.x_tile) < len(adaptive.far_tiles(tree.src_start, 400)[0])))
    assert n_w > 0 and n_x > 0                               # W and X lists in use
    fam = _CountingAdaptive
    ops = fam.operators(1, lists.m2l_offsets(3), jnp.float64)
    run = jax.jit(passes.evaluate, static_argnums=(3, 5))
    phi, _ = run(tree, jnp.ones((400, 1)), _One(), configure.Config(fam, 1, 2, 1.0), ops, False)
    np.testing.assert_array_equal(phi, 400.0)


class _CountingAdaptive(_Counting):
    """`_Counting` with M2P and P2L that pass counts on too."""

    @staticmethod
    def m2p_basis(kernel, u, h, p, gradient=False):
        return jnp.ones(u.shape[:1] + (1,), u.dtype), None

    @staticmethod
    def p2l_basis(kernel, v, h, p):
        return jnp.ones(v.shape[:1] + (1,), v.dtype)


def test_update_overflow_is_nan_under_jit_and_raises_eagerly(rng):
    x = points("cube", 300, rng, 3)
    q = charges(300, rng)
    pl = jfmm.plan(x, eps=1e-5, leaf_size=8, tree="adaptive")
    moved = x + 1e-9 * rng.normal(size=x.shape)               # the same tree's room
    apply = jax.jit(lambda p, a, c: p.update(a).apply(c))
    assert rel(apply(pl, moved, q), radial_reference(K.Laplace3D(), moved, q,
                                                     gradient=False)[0]) <= 1e-5
    crowded = scales(300, rng, 3)                    # needs levels the plan does not have
    assert bool(jax.jit(lambda p, a: p.update(a).overflow)(pl, crowded))
    assert np.isnan(apply(pl, crowded, q)).all()
    with pytest.raises(RuntimeError, match="make a new plan"):
        pl.update(crowded).apply(q)


def test_derivatives_on_an_adaptive_plan(rng):
    """jax.grad in the charges through Plan.update and apply: the adjoint
    sum, on the swapped tree with its W and X lists exchanged, against
    autodiff of the direct sum. (Point positions and vmap go through the
    same primitive rules as on uniform trees: tests/test_primitive.py.)
    The adjoint sum runs at the order chosen for the forward one, whose
    eps it does not promise: measured up to 3.1 eps on these points (one
    draw; 40 others at most 1.6 eps; a per-direction order for the adjoint
    would hold it to eps)."""
    x, y = scales(250, rng, 3, 3), points("sphere", 120, rng, 3)
    q, w = charges(250, rng), jnp.asarray(rng.normal(size=120))
    pl = jfmm.plan(x, y, eps=1e-4, leaf_size=8, tree="adaptive")
    # The plan is an argument: closed over, its arrays would be constants
    # that XLA folds at length.
    fast = jax.jit(jax.grad(lambda c, p: jnp.sum(w * p.update(x, y).apply(c))))
    want = jax.grad(lambda c: jnp.sum(w * jfmm.direct(x, c, y)))(q)
    assert rel(fast(q, pl), np.asarray(want)) <= 4e-4


def test_the_tree_auto_chooses(rng, monkeypatch):
    """"auto": adaptive where the points crowd the uniform tree, uniform on
    uniform points, for concrete and traced points alike (traced: chosen
    at run time; under vmap one tree for the batch, adaptive where any
    member crowds); tree="adaptive" needs a tree family, and on traced
    points the Laplace series. An eager call keeps its adaptive tree for
    the next call on the same array: that call builds none."""
    crowded, even = scales(1000, rng, 3, 3), points("cube", 1000, rng, 3)
    opts = dict(eps=1e-4, leaf_size=2)              # depth 3
    # At depth 3 crowding stays below 8^3 / 3^3 = 19 (all points in one
    # leaf), under the bar that large trees are chosen by: there the bar is
    # half of that (`configure.crowding_bar`), and below depth 3 none.
    assert float(crowding(crowded, None, 3)) > 10 > 1.5 > float(crowding(even, None, 3))
    assert configure.crowding_bar(3, 3) < 10 and configure.crowding_bar(3, 2) is None
    assert jfmm.plan(crowded, **opts).config.tree == "adaptive"
    assert jfmm.plan(even, **opts).config.tree == "uniform"
    shallow = jfmm.plan(crowded, eps=1e-4, leaf_size=16)
    assert shallow.config.depth == 2 and shallow.config.tree == "uniform"
    built, real = [], adaptive.plan_tree
    monkeypatch.setattr(adaptive, "plan_tree", lambda *a: built.append(1) or real(*a))
    monkeypatch.setattr(adaptive, "BOUNDED_LEVELS", 4)       # fewer levels to compile
    held = jnp.asarray(crowded)
    for q in (charges(1000, rng), charges(1000, rng)):
        phi = jfmm.fmm(held, q, **opts)                       # eager: adaptive, kept
        assert rel(phi, radial_reference(K.Laplace3D(), crowded, q, gradient=False)[0]) <= 1e-4
    assert len(built) == 1
    traced = jax.jit(lambda a, tree: jfmm.fmm(a, q, tree=tree, **opts), static_argnums=1)
    auto_phi = traced(crowded, "auto")          # the adaptive tree of bounded capacities
    assert rel(auto_phi, phi) <= 2e-4
    # vmap over both sets: one tree for the batch, the adaptive one
    both = jax.jit(jax.vmap(lambda a: traced(a, "auto")))(np.stack([crowded, even]))
    even_phi = radial_reference(K.Laplace3D(), even, q, gradient=False)[0]
    assert rel(both[0], auto_phi) < 1e-13 and rel(both[1], even_phi) <= 2e-4
    # Not the uniform tree's sums where the points crowd (a tree's sums
    # differ beyond rounding from another's), and its alone where not.
    uniform = traced(even, "uniform")
    assert rel(traced(crowded, "uniform"), auto_phi) > 1e-13 and rel(both[1], uniform) > 1e-13
    assert rel(traced(even, "auto"), uniform) < 1e-13
    with pytest.raises(ValueError, match="float32 Chebyshev gradients"):
        jax.jit(lambda a: jfmm.fmm(a, q, kernel=K.InverseMultiquadric(1.0), tree="adaptive",
                                   **opts))(crowded.astype(np.float32))
    with pytest.raises(ValueError, match="tree must be one of"):
        jfmm.plan(crowded, tree="octree")
    gauss = jfmm.plan(crowded, kernel=K.Gaussian(3.0), eps=1e-4, family="hermite")
    assert gauss.config.tree == "uniform"                    # the transform keeps its grid


def test_eager_calls_on_new_points_share_one_tree(rng, monkeypatch):
    """Eager calls on new point sets of the same shapes (time steps
    outside jit): the first sizes its adaptive tree from its points, later
    ones take the tree of traced points, compiled once, within eps. Calls
    on one numpy array of points sum through the plan the first made, as
    calls on one jax array do; changed in place, its values are new
    points."""
    for name in ("_SIZED", "_PLANS", "_HOST_POINTS"):
        monkeypatch.setattr(api, name, type(getattr(api, name))())
    built, real = [], adaptive.plan_tree
    monkeypatch.setattr(adaptive, "plan_tree", lambda *a: built.append(1) or real(*a))
    x, plans = scales(1000, rng, 3, 3), []
    for step in range(4):
        if step == 2:
            x[:] = scales(1000, rng, 3, 4)                     # in place
        pts = jnp.asarray(scales(1000, rng, 3, 5)) if step == 3 else x
        q = charges(1000, rng)
        phi = jfmm.fmm(pts, q, eps=1e-4, leaf_size=2)
        ref = radial_reference(K.Laplace3D(), np.asarray(pts), q, gradient=False)[0]
        assert rel(phi, ref) <= 1e-4
        plans.append(api._PLANS[0][2])                         # the plan the call kept
    assert len(built) == 1 and plans[1] is plans[0]
    assert [pl.tree.caps.bounded for pl in plans] == [False, False, True, True]


# Traced points: trees of bounded capacities (`adaptive.bounded_capacities`).

def coincident_but_few(n, rng, dim):
    """Nine in ten points at one place, the rest in the unit cube."""
    x = np.tile(rng.random(dim), (n, 1))
    x[: n // 10] = rng.random((n // 10, dim))
    return x


def one_far_outlier(n, rng, dim):
    x = rng.random((n, dim))
    x[0] = 1e6
    return x


def twenty_decades(n, rng, dim):
    """Radii spread over 10^-10 .. 10^10 in random directions."""
    v = rng.normal(size=(n, dim))
    return v / np.linalg.norm(v, axis=1, keepdims=True) * 10.0 ** rng.uniform(-10, 10, (n, 1))


WORST = {"coincident": coincident_but_few, "outlier": one_far_outlier,
         "line": lambda n, r, d: flat(n, r, d, 1), "decades": twenty_decades}


def test_traced_points_on_bounded_trees(rng, monkeypatch):
    """jit(fmm) on a tree sized from the shapes alone: worst-case point sets
    within eps of the float64 numpy sum, with so little room that levels
    run out (the most crowded boxes split first, larger leaves remain;
    the default room: `test_the_tree_auto_chooses`) and the near field's
    tiles in steps (`tiles.in_steps`). float32, whose
    deepest exact level is the shallower."""
    dtype, eps = np.float32, 1e-4
    monkeypatch.setattr(adaptive, "BOUNDED_ROOM", 0.02)
    monkeypatch.setattr(adaptive, "BOUNDED_LEVELS", 2)
    monkeypatch.setattr(adaptive, "BOUNDED_CLUSTERS", 0)
    monkeypatch.setattr(adaptive, "BUSY_LEAVES", 1)          # tiles in several steps
    call = jax.jit(lambda a, c: jfmm.fmm(a, c, eps=eps, gradient=True, tree="adaptive",
                                          leaf_size=8))
    for name, make in WORST.items():
        x, q = make(300, rng, 3).astype(dtype), charges(300, rng).astype(dtype)
        phi, grad = call(x, q)
        ref, gref = radial_reference(K.Laplace3D(), x, q)
        assert rel(phi, ref) <= eps, (name, rel(phi, ref))
        assert rel(grad, gref) <= eps, (name, rel(grad, gref))


@pytest.mark.parametrize("far_chunk", [64, 1024])
def test_m2l_runs_busy_blocks_alone(far_chunk, rng, monkeypatch):
    """A bounded tree's M2L runs its busy blocks alone (`passes._busy_only`):
    whole chunks, then, where chunks are FAR_CHUNK long, a tail of smaller
    ones; every busy row's result lands in its place, the rest are zero."""
    monkeypatch.setattr(adaptive, "FAR_CHUNK", far_chunk)
    t, ways = 1000, 8
    rows = jnp.asarray(rng.integers(0, 50, (t, 27)), jnp.int32)
    busy = jnp.asarray(rng.random(t) < 0.537)

    def run(r):                          # (c, 27) -> (c ways, 1, 2)
        v = jnp.stack([jnp.sum(r, axis=1), jnp.max(r, axis=1)], axis=1).astype(jnp.float64)
        return jnp.repeat(v, ways, axis=0)[:, None, :]

    got = jax.jit(lambda r, b: passes._busy_only(run, r, b, 50))(rows, busy)
    want = np.where(np.asarray(busy)[:, None, None, None],
                    np.asarray(run(rows)).reshape(t, ways, 1, 2), 0.0).reshape(t * ways, 1, 2)
    np.testing.assert_array_equal(np.asarray(got), want)


def test_bounded_tree_runs_out_of_room_gracefully(rng, monkeypatch):
    """With scarce room the build keeps the tree balanced (no box beside a
    gap splits) and never sets overflow, and a plan made under jit (such a
    tree) sums within eps."""
    monkeypatch.setattr(adaptive, "BOUNDED_ROOM", 0.05)
    monkeypatch.setattr(adaptive, "BOUNDED_CLUSTERS", 0)
    monkeypatch.setattr(adaptive, "BOUNDED_LEVELS", 4)       # fewer levels to compile
    x = jnp.asarray(scales(1200, rng, 3))
    caps = adaptive.bounded_capacities(1200, 3, 8, x.dtype)
    tree = jax.jit(lambda a: adaptive.build(a, None, 8, caps))(x)
    assert not bool(tree.overflow)
    used = [int(jnp.sum(tree.valid[o:e])) for o, e in zip(tree.offsets[:-1], tree.offsets[1:])]
    assert max(used) == max(caps.levels[2:])              # some level ran out of room
    # 2:1 balance: every colleague position of a split box inside the root holds a box
    level = np.asarray(tree.level)
    split = np.asarray(tree.valid & ~tree.leaf)
    coll = np.asarray(tree.colleagues)
    centre, side = np.asarray(tree.center), float(tree.side)
    lo = np.asarray(tree.lo)
    for b in np.flatnonzero(split):
        h = side / 2 ** level[b]
        for j, v in enumerate(lists.near_displacements(3)):
            c = centre[b] + h * v
            inside = np.all((c > lo) & (c < lo + side))
            assert not inside or coll[b, j] < tree.n_boxes, (b, j)
    # A plan made inside jit builds such a tree, and sums through it.
    q = charges(1200, rng)
    ref = radial_reference(K.Laplace3D(), np.asarray(x), q, gradient=False)[0]
    phi = jax.jit(lambda a: jfmm.plan(a, eps=1e-6, leaf_size=8, tree="adaptive").apply(q))(x)
    assert rel(phi, ref) <= 1e-6


def test_traced_chebyshev_on_bounded_trees(rng, monkeypatch):
    """jit(fmm) of a Chebyshev kernel (float64, 2D: the choice is the same
    in 3D, `CASES` has its passes) on clustered points: "auto" takes the
    bounded adaptive tree at run time (its sums differ beyond rounding
    from the uniform tree's) and is within eps of the float64 numpy sum."""
    monkeypatch.setattr(adaptive, "BOUNDED_LEVELS", 4)       # fewer levels to compile
    kernel, eps = K.InverseMultiquadric(1.0), 1e-6
    x, q = scales(600, rng, 2, 3), charges(600, rng)
    call = jax.jit(lambda a, tree: jfmm.fmm(a, q, kernel=kernel, eps=eps, gradient=True,
                                            tree=tree, leaf_size=4), static_argnums=1)
    (phi, grad), (phi_u, _) = call(x, "auto"), call(x, "uniform")       # depth 4
    assert rel(phi, phi_u) > 1e-13
    ref, gref = radial_reference(kernel, x, q)
    assert rel(phi, ref) <= eps and rel(grad, gref) <= eps, (rel(phi, ref), rel(grad, gref))


def test_flagged_sums_are_checked_at_their_samples(rng, monkeypatch):
    """Pairs of opposite charges 1e-4 apart on clustered points cancel in
    phi far more than the random ones a traced call's order assumes: the
    model's check flags them (NaN with the direct check at its targets
    turned off), and the direct sums at its strided targets find the FMM's
    within eps (measured: at most 0.04 eps over 24 draws), so jit(fmm) is
    finite and within eps of the float64 numpy sum. (The gradient's rows
    of the direct check: test_configure.py.)"""
    kernel, eps = K.InverseMultiquadric(1.0), 1e-6
    x, q = scales(300, rng, 2, 3), charges(300, rng, 2)
    x, q = np.vstack([x, x + 1e-4 * rng.normal(size=x.shape)]), np.vstack([q, -q])

    def call():
        return jax.jit(lambda a: jfmm.fmm(a, q, kernel=kernel, eps=eps, tree="uniform",
                                          leaf_size=4))(x)
    phi = call()
    assert rel(phi, radial_reference(kernel, x, q, gradient=False)[0]) <= eps
    monkeypatch.setattr(configure, "SAMPLED_SHARE", 0.0)
    jax.clear_caches()                              # retrace jfmm's inner jit with it
    assert np.isnan(call()).all()


def test_grad_through_traced_adaptive_trees(rng, monkeypatch):
    """jit(grad) of an energy with respect to the points on bounded trees
    (the adjoint sum on the swapped tree) against the float64 numpy sum."""
    monkeypatch.setattr(adaptive, "BOUNDED_LEVELS", 4)       # fewer levels to compile
    x, q = scales(250, rng, 3, 4).astype(np.float32), charges(250, rng).astype(np.float32)
    force = jax.jit(jax.grad(lambda a: 0.5 * jnp.sum(
        q * jfmm.fmm(a, q, eps=1e-4, tree="adaptive", leaf_size=8))))
    gref = radial_reference(K.Laplace3D(), x, q)[1]
    assert rel(force(x), q[:, None] * gref) <= 1e-4

