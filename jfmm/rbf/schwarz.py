"""Multilevel restricted additive Schwarz for RBF systems.

The preconditioner of Beatson, Light and Billings (SISC 2000) and Haase et
al. (2018), as ferreus_rbf uses it: on each level the points are cut into
subdomains by median splits (at most `core` points each, compact in space
whatever the density), each extended by its nearest points to `extended`
points; a local RBF problem (kernel plus smoothing, with the polynomial) is
solved densely on the extended set and only the subdomain's own
coefficients are kept (restricted additive Schwarz). Between levels the
correction is multiplicative: the next level's points are one point per
median-split group of about `ratio` points (the one nearest the group's
centre, so coarse points follow the density), the coarse problem is solved first,
its residual removed by one sum from coarse to fine points, and the
subdomain solves act on what is left. The coarsest level is a dense solve.

Geometry (which points, which subdomains) is decided once from the
concrete data points: the median splits by scipy's k-d tree on the host,
the coarse points on the device, the extended sets by the k-d tree or, on
a GPU at scale, on the device. The local inverses depend on the kernel and
the smoothing and are rebuilt on the device (batched dense solves)
whenever they change.
"""
from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

from jfmm.ops import p2p
from jfmm.rbf import polynomial


# Subtrees whose k-d trees `median_groups` builds at once, in threads
# (scipy builds without the GIL).
PARTS = 8


def median_groups(x: np.ndarray, size: int) -> list[np.ndarray]:
    """Index groups of at most `size` points of x (n, d) by median splits
    along the widest axis of each group's points: the leaves of scipy's
    balanced k-d tree with leaves of `size` (the same splits, made in C;
    a loop over groups in numpy took 1.5 s at 10^6 points against 0.7 s).
    Its leaves are uneven where coordinates tie (points along lines), so
    their number varies with the data (`system.bucket` absorbs that);
    splits at the median rank fix the number but cut lines between cores:
    on 20,000 points along 40 lines FGMRES took 15-23 iterations against 4
    (the 2-core CPU). A shallow tree of about PARTS leaves first, then the
    tree of each leaf's points in a thread of its own: a node's splits
    depend on its points alone, so these are the whole tree's leaves."""
    from concurrent.futures import ThreadPoolExecutor

    top = _leaves(x, np.arange(len(x)), max(size, -(-len(x) // PARTS)))
    with ThreadPoolExecutor(max(1, min(len(top), os.cpu_count() or 1))) as pool:
        parts = list(pool.map(lambda idx: _leaves(x, idx, size), top))
    return [g for part in parts for idx in part
            for g in np.array_split(idx, -(-len(idx) // size))]   # coincident points


def _leaves(x: np.ndarray, idx: np.ndarray, size: int) -> list[np.ndarray]:
    """The leaves (indices into x) of the balanced k-d tree of x[idx] with
    leaves of `size`, depth first, lesser side first."""
    from scipy.spatial import cKDTree

    if len(idx) <= size:
        return [idx]
    tree = cKDTree(x[idx], leafsize=size, balanced_tree=True, compact_nodes=True)
    out, stack = [], [tree.tree]
    while stack:
        node = stack.pop()
        if node.split_dim == -1:
            out.append(idx[tree.indices[node.start_idx:node.end_idx]])
        else:
            stack += [node.greater, node.lesser]
    return out


def padded(groups: list[np.ndarray], width: int, fill: int) -> np.ndarray:
    """Index groups as rows (G, width), padded with `fill`."""
    sizes = np.array([len(g) for g in groups])
    rows = np.repeat(np.arange(len(groups)), sizes)
    cols = np.arange(sizes.sum()) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    out = np.full((len(groups), width), fill, np.int64)
    out[rows, cols] = np.concatenate(groups)
    return out


def _halve(x, rows, xp=jnp):
    """Each row (of indices into x, -1 for padding) split at its median
    rank along its widest axis: (G, m) -> (2G, m / 2). xp: jax.numpy, or
    numpy for host arrays."""
    valid = rows >= 0
    pts = x[xp.where(valid, rows, 0)]
    lo = xp.where(valid[..., None], pts, xp.inf).min(1)
    hi = xp.where(valid[..., None], pts, -xp.inf).max(1)
    axis = xp.argmax(hi - lo, axis=1)
    key = xp.where(valid, xp.take_along_axis(pts, axis[:, None, None], 2)[..., 0], xp.inf)
    if xp is np:
        ranked = np.take_along_axis(rows, np.argsort(key, axis=1, kind="stable"), 1)
    else:
        _, ranked = jax.lax.sort((key, rows), dimension=1, num_keys=1, is_stable=True)
    count = valid.sum(1, keepdims=True)
    half, width = count // 2, rows.shape[1] // 2
    slot = xp.arange(width)[None, :]
    left = xp.where(slot < half, ranked[:, :width], -1)
    right = xp.take_along_axis(ranked, xp.minimum(half + slot, rows.shape[1] - 1), 1)
    right = xp.where(half + slot < count, right, -1)
    return xp.concatenate([left, right])


def _nearest_to_centres(x, groups, parts: int, xp=jnp):
    """Each group halved into `parts`, and of each part the point nearest
    its centroid (-1 for an empty part): (G parts,)."""
    rows = groups
    while rows.shape[0] < parts * groups.shape[0]:
        rows = _halve(x, rows, xp)
    valid = rows >= 0
    pts = x[xp.where(valid, rows, 0)]
    w = valid[..., None].astype(x.dtype)
    centre = xp.sum(pts * w, 1) / xp.maximum(xp.sum(w, 1), 1)
    dist = xp.where(valid, xp.sum((pts - centre[:, None]) ** 2, axis=-1), xp.inf)
    return xp.take_along_axis(rows, xp.argmin(dist, axis=1)[:, None], 1)[:, 0]


_nearest_on_device = jax.jit(_nearest_to_centres, static_argnames=("parts",))


def coarsen(x: np.ndarray, groups: np.ndarray, parts: int) -> np.ndarray:
    """Sorted indices of the coarse points: each median-split group (rows
    of `groups`, padded with -1) halved further into `parts` (a power of 2)
    groups, and of each the point nearest its centroid, so coarse points
    follow the density. On a GPU from DEVICE_SEARCH points (its host took
    0.7-0.9 s in numpy at 10^6), else in numpy, which compiles nothing (a
    program of its own per level: 0.6 s on an H200)."""
    if jax.default_backend() != "cpu" and x.shape[0] >= DEVICE_SEARCH:
        near = np.asarray(_nearest_on_device(x, jax.device_put(groups.astype(np.int32)),
                                             parts=parts))
    else:
        near = _nearest_to_centres(np.asarray(x), np.asarray(groups), parts, np)
    return np.sort(near[near >= 0])


# Points from which a GPU searches the extended sets itself (below, scipy's
# k-d tree on the host is as fast as the device program's loading).
DEVICE_SEARCH = 2 ** 18


def subdomains(x, groups: np.ndarray, extended: int, candidates: int = 64,
               device: bool | None = None, sentinel: int | None = None,
               rows: int | None = None):
    """Subdomains of x (n, d) with the median-split groups (G, core) as
    cores (padded with -1): cores (rows, core) and extended sets (rows,
    m_ext), int32, padded with `sentinel` (default n), the rows past G
    all sentinel (rows default G). An extended set starts with its core
    and continues with the points nearest the core's centroid that are not
    in it.

    Found by scipy's k-d tree on the host, or (`device`; by default on a
    GPU from DEVICE_SEARCH points) on the device among the points of the
    `candidates` cores nearest each centroid (by a lower bound on their
    points' distance), checked exact: no other core can hold a point nearer
    than the last one taken (the k-d tree answers for the cores where that
    fails). 64 candidates were exact on uniform points and along lines, 32
    and 48 were not. The k-d tree took 1.1-1.2 s at 10^6 points on an
    H200's host, the device 0.10-0.13 s."""
    count, core = groups.shape
    m_ext = min(extended, x.shape[0])
    sentinel = x.shape[0] if sentinel is None else sentinel
    rows = count if rows is None else rows
    if device is None:
        device = jax.default_backend() != "cpu" and x.shape[0] >= DEVICE_SEARCH
    enough = -(-(m_ext - core) // core) + 1            # cores holding enough points
    if device and m_ext > core:
        # Shapes of the padded level alone (`rows` groups, `sentinel` points:
        # copies of the first, never a group's), so that new points of the
        # same number search by the same program.
        xs = np.concatenate([x, np.broadcast_to(x[:1], (sentinel - len(x), x.shape[1]))])
        gs = np.concatenate([groups, np.full((rows - count, core), -1, groups.dtype)])
        cores, ext, exact = _extended_sets(
            xs, jax.device_put(gs.astype(np.int32)), m_ext=m_ext,
            candidates=min(max(candidates, enough), rows))
        redo = np.flatnonzero(~np.asarray(exact))
        if redo.size:
            ext = ext.at[redo].set(_subdomains_host(np.asarray(x, np.float64), groups,
                                                    extended, sentinel, len(redo), redo)[1])
        return cores, ext
    return _subdomains_host(np.asarray(x, np.float64), groups, extended, sentinel, rows)


# Cores whose extended sets the device searches at once.
SEARCH_CHUNK = 256


@functools.partial(jax.jit, static_argnames=("m_ext", "candidates"))
def _extended_sets(x, groups, m_ext: int, candidates: int):
    """`subdomains` on the device: cores, extended sets (sentinel n) and
    whether each set is exact (G,). Groups of no points (rows of -1) get
    sets of the sentinel alone."""
    n = x.shape[0]
    count, core = groups.shape
    valid = groups >= 0
    live = valid.any(1)
    pts = x[jnp.where(valid, groups, 0)]
    w = valid[..., None].astype(x.dtype)
    centres = jnp.sum(pts * w, 1) / jnp.maximum(jnp.sum(w, 1), 1)
    radius = jnp.sqrt(jnp.max(jnp.sum((pts - centres[:, None]) ** 2, -1) * w[..., 0], 1))
    radius = jnp.where(live, radius, -jnp.inf)         # an empty group is no candidate
    extra = m_ext - core
    pad = -count % SEARCH_CHUNK
    blocks = jnp.arange(count + pad).reshape(-1, SEARCH_CHUNK)

    def block(g):                       # g (chunk,) core numbers, some past the end
        c = centres[jnp.minimum(g, count - 1)]
        bound = jnp.sqrt(jnp.sum((c[:, None] - centres[None]) ** 2, -1)) - radius[None]
        more = min(candidates + 1, count)
        neg, near = jax.lax.top_k(-bound, more)
        near = near[:, :candidates]
        unseen = -neg[:, -1] if more > candidates else jnp.full(g.shape, jnp.inf, x.dtype)
        cand = groups[near].reshape(g.shape[0], -1)                   # (chunk, K core)
        outside = (cand >= 0) & jnp.repeat(near != g[:, None], core, axis=1)
        d2 = jnp.sum((x[jnp.maximum(cand, 0)] - c[:, None]) ** 2, -1)
        d2 = jnp.where(outside, d2, jnp.inf)
        neg2, pick = jax.lax.top_k(-d2, extra)
        taken = jnp.isfinite(neg2)
        chosen = jnp.where(taken, jnp.take_along_axis(cand, pick, 1), n)
        # Exact where the farthest point taken is no farther than any point
        # of an unseen core, and a set short of points saw every core.
        last = jnp.sqrt(-neg2[:, -1])
        exact = jnp.where(taken[:, -1], last <= unseen, more <= candidates)
        return chosen, exact

    chosen, exact = jax.lax.map(block, blocks)
    chosen = jnp.where(live[:, None], chosen.reshape(-1, extra)[:count], n)
    cores = jnp.where(valid, groups, n)
    exact = exact.reshape(-1)[:count] | ~live
    return cores, jnp.concatenate([cores, chosen], axis=1), exact


def _resentinel(a: np.ndarray, n: int, sentinel: int, rows: int) -> np.ndarray:
    """Index rows a (G, w) with the sentinel n replaced by `sentinel`,
    continued by rows of it to `rows` rows."""
    a = np.where(a >= n, sentinel, a).astype(np.int32)
    return np.concatenate([a, np.full((rows - a.shape[0], a.shape[1]), sentinel, np.int32)])


def _subdomains_host(x: np.ndarray, groups: np.ndarray, extended: int,
                     sentinel: int | None = None, rows: int | None = None, which=None):
    """`subdomains` by scipy's k-d tree, of the cores `which` (default all)."""
    from scipy.spatial import cKDTree

    n, core = len(x), groups.shape[1]
    sentinel = n if sentinel is None else sentinel
    m_ext = min(extended, n)
    valid = groups >= 0
    owner = np.empty(n, np.int64)
    owner[groups[valid]] = np.nonzero(valid)[0]
    which = np.arange(len(groups)) if which is None else which
    rows = len(which) if rows is None else rows
    groups, valid = groups[which], valid[which]
    cores = np.where(valid, groups, n).astype(np.int32)
    pts = x[np.where(valid, groups, 0)]
    centres = (pts * valid[..., None]).sum(1) / valid.sum(1)[:, None]
    _, near = cKDTree(x).query(centres, k=m_ext, workers=-1)
    near = near.reshape(len(groups), m_ext)
    outside = owner[near] != which[:, None]
    order = np.argsort(~outside, axis=1, kind="stable")       # outside points first, nearest first
    extra = np.take_along_axis(near, order, axis=1)[:, :max(m_ext - core, 0)]
    extra = np.where(np.take_along_axis(outside, order, axis=1)[:, :extra.shape[1]], extra, n)
    ext = np.concatenate([cores, extra.astype(np.int32)], axis=1)
    return (jax.device_put(_resentinel(cores, n, sentinel, rows)),
            jax.device_put(_resentinel(ext, n, sentinel, rows)))


def _local_system(kernel, pts, valid, smoothing, powers):
    """The blocks of the local system [[K + S, P], [P^T, 0]] of points pts
    (m, d): K + S (m, m) and P (m, R); rows of invalid (padding) points
    are those of the identity in K + S and zero in P. The monomials are of
    locally centred and scaled coordinates: they span the same polynomials
    as the global ones, better conditioned."""
    r2 = p2p.squared_distances(pts, pts)
    both = valid[:, None] & valid[None, :]
    k = jnp.where(both, kernel.pair(r2, False)[0], 0.0)
    k = k + jnp.diag(jnp.where(valid, smoothing, 1.0))
    w = valid[:, None].astype(pts.dtype)
    centre = jnp.sum(pts * w, 0) / jnp.maximum(jnp.sum(w), 1)
    scale = jnp.max(jnp.abs(pts - centre) * w, axis=0)
    scale = jnp.where(scale > 0, scale, 1.0)
    return k, polynomial.monomials((pts - centre) / scale, powers) * w


def _saddle(kernel, pts, valid, smoothing, powers):
    """The local system [[K + S, P], [P^T, 0]] (`_local_system`)."""
    k, p = _local_system(kernel, pts, valid, smoothing, powers)
    r = p.shape[1]
    if r == 0:
        return k
    top = jnp.concatenate([k, p], axis=1)
    bottom = jnp.concatenate([p.T, jnp.zeros((r, r), pts.dtype)], axis=1)
    return jnp.concatenate([top, bottom], axis=0)


def null_space_solve(a, p, b):
    """x = Z (Z^T A Z)^-1 Z^T b (m, k), Z an orthonormal basis of the
    complement of range(P): the coefficient block c of the solution of
    [[A, P], [P^T, 0]] [c; a] = [b; 0], by one Cholesky factorization of
    Z^T A Z, positive definite for the kernels at or above their minimum
    degree (half of LU's arithmetic on the saddle system; on an H200, 256
    systems of 516: Cholesky 3.4 ms, LU 13.0 ms). Z from the Householder
    reflections of P's columns, Q = H_0 ... H_{R-1} = I - Y T Y^T (compact
    WY, Schreiber and Van Loan 1989), so that Q^T A Q is one rank-2R update
    of A rather than R passes over it (2-core CPU, 512 systems of 384 with
    R = 4: 2.7 s against 3.5 s). A zero column of P, as along a line, is
    skipped: the solve then constrains one direction more, which a
    preconditioner may. NaN where Z^T A Z is not positive definite.
    a (m, m), p (m, R), b (m, k). Returns x, the polynomial block
    (R, k) of the same solution (a of the system above), and the norms
    (R,) of P's columns as each reflection met them (|R_jj| of P's QR)."""
    m, r = p.shape
    tiny = jnp.finfo(a.dtype).tiny
    mm = functools.partial(jnp.matmul, precision=jax.lax.Precision.HIGHEST)
    rows, cols = jnp.arange(m), jnp.arange(r)

    def reflect(j, state):      # column j's unit Householder vector, H = I - 2 v v^T
        p, y, t, norms = state
        col = jnp.where(rows >= j, p[:, j], 0.0)
        norm = jnp.linalg.norm(col)
        v = col.at[j].add(jnp.where(col[j] < 0, -norm, norm))
        v = jnp.where(norm > tiny, v / jnp.maximum(jnp.linalg.norm(v), tiny), 0.0)
        p = p - 2 * jnp.outer(v, mm(v, p))
        # Q = I - Y T Y^T: T's column j is -2 T (Y^T v) above the diagonal, 2 on it.
        tj = jnp.where(cols < j, -2 * mm(t, mm(y.T, v)), 0.0).at[j].set(2.0)
        return p, y.at[:, j].set(v), t.at[:, j].set(tj), norms.at[j].set(norm)

    if r:
        zeros = jnp.zeros((r,), a.dtype)
        p, y, t, norms = jax.lax.fori_loop(0, r, reflect, (p, jnp.zeros((m, r), a.dtype),
                                                           jnp.zeros((r, r), a.dtype), zeros))
        ay = mm(a, y)
        w = mm(ay, t) - 0.5 * mm(y, mm(mm(t.T, mm(y.T, ay)), t))   # Q^T A Q = A - W Y^T - Y W^T
        a = a - mm(jnp.concatenate([w, y], 1), jnp.concatenate([y, w], 1).T)
        b = b - mm(y, mm(t.T, mm(y.T, b)))                   # Q^T b
    factor = jax.scipy.linalg.cho_factor(a[r:, r:], lower=True)
    u = jax.scipy.linalg.cho_solve(factor, b[r:])
    if not r:
        return u, jnp.zeros((0, b.shape[1]), a.dtype), jnp.zeros((0,), a.dtype)
    # The first R rows of Q^T ([A, P] [x; poly] - b) = 0, with Q^T P = [R; 0].
    poly = jax.scipy.linalg.solve_triangular(p[:r], b[:r] - mm(a[:r, r:], u), lower=False)
    x = jnp.concatenate([jnp.zeros((r, b.shape[1]), a.dtype), u])
    return x - mm(y, mm(t, mm(y.T, x))), poly, norms     # x = Q [0; U]


# The local inverses are stored in this dtype where the points' is wider:
# the preconditioner needs no more (2-core CPU, 2x10^4 points, linear
# kernel: the same iterations and residuals to four digits as float64, at
# tol 1e-6 and 1e-10 on uniform points and 1e-8 along 200 segments), and
# they are the solver's largest arrays (10^6 points: 4.3 GB in float64).
STORED = jnp.float32


def local_inverses(kernel, points, smoothing, ext, n_core: int, powers, chunk: int | None = None,
                   definite: bool = True):
    """G (D, n_core, m_ext): rows of the local systems' inverses that map
    an extended set's residual to its core's coefficients, factorized in
    the points' dtype and stored in `STORED` where that is narrower.

    points (n, d), smoothing (n,), ext (D, m_ext) int (sentinel n).
    definite: the kernel is (conditionally) positive definite at this
    polynomial degree, so the local systems factorize by Cholesky on the
    polynomials' null space (`null_space_solve`); else by LU of the saddle
    system. H200, 10^6 points, 16,384 subdomains of 512: Cholesky 0.37 s,
    LU 0.98-1.12 s (linear and thin-plate kernels; their rows agree to
    1e-10). A subdomain whose local system is singular (degenerate local
    points) gets G = 0: the preconditioner then skips it, and the outer
    solve's residual check still holds. chunk: subdomains factorized at
    once (None: 256, and 1 on the CPU, where jaxlib's batched LU waits on
    the intra-op thread pool it shares with XLA and can deadlock it). On
    an H200 at 10^6 points chunks of 64, 256 and 1,024 took 1.75, 0.93 and
    0.88 s (linear kernel, LU), the last holding 8.1 GB at peak against
    5.1."""
    n, dim = points.shape
    padded = jnp.concatenate([points, jnp.zeros((1, dim), points.dtype)])
    smooth = jnp.concatenate([smoothing, jnp.ones((1,), smoothing.dtype)])
    m_ext = ext.shape[1]
    store = min(jnp.dtype(points.dtype), jnp.dtype(STORED), key=lambda t: t.itemsize)

    def one(e):
        if definite:
            k, p = _local_system(kernel, padded[e], e < n, smooth[e], powers)
            g = null_space_solve(k, p, jnp.eye(m_ext, n_core, dtype=k.dtype))[0].T
        else:
            s = _saddle(kernel, padded[e], e < n, smooth[e], powers)
            g = jnp.linalg.solve(s, jnp.eye(s.shape[0], n_core, dtype=points.dtype))[:m_ext].T
        return jnp.where(jnp.all(jnp.isfinite(g)), g, 0.0).astype(store)

    if chunk is None:
        chunk = 1 if jax.default_backend() == "cpu" else 256
    d = ext.shape[0]
    pad = (-d) % chunk
    blocks = jnp.concatenate([ext, jnp.full((pad, m_ext), n, ext.dtype)]).reshape(-1, chunk,
                                                                                    m_ext)
    g = jax.lax.map(jax.vmap(one), blocks)
    return g.reshape(-1, n_core, m_ext)[:d]


def coarsest_inverse(kernel, points, smoothing, powers, real):
    """The coefficient block of the inverse of the whole saddle system on
    the coarsest level's points where `real` (n,) bool (identity rows at
    the others): (n, n)."""
    n = points.shape[0]
    s = _saddle(kernel, points, real, smoothing, powers)
    return jnp.linalg.solve(s, jnp.eye(s.shape[0], n, dtype=points.dtype))[:n]


def restricted_solves(G, cores, ext, r):
    """sum over subdomains of R_core^T G R_ext r: (n,) from r (n,), the
    products in G's dtype."""
    n = r.shape[0]
    rp = jnp.concatenate([r, jnp.zeros((1,), r.dtype)])
    z = jnp.einsum("dme,de->dm", G, rp[ext].astype(G.dtype)).astype(r.dtype)
    return jnp.zeros((n + 1,), r.dtype).at[cores].set(z)[:n]
