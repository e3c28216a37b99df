"""float64 numpy direct sum of 1/r: the yardstick of tests, demo and benchmarks."""
from __future__ import annotations

import numpy as np


def laplace3d(sources, charges, targets, chunk: int = 256):
    """phi (M,) or (M, k) and grad (M, d) or (M, k, d) of sum_i q_i / |y - x_i|.

    Pairs at r = 0 are skipped. The gradient is formed from the differences
    y - x_i before summing (no cancellation between large sums).
    """
    x = np.asarray(sources, np.float64)
    y = np.asarray(targets, np.float64)
    q = np.asarray(charges, np.float64)
    qq = q[:, None] if q.ndim == 1 else q
    phi = np.zeros((len(y), qq.shape[1]))
    grad = np.zeros((len(y), qq.shape[1], y.shape[1]))
    for s in range(0, len(y), chunk):
        yb = y[s:s + chunk]
        diff = [yb[:, None, a] - x[None, :, a] for a in range(y.shape[1])]
        r = np.sqrt(sum(d * d for d in diff))
        inv = np.divide(1.0, r, out=np.zeros_like(r), where=r > 0)
        inv3 = inv ** 3
        phi[s:s + chunk] = inv @ qq
        for a, d in enumerate(diff):
            grad[s:s + chunk, :, a] = -(d * inv3) @ qq
    if q.ndim == 1:
        return phi[:, 0], grad[:, 0]
    return phi, grad
