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
    Local coordinates are (x0, y0, x1, y1, θ).  A mechanism has a handful of these at most, so
    plain float arithmetic per instance beats numpy's per-call overhead.
    """

    kind = "relative_angle"
    _SWITCH = 1.0 / math.sqrt(2.0)

    def __init__(self, index, names, lengths):
        super().__init__(index, names)
        self.lengths = np.asarray(lengths, dtype=float).reshape(self.size)
        self._L = [float(x) for x in self.lengths]
        self._idx = [tuple(int(i) for i in row) for row in self.index]

    def _forms(self, u):
        """Per instance: (x-form?, L, sin θ, cos θ)."""
        for row, L in zip(u.tolist(), self._L):
            s, c = math.sin(row[4]), math.cos(row[4])
            yield abs(s) > self._SWITCH, L, s, c, row

    def phi(self, u):
        return np.array([(r[2] - r[0] - L * c) if xf else (r[3] - r[1] - L * s)
                         for xf, L, s, c, r in self._forms(u)])

    def gradient(self, u):
        return np.array([[-1.0, 0.0, 1.0, 0.0, L * s] if xf else [0.0, -1.0, 0.0, 1.0, -L * c]
                         for xf, L, s, c, _ in self._forms(u)])

    def hessian(self, u):
        H = np.zeros((self.size, 5, 5))
        H[:, 4, 4] = [L * c if xf else L * s for xf, L, s, c, _ in self._forms(u)]
        return H

    def third(self, u, w):
        t = np.zeros_like(u)
        t[:, 4] = [(-L * s if xf else L * c) * wr[4] ** 2
                   for (xf, L, s, c, _), wr in zip(self._forms(u), w.tolist())]
        return t

    # -- one-pass forms used by `ConstraintSet` (only ∂²φ/∂θ² is non-zero among the second derivatives)
    angle_only = True

    def put_phi_gradient(self, x, rows, phi, T=None):
        """Write φ of every instance into phi[rows] and, with T, its gradient into T[rows, index], `x` being the
        extended coordinates as a list (scalar stores: the same numbers as `phi` and `gradient`, without their
        arrays)."""
        switch = self._SWITCH
        for row, (i0, i1, i2, i3, i4), L in zip(rows, self._idx, self._L):
            s, c = math.sin(x[i4]), math.cos(x[i4])
            if abs(s) > switch:
                phi[row] = x[i2] - x[i0] - L * c
                if T is not None:
                    T[row, i0], T[row, i1], T[row, i2], T[row, i3], T[row, i4] = -1.0, 0.0, 1.0, 0.0, L * s
            else:
                phi[row] = x[i3] - x[i1] - L * s
                if T is not None:
                    T[row, i0], T[row, i1], T[row, i2], T[row, i3], T[row, i4] = 0.0, -1.0, 0.0, 1.0, -L * c

    def curvatures(self, theta):
        """(∂²φ/∂θ², ∂³φ/∂θ³) per instance at the angles `theta`, as two lists of floats (the callers read and
        write them one value at a time)."""
        c2, c3 = [], []
        for t, L in zip(theta.tolist(), self._L):
            s, c = math.sin(t), math.cos(t)
            if abs(s) > self._SWITCH:
                c2.append(L * c)
                c3.append(-L * s)
            else:
                c2.append(L * s)
                c3.append(L * c)
        return c2, c3


class ConstraintSet:
    """All constraint types of a mechanism, assembled into global arrays over the n coordinates.

    Quadratic types (distances, sliders) are folded once into dense constant arrays
    Φ = ½ qeᵀ Hᵢ qe + bᵢᵀ qe + cᵢ, so Φq = H qe + b, Φ̇q = H q̇e and Σ λᵢ Hᵢ are single matrix
    products: the per-step cost does not grow with the number of Python-level constraint objects.
    Other types (relative angles) are scattered row by row from their local derivatives.
    """

    def __init__(self, types: Sequence[ConstraintType], n: int, fixed_values: np.ndarray):
        self.types = tuple(t for t in types if t.size > 0)
        self.n = n
        self.fixed_values = np.asarray(fixed_values, dtype=float)
        ne = self.n_extended = n + self.fixed_values.size
        self.m = m = sum(t.size for t in self.types)
        self.names = tuple(name for t in self.types for name in t.names)
        offsets = np.cumsum([0] + [t.size for t in self.types])
        rows = [np.arange(offsets[i], offsets[i + 1]) for i in range(len(self.types))]
        self._zeros_fixed = np.zeros(self.fixed_values.size)

        H, b, c = np.zeros((m, ne, ne)), np.zeros((m, ne)), np.zeros(m)
        self._nonlinear = []
        for t, r in zip(self.types, rows):
            if isinstance(t, QuadraticConstraints):
                for k, row in enumerate(r):
                    idx = t.index[k]
                    H[row][np.ix_(idx, idx)] += t.H[k]
                    b[row, idx] += t.b[k]
                    c[row] = t.c[k]
            else:
                flat = (t.index[:, :, None] * ne + t.index[:, None, :]).ravel()
                self._nonlinear.append((t, r, flat))
        self._H_rows = H.reshape(m * ne, ne)          # (H @ x) for all rows at once
        self._H_flat = H.reshape(m, ne * ne)          # λ-weighted sum of Hessians
        self._b, self._c = b, c
        # Φ and Φq in one product: with qe1 = [qe, 1] and H̃ = [[H, b], [bᵀ, 2c]] per row,
        # T = H̃ qe1 = [Φq(extended) | bᵀqe + 2c] and Φ = ½ T qe1.
        Ht = np.zeros((m, ne + 1, ne + 1))
        Ht[:, :ne, :ne] = H
        Ht[:, :ne, ne] = b
        Ht[:, ne, :ne] = b
        Ht[:, ne, ne] = 2.0 * c
        self._Ht_rows = Ht.reshape(m * (ne + 1), ne + 1)
        self._tail1 = np.concatenate((self.fixed_values, [1.0]))
        # types whose only non-zero second derivative is ∂²φ/∂θ² of one local coordinate (relative angles):
        # (type, rows, column of θ, flat (θ, θ) index in an n × n matrix)
        self._angle = []
        for t, r, _ in self._nonlinear:
            if getattr(t, "angle_only", False):
                col = np.ascontiguousarray(t.index[:, 4])
                self._angle.append((t, r, col, col * n + col))
        # fast path: only angle types, and their angles are coordinates (not fixed values).  There no second
        # derivative touches a fixed value, so the Hessian products need only the coordinates' part of H (no
        # extended vector to build, no columns to drop), and φ, ∂φ of the angles are scalar stores.
        self._all_angle = (len(self._angle) == len(self._nonlinear)
                           and all(bool(np.all(a[2] < n)) for a in self._angle))
        # the same per angle instance as plain ints, (row, column of θ, flat (θ, θ) index): with one or a few angle
        # constraints their second and third derivatives are written one float at a time, cheaper than the
        # numpy calls of fancy-indexed stores (the same products, so the same numbers)
        self._angle_items = [(t, col, [(int(i), int(c), int(f)) for i, c, f in zip(r, col, flat)])
                             for t, r, col, flat in self._angle]
        self._curv_memo = [None]
        Hn = np.ascontiguousarray(H[:, :n, :n])
        self._Hn_rows = Hn.reshape(m * n, n)
        self._Hn_flat = Hn.reshape(m, n * n)
        self._angle_rows = [(t, [int(i) for i in r]) for t, r, _ in self._nonlinear] if self._all_angle else None

    def native_form(self):
        """The constraints as `mbfg_ros.native` takes them: (H̃ (m, ne+1, ne+1) with Φᵢ = ½ qe1ᵀ H̃ᵢ qe1 for the
        quadratic types over qe1 = [q, fixed values, 1] (zero for the others), [fixed values, 1], and per relative
        angle (row, its 5 extended indices x0, y0, x1, y1, θ, length)); None when a type is neither (the
        compiled kernel does not know it)."""
        angles = []
        offset = 0
        for t in self.types:
            if isinstance(t, RelativeAngleConstraints):
                angles.extend((offset + k, *(int(i) for i in t.index[k]), float(t.lengths[k])) for k in range(t.size))
            elif not isinstance(t, QuadraticConstraints):
                return None
            offset += t.size
        w = self.n_extended + 1
        return self._Ht_rows.reshape(self.m, w, w), self._tail1, angles

    @property
    def quadratic_form(self):
        """(H_rows (m·ne, ne), H_flat (m, ne²), b (m, ne), c (m,)): the quadratic types folded into
        Φᵢ = ½ qeᵀHᵢqe + bᵢᵀqe + cᵢ over the extended coordinates qe (zero rows for the other types)."""
        return self._H_rows, self._H_flat, self._b, self._c

    def _curvatures(self, q):
        """[(∂²φ/∂θ², ∂³φ/∂θ³) lists] per angle type at q (all-angle fast path; a memo of the last q, which the
        dynamics read several times per configuration; one atomic slot: safe with concurrent callers)."""
        key = q.tobytes()
        m = self._curv_memo[0]
        if m is None or m[0] != key:
            m = self._curv_memo[0] = (key, [t.curvatures(q[col]) for t, col, _ in self._angle_items])
        return m[1]

    def _extended(self, q):
        return np.concatenate((q, self.fixed_values))

    def _extended_rate(self, v):
        return np.concatenate((v, self._zeros_fixed))

    def _rows_times(self, x):
        return self._H_rows.dot(x).reshape(self.m, self.n_extended)

    @staticmethod
    def _put(out, t, r, block):
        out[r[:, None], t.index] = block

    def phi(self, q: np.ndarray) -> np.ndarray:
        """Φ(q) alone (no Jacobian to assemble: the residual reported at every step)."""
        qe1 = np.concatenate((q, self._tail1))
        phi = self._Ht_rows.dot(qe1).reshape(self.m, self.n_extended + 1).dot(qe1)
        phi *= 0.5
        if self._angle_rows is not None:
            if self._angle_rows:
                x = qe1.tolist()
                for t, rows in self._angle_rows:
                    t.put_phi_gradient(x, rows, phi)
            return phi
        for t, r, _ in self._nonlinear:
            phi[r] = t.phi(qe1[t.index])
        return phi

    def jacobian(self, q: np.ndarray) -> np.ndarray:
        """Φq, shape (m, n)."""
        return self.phi_and_jacobian(q)[1]

    def phi_and_jacobian(self, q):
        qe1 = np.concatenate((q, self._tail1))
        T = self._Ht_rows.dot(qe1).reshape(self.m, self.n_extended + 1)
        phi = T.dot(qe1)
        phi *= 0.5
        if self._angle_rows is not None:
            if self._angle_rows:
                x = qe1.tolist()
                for t, rows in self._angle_rows:
                    t.put_phi_gradient(x, rows, phi, T)
            return phi, T[:, :self.n]
        for t, r, _ in self._nonlinear:
            u = qe1[t.index]
            p, g = t.phi(u), t.gradient(u)
            phi[r] = p
            T[r[:, None], t.index] = g
        return phi, T[:, :self.n]

    def hessian_vector(self, q: np.ndarray, w: np.ndarray) -> np.ndarray:
        """∂(Φq w)/∂q, shape (m, n).  With w = q̇ this is Φ̇q = d(Φq)/dt."""
        if self._all_angle or not self._nonlinear:
            out = self._Hn_rows.dot(w).reshape(self.m, self.n)
            if self._angle_items:
                wl = w.tolist()
                for (c2, _), (_, _, items) in zip(self._curvatures(q), self._angle_items):
                    for (row, col, _), c in zip(items, c2):
                        out[row, col] = c * wl[col]
            return out
        we = np.concatenate((w, self._zeros_fixed))
        out = self._H_rows.dot(we).reshape(self.m, self.n_extended)
        qe = self._extended(q)
        for t, r, _ in self._nonlinear:
            self._put(out, t, r, np.einsum("kij,kj->ki", t.hessian(qe[t.index]), we[t.index]))
        return out[:, :self.n]

    def jacobian_dot(self, q: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Φ̇q = d(Φq)/dt along q̇ = v."""
        return self.hessian_vector(q, v)

    def jacobian_dot_times_v_derivative(self, q: np.ndarray, v: np.ndarray) -> np.ndarray:
        """∂(Φ̇q(q, v) v)/∂q at fixed v, shape (m, n): zero for quadratic constraints."""
        if self._all_angle or not self._nonlinear:
            out = np.zeros((self.m, self.n))
            if self._angle_items:
                vl = v.tolist()
                for (_, c3), (_, _, items) in zip(self._curvatures(q), self._angle_items):
                    for (row, col, _), c in zip(items, c3):
                        w = vl[col]
                        out[row, col] = c * (w * w)
            return out
        out = np.zeros((self.m, self.n_extended))
        qe, ve = self._extended(q), self._extended_rate(v)
        for t, r, _ in self._nonlinear:
            self._put(out, t, r, t.third(qe[t.index], ve[t.index]))
        return out[:, :self.n]

    def weighted_hessian(self, q: np.ndarray, lam: np.ndarray) -> np.ndarray:
        """Σᵢ λᵢ ∂²Φᵢ/∂q² = ∂(Φqᵀ λ)/∂q, shape (n, n)."""
        if self._all_angle or not self._nonlinear:
            n = self.n
            out = lam.dot(self._Hn_flat) if self.m else np.zeros(n * n)
            if self._angle_items:
                ll = lam.tolist()
                for (c2, _), (_, _, items) in zip(self._curvatures(q), self._angle_items):
                    for (row, _, flat), c in zip(items, c2):
                        out[flat] += c * ll[row]      # (in order: a repeated (θ, θ) entry sums its terms)
            return out.reshape(n, n)
        ne = self.n_extended
        out = lam.dot(self._H_flat) if self.m else np.zeros(ne * ne)
        qe = self._extended(q)
        for t, r, flat in self._nonlinear:
            weights = (t.hessian(qe[t.index]) * lam[r][:, None, None]).ravel()
            out = out + np.bincount(flat, weights, minlength=ne * ne)
        return out.reshape(ne, ne)[:self.n, :self.n]
