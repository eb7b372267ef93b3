"""The per-step evaluation cache: Φ, Φq and the dynamics linearization at the last (q, q̇, Q) seen, shared
by the factor units of one step (the Mechanism is the model, this is its data)."""

from __future__ import annotations


import numpy as np

from scipy.linalg import lapack as _lapack

from mbfg_ros.dynamics.constrained import (DynamicsLinearization, acceleration_derivatives, forward_dynamics,
                                           forward_dynamics_jacobians, has_third_derivatives)
from mbfg_ros.model.mechanism import Mechanism


def is_sane(x) -> bool:
    """Finite and not absurdly large (‖x‖ < 1e12; one BLAS call: NaN and inf compare False)."""
    return bool(x.dot(x) < 1e24)


class EvalContext:
    """Memo of Φ/Φq and of the dynamics linearizations for the last (q, q̇, Q) seen (value-keyed; the
    three most recent linearizations are kept, e.g. at the previous step's and at this step's
    linearization points, both read by `HermiteVelocityIntegrator`).

    The dynamics are linearized by `linearize`: the formula of `acceleration_derivatives` with the rows of
    K⁻¹ from one LU factorization of the augmented matrix (Φq and Φ̇q shared with the constraint units
    through this memo); it falls back to `forward_dynamics_jacobians` whenever the augmented matrix is
    singular or ill-conditioned.  The tests check both give the same numbers.
    """

    __slots__ = ("mech", "_pj_key", "_pj", "_dyn_key", "_dyn", "_acc_key", "_acc", "_jd_key", "_jd",
                 "_K", "_b", "_rows", "_n", "_third", "_older")

    def __init__(self, mech: Mechanism):
        self.mech = mech
        n = mech.n
        rows = np.asarray(mech.independent_rows, dtype=np.intp)
        self._rows = None if rows.size == mech.m else rows
        self._n = n
        self._K = np.zeros((n + rows.size, n + rows.size), order="F")
        self._K[:n, :n] = mech.mass_matrix
        self._b = np.zeros(n + rows.size)
        self._third = has_third_derivatives(mech)
        self.clear()

    def clear(self):
        self._pj_key = self._dyn_key = self._acc_key = self._jd_key = None
        self._pj = self._dyn = self._acc = self._jd = None
        self._older = {}                 # key -> linearization: the ones before the newest (at most 2)

    def phi_and_jacobian(self, q):
        key = q.tobytes()
        if key != self._pj_key:
            self._pj = self.mech.constraints.phi_and_jacobian(q)
            self._pj_key = key
        return self._pj

    def phi(self, q):
        """Φ(q) (from the linearization at the same q when there is one)."""
        if self._pj_key is not None and self._pj_key == q.tobytes():
            return self._pj[0]
        return self.mech.constraints.phi(q)

    def jacobian_dot(self, q, v):
        """Φ̇q at (q, q̇) (taken from the dynamics linearization when that is at the same point)."""
        key = q.tobytes() + v.tobytes()
        if key != self._jd_key:
            d = self._dyn
            if d is not None and self._dyn_key is not None and self._dyn_key[:len(key)] == key:
                self._jd = d.Phi_q_dot
            else:
                self._jd = self.mech.constraints.jacobian_dot(q, v)
            self._jd_key = key
        return self._jd

    def dynamics(self, q, v, Q):
        """`forward_dynamics_jacobians(mech, q, v, Q)` (q̈, ∂q̈/∂q, ∂q̈/∂q̇, ∂q̈/∂Q, Φq, Φ̇q)."""
        key = q.tobytes() + v.tobytes() + Q.tobytes()
        if key != self._dyn_key:
            older = self._older
            d = older.pop(key, None) if older else None
            if d is None:
                d = self.linearize(q, v, Q)
                if d is None:
                    d = forward_dynamics_jacobians(self.mech, q, v, Q)
            if self._dyn_key is not None:
                older[self._dyn_key] = self._dyn
                if len(older) > 2:
                    del older[next(iter(older))]
            self._dyn, self._dyn_key = d, key
        return self._dyn

    def acceleration(self, q, v, Q):
        """q̈(q, q̇, Q) only (reuses a linearization at the same point)."""
        key = q.tobytes() + v.tobytes() + Q.tobytes()
        if key == self._dyn_key:
            return self._dyn.a
        if self._older:
            d = self._older.get(key)
            if d is not None:
                return d.a
        if key != self._acc_key:
            a = None
            K, b = self._system(q, v, Q)[:2]
            lu, piv, x, info = _lapack.dgesv(K, b)
            if info == 0 and is_sane(x):
                a = x[:self._n]
            self._acc = a if a is not None else forward_dynamics(self.mech, q, v, Q)
            self._acc_key = key
        return self._acc

    # -- the lean dynamics linearization ---------------------------------------------------------
    def _system(self, q, v, Q):
        """Augmented matrix K = [[M, Φqᵀ], [Φq, 0]] (independent rows) and right-hand side [Q; −Φ̇q q̇]."""
        n = self._n
        _, J_all = self.phi_and_jacobian(q)
        Jd_all = self.jacobian_dot(q, v)
        J, Jd = (J_all, Jd_all) if self._rows is None else (J_all[self._rows], Jd_all[self._rows])
        K = self._K
        K[:n, n:] = J.T
        K[n:, :n] = J
        b = self._b
        b[:n] = Q
        np.negative(Jd.dot(v), out=b[n:])
        return K, b, J_all, Jd_all, Jd

    def linearize(self, q, v, Q):
        """The dynamics linearization at (q, q̇, Q), not memoized: one LU of K and its explicit inverse (K is
        small; its top rows Kᵢₙᵥ[:n] = [A B] turn the derivatives into the two products of
        `acceleration_derivatives`); None where K is singular or the solution is not sane."""
        mech, n, C = self.mech, self._n, self.mech.constraints
        K, b, J_all, Jd_all, Jd = self._system(q, v, Q)
        lu, piv, info = _lapack.dgetrf(K)
        if info != 0:
            return None
        Kinv, info = _lapack.dgetri(lu, piv, overwrite_lu=1)
        if info != 0:
            return None
        x = Kinv.dot(b)
        if not is_sane(x):
            return None
        a = x[:n]
        if self._rows is None:
            lam = x[n:]
        else:
            lam = np.zeros(mech.m)
            lam[self._rows] = x[n:]
        top = Kinv[:n]
        low = C.hessian_vector(q, a)
        if self._third:
            low = low + C.jacobian_dot_times_v_derivative(q, v)
        if self._rows is not None:
            low = low[self._rows]
        tl, tr = top[:, :n], top[:, n:]
        da_dq, da_dv = acceleration_derivatives(tl, tr, C.weighted_hessian(q, lam), low, Jd)
        return DynamicsLinearization(a, da_dq, da_dv, tl, lam, J_all, Jd_all)
