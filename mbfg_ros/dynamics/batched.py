"""The all-steps evaluation cache: the quantities of `dynamics.cache.EvalContext` for N steps at once
(numpy arrays with the step as leading axis), for the batch solvers that evaluate the same factor at
every step of a trajectory.

* Φ, Φq, Φ̇q = ∂(Φq w)/∂q and ∂(Φ̇q q̇)/∂q for N configurations are the mechanism's `ConstraintSet` itself (the
  kernel's many-state calls, one C call for all steps): no batched copy of them.
* `dynamics_many` – q̈(q, q̇; Q) and its exact first derivatives for N steps through the per-step forms (the
  compiled kernel, else numpy's): the batch keeps no formula of its own.
* `BatchContext` – memo of Φ/Φq and Φ̇q of one evaluation keyed by the columns the blocks come from, so the
  factors of one evaluation share them (as `EvalContext` does within a step), and their dynamics.
* `assembly_modes`, `angles_consistent`, `newton_positions`, `inverse_dynamics_many`: kinematics and
  closed-form inverse dynamics over many steps.

The factor classes evaluate themselves over all steps with these (`Factor.vectorized`).
"""

from __future__ import annotations

from typing import Dict, Optional

import numpy as np

from mbfg_ros import native
from mbfg_ros.dynamics.constrained import forward_dynamics, forward_dynamics_jacobians
from mbfg_ros.model.constraints import ConstraintSet
from mbfg_ros.model.mechanism import Mechanism

__all__ = ["dynamics_many", "BatchContext", "assembly_modes", "angles_consistent",
           "newton_positions", "inverse_dynamics_many"]

def dynamics_many(mech: Mechanism, q, v, Q, force_columns=None, kernel=None, need_jacobians: bool = True):
    """q̈ (N, n) and, with `need_jacobians`, ∂q̈/∂q, ∂q̈/∂q̇ (N, n, n) and ∂q̈/∂Q[:, force_columns] (N, n, s) at N
    states, one step at a time through the per-step forms: the compiled kernel's (`kernel`, a
    `native.mechanism_kernel` of `mech`; one C call per step is no slower than batched numpy solves:
    docs/decisions.md) where it solves the step, else `constrained.forward_dynamics_jacobians` (the
    null-space solver at a singular augmented matrix); no copy of the formulas of its own.  Q is without the
    actuators' friction (applied by either form).  A step neither form solves is NaN."""
    N, n, m = q.shape[0], mech.n, mech.m
    cols = np.arange(n) if force_columns is None else np.asarray(force_columns, np.intp)
    a = np.empty((N, n))
    if need_jacobians:
        dq, dv, dQ = np.empty((N, n, n)), np.empty((N, n, n)), np.empty((N, n, cols.size))
        full = np.empty((n, n))
        lam, J, Jd = np.empty(m), np.empty((m, n)), np.empty((m, n))
    q, v, Q = (np.ascontiguousarray(x, dtype=float) for x in (q, v, Q))
    for k in range(N):
        if kernel is not None:
            if need_jacobians:
                if kernel.linearize(q[k], v[k], Q[k], a[k], dq[k], dv[k], full, lam, J, Jd):
                    dQ[k] = full[:, cols]
                    continue
            elif kernel.acceleration(q[k], v[k], Q[k], a[k]):
                continue
        try:
            if need_jacobians:
                d = forward_dynamics_jacobians(mech, q[k], v[k], Q[k])
                a[k], dq[k], dv[k], dQ[k] = d.a, d.da_dq, d.da_dv, d.da_dQ[:, cols]
            else:
                a[k] = forward_dynamics(mech, q[k], v[k], Q[k])
        except (np.linalg.LinAlgError, ValueError):
            a[k] = np.nan
            if need_jacobians:
                dq[k], dv[k], dQ[k] = np.nan, np.nan, np.nan
    return (a, dq, dv, dQ) if need_jacobians else a


class BatchContext:
    """Memo of the batch quantities of one evaluation (all groups at one stacked point x).  The keys are
    the caller's names of where the stacked blocks come from (e.g. the bytes of their first columns):
    equal keys mean equal blocks."""

    def __init__(self, mech: Mechanism, cache: Optional[dict] = None):
        """`cache`: a dict kept by the caller across evaluations, holding the vectorized constraint and
        dynamics objects per mechanism."""
        self.mech = mech
        # the vectorized constraint/dynamics objects are cached per mechanism across evaluations
        cache = cache if cache is not None else {}
        key = id(mech)
        hit = cache.get(key)
        if hit is None or hit[0] is not mech:
            hit = cache[key] = (mech, mech.constraints, native.mechanism_kernel(mech))
        self.bc, self.kernel = hit[1], hit[2]
        self.memo: Dict[tuple, object] = {}

    def phi_and_jacobian(self, key, q):
        k = ("pj", key)
        if k not in self.memo:
            self.memo[k] = self.bc.phi_and_jacobian(q)
        return self.memo[k]

    def jacobian_dot(self, key, q, v):
        k = ("jd", key)
        if k not in self.memo:
            self.memo[k] = self.bc.hessian_vector(q, v)
        return self.memo[k]

    def dynamics(self, qkey, vkey, q, v, Q, force_columns):
        """q̈, ∂q̈/∂q, ∂q̈/∂q̇ and ∂q̈/∂Q[:, force_columns] for all steps (N, ...) (`dynamics_many`)."""
        return dynamics_many(self.mech, q, v, Q, force_columns, self.kernel)


# ----------------------------------------------------------------------------------------------
# kinematics and closed-form inverse dynamics over many steps
# ----------------------------------------------------------------------------------------------
def assembly_modes(mech: Mechanism, q) -> np.ndarray:
    """`Mechanism.assembly_mode` for every row of q (N, n): ±1 per indicator, (N, n_indicators)."""
    q = np.asarray(q, float)
    pts = mech.assembly_mode_points
    if not len(pts):
        return np.zeros((q.shape[0], 0), dtype=int)
    qe = np.concatenate((q, np.broadcast_to(mech.fixed_values, (q.shape[0], mech.fixed_values.size))), axis=1)
    xy = qe[:, mech.extended_point_index]                       # (N, n_points, 2)
    i, j, k = pts.T
    a, b = xy[:, j] - xy[:, i], xy[:, k] - xy[:, i]
    return np.where(a[..., 0] * b[..., 1] - a[..., 1] * b[..., 0] >= 0.0, 1, -1)


def angles_consistent(mech: Mechanism, q, tol: float = 1e-6) -> np.ndarray:
    """Per row of q (N, n): does every relative angle point along its points (p0 → p1)?  The single
    constraint row of a relative angle (`RelativeAngleConstraints`) is also satisfied by the mirrored
    point, so Newton from a poor guess can land there; this tells the two apart."""
    q = np.asarray(q, float)
    ok = np.ones(q.shape[0], bool)
    if not len(mech.relative_angle_columns):
        return ok
    qe = np.concatenate((q, np.broadcast_to(mech.fixed_values, (q.shape[0], mech.fixed_values.size))), axis=1)
    xy = qe[:, mech.extended_point_index]
    for k, r in enumerate(mech.spec.relative_angles):
        d = xy[:, r.points[1]] - xy[:, r.points[0]]
        err = np.arctan2(d[:, 1], d[:, 0]) - q[:, mech.n_point_coordinates + k]
        ok &= np.abs(np.remainder(err + np.pi, 2.0 * np.pi) - np.pi) < tol
    return ok


def newton_positions(bc: ConstraintSet, x, free, tol: float = 1e-12, iterations: int = 8,
                     jacobians: Optional[np.ndarray] = None):
    """Gauss–Newton on Φ(q) = 0 over the coordinates `free` for every row of x (N, n), in place, with
    the per-step iteration of `batch.trajectories.position_continuation` (steps stop once max |Φ| ≤ tol).
    Returns the mask of converged rows; `jacobians` (N, m, n), when given, receives Φq at each converged row
    (the convergence test computed it: the caller's next linear solves need not)."""
    N = x.shape[0]
    active = np.arange(N)
    done = np.zeros(N, bool)
    for _ in range(iterations + 1):
        if not active.size:
            break
        xa = x[active]
        phi, J = bc.phi_and_jacobian(xa)
        ok = np.abs(phi).max(axis=1, initial=0.0) <= tol
        done[active[ok]] = True
        if jacobians is not None:
            jacobians[active[ok]] = J[ok]
        active, xa, phi, J = active[~ok], xa[~ok], phi[~ok], J[~ok]
        if not active.size or _ == iterations:
            break
        Jf = J[:, :, free]
        JfT = np.swapaxes(Jf, 1, 2)
        try:
            step = np.linalg.solve(JfT @ Jf, -(JfT @ phi[:, :, None]))[..., 0]
        except np.linalg.LinAlgError:
            break
        finite = np.all(np.isfinite(step), axis=1)
        xa[:, free] += np.where(finite[:, None], step, 0.0)
        x[active] = xa
        active = active[finite]
    return done


def inverse_dynamics_many(mech: Mechanism, q, v, a, Q_known=None, constraints: Optional[ConstraintSet] = None):
    """τ per step (N, n_actuated) with M q̈ + Φqᵀλ = Q_known + E τ over the independent rows of Φq:
    one square solve per step for (λ, τ) when the actuators match the degrees of freedom (then the
    same τ as `dynamics.inverse_dynamics`, which projects onto the null space of Φq); rows whose
    system is singular (or all rows when it is not square) come back NaN for the caller to redo.  With friction
    the known forces are Q_known − F(q̇) (`model.friction`): τ is the actuators' own effort."""
    q, v, a = (np.asarray(x, float) for x in (q, v, a))
    N, n = q.shape
    act = np.asarray(mech.actuated, np.intp)
    rows = np.asarray(mech.independent_rows, np.intp)
    out = np.full((N, act.size), np.nan)
    if rows.size + act.size != n:
        return out
    bc = constraints or mech.constraints
    Q = np.broadcast_to(mech.gravity_forces if Q_known is None else np.asarray(Q_known, float), (N, n))
    if mech.friction is not None:
        Q = mech.friction.applied(Q, v)
    J = bc.phi_and_jacobian(q)[1][:, rows]
    A = np.zeros((N, n, n))
    A[:, :, :rows.size] = np.swapaxes(J, 1, 2)
    A[:, act, rows.size + np.arange(act.size)] = -1.0
    rhs = Q - a @ np.asarray(mech.mass_matrix, float).T
    try:
        x = np.linalg.solve(A, rhs[..., None])[..., 0]
    except np.linalg.LinAlgError:
        return out
    tau = x[:, rows.size:]
    good = np.all(np.abs(x) < 1e12, axis=1)
    out[good] = tau[good]
    return out
