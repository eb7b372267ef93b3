"""Numpy references of the constraint formulas, whose only implementation in the package is the compiled kernel
(`mbfg_ros.model.constraints.ConstraintSet` calls it): each type's local φ, ∂φ/∂u, ∂²φ/∂u² and third-order
contraction, written from the types' definitions, and their assembly over a mechanism's coordinates by scattering
(no folded tensor, as the kernel has).  test/test_constraints.py checks these against finite differences and the
kernel against these.
"""

import math

import numpy as np

from mbfg_ros.model.constraints import QuadraticConstraints, RelativeAngleConstraints

SWITCH = 1.0 / math.sqrt(2.0)     # a relative angle's row is its x-form where |sin θ| > SWITCH


def _angle_forms(t, u):
    """(x-form mask, sin θ, cos θ, L) per instance of a relative-angle type at local coordinates u (K, 5)."""
    s, c = np.sin(u[:, 4]), np.cos(u[:, 4])
    return np.abs(s) > SWITCH, s, c, t.lengths


def phi(t, u):
    if isinstance(t, QuadraticConstraints):
        return 0.5 * np.einsum("ki,kij,kj->k", u, t.H, u) + np.einsum("ki,ki->k", t.b, u) + t.c
    xf, s, c, L = _angle_forms(t, u)
    return np.where(xf, u[:, 2] - u[:, 0] - L * c, u[:, 3] - u[:, 1] - L * s)


def gradient(t, u):
    if isinstance(t, QuadraticConstraints):
        return np.einsum("kij,kj->ki", t.H, u) + t.b
    xf, s, c, L = _angle_forms(t, u)
    one = np.ones_like(s)
    return np.where(xf[:, None], np.stack([-one, 0 * one, one, 0 * one, L * s], axis=1),
                    np.stack([0 * one, -one, 0 * one, one, -L * c], axis=1))


def hessian(t, u):
    if isinstance(t, QuadraticConstraints):
        return t.H
    xf, s, c, L = _angle_forms(t, u)
    H = np.zeros((t.size, 5, 5))
    H[:, 4, 4] = np.where(xf, L * c, L * s)
    return H


def third(t, u, w):
    """∂(wᵀ ∂²φ/∂u² w)/∂u per instance."""
    if isinstance(t, QuadraticConstraints):
        return np.zeros_like(u)
    xf, s, c, L = _angle_forms(t, u)
    out = np.zeros_like(u)
    out[:, 4] = np.where(xf, -L * s, L * c) * w[:, 4] ** 2
    return out


class ReferenceConstraints:
    """Φ, Φq, ∂(Φq w)/∂q, ∂(Φ̇q v)/∂q and Σ λᵢ ∂²Φᵢ/∂q² of a `ConstraintSet`'s types, one state at a time."""

    def __init__(self, cset):
        self.types, self.n, self.m = cset.types, cset.n, cset.m
        self.fixed = np.asarray(cset.fixed_values, float)
        self.ne = self.n + self.fixed.size
        offsets = np.cumsum([0] + [t.size for t in self.types])
        self.rows = [np.arange(offsets[i], offsets[i + 1]) for i in range(len(self.types))]
        assert all(isinstance(t, (QuadraticConstraints, RelativeAngleConstraints)) for t in self.types)

    def _ext(self, x, rate=False):
        return np.concatenate((x, np.zeros(self.fixed.size) if rate else self.fixed))

    def phi_and_jacobian(self, q):
        qe = self._ext(q)
        p, T = np.zeros(self.m), np.zeros((self.m, self.ne))
        for t, r in zip(self.types, self.rows):
            u = qe[t.index]
            p[r] = phi(t, u)
            T[r[:, None], t.index] = gradient(t, u)
        return p, T[:, :self.n]

    def hessian_vector(self, q, w):
        qe, we = self._ext(q), self._ext(w, rate=True)
        out = np.zeros((self.m, self.ne))
        for t, r in zip(self.types, self.rows):
            out[r[:, None], t.index] = np.einsum("kij,kj->ki", hessian(t, qe[t.index]), we[t.index])
        return out[:, :self.n]

    def jacobian_dot_times_v_derivative(self, q, v):
        qe, ve = self._ext(q), self._ext(v, rate=True)
        out = np.zeros((self.m, self.ne))
        for t, r in zip(self.types, self.rows):
            out[r[:, None], t.index] = third(t, qe[t.index], ve[t.index])
        return out[:, :self.n]

    def weighted_hessian(self, q, lam):
        qe = self._ext(q)
        out = np.zeros((self.ne, self.ne))
        for t, r in zip(self.types, self.rows):
            H = hessian(t, qe[t.index]) * lam[r][:, None, None]
            for k in range(t.size):
                np.add.at(out, np.ix_(t.index[k], t.index[k]), H[k])
        return out[:self.n, :self.n]
