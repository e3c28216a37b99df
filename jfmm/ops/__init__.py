"""Expansion families and operators.

A family is a module or object exposing: NAME, SCHEME ("tree": the passes
of jfmm.passes over the tree plus the near field; "grid": one grid level,
no near field), operators(p, m2l_offsets, dtype) -> Operators (with m2m and
l2l), m2l_basis(ops) (None, or B (k, P): M2L then maps B @ multipoles to
B^T @ locals), m2l_matrices(ops, kernel, side, p) (the M2L matrices of a
level whose boxes have side `side`), p2m(u, q, p), l2p_coefficients(loc, p, gradient)
(per box, what L2P evaluates) and l2p(u, coef, h, p, gradient). Families:
laplace3d (spherical harmonics, 3D Laplace), laplace2d (complex series, 2D
Laplace) and chebyshev (interpolation, any kernel, 2D and 3D); hermite (the
fast Gauss transform) has the same P2M / L2P interface but one grid level
and its own translation (`GaussTransform.h2l`, driven by
jfmm.passes.gauss_transform). Coordinates u are box-local and scaled by the
box side h; jfmm.passes does the rest. Each family's order and depth come
from its error model in jfmm.models, and jfmm.configure picks the family.
Hot operators have Pallas twins in ops/pallas, chosen by ops/backend.py.
"""
