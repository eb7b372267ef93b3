"""Real-time fixed-lag factor-graph estimator of a planar mechanism (ROS-free).

`FixedLagEstimator(mech, config)` keeps a window of the last ``config.window`` steps in a
`gtsam.IncrementalFixedLagSmoother` (iSAM2 with QR factorization: Cholesky breaks down at dead points,
real marginalization, lag in steps).  Each step's state is one stacked vector

    dependent:    X_k = [q, q̇, q̈ (, τ)]
    independent:  X_k = [q, q̇, q̈, z, ż, z̈ (, z⃛) (, τ)]

(z⃛ = dz̈/dt only with the 4th-order `hermite` integrator; τ = the actuator efforts, a state in the
`estimation` and `fused` modes), and each step's factors are linearized once in Python at a continuity
predictor and handed to GTSAM as one linear C++ factor, with the relinearization safeguard of
`graph.window.FixedLagWindow`.

This class is a facade over collaborators chosen once at construction, each owning one concern:

* `efforts.EffortModel` (one class per mode): how the actuator efforts enter (commanded forces; τ a state
  under a random walk; τ a state with the commanded efforts as a prior);
* `step_factors.StepFactors` (one class per formulation × integrator): the state's layout, the persistent
  units of the window, the per-step forces, the continuity predictor, the seed's state;
* `sensors.Sensors` and `sensors.InnovationGate`: the readings' units, and the one gate that judges
  on-time and late readings;
* `stepping.Stepper`: the current window and the steps added to it (forces, prediction, linearization,
  gate, update with the relinearization safeguard), late readings and late commands;
* `seeding.Seeder`: a new window from a `seeding.Seed` (start-up, re-initialization, recovery);
* `estimates.Estimates`: the estimate of the newest state, its sanity checks, the assembly mode.

The facade decides what a call does (advance, re-seed on request, re-initialize after a gap or a
disagreement, recover from a failure) and calls them in that order; the calls go one way (facade →
stepper / seeder → step factors, effort model, sensors, gate → graph), never back.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from collections import deque
from typing import Deque, Dict, List, Optional, Sequence, Tuple

import numpy as np

import mbfg_ros.factors as F
from mbfg_ros import native
from mbfg_ros.blas import limit_blas_threads
from mbfg_ros.dynamics.cache import EvalContext
from mbfg_ros.estimation.config import Estimate, EstimatorConfig
from mbfg_ros.estimation.deflection import deflection_floor, encoder_deflection, geared_encoders
from mbfg_ros.estimation.density_adaptation import (BOOST_SETTLED, CHANGE as DENSITY_CHANGE,
                                                     DEFLECTION_REFERENCE, MIN_EVIDENCE, DensityAdaptation,
                                                     encoded_coordinates)
from mbfg_ros.estimation.actuator_delay import actuator_delay, configured_delays, configured_time_constants
from mbfg_ros.estimation.efforts import configured_shares, effort_model
from mbfg_ros.estimation.estimates import Estimates, copy_estimate
from mbfg_ros.estimation.identification import BOUND_SIGMAS, identification
from mbfg_ros.estimation.joint_covariance import joint_covariance
from mbfg_ros.estimation.seeding import Seed, Seeder, effort_marginal, extrapolated, marginal_prior
from mbfg_ros.estimation.sensors import InnovationGate, ReadingsDisagree, Sensors, TrackMonitor, observations_in
from mbfg_ros.estimation.sigma_adaptation import SensorSigmaAdaptation
from mbfg_ros.estimation.step_factors import step_factors
from mbfg_ros.estimation.stepping import Stepper
from mbfg_ros.factors.noise import default_sigmas
from mbfg_ros.graph.window import FixedLagWindow
from mbfg_ros.model.mechanism import Mechanism

__all__ = ["FixedLagEstimator"]

PARAMETER_CHECKPOINT_STEPS = 500   # steps of a healthy window between checkpoints of the identified parameters
BOUND_CHECK_STEPS = 10             # steps between checks of a friction or payload estimated below 0 (`_check_bounds`)
RELEARN_DECADES = 1.0              # `_relearn_parameters`
SETTLE_SECONDS = 0.2               # identified parameters held after a fresh start or a failure (`Identification.settle`)
FIRST_FIT_SECONDS = 1.0            # ... and, where the early readings reject the configured densities, until the
                                   # density fit's first estimate, at most this long after the hold began


def _vector(x, n, what):
    x = np.array(x, dtype=float).reshape(-1)
    if x.shape != (n,):
        raise ValueError(f"{what}: expected {n} values, got {x.size}")
    return x


class FixedLagEstimator:
    """Fixed-lag smoother / state observer of one mechanism.  See the module docstring.

    ``FixedLagEstimator(mech, config=EstimatorConfig(), q0=None, v0=None)``: q0 / v0 are guesses for the
    first position / velocity problem (default: the drawn pose, at rest).

    ``step(t, efforts=None, observations=None) -> Estimate`` advances to time t: one step of
    ``config.dt`` (a longer gap is bridged with intermediate steps, a gap over ``max_substeps`` steps or a
    time going backwards re-initializes, a repeated t returns the previous estimate).

    * ``efforts``: array in actuator order (``mech.actuator_names``), NaN / None = unknown.
      `forward_dynamics`: the commanded efforts (unknown = 0); `estimation`: ignored (τ is estimated);
      `fused`: the finite entries are priors on τ (sigma ``commanded_effort``).  Wrong length: ValueError.
    * ``observations``: dict sensor name → reading (missing, None or NaN = no reading this step), plus
      generic ``'q:<coordinate>'``, ``'v:<coordinate>'``, ``'a:<coordinate>'``; unknown names are ignored
      and listed in ``Estimate.message``.  The `forward_dynamics` mode ignores them (except that encoder
      readings fix their coordinates in the first position problem).
    * Returns the estimate at t of q, q̇, q̈, Q (gravity + efforts), the efforts (estimated or commanded),
      the assembly mode, max |Φ|, the wall time, ``status`` (initialized | ok | recovered | waiting) and the
      [q, q̇] marginal covariance when ``compute_covariance``.

    Numerical failures (GTSAM exceptions, NaN, |Φ| > ``max_constraint_residual``, |q̇| > ``max_speed``,
    a linearization that does not converge — beyond its dynamics rows' being off by less than the accelerations'
    own noise, `stepping.FAILURE_NOISE` —, leaving a requested assembly mode) never raise: the window is
    re-seeded at the last good estimate and integrated forward (``status='recovered'``, ``message``).

    ``reinitialize(assembly_mode=None) -> (mode, max |Φ|)`` re-solves the position problem on the
    requested (or current) assembly mode from the latest estimate and readings; the next step re-seeds
    the window from that solution at the latest estimate's time and advances it;
    ``reset()`` forgets everything but the turns of the angles.  Attributes: ``layout`` (the stacked
    state), ``independent_coordinates``, ``relinearizations``, ``recoveries``, ``last`` (latest Estimate),
    ``window`` (the current `FixedLagWindow` or None), ``relinearize_threshold``.

    Relative angles stay continuous through every path (a seed at start-up, after a reset, a gap, a
    disagreement, a failure, on request or on another branch): an angle read by an encoder is on the turn
    of its reading, turns included (a single-turn encoder, declared so in the mechanism, only modulo 2π), and any
    other angle on the turn of its last estimate (kept over a reset); see `seeding` and `stepping.Stepper`.
    """

    REINITIALIZED = "re-initialized on request"
    # failures in a row (no usual step between) after which recoveries stop starting from the last estimate
    TRUST_LAST_FAILURES = 4

    def __init__(self, mech: Mechanism, config: Optional[EstimatorConfig] = None, q0=None, v0=None):
        self.mech = mech
        self.config = c = (config if config is not None else EstimatorConfig()).validated()
        self.sigmas = {**default_sigmas(mech.spec), **dict(c.sigmas)}
        if c.relinearize_scope not in FixedLagWindow.SCOPES:
            raise ValueError(f"relinearize_scope must be one of {FixedLagWindow.SCOPES} (got {c.relinearize_scope!r})")
        if c.blas_threads:
            limit_blas_threads(int(c.blas_threads))
        q0 = None if q0 is None else _vector(q0, mech.n, "q0")
        v0 = None if v0 is None else _vector(v0, mech.n, "v0")
        self.ctx = EvalContext(mech)
        self.efforts = effort_model(c.mode, mech, self.sigmas, rates=c.integrator == "hermite",
                                    overrides=c.actuator_efforts)
        self.configured_shares = configured_shares(mech, self.efforts, c.effort_shares, c.mode)
        self.efforts.shares = self.configured_shares
        self.delay = actuator_delay(configured_delays(mech, c.actuator_delays), c.dt, c.window,
                                    configured_time_constants(mech, c.actuator_time_constants))
        self.deflection = encoder_deflection(mech, c.mode, self.sigmas,
                                             fitted=c.adapt_deflection and self._fits_densities())
        self.sensors = Sensors(mech, c, self.sigmas, self.deflection)
        self.gate = InnovationGate(c, self.deflection)
        self.identification = identification(mech, c.identify, c.mode, c.formulation, c.integrator, self.efforts)
        self.factors = step_factors(mech, c, self.sigmas, self.efforts, self.ctx, self.identification,
                                    self.deflection)
        self.layout = self.factors.layout
        self.estimates = Estimates(mech, c, self.efforts, self.factors, self.ctx)
        self.stepper = Stepper(c, self.factors, self.efforts, self.sensors, self.gate, self.ctx,
                               TrackMonitor(mech, c, self.sensors, self.layout.slices["deflection"].start
                                            if "deflection" in self.layout else None))
        self.seeder = Seeder(mech, c, self.sigmas, self.sensors, self.gate, self.factors, self.efforts, self.ctx,
                             self.stepper.threshold, q0, v0)
        self.density_adaptation = self._density_adaptation()
        self.deflection_fit = self._deflection_fit()
        self.shares_fit = self._shares_fit()
        self.boost_fit = self._boost_fit()
        self._boosting = False          # the boosts apply (`BOOST_SETTLED`)
        # the deflection's fit starts at none; until the density fit's estimates are used (`MIN_EVIDENCE`), the
        # window reads geared encoders through the deflection grid's middle (`DEFLECTION_REFERENCE`): from none,
        # a real gear's wobble was read as effort at the configured densities (the DFKI acrobot's first 0.1 s:
        # 24 N·m off at a 1σ of 0.7)
        self._cautious_deflection = self.deflection_fit is not None and self.deflection_fit.deflection_sigma == 0.0
        if self._cautious_deflection:
            self.sigmas["deflection_sigma"] = DEFLECTION_REFERENCE
        self.sigma_adaptation = self._sigma_adaptation()
        # Fused mode has no deflection block (its cost a step is 13–14 %): until the density fit's estimates are
        # used, its window reads geared encoders with the same 1-mrad deflection as white noise, σ² + σ_b²
        # (from the configured densities and the quantization's σ, the DFKI acrobot's first 0.1 s was 24 N·m off
        # at a 1σ of 0.7); the fits read the encoders' own σ
        self._encoder_sigmas: Dict[str, float] = {}     # geared encoder -> its own σ, while widened
        if c.mode == "fused" and self.density_adaptation is not None and self.deflection is None:
            self._encoder_sigmas = {name: self.sensors.sigma(name) for name in geared_encoders(mech)
                                    if name in self.sensors.units}
            self._widen_encoders()
        self.last: Optional[Estimate] = None
        self._pending_smoothed: Deque[Tuple[int, Estimate]] = deque()   # estimated, not yet smoothed
        self._ready_smoothed: List[Estimate] = []
        self.reset()

    def _fits_densities(self) -> bool:
        """Are the process densities fitted online (`adapt_densities`, estimation or fused mode with efforts in
        the state, one encoder per degree of freedom)?"""
        c = self.config
        return bool(c.adapt_densities and c.mode in ("estimation", "fused") and self.efforts.has_state
                    and encoded_coordinates(self.mech))

    def _density_adaptation(self) -> Optional[DensityAdaptation]:
        """The online fit of the process densities (estimation: effort_density, fused: disturbance_density, both
        with acceleration_density) with `adapt_densities`, when the mechanism has one encoder per degree of
        freedom; else None (the densities stay as configured)."""
        c = self.config
        if not self._fits_densities():
            return None
        layout = encoded_coordinates(self.mech)
        fused = c.mode == "fused"
        T = self.sigmas["disturbance_time_constant"] if fused else math.inf
        Tv = math.inf if fused else self.sigmas["effort_rate_time_constant"]
        return DensityAdaptation(self.mech, self.sigmas[self.efforts.density_name],
                                 self.sigmas["acceleration_density"], layout, c.sensor_sigmas, time_constant=T,
                                 hold_start=fused, actuated=self.efforts.state_coordinates, dt=c.dt,
                                 rate_time_constant=Tv, shares=self.configured_shares,
                                 deflection=None if self.deflection is None else
                                 (self.deflection.sigma, self.deflection.time_constant),
                                 effort_bandwidth=0.0 if fused else c.effort_bandwidth)

    def _deflection_fit(self) -> Optional[DensityAdaptation]:
        """The online fit of the encoders' deflection σ (where the state has a deflection and the densities are
        fitted): a second bank over σ_b (none and `DEFLECTION_GRID`) at the other fit's current densities, the
        two passing their estimates to each other (a coordinate ascent; the joint grid would multiply the
        bank's filters by the deflection's points).  It holds "none" until the readings reject it
        (`hold_start`)."""
        main = self.density_adaptation
        if main is None or self.deflection is None or not self.config.adapt_deflection:
            return None
        return self._side_bank(main, deflection=(0.0 if self.sigmas["deflection_sigma"] <= deflection_floor(self.mech)
                                                 else self.deflection.sigma, self.deflection.time_constant),
                               fit_deflection=True)

    def _shares_fit(self) -> Optional[DensityAdaptation]:
        """The online fit of each estimated effort's share of the effort density (estimation mode), where two or
        more are in the state and the densities are fitted: a third bank over the shares (per actuator but the last a
        family of points; with two, their ratio ± `SHARE_DECADES` × 2) at the main fit's densities, passing
        its estimate back (coordinate ascent, as the deflection's).  One density for every actuator reads the
        larger efforts' variation into the smaller (the DFKI acrobot's passive shoulder, 0.2 N·m RMS beside its
        elbow's 1.25: its estimation-mode error 1.8× its own size).  It holds equal shares until the readings
        reject them (`hold_start`).  Not in fused mode, where the disturbance corrects the commands and its shares
        are poorly determined (docs/decisions.md)."""
        main = self.density_adaptation
        if main is None or self.config.mode != "estimation" or len(self.efforts.state_coordinates) < 2:
            return None
        return self._side_bank(main, deflection=None if self.deflection is None else
                               (self.deflection.sigma, self.deflection.time_constant), fit_shares=True)

    def _boost_fit(self) -> Optional[DensityAdaptation]:
        """The efforts' boosts (estimation mode, the densities fitted): a bank over one actuator's density raised
        by 0.5–2 decades at a time, at the other fits' estimates, whose evidence is forgotten over half a second:
        while it rejects the unraised densities, that actuator's density in the graph is raised (`DensityAdaptation`,
        `boosts`).  A density fitted over 10 s lags a motion that turns faster than the recent past: on the
        DFKI acrobot's last second the estimate trailed its readings by 10–15 mrad and the elbow's torque by ~35 ms.
        Not in fused mode, where the commands pin the motion down (measured: docs/decisions.md)."""
        main = self.density_adaptation
        if main is None or self.config.mode != "estimation":
            return None
        return self._side_bank(main, deflection=None if self.deflection is None else
                               (self.deflection.sigma, self.deflection.time_constant), boosts=True)

    def _side_bank(self, main: DensityAdaptation, **axis) -> DensityAdaptation:
        """A bank over one more axis (`axis`: the deflection's or the shares'), at the main fit's densities,
        holding its start until the readings reject it."""
        c = self.config
        return DensityAdaptation(self.mech, main.density, main.acceleration_density, encoded_coordinates(self.mech),
                                 c.sensor_sigmas, time_constant=main.time_constant, fit_acceleration=False,
                                 fit_effort=False, hold_start=True, actuated=self.efforts.state_coordinates,
                                 dt=c.dt, rate_time_constant=main.rate_time_constant,
                                 shares=self.configured_shares, **axis)

    def _follow_main(self, bank: DensityAdaptation):
        """A side bank takes the main fit's current estimates of the axes it does not fit (`set_fixed` leaves
        its own axis alone)."""
        main = self.density_adaptation
        # (the likelihood's own densities, before the efforts' bandwidth: each bank's axis fitted where the
        # readings are best described; held at the bandwidth's, the deflection went to the top of its range on the
        # DFKI pendubot's limit cycle and the estimate left its readings by 10–20 mrad)
        bank.set_fixed(main.free_density, main.free_acceleration_density,
                       main.time_constant if main.fit_time_constant else None,
                       main.deflection_sigma if self.deflection is not None else None)

    def _sigma_adaptation(self) -> Optional[SensorSigmaAdaptation]:
        """The online fit of the encoders' σ (estimation and fused modes with `adapt_sensor_sigmas`), else None."""
        c = self.config
        if not (c.adapt_sensor_sigmas and self.sensors.active):
            return None
        encoders = [(name, u.angle, self.sensors.sigma(name)) for name, u in self.sensors.units.items()
                    if isinstance(u, F.Encoder)]
        return SensorSigmaAdaptation(encoders) if encoders else None

    def _widen_encoders(self, widened: bool = True):
        """The window's geared encoders read with σ² + `DEFLECTION_REFERENCE`² (`widened`), or with their own σ
        (and from then on always)."""
        for name, sigma in self._encoder_sigmas.items():
            self.sensors.set_sigma(name, math.hypot(sigma, DEFLECTION_REFERENCE) if widened else sigma)
        if not widened:
            self._encoder_sigmas = {}
        self.stepper.sensors_changed()
        self.factors.readings_changed()

    def _set_sensor_sigmas(self, sigmas: Dict[str, float]):
        """New σ of encoders for the steps from now on: their units, the checks that use them, the effort
        density's likelihood."""
        for name, sigma in sigmas.items():
            if name in self._encoder_sigmas:
                self._encoder_sigmas[name] = sigma
                sigma = math.hypot(sigma, DEFLECTION_REFERENCE)
            self.sensors.set_sigma(name, sigma)
        self.stepper.sensors_changed()
        self.factors.readings_changed()
        for fit in (self.density_adaptation, self.deflection_fit, self.shares_fit, self.boost_fit):
            if fit is not None:
                fit.set_sensor_sigmas(sigmas)

    # -- public API ---------------------------------------------------------------------------
    def reset(self):
        """Forget everything but the turns of the angles and what was learnt of the identified parameters: the next
        `step` re-initializes (position problem, priors) with its angles on the turns of the readings, else of the
        last estimate before the reset."""
        if self.last is not None:
            self.seeder.published = self.last.q
            ident = self.identification
            if ident is not None and self.stepper.window is not None and self.last.status == "ok":
                # a healthy window's newest belief, not its last checkpoint's (a reset after the readings stopped
                # would otherwise lose up to PARAMETER_CHECKPOINT_STEPS steps of learning); a failing window's
                # status is not "ok", and its learning stays dropped
                ident.carry(self.stepper.window, self.stepper.k, self.layout)
        self._drain_smoothed()
        self.stepper.reset()
        if self.delay is not None:
            self.delay.reset()
        self.sensors.timing.reset()
        self.last = None
        self._last_obs: Dict[str, float] = {}
        self._last_efforts = np.full(self.efforts.na, np.nan)
        self._step_inputs: Dict[int, tuple] = {}   # estimated step id -> (t, efforts, status): `smoothed`
        self.estimates.reset()
        self.gate.reset()
        self.seeder.pending_q = None
        self._reseed = None        # requested re-seed at the last estimate: (solved q, readings, efforts, same branch)
        # `reset_parameters` / a thaw asked for a re-seed whose θ prior is the belief, not what the window holds
        self._parameters_reset = False
        self._parameters_message = ""
        self._bound_wait = 0       # steps until `_check_bounds` looks again
        self._densities_fitted = False
        self._hold_began: Optional[float] = None   # when θ's last hold began (`_awaiting_first_fit`)
        self._turn_shift = None    # a late reading whole turns from its step's estimate: `Stepper.late_turns`
        self._reseeded = False     # the window was re-seeded on request: the next step says so
        self._retry = None
        self._failures = 0
        self.recoveries = 0
        self.init_residual = float("nan")

    @property
    def init_residual(self) -> float:
        """max |Φ| of the last position problem solved (initialization or `reinitialize`)."""
        return self.seeder.init_residual

    @init_residual.setter
    def init_residual(self, value: float):
        self.seeder.init_residual = value

    @property
    def relinearize_threshold(self) -> float:
        """The relinearization threshold of steps without readings (see `stepping.Stepper`)."""
        return self.stepper.threshold

    @property
    def window(self) -> Optional[FixedLagWindow]:
        return self.stepper.window

    @property
    def relinearizations(self) -> int:
        return self.stepper.relinearizations

    @property
    def independent_coordinates(self) -> Tuple[str, ...]:
        z = self.factors.z
        return () if z is None else tuple(self.mech.coordinate_names[i] for i in z)

    def step(self, t: float, efforts=None, observations: Optional[Dict[str, float]] = None,
             command_times: Optional[Sequence[float]] = None) -> Estimate:
        """The estimate at t from the commands in force then (`efforts`, actuator order; per actuator the time it
        was given in `command_times`, which an actuator's delay interpolates by: `ActuatorDelay.applied`; None:
        at t) and the readings of t."""
        t_start = time.perf_counter()
        t = float(t)
        efforts = self.efforts.efforts_in(efforts)
        if self.delay is not None:
            efforts = self.delay.applied(t, efforts, command_times)
        obs = observations_in(observations)
        self.sensors.timing.observe(t, obs)
        try:
            est = self._step(t, efforts, obs)
        except Exception as exc:          # numerical failure: never escapes
            est = self._recover(t, efforts, obs, exc)
        if self.delay is not None:
            self.delay.assign(est.step)
        fit = self.sigma_adaptation
        if fit is not None and obs:
            changed = fit.observe(t, obs)
            if changed:
                self._set_sensor_sigmas(changed)
        adaptation = self.density_adaptation
        if adaptation is not None and est.status != "waiting":
            try:
                tau = est.efforts if est.disturbance is None else est.disturbance
                if self.efforts.partial_state:      # (the known efforts are in q̈: the fit's drift input)
                    tau = tau[self.efforts.state_actuators]
                if est.parameters is not None:
                    # the identified parameters' forces are part of the model's efforts, not innovations
                    tau = tau + self.identification.forces(est.parameters, est.v, self.efforts.known(efforts),
                                                           est.a)[self.efforts.state_coordinates]
                changed = fitted = adaptation.observe(t, obs, est.q, est.v, est.a, tau, est.status != "ok")
                deflection = self.deflection_fit
                if deflection is not None:
                    if changed:
                        self._follow_main(deflection)
                    if deflection.observe(t, obs, est.q, est.v, est.a, tau, est.status != "ok"):
                        adaptation.set_fixed(deflection_sigma=deflection.deflection_sigma)
                        changed = True
                shares = self.shares_fit
                if shares is not None:
                    if changed:
                        self._follow_main(shares)
                    if shares.observe(t, obs, est.q, est.v, est.a, tau, est.status != "ok"):
                        for fit in (adaptation, deflection, self.boost_fit):
                            if fit is not None:
                                fit.set_shares(shares.shares)
                        changed = True
                boost = self.boost_fit
                if boost is not None:
                    if changed:
                        self._follow_main(boost)
                    if boost.observe(t, obs, est.q, est.v, est.a, tau, est.status != "ok"):
                        changed = True
                    # (only once the density fit's evidence is older than the boosts': before, the two are as
                    # quick, and raising a density the fit is still moving towards overshoots it)
                    settled = adaptation.evidence >= BOOST_SETTLED
                    if settled != self._boosting:
                        self._boosting = settled
                        changed = True
                if self._cautious_deflection and adaptation.evidence >= MIN_EVIDENCE:
                    self._cautious_deflection = False
                    changed = True          # (the fit's deflection, none until its bank rejects none)
                if self._encoder_sigmas and adaptation.evidence >= MIN_EVIDENCE:
                    self._widen_encoders(False)
                if changed and (shares is not None or boost is not None):
                    base = shares.shares if shares is not None else self.configured_shares
                    raised = boost is not None and self._boosting and bool(np.any(boost.boost))
                    # (None: one density for every effort, as configured)
                    self.efforts.shares = base if not raised else \
                        (1.0 if base is None else base) * 10.0 ** boost.boost
                if changed:
                    # (the densities' own first estimate, not a change of the deflection's alone)
                    first = fitted and self.identification is not None and not self._densities_fitted
                    before = float(self.factors.sigmas["acceleration_density"])
                    self.factors.set_process_densities(self._fitted_by(adaptation))
                    if first:
                        self._densities_fitted = True
                        self._relearn_parameters(before)
            except (ArithmeticError, np.linalg.LinAlgError, ValueError):
                adaptation.restart()      # numerical trouble in the fit (a diverged estimate): start it again
                for fit in (self.deflection_fit, self.shares_fit, self.boost_fit):
                    if fit is not None:
                        fit.restart()
        est.solve_time = time.perf_counter() - t_start
        return est

    def _relearn_parameters(self, before: float):
        """At the density fit's first estimate: when it raised the acceleration density (how far the model's own
        q̈ may be off) from `before` by RELEARN_DECADES or more, what θ learnt since it started is dropped and θ
        learns again from its belief then (`Identification.learn_again`; θ fitted against a model believed more
        than the data allow takes up the model's errors: on the real double pendulum an elbow's viscous friction
        went to 0.22 N·m·s/rad in 0.3 s)."""
        after = float(self.factors.sigmas["acceleration_density"])
        raised = math.log10(after / before) if before > 0 and after > 0 else 0.0
        if raised >= RELEARN_DECADES and self.identification.learn_again():
            self._parameters_reset = self.window is not None and self.last is not None
            self._parameters_message = (f"identified parameters learning again: the fitted acceleration density is "
                                        f"{raised:.2g} decades above the configured one")

    def numerics(self) -> Dict[str, str]:
        """Which form computes each of the estimator's models: {'dynamics': the mechanism's q̈ and its
        derivatives, 'seed' and 'step': the step models built so far} -> 'compiled' or 'numpy (why)'."""
        return {"dynamics": native.mechanism_form(self.mech, self.ctx.native), **self.factors.forms}

    def fitted_densities(self) -> Optional[Dict[str, float]]:
        """The process densities the online fit has handed to the factors (the steps added from now on use them):
        {effort_density (estimation) or disturbance_density (fused), acceleration_density, and in fused mode
        disturbance_time_constant (unless configured undamped), deflection_sigma where fitted, and
        effort_density.<joint> (disturbance_density.<joint>) where the efforts have their own: shares or
        boosts; acceleration_density.likelihood where the efforts' bandwidth holds the acceleration density a
        tenth of a decade or more below the likelihood's own, that); None when they are
        not fitted online (forward_dynamics mode, `adapt_densities` false, not one encoder per degree of
        freedom)."""
        if self.density_adaptation is None:
            return None
        fitted = {name: float(self.factors.sigmas[name]) for name in self._fitted_by(self.density_adaptation)}
        if self.efforts.shares is not None:
            # each actuated effort's own density (the density × its share, `_shares_fit`, given or fitted, × its
            # boost, `_boost_fit`)
            density = fitted[self.efforts.density_name]
            for j, share in zip(self.efforts.state_actuators, self.efforts.shares):
                fitted[f"{self.efforts.density_name}.{self.mech.actuator_names[j]}"] = density * float(share)
        main = self.density_adaptation
        if main.effort_bandwidth > 0 and \
                math.log10(main.free_acceleration_density / main.acceleration_density) >= DENSITY_CHANGE:
            # (the efforts' bandwidth holds the acceleration density below what the readings ask for: said)
            fitted["acceleration_density.likelihood"] = main.free_acceleration_density
        return fitted

    def density_fit_limits(self) -> Optional[Dict[str, str]]:
        """The fitted densities whose online estimate sits at the edge of its range (`DensityAdaptation.limits`):
        {name: "bottom" or "top"} (names as `fitted_densities`; "deflection_sigma": "top" only), {} where none
        does; None when the densities are not fitted online.  A top edge says the readings ask for more than the
        range allows (motion the model and its noise do not explain: a gear's play, late stamps, a wrong model, an
        effort that turns faster than the range) and the estimates' σ are not to be trusted as they are; a bottom
        edge that the model explains the readings better than the range expects (a simulation of the model
        itself)."""
        main = self.density_adaptation
        if main is None:
            return None
        names = {"density": self.efforts.density_name, "acceleration_density": "acceleration_density"}
        out = {names[k]: v for k, v in main.limits().items() if k in names}
        if self.deflection_fit is not None:
            out.update(self.deflection_fit.limits())
        return out

    def _fitted_by(self, adaptation: DensityAdaptation) -> Dict[str, float]:
        """The noise parameters the online fit sets, by name, at its current estimates."""
        fitted = {self.efforts.density_name: adaptation.density,
                  "acceleration_density": adaptation.acceleration_density}
        if adaptation.fit_time_constant:
            fitted["disturbance_time_constant"] = adaptation.time_constant
        if self.deflection_fit is not None:
            # (none: the floor, where a deflection changes nothing)
            fitted["deflection_sigma"] = max(self.deflection_fit.deflection_sigma, deflection_floor(self.mech))
        return fitted

    @property
    def parameter_names(self) -> Tuple[str, ...]:
        """The identified actuator parameters (``joint.parameter``), in the order of `Estimate.parameters`."""
        return () if self.identification is None else self.identification.names

    def parameters(self) -> Optional[Dict[str, object]]:
        """The identified parameters now: {'names', 'values' (the newest estimate), 'std' (their marginal 1σ; NaN
        where the window cannot give it), 'prior_std', 'excitation' (1 − σ/σ_prior, clipped to [0, 1]: how much
        the motion so far has told about each), 'frozen', 'settling' (held while a new window settles), 'confounded'
        (the names of friction parameters whose actuator's effort is estimated: `Identification.confounded`),
        'projections' (per parameter: the times it was estimated below its bound 0 and moved onto it:
        `_check_bounds`)}; None without identified parameters."""
        ident = self.identification
        if ident is None:
            return None
        P = ident.parameters
        values, std = ident.mean.copy(), ident.sigma.copy()
        window, last = self.window, self.last
        if last is not None and last.parameters is not None:
            values = last.parameters.copy()
        if window is not None and not ident.held:
            try:
                std = ident.window_std(window, self.stepper.k, self.layout)
            except Exception:
                std = np.full(ident.size, np.nan)
        return {"names": ident.names, "values": values, "std": std, "prior_std": P.prior_sigma.copy(),
                "excitation": np.clip(1.0 - std / P.prior_sigma, 0.0, 1.0), "frozen": ident.frozen,
                "settling": ident.settling > 0, "confounded": ident.confounded,
                "projections": ident.projections.copy()}

    def freeze_parameters(self, frozen: bool) -> bool:
        """Hold the identified parameters at their newest estimates (`frozen`) or let them learn again; False
        without identified parameters."""
        ident = self.identification
        if ident is None:
            return False
        if frozen and not ident.frozen:
            if self.window is not None:
                ident.carry(self.window, self.stepper.k, self.layout)
            ident.freeze(ident.mean if self.last is None or self.last.parameters is None else self.last.parameters)
        elif not frozen and ident.frozen:
            # the window's steps hold θ tight: the next step re-seeds it at the last estimate, θ under the σ it had
            # when frozen (else the pinned steps, marginalized, would keep it frozen)
            ident.thaw()
            self._parameters_reset = self.window is not None and self.last is not None
            self._parameters_message = "identified parameters thawed"
        return True

    def reset_parameters(self) -> bool:
        """The identified parameters back to their priors (thawed): the next step re-seeds the window at the last
        estimate without what it learnt of them.  False without identified parameters."""
        ident = self.identification
        if ident is None:
            return False
        ident.reset()
        self._parameters_reset = self.window is not None and self.last is not None
        self._parameters_message = "identified parameters reset to their priors"
        return True

    def fitted_sensor_sigmas(self) -> Optional[Dict[str, float]]:
        """The σ in use of each encoder when they are fitted online (the steps added from now on use them), or
        None (forward_dynamics mode, `adapt_sensor_sigmas` false, no encoder)."""
        if self.sigma_adaptation is None:
            return None
        return {name: self.sensors.sigma(name) for name in self.sigma_adaptation.encoders}

    def joint_covariance(self, coordinates: Sequence[int]) -> Optional[np.ndarray]:
        """The full covariance of the newest estimate's [angles, rates, efforts] of the coordinate columns
        `coordinates` (3m × 3m; see `joint_covariance.joint_covariance`), computed now (a marginal of the
        window: about the cost of ``compute_covariance`` for one step); None before the first estimate."""
        if self.window is None or self.last is None:
            return None
        P = self.window.marginal_covariance(self.stepper.k)
        return joint_covariance(P, self.layout, self.mech, coordinates, self.efforts.state_coordinates,
                                self.estimates.ripple_variances)

    def prepare_next_step(self) -> bool:
        """Do now the part of the next step (one dt after the newest) that does not depend on its inputs:
        the prediction and the dynamics linearization at it, which the step then finds in the evaluation
        context.  A real-time caller runs this while it waits for the next inputs, which takes about a
        fifth of a step off the input-to-output path; the estimates are identical either way.  Only where
        the prediction is input-free: estimated efforts (estimation, fused) with the trapezoidal or Euler
        integrator (the forces of forward dynamics and the jerk of hermite come with the inputs).
        Returns whether anything was done; never raises."""
        return self.stepper.prepare_next()

    def reinitialize(self, assembly_mode=None):
        """Re-solve the position problem from the latest estimate on the requested (or the current) assembly
        mode; the next step clears the window, re-seeds it from this solution at the latest estimate's
        time (with that time's velocity, readings and efforts, under a prior of the estimate's marginal
        covariance) and advances it.  Returns (mode, max |Φ|) of the solution; raises AssemblyError
        (nothing changed) when there is no assembly on that mode.

        On the branch the estimate is on, the solution is the estimate projected onto the constraints
        (Newton from it with every coordinate free: the nearest assembly); on another branch the observed
        coordinates are held at their estimates (before the first estimate: the latest readings); see
        `seeding.marginal_prior` for the re-seed's prior.  The window is re-seeded by the next step rather
        than here so that a caller answering a request (a ROS service) can reply after the position problem
        alone."""
        modes = self.estimates
        mode = modes.mode if assembly_mode is None else modes.check_mode(assembly_mode)
        last = self.last
        same_branch = last is not None and (modes.mode is None or np.array_equal(mode, modes.mode))
        if last is None:
            q_guess = self.seeder.initial_guess()
            fixed = self.seeder.fix_readings(q_guess, self._last_obs)
        else:
            q_guess = (last.q if self._reseed is None else self._reseed[0]).copy()
            fixed = [] if same_branch else self.sensors.read_coordinate_indices(self._last_obs)
        sol = self.seeder.position(q_guess, fixed, mode)
        if assembly_mode is not None:
            modes.requested = np.array(mode, dtype=int)
        modes.mode = np.array(sol.assembly_mode, dtype=int)
        self.init_residual = float(sol.residual)
        if last is None:
            self.seeder.pending_q = sol.q
        else:
            self._reseed = (sol.q, dict(self._last_obs), self._last_efforts, same_branch)
        return tuple(int(m) for m in sol.assembly_mode), float(sol.residual)

    def apply_reinitialization(self) -> bool:
        """Re-seed the window now if `reinitialize` asked for it, instead of at the next step: a caller that
        has answered the request runs this in its idle time, so that the next step costs no more than
        usual.  The same estimates either way; returns whether anything was done; never raises (a
        failure re-seeds at the last estimate at the next step)."""
        if self._reseed is None or self.last is None:
            return False
        try:
            self._reseed_at_last()
        except Exception as exc:
            self.stepper.window = None
            self._retry = f"{type(exc).__name__}: {exc}"
        return True

    def add_late_observations(self, step: int, observations: Dict[str, float]) -> Tuple[List[str], List[str]]:
        """Readings of an earlier step that is still in the window (they arrived after it was estimated),
        addressed by that step's `Estimate.step`: each becomes a factor on that step's state and the
        window is updated, so the next estimates use them.  Returns (fused, refused) reading names;
        refused: unknown, NaN, outside the innovation gate, or the step no longer (or never) in the
        window."""
        fused, refused = self.stepper.add_late(step, observations_in(observations))
        late, self.stepper.late_turns = self.stepper.late_turns, None
        if late is not None and self.last is not None:
            self._turn_shift = late         # the next step moves the estimate onto the reading's turn
        return fused, refused

    def correct_commands(self, corrections: Sequence[Tuple[int, object]]) -> List[int]:
        """Commanded efforts that arrived after their step was estimated, while it is still in the window:
        `corrections` are (`Estimate.step`, efforts in actuator order, NaN: unknown) pairs, each the whole
        command the step should have been estimated with.  Each such step's factor is replaced by the one
        of its new commands (linearized at the same point: the factor it would have had with them in time),
        all in one window update, so the next estimates are those of commands that came in time, to within
        the linearization of the later steps (made at the old estimates; their difference is of second order
        in the change, and the relinearization check bounds it).  Returns the step ids corrected; none where
        the commands do not enter the estimate (estimation mode) or not through that step's factor alone (the
        hermite integrator: rates over three steps), and none for steps no longer (or never) in the window.  A
        third entry, per actuator the time each command was given (`step`'s command_times), times them for the
        actuators' delay.  Efforts of the wrong length: ValueError."""
        given = [(int(step), self.efforts.efforts_in(efforts), *when) for step, efforts, *when in corrections]
        corrections = [(step, efforts) for step, efforts, *_ in given]
        if self.delay is not None:          # (the steps that apply them, after the delay)
            corrections = self.delay.correct(given)
        done = self.stepper.correct_commands(corrections)
        newest = self.stepper.first_id + self.stepper.k
        for step, efforts in corrections:
            if step == newest and step in done:
                self._last_efforts = efforts       # a re-seed at the last estimate takes its commands
        return done

    # -- stepping -----------------------------------------------------------------------------
    def _step(self, t, efforts, obs) -> Estimate:
        self._last_obs.update(obs)
        stepper = self.stepper
        if self._reseed is not None and self.last is not None:
            self._reseed_at_last()
        if self._reseeded and stepper.window is not None:
            self._reseeded = False
            if t - stepper.t <= 1e-9 * self.config.dt:
                return self.last
            return self._advance_to(t, efforts, obs, "initialized", [self.REINITIALIZED], resync=True)
        if stepper.window is None:
            retry, self._retry = self._retry, None
            if retry is not None and self.last is not None and self._failures <= self.TRUST_LAST_FAILURES:
                # an earlier recovery could not re-initialize: try again from the last good estimate
                return self._reseed_and_advance(t, efforts, obs, "recovered", f"re-initialized after: {retry}",
                                                carry=False)
            return self._initialize(t, efforts, obs, self.seeder.fresh(self.last is None), "initialized", "initialized")
        gap = t - stepper.t
        dt = self.config.dt
        if gap < -1e-9 * dt:
            self.reset()
            self._last_obs.update(obs)
            return self._initialize(t, efforts, obs, self.seeder.fresh(self.last is None), "initialized",
                                    f"time went backwards by {-gap:.6g} s: re-initialized")
        if gap <= 1e-9 * dt:
            est = copy_estimate(self.last)
            est.status, est.message = "ok", "time did not advance: previous estimate"
            return est
        if self._turn_shift is not None:
            name, value, turns, c = self._turn_shift
            self._turn_shift = None
            est = self._reseed_and_advance(t, efforts, obs, "recovered",
                                           f"{name} read {value:.6g} rad (late), {turns:+d} turn(s) from the "
                                           f"estimate of its step: moved onto the reading's turn", shift=(c, turns))
            est.recovery = "turn"
            return est
        if self._parameters_reset:
            return self._reseed_and_advance(t, efforts, obs, "ok", self._parameters_message,
                                            theta_from=self.last.parameters)
        if self.estimates.switch_pending:
            old = self.independent_coordinates
            est = self._reseed_and_advance(t, efforts, obs, "ok", "")
            est.message = "; ".join(filter(None, [f"independent coordinates {list(old)} -> "
                                                  f"{list(self.independent_coordinates)} (window re-seeded)",
                                                  est.message]))
            return est
        substeps = stepper.substeps(t)
        if substeps[0] > self.config.max_substeps:
            return self._initialize(t, efforts, obs, Seed.extrapolated(self.last, t), "initialized",
                                    f"gap of {gap:.6g} s ({substeps[0]} steps): re-initialized")
        return self._advance_to(t, efforts, obs, "ok", [], resync=True, substeps=substeps)

    def _advance_to(self, t, efforts, obs, status, messages, resync=False, substeps=None) -> Estimate:
        """Integrate from the window's newest time to t (`Stepper.advance_to`), make the estimate and check it;
        with `resync`, readings that disagree with the prediction re-initialize from them."""
        try:
            self.stepper.advance_to(t, efforts, obs, messages, substeps)
        except ReadingsDisagree as why:
            if not resync:
                raise
            est = self._initialize(t, efforts, obs, Seed.extrapolated(self.last, t), "recovered",
                                   f"{why}: re-initialized from the readings", carry=why.turns)
            est.recovery = "turn" if why.turns else "lost_track"
            return est
        est = self._estimate(t, self.stepper.x, efforts, status, messages)
        self.estimates.check(est)
        self.last = est
        self._last_efforts = efforts
        ident = self.identification
        if ident is not None and status == "ok":
            if self._awaiting_first_fit(t):
                pass
            elif ident.settled_step():
                # the hold ends: the next step re-seeds the window (its steps hold θ tight) with θ's belief
                self._parameters_reset = True
                self._parameters_message = "identified parameters learning (the state has settled)"
            elif self._check_bounds(est):
                pass
            elif self.stepper.k % PARAMETER_CHECKPOINT_STEPS == 0 and self.stepper.k:
                # a healthy window's parameters, kept for a recovery that drops what a failing window learnt
                ident.carry(self.stepper.window, self.stepper.k, self.layout)
        if status == "ok":
            # only a step advanced as usual shows the state sane again: a recovery's own estimate (re-seeded
            # at a possibly diverged estimate) must not reset the escalation of `_recover`
            self._failures = 0
        return est

    def _check_bounds(self, est: Estimate) -> bool:
        """Where a friction or a payload is estimated below 0 (every `BOUND_CHECK_STEPS` steps while one is): those
        more than BOUND_SIGMAS of their marginal σ below are moved onto 0 (`Identification.project`), the next step
        re-seeding the window at that belief with the efforts' state moved to keep the forces
        (`_efforts_for_parameters`; True then)."""
        ident, k = self.identification, self.stepper.k
        theta = est.parameters
        self._bound_wait -= 1
        if theta is None or ident.held or self._bound_wait > 0 or not np.any(ident.nonnegative & (theta < 0.0)):
            return False
        self._bound_wait = BOUND_CHECK_STEPS
        try:
            std = ident.window_std(self.window, k, self.layout)
        except Exception:       # (a window that cannot give its marginal: checked again later)
            return False
        below = ident.below_bound(theta, std)
        if not below.any():
            return False
        ident.project(theta, std, below)
        self._parameters_reset = True
        self._parameters_message = ("identified " + ", ".join(
            f"{name} {theta[i]:.3g} ± {std[i]:.2g}" for i, name in enumerate(ident.names) if below[i])
            + f" below its bound 0 by more than {BOUND_SIGMAS:g}σ: moved onto 0 (the model's error, not the "
              "parameter's; the efforts take it)")
        return True

    def _awaiting_first_fit(self, t: float) -> bool:
        """Is θ's hold, at its last step, kept for the density fit's first estimate?  Until then the window weighs
        the readings with the configured densities; where the readings already reject those (the fit's bank,
        over its burn-in's second half: `DensityAdaptation.early_evidence`), they believe the model too much (on
        the DFKI double pendulum the acceleration density is 40–75× the default) and θ learnt against them takes
        up the model's errors (an elbow's viscous friction to 0.22 N·m·s/rad in 0.3 s, the reported effort 13 N·m
        off on C0 sysid 01 at 0.23 s).  Where they do not (a simulation of the model), θ learns at once; nor is
        it held where the densities are not fitted, or longer than `FIRST_FIT_SECONDS` after the hold began."""
        fit, ident = self.density_adaptation, self.identification
        if fit is None or ident.settling != 1 or fit.evidence >= MIN_EVIDENCE \
                or fit.early_evidence() < fit.early_rejection:
            return False
        if self._hold_began is None:
            self._hold_began = t
        return t - self._hold_began < FIRST_FIT_SECONDS

    def _estimate(self, t, x, efforts, status, messages) -> Estimate:
        st = self.stepper
        step = st.first_id + st.k
        est = self.estimates.make(t, x, efforts, status, messages, st.window, st.k, step)
        st.estimated()
        if self.config.smoothed_lag:
            # what `smoothed` needs of the estimated steps the window may still hold
            inputs = self._step_inputs
            inputs[step] = (t, efforts, status)
            while len(inputs) > self.config.window + 1:
                del inputs[next(iter(inputs))]
            self._pending_smoothed.append((step, est))
        return est

    def smoothed_estimates(self) -> List[Estimate]:
        """With `EstimatorConfig.smoothed_lag` L > 0: the estimates, in time order and each once, of the steps now
        L or more of the window's steps behind the newest (sub-steps count: a gap bridged by them makes the steps
        before it due at once), each at the window's current values (`smoothed`); a step whose window was replaced
        (re-initialization, reset) at that window's last values; one that left the window in one leap (a gap of
        more steps than the window holds) as it was estimated.  Empty with L = 0."""
        pending = self._pending_smoothed
        st = self.stepper
        if pending and st.window is not None:
            due = st.first_id + st.k - self.config.smoothed_lag
            while pending and pending[0][0] <= due:
                self._ready_smoothed.append(self._smoothed_or_made(*pending.popleft()))
        out, self._ready_smoothed = self._ready_smoothed, []
        return out

    def flush_smoothed(self) -> List[Estimate]:
        """`smoothed_estimates` and then every step still pending, at the window's current values (the end of a
        recording: nothing later will come)."""
        out = self.smoothed_estimates()
        self._drain_smoothed()
        out += self._ready_smoothed
        self._ready_smoothed = []
        return out

    def _drain_smoothed(self):
        """Every pending step's smoothed estimate, now (its window is about to be replaced), for the next
        `smoothed_estimates`."""
        pending = self._pending_smoothed
        while pending:
            self._ready_smoothed.append(self._smoothed_or_made(*pending.popleft()))

    def _smoothed_or_made(self, step: int, est: Estimate) -> Estimate:
        """`smoothed(step)`, else (no longer in the window, or a window in numerical trouble) `est` as made."""
        try:
            smoothed = self.smoothed(step)
        except Exception:
            smoothed = None
        return est if smoothed is None else smoothed

    def smoothed(self, step: int) -> Optional[Estimate]:
        """The estimate of an earlier step (its `Estimate.step`) at the window's current values: the fixed-lag
        smoother's, given every reading up to the newest step (later but better: on the real double pendulum,
        9 steps back the rates' error halves; bench/real_hardware.py).  Its time, commands and status are those
        of the step; None when the step is no longer (or never was) in the window: marginalized, or dropped by
        a re-initialization, and always with `smoothed_lag` 0 (the steps are then not recorded).  It changes
        nothing of the estimator's."""
        st = self.stepper
        record = self._step_inputs.get(int(step))
        if st.window is None or record is None:
            return None
        k = int(step) - st.first_id
        if k not in st.window.records:
            return None
        t, efforts, status = record
        return self.estimates.make(t, st.window.estimate(k), efforts, status, [], st.window, k, int(step),
                                   newest=False)

    # -- seeding and recovery -------------------------------------------------------------------
    def _initialize(self, t, efforts, obs, seed: Seed, status: str, message: str, carry: bool = True) -> Estimate:
        """A new window at t from `seed`, with this time's efforts and readings; `carry` false: the old window
        failed (numerically, or it lost track of its readings), and what it learnt of the identified parameters
        since their last checkpoint is dropped (a runaway parameter would otherwise outlive every recovery)."""
        modes = self.estimates
        ident = self.identification
        if ident is not None and not self._parameters_reset:
            if carry and self.stepper.window is not None:
                # what the old window learnt of the identified parameters goes into the new one
                ident.carry(self.stepper.window, self.stepper.k, self.layout)
            else:
                # a fresh start or a failed window: θ held until the new window's state has settled
                ident.settle(max(self.config.window, round(SETTLE_SECONDS / self.config.dt)))
                self._hold_began = t
        self._parameters_reset = False
        window, x = self.seeder.seed(seed, efforts, obs, modes.mode)
        self._drain_smoothed()         # (the old window's steps, at its last values)
        self.stepper.start(window, x, t)
        modes.switch_pending = False
        messages = [message] if message else []
        unknown = self.sensors.unknown(obs)
        if unknown:
            messages.append(f"ignored unknown observations {unknown}")
        mode_before = modes.mode
        modes.mode = None          # the new window defines the mode
        est = self._estimate(t, x, efforts, status, messages)
        if mode_before is not None and est.assembly_mode.size and not np.array_equal(est.assembly_mode, mode_before):
            est.message = "; ".join(filter(None, [est.message,
                                                  f"assembly mode is now {modes.mode_text(est.assembly_mode)}"]))
        self.estimates.check(est)
        self.last = est
        self._last_efforts = efforts
        return est

    def _reseed_at_last(self):
        """The new window at the last estimate's time from the position `reinitialize` solved there (with
        that time's readings and efforts, the last velocity and efforts)."""
        (q, obs_then, efforts_then, same_branch), self._reseed = self._reseed, None
        prior = marginal_prior(self.window, self.stepper.k, self.factors, self.sigmas, correlated=same_branch)
        efforts_prior = effort_marginal(self.window, self.stepper.k, self.factors)
        self._initialize(self.last.t, efforts_then, obs_then, Seed.requested(q, self.last, prior, efforts_prior),
                         "initialized",
                         self.REINITIALIZED)
        self._reseeded = True

    def _reseed_and_advance(self, t, efforts, obs, status, message, shift=None, carry=True,
                            theta_from=None, resync=False) -> Estimate:
        """Re-seed the window AT the last good estimate (same time, so no extrapolation error; priors on
        its q, q̇ projected on the constraints) and integrate to t as usual; `shift` (coordinate, turns): that
        angle moved by whole turns (the same pose); `theta_from`: the identified parameters' values in the old
        window, the new one's starting from their belief (`_efforts_for_parameters`); `resync`: readings that
        disagree with the prediction at t re-initialize from them (`_advance_to`)."""
        last = self.last
        efforts_prior = effort_marginal(self.window, self.stepper.k, self.factors)
        if theta_from is not None:
            efforts_prior = self._efforts_for_parameters(efforts_prior, theta_from)
        seed = Seed.at_estimate(last, efforts_prior)
        if shift is not None:
            q = last.q.copy()
            q[shift[0]] += 2.0 * math.pi * shift[1]
            seed = replace(seed, q=q)
        seen = list(self.gate.seen)
        self._initialize(last.t, self._last_efforts, {}, seed, status, "", carry)
        # the sensors read up to the last estimate were read at the new window's first step at the latest: the
        # steps integrated from there to t are an outage of theirs, as in the old window (a reading after a
        # long gap that the prediction drifted from re-initializes, `InnovationGate.screen`)
        self.gate.seen.update(dict.fromkeys(seen, 0))
        if t - self.stepper.t > 1e-9 * self.config.dt:
            return self._advance_to(t, efforts, obs, status, [message], resync=resync)
        est = self.last
        est.message = message
        return est

    def _efforts_for_parameters(self, efforts_prior, theta_from):
        """The efforts' state for a window whose identified parameters start from their belief instead of
        `theta_from` (a hold's end, a relearning, a thaw, a reset to the priors): its mean moved so that the
        efforts plus the parameters' forces stay what they were, its variance raised by the new mean's square
        and the move's (what the efforts' state holds may be what θ is to explain: held, θ left it all to the
        disturbance).  Neither kept as it was (on the crank four-bar a disturbance of −10 % of the command kept
        the gain at 0.97–0.985 for 0.9 s) nor started again under the weak initial priors (the real double
        pendulum's disturbance then swung to −5 N·m within 2 ms, and its friction with it: elbows' effort error
        from 0.5 s 0.18 → 0.095 N·m, bench/real_hardware.py --identify).  None where there is no such state."""
        if efforts_prior is None:
            return None
        ident, last, n = self.identification, self.last, self.efforts.n_state
        known = self.efforts.known(self._last_efforts)
        moved = (ident.forces(theta_from, last.v, known, last.a)
                 - ident.forces(ident.mean, last.v, known, last.a))[self.efforts.state_coordinates]
        mean, P = efforts_prior[0].copy(), efforts_prior[1].copy()
        mean[:n] += moved
        i = np.arange(n)
        P[i, i] += mean[:n] ** 2 + moved ** 2
        return mean, P

    def _far_text(self) -> str:
        monitor = self.stepper.monitor
        return ", ".join(f"{name} for {n} steps" for name, n in monitor.far.items())

    def _recover(self, t, efforts, obs, exc) -> Estimate:
        """After a numerical failure: re-seed at the last good estimate and integrate to t; if that fails
        too (or failures repeat), re-initialize at t from an extrapolation; if even that fails, return the
        previous estimate and retry at the next step.  Never raises."""
        reason = f"{type(exc).__name__}: {exc}"
        last = self.last
        self.recoveries += 1
        self._failures += 1
        errors = []
        # an estimate already far from its readings before it failed has lost track: not re-seeded at, but
        # re-initialized from the readings
        monitor = self.stepper.monitor
        lost = bool(monitor is not None and monitor.far and self.sensors.read_coordinates(obs))
        if last is not None:
            # the last estimate is trusted less with each failure not separated by a usual step: re-seed at it,
            # then re-initialize at its extrapolation, then start afresh from the readings (a diverged estimate
            # would otherwise seed every retry, failing forever: seen under sustained overload at 1 kHz)
            n = self._failures
            attempts = ((["reseed"] if n <= 2 and not lost else [])
                        + (["extrapolated"] if n <= self.TRUST_LAST_FAILURES else []) + ["fresh"])
            for attempt in attempts:
                try:
                    if attempt == "reseed":
                        # (integrated again from it: readings that disagree with that prediction re-initialize
                        # from them, as after a usual step; a gap's drift would otherwise be taken for outliers)
                        return self._reseed_and_advance(
                            t, efforts, obs, "recovered",
                            f"numerical failure ({reason}): re-seeded at the last good estimate (t={last.t:.6g})",
                            carry=False, resync=True)
                    if attempt == "extrapolated":
                        est = self._initialize(t, efforts, obs, Seed.extrapolated(last, t), "recovered",
                                               carry=False, message=f"numerical failure ({reason})"
                                               + (f" of an estimate far from its readings ({self._far_text()}): "
                                                  f"re-initialized from the readings" if lost else
                                                  f": re-initialized at t={t:.6g}"))
                    else:
                        est = self._initialize(t, efforts, obs, self.seeder.fresh(False), "recovered",
                                               carry=False, message=f"numerical failure ({reason}): started afresh "
                                               f"from the readings "
                                               f"at t={t:.6g} ({n} failures in a row)")
                    if lost:
                        est.recovery = "lost_track"
                    return est
                except Exception as exc2:
                    errors.append(f"{type(exc2).__name__}: {exc2}")
        self.stepper.window = None   # retry the initialization at the next step
        self._retry = reason
        if last is None:
            return self.estimates.waiting(t, self.seeder.initial_guess(), f"cannot initialize yet ({reason})")
        est = copy_estimate(last)
        est.q, est.v = extrapolated(last, t)
        est.t, est.status = t, "recovered"
        est.message = (f"numerical failure ({reason}); re-initialization failed ({'; '.join(errors)}): "
                       f"extrapolated previous estimate, retrying at the next step")
        return est
