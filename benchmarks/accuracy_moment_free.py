"""Errors for charges with zero sum and zero first moments beside random ones.

    python benchmarks/accuracy_moment_free.py --n 1048576 --out moment_free.json

The weights of an RBF interpolant with a linear polynomial tail have zero
sum and zero first moments sum_i q_i x_i. Where the kernel is smooth over
the points' extent such charges cancel in phi's largest modes, so |phi| is
far smaller than for random charges while the far field's truncation error
is not: eps, a relative error, is harder to meet. Per kernel, points and
(dtype, eps), for --draws random charge vectors and --draws moment-free
ones (each drawn at random and projected): the order of a plan made
without charges (`order_static`, what jit and plans without charges take)
and of one made with them (`jfmm.plan(..., charges=)`, what eager `fmm`
calls take), and the worst relative L2 error of the latter's sums over
the draws, on 1,000 sampled targets against a float64 direct sum of the
same rounded inputs (with --gradient grad phi's too, the plans then
bounding it); beside them the moment-free error of `jfmm.direct` in the
same dtype (its rounding alone). A plan that raises (eps below what the
dtype reaches for these charges) is a row with errors null.

The plan made without charges is also applied under jit to the same
draws, where it checks them (`configure.checked`): the worst error
without that check (what jit gave before it), how many draws it flags
(NaN), and the worst error of those it passes (with --gradient, each the
worse of phi's and grad's).

JSON row fields: n, kernel, dim, points, dtype, eps, charges ("random" or
"moment-free"), family, order_static, order, depth, err_phi, err_grad
(null without --gradient), err_direct (the direct sum's, moment-free rows),
raises (the message's reachable eps, or null), err_unchecked, flagged,
err_checked (null where every draw was flagged).
"""
from __future__ import annotations

import dataclasses

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from common import Table, make_points, moment_free, parser, rel, sample  # noqa: E402
import jfmm  # noqa: E402
from jfmm import configure, kernels as K  # noqa: E402
from jfmm.models import Unreachable  # noqa: E402
from accuracy_rbf import label  # noqa: E402

KERNELS = [K.Gaussian(1.0), K.Multiquadric(1.0), K.InverseMultiquadric(1.0),
           K.InverseQuadratic(1.0), K.ThinPlateSpline(), K.Linear(), K.Cubic()]
COLUMNS = [("kernel", "kernel", ""), ("points", "points", ""), ("dtype", "dtype", ""),
           ("eps", "eps", "g"), ("charges", "charges", ""),
           ("family", "family, order (without charges), depth",
            lambda r: f"{r['family']}, {r['order']} ({r['order_static']}), {r['depth']}"),
           ("err_phi", "err phi / eps", lambda r: "raises" if r["err_phi"] is None
            else f"{r['err_phi'] / r['eps']:.2f}"),
           ("err_grad", "err grad / eps", lambda r: "" if r["err_grad"] is None
            else f"{r['err_grad'] / r['eps']:.2f}"),
           ("err_direct", "direct", lambda r: "" if r["err_direct"] is None
            else f"{r['err_direct']:.1e}"),
           ("err_unchecked", "without charges: unchecked / eps",
            lambda r: f"{r['err_unchecked'] / r['eps']:.2f}"),
           ("flagged", "flagged", lambda r: f"{r['flagged']}"),
           ("err_checked", "passed / eps", lambda r: "" if r["err_checked"] is None
            else f"{r['err_checked'] / r['eps']:.2f}")]


def _errors(pl, q, idx, ref_phi, ref_grad, grad_on):
    """Per column of q: the worst of phi's and (grad_on) grad's relative
    errors of the plan's sums under jit (NaN where its check flagged it)."""
    out = jax.jit(lambda c: pl.apply(c, gradient=grad_on))(q)
    phi, grad = out if grad_on else (out, None)
    errs = []
    for j in range(q.shape[1]):
        e = rel(np.asarray(phi, np.float64)[idx, j], ref_phi[:, j])
        if grad_on:
            e = max(e, rel(np.asarray(grad, np.float64)[idx, j], ref_grad[:, j]))
        errs.append(e)
    return np.array(errs)


def _without_charges(static, q, idx, ref_phi, ref_grad, grad_on) -> dict:
    """The plan made without charges (what jit and such plans take) on
    these columns: its sums' worst error without the check of the charges
    (`configure.checked`), how many columns the check flags (NaN), and the
    worst error of those it passes."""
    bare = dataclasses.replace(static, check=None)
    unchecked = _errors(bare, q, idx, ref_phi, ref_grad, grad_on)
    checked = _errors(static, q, idx, ref_phi, ref_grad, grad_on)
    passed = checked[~np.isnan(checked)]
    return dict(err_unchecked=float(unchecked.max()), flagged=int(np.isnan(checked).sum()),
                err_checked=float(passed.max()) if passed.size else None)


def main():
    ap = parser(__doc__, repeats=False)
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--dim", type=int, default=3)
    ap.add_argument("--points", default="cube,sphere,clusters")
    ap.add_argument("--cases", default="float32:1e-4,float64:1e-6", help="dtype:eps, comma-separated")
    ap.add_argument("--draws", type=int, default=2)
    ap.add_argument("--gradient", action="store_true")
    ap.add_argument("--kernels", default=None, help="comma-separated indices into the list")
    args = ap.parse_args()
    configure.DIRECT_PAIRS = {"cpu": {}, "gpu": {}}       # every row sums by its family
    rng = np.random.default_rng(args.seed)
    grad_on = args.gradient
    table = Table(f"random and moment-free charges, N = {args.n:,}, {args.dim}D, "
                  f"{'potential and gradient' if grad_on else 'potential'}", COLUMNS)
    laplace = K.Laplace3D() if args.dim == 3 else K.Laplace2D()
    kernels = [laplace] + KERNELS
    if args.kernels:
        kernels = [kernels[int(i)] for i in args.kernels.split(",")]
    d = args.draws
    for kind in args.points.split(","):
        x = make_points(kind, args.n, rng, args.dim).astype(np.float32).astype(np.float64)
        q = rng.random((args.n, 2 * d)) - 0.5
        q[:, d:] = moment_free(q[:, d:], x)
        q = q.astype(np.float32).astype(np.float64)
        idx = sample(rng, args.n)
        for k in kernels:
            ref = jfmm.direct(jnp.asarray(x), jnp.asarray(q), jnp.asarray(x[idx]), kernel=k,
                              gradient=True)
            ref_phi, ref_grad = (np.asarray(v) for v in ref)
            for case in args.cases.split(","):
                dtype, eps = case.split(":")
                eps = float(eps)
                xd, qd = jnp.asarray(x, dtype), jnp.asarray(q, dtype)
                static = jfmm.plan(xd, kernel=k, eps=eps, gradient=grad_on)
                for name, cols in (("random", range(d)), ("moment-free", range(d, 2 * d))):
                    cols = list(cols)
                    row = dict(n=args.n, kernel=label(k), dim=args.dim, points=kind, dtype=dtype,
                               eps=eps, charges=name, family=static.family,
                               order_static=static.order, order=None, depth=None, err_phi=None,
                               err_grad=None, err_direct=None, raises=None)
                    row.update(_without_charges(static, qd[:, cols], idx, ref_phi[:, cols],
                                                ref_grad[:, cols], grad_on))
                    if name == "moment-free":
                        direct = np.asarray(jfmm.direct(xd, qd[:, cols], xd[idx], kernel=k),
                                            np.float64)
                        row["err_direct"] = max(rel(direct[:, j], ref_phi[:, c])
                                                for j, c in enumerate(cols))
                    try:
                        pl = jfmm.plan(xd, kernel=k, eps=eps, gradient=grad_on,
                                       charges=qd[:, cols])
                    except Unreachable as e:
                        row["raises"] = e.reachable
                        table.add(row)
                        continue
                    phi, grad = pl.apply(qd[:, cols], gradient=True) if grad_on else \
                        (pl.apply(qd[:, cols]), None)
                    phi = np.asarray(phi, np.float64)[idx]
                    row.update(family=pl.family, order=pl.order, depth=pl.config.depth,
                               err_phi=max(rel(phi[:, j], ref_phi[:, c])
                                           for j, c in enumerate(cols)))
                    if grad_on:
                        grad = np.asarray(grad, np.float64)[idx]
                        row["err_grad"] = max(rel(grad[:, j], ref_grad[:, c])
                                              for j, c in enumerate(cols))
                    table.add(row)
    table.save(args.out)


if __name__ == "__main__":
    main()
