"""Factor units of the multibody factor graphs, with closed-form Jacobians (ROS-free, gtsam-free).

A unit is one small object with

* ``slots``  – names of the variable blocks it reads, in argument order.  A bare name (``"q"``,
  ``"v"``, ``"a"``, ``"j"``, ``"tau"``, ``"z"``, ``"zd"``, ``"zdd"``, ``"zj"``) is the block of the step
  the unit belongs to; the suffix ``_prev`` names the same block one step earlier (integrators,
  soft equality, random walks).
* ``dim``    – number of error rows,
* ``sigmas`` – (dim,) standard deviations of the rows (the noise model is diagonal),
* ``evaluate(*blocks, ctx=None) -> (error, [J_slot ...])`` – error and one Jacobian per slot,
  ``error(*blocks, ctx=None)`` – error only (cheaper for the dynamics units),
  ``whitened(*blocks, ctx=None)`` – both divided by the sigmas.

Fixed parameters (measured values, known forces, Δt) are attributes set at construction; the
estimator may update them in place (``unit.value = ...``, ``unit.Q = ...``) before evaluating, the gtsam
adapters take a copy.  Nothing is read from outside the blocks: every quantity an error depends on is
either a slot or a parameter of the unit.

``ctx`` is an optional `EvalContext`: a memo of the expensive per-configuration quantities (Φ, Φq,
q̈ and its Jacobians) keyed by the *values* of the blocks, so several units evaluated at the same
(q, q̇, Q) share one dynamics linearization.  Passing no context gives the same numbers.

Notation: n coordinates, m constraint rows, d degrees of freedom (independent coordinates z),
na actuators (efforts τ on the actuated coordinates, E the n×na selector, Q = Q_known + E τ).
"""

from __future__ import annotations

import copy
import math
from typing import Optional, Sequence

import numpy as np

from scipy.linalg import lapack as _lapack

from .dynamics import DynamicsLinearization, forward_dynamics, forward_dynamics_jacobians
from .estimate import default_sigmas
from .model import Mechanism

TWO_PI = 2.0 * math.pi

__all__ = [
    "EvalContext", "Factor", "Prior", "EulerIntegrator", "TrapezoidalIntegrator", "HermiteIntegrator",
    "SoftEquality", "PositionConstraints", "VelocityConstraints", "AccelerationConstraints",
    "ForwardDynamics", "InverseDynamics", "Jerk", "HermiteVelocityIntegrator", "PositionConstraintsIndep",
    "VelocityConstraintsIndep", "AccelerationConstraintsIndep", "ForwardDynamicsIndep", "InverseDynamicsIndep",
    "Encoder", "Gyroscope", "ObservedCoordinate", "prev", "sigma_or_default",
]


def prev(name: str) -> str:
    """Slot name of block `name` one step earlier."""
    return name + "_prev"


def sigma_or_default(sigma, key: str) -> float:
    return default_sigmas()[key] if sigma is None else sigma


def _sigmas(sigma, dim: int) -> np.ndarray:
    if isinstance(sigma, float):            # the common case, without numpy's broadcasting machinery
        if not (0.0 < sigma < math.inf):
            raise ValueError(f"sigmas must be positive and finite (got {sigma})")
        return np.full(dim, sigma)
    s = np.broadcast_to(np.asarray(sigma, dtype=float), (dim,)).copy()
    if dim and not (np.all(s > 0) and np.all(np.isfinite(s))):
        raise ValueError(f"sigmas must be positive and finite (got {sigma})")
    return s


# ----------------------------------------------------------------------------------------------
class EvalContext:
    """Memo of Φ/Φq and of the dynamics linearizations for the last (q, q̇, Q) seen (value-keyed; the
    three most recent linearizations are kept, e.g. at the previous step's and at this step's
    linearization points, both read by `HermiteVelocityIntegrator`).

    With ``fast=True`` (default) the dynamics are linearized by `lean_dynamics_jacobians`: the same
    equations as `dynamics.forward_dynamics_jacobians` (augmented system over the independent rows of Φq,
    differentiated), but one LU factorization shared by both solves and by Φ/Φq of the position factor;
    it falls back to `forward_dynamics_jacobians` whenever the augmented matrix is singular or
    ill-conditioned.  The tests check both give the same numbers.
    """

    __slots__ = ("mech", "fast", "_pj_key", "_pj", "_dyn_key", "_dyn", "_acc_key", "_acc", "_jd_key", "_jd",
                 "_K", "_b", "_rows", "_n", "_r", "_third", "_older")

    def __init__(self, mech: Mechanism, fast: bool = True):
        self.mech = mech
        self.fast = bool(fast)
        n = mech.n
        rows = np.asarray(mech.independent_rows, dtype=np.intp)
        self._rows = None if rows.size == mech.m else rows
        self._n, self._r = n, rows.size
        self._K = np.zeros((n + rows.size, n + rows.size), order="F")
        self._K[:n, :n] = mech.mass_matrix
        self._b = np.zeros(n + rows.size)
        # do the constraints have third derivatives (∂(Φ̇q q̇)/∂q ≠ 0)?  Quadratic ones (distances, sliders)
        # do not: probe once at a random point.
        rng = np.random.default_rng(0)
        qr, vr = np.array(mech.q0) + 0.1 * rng.standard_normal(n), rng.standard_normal(n)
        self._third = bool(np.any(mech.constraints.jacobian_dot_times_v_derivative(qr, vr) != 0.0))
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
                d = self._lean(q, v, Q) if self.fast else None
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
            if self.fast:
                K, b = self._system(q, v, Q)[:2]
                lu, piv, x, info = _lapack.dgesv(K, b)
                if info == 0 and _sane(x):
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

    def _lean(self, q, v, Q):
        """One LU of K, its explicit inverse (K is small; the top rows Kᵢₙᵥ[:n] give ∂q̈/∂Q directly and
        turn the derivative solve K D = R into two small products), then
        ∂q̈/∂q = −Kᵢₙᵥ[:n] [Σλᵢ∂²Φᵢ; ∂(Φq q̈)/∂q + ∂(Φ̇q q̇)/∂q],  ∂q̈/∂q̇ = −2 Kᵢₙᵥ[:n, n:] Φ̇q."""
        mech, n, C = self.mech, self._n, self.mech.constraints
        K, b, J_all, Jd_all, Jd = self._system(q, v, Q)
        lu, piv, info = _lapack.dgetrf(K)
        if info != 0:
            return None
        Kinv, info = _lapack.dgetri(lu, piv, overwrite_lu=1)
        if info != 0:
            return None
        x = Kinv.dot(b)
        if not _sane(x):
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
        da_dq = tl.dot(C.weighted_hessian(q, lam))
        da_dq += tr.dot(low)
        np.negative(da_dq, out=da_dq)
        da_dv = tr.dot(Jd)
        da_dv *= -2.0
        return DynamicsLinearization(a, da_dq, da_dv, tl, lam, J_all, Jd_all, mech.independent_rows,
                                     mech.mass_matrix)


def _sane(x) -> bool:
    """Finite and not absurdly large (‖x‖ < 1e12; one BLAS call: NaN and inf compare False)."""
    return bool(x.dot(x) < 1e24)


def _ctx(ctx, mech):
    return EvalContext(mech) if ctx is None else ctx


# ----------------------------------------------------------------------------------------------
class Factor:
    """Base of all units (see the module docstring)."""

    slots: tuple = ()
    dim: int = 0
    sigmas: np.ndarray = np.zeros(0)
    name: str = "factor"
    #: error is affine in the blocks with constant Jacobians (a pre-linearized factor is exact)
    linear: bool = False
    #: affine with zero offset and parameters fixed at construction: its whitened Jacobian blocks can be
    #: stacked once (`graph.StepModel`)
    static: bool = False
    #: weight of this unit's rows in the relinearization check of the fast path (see `Jerk`)
    check_weight: float = 1.0
    #: names of the per-step parameters (measured values, known forces) an estimator may update in place;
    #: `graph.StepModel` snapshots them so an older step can be re-linearized with its own values
    params: tuple = ()

    def evaluate(self, *blocks, ctx: Optional[EvalContext] = None):
        raise NotImplementedError

    def error(self, *blocks, ctx: Optional[EvalContext] = None) -> np.ndarray:
        return self.evaluate(*blocks, ctx=ctx)[0]

    def whitened(self, *blocks, ctx: Optional[EvalContext] = None):
        e, J = self.evaluate(*blocks, ctx=ctx)
        w = 1.0 / self.sigmas
        return e * w, [Ji * w[:, None] for Ji in J]

    def copy(self) -> "Factor":
        """Shallow copy with its own parameter arrays (the mechanism is shared: it is immutable)."""
        c = copy.copy(self)
        for k, val in vars(self).items():
            if isinstance(val, np.ndarray):
                setattr(c, k, val.copy())
        return c

    def __repr__(self):
        return f"{type(self).__name__}(slots={self.slots}, dim={self.dim})"


class Prior(Factor):
    """f_prior: e = x[select] − x0 (all of x when `select` is None).  Jacobian: rows of I."""

    linear = True

    params = ('mean',)

    def __init__(self, block: str, mean, sigma, select: Optional[Sequence[int]] = None, size: Optional[int] = None):
        self.mean = np.array(mean, dtype=float).reshape(-1)
        self.slots = (block,)
        self.dim = self.mean.size
        self.size = self.dim if size is None else int(size)
        self.select = None if select is None else np.asarray(select, dtype=np.intp)
        if self.select is not None and self.select.size != self.dim:
            raise ValueError("Prior: len(select) must equal len(mean)")
        self.sigmas = _sigmas(sigma, self.dim)
        self.name = f"prior({block})"
        self._J = np.eye(self.size)[self.select] if self.select is not None else np.eye(self.size)

    def evaluate(self, x, ctx=None):
        e = (x if self.select is None else x[self.select]) - self.mean
        return e, [self._J]


class CorrelatedPrior(Factor):
    """A Gaussian prior on several blocks jointly: e = R (x − mean), x = the blocks stacked in slot order and
    R a square root of the information (Rᵀ R = P⁻¹), so e is whitened already (unit sigmas).  Jacobians:
    R's column blocks."""

    linear = True

    params = ('mean',)

    def __init__(self, blocks: Sequence[str], sizes: Sequence[int], mean, sqrt_information):
        self.mean = np.array(mean, dtype=float).reshape(-1)
        R = np.array(sqrt_information, dtype=float)
        sizes = [int(z) for z in sizes]
        if len(sizes) != len(blocks) or sum(sizes) != self.mean.size or R.shape != (self.mean.size,) * 2:
            raise ValueError(f"CorrelatedPrior: blocks {list(blocks)} of sizes {sizes}, a mean of "
                             f"{self.mean.size} and a {R.shape} square root of the information do not match")
        if not np.isfinite(R).all():
            raise ValueError("CorrelatedPrior: non-finite square root of the information")
        self.slots = tuple(blocks)
        self.dim = self.mean.size
        self.sigmas = np.ones(self.dim)
        self._R = R
        ends = np.cumsum(sizes)
        self._J = [R[:, b - z:b].copy() for z, b in zip(sizes, ends)]
        self.name = f"prior({', '.join(blocks)})"

    @classmethod
    def from_covariance(cls, blocks: Sequence[str], sizes: Sequence[int], mean, P, floor: float) -> "CorrelatedPrior":
        """The prior of covariance P, its eigenvalues raised to at least floor² (never tighter than that: a
        marginal of a constrained state is nearly singular across the constraints)."""
        lam, V = np.linalg.eigh(0.5 * (P + P.T))
        lam = np.maximum(lam, floor * floor)
        return cls(blocks, sizes, mean, (V / np.sqrt(lam)).T)

    def evaluate(self, *blocks, ctx=None):
        return self._R.dot(np.concatenate(blocks) - self.mean), self._J


class _TwoStep(Factor):
    linear = True
    static = True       # affine, zero offset, parameters fixed at construction

    def __init__(self, coefficients, names, d, sigma, title):
        """e = Σ cᵢ · blockᵢ with scalar coefficients: every Jacobian is cᵢ I."""
        self.slots = tuple(names)
        self.dim = int(d)
        self.sigmas = _sigmas(sigma, self.dim)
        self.coefficients = tuple(float(c) for c in coefficients)
        I = np.eye(self.dim)
        self._J = [c * I for c in self.coefficients]
        self.name = title

    def evaluate(self, *blocks, ctx=None):
        e = self.coefficients[0] * blocks[0]
        for c, b in zip(self.coefficients[1:], blocks[1:]):
            e = e + c * b
        return e, self._J


class EulerIntegrator(_TwoStep):
    """f_ei: e = x₁ − x₀ − Δt ẋ₀ (slots x_prev, x, xd_prev)."""

    def __init__(self, x: str, xd: str, d: int, dt: float, sigma=None):
        super().__init__((-1.0, 1.0, -dt), (prev(x), x, prev(xd)), d, sigma_or_default(sigma, "integrator"),
                         f"euler({x},{xd})")
        self.dt = dt


class TrapezoidalIntegrator(_TwoStep):
    """f_ti: e = x₁ − x₀ − Δt/2 (ẋ₀ + ẋ₁) (slots x_prev, x, xd_prev, xd)."""

    def __init__(self, x: str, xd: str, d: int, dt: float, sigma=None):
        h = 0.5 * dt
        super().__init__((-1.0, 1.0, -h, -h), (prev(x), x, prev(xd), xd), d,
                         sigma_or_default(sigma, "integrator"), f"trapezoidal({x},{xd})")
        self.dt = dt


class HermiteIntegrator(_TwoStep):
    """4th-order end-corrected trapezoid (two-point Hermite / Obreshkov formula):
    e = x₁ − x₀ − Δt/2 (ẋ₀ + ẋ₁) − Δt²/12 (ẍ₀ − ẍ₁) (slots x_prev, x, xd_prev, xd, xdd_prev, xdd).

    Local error Δt⁵/720 x⁽⁵⁾: global error O(Δt⁴), like RK4.  Used for q (with q̇, q̈) and for q̇ (with
    q̈ and the jerk j = dq̈/dt, see `Jerk`)."""

    def __init__(self, x: str, xd: str, xdd: str, d: int, dt: float, sigma=None):
        h, c = 0.5 * dt, dt * dt / 12.0
        super().__init__((-1.0, 1.0, -h, -h, -c, c), (prev(x), x, prev(xd), xd, prev(xdd), xdd), d,
                         sigma_or_default(sigma, "integrator"), f"hermite({x},{xd},{xdd})")
        self.dt = dt


class SoftEquality(_TwoStep):
    """f_eq: e = x₁ − x₀ − δ (slots x_prev, x), δ = 0 (the paper's soft equality) unless an `offset` is
    given.  Also the random walk of unknown efforts.

    With an offset the factor is a *predictive* soft equality: the estimator sets δ to the continuity
    predictor's displacement, so the factor still penalizes jumps (e.g. to the other assembly mode)
    but no longer drags the motion towards standing still (with δ = 0 and σ = 10 that drag costs ~1e-3 mm
    over the 5-s four-bar fall in the independent formulation, far above the 4th-order integrator's error).
    """

    def __init__(self, x: str, d: int, sigma=None, offset=None):
        super().__init__((-1.0, 1.0), (prev(x), x), d, sigma_or_default(sigma, "soft_equality"), f"equality({x})")
        self.offset = None if offset is None else np.array(offset, dtype=float).reshape(self.dim)
        if self.offset is not None:
            self.static = False          # the offset is a per-step parameter
            self.params = ("offset",)

    def evaluate(self, x0, x1, ctx=None):
        e = x1 - x0
        if self.offset is not None:
            e = e - self.offset
        return e, self._J


# ----------------------------------------------------------------------------------------------
class PositionConstraints(Factor):
    """f_pc: e = Φ(q); ∂e/∂q = Φq."""

    def __init__(self, mech: Mechanism, sigma=None):
        self.mech = mech
        self.slots = ("q",)
        self.dim = mech.m
        self.sigmas = _sigmas(sigma_or_default(sigma, "position_constraints"), self.dim)
        self.name = "position_constraints"

    def evaluate(self, q, ctx=None):
        phi, J = _ctx(ctx, self.mech).phi_and_jacobian(q)
        return phi, [J]

    def error(self, q, ctx=None):
        return _ctx(ctx, self.mech).phi_and_jacobian(q)[0]


class VelocityConstraints(Factor):
    """f_vc: e = Φq q̇; ∂e/∂q = ∂(Φq q̇)/∂q = Φ̇q, ∂e/∂q̇ = Φq."""

    def __init__(self, mech: Mechanism, sigma=None):
        self.mech = mech
        self.slots = ("q", "v")
        self.dim = mech.m
        self.sigmas = _sigmas(sigma_or_default(sigma, "velocity_constraints"), self.dim)
        self.name = "velocity_constraints"

    def evaluate(self, q, v, ctx=None):
        c = _ctx(ctx, self.mech)
        J = c.phi_and_jacobian(q)[1]
        Jd = c.jacobian_dot(q, v)
        return J.dot(v), [Jd, J]

    def error(self, q, v, ctx=None):
        return _ctx(ctx, self.mech).phi_and_jacobian(q)[1].dot(v)


class AccelerationConstraints(Factor):
    """f_ac: e = Φq q̈ + Φ̇q q̇;
    ∂e/∂q = ∂(Φq q̈)/∂q + ∂(Φ̇q q̇)/∂q, ∂e/∂q̇ = 2 Φ̇q, ∂e/∂q̈ = Φq."""

    def __init__(self, mech: Mechanism, sigma=None):
        self.mech = mech
        self.slots = ("q", "v", "a")
        self.dim = mech.m
        self.sigmas = _sigmas(sigma_or_default(sigma, "acceleration_constraints"), self.dim)
        self.name = "acceleration_constraints"

    def evaluate(self, q, v, a, ctx=None):
        c = _ctx(ctx, self.mech)
        C = self.mech.constraints
        J = c.phi_and_jacobian(q)[1]
        Jd = c.jacobian_dot(q, v)
        Jq = C.hessian_vector(q, a) + C.jacobian_dot_times_v_derivative(q, v)
        return J @ a + Jd @ v, [Jq, 2.0 * Jd, J]


# ----------------------------------------------------------------------------------------------
class ForwardDynamics(Factor):
    """f_dyn: e = q̈(q, q̇; Q) − a with the known generalized forces Q (gravity + commanded efforts).
    Jacobians ∂q̈/∂q, ∂q̈/∂q̇ from `forward_dynamics_jacobians`, −I for a."""

    params = ('Q',)

    def __init__(self, mech: Mechanism, Q=None, sigma=None):
        self.mech = mech
        self.Q = np.array(mech.gravity_forces if Q is None else Q, dtype=float)
        self.slots = ("q", "v", "a")
        self.dim = mech.n
        self.sigmas = _sigmas(sigma_or_default(sigma, "dynamics"), self.dim)
        self._minus_I = -np.eye(mech.n)
        self.name = "forward_dynamics"

    def evaluate(self, q, v, a, ctx=None):
        d = _ctx(ctx, self.mech).dynamics(q, v, self.Q)
        return d.a - a, [d.da_dq, d.da_dv, self._minus_I]

    def error(self, q, v, a, ctx=None):
        return _ctx(ctx, self.mech).acceleration(q, v, self.Q) - a


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
        self.sigmas = _sigmas(sigma_or_default(sigma, "dynamics"), self.dim)
        self._minus_I = -np.eye(mech.n)
        self.name = "inverse_dynamics"

    def forces(self, tau):
        Q = self.Q_known.copy()
        Q[self.actuated] += tau
        return Q

    def evaluate(self, q, v, a, tau, ctx=None):
        d = _ctx(ctx, self.mech).dynamics(q, v, self.forces(tau))
        return d.a - a, [d.da_dq, d.da_dv, self._minus_I, d.da_dQ[:, self.actuated]]

    def error(self, q, v, a, tau, ctx=None):
        return _ctx(ctx, self.mech).acceleration(q, v, self.forces(tau)) - a


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
        self.sigmas = _sigmas(sigma_or_default(sigma, "dynamics"), self.dim)
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
        d = _ctx(ctx, self.mech).dynamics(q, v, self._forces(tau[0] if tau else None))
        jp = d.da_dq @ v + d.da_dv @ a + d.da_dQ @ self.Qdot
        Jv, Ja = -d.da_dq, -d.da_dv
        if self.select is not None:
            jp, Jv, Ja = jp[self.select], Jv[self.select], Ja[self.select]
        Js = [self._zq, Jv, Ja, self._I] + ([self._ztau] if self.efforts else [])
        return j - jp, Js


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
        self.lin_prev = lin_prev
        self.efforts = bool(efforts)
        self.actuated = np.array(mech.actuated if actuated is None else actuated, dtype=np.intp)
        self.dt = float(dt)
        self.slots = ("q_prev", "v_prev", "a_prev", "q", "v", "a") + (("tau_prev", "tau") if efforts else ())
        self.dim = n
        self.sigmas = _sigmas(sigma_or_default(sigma, "integrator"), self.dim)
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

    def dynamics_prev(self, q0, v0, tau0=None, ctx=None):
        """The dynamics linearization j₀ is built on (at ``lin_prev``, else at (q₀, q̇₀))."""
        c = _ctx(ctx, self.mech)
        if self.lin_prev is None:
            return c.dynamics(q0, v0, self.forces(self.Q_prev, tau0))
        qb, vb, tb = self.lin_prev
        return c.dynamics(qb, vb, self.forces(self.Q_prev, tb))

    def evaluate(self, q0, v0, a0, q1, v1, a1, *tau, ctx=None):
        c = _ctx(ctx, self.mech)
        d0 = self.dynamics_prev(q0, v0, tau[0] if tau else None, ctx=c)
        d1 = c.dynamics(q1, v1, self.forces(self.Q, tau[1] if tau else None))
        j0 = self.jerk(d0, v0, a0, self.Qdot_prev)
        j0 -= self.jerk(d1, v1, a1, self.Qdot)
        h2, cc = self._h2, self._c
        e = v1 - v0
        e -= h2 * (a0 + a1)
        e -= cc * j0
        Js = [self._zq, self._mI - cc * d0.da_dq, self._mh2I - cc * d0.da_dv,
              self._zq, self._I + cc * d1.da_dq, self._mh2I + cc * d1.da_dv]
        if self.efforts:
            Js += [self._ztau, self._ztau]
        return e, Js


# ----------------------------------------------------------------------------------------------
class _IndepBase(Factor):
    def __init__(self, mech, z, sigma, key, slots, title):
        self.mech = mech
        self.z = np.asarray(z, dtype=np.intp)
        d = self.z.size
        self.slots = slots
        self.dim = mech.m + d
        s = sigma_or_default(sigma, key)
        self.sigmas = _sigmas(s, self.dim)
        self._B = np.eye(mech.n)[self.z]                                 # selector I_idx (d × n)
        self._zero_n = np.zeros((d, mech.n))
        self._zero_d = np.zeros((mech.m, d))
        self._minus_I = np.vstack([self._zero_d, -np.eye(d)])              # ∂e/∂z = [0; −I]
        self.name = title


class PositionConstraintsIndep(_IndepBase):
    """f_pc^i: e = [Φ(q); q[z] − z] (slots q, z); ∂e/∂q = [Φq; I_idx], ∂e/∂z = [0; −I]."""

    def __init__(self, mech: Mechanism, z: Sequence[int], sigma=None):
        super().__init__(mech, z, sigma, "position_constraints", ("q", "z"), "position_constraints_indep")

    def evaluate(self, q, zz, ctx=None):
        phi, J = _ctx(ctx, self.mech).phi_and_jacobian(q)
        return np.concatenate((phi, q[self.z] - zz)), [np.vstack((J, self._B)), self._minus_I]


class VelocityConstraintsIndep(_IndepBase):
    """f_vc^i: e = [Φq q̇; q̇[z] − ż] (slots q, v, zd); ∂e/∂q = [Φ̇q; 0], ∂e/∂q̇ = [Φq; I_idx], ∂e/∂ż = [0; −I]."""

    def __init__(self, mech: Mechanism, z: Sequence[int], sigma=None):
        super().__init__(mech, z, sigma, "velocity_constraints", ("q", "v", "zd"), "velocity_constraints_indep")

    def evaluate(self, q, v, zd, ctx=None):
        c = _ctx(ctx, self.mech)
        J = c.phi_and_jacobian(q)[1]
        Jd = c.jacobian_dot(q, v)
        return (np.concatenate((J @ v, v[self.z] - zd)),
                [np.vstack((Jd, self._zero_n)), np.vstack((J, self._B)), self._minus_I])


class AccelerationConstraintsIndep(_IndepBase):
    """f_ac^i: e = [Φq q̈ + Φ̇q q̇; q̈[z] − z̈] (slots q, v, a, zdd)."""

    def __init__(self, mech: Mechanism, z: Sequence[int], sigma=None):
        super().__init__(mech, z, sigma, "acceleration_constraints", ("q", "v", "a", "zdd"),
                         "acceleration_constraints_indep")

    def evaluate(self, q, v, a, zdd, ctx=None):
        c = _ctx(ctx, self.mech)
        C = self.mech.constraints
        J = c.phi_and_jacobian(q)[1]
        Jd = c.jacobian_dot(q, v)
        Jq = C.hessian_vector(q, a) + C.jacobian_dot_times_v_derivative(q, v)
        return (np.concatenate((J @ a + Jd @ v, a[self.z] - zdd)),
                [np.vstack((Jq, self._zero_n)), np.vstack((2.0 * Jd, self._zero_n)), np.vstack((J, self._B)),
                 self._minus_I])


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
        self.sigmas = _sigmas(sigma_or_default(sigma, "dynamics"), self.dim)
        self._minus_I = -np.eye(self.dim)
        self.name = "forward_dynamics_indep"

    def evaluate(self, q, v, zdd, ctx=None):
        d = _ctx(ctx, self.mech).dynamics(q, v, self.Q)
        return d.a[self.z] - zdd, [d.da_dq[self.z], d.da_dv[self.z], self._minus_I]

    def error(self, q, v, zdd, ctx=None):
        return _ctx(ctx, self.mech).acceleration(q, v, self.Q)[self.z] - zdd


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
        self.sigmas = _sigmas(sigma_or_default(sigma, "dynamics"), self.dim)
        self._minus_I = -np.eye(self.dim)
        self.name = "inverse_dynamics_indep"

    def forces(self, tau):
        Q = self.Q_known.copy()
        Q[self.actuated] += tau
        return Q

    def evaluate(self, q, v, zdd, tau, ctx=None):
        d = _ctx(ctx, self.mech).dynamics(q, v, self.forces(tau))
        z = self.z
        return d.a[z] - zdd, [d.da_dq[z], d.da_dv[z], self._minus_I, d.da_dQ[z][:, self.actuated]]

    def error(self, q, v, zdd, tau, ctx=None):
        return _ctx(ctx, self.mech).acceleration(q, v, self.forces(tau))[self.z] - zdd


# ----------------------------------------------------------------------------------------------
class Encoder(Factor):
    """Encoder on one coordinate: e = q[c] − reading.  On a relative angle the difference is wrapped to
    (−π, π], so a reading in any 2π range matches a continuous angle."""

    params = ('value',)

    def __init__(self, mech: Mechanism, coordinate, value: float = 0.0, sigma: float = 1e-3):
        self.coordinate = _coordinate(mech, coordinate)
        self.angle = self.coordinate >= mech.n_point_coordinates
        self.linear = not self.angle         # the wrap makes an angle encoder piecewise affine
        self.value = float(value)
        self.slots = ("q",)
        self.dim = 1
        self.sigmas = _sigmas(sigma, 1)
        self._J = np.zeros((1, mech.n))
        self._J[0, self.coordinate] = 1.0
        self.name = f"encoder({mech.coordinate_names[self.coordinate]})"

    def evaluate(self, q, ctx=None):
        d = q[self.coordinate] - self.value
        if self.angle:
            d -= TWO_PI * math.floor((d + math.pi) / TWO_PI)
        return np.array([d]), [self._J]


def _coordinate(mech: Mechanism, coordinate) -> int:
    """Coordinate index from an index or a name (`Mechanism.coordinate_names`)."""
    if isinstance(coordinate, str):
        return mech.coordinate_index(coordinate)
    c = int(coordinate)
    if not 0 <= c < mech.n:
        raise ValueError(f"coordinate index {c} out of range 0..{mech.n - 1}")
    return c


class ObservedCoordinate(Factor):
    """Generic observation of one named coordinate's position (order 0), velocity (1) or acceleration (2):
    e = x[c] − reading with x = q, q̇ or q̈.  `coordinate` is an index or a name."""

    linear = True
    BLOCKS = ("q", "v", "a")

    params = ('value',)

    def __init__(self, mech: Mechanism, coordinate, order=0, value: float = 0.0, sigma: float = 1e-3):
        self.coordinate = _coordinate(mech, coordinate)
        self.order = {"q": 0, "position": 0, "v": 1, "velocity": 1, "a": 2, "acceleration": 2}.get(order, order)
        if self.order not in (0, 1, 2):
            raise ValueError(f"order must be 0/'position', 1/'velocity' or 2/'acceleration' (got {order!r})")
        self.value = float(value)
        self.slots = (self.BLOCKS[self.order],)
        self.dim = 1
        self.sigmas = _sigmas(sigma, 1)
        self._J = np.zeros((1, mech.n))
        self._J[0, self.coordinate] = 1.0
        self.name = f"observed_{self.slots[0]}({mech.coordinate_names[self.coordinate]})"

    def evaluate(self, x, ctx=None):
        return np.array([x[self.coordinate] - self.value]), [self._J]


class Gyroscope(Factor):
    """Gyroscope on a body: e = ω(q, q̇) − reading with ω = (Δ × Δ̇)/|Δ|², Δ = p₁ − p₀ of the body's first
    two points (`Mechanism.body_angular_rate`).  With r = |Δ|²:
    ∂ω/∂Δ̇ = (−Δy, Δx)/r,  ∂ω/∂Δ = (Δ̇y, −Δ̇x)/r − 2ω Δ/r, scattered with ±1 onto the point columns."""

    params = ('value',)

    def __init__(self, mech: Mechanism, body: int, value: float = 0.0, sigma: float = 1e-2):
        self.mech = mech
        self.body = int(body)
        b = mech.spec.bodies[self.body]
        i, j = b.points[0], b.points[1]
        self.cols_i, self.cols_j = mech.point_columns[i], mech.point_columns[j]
        self._ci, self._cj = tuple(int(c) for c in self.cols_i), tuple(int(c) for c in self.cols_j)
        self.fixed_i = mech.spec.points[i] if self.cols_i[0] < 0 else None
        self.fixed_j = mech.spec.points[j] if self.cols_j[0] < 0 else None
        self.value = float(value)
        self.slots = ("q", "v")
        self.dim = 1
        self.sigmas = _sigmas(sigma, 1)
        self.n = mech.n
        self.name = f"gyroscope(body {self.body})"

    def _point(self, x, cols, fixed, rate):
        if fixed is not None:
            return (0.0, 0.0) if rate else (fixed.x, fixed.y)
        return x[cols[0]], x[cols[1]]

    def evaluate(self, q, v, ctx=None):
        xi, yi = self._point(q, self._ci, self.fixed_i, False)
        xj, yj = self._point(q, self._cj, self.fixed_j, False)
        vxi, vyi = self._point(v, self._ci, self.fixed_i, True)
        vxj, vyj = self._point(v, self._cj, self.fixed_j, True)
        dx, dy, ddx, ddy = xj - xi, yj - yi, vxj - vxi, vyj - vyi
        r = dx * dx + dy * dy
        w = (dx * ddy - dy * ddx) / r
        gqx, gqy = (ddy - 2.0 * w * dx) / r, (-ddx - 2.0 * w * dy) / r     # ∂ω/∂Δ
        gvx, gvy = -dy / r, dx / r                                          # ∂ω/∂Δ̇
        # new arrays at every call (the step model keeps the ones it has written by identity);
        # plain scalar stores: this runs at every step of a 1 kHz loop
        Jq, Jv = np.zeros((1, self.n)), np.zeros((1, self.n))
        jq, jv = Jq[0], Jv[0]
        if self.fixed_j is None:
            cx, cy = self._cj
            jq[cx] += gqx
            jq[cy] += gqy
            jv[cx] += gvx
            jv[cy] += gvy
        if self.fixed_i is None:
            cx, cy = self._ci
            jq[cx] -= gqx
            jq[cy] -= gqy
            jv[cx] -= gvx
            jv[cy] -= gvy
        return np.array([w - self.value]), [Jq, Jv]
