"""Dynamics factors: forward dynamics, inverse dynamics with τ a variable, the jerk factor."""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np


from mbfg_ros.factors.base import (Factor, batch_mechanism, compiled_evaluation, context_or_new, sigma_array,
                                   sigma_or_default)
from mbfg_ros.model.mechanism import Mechanism

TWO_PI = 2.0 * math.pi


def _compiled(unit, blocks, ctx, params):
    """(error, [Jacobian per slot]) of a dynamics unit of a compiled kind: its kind's function in the kernel, the
    only form of its residual (where the dynamics are singular with the null-space solver's q̈ and derivatives)."""
    out = compiled_evaluation(unit, blocks, ctx, params)
    if out is None:
        raise np.linalg.LinAlgError(f"{unit.name}: no dynamics linearization at a singular point")
    return out


def _stacked(params, i):
    """The per-step parameter i of every factor of a series (`params`: one tuple per factor), (F, n), or (1, n) when
    they all share one value."""
    values = [np.asarray(p[i], float) for p in params]
    if all(x is values[0] for x in values) or all(np.array_equal(x, values[0]) for x in values):
        return values[0][None, :]
    return np.array(values)


class ForwardDynamics(Factor):
    """f_dyn: e = q̈(q, q̇; Q) − a with the known generalized forces Q (gravity + commanded efforts);
    Jacobians ∂q̈/∂q, ∂q̈/∂q̇ from the dynamics linearization, −I for a (slots q, v, a).

    With independent coordinates `z` this is f_dyn^i: e = q̈(q, q̇; Q)[z] − z̈ (eq. 15: the independent
    accelerations of the constrained motion; slots q, v, zdd — q is a real slot, not read from outside)."""

    params = ('Q',)

    def __init__(self, mech: Mechanism, Q=None, sigma=None, z: Optional[Sequence[int]] = None):
        self.mech = mech
        self.Q = np.array(mech.gravity_forces if Q is None else Q, dtype=float)
        self.z = None if z is None else np.array(z, dtype=np.intp)
        self.slots = ("q", "v", "a") if self.z is None else ("q", "v", "zdd")
        self.dim = mech.n if self.z is None else self.z.size
        self.sigmas = sigma_array(sigma_or_default(sigma, "dynamics"), self.dim)
        self._minus_I = -np.eye(self.dim)
        self.name = "forward_dynamics" if self.z is None else "forward_dynamics_indep"
        self.kernel_kind = "forward_dynamics" if self.z is None else None

    def evaluate(self, q, v, a, *, params, ctx=None):
        z = self.z
        if z is None:
            return _compiled(self, (q, v, a), ctx, params)
        d = context_or_new(ctx, self.mech).dynamics(q, v, params[0])
        return d.a[z] - a, [d.da_dq[z], d.da_dv[z], self._minus_I]

    def error(self, q, v, a, *, params, ctx=None):
        if self.z is None:
            return _compiled(self, (q, v, a), ctx, params)[0]
        acc = context_or_new(ctx, self.mech).acceleration(q, v, params[0])
        return acc[self.z] - a

    @classmethod
    def vectorized(cls, units, params):
        # the dependent form only: the independent one stays factor by factor in the batch engine, whose
        # Levenberg–Marquardt path (and so its converged point, to the stopping tolerance) depends on
        # the rounding of the Jacobians
        if batch_mechanism(units) is None or any(u.z is not None for u in units):
            return None
        Q0 = _stacked(params, 0)
        minus_I = -np.eye(units[0].dim)
        no_columns = np.zeros(0, np.intp)

        def evaluate_many(ctx, keys, q, v, a):
            Q = np.broadcast_to(Q0, q.shape)
            acc, dq, dv, _ = ctx.dynamics(keys[0], keys[1], q, v, Q, no_columns)
            return acc - a, [dq, dv, np.broadcast_to(minus_I, dq.shape)]
        return evaluate_many


class InverseDynamics(Factor):
    """f_idyn with the actuator efforts as a real variable (slots q, v, a, tau):
    e = q̈(q, q̇; Q_known + E τ) − a;  ∂e/∂τ = ∂q̈/∂Q E (plus the full ∂/∂q, ∂/∂q̇, −I for a).

    With independent coordinates `z` this is f_idyn^i: e = q̈(q, q̇; Q_known + E τ)[z] − z̈
    (slots q, v, zdd, tau); ∂e/∂τ = (∂q̈/∂Q E)[z]."""

    params = ('Q_known',)

    def __init__(self, mech: Mechanism, Q_known=None, sigma=None, actuated: Optional[Sequence[int]] = None,
                 z: Optional[Sequence[int]] = None):
        self.mech = mech
        self.Q_known = np.array(mech.gravity_forces if Q_known is None else Q_known, dtype=float)
        self.actuated = np.array(mech.actuated if actuated is None else actuated, dtype=np.intp)
        # consecutive actuated coordinates (the usual layout: relative angles last) as a slice: views, not copies
        act = self.actuated
        self._act = (slice(int(act[0]), int(act[-1]) + 1)
                     if act.size and np.array_equal(act, np.arange(act[0], act[-1] + 1)) else act)
        self.z = None if z is None else np.array(z, dtype=np.intp)
        self.slots = ("q", "v", "a", "tau") if self.z is None else ("q", "v", "zdd", "tau")
        self.dim = mech.n if self.z is None else self.z.size
        self.sigmas = sigma_array(sigma_or_default(sigma, "dynamics"), self.dim)
        self._minus_I = -np.eye(self.dim)
        self.name = "inverse_dynamics" if self.z is None else "inverse_dynamics_indep"
        self.kernel_kind = "inverse_dynamics" if self.z is None else None

    def kernel_arguments(self):
        return [int(i) for i in self.actuated], []

    def forces(self, Q_known, tau):
        """Q = Q_known + E τ (a new array)."""
        Q = np.array(Q_known, dtype=float)
        Q[self._act] += tau
        return Q

    def evaluate(self, q, v, a, tau, *, params, ctx=None):
        z = self.z
        if z is None:
            return _compiled(self, (q, v, a, tau), ctx, params)
        d = context_or_new(ctx, self.mech).dynamics(q, v, self.forces(params[0], tau))
        return d.a[z] - a, [d.da_dq[z], d.da_dv[z], self._minus_I, d.da_dQ[z][:, self._act]]

    def error(self, q, v, a, tau, *, params, ctx=None):
        if self.z is None:
            return _compiled(self, (q, v, a, tau), ctx, params)[0]
        acc = context_or_new(ctx, self.mech).acceleration(q, v, self.forces(params[0], tau))
        return acc[self.z] - a

    @classmethod
    def vectorized(cls, units, params):
        # the dependent form only (see `ForwardDynamics.vectorized`)
        if batch_mechanism(units) is None or any(u.z is not None for u in units):
            return None
        act = units[0].actuated
        if any(not np.array_equal(u.actuated, act) for u in units):
            return None
        Q0 = _stacked(params, 0)
        minus_I = -np.eye(units[0].dim)

        def evaluate_many(ctx, keys, q, v, a, tau):
            Q = np.array(np.broadcast_to(Q0, q.shape))
            Q[:, act] += tau
            acc, dq, dv, dQ = ctx.dynamics(keys[0], keys[1], q, v, Q, act)
            return acc - a, [dq, dv, np.broadcast_to(minus_I, dq.shape), dQ]
        return evaluate_many


class IdentifiedDynamics(Factor):
    """f_idyn with identified parameters θ (`model.identified`) as a real variable (slots q, v, a, tau, theta):
    e = q̈(q, q̇; Q_known + E τ + ΔQ(θ, q̇, u, a)) − a, ΔQ the parameters' forces beyond the declared model (u: the
    step's known commands, actuator order; a payload's depends on the state's q̈ a: its inertia);
    ∂e/∂q̇ = ∂q̈/∂q̇ + ∂q̈/∂Q ∂ΔQ/∂q̇,  ∂e/∂a = −I + ∂q̈/∂Q ∂ΔQ/∂a,  ∂e/∂τ = ∂q̈/∂Q E,  ∂e/∂θ = ∂q̈/∂Q ∂ΔQ/∂θ."""

    params = ('Q_known', 'commands')

    def __init__(self, mech: Mechanism, parameters, Q_known=None, commands=None, sigma=None,
                 actuated: Optional[Sequence[int]] = None):
        self.mech = mech
        self.parameters = parameters
        self.Q_known = np.array(mech.gravity_forces if Q_known is None else Q_known, dtype=float)
        self.commands = np.zeros(len(mech.actuated)) if commands is None else np.array(commands, dtype=float)
        self.actuated = np.array(mech.actuated if actuated is None else actuated, dtype=np.intp)
        self.slots = ("q", "v", "a", "tau", "theta")
        self.dim = mech.n
        self.sigmas = sigma_array(sigma_or_default(sigma, "dynamics"), self.dim)
        self.name = "identified_dynamics"
        self.kernel_kind = "identified_dynamics"

    def kernel_arguments(self):
        par, doubles = self.parameters.kernel_layout()
        return [int(self.actuated.size)] + [int(i) for i in self.actuated] + list(par), doubles.tolist()

    def evaluate(self, q, v, a, tau, theta, *, params, ctx=None):
        return _compiled(self, (q, v, a, tau, theta), ctx, params)

    def error(self, q, v, a, tau, theta, *, params, ctx=None):
        return _compiled(self, (q, v, a, tau, theta), ctx, params)[0]


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
        self.select = None if select is None else np.array(select, dtype=np.intp)
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

    def _forces(self, Q, tau):
        if not self.efforts:
            return Q
        Q = Q.copy()
        Q[self.actuated] += tau
        return Q

    def evaluate(self, q, v, a, j, *tau, params, ctx=None):
        Q, Qdot = params
        d = context_or_new(ctx, self.mech).dynamics(q, v, self._forces(Q, tau[0] if tau else None))
        jp = d.da_dq @ v + d.da_dv @ a + d.da_dQ @ Qdot
        Jv, Ja = -d.da_dq, -d.da_dv
        if self.select is not None:
            jp, Jv, Ja = jp[self.select], Jv[self.select], Ja[self.select]
        Js = [self._zq, Jv, Ja, self._I] + ([self._ztau] if self.efforts else [])
        return j - jp, Js
