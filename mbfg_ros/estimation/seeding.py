"""Seeding a new window: at start-up, on request (re-initialization), after a gap, a disagreement with
the readings or a numerical failure (recovery), and when the independent coordinates change.

A `Seed` says where the new window starts (position / velocity / effort guesses, the prior of the seed,
how readings are used); `Seeder.seed` solves the position problem on the assembly mode from it (readings
of coordinates fixed), the velocity problem (independent velocities and 'v:' readings fixed), q̈ from
the dynamics, and makes the new window with its first step: priors on q0, q̇0 (and a weak one on τ0),
constraints, dynamics and the readings.

Turns of the relative angles: a pose has one value of each angle per turn, and the constraints, the
encoders (their residual is wrapped) and the gyroscopes accept them all, so a new window would stay on
whatever turn its seed is on.  A seed is therefore on the turns of what it follows: an angle read by an
encoder or a 'q:' reading that the seed fixes is the reading itself, turns included (an encoder reports
the angle, not the angle modulo 2π; a single-turn encoder, declared so in the mechanism, only modulo 2π); every
other angle is on the turn of the guess, which is the last estimate (extrapolated over a short gap, or
solved on request), and for a fresh start (the drawn pose or the q0 argument) the last estimate before
the reset (`Seeder.published`).  `Seeder.position` solves every seed's position problem and puts its
angles back on the guess's turns (`unwrap_angles`): Newton and the branch changes move an angle by at
most a fraction of a turn from the guess, but nothing else guarantees it.  (While steps follow readings,
`stepping.Stepper` re-initializes from them when an estimate ends up a whole turn from a reading.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import List, Optional, Tuple, Union

import numpy as np

import mbfg_ros.factors as F
from mbfg_ros.dynamics.cache import EvalContext
from mbfg_ros.dynamics.coordinates import choose_independent, unwrap_angles
from mbfg_ros.dynamics.kinematics import AssemblyError, PositionSolution, solve_positions_on_mode, solve_velocities
from mbfg_ros.estimation.config import Estimate, EstimatorConfig
from mbfg_ros.estimation.efforts import EffortModel
from mbfg_ros.estimation.sensors import InnovationGate, Sensors
from mbfg_ros.estimation.step_factors import StepFactors
from mbfg_ros.graph.window import FixedLagWindow
from mbfg_ros.model.mechanism import Mechanism

__all__ = ["Seed", "Seeder", "extrapolated", "marginal_prior", "effort_marginal", "MAX_EXTRAPOLATION"]

TWO_PI = 2.0 * math.pi
EFFORT_PRIOR_FLOOR = 1e-6   # smallest σ of a carried effort prior (N·m, N·m/s): a numerical floor
MAX_EXTRAPOLATION = 0.1    # [s] longest gap over which the last estimate is extrapolated (constant q̈)

#: the prior of a re-seed from an estimate: (σ_q, σ_q̇) per coordinate, or the covariance of (q, q̇)
SeedPrior = Union[None, Tuple[np.ndarray, np.ndarray], np.ndarray]
#: the estimated efforts' process state (τ, τ̇) of an estimate and its covariance, carried into a re-seed
EffortPrior = Optional[Tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class Seed:
    """Where a new window starts.

    q, v, tau: guesses of the position, velocity (None: at rest, or as unknown) and efforts (None: 0; used
    with τ a state); prior: of the seed's (q, q̇) (None: the tight `prior_q0`/`prior_v0`); v_uncertain: the
    velocity is a guess (with readings it gets the weak `initial_velocity` prior); fix_readings: put the
    coordinate readings into the position guess (else they only choose the coordinates held in the
    position problem); from_estimate: the seed is an estimate (the innovation gate's confirmation carries
    over), not a guess; efforts_prior: the mean and covariance of the estimated efforts' state (τ, τ̇)
    (with τ a state; None: τ from `tau` under the weak `initial_effort` / `initial_effort_rate` priors)."""

    q: np.ndarray
    v: Optional[np.ndarray] = None
    tau: Optional[np.ndarray] = None
    prior: SeedPrior = None
    v_uncertain: bool = False
    fix_readings: bool = True
    from_estimate: bool = False
    efforts_prior: EffortPrior = None

    @classmethod
    def at_estimate(cls, last: Estimate, efforts_prior: EffortPrior = None) -> "Seed":
        """At an estimate (same time: no extrapolation error)."""
        return cls(last.q, last.v, last.efforts, from_estimate=True, efforts_prior=efforts_prior)

    @classmethod
    def extrapolated(cls, last: Estimate, t: float) -> "Seed":
        """At the estimate extrapolated to t: q, q̇ after a gap or a disagreement with the readings are
        guesses."""
        q, v = extrapolated(last, t)
        return cls(q, v, last.efforts, v_uncertain=True)

    @classmethod
    def requested(cls, q: np.ndarray, last: Estimate, prior: SeedPrior, efforts_prior: EffortPrior = None) -> "Seed":
        """At the position `reinitialize` solved at the estimate's time, under the estimate's marginal."""
        return cls(q, last.v, last.efforts, prior, fix_readings=False, from_estimate=True,
                   efforts_prior=efforts_prior)


def extrapolated(last: Estimate, t: float) -> Tuple[np.ndarray, np.ndarray]:
    """(q, q̇) of an estimate extrapolated to t at constant acceleration (for gaps up to
    MAX_EXTRAPOLATION; beyond, the last q and q̇ are better guesses than a long parabola)."""
    gap = t - last.t
    if not 0.0 <= gap <= MAX_EXTRAPOLATION:
        return last.q, last.v
    return last.q + gap * last.v + 0.5 * gap * gap * last.a, last.v + gap * last.a


def marginal_prior(window: Optional[FixedLagWindow], k: int, factors: StepFactors, sigmas: dict,
                   correlated: bool) -> SeedPrior:
    """The prior of a re-seed from the newest estimate k of `window` (None: unavailable): the (q, q̇) block
    of its marginal covariance (`correlated`), or its per-coordinate sigmas (at least `prior_q0` /
    `prior_v0`).  Under this prior, instead of the tight `prior_q0`/`prior_v0`, the new window keeps what
    the old one knew without claiming more.  On the branch of the estimate the correlations make a
    re-initialization cost no accuracy: holding the observed coordinates instead makes the rest of the
    mechanism absorb the constraint residual (large moves near a singular pose), and per-coordinate sigmas
    let the re-seed drift along that weakly observed direction.  On another branch the old branch's
    correlations do not apply: per-coordinate sigmas."""
    if window is None:
        return None
    try:
        P = window.marginal_covariance(k)
    except Exception:      # (the window may be what failed)
        return None
    if not np.isfinite(P).all():
        return None
    sl = factors.layout.slices
    if correlated:
        idx = np.r_[sl["q"], sl["v"]]
        return P[np.ix_(idx, idx)]
    d = np.sqrt(np.clip(np.diagonal(P), 0.0, None))
    sq, sv = np.maximum(d[sl["q"]], sigmas["prior_q0"]), np.maximum(d[sl["v"]], sigmas["prior_v0"])
    if not (np.isfinite(sq).all() and np.isfinite(sv).all()):
        return None
    return sq, sv


def effort_marginal(window: Optional[FixedLagWindow], k: int, factors: StepFactors) -> EffortPrior:
    """The estimated efforts' state (τ, τ̇) of step k of `window` and its marginal covariance, or None (no τ
    state, no window, no finite covariance).  A re-seed from an estimate keeps it: under the weak initial
    priors the effort (disturbance) and its rate would have to be learnt again, a transient of ~0.1 s."""
    sl = factors.layout.slices
    if window is None or "tau" not in sl:
        return None
    try:
        P = window.marginal_covariance(k)
    except Exception:      # (the window may be what failed)
        return None
    idx = np.r_[sl["tau"], sl["tau_rate"]]
    P = P[np.ix_(idx, idx)]
    if not np.isfinite(P).all():
        return None
    return window.estimate(k)[idx].copy(), P


class Seeder:
    """Makes new windows from seeds (see the module docstring)."""

    def __init__(self, mech: Mechanism, config: EstimatorConfig, sigmas: dict, sensors: Sensors,
                 gate: InnovationGate, factors: StepFactors, efforts: EffortModel, ctx: EvalContext,
                 threshold: float, q0: Optional[np.ndarray] = None, v0: Optional[np.ndarray] = None):
        self.mech, self.config, self.sigmas = mech, config, sigmas
        self.sensors, self.gate, self.factors, self.efforts, self.ctx = sensors, gate, factors, efforts, ctx
        self.threshold = threshold
        self.init_residual = float("nan")      # max |Φ| of the last position problem solved
        self.q0, self.v0 = q0, v0                # guesses for the first position / velocity problem
        self.pending_q: Optional[np.ndarray] = None   # position solved on request before the first estimate
        # q of the last estimate before a reset (None: none yet): the turns a fresh start's angles are on
        self.published: Optional[np.ndarray] = None

    def initial_guess(self) -> np.ndarray:
        """The position guess of a start: the position solved on request, the q0 argument or the drawn pose,
        its angles on the turns of the last estimate before a reset (see the module docstring)."""
        if self.pending_q is not None:
            return self.pending_q.copy()
        q = np.array(self.q0 if self.q0 is not None else self.mech.q0, dtype=float)
        return q if self.published is None else unwrap_angles(self.mech, q, self.published)

    def position(self, q_guess: np.ndarray, fixed, mode) -> PositionSolution:
        """The position problem of a seed from q_guess (coordinates `fixed` held) on assembly `mode` (None:
        any), its angles on the turns of q_guess.  Raises AssemblyError."""
        sol = solve_positions_on_mode(self.mech, q_guess, fixed, mode)
        return replace(sol, q=unwrap_angles(self.mech, sol.q, q_guess))

    def fresh(self, first: bool) -> Seed:
        """A start from the initial guess (the v0 argument only for the `first` window)."""
        return Seed(self.initial_guess(), self.v0 if first else None)

    def fix_readings(self, q_guess: np.ndarray, obs) -> List[int]:
        """Put encoder / 'q:' readings into q_guess (an angle's reading with its turns: the seed follows it;
        a single-turn encoder's on the guess's turn); return the coordinates they fix."""
        readings = self.sensors.read_coordinates(obs)
        single = self.sensors.single_turn_coordinates
        for c, val in readings:
            q_guess[c] = val + TWO_PI * round((q_guess[c] - val) / TWO_PI) if c in single else val
        return sorted({c for c, _ in readings})

    def seed(self, seed: Seed, efforts: np.ndarray, obs, mode) -> Tuple[FixedLagWindow, np.ndarray]:
        """A new window from `seed` on assembly `mode` (None: any) with this time's efforts and readings;
        returns it and the estimate of its first state."""
        mech, c, s = self.mech, self.config, self.sigmas
        q_guess = np.array(seed.q, dtype=float)
        fixed = (self.fix_readings(q_guess, obs) if seed.fix_readings
                 else self.sensors.read_coordinate_indices(obs))
        try:
            sol = self.position(q_guess, fixed, mode)
        except AssemblyError:
            if not fixed:
                raise
            # readings out of reach of the guess's branch / inconsistent: fall back to the guess alone
            sol = self.position(q_guess, (), mode)
        q0 = sol.q
        self.init_residual = float(sol.residual)
        factors = self.factors
        z = factors.z_user if factors.z_user is not None else choose_independent(mech, q0)
        factors.restart(z if factors.independent else None)
        v_known = seed.v is not None
        v_guess = np.asarray(seed.v if v_known else np.zeros(mech.n), dtype=float)
        zsel = z if len(z) else choose_independent(mech, q0)
        fixed_v = [int(i) for i in zsel]
        vals = [float(v_guess[i]) for i in zsel]
        for coordinate, val in self.sensors.read_velocities(obs):
            if coordinate not in fixed_v:
                fixed_v.append(coordinate)
                vals.append(val)
        v0 = solve_velocities(mech, q0, fixed_v, vals, v_guess=v_guess)
        effort_prior = seed.efforts_prior if self.efforts.has_state else None
        ident = factors.identification
        theta0 = None if ident is None else ident.mean
        if effort_prior is None:
            tau0, Q0 = self.efforts.seed(efforts, seed.tau)
            tau_rate0 = None
        else:
            na = self.efforts.n_state
            tau0, Q0 = self.efforts.seed_at(efforts, effort_prior[0][:na])
            tau_rate0 = effort_prior[0][na:]
        if ident is not None:
            Q0 = Q0 + ident.forces(theta0, v0, self.efforts.known(efforts))
        x0 = factors.seed_state(q0, v0, Q0, tau0, tau_rate0, theta0)
        # With sensors an unknown initial velocity gets a weak prior: the mechanism may be moving when the
        # observer starts (a tight "at rest" prior would take ~100 steps and huge effort errors to unlearn).
        # (Only when readings arrive: without them every v0 fits and a weak prior leaves the trajectory free
        # to drift along that direction.)
        observed = self.sensors.observed(obs)
        sigma_v0 = s["initial_velocity"] if (observed and (seed.v_uncertain or not v_known)) else s["prior_v0"]
        sigma_q0 = s["prior_q0"]
        prior = seed.prior
        if isinstance(prior, np.ndarray):
            n = mech.n
            priors = [F.CorrelatedPrior.from_covariance(("q", "v"), (n, n), np.concatenate((q0, v0)), prior,
                                                        floor=min(sigma_q0, s["prior_v0"]))]
        else:
            if prior is not None:
                sigma_q0, sigma_v0 = prior
            priors = [F.Prior("q", q0, sigma_q0), F.Prior("v", v0, sigma_v0)]
        if effort_prior is None:
            priors += self.efforts.seed_units(tau0)
        else:
            na = self.efforts.n_state
            priors.append(F.CorrelatedPrior.from_covariance(("tau", "tau_rate"), (na, na), effort_prior[0],
                                                            effort_prior[1], floor=EFFORT_PRIOR_FLOOR))
        if ident is not None:
            priors += ident.seed_units()
        if factors.deflection is not None:
            priors += factors.deflection.seed_units()
        values, effort_prior = factors.step_values(efforts, None, None)
        model = factors.seed_model(priors, effort_prior, self.sensors.step_units(obs, values))
        window = FixedLagWindow(factors.layout, c.window, self.ctx, self.threshold, c.max_relinearizations,
                                scope=c.relinearize_scope, check_interval=c.check_interval)
        # A seed that is a guess (start-up, re-initialization after a gap or a disagreement) has not been
        # confirmed by the sensors it had no reading of: their readings outside the gate re-initialize from
        # the readings after UNCONFIRMED_REJECTIONS rejections, not max_rejections, while the guess drifts.
        # (A re-seed at an estimate keeps the gate.)
        self.gate.restart(set() if seed.from_estimate or not self.sensors.active else self.sensors.silent(obs))
        x = window.add_step(0, model, x0, values=values)
        self.efforts.seeded()
        self.pending_q = None
        return window, x
