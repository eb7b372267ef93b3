"""Integrators between two steps (Euler, trapezoidal, Hermite, the jerk-free Hermite velocity
integrator), the soft equality of a block across steps and the second difference over three steps."""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np


from mbfg_ros.factors.base import Factor, context_or_new, prev, sigma_array, sigma_or_default
from mbfg_ros.model.mechanism import Mechanism

TWO_PI = 2.0 * math.pi


class _Combination(Factor):
    linear = True
    static = True       # affine, zero offset, parameters fixed at construction

    def __init__(self, coefficients, names, d, sigma, title):
        """e = Σ cᵢ · blockᵢ with scalar coefficients: every Jacobian is cᵢ I."""
        self.slots = tuple(names)
        self.dim = int(d)
        self.sigmas = sigma_array(sigma, self.dim)
        self.coefficients = tuple(float(c) for c in coefficients)
        I = np.eye(self.dim)
        self.jacobians = [c * I for c in self.coefficients]
        self.name = title

    def evaluate(self, *blocks, params, ctx=None):
        e = self.coefficients[0] * blocks[0]
        for c, b in zip(self.coefficients[1:], blocks[1:]):
            e = e + c * b
        return e, self.jacobians


class EulerIntegrator(_Combination):
    """f_ei: e = x₁ − x₀ − Δt ẋ₀ (slots x_prev, x, xd_prev)."""

    def __init__(self, x: str, xd: str, d: int, dt: float, sigma=None):
        super().__init__((-1.0, 1.0, -dt), (prev(x), x, prev(xd)), d, sigma_or_default(sigma, "integrator"),
                         f"euler({x},{xd})")
        self.dt = dt


class TrapezoidalIntegrator(_Combination):
    """f_ti: e = x₁ − x₀ − Δt/2 (ẋ₀ + ẋ₁) (slots x_prev, x, xd_prev, xd)."""

    def __init__(self, x: str, xd: str, d: int, dt: float, sigma=None):
        h = 0.5 * dt
        super().__init__((-1.0, 1.0, -h, -h), (prev(x), x, prev(xd), xd), d,
                         sigma_or_default(sigma, "integrator"), f"trapezoidal({x},{xd})")
        self.dt = dt


class HermiteIntegrator(_Combination):
    """4th-order end-corrected trapezoid (two-point Hermite / Obreshkov formula):
    e = x₁ − x₀ − Δt/2 (ẋ₀ + ẋ₁) − Δt²/12 (ẍ₀ − ẍ₁) (slots x_prev, x, xd_prev, xd, xdd_prev, xdd).

    Local error Δt⁵/720 x⁽⁵⁾: global error O(Δt⁴), like RK4.  Used for q (with q̇, q̈) and for q̇ (with
    q̈ and the jerk j = dq̈/dt, see `Jerk`)."""

    def __init__(self, x: str, xd: str, xdd: str, d: int, dt: float, sigma=None):
        h, c = 0.5 * dt, dt * dt / 12.0
        super().__init__((-1.0, 1.0, -h, -h, -c, c), (prev(x), x, prev(xd), xd, prev(xdd), xdd), d,
                         sigma_or_default(sigma, "integrator"), f"hermite({x},{xd},{xdd})")
        self.dt = dt


class SoftEquality(_Combination):
    """f_eq: e = x₁ − x₀ − δ (slots x_prev, x), δ = 0 (the paper's soft equality) unless an `offset` is
    given.  Also the random walk of unknown efforts.

    With an offset the factor is a *predictive* soft equality: the estimator sets δ to the continuity
    predictor's displacement, so the factor still penalizes jumps (e.g. to the other assembly mode)
    but does not drag the motion towards standing still (with δ = 0 and σ = 10 that drag costs ~1e-3 mm
    over the 5-s four-bar fall in the independent formulation, far above the 4th-order integrator's error).
    """

    def __init__(self, x: str, d: int, sigma=None, offset=None):
        super().__init__((-1.0, 1.0), (prev(x), x), d, sigma_or_default(sigma, "soft_equality"), f"equality({x})")
        self.offset = None if offset is None else np.array(offset, dtype=float).reshape(self.dim)
        if self.offset is not None:
            self.static = False          # the offset is a per-step parameter
            self.params = ("offset",)

    def evaluate(self, x0, x1, *, params, ctx=None):
        e = x1 - x0
        if params:                      # (the offset, where the unit has one)
            e = e - params[0]
        return e, self.jacobians


class SecondDifference(_Combination):
    """e = x_{k−1} − 2 x_k + x_{k+1} (slots x_prev_prev, x_prev, x): a smoothness prior that vanishes on
    linear trends.  The trapezoidal rule leaves a sawtooth (−1)^k in q̈ (and the efforts) undetermined
    when the efforts are free; a soft equality x_{k+1} − x_k would fix it too but drags the end
    values toward their neighbours (an O(Δt·jerk) error at both ends), this one does not."""

    def __init__(self, x: str, d: int, sigma: float):
        super().__init__((1.0, -2.0, 1.0), (prev(prev(x)), prev(x), x), d, sigma, f"second_difference({x})")


class HermiteVelocityIntegrator(Factor):
    """The 4th-order velocity integrator without a jerk variable in the state:

        e = q̇₁ − q̇₀ − Δt/2 (q̈₀ + q̈₁) − Δt²/12 (j₀ − j₁),   jᵢ = ∂q̈/∂q q̇ᵢ + ∂q̈/∂q̇ q̈ᵢ + ∂q̈/∂Q Q̇ᵢ,

    i.e. `HermiteIntegrator` on (q̇, q̈, j) with the jerk of each end computed from the states (the j_pred
    of `Jerk`), so the stacked state stays [q, q̇, q̈ (, τ)].  Slots (q_prev, v_prev, a_prev, q, v, a)
    (+ tau_prev, tau with the efforts as variables: Qᵢ = Q_known + E τᵢ).  Parameters: Q_prev, Q (Q_known
    with efforts), Qdot_prev, Qdot (None: zero) and ``lin_prev``.

    j₁ uses ∂q̈/∂q, ∂q̈/∂q̇, ∂q̈/∂Q at (q₁, q̇₁; Q₁).  j₀ uses them at ``lin_prev`` = (q̄, q̇̄, τ̄ or None): the
    point where the previous step's integrator linearized its own j₁ (None: at (q₀, q̇₀), the exact jerk).
    A step's factor is a linear model built once, so the jerk of step k enters the factors of steps k and
    k + 1; with both ends on the same linear model of it (matrices at step k's linearization point, linear
    in q̇ and q̈) the Δt²/12 jerk terms telescope over the steps exactly as with a jerk variable in the
    state (evaluating j₀ exactly at the estimate instead breaks the telescoping by the linear model's
    error of every step: 2–50 times larger errors in tests).

    Jacobians as in `Jerk`: exact in q̈, ∂q̈/∂q for q̇ (the second derivatives of q̈ are neglected) and 0
    for q and τ; they enter scaled by Δt²/12 and the rows are not checked for relinearization
    (`check_weight` 0) — see `Jerk` for why the fixed point stays exact.
    """

    params = ('Q_prev', 'Q', 'Qdot_prev', 'Qdot', 'lin_prev')

    def __init__(self, mech: Mechanism, dt: float, Q_prev=None, Q=None, Qdot_prev=None, Qdot=None, sigma=None,
                 efforts: bool = False, actuated: Optional[Sequence[int]] = None, lin_prev=None):
        self.mech = mech
        n = mech.n
        g = mech.gravity_forces
        self.Q_prev = np.array(g if Q_prev is None else Q_prev, dtype=float)
        self.Q = np.array(g if Q is None else Q, dtype=float)
        self.Qdot_prev = None if Qdot_prev is None else np.array(Qdot_prev, dtype=float)
        self.Qdot = None if Qdot is None else np.array(Qdot, dtype=float)
        self.lin_prev = None if lin_prev is None else tuple(None if x is None else np.array(x, dtype=float)
                                                            for x in lin_prev)
        self.efforts = bool(efforts)
        self.actuated = np.array(mech.actuated if actuated is None else actuated, dtype=np.intp)
        self.dt = float(dt)
        self.slots = ("q_prev", "v_prev", "a_prev", "q", "v", "a") + (("tau_prev", "tau") if efforts else ())
        self.dim = n
        self.sigmas = sigma_array(sigma_or_default(sigma, "integrator"), self.dim)
        self._h2, self._c = 0.5 * self.dt, self.dt * self.dt / 12.0
        self._I = np.eye(n)
        self._mI, self._mh2I = -self._I, -self._h2 * self._I
        self._zq = np.zeros((n, n))
        self._ztau = np.zeros((n, self.actuated.size))
        self.check_weight = 0.0
        self.name = "hermite_velocity"

    def forces(self, Q, tau=None):
        if not self.efforts:
            return Q
        Q = Q.copy()
        Q[self.actuated] += tau
        return Q

    @staticmethod
    def jerk(d, v, a, Qdot):
        """j = ∂q̈/∂q q̇ + ∂q̈/∂q̇ q̈ + ∂q̈/∂Q Q̇ with the matrices of a dynamics linearization `d` (Q̇ None: 0)."""
        j = d.da_dq.dot(v)
        j += d.da_dv.dot(a)
        if Qdot is not None:
            j += d.da_dQ.dot(Qdot)
        return j

    def dynamics_at(self, ctx, Q_prev, lin_prev, q0, v0, tau0=None):
        """The dynamics linearization j₀ is built on (at ``lin_prev``, else at (q₀, q̇₀)) for the per-step values
        ``Q_prev`` and ``lin_prev``."""
        if lin_prev is None:
            return ctx.dynamics(q0, v0, self.forces(Q_prev, tau0))
        qb, vb, tb = lin_prev
        return ctx.dynamics(qb, vb, self.forces(Q_prev, tb))

    def evaluate(self, q0, v0, a0, q1, v1, a1, *tau, params, ctx=None):
        Q_prev, Q, Qdot_prev, Qdot, lin_prev = params
        c = context_or_new(ctx, self.mech)
        d0 = self.dynamics_at(c, Q_prev, lin_prev, q0, v0, tau[0] if tau else None)
        d1 = c.dynamics(q1, v1, self.forces(Q, tau[1] if tau else None))
        j0 = self.jerk(d0, v0, a0, Qdot_prev)
        j0 -= self.jerk(d1, v1, a1, Qdot)
        h2, cc = self._h2, self._c
        e = v1 - v0
        e -= h2 * (a0 + a1)
        e -= cc * j0
        Js = [self._zq, self._mI - cc * d0.da_dq, self._mh2I - cc * d0.da_dv,
              self._zq, self._I + cc * d1.da_dq, self._mh2I + cc * d1.da_dv]
        if self.efforts:
            Js += [self._ztau, self._ztau]
        return e, Js
