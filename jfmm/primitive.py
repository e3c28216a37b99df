"""The FMM sum as a JAX primitive, so that every transformation is an FMM call.

For a tree of sources x_j and targets y_i and source weights w_a of orders
a = 0..A (charges, dipoles, quadrupoles, ...) the primitive computes, for
c = 0..B,

    out_c(y_i) = sum_a sum_j  D^(a+c) G(y_i - x_j) [w_a,j]      (M, K, d^c)

G(r) = K(|r|), D^n the n-th derivative tensor with respect to r (that is,
with respect to the target), w_a (N, K, d^a) contracted with its first a
indices. out_0 is the potential, out_1 its gradient; a pair at distance 0
adds K(0) to out_0 of charges (smooth kernels) and nothing else. The sum is
linear in the weights, and

  * its transpose is the same sum with sources and targets swapped, weights
    u_c = (-1)^c ct_c and outputs of orders 0..A, times (-1)^a (G is even);
  * its derivative along target moves dy is the next output order
    contracted with dy; along source moves dx it is the sum with weights one
    order higher, w_(a+1) <- -w_a (x) dx.

So jax.jvp, jax.grad, jacfwd, jacrev, vmap and higher orders all reduce to
FMM calls, never to stored intermediates. Charges with potential and
gradient (A = 0, B <= 1) run the fast path, `passes.evaluate` on the requested
backend, and their second derivatives (B = 2) `passes.hessian` on uniform
trees; other orders differentiate the fast path's approximation in forward
mode on the jnp backend (memory of a forward call; slower, used for forward
mode and second derivatives).

Kernel parameters are not linear: their tangent is d out / d theta, computed
as a primal value by forward mode through the jnp fast path (one pass per
parameter), times d theta.

Tangents of the tree's root box (lo, side) are ignored: the exact sum does
not depend on where the boxes are. Weights and outputs are in the caller's
point order; the tree's coordinates are in Morton order.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jfmm import distributed, passes
from jfmm._compat import Primitive, ShapedArray, ad, batching, mlir
from jfmm.configure import Config
from jfmm.ops import p2p
from jfmm.tree import Tree, adaptive


class Spec(NamedTuple):
    """Static description of one bind (hashable: it is the primitive's param).

    orders: the weight orders present, ascending (a above); top: the
    highest output order (B above); config: the resolved family, order and
    depth; nbatch: leading batch axes on every operand (from vmap over
    point sets); curl: charges alone with top 1, and the one output is the
    curl of each triple of columns' gradients (M, K) (`ops.p2p.curl`,
    3D), which the near field sums alone.
    """
    tree_def: object
    ops_def: object
    kernel_def: object
    orders: tuple
    top: int
    config: Config
    mode: str
    nbatch: int = 0
    curl: bool = False

sum_p = Primitive("jfmm_sum")
sum_p.multiple_results = True


def fmm_sum(tree: Tree, ops, kernel, weights: dict, top: int, config: Config, mode: str,
            curl: bool = False):
    """Bind the primitive: weights {order a: (N, K, d^a)} -> [out_0, ..., out_top],
    or with curl ({0: charges}, top 1) [the curl (M, K)]."""
    tl, tdef = jax.tree_util.tree_flatten(tree)
    ol, odef = jax.tree_util.tree_flatten(ops)
    kl, kdef = jax.tree_util.tree_flatten(kernel)
    orders = tuple(sorted(weights))
    spec = Spec(tdef, odef, kdef, orders, top, config, mode, curl=curl)
    return _placed(sum_p.bind(*tl, *ol, *kl, *(weights[a] for a in orders), spec=spec), spec)


def _placed(outs, spec: Spec):
    """Results of a bind on a mesh placed on it (`distributed.sharded`)."""
    if spec.config.mesh is None:
        return outs
    return [distributed.sharded(o, spec.config.mesh, spec.nbatch) for o in outs]


def _split(args, spec: Spec):
    """Operands -> (tree leaves, ops leaves, kernel leaves, {order: weights})."""
    nt, no = spec.tree_def.num_leaves, spec.ops_def.num_leaves
    nk = spec.kernel_def.num_leaves
    tl, ol, kl = args[:nt], args[nt:nt + no], args[nt + no:nt + no + nk]
    ws = dict(zip(spec.orders, args[nt + no + nk:]))
    return list(tl), list(ol), list(kl), ws


def _unflatten(spec: Spec, tl, ol, kl):
    return (spec.tree_def.unflatten(tl), spec.ops_def.unflatten(ol),
            spec.kernel_def.unflatten(kl))


def _rebind(spec: Spec, tl, ol, kl, ws: dict, top: int):
    spec = spec._replace(orders=tuple(sorted(ws)), top=top)
    return _placed(sum_p.bind(*tl, *ol, *kl, *(ws[a] for a in spec.orders), spec=spec), spec)


# ------------------------------------------------------------------ evaluation

def _evaluate(tree: Tree, charges, kernel, config: Config, ops, gradient: bool, mode: str):
    """The fast path on one device, or sharded over the configuration's mesh."""
    run = passes.evaluate if config.mesh is None else distributed.evaluate
    return run(tree, charges, kernel, config, ops, gradient, mode)


def _curl(tree: Tree, charges, kernel, config: Config, ops, mode: str):
    """The curl output (M, K): its own near field on one device, else the
    curl of the sharded sum's gradient."""
    if config.mesh is None:
        return passes.evaluate(tree, charges, kernel, config, ops, True, mode, curl=True)[1]
    return p2p.curl(_evaluate(tree, charges, kernel, config, ops, True, mode)[1])


def _block(tree: Tree, ops, kernel, config: Config, w, a: int, c: int, mode: str):
    """sum_j D^(a+c) G(y_i - x_j)[w_j] for one weight order: (M, K) + (d,)*c.

    G depends on y - x only, so every derivative is taken at the target:
    charges' second derivatives on one device's uniform tree from
    `passes.hessian` (near field on backend `mode`); else, for each
    multi-index m of the weight's a axes, a target derivatives along e_m of
    the potential of charges w[..., m], then c more by jacfwd, in forward
    mode through the jnp fast path (charges: from its gradient).
    """
    dim = tree.dim
    tgt = tree.tgt_sorted
    if (a == 0 and c == 2 and config.mesh is None and isinstance(tree, Tree)
            and (config.family is None or config.family.SCHEME == "tree")):
        return passes.hessian(tree, w, kernel, config, ops, mode)
    if a == 0 and c >= 1:            # the fast path's gradient, c - 1 derivatives more
        def grad_at(s):
            t = dataclasses.replace(tree, tgt_sorted=tgt + s, shared=False)
            return _evaluate(t, w, kernel, config, ops, True, "jnp")[1]
        f = grad_at
        for _ in range(c - 1):
            f = jax.jacfwd(f)
        return f(jnp.zeros(dim, tgt.dtype))
    n, k = w.shape[:2]
    combos = list(itertools.product(range(dim), repeat=a))
    charges = jnp.moveaxis(w.reshape(n, k, len(combos)), 2, 0)      # (d^a, N, K)
    dirs = jnp.asarray(np.array(combos, np.int32).reshape(len(combos), a))
    eye = jnp.eye(dim, dtype=tgt.dtype)

    def potential(ys, q):
        t = dataclasses.replace(tree, tgt_sorted=ys, shared=False)
        return _evaluate(t, q, kernel, config, ops, False, "jnp")[0]

    def one(q, m, s):
        g = lambda ys: potential(ys, q)                               # noqa: E731
        for i in range(a):
            g = (lambda g, e: lambda ys: jax.jvp(g, (ys,), (jnp.broadcast_to(e, ys.shape),))[1])(
                g, eye[m[i]])
        return g(tgt + s)

    def f(s):
        return jax.vmap(one, in_axes=(0, 0, None))(charges, dirs, s).sum(axis=0)

    for _ in range(c):
        f = jax.jacfwd(f)
    return f(jnp.zeros(dim, tgt.dtype))


def _meaning(spec: Spec, *args):
    """The primitive's value (no batch axes): list of out_c, c = 0..top.
    Charges' potential and gradient come from the fast path; every other
    (weight order, output order) from `_block`."""
    tl, ol, kl, ws = _split(args, spec)
    tree, ops, kernel = _unflatten(spec, tl, ol, kl)
    if spec.curl:
        return [_curl(tree, ws[0], kernel, spec.config, ops, spec.mode)]
    outs = [None] * (spec.top + 1)

    def add(c, v):
        outs[c] = v if outs[c] is None else outs[c] + v

    for a, w in ws.items():
        done = 0                      # output orders of this weight the fast path gave
        if a == 0:
            phi, grad = _evaluate(tree, w, kernel, spec.config, ops, spec.top >= 1, spec.mode)
            add(0, phi)
            if spec.top >= 1:
                add(1, grad)
            done = 2
        for c in range(done, spec.top + 1):
            add(c, _block(tree, ops, kernel, spec.config, w, a, c, spec.mode))
    return outs


def _impl(*args, spec: Spec):
    f = functools.partial(_meaning, spec._replace(nbatch=0))
    for _ in range(spec.nbatch):
        f = jax.vmap(f)
    return f(*args)


def _abstract(*args, spec: Spec):
    tl, _, _, ws = _split(args, spec)
    tree = spec.tree_def.unflatten(tl)
    lead = tree.tgt_sorted.shape[:-1]                            # (*batch, M)
    k = next(iter(ws.values())).shape[spec.nbatch + 1]
    dtype = tree.tgt_sorted.dtype
    if spec.curl:
        return [ShapedArray(lead + (k,), dtype)]
    return [ShapedArray(lead + (k,) + (tree.dim,) * c, dtype)
            for c in range(spec.top + 1)]


_jit_impl = jax.jit(_impl, static_argnames="spec")
sum_p.def_impl(lambda *args, spec: _jit_impl(*args, spec=spec))
sum_p.def_abstract_eval(_abstract)
mlir.register_lowering(sum_p, mlir.lower_fun(_impl, multiple_results=True))


# ------------------------------------------------------------------ jvp

def _unsort(sorted_vals, perm, mesh=None):
    """Undo a Morton sort along the point axis (axis -2), batch axes first;
    on a mesh, by `distributed.unsort` (no device gathers every point)."""
    def one(v, pr):
        if mesh is not None:
            return distributed.unsort(v, pr, mesh)
        return jnp.zeros_like(v).at[pr].set(v, unique_indices=True)
    f = one
    for _ in range(perm.ndim - 1):
        f = jax.vmap(f)
    return f(sorted_vals, perm)


def _zero(t) -> bool:
    return type(t) is ad.Zero


def _check_moves(spec: Spec):
    """Derivatives along point moves need an order that holds the gradient."""
    if not spec.config.gradient:
        raise ValueError("differentiating along point moves needs gradients within eps: "
                         "make the plan with jfmm.plan(..., gradient=True)")


def _jvp(primals, tangents, *, spec: Spec):
    if spec.curl:
        return _curl_jvp(primals, tangents, spec)
    tl, ol, kl, ws = _split(primals, spec)
    dtl, _, dkl, dws = _split(tangents, spec)
    dtree = spec.tree_def.unflatten(dtl)
    tree = spec.tree_def.unflatten(tl)
    dsrc, dtgt = dtree.src_sorted, dtree.tgt_sorted
    move_y = not _zero(dtgt)
    if move_y or not _zero(dsrc):
        _check_moves(spec)
    outs = _rebind(spec, tl, ol, kl, ws, spec.top + move_y)
    primal = outs[:spec.top + 1]

    tw = {a: dw for a, dw in dws.items() if not _zero(dw)}
    if not _zero(dsrc):
        dx = _unsort(dsrc, tree.src_perm, spec.config.mesh)               # (*b, N, d)
        for a, w in ws.items():
            lift = -w[..., None] * dx.reshape(dx.shape[:-1] + (1,) * (1 + a) + dx.shape[-1:])
            tw[a + 1] = tw[a + 1] + lift if a + 1 in tw else lift
    if tw:
        tangent = _rebind(spec, tl, ol, kl, tw, spec.top)
    else:
        tangent = [jnp.zeros_like(o) for o in primal]
    for i, dk in enumerate(dkl):
        if not _zero(dk):
            basis = _kernel_basis_tangent(spec, tl, ol, kl, ws, i)
            for c in range(spec.top + 1):
                tangent[c] = tangent[c] + basis[c] * _expand(dk, basis[c].ndim)
    if move_y:
        dy = _unsort(dtgt, tree.tgt_perm, spec.config.mesh)               # (*b, M, d)
        for c in range(spec.top + 1):
            shaped = dy.reshape(dy.shape[:-1] + (1,) * (1 + c) + dy.shape[-1:])
            tangent[c] = tangent[c] + jnp.sum(outs[c + 1] * shaped, axis=-1)
    return primal, tangent


def _kernel_basis_tangent(spec: Spec, tl, ol, kl, ws, i: int):
    """d out_c / d (kernel leaf i), a primal value: forward mode through the
    jnp fast path (the operators that depend on the kernel, M2L matrices and
    near field, are built from it inside the evaluation). The tangent is this
    times d leaf_i, linear and so transposable: reverse mode costs one forward
    pass per kernel parameter, memory of a forward call."""
    jnp_spec = spec._replace(mode="jnp")
    order = spec.orders

    def f(leaf):
        k = list(kl)
        k[i] = leaf
        return _impl(*tl, *ol, *k, *(ws[a] for a in order), spec=jnp_spec)

    leaf = kl[i]
    return jax.jvp(f, (leaf,), (jnp.ones_like(leaf),))[1]


def _expand(dk, ndim: int):
    """A scalar kernel-parameter tangent (batch axes first) broadcast against
    an output of rank ndim."""
    return jnp.reshape(dk, jnp.shape(dk) + (1,) * (ndim - jnp.ndim(dk)))


ad.primitive_jvps[sum_p] = _jvp


def _curl_jvp(primals, tangents, spec: Spec):
    """The curl output's jvp: where only the targets move, the curl primal
    and `along_p` (the stretching of vortex elements); else the curl of
    the gradient's primal and tangent."""
    tl, ol, kl, ws = _split(primals, spec)
    dtl, _, dkl, dws = _split(tangents, spec)
    dtree = spec.tree_def.unflatten(dtl)
    if (_zero(dtree.src_sorted) and not _zero(dtree.tgt_sorted)
            and all(_zero(t) for t in list(dws.values()) + list(dkl))):
        _check_moves(spec)
        dy = _unsort(dtree.tgt_sorted, spec.tree_def.unflatten(tl).tgt_perm, spec.config.mesh)
        primal = _placed(sum_p.bind(*primals, spec=spec), spec)
        return primal, [along_p.bind(*tl, *ol, *kl, ws[0], dy, spec=spec)]
    primal, tangent = _jvp(primals, tangents, spec=spec._replace(curl=False))
    return [p2p.curl(primal[1])], [p2p.curl(tangent[1])]


# ------------------------------------------------------------------ curl along target moves

# along_p: the curl output's derivative along per-target moves dy (*b, M, d),
# linear in dy: sum_j curl (D^2 G(y_i - x_j) dy_i) [q_j], (*b, M, K). Its
# value sums three terms a pair (`passes.curl_along`) on one device; its own
# derivatives, transpose and batching are those of its meaning through
# sum_p's second derivatives (`_along_meaning`).
along_p = Primitive("jfmm_curl_along")


def _along_meaning(*args, spec: Spec):
    """along_p through sum_p's second derivatives (M, K, d, d)."""
    *rest, dy = args
    tl, ol, kl, ws = _split(rest, spec)
    h = _rebind(spec._replace(curl=False), tl, ol, kl, ws, 2)[2]
    return p2p.curl(jnp.einsum("...mkjl,...ml->...mkj", h, dy))


def _along_impl(*args, spec: Spec):
    *rest, dy = args
    tl, ol, kl, ws = _split(rest, spec)
    tree, ops, kernel = _unflatten(spec, tl, ol, kl)
    config = spec.config
    if (spec.nbatch == 0 and config.mesh is None
            and isinstance(tree, (Tree, adaptive.AdaptiveTree))
            and (config.family is None or config.family.SCHEME == "tree")):
        return passes.curl_along(tree, ws[0], dy, kernel, config, ops, spec.mode)
    return _along_meaning(*args, spec=spec)


def _along_abstract(*args, spec: Spec):
    return ShapedArray(args[-1].shape[:-1] + (args[-2].shape[-1],), args[-1].dtype)


along_p.def_impl(jax.jit(_along_impl, static_argnames="spec"))
along_p.def_abstract_eval(_along_abstract)
mlir.register_lowering(along_p, mlir.lower_fun(_along_impl, multiple_results=False))
ad.primitive_jvps[along_p] = lambda primals, tangents, *, spec: jax.jvp(
    functools.partial(_along_meaning, spec=spec), primals,
    tuple(ad.instantiate_zeros(t) for t in tangents))


def _along_transpose(ct, *args, spec: Spec):
    if any(ad.is_undefined_primal(v) for v in args[:-1]):
        raise NotImplementedError("the curl's derivative is linear only in the moves")
    if _zero(ct):
        return [None] * len(args)
    aval = args[-1].aval
    bar, = jax.linear_transpose(lambda d: _along_meaning(*args[:-1], d, spec=spec),
                                jax.ShapeDtypeStruct(aval.shape, aval.dtype))(ct)
    return [None] * (len(args) - 1) + [bar]


ad.primitive_transposes[along_p] = _along_transpose
batching.primitive_batchers[along_p] = lambda args, dims, *, spec: (
    jax.vmap(functools.partial(_along_meaning, spec=spec), in_axes=dims)(*args), 0)


# ------------------------------------------------------------------ transpose

def _transpose(cts, *args, spec: Spec):
    tl, ol, kl, ws = _split(args, spec)
    if any(ad.is_undefined_primal(v) for v in tl + ol + kl):
        raise NotImplementedError("the FMM sum is linear only in its weights")
    u = {c: (-1) ** c * ct for c, ct in enumerate(cts) if not _zero(ct)}
    n_lin = len(spec.orders)
    if not u:
        return [None] * (len(args) - n_lin) + [None] * n_lin
    swapped, swapped_def = jax.tree_util.tree_flatten(spec.tree_def.unflatten(tl).swapped())
    outs = _rebind(spec._replace(tree_def=swapped_def), swapped, ol, kl, u, max(spec.orders))
    bars = [(-1) ** a * outs[a] for a in spec.orders]
    return [None] * (len(args) - n_lin) + bars


ad.primitive_transposes[sum_p] = _transpose


# ------------------------------------------------------------------ batching

def _batch(args, dims, *, spec: Spec):
    tl, ol, kl, ws = _split(list(args), spec)
    tdims, odims, kdims, wdims = _split(list(dims), spec)
    nb = spec.nbatch
    size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
    if all(d is None for d in tdims + odims + kdims):
        # Only weights are batched: fold the batch into the charge axis.
        folded = {}
        for a, w in ws.items():
            d = wdims[a]
            w = (jnp.broadcast_to(jnp.expand_dims(w, nb + 1),
                                  w.shape[:nb + 1] + (size,) + w.shape[nb + 1:])
                 if d is None else jnp.moveaxis(w, d, nb + 1))
            folded[a] = w.reshape(w.shape[:nb + 1] + (-1,) + w.shape[nb + 3:])
        outs = _rebind(spec, tl, ol, kl, folded, spec.top)
        outs = [o.reshape(o.shape[:nb + 1] + (size, -1) + o.shape[nb + 2:]) for o in outs]
        return outs, [nb + 1] * len(outs)
    # Point sets batched: a new leading batch axis on every operand.
    moved = [jnp.broadcast_to(x, (size,) + x.shape) if d is None
             else jnp.moveaxis(x, d, 0) for x, d in zip(args, dims)]
    spec = spec._replace(nbatch=nb + 1)
    outs = _placed(sum_p.bind(*moved, spec=spec), spec)
    return outs, [0] * len(outs)


batching.primitive_batchers[sum_p] = _batch
