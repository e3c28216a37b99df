"""Expansion families and operators.

A family is a module exposing: DIM, n_coef(p), order(eps, dtype),
operators(p, m2l_offsets, dtype) -> Operators(m2m, l2l, m2l),
p2m(u, q, p), l2p_coefficients(loc, p, gradient) (per box, what L2P
evaluates) and l2p(u, coef, h, p, gradient). Coordinates u are box-local and
scaled by the box side h; the driver (jfmm.fmm) does the rest.
"""
