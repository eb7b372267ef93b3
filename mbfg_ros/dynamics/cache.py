"""The per-step evaluation cache: Φ, Φq and the dynamics linearization at the last (q, q̇, Q) seen, shared
by the factor units of one step (the Mechanism is the model, this is its data)."""

from __future__ import annotations


import numpy as np

from scipy.linalg import lapack as _lapack

from mbfg_ros.dynamics.constrained import (DynamicsLinearization, acceleration_derivatives, forward_dynamics,
                                           forward_dynamics_jacobians, has_third_derivatives)
from mbfg_ros.model.mechanism import Mechanism
from mbfg_ros.native import mechanism_kernel


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
    singular or ill-conditioned.  The tests check both give the same numbers.  With the compiled kernel
    (`mbfg_ros.native`, ``native``) the linearization, q̈ and Φ are computed in C (the same formula; numpy
    where the kernel finds K singular).  The forces Q of every method are without the actuators' friction, which
    each applies itself (`model.friction`; the kernel too).
    """

    __slots__ = ("mech", "_pj_key", "_pj", "_dyn_key", "_dyn", "_acc_key", "_acc", "_jd_key", "_jd",
                 "_K", "_b", "_rows", "_n", "_third", "_older", "_fac_key", "_fac", "native")

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
        self.native = mechanism_kernel(mech)
        if self.native is None:
            raise ValueError(f"the compiled kernel does not know a constraint type of mechanism {mech.name} "
                             f"(mbfg_ros/native/_kernel.c)")
        self.clear()

    def clear(self):
        self._pj_key = self._dyn_key = self._acc_key = self._jd_key = self._fac_key = None
        self._pj = self._dyn = self._acc = self._jd = self._fac = None
        self._older = {}                 # key -> linearization: the ones before the newest (at most 2)

    def phi_and_jacobian(self, q):
        key = q.tobytes()
        if key != self._pj_key:
            self._pj = self.mech.constraints.phi_and_jacobian(q)
            self._pj_key = key
        return self._pj

    def state_summary(self, x: np.ndarray):
        """(max |Φ(q)|, x·x, max |q̇|, assembly mode as a tuple of ±1) of a state x whose layout starts with q, q̇:
        what an estimate reports and is checked on (NaN propagates into the first three)."""
        return self.native.summary(x)

    def constraint_residual(self, q) -> float:
        """max |Φ(q)| (0 without constraints; NaN propagates)."""
        return self.native.max_abs_phi(q)

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
            if self.native is not None:
                a = np.empty(self._n)
                if self.native.acceleration(q, v, Q, a):
                    self._acc, self._acc_key = a, key
                    return a
                a = None
            K, b = self._system(q, v, Q if self.mech.friction is None else self.mech.friction.applied(Q, v))[:2]
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

    def _factorization(self, q, v):
        """What the dynamics linearization at (q, q̇) needs besides the forces: (K⁻¹, Φq, Φ̇q, Φ̇q of the
        independent rows, −Φ̇q q̇ of those rows, ∂(Φ̇q q̇)/∂q or None), kept for the last (q, q̇); None where K
        is singular."""
        key = q.tobytes() + v.tobytes()
        if key == self._fac_key:
            return self._fac
        K, b, J_all, Jd_all, Jd = self._system(q, v, self._b[:self._n])
        lu, piv, info = _lapack.dgetrf(K)
        if info != 0:
            return None
        Kinv, info = _lapack.dgetri(lu, piv, overwrite_lu=1)
        if info != 0:
            return None
        third = self.mech.constraints.jacobian_dot_times_v_derivative(q, v) if self._third else None
        self._fac_key, self._fac = key, (Kinv, J_all, Jd_all, Jd, b[self._n:].copy(), third)
        return self._fac

    def _solution(self, Kinv, g, Q):
        """[q̈; λ of the independent rows] = K⁻¹ [Q; −Φ̇q q̇], or None when not sane."""
        n, b = self._n, self._b
        b[:n] = Q
        b[n:] = g
        x = Kinv.dot(b)
        return x if is_sane(x) else None

    def predicted_acceleration(self, q, v, Q):
        """q̈(q, q̇, Q) as `dynamics` would give it (the same K⁻¹ and product; the same numbers), without the
        derivatives: a prediction needs q̈ alone, and the step's dynamics factor, linearized at the same
        (q, q̇) under its own forces, then reuses K⁻¹ (`linearize`)."""
        if self.native is not None:
            # (compiled: one LU solve, no memo to consult; q̈ to rounding of the linearization's)
            a = np.empty(self._n)
            if self.native.acceleration(q, v, Q, a):
                return a
            return self.dynamics(q, v, Q).a
        key = q.tobytes() + v.tobytes() + Q.tobytes()
        if key == self._dyn_key:
            return self._dyn.a
        fac = self._factorization(q, v)
        friction = self.mech.friction
        x = None if fac is None else self._solution(fac[0], fac[4], Q if friction is None else friction.applied(Q, v))
        if x is None:
            return self.dynamics(q, v, Q).a
        return x[:self._n]

    def linearize(self, q, v, Q):
        """The dynamics linearization at (q, q̇, Q), not memoized: one LU of K and its explicit inverse (K is
        small; its top rows Kᵢₙᵥ[:n] = [A B] turn the derivatives into the two products of
        `acceleration_derivatives`); None where K is singular or the solution is not sane.

        Everything but Q's contribution depends on (q, q̇) only (K⁻¹, Φq, Φ̇q, −Φ̇q q̇, ∂(Φ̇q q̇)/∂q): that part is
        kept for the last (q, q̇) (`_factorization`), so a second linearization there under other forces (fused
        mode: the prediction under the previous step's commands, the step's dynamics factor under its own)
        costs only q̈, λ and the two derivative products, with the same numbers as a full one."""
        mech, n, C = self.mech, self._n, self.mech.constraints
        if self.native is not None:
            m = mech.m
            out = (np.empty(n), np.empty((n, n)), np.empty((n, n)), np.empty((n, n)), np.empty(m), np.empty((m, n)),
                   np.empty((m, n)))
            if self.native.linearize(q, v, Q, *out):
                a, da_dq, da_dv, da_dQ, lam, J, Jd = out
                return DynamicsLinearization(a, da_dq, da_dv, da_dQ, lam, J, Jd)
        fac = self._factorization(q, v)
        if fac is None:
            return None
        Kinv, J_all, Jd_all, Jd, g, third = fac
        friction = mech.friction
        x = self._solution(Kinv, g, Q if friction is None else friction.applied(Q, v))
        if x is None:
            return None
        a = x[:n]
        if self._rows is None:
            lam = x[n:]
        else:
            lam = np.zeros(mech.m)
            lam[self._rows] = x[n:]
        top = Kinv[:n]
        low = C.hessian_vector(q, a)          # (a new array)
        if third is not None:
            low += third
        if self._rows is not None:
            low = low[self._rows]
        tl, tr = top[:, :n], top[:, n:]
        da_dq, da_dv = acceleration_derivatives(tl, tr, C.weighted_hessian(q, lam), low, Jd)
        if friction is not None:
            friction.add_rate_derivative(da_dv, tl, v)
        return DynamicsLinearization(a, da_dq, da_dv, tl, lam, J_all, Jd_all)
