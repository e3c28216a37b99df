"""Expansion families and operators.

A family is a module exposing: MAX_ORDER, order(eps, dtype) -> p,
leaf_size(p), operators(p, m2l_offsets, dtype) -> Operators(m2m, l2l, m2l),
p2m(u, q, p), l2p_coefficients(loc, p, gradient) (per box, what L2P
evaluates) and l2p(u, coef, h, p, gradient). Coordinates u are box-local and
scaled by the box side h; the driver (jfmm.fmm) does the rest. Hot operators
have Pallas twins in ops/pallas, chosen by ops/backend.py.
"""
