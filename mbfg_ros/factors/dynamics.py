"""Dynamics factors: forward dynamics, inverse dynamics with τ a variable, the jerk factor."""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np


from mbfg_ros.factors.base import Factor, context_or_new, sigma_array, sigma_or_default
from mbfg_ros.model.mechanism import Mechanism

TWO_PI = 2.0 * math.pi


class ForwardDynamics(Factor):
    """f_dyn: e = q̈(q, q̇; Q) − a with the known generalized forces Q (gravity + commanded efforts).
    Jacobians ∂q̈/∂q, ∂q̈/∂q̇ from `forward_dynamics_jacobians`, −I for a."""

    params = ('Q',)

    def __init__(self, mech: Mechanism, Q=None, sigma=None):
        self.mech = mech
        self.Q = np.array(mech.gravity_forces if Q is None else Q, dtype=float)
        self.slots = ("q", "v", "a")
        self.dim = mech.n
        self.sigmas = sigma_array(sigma_or_default(sigma, "dynamics"), self.dim)
        self._minus_I = -np.eye(mech.n)
        self.name = "forward_dynamics"

    def evaluate(self, q, v, a, ctx=None):
        d = context_or_new(ctx, self.mech).dynamics(q, v, self.Q)
        return d.a - a, [d.da_dq, d.da_dv, self._minus_I]

    def error(self, q, v, a, ctx=None):
        return context_or_new(ctx, self.mech).acceleration(q, v, self.Q) - a


class InverseDynamics(Factor):
    """f_idyn with the actuator efforts as a real variable:
    e = q̈(q, q̇; Q_known + E τ) − a;  ∂e/∂τ = ∂q̈/∂Q E (plus the full ∂/∂q, ∂/∂q̇, −I for a)."""

    params = ('Q_known',)

    def __init__(self, mech: Mechanism, Q_known=None, sigma=None, actuated: Optional[Sequence[int]] = None):
        self.mech = mech
        self.Q_known = np.array(mech.gravity_forces if Q_known is None else Q_known, dtype=float)
        self.actuated = np.array(mech.actuated if actuated is None else actuated, dtype=np.intp)
        self.slots = ("q", "v", "a", "tau")
        self.dim = mech.n
        self.sigmas = sigma_array(sigma_or_default(sigma, "dynamics"), self.dim)
        self._minus_I = -np.eye(mech.n)
        self.name = "inverse_dynamics"

    def forces(self, tau):
        Q = self.Q_known.copy()
        Q[self.actuated] += tau
        return Q

    def evaluate(self, q, v, a, tau, ctx=None):
        d = context_or_new(ctx, self.mech).dynamics(q, v, self.forces(tau))
        return d.a - a, [d.da_dq, d.da_dv, self._minus_I, d.da_dQ[:, self.actuated]]

    def error(self, q, v, a, tau, ctx=None):
        return context_or_new(ctx, self.mech).acceleration(q, v, self.forces(tau)) - a


class Jerk(Factor):
    """Jerk factor for the 4th-order integrator: e = j − j_pred with the total time derivative of q̈,

        j_pred = ∂q̈/∂q · q̇ + ∂q̈/∂q̇ · a + ∂q̈/∂Q · Q̇,

    evaluated at (q, q̇; Q) (Q = Q_known + E τ when the efforts are a slot, Q̇ a known parameter).
    With `select` the factor constrains only j[select] (independent coordinates: the z-jerk block).

    Jacobians: ∂e/∂j = I and ∂e/∂a = −∂q̈/∂q̇ (both exact: j_pred is linear in a);
    ∂e/∂q̇ ≈ −∂q̈/∂q and ∂e/∂q ≈ 0, ∂e/∂τ ≈ 0: the terms with second derivatives of q̈ are neglected.

    Why the answer is still exact: the error itself is exact, so any point where the graph's residuals
    vanish is a fixed point of Gauss–Newton whatever the Jacobian.  Where they do not vanish (the
    dependent-coordinate graph is over-determined by Φ and Φq q̇), the neglected block only enters the
    normal equations multiplied by this factor's own residual e_J, and stationarity in j (which appears
    nowhere else than here and, scaled by Δt²/12, in the velocity integrator) forces
    e_J = (Δt²/12)(σ_J/σ_I)² (e_I,k − e_I,k+1), i.e. about 1e-7 × a difference of two integrator residuals
    at Δt = 1 ms: the fixed point moves by ~1e-7 of the (already O(Δt⁵)) constraint-drift compromise.
    The neglected terms also enter the Newton step only scaled by Δt²/12, so the convergence rate of the
    relinearization loop is unaffected.  For the same reason the fast path does not check this unit's
    rows for relinearization (`check_weight` = 0): a mismatch ε in its whitened linear model moves the
    velocity integrator's whitened error by only (Δt²/12)(σ_I/σ_J)·ε ≈ 1e-7 ε, and its linear model is
    approximate by design anyway.
    (The tests check the exact blocks against finite differences; the accuracy tests show the fixed point.)
    """

    params = ('Q', 'Qdot')

    def __init__(self, mech: Mechanism, Q=None, Qdot=None, sigma=None, select: Optional[Sequence[int]] = None,
                 efforts: bool = False, actuated: Optional[Sequence[int]] = None):
        self.mech = mech
        n = mech.n
        self.Q = np.array(mech.gravity_forces if Q is None else Q, dtype=float)    # Q_known when efforts=True
        self.Qdot = np.zeros(n) if Qdot is None else np.array(Qdot, dtype=float)
        self.select = None if select is None else np.asarray(select, dtype=np.intp)
        self.efforts = bool(efforts)
        self.actuated = np.array(mech.actuated if actuated is None else actuated, dtype=np.intp)
        self.slots = ("q", "v", "a", "zj" if self.select is not None else "j") + (("tau",) if efforts else ())
        self.dim = n if self.select is None else self.select.size
        self.sigmas = sigma_array(sigma_or_default(sigma, "dynamics"), self.dim)
        self._I = np.eye(self.dim)
        self._zq = np.zeros((self.dim, n))
        self._ztau = np.zeros((self.dim, self.actuated.size))
        self.name = "jerk"
        self.check_weight = 0.0

    def _forces(self, tau):
        if not self.efforts:
            return self.Q
        Q = self.Q.copy()
        Q[self.actuated] += tau
        return Q

    def evaluate(self, q, v, a, j, *tau, ctx=None):
        d = context_or_new(ctx, self.mech).dynamics(q, v, self._forces(tau[0] if tau else None))
        jp = d.da_dq @ v + d.da_dv @ a + d.da_dQ @ self.Qdot
        Jv, Ja = -d.da_dq, -d.da_dv
        if self.select is not None:
            jp, Jv, Ja = jp[self.select], Jv[self.select], Ja[self.select]
        Js = [self._zq, Jv, Ja, self._I] + ([self._ztau] if self.efforts else [])
        return j - jp, Js


class ForwardDynamicsIndep(Factor):
    """f_dyn^i: e = z̈_pred(q, q̇; Q) − z̈ with z̈_pred = q̈(q, q̇; Q)[z] (eq. 15: the independent
    accelerations of the constrained motion); slots q, q̇, z̈ — q is a real slot, not read from outside."""

    params = ('Q',)

    def __init__(self, mech: Mechanism, z: Sequence[int], Q=None, sigma=None):
        self.mech = mech
        self.z = np.asarray(z, dtype=np.intp)
        self.Q = np.array(mech.gravity_forces if Q is None else Q, dtype=float)
        self.slots = ("q", "v", "zdd")
        self.dim = self.z.size
        self.sigmas = sigma_array(sigma_or_default(sigma, "dynamics"), self.dim)
        self._minus_I = -np.eye(self.dim)
        self.name = "forward_dynamics_indep"

    def evaluate(self, q, v, zdd, ctx=None):
        d = context_or_new(ctx, self.mech).dynamics(q, v, self.Q)
        return d.a[self.z] - zdd, [d.da_dq[self.z], d.da_dv[self.z], self._minus_I]

    def error(self, q, v, zdd, ctx=None):
        return context_or_new(ctx, self.mech).acceleration(q, v, self.Q)[self.z] - zdd


class InverseDynamicsIndep(Factor):
    """f_idyn^i: e = q̈(q, q̇; Q_known + E τ)[z] − z̈ (slots q, v, zdd, tau); ∂e/∂τ = (∂q̈/∂Q E)[z]."""

    params = ('Q_known',)

    def __init__(self, mech: Mechanism, z: Sequence[int], Q_known=None, sigma=None,
                 actuated: Optional[Sequence[int]] = None):
        self.mech = mech
        self.z = np.asarray(z, dtype=np.intp)
        self.Q_known = np.array(mech.gravity_forces if Q_known is None else Q_known, dtype=float)
        self.actuated = np.array(mech.actuated if actuated is None else actuated, dtype=np.intp)
        self.slots = ("q", "v", "zdd", "tau")
        self.dim = self.z.size
        self.sigmas = sigma_array(sigma_or_default(sigma, "dynamics"), self.dim)
        self._minus_I = -np.eye(self.dim)
        self.name = "inverse_dynamics_indep"

    def forces(self, tau):
        Q = self.Q_known.copy()
        Q[self.actuated] += tau
        return Q

    def evaluate(self, q, v, zdd, tau, ctx=None):
        d = context_or_new(ctx, self.mech).dynamics(q, v, self.forces(tau))
        z = self.z
        return d.a[z] - zdd, [d.da_dq[z], d.da_dv[z], self._minus_I, d.da_dQ[z][:, self.actuated]]

    def error(self, q, v, zdd, tau, ctx=None):
        return context_or_new(ctx, self.mech).acceleration(q, v, self.forces(tau))[self.z] - zdd
