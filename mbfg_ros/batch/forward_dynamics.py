"""Batch forward dynamics (`batch_forward_dynamics`): the whole trajectory under given efforts as one
Levenberg–Marquardt problem, in dependent (paper Fig. 2) or independent coordinates (Fig. 3), from an
RK4 initial guess."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import numpy as np

import mbfg_ros.factors as F
from mbfg_ros.batch.engines import solve
from mbfg_ros.batch.problem import LMReport, LMSettings, Problem
from mbfg_ros.batch.trajectories import Motion
from mbfg_ros.dynamics import kinematics
from mbfg_ros.dynamics.constrained import forward_dynamics
from mbfg_ros.dynamics.coordinates import choose_independent
from mbfg_ros.model.mechanism import Mechanism

__all__ = ["ForwardDynamicsResult", "batch_forward_dynamics"]


@dataclass
class ForwardDynamicsResult(Motion):
    efforts: np.ndarray       # (N, n_actuated) applied efforts
    report: LMReport
    z: Optional[np.ndarray] = None   # independent coordinates (N, d) (independent formulation)


def batch_forward_dynamics(mech: Mechanism, dt: float, steps: int, efforts=None, q0=None, v0=None,
                           formulation: str = "dependent", independent=None,
                           sigmas: Optional[Dict[str, float]] = None, settings: Optional[LMSettings] = None,
                           engine: str = "sparse") -> ForwardDynamicsResult:
    """Forward dynamics of the whole trajectory t_k = k·dt, k = 0..steps, as ONE batch LM problem.

    efforts: (steps+1, n_actuated) actuator efforts per step (default zero).  q0 (default the YAML
    pose, made consistent by the position problem) and v0 (default rest) are pinned by priors.
    formulation 'dependent': variables q, q̇, q̈ per step; factors f_pc, f_vc, f_dyn, trapezoidal
    q–q̇ and q̇–q̈ (paper Fig. 2).  'independent': variables q, q̇, q̈ and z, ż, z̈ per step; factors
    f_pc^i, f_vc^i, f_ac^i, f_dyn^i, trapezoidal on z, soft equality on q (paper Fig. 3).  `independent` names the
    independent coordinates (names or indices); by default `coordinates.choose_independent` at the
    initial pose, preferring the actuated coordinates.
    The initial guess is a semi-implicit Euler pass with the closed-form q̈.
    """
    sig = F.default_sigmas()
    sig.update(sigmas or {})
    settings = settings or LMSettings()
    N = int(steps) + 1
    if N < 2:
        raise ValueError("need at least one step")
    na = len(mech.actuated)
    E = np.zeros((N, na)) if efforts is None else np.asarray(efforts, float).reshape(N, na)
    n = mech.n
    q_start = np.array(mech.q0 if q0 is None else q0, dtype=float)
    q_start = kinematics.solve_positions(mech, q_start).q
    v_start = np.zeros(n) if v0 is None else kinematics.solve_velocities(mech, q_start, v_guess=v0)
    Qs = [mech.generalized_forces(E[k]) for k in range(N)]

    # initial guess: classical RK4 with the closed-form q̈ and projection onto the constraints.  Its
    # O(dt⁴) error is far below the trapezoidal graph's own O(dt²), so LM only has to apply that
    # small correction (from a crude guess the whole-trajectory problem converges very slowly).
    q = np.empty((N, n))
    v = np.empty((N, n))
    a = np.empty((N, n))
    q[0], v[0] = q_start, v_start
    fd = lambda qq, vv, QQ: forward_dynamics(mech, qq, vv, QQ)
    a[0] = fd(q[0], v[0], Qs[0])
    for k in range(1, N):
        Qm = 0.5 * (Qs[k - 1] + Qs[k])
        q1, v1, a1 = q[k - 1], v[k - 1], a[k - 1]
        q2, v2 = q1 + 0.5 * dt * v1, v1 + 0.5 * dt * a1
        a2 = fd(q2, v2, Qm)
        q3, v3 = q1 + 0.5 * dt * v2, v1 + 0.5 * dt * a2
        a3 = fd(q3, v3, Qm)
        q4, v4 = q1 + dt * v3, v1 + dt * a3
        a4 = fd(q4, v4, Qs[k])
        qn = q1 + dt / 6.0 * (v1 + 2 * v2 + 2 * v3 + v4)
        vn = v1 + dt / 6.0 * (a1 + 2 * a2 + 2 * a3 + a4)
        q[k] = _newton_polish(mech, qn)
        v[k] = kinematics.solve_velocities(mech, q[k], v_guess=vn)
        a[k] = fd(q[k], v[k], Qs[k])

    prob = Problem(mech)
    t = dt * np.arange(N)
    for k in range(N):
        prob.add_variable(("q", k), q[k])
        prob.add_variable(("v", k), v[k])
        prob.add_variable(("a", k), a[k])
    prob.add_factor(F.Prior("q", q_start, sig["prior_q0"]), [("q", 0)])
    prob.add_factor(F.Prior("v", v_start, sig["prior_v0"]), [("v", 0)])
    trap_q = F.TrapezoidalIntegrator("q", "v", n, dt, sig["integrator"])
    trap_v = F.TrapezoidalIntegrator("v", "a", n, dt, sig["integrator"])
    z_idx = None
    if formulation == "dependent":
        pos = F.PositionConstraints(mech, sig["position_constraints"])
        vel = F.VelocityConstraints(mech, sig["velocity_constraints"])
        dyn = F.ForwardDynamics(mech, sigma=sig["dynamics"])
        for k in range(N):
            prob.add_factor(pos, [("q", k)])
            prob.add_factor(vel, [("q", k), ("v", k)])
            prob.add_factor(dyn, [("q", k), ("v", k), ("a", k)], (Qs[k],))
            if k:
                prob.add_factor(trap_q, [("q", k - 1), ("q", k), ("v", k - 1), ("v", k)])
                prob.add_factor(trap_v, [("v", k - 1), ("v", k), ("a", k - 1), ("a", k)])
    elif formulation == "independent":
        if independent is not None and len(independent):
            z_idx = [mech.coordinate_index(c) if isinstance(c, str) else int(c) for c in independent]
        else:
            z_idx = [int(i) for i in choose_independent(mech, q_start, prefer=mech.actuated)]
        d = len(z_idx)
        for k in range(N):
            prob.add_variable(("z", k), q[k, z_idx])
            prob.add_variable(("zd", k), v[k, z_idx])
            prob.add_variable(("zdd", k), a[k, z_idx])
        pos = F.PositionConstraintsIndep(mech, z_idx, sig["position_constraints"])
        vel = F.VelocityConstraintsIndep(mech, z_idx, sig["velocity_constraints"])
        acc = F.AccelerationConstraintsIndep(mech, z_idx, sig["acceleration_constraints"])
        eq = F.SoftEquality("q", n, sig["soft_equality"])
        trap_z = F.TrapezoidalIntegrator("z", "zd", d, dt, sig["integrator"])
        trap_zd = F.TrapezoidalIntegrator("zd", "zdd", d, dt, sig["integrator"])
        dyn = F.ForwardDynamics(mech, sigma=sig["dynamics"], z=z_idx)
        for k in range(N):
            prob.add_factor(pos, [("q", k), ("z", k)])
            prob.add_factor(vel, [("q", k), ("v", k), ("zd", k)])
            prob.add_factor(acc, [("q", k), ("v", k), ("a", k), ("zdd", k)])
            prob.add_factor(dyn, [("q", k), ("v", k), ("zdd", k)], (Qs[k],))
            if k:
                prob.add_factor(eq, [("q", k - 1), ("q", k)])
                prob.add_factor(trap_z, [("z", k - 1), ("z", k), ("zd", k - 1), ("zd", k)])
                prob.add_factor(trap_zd, [("zd", k - 1), ("zd", k), ("zdd", k - 1), ("zdd", k)])
    else:
        raise ValueError(f"formulation must be 'dependent' or 'independent' (got '{formulation}')")
    report = solve(prob, settings, engine)
    get = lambda name: np.array([prob.values[(name, k)] for k in range(N)])
    return ForwardDynamicsResult(t, get("q"), get("v"), get("a"), E, report,
                                 get("z") if z_idx is not None else None)


def _newton_polish(mech: Mechanism, q, iterations: int = 3):
    """A few minimum-norm Newton steps onto Φ(q) = 0 (q is already close)."""
    C = mech.constraints
    for _ in range(iterations):
        phi, J = C.phi_and_jacobian(q)
        if np.abs(phi).max(initial=0.0) < 1e-13:
            break
        q = q + np.linalg.lstsq(J, -phi, rcond=None)[0]
    return q
