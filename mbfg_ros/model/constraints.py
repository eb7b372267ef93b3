"""Constraint equations Φ(q) = 0 in natural coordinates.

Each constraint *type* describes its instances: ``index`` (K, k) reads k "local" coordinates out of the extended
vector ``qe = [q, fixed point coordinates]``, so fixed points need no special case inside a type.  The quadratic
types (distances, sliders, joint angles) are φ = ½ uᵀ H u + bᵀ u + c with constant H, b, c per instance; a
relative angle is one row of (x0, y0, x1, y1, θ) whose form depends on θ.

`ConstraintSet` folds the quadratic types into one constant tensor and evaluates Φ, Φq, Φ̇q = d(Φq)/dt,
∂(Φq w)/∂q, ∂(Φ̇q q̇)/∂q and Σ λᵢ ∂²Φᵢ/∂q² through the compiled kernel (`mbfg_ros.native`), their only
implementation: one state or many at once.  The tests keep numpy references of the types' local derivatives.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from mbfg_ros import native

_PERP = np.array([[0.0, 1.0], [-1.0, 0.0]])  # e × f = eᵀ _PERP f  (2-D cross product)
RANK_TOL = 1e-9     # a singular value of Φq counts when above RANK_TOL · max(1, σ_max)


def numerical_rank(singular_values: np.ndarray, rank_tol: float = RANK_TOL) -> int:
    """The rank that singular values (descending) stand for: how many exceed rank_tol · max(1, σ_max)."""
    s = singular_values
    return int(np.sum(s > rank_tol * max(1.0, s[0]))) if s.size else 0


class ConstraintType:
    """Base: `index` (K, k) into the extended coordinate vector; `names` label every row."""

    kind = "constraint"

    def __init__(self, index: np.ndarray, names: Sequence[str]):
        index = np.asarray(index, dtype=np.intp)
        self.index = index.reshape(len(names), index.shape[-1] if index.ndim == 2 else -1)
        self.names = tuple(names)
        self.size = len(self.names)


class QuadraticConstraints(ConstraintType):
    """φ = ½ uᵀ H u + bᵀ u + c with constant H, b, c per instance: third derivatives vanish."""

    def __init__(self, index, names, H, b, c):
        super().__init__(index, names)
        self.H = np.asarray(H, dtype=float)
        self.b = np.asarray(b, dtype=float)
        self.c = np.asarray(c, dtype=float)


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


class JointAngleConstraints(QuadraticConstraints):
    """A joint angle q = θ_child − θ_parent + offset: the linear row q − θ_child + θ_parent − offset = 0.

    Local coordinates are (q, θ_child, θ_parent), or (q, θ_child) for a joint on the ground (θ_parent = 0): one
    instance of this type per width.  Linear (H = 0), so the quadratic form of `ConstraintSet`, the batched
    dynamics and the compiled kernel take it as they are."""

    kind = "joint_angle"

    def __init__(self, index, names, offsets, grounded: bool):
        K = len(names)
        b = np.array([1.0, -1.0] if grounded else [1.0, -1.0, 1.0])
        self.offsets = np.asarray(offsets, dtype=float).reshape(K)
        super().__init__(index, names, np.zeros((K, b.size, b.size)), np.broadcast_to(b, (K, b.size)).copy(),
                         -self.offsets)


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

    def __init__(self, index, names, lengths):
        super().__init__(index, names)
        self.lengths = np.asarray(lengths, dtype=float).reshape(self.size)


class ConstraintSet:
    """All constraint types of a mechanism, assembled over the n coordinates and evaluated by the compiled kernel.

    The quadratic types are folded once into one constant tensor: with qe1 = [q, fixed values, 1] and
    H̃ᵢ = [[Hᵢ, bᵢ], [bᵢᵀ, 2cᵢ]] per row, Φᵢ = ½ qe1ᵀ H̃ᵢ qe1 and H̃ qe1 holds Φq; the relative angles are
    (row, 5 extended indices, length).  Every method takes one state q (n,) or N states (N, n), and answers in
    the same shape (a leading N axis for many).
    """

    def __init__(self, types: Sequence[ConstraintType], n: int, fixed_values: np.ndarray):
        self.types = tuple(t for t in types if t.size > 0)
        self.n = n
        self.fixed_values = np.asarray(fixed_values, dtype=float)
        ne = self.n_extended = n + self.fixed_values.size
        self.m = m = sum(t.size for t in self.types)
        self.names = tuple(name for t in self.types for name in t.names)
        Ht = np.zeros((m, ne + 1, ne + 1))
        self._angles = []
        row = 0
        for t in self.types:
            if isinstance(t, QuadraticConstraints):
                for k in range(t.size):
                    idx = t.index[k]
                    Ht[row + k][np.ix_(idx, idx)] += t.H[k]
                    Ht[row + k, idx, ne] += t.b[k]
                    Ht[row + k, ne, idx] += t.b[k]
                    Ht[row + k, ne, ne] = 2.0 * t.c[k]
            elif isinstance(t, RelativeAngleConstraints):
                self._angles.extend((row + k, *(int(i) for i in t.index[k]), float(t.lengths[k]))
                                    for k in range(t.size))
            else:
                raise ValueError(f"constraint type {t.kind!r} is neither quadratic nor a relative angle: the "
                                 f"compiled kernel has no form of it")
            row += t.size
        self._Ht = Ht
        self._tail1 = np.concatenate((self.fixed_values, [1.0]))
        # its own kernel: the work buffers of a kernel belong to one caller (each call holds the GIL)
        self._kernel = native.constraint_kernel(n, Ht, self._tail1, self._angles)

    def native_form(self):
        """The constraints as `mbfg_ros.native` takes them: (H̃ (m, ne+1, ne+1) with Φᵢ = ½ qe1ᵀ H̃ᵢ qe1 for the
        quadratic types over qe1 = [q, fixed values, 1] (zero for the others), [fixed values, 1], and per relative
        angle (row, its 5 extended indices x0, y0, x1, y1, θ, length))."""
        return self._Ht, self._tail1, list(self._angles)

    @staticmethod
    def _states(q):
        q = np.ascontiguousarray(q, dtype=float)
        return q, q.shape[:-1]

    def phi(self, q: np.ndarray) -> np.ndarray:
        """Φ(q), shape (m,) (or (N, m))."""
        return self.phi_and_jacobian(q)[0]

    def jacobian(self, q: np.ndarray) -> np.ndarray:
        """Φq, shape (m, n) (or (N, m, n))."""
        return self.phi_and_jacobian(q)[1]

    def phi_and_jacobian(self, q):
        """Φ and Φq."""
        q, lead = self._states(q)
        phi, J = np.empty(lead + (self.m,)), np.empty(lead + (self.m, self.n))
        self._kernel.phi_and_jacobian(q, phi, J)
        return phi, J

    def hessian_vector(self, q: np.ndarray, w: np.ndarray) -> np.ndarray:
        """∂(Φq w)/∂q, shape (m, n) (or (N, m, n)).  With w = q̇ this is Φ̇q = d(Φq)/dt."""
        q, lead = self._states(q)
        out = np.empty(lead + (self.m, self.n))
        self._kernel.jacobian_dot(q, np.ascontiguousarray(w, dtype=float), out)
        return out

    def jacobian_dot(self, q: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Φ̇q = d(Φq)/dt along q̇ = v."""
        return self.hessian_vector(q, v)

    def jacobian_dot_times_v_derivative(self, q: np.ndarray, v: np.ndarray) -> np.ndarray:
        """∂(Φ̇q(q, v) v)/∂q at fixed v, shape (m, n) (or (N, m, n)): zero for quadratic constraints."""
        q, lead = self._states(q)
        out = np.empty(lead + (self.m, self.n))
        self._kernel.jacobian_dot_times_v_derivative(q, np.ascontiguousarray(v, dtype=float), out)
        return out

    def weighted_hessian(self, q: np.ndarray, lam: np.ndarray) -> np.ndarray:
        """Σᵢ λᵢ ∂²Φᵢ/∂q² = ∂(Φqᵀ λ)/∂q, shape (n, n) (or (N, n, n))."""
        q, lead = self._states(q)
        out = np.empty(lead + (self.n, self.n))
        self._kernel.weighted_hessian(q, np.ascontiguousarray(lam, dtype=float), out)
        return out
