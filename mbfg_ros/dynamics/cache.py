"""The per-step evaluation cache: Φ, Φq and the dynamics linearization at the last (q, q̇, Q) seen, shared
by the factor units of one step (the Mechanism is the model, this is its data)."""

from __future__ import annotations


import numpy as np

from mbfg_ros.dynamics.constrained import DynamicsLinearization, forward_dynamics, forward_dynamics_jacobians
from mbfg_ros.model.mechanism import Mechanism
from mbfg_ros.native import UnitProgram, mechanism_kernel


class EvalContext:
    """Memo of Φ/Φq and of the dynamics linearizations for the last (q, q̇, Q) seen (value-keyed; the
    three most recent linearizations are kept, e.g. at the previous step's and at this step's
    linearization points, both read by `HermiteVelocityIntegrator`).

    q̈, the dynamics linearization, an estimate's summary come from the mechanism's compiled kernel
    (`mbfg_ros.native`, ``native``: its derivative products with the rows of K⁻¹ from one LU factorization of
    the augmented matrix); where it finds K singular or the solution not sane, from the
    null-space solver of `forward_dynamics_jacobians` / `forward_dynamics`, which `supply_singular` also hands to
    the kernel for its step programs.  The forces Q of every method are
    without the actuators' friction, which each applies itself (`model.friction`; the kernel too).
    """

    __slots__ = ("mech", "_pj_key", "_pj", "_dyn_key", "_dyn", "_acc_key", "_acc", "_jd_key", "_jd",
                 "_n", "_older", "_units", "native")

    def __init__(self, mech: Mechanism):
        self.mech = mech
        self._n = mech.n
        self.native = mechanism_kernel(mech)
        if self.native is None:
            raise ValueError(f"the compiled kernel does not know a constraint type of mechanism {mech.name} "
                             f"(mbfg_ros/native/_kernel.c)")
        self._units = {}                 # id(unit) -> (unit, block widths, its UnitProgram)
        self.clear()

    def clear(self):
        self._pj_key = self._dyn_key = self._acc_key = self._jd_key = None
        self._pj = self._dyn = self._acc = self._jd = None
        self._older = {}                 # key -> linearization: the ones before the newest (at most 2)

    def unit_program(self, unit, widths) -> UnitProgram:
        """`unit` alone as a program of this mechanism's kernel, for blocks of `widths` (kept per unit)."""
        held = self._units.get(id(unit))
        if held is None or held[0] is not unit or held[1] != widths:
            if len(self._units) > 64:
                self._units.clear()
            held = self._units[id(unit)] = (unit, widths, UnitProgram(self.native, unit, widths))
        return held[2]

    def supply_singular(self) -> bool:
        """After a kernel call that stopped where the augmented matrix is singular: the null-space solver's
        linearization at that point (`forward_dynamics_jacobians`) handed to the kernel, which takes it there from
        then on, so that the call repeated goes through with the kernel's own formulas of everything else (the
        kernel has no null-space solver; the units' formulas have no numpy twin).  False where the kernel stopped
        at no such point."""
        n = self._n
        q, v, Q = np.empty(n), np.empty(n), np.empty(n)
        if not self.native.missed(q, v, Q):
            return False
        d = forward_dynamics_jacobians(self.mech, q, v, Q)
        self.native.supply(q, v, Q, *[np.ascontiguousarray(x, dtype=float)
                                      for x in (d.a, d.da_dq, d.da_dv, d.da_dQ, d.multipliers)])
        return True

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
            a = np.empty(self._n)
            if not self.native.acceleration(q, v, Q, a):
                a = forward_dynamics(self.mech, q, v, Q)
            self._acc, self._acc_key = a, key
        return self._acc

    def predicted_acceleration(self, q, v, Q):
        """q̈(q, q̇, Q) as `dynamics` would give it (to rounding), without the derivatives: one LU solve, no memo
        to consult (a prediction needs q̈ alone)."""
        a = np.empty(self._n)
        if self.native.acceleration(q, v, Q, a):
            return a
        return self.dynamics(q, v, Q).a

    def linearize(self, q, v, Q):
        """The dynamics linearization at (q, q̇, Q), not memoized; None where K is singular or the solution is not
        sane (then `forward_dynamics_jacobians`)."""
        n, m = self._n, self.mech.m
        out = (np.empty(n), np.empty((n, n)), np.empty((n, n)), np.empty((n, n)), np.empty(m), np.empty((m, n)),
               np.empty((m, n)))
        if self.native.linearize(q, v, Q, *out):
            return DynamicsLinearization(*out)
        return None
