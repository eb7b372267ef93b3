"""Constraint equations Φ(q) = 0 in natural coordinates, with closed-form derivatives.

Each constraint *type* is one small unit that evaluates all its instances at once (vectorised over
instances).  An instance reads k "local" coordinates out of the extended vector
``qe = [q, fixed point coordinates]``, so fixed points need no special case inside a type.  A type
provides, per instance and in local coordinates:

* ``phi(u)``          the residual,                            shape (K,)
* ``gradient(u)``     ∂φ/∂u,                                   shape (K, k)
* ``hessian(u)``      ∂²φ/∂u²  (symmetric),                    shape (K, k, k)
* ``third(u, w)``     ∂(wᵀ ∂²φ/∂u² w)/∂u,                      shape (K, k)

`ConstraintSet` scatters those into the global quantities the dynamics and the factors need:
Φ, Φq, Φ̇q = d(Φq)/dt, ∂(Φq w)/∂q, ∂(Φ̇q q̇)/∂q and Σ λᵢ ∂²Φᵢ/∂q².
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

_PERP = np.array([[0.0, 1.0], [-1.0, 0.0]])  # e × f = eᵀ _PERP f  (2-D cross product)


class ConstraintType:
    """Base: `index` (K, k) into the extended coordinate vector; `names` label every row."""

    kind = "constraint"

    def __init__(self, index: np.ndarray, names: Sequence[str]):
        index = np.asarray(index, dtype=np.intp)
        self.index = index.reshape(len(names), index.shape[-1] if index.ndim == 2 else -1)
        self.names = tuple(names)
        self.size = len(self.names)

    def phi(self, u: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def gradient(self, u: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def hessian(self, u: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def third(self, u: np.ndarray, w: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class QuadraticConstraints(ConstraintType):
    """φ = ½ uᵀ H u + bᵀ u + c with constant H, b, c per instance: third derivatives vanish."""

    def __init__(self, index, names, H, b, c):
        super().__init__(index, names)
        self.H = np.asarray(H, dtype=float)
        self.b = np.asarray(b, dtype=float)
        self.c = np.asarray(c, dtype=float)

    def phi(self, u):
        Hu = np.einsum("kij,kj->ki", self.H, u)
        return 0.5 * np.einsum("ki,ki->k", u, Hu) + np.einsum("ki,ki->k", self.b, u) + self.c

    def gradient(self, u):
        return np.einsum("kij,kj->ki", self.H, u) + self.b

    def hessian(self, u):
        return self.H

    def third(self, u, w):
        return np.zeros_like(u)


class DistanceConstraints(QuadraticConstraints):
    """|p_j − p_i|² − L² = 0 (rigid bars; 2N−3 of them make an N-point body rigid)."""

    kind = "distance"

    def __init__(self, index, names, lengths):
        K = len(names)
        block = np.array([[1.0, 0, -1, 0], [0, 1, 0, -1], [-1, 0, 1, 0], [0, -1, 0, 1]]) * 2.0
        lengths = np.asarray(lengths, dtype=float)
        super().__init__(index, names, np.broadcast_to(block, (K, 4, 4)).copy(),
                         np.zeros((K, 4)), -lengths ** 2)
        self.lengths = lengths


class FixedSliderConstraints(QuadraticConstraints):
    """Signed distance of a point from a fixed line through a with unit direction d: d × (p − a) = 0."""

    kind = "fixed_slider"

    def __init__(self, index, names, origins, directions):
        K = len(names)
        a = np.asarray(origins, dtype=float).reshape(K, 2)
        d = np.asarray(directions, dtype=float).reshape(K, 2)
        d = d / np.linalg.norm(d, axis=1, keepdims=True)
        b = np.stack([-d[:, 1], d[:, 0]], axis=1)
        c = d[:, 1] * a[:, 0] - d[:, 0] * a[:, 1]
        super().__init__(index, names, np.zeros((K, 2, 2)), b, c)


class MobileSliderConstraints(QuadraticConstraints):
    """Point p on the line through moving points r0, r1: (r1 − r0) × (p − r0) / L01 = 0.

    Local coordinates are (r0x, r0y, r1x, r1y, px, py).  Dividing by the drawn |r1 − r0| makes the
    residual a distance, so its noise model has the same units as a fixed slider's.
    """

    kind = "mobile_slider"

    def __init__(self, index, names, scales):
        K = len(names)
        A_e = np.array([[-1.0, 0, 1, 0, 0, 0], [0, -1, 0, 1, 0, 0]])   # e = r1 − r0
        A_f = np.array([[-1.0, 0, 0, 0, 1, 0], [0, -1, 0, 0, 0, 1]])   # f = p − r0
        H = A_e.T @ _PERP @ A_f + A_f.T @ _PERP.T @ A_e
        scales = np.asarray(scales, dtype=float).reshape(K)
        super().__init__(index, names, H[None, :, :] / scales[:, None, None],
                         np.zeros((K, 6)), np.zeros(K))


class RelativeAngleConstraints(ConstraintType):
    """Ties the angle θ of p0 → p1 to the points with one row whose form depends on θ.

    Where |sin θ| > 1/√2 the row is Δx − L cos θ, otherwise Δy − L sin θ: each form has
    |∂φ/∂θ| ≥ L/√2, so the row never loses rank, and a single row keeps Φq free of redundancy.
    Local coordinates are (x0, y0, x1, y1, θ).
    """

    kind = "relative_angle"
    _SWITCH = 1.0 / math.sqrt(2.0)

    def __init__(self, index, names, lengths):
        super().__init__(index, names)
        self.lengths = np.asarray(lengths, dtype=float).reshape(self.size)

    def _x_form(self, theta):
        return np.abs(np.sin(theta)) > self._SWITCH

    def phi(self, u):
        th, L = u[:, 4], self.lengths
        return np.where(self._x_form(th), u[:, 2] - u[:, 0] - L * np.cos(th),
                        u[:, 3] - u[:, 1] - L * np.sin(th))

    def gradient(self, u):
        th, L = u[:, 4], self.lengths
        xf = self._x_form(th)
        g = np.zeros_like(u)
        g[:, 0] = np.where(xf, -1.0, 0.0)
        g[:, 2] = -g[:, 0]
        g[:, 1] = np.where(xf, 0.0, -1.0)
        g[:, 3] = -g[:, 1]
        g[:, 4] = np.where(xf, L * np.sin(th), -L * np.cos(th))
        return g

    def hessian(self, u):
        th, L = u[:, 4], self.lengths
        H = np.zeros((self.size, 5, 5))
        H[:, 4, 4] = np.where(self._x_form(th), L * np.cos(th), L * np.sin(th))
        return H

    def third(self, u, w):
        th, L = u[:, 4], self.lengths
        t = np.zeros_like(u)
        t[:, 4] = np.where(self._x_form(th), -L * np.sin(th), L * np.cos(th)) * w[:, 4] ** 2
        return t


class ConstraintSet:
    """All constraint types of a mechanism, assembled into global arrays over the n coordinates."""

    def __init__(self, types: Sequence[ConstraintType], n: int, fixed_values: np.ndarray):
        self.types = tuple(t for t in types if t.size > 0)
        self.n = n
        self.fixed_values = np.asarray(fixed_values, dtype=float)
        self.n_extended = n + self.fixed_values.size
        self.m = sum(t.size for t in self.types)
        self.names = tuple(name for t in self.types for name in t.names)
        offsets = np.cumsum([0] + [t.size for t in self.types])
        self._rows = [np.arange(offsets[i], offsets[i + 1]) for i in range(len(self.types))]
        self._zeros_fixed = np.zeros(self.fixed_values.size)

    def _extended(self, q):
        return np.concatenate((q, self.fixed_values))

    def _extended_rate(self, v):
        return np.concatenate((v, self._zeros_fixed))

    def _scatter_rows(self, local_rows):
        """Local (K, k) row blocks → global (m, n); columns of fixed points are dropped."""
        out = np.zeros((self.m, self.n_extended))
        for t, rows, block in zip(self.types, self._rows, local_rows):
            out[rows[:, None], t.index] = block
        return out[:, :self.n]

    def phi(self, q: np.ndarray) -> np.ndarray:
        qe = self._extended(q)
        if not self.types:
            return np.zeros(0)
        return np.concatenate([t.phi(qe[t.index]) for t in self.types])

    def jacobian(self, q: np.ndarray) -> np.ndarray:
        """Φq, shape (m, n)."""
        qe = self._extended(q)
        return self._scatter_rows([t.gradient(qe[t.index]) for t in self.types])

    def phi_and_jacobian(self, q):
        qe = self._extended(q)
        us = [qe[t.index] for t in self.types]
        phi = np.concatenate([t.phi(u) for t, u in zip(self.types, us)]) if us else np.zeros(0)
        return phi, self._scatter_rows([t.gradient(u) for t, u in zip(self.types, us)])

    def hessian_vector(self, q: np.ndarray, w: np.ndarray) -> np.ndarray:
        """∂(Φq w)/∂q, shape (m, n).  With w = q̇ this is Φ̇q = d(Φq)/dt."""
        qe, we = self._extended(q), self._extended_rate(w)
        return self._scatter_rows([np.einsum("kij,kj->ki", t.hessian(qe[t.index]), we[t.index])
                                   for t in self.types])

    def jacobian_dot(self, q: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Φ̇q = d(Φq)/dt along q̇ = v."""
        return self.hessian_vector(q, v)

    def jacobian_dot_times_v_derivative(self, q: np.ndarray, v: np.ndarray) -> np.ndarray:
        """∂(Φ̇q(q, v) v)/∂q at fixed v, shape (m, n)."""
        qe, ve = self._extended(q), self._extended_rate(v)
        return self._scatter_rows([t.third(qe[t.index], ve[t.index]) for t in self.types])

    def weighted_hessian(self, q: np.ndarray, lam: np.ndarray) -> np.ndarray:
        """Σᵢ λᵢ ∂²Φᵢ/∂q² = ∂(Φqᵀ λ)/∂q, shape (n, n)."""
        qe = self._extended(q)
        out = np.zeros((self.n_extended, self.n_extended))
        for t, rows in zip(self.types, self._rows):
            H = t.hessian(qe[t.index]) * lam[rows][:, None, None]
            idx = t.index
            np.add.at(out, (idx[:, :, None], idx[:, None, :]), H)
        return out[:self.n, :self.n]
