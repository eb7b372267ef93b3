"""Staged batch inverse dynamics (paper §7.2, `staged_inverse_dynamics`).

For a prescribed trajectory of the actuated coordinates, stage 1 solves q only (trajectory priors on
the actuated entries, position constraints, soft equality between consecutive q), stage 2 adds q̇, q̈
and the trapezoidal integrators, stage 3 the velocity constraints, stage 4 the efforts τ_k as real
variables of the inverse-dynamics factor (error q̈(q, q̇; Qg + Eτ) − q̈ over the keys q_k, q̇_k, q̈_k,
τ_k).  Each stage starts from the previous result; stage 1 from per-step position problems with
continuation (`trajectories.position_continuation`), stage 2 from finite differences, stage 4 from the
closed-form efforts at the stage-3 motion.  With τ free, the trapezoidal rule leaves a sawtooth (−1)^k
in q̈ (and τ) undetermined; a weak second-difference prior on q̇ and q̈ (`factors.SecondDifference`)
fixes it without biasing the ends (a soft equality q̈_k → q̈_k+1 pulls the end values by O(Δt·jerk)).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional

import numpy as np

import mbfg_ros.factors as F
from mbfg_ros.batch.engines import solve
from mbfg_ros.batch.problem import LMSettings, Problem
from mbfg_ros.batch.trajectories import Motion, closed_form_efforts, position_continuation
from mbfg_ros.dynamics.batched import inverse_dynamics_many
from mbfg_ros.model.mechanism import Mechanism

__all__ = ["InverseDynamicsSigmas", "StageReport", "InverseDynamicsResult", "InverseDynamicsUnits",
           "staged_inverse_dynamics"]


@dataclass
class InverseDynamicsSigmas:
    """Noise sigmas of the staged inverse-dynamics graph (only ratios matter)."""
    trajectory: float = 1e-5            # prior on the actuated coordinates (the prescribed trajectory)
    position_constraints: float = 1e-3  # Φ(q)
    velocity_constraints: float = 1e-3  # Φq q̇
    integrator: float = 1e-3            # trapezoidal q–q̇ and q̇–q̈
    dynamics: float = 1e-3              # inverse-dynamics factor q̈(q, q̇; Qg + Eτ) − q̈
    soft_equality: float = 10.0         # q_k → q_k+1 (keeps the branch)
    smoothness: float = 1e3             # second differences of q̇ and q̈ (fix the trapezoid's sawtooth modes)


@dataclass
class StageReport:
    stage: int
    variables: int
    factors: int
    iterations: int
    evaluations: int
    initial_error: float
    final_error: float
    converged: bool
    seconds: float            # whole stage: initial guess, graph construction and LM


@dataclass
class InverseDynamicsResult(Motion):
    tau: np.ndarray           # (N, n_actuated), actuator order
    stages: List[StageReport] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return float(sum(s.seconds for s in self.stages))


class InverseDynamicsUnits:
    """The factor units of the staged inverse-dynamics graph: one shared unit object per kind (the engine
    stacks the Jacobians of a shared linear unit once), the trajectory prior's included (its means per step)."""

    def __init__(self, mech: Mechanism, dt: float, sigmas: InverseDynamicsSigmas):
        n = mech.n
        self.mech, self.sigmas = mech, sigmas
        self.position = F.PositionConstraints(mech, sigmas.position_constraints)
        self.velocity = F.VelocityConstraints(mech, sigmas.velocity_constraints)
        self.inverse_dynamics = F.InverseDynamics(mech, sigma=sigmas.dynamics)
        self.trapezoidal_q = F.TrapezoidalIntegrator("q", "v", n, dt, sigmas.integrator)
        self.trapezoidal_v = F.TrapezoidalIntegrator("v", "a", n, dt, sigmas.integrator)
        self.soft_equality = F.SoftEquality("q", n, sigmas.soft_equality)
        self.smoothness_v = F.SecondDifference("v", n, sigmas.smoothness)
        self.smoothness_a = F.SecondDifference("a", n, sigmas.smoothness)
        #: the prior on the actuated coordinates (the prescribed trajectory), each step's row its mean
        self.trajectory = F.Prior("q", np.zeros(len(mech.actuated)), sigmas.trajectory, select=mech.actuated, size=n)


def _finite_difference(x, dt):
    return np.gradient(x, dt, axis=0, edge_order=2)


def staged_inverse_dynamics(mech: Mechanism, trajectory, dt: float, t0: float = 0.0,
                            sigmas: Optional[InverseDynamicsSigmas] = None,
                            settings: Optional[LMSettings] = None, engine: str = "sparse",
                            assembly_mode=None, q_start=None, stages: int = 4,
                            progress: Optional[Callable[[int], None]] = None) -> InverseDynamicsResult:
    """The paper's four-stage batch inverse dynamics for prescribed actuated coordinates.

    trajectory: (N, n_actuated) values of the actuated coordinates (actuator order) at t0 + k·dt.
    Returns q, q̇, q̈ (N, n) and the efforts τ (N, n_actuated); `stages` < 4 stops early (τ is NaN).
    `assembly_mode` (±1 per indicator) picks the branch of the first position problem, whose
    initial guess is `q_start` (default: the YAML pose).
    """
    mech_act = list(mech.actuated)
    traj = np.asarray(trajectory, dtype=float)
    traj = traj.reshape(len(traj), -1)
    N = len(traj)
    if traj.shape[1] != len(mech_act) or len(mech_act) == 0:
        raise ValueError(f"trajectory must have one column per actuated coordinate ({len(mech_act)}), "
                         f"got shape {traj.shape}")
    if N < 3:
        raise ValueError("the trajectory needs at least 3 samples")
    if not (dt > 0 and math.isfinite(dt)):
        raise ValueError(f"dt must be > 0 (got {dt})")
    sigmas = sigmas or InverseDynamicsSigmas()
    settings = settings or LMSettings()
    U = InverseDynamicsUnits(mech, dt, sigmas)
    t = t0 + dt * np.arange(N)
    n = mech.n
    prob = Problem(mech)
    reports: List[StageReport] = []

    def run(stage, t_start):
        rep = solve(prob, settings, engine)
        reports.append(StageReport(stage, len(prob.keys), len(prob.factors), rep.iterations, rep.evaluations,
                                   rep.initial_error, rep.final_error, rep.converged,
                                   time.perf_counter() - t_start))
        if progress is not None:
            progress(stage)

    # --- stage 1: q only ----------------------------------------------------------------------
    ts = time.perf_counter()
    q_init = position_continuation(mech, traj, q_start, assembly_mode)
    steps = np.arange(N)
    prob.add_variables("q", q_init)
    prob.add_factors(U.trajectory, [("q", 0)], steps, [(row,) for row in traj])
    prob.add_factors(U.position, [("q", 0)], steps)
    prob.add_factors(U.soft_equality, [("q", -1), ("q", 0)], steps[1:])
    run(1, ts)
    get = lambda name: np.array([prob.values[(name, k)] for k in range(N)])
    q = get("q")
    if stages < 2:
        nan = np.full((N, n), np.nan)
        return InverseDynamicsResult(t, q, nan, nan.copy(), np.full((N, len(mech_act)), np.nan), reports)

    # --- stage 2: q̇, q̈ with trapezoidal integrators --------------------------------------------
    ts = time.perf_counter()
    v_init = _finite_difference(q, dt)
    a_init = _finite_difference(v_init, dt)
    prob.add_variables("v", v_init)
    prob.add_variables("a", a_init)
    prob.add_factors(U.trapezoidal_q, [("q", 0), ("q", 1), ("v", 0), ("v", 1)], steps[:-1])
    prob.add_factors(U.trapezoidal_v, [("v", 0), ("v", 1), ("a", 0), ("a", 1)], steps[:-1])
    prob.add_factors(U.smoothness_v, [("v", -1), ("v", 0), ("v", 1)], steps[1:-1])
    prob.add_factors(U.smoothness_a, [("a", -1), ("a", 0), ("a", 1)], steps[1:-1])
    run(2, ts)

    # --- stage 3: velocity constraints --------------------------------------------------------------
    if stages >= 3:
        ts = time.perf_counter()
        prob.add_factors(U.velocity, [("q", 0), ("v", 0)], steps)
        run(3, ts)

    # --- stage 4: efforts as variables of the inverse-dynamics factor -------------------------------
    tau = np.full((N, len(mech_act)), np.nan)
    if stages >= 4:
        ts = time.perf_counter()
        q3, v3, a3 = get("q"), get("v"), get("a")
        tau0 = inverse_dynamics_many(mech, q3, v3, a3)
        redo = ~np.all(np.isfinite(tau0), axis=1)
        if redo.any():
            tau0[redo] = closed_form_efforts(mech, q3[redo], v3[redo], a3[redo])
        prob.add_variables("tau", tau0)
        prob.add_factors(U.inverse_dynamics, [("q", 0), ("v", 0), ("a", 0), ("tau", 0)], steps)
        run(4, ts)
        tau = get("tau")
    return InverseDynamicsResult(t, get("q"), get("v"), get("a"), tau, reports)
