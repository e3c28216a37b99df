"""The adaptive tree and its U, V, W, X lists against brute force: every
pair of leaves covered exactly once, balance, colleagues, leaf contents."""
import jax
import numpy as np
import pytest

from jfmm.tree import adaptive, lists


def clustered(n, rng, dim):
    """Clusters whose widths span 6 orders of magnitude, and 5% outliers."""
    centres = rng.random((4, dim))
    width = 10.0 ** -rng.integers(1, 7, n)
    x = centres[rng.integers(0, 4, n)] + width[:, None] * rng.normal(size=(n, dim))
    x[: n // 20] = rng.random((n // 20, dim)) * 10
    return x


def point_sets(dim, rng):
    line = np.zeros((150, dim))
    line[:, 0] = rng.random(150)
    dup = np.repeat(rng.random((10, dim)), 12, axis=0)
    sets = {"clustered": (clustered(200, rng, dim), None)}
    if dim == 2:                                   # each set compiles anew: 2D only
        sets.update({"line": (line, None), "duplicates": (dup, None)})
    else:                                          # targets apart: 3D only
        sets["clustered-to-uniform"] = (clustered(150, rng, dim), rng.random((100, dim)))
    return sets


def geometry(tree):
    """The tree as numpy arrays, and the integer coordinates of its boxes
    (B, d), from the parents level by level (the tree's own centres are
    checked against them)."""
    t = jax.tree_util.tree_map(np.asarray, tree)
    bits = lists.child_bits(tree.dim)
    slot = np.asarray(tree.slot())
    coords = np.zeros((tree.n_boxes, tree.dim), np.int64)
    for level in range(1, tree.depth + 1):
        b = np.arange(tree.offsets[level], tree.offsets[level + 1])
        b = b[t.valid[b]]
        coords[b] = 2 * coords[t.parent[b]] + bits[slot[b]]
    return t, coords


def box_bounds(t, coords, top):
    """Integer [lo, hi] corners of every box on the grid of level `top`."""
    scale = 2 ** (top - t.level.astype(np.int64))[:, None]
    return coords * scale, (coords + 1) * scale


def ancestor_table(t):
    """(B, depth + 1) each box's ancestors and itself, padded with B."""
    total = len(t.valid)
    table = [np.arange(total)]
    while True:
        up = np.where(table[-1] < total, t.parent[np.minimum(table[-1], total - 1)], total)
        if np.all(up == total):
            return np.stack(table, axis=1)
        table.append(up)


def histogram(rows, total):
    return np.bincount(rows[rows < total].ravel(), minlength=total + 1)


def check_busy_blocks(tree, t):
    """Per level, `level_blocks` lists exactly the blocks of siblings with a
    target (for sources and the swapped tree, a source) in a leaf below
    them, padded with the level's block count."""
    up = ancestor_table(t)
    ways = 2 ** tree.dim
    for sources, leaves in ((False, t.tgt_leaf), (True, t.src_leaf)):
        boxes = np.unique(up[leaves])
        for level in range(2, tree.depth + 1):
            off, end = tree.offsets[level], tree.offsets[level + 1]
            want = np.unique((boxes[(boxes >= off) & (boxes < end)] - off) // ways)
            for table, flip in ((tree, False), (tree.swapped(), True)):
                got = np.asarray(table.level_blocks(level, sources ^ flip))
                assert np.array_equal(got[:len(want)], want), level
                assert np.all(got[len(want):] == (end - off) // ways), level


def all_lists(tree):
    return (adaptive.u_list(tree), adaptive.v_list(tree), adaptive.w_list(tree),
            adaptive.x_list(tree))


@pytest.mark.parametrize("dim", [2, 3])
def test_lists_cover_every_leaf_pair_once(dim, rng):
    for name, (src, tgt) in point_sets(dim, rng).items():
        tree = adaptive.plan_tree(src, tgt, 8)
        if name == "line":                           # under jit alike
            again = jax.jit(adaptive.build, static_argnums=(2, 3))(src, tgt, 8, tree.caps)
            for a, b in zip(jax.tree_util.tree_leaves(tree), jax.tree_util.tree_leaves(again)):
                np.testing.assert_array_equal(a, b)
        check_work_lists(tree)
        assert not bool(tree.overflow), name
        t, coords = geometry(tree)
        check_busy_blocks(tree, t)
        total = tree.n_boxes
        leaves = np.nonzero(t.leaf)[0]
        lev = t.level

        # Leaves tile the root box and hold their own points: at most 8 of
        # each kind unless those coincide.
        assert np.sum(2.0 ** (-dim * lev[leaves])) == pytest.approx(1.0), name
        lo, side = np.asarray(tree.lo, np.float64), float(tree.side)
        for perm, start, leaf_of, pts in ((t.src_perm, t.src_start, t.src_leaf, src),
                                          (t.tgt_perm, t.tgt_start, t.tgt_leaf,
                                           src if tgt is None else tgt)):
            assert start[total] == len(pts)
            np.testing.assert_array_equal(np.repeat(np.arange(total), np.diff(start)[:total]),
                                          leaf_of)
            assert np.all(t.leaf[leaf_of]), name
            own = pts[perm]
            count = np.diff(start)[leaf_of]
            first = own[start[leaf_of]]                 # each leaf's first point
            spread = np.zeros(total)
            np.maximum.at(spread, leaf_of, np.abs(own - first).max(axis=1))
            assert np.all((count <= 8) | (spread[leaf_of] == 0)), name
            # inside the leaf, up to float32 rounding of the coordinates
            scale = 2.0 ** lev[leaf_of]
            pos = (own - lo) / side * scale[:, None] - coords[leaf_of]
            slack = (scale * 2e-7)[:, None]
            assert np.all((pos >= -slack) & (pos <= 1 + slack)), name

        top = int(lev.max())
        blo, bhi = box_bounds(t, coords, top)

        def touch(a, b):
            """(len(a), len(b)) whether boxes a and b share at least a corner."""
            return np.all((blo[a][:, None] <= bhi[b][None]) & (blo[b][None] <= bhi[a][:, None]),
                          axis=-1)

        # Balance: touching leaves differ by at most one level.
        pick = rng.choice(leaves, min(len(leaves), 400), replace=False)
        gap = np.abs(lev[pick][:, None] - lev[leaves][None])
        assert np.all(gap[touch(pick, leaves)] <= 1), name

        # Colleagues: every valid same-level box that touches, itself included.
        valid = np.nonzero(t.valid)[0]
        some = rng.choice(valid, min(len(valid), 400), replace=False)
        same = touch(some, valid) & (lev[some][:, None] == lev[valid][None])
        for row, b in enumerate(some):
            got = t.colleagues[b][t.colleagues[b] < total]
            assert sorted(got) == list(valid[same[row]]), name

        # Every ordered pair of leaves is covered exactly once: directly (U),
        # or by one V pair of ancestors, a W box above the source, an X box
        # above the target (all source leaves, a sample of target leaves).
        u, (v, _), w, x = jax.tree_util.tree_map(np.asarray, jax.jit(all_lists)(tree))
        anc = ancestor_table(t)
        near = touch(pick, leaves)
        for row, tb in enumerate(pick):
            up = anc[tb][anc[tb] < total]
            far = histogram(v[up], total) + histogram(w[tb], total)   # boxes above sources
            direct = histogram(u[tb], total)[leaves]
            got = direct + histogram(x[up], total)[leaves] + far[anc[leaves]].sum(axis=1)
            assert np.all(got == 1), (name, tb, got)
            assert np.all(direct[near[row]] == 1), name             # touching: direct


def check_work_lists(tree):
    """The lists the passes walk hold what the reference lists hold: the
    near table each leaf's U entries, the W (X) work list each target
    (source) tile's W (X) entries, every box centre the middle of its box."""
    t = jax.tree_util.tree_map(np.asarray, tree)
    total, d = tree.n_boxes, tree.dim
    u, w, x = (np.asarray(a) for a in jax.jit(lambda tr: (
        adaptive.u_list(tr), adaptive.w_list(tr), adaptive.x_list(tr)))(tree))
    assert t.near.shape == (total, adaptive.near_width(d), 2)
    # the ranges' leaves are U's entries, and their split boxes hold no points
    lo, hi = t.near[..., 0].ravel(), t.near[..., 1].ravel()
    size = hi - lo
    row = np.repeat(np.arange(lo.size) // t.near.shape[1], size)
    slot = np.repeat(lo, size) + np.arange(size.sum()) - np.repeat(np.cumsum(size) - size, size)
    row, slot = row[slot < total], slot[slot < total]
    assert np.all(np.diff(t.src_start)[slot[~t.leaf[slot]]] == 0)
    got = np.stack([row, slot], -1)[t.leaf[slot]]
    b, k = np.nonzero(u < total)
    want = np.stack([b, u[b, k]], -1)
    np.testing.assert_array_equal(got[np.lexsort(got.T[::-1])], want[np.lexsort(want.T[::-1])])
    kids = adaptive.far_children(d)
    split = t.valid & ~t.leaf
    for start, tile, pos, n, ref in ((t.tgt_start, t.w_tile, t.w_pos, len(t.tgt_sorted), w),
                                     (t.src_start, t.x_tile, t.x_pos, len(t.src_sorted), None)):
        leaf = np.asarray(adaptive.far_tiles(start, n)[0])
        real = tile < len(leaf)
        lf, j = leaf[tile[real]], pos[real]
        first = t.first_child[t.colleagues[lf, j]]
        box = np.minimum(first[:, None] + kids[j], total - 1)
        keep = (kids[j] >= 0) & (first[:, None] < total) & split[box]
        assert np.all(keep.any(axis=1))              # no entry without a box
        got = np.stack([np.broadcast_to(lf[:, None], box.shape), box], -1)[keep]
        got = got[np.lexsort(got.T[::-1])]
        if ref is not None:                  # W(b), once per tile of b
            tiles_of = np.bincount(leaf[leaf < total], minlength=total)
            b, c = np.nonzero(ref < total)
            want = np.repeat(np.stack([b, ref[b, c]], -1), tiles_of[b], axis=0)
            np.testing.assert_array_equal(got, want[np.lexsort(want.T[::-1])])
        assert np.all(np.any(x[got[:, 1]] == got[:, :1], axis=1))   # X(c) holds b
    t, coords = geometry(tree)
    h = float(tree.side) * 2.0 ** -t.level.astype(np.float64)
    want = np.asarray(tree.lo, np.float64) + (coords + 0.5) * h[:, None]
    ok = t.valid
    assert np.array_equal(np.asarray(t.center, np.float64)[ok], want[ok])


def test_overflow_is_set_when_capacities_are_short(rng):
    x = clustered(150, rng, 2)
    tree = adaptive.plan_tree(x, None, 8)
    caps = tree.caps
    widest = int(np.argmax(caps.levels))
    made = int(np.asarray(tree.valid)[tree.offsets[widest]:tree.offsets[widest + 1]].sum())
    levels = list(caps.levels)
    levels[widest] = made - 4                        # one block short
    short = caps._replace(levels=tuple(levels))
    assert bool(adaptive.build(x, None, 8, short).overflow)
    assert bool(adaptive.build_jit(x, None, 8, short, True).overflow)     # levels in one loop
    assert bool(adaptive.build(x, None, 8, caps._replace(levels=caps.levels[:-1])).overflow)
    assert bool(adaptive.build(x, None, 8, caps._replace(w=1)).overflow)
    busy = list(caps.tgt_blocks)
    nblk = caps.levels[-1] // 4
    busy[-1] = int(np.sum(np.asarray(tree.level_blocks(tree.depth)) < nblk)) - 1
    assert bool(adaptive.build(x, None, 8, caps._replace(tgt_blocks=tuple(busy))).overflow)
    assert not bool(adaptive.build(x, None, 8, caps).overflow)


@pytest.mark.parametrize("dim", [2, 3])
def test_morton_order_makes_every_level_a_run(dim, rng):
    """`_morton_order`: at every level down to the deepest, each box's
    points are one run of the order (as many runs as boxes), and points in
    one deepest box keep their input order."""
    levels = 21
    q = rng.random((3000, dim))
    q[1000:1100] = q[5]                           # one box of many points
    q[:, 0] *= 1e-6                               # boxes apart only deep down
    perm = np.asarray(adaptive._morton_order(jax.numpy.asarray(q), levels))
    assert sorted(perm) == list(range(len(q)))
    cells = np.floor(q[perm] * 2.0 ** levels).astype(np.int64)
    for level in range(1, levels + 1):
        box = cells >> (levels - level)
        runs = 1 + np.count_nonzero(np.any(box[1:] != box[:-1], axis=1))
        assert runs == len(np.unique(box, axis=0)), level
    ties = perm[np.flatnonzero(np.all(q[perm] == q[5], axis=1))]
    assert list(ties) == sorted(ties) and len(ties) == 101


@pytest.mark.parametrize("n, cap, share", [(1, 3, 0.0), (1, 3, 1.0), (200, 5, 0.1),
                                           (200, 50, 0.1), (200, 300, 0.5), (64, 64, 1.0)])
def test_first_true_is_nonzero_with_a_size(n, cap, share, rng):
    """`first_true` (the work lists' compaction): the first `cap` True
    indices, n after them, and the full count, as np.flatnonzero has them."""
    mask = rng.random(n) < share
    out, count = adaptive.first_true(jax.numpy.asarray(mask), cap)
    want = np.full(cap, n)
    hits = np.flatnonzero(mask)[:cap]
    want[:len(hits)] = hits
    assert np.array_equal(np.asarray(out), want) and int(count) == mask.sum()


def test_level_counts_grow_their_room_until_nothing_is_short(rng):
    """The sizing loop's slots: too few report short; the capacities come
    from counts with room for every level (each level's boxes fit), and a
    build a level at a time gives the plan's tree, built in one loop."""
    x = clustered(1500, rng, 2)
    state = adaptive._root_state(x, None)[3]
    made, short = adaptive._level_counts(state, 8, 8)
    assert bool(short)
    wide, short = adaptive._level_counts(state, 8, 1 << 16)
    assert not bool(short)
    tree = adaptive.plan_tree(x, None, 8)
    levels = tree.caps.levels
    assert len(levels) == int(np.sum(np.asarray(wide) > 0)) + 1
    for level, count in enumerate(np.asarray(wide)[:len(levels) - 1]):
        assert count <= levels[level + 1] <= adaptive.room(int(count), 4)
        assert count == int(np.asarray(tree.valid)[tree.offsets[level + 1]:
                                                   tree.offsets[level + 2]].sum())
    stepped = adaptive.build(x, None, 8, tree.caps._replace(w=None))   # the plan's was scanned
    for name in ("level", "parent", "first_child", "leaf", "valid", "colleagues", "center",
                 "src_perm", "src_start", "near", "overflow"):
        np.testing.assert_array_equal(getattr(stepped, name), getattr(tree, name), err_msg=name)


def test_far_chunks_divide_the_bounded_capacities():
    """The loops over W and X entries and M2L blocks step by a chunk that
    divides every capacity `bounded_capacities` makes: FAR_CHUNK on large
    trees, about an eighth of a small one's (a multiple chunk loop runs in
    test_adaptive_fmm's traced trees against the numpy sum)."""
    for n, dim, leaf in ((300, 3, 8), (1000, 3, 2), (5000, 2, 16), (2 ** 20, 3, 64)):
        caps = adaptive.bounded_capacities(n, dim, leaf, np.float32)
        for capacity in (caps.w, caps.x):
            chunk = adaptive.far_chunk(capacity)
            assert capacity % chunk == 0 and chunk & (chunk - 1) == 0, (n, capacity, chunk)
            assert adaptive.MIN_FAR_CHUNK <= chunk <= adaptive.FAR_CHUNK
            assert chunk == adaptive.FAR_CHUNK or 8 * chunk >= capacity
    assert adaptive.far_chunk(2 ** 20) == adaptive.FAR_CHUNK
    assert adaptive.far_chunk(1024) == 128 and adaptive.far_chunk(100) == adaptive.MIN_FAR_CHUNK
