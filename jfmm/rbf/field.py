"""A fitted interpolant's sum over its data points, ready for new points.

An evaluation sums K(|x - y_i|) c_i from N fixed data points y with fixed
coefficients c to M new points x. The FMM's upward and downward passes
depend on y and c alone, so they run once per fit (`build`): a uniform
tree of the data points and its leaves' local expansions. Each
evaluation then sorts its points into that tree's leaves and runs only
what depends on them (`at`): the near field over neighbouring leaves and
the L2P, O(M) work beside the whole FMM's O(N + M). Points outside the
tree's root box (the data's bounding cube with small margins) are not
covered: `at` says so and the caller sums them another way.
"""
from __future__ import annotations

import dataclasses
import functools

import jax

from jfmm import api, passes
from jfmm.configure import Config
from jfmm.models import Unreachable
from jfmm.ops import backend
from jfmm.tree import Tree, uniform


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["tree", "kernel", "q_sorted", "loc"], meta_fields=["config"])
@dataclasses.dataclass(frozen=True)
class Field:
    """tree: a uniform tree of the N data points (its targets unused);
    q_sorted (N, S): the coefficients in the tree's order; loc (n_leaves,
    S, P): the leaves' local expansions; config: the FMM's family, order
    and depth (static)."""
    tree: Tree
    kernel: object
    q_sorted: jax.Array
    loc: jax.Array
    config: Config


# Points per leaf of the tree a Field makes for itself (None: the FMM's
# choice for the data points to themselves). Smaller leaves would make each
# evaluation cheaper and the fit's passes and locals costlier.
LEAF_SIZE = None


def build(points, coeffs, kernel, eps: float, plan=None) -> Field | None:
    """The Field of coefficients (N, S) at points (N, d), or None where the
    uniform tree has no far field (depth < 2: the plain sum is then as
    cheap) or eps is out of the FMM's reach for these coefficients. plan:
    the fit's own plan of the points to themselves, whose tree and order
    serve where its tree is uniform (its kernel may be of other parameters:
    the Chebyshev operators are built from `kernel`); else a uniform plan is made, its
    order chosen for these coefficients (`jfmm.plan`'s charges)."""
    if plan is None or not isinstance(plan.tree, Tree):
        try:
            plan = api.plan(points, kernel=kernel, eps=eps, family="chebyshev",
                            tree="uniform", leaf_size=LEAF_SIZE, charges=coeffs)
        except Unreachable:
            return None
    if plan.config.family is None or plan.tree.depth < 2:
        return None
    return backend.call(_locals_jits, plan.tree, plan.ops, kernel, coeffs,
                        config=plan.config, mode=backend.current())


def _locals(tree, ops, kernel, coeffs, config, mode):
    q_sorted = coeffs[tree.src_perm]
    loc = passes.leaf_locals(tree, q_sorted, config.family, ops, kernel, config.order, mode)
    return Field(tree, kernel, q_sorted, loc, config)


_locals_jits = backend.jits(_locals, ("config", "mode"))


def at(field: Field, x):
    """The sum at points x (M, d): (M, S), and whether every point lies in
    the tree's root box (where one does not, the values are not the sum)."""
    return backend.call(_at_jits, field, x, mode=backend.current())


def _at(field, x, mode):
    tree, inside = uniform.with_targets(field.tree, x)
    return passes.at_targets(tree, field.q_sorted, field.loc, field.kernel, field.config,
                             mode), inside


_at_jits = backend.jits(_at, ("mode",))
