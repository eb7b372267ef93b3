"""Configuration and result types shared by the estimators, the command line and the ROS node."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

import numpy as np

from mbfg_ros.factors.noise import default_sigmas
from mbfg_ros.model.spec import EFFORT_KINDS, MAX_ACTUATOR_DELAY, is_actuator_delay, is_effort_sigma

MODES = ("forward_dynamics", "estimation", "fused")
FORMULATIONS = ("dependent", "independent")
INTEGRATORS = ("trapezoidal", "hermite", "euler")


@dataclass(frozen=True)
class EstimatorConfig:
    dt: float = 1e-3
    window: int = 10                       # Nw: steps kept in the fixed-lag window
    mode: str = "forward_dynamics"         # forward_dynamics | estimation | fused
    formulation: str = "dependent"         # dependent | independent coordinates
    integrator: str = "trapezoidal"        # trapezoidal | hermite (4th order) | euler
    independent: Tuple[str, ...] = ()      # independent coordinate names (independent formulation); auto if empty
    # noise parameters by name (`factors.noise`); those not given take the defaults scaled to the mechanism
    sigmas: Dict[str, float] = field(default_factory=dict)
    sensor_sigmas: Dict[str, float] = field(default_factory=dict)   # per-sensor override by sensor name
    # per actuator (joint name) whose effort (or disturbance) is a state, its share of the density: its walk's
    # density is the density × the share, the shares normalized to geometric mean 1 (those not given: 1); the
    # start of the online fit (`adapt_densities`, estimation mode), else used as given
    effort_shares: Dict[str, float] = field(default_factory=dict)
    assembly_mode: Optional[Tuple[int, ...]] = None                 # requested branch (±1 per indicator)
    # per actuator (joint name) its effort kind, estimated | commanded | passive, over the mechanism's `effort`
    # keys (those not given: the mechanism's, else as the mode says): estimation/efforts.py
    actuator_efforts: Dict[str, str] = field(default_factory=dict)
    # per actuator (joint name) the time [s] from a command to its application, over the mechanism's `delay`
    # keys (estimation/actuator_delay.py)
    actuator_delays: Dict[str, float] = field(default_factory=dict)
    # per actuator (joint name) the time constant [s] of its lag after the delay, over the mechanism's
    # `time_constant` keys
    actuator_time_constants: Dict[str, float] = field(default_factory=dict)
    # per actuator (joint name) the 1σ of its applied effort about its response to the command, over the
    # mechanism's `effort_sigma` keys (part of the published σ of its effort unless it is passive)
    actuator_effort_sigmas: Dict[str, float] = field(default_factory=dict)
    # actuator parameters identified online, JOINT.PARAMETER[=SIGMA] entries (PARAMETER: gain, viscous_friction,
    # coulomb_friction); None: the mechanism's `identify:` section; (): none (estimation/identification.py)
    identify: Optional[Tuple[str, ...]] = None
    adapt_densities: bool = True           # estimation and fused modes: fit the process densities online
                                           # (effort_density or disturbance_density, and acceleration_density,
                                           # starting from sigmas' values) by the innovation likelihood of the
                                           # encoders (one per degree of freedom; else they stay fixed):
                                           # estimation/density_adaptation.py
    adapt_deflection: bool = True          # estimation mode with adapt_densities: a deflection state for each
                                           # encoder on a geared actuator, its σ fitted online (and, where
                                           # sigmas.deflection_sigma > 0 is set, the fit starts there); false: a
                                           # deflection only where that σ is set, held: estimation/deflection.py
    effort_bandwidth: float = 3.0          # [Hz] estimation mode with adapt_densities: the online fit keeps the
                                           # unmodelled accelerations below the unknown efforts' spectrum up to
                                           # this frequency (slower unexplained motion is effort); 0: the
                                           # likelihood alone (density_adaptation.py, docs/decisions.md)
    adapt_sensor_sigmas: bool = True      # estimation and fused modes: fit each encoder's σ online from its
                                           # readings' scatter, never below the stated σ (sensor_sigmas or the
                                           # mechanism file's): estimation/sigma_adaptation.py
    smoothed_lag: int = 0                  # > 0: each estimate again once the window holds this many steps after
                                           # it, smoothed by their readings (FixedLagEstimator.smoothed_estimates;
                                           # < window)
    compute_covariance: bool = False       # the newest state's marginal: Estimate.covariance (q, q̇) and the 1σ
                                           # fields (one more marginal a step: off unless asked for)
    # fixed-lag estimator internals (mbfg_ros.estimation.estimator.FixedLagEstimator)
    relinearize_threshold: Optional[float] = None  # whitened mismatch that triggers re-linearizing a step;
                                           # None: 1e-3 for steps without readings, 10 for steps with readings
    max_relinearizations: int = 3          # rounds per step
    check_interval: int = 8                # the newest step's relinearization check may be skipped when a
                                           # quadratic bound shows it cannot trigger, at most check_interval − 1
                                           # steps in a row (1 = check every step; see graph.FixedLagWindow)
    relinearize_scope: str = "newest"      # steps checked after each update: newest | ends (also the step about
                                           # to be marginalized) | window (all: the full nonlinear smoother)
    max_constraint_residual: float = 1e-2  # max |Φ(q)| above which a step counts as a numerical failure
    max_speed: float = 1e4                 # max |q̇| above which a step counts as diverged
    max_substeps: int = 10000              # longest time gap (in dt) bridged by integrating; longer: re-initialize
    blas_threads: int = 1                  # limit OpenBLAS threads of this process (0 = leave alone)
    outlier_gate: float = 100.0            # reject a reading whose residual at the prediction exceeds this many
                                           # sigmas (0 = off; through a deflection √(σ² + σ_b²)) ...
    max_rejections: int = 10               # ... unless it was rejected this many consecutive steps (then the
                                           # window is re-initialized from the readings: the estimate lost track)
    lost_track_sigmas: float = 30.0        # an encoder's reading farther than this many of its σ (and than 1e-3
                                           # of the mechanism's scale) from the new estimate for more than
                                           # max_rejections steps in a row: lost track, re-initialized from the
                                           # readings (0 = off; sensors.TrackMonitor)
    outage_steps: int = 20                 # after a sensor was silent this many steps, a reading outside the gate
                                           # re-initializes at once (the prediction ran on the model alone)

    def validated(self) -> "EstimatorConfig":
        problems = []
        if not (self.dt > 0 and np.isfinite(self.dt)):
            problems.append(f"dt must be a positive number of seconds (got {self.dt})")
        if int(self.check_interval) != self.check_interval or self.check_interval < 1:
            problems.append(f"check_interval must be an integer ≥ 1 (got {self.check_interval})")
        if int(self.window) != self.window or self.window < 1:
            problems.append(f"window must be an integer ≥ 1 (got {self.window})")
        elif int(self.smoothed_lag) != self.smoothed_lag or not 0 <= self.smoothed_lag < self.window:
            problems.append(f"smoothed_lag must be an integer from 0 to window − 1 = {int(self.window) - 1} (got "
                            f"{self.smoothed_lag}): the window holds the steps it smooths")
        if not (self.effort_bandwidth >= 0 and np.isfinite(self.effort_bandwidth)):
            problems.append(f"effort_bandwidth must be a finite number of Hz ≥ 0 (got {self.effort_bandwidth})")
        if not (self.lost_track_sigmas >= 0 and np.isfinite(self.lost_track_sigmas)):
            problems.append(f"lost_track_sigmas must be a finite number ≥ 0 (got {self.lost_track_sigmas})")
        if self.mode not in MODES:
            problems.append(f"mode must be one of {', '.join(MODES)} (got '{self.mode}')")
        if self.formulation not in FORMULATIONS:
            problems.append(f"formulation must be one of {', '.join(FORMULATIONS)} (got '{self.formulation}')")
        if self.integrator not in INTEGRATORS:
            problems.append(f"integrator must be one of {', '.join(INTEGRATORS)} (got '{self.integrator}')")
        for k, s in {**self.sigmas, **self.sensor_sigmas}.items():
            # a time constant may be infinite (no damping); a deflection σ of 0 is none
            if k == "deflection_sigma" and s == 0:
                continue
            if not (s > 0 and (np.isfinite(s) or k in ("disturbance_time_constant", "effort_rate_time_constant"))):
                problems.append(f"noise parameter '{k}' must be > 0 (got {s})")
        for name, share in self.effort_shares.items():
            if isinstance(share, bool) or not isinstance(share, (int, float)) or not (share > 0 and np.isfinite(share)):
                problems.append(f"effort_shares.{name} must be a positive finite number (got {share!r})")
        for name, kind in self.actuator_efforts.items():
            if kind not in EFFORT_KINDS:
                problems.append(f"actuator '{name}': effort kind must be one of {', '.join(EFFORT_KINDS)} "
                                f"(got {kind!r})")
        for key, times in (("actuator_delays", self.actuator_delays),
                           ("actuator_time_constants", self.actuator_time_constants)):
            for name, delay in times.items():
                if not is_actuator_delay(delay):
                    problems.append(f"{key}.{name} must be a time in seconds, >= 0 and under "
                                    f"{MAX_ACTUATOR_DELAY:g} (got {delay!r})")
        for name, sigma in self.actuator_effort_sigmas.items():
            if not is_effort_sigma(sigma):
                problems.append(f"actuator_effort_sigmas.{name} must be a finite number >= 0 (got {sigma!r})")
        unknown = set(self.sigmas) - set(default_sigmas())
        if unknown:
            problems.append(f"unknown noise parameter names {sorted(unknown)} (known: {sorted(default_sigmas())})")
        if problems:
            raise ValueError("; ".join(problems))
        return self


@dataclass
class Estimate:
    """The estimate at time t (the newest state of the window)."""
    t: float
    q: np.ndarray                 # generalized positions (n)
    v: np.ndarray                 # generalized velocities (n)
    a: np.ndarray                 # generalized accelerations (n)
    Q: np.ndarray                 # generalized forces (n), gravity included
    efforts: np.ndarray           # efforts on the actuated coordinates, actuator order: estimated (estimation),
                                  # commanded (forward_dynamics), command + estimated disturbance (fused)
    assembly_mode: np.ndarray     # ±1 per assembly-mode indicator
    constraint_residual: float    # max |Φ(q)|
    solve_time: float             # wall seconds spent in this step
    status: str = "ok"            # ok | initialized | recovered | waiting
    message: str = ""
    covariance: Optional[np.ndarray] = None   # marginal covariance of [q, v] if requested
    step: int = -1                # id of the estimator step this estimate is of (never reused; -1: none):
                                  # late readings of that step are addressed by it
    disturbance: Optional[np.ndarray] = None  # fused mode: estimated applied − commanded efforts (actuator order)
    # 1σ of the newest state's marginal (with compute_covariance): [q, q̇, q̈] stacked (3n), the efforts
    # (actuator order; 0 when commanded) and the disturbance (fused mode)
    std: Optional[np.ndarray] = None
    efforts_std: Optional[np.ndarray] = None
    disturbance_std: Optional[np.ndarray] = None
    # why a "recovered" estimate re-initialized: "turn" (a multi-turn encoder read whole turns from the
    # prediction), "lost_track" (it stopped following its readings: they kept disagreeing with the prediction,
    # or stayed far from the estimate, or it failed numerically while far from them; re-initialized from the
    # readings), "" (a numerical failure, or not recovered)
    recovery: str = ""
    # the identified actuator parameters (`FixedLagEstimator.parameter_names`), the newest state's estimate
    parameters: Optional[np.ndarray] = None
