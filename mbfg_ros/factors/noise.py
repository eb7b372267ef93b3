"""The estimator's noise parameters and their defaults.

* The sigmas of the exact model's rows (paper Table 2: tight weights chosen for simulation): the integrators
  and the dynamics in forward-dynamics mode, the constraints and priors in every mode.  They are numerical
  tolerances, not a model of the unknown: the forward-dynamics accuracy rests on them.
* The continuous-time white-noise densities of the estimation and fused modes, in physical units: the
  unmodelled accelerations (they replace the integrators' sigmas, `factors.white_acceleration_sigmas`) and
  the unknown efforts or the disturbance (their second derivative, `factors.IntegratedRandomWalk`), and the
  disturbance's time constant (its prior damped back to 0, seconds).
  Defaults measured with bench/stochastic_model.py (crank four-bar, encoder σ 1 mrad at 1 kHz) and carried
  to every other mechanism by its scale (`mechanism_scale`): a density in (N·m)²/s³ of a 1-kg pendulum is not
  that of a 24-kg robot.  A mechanism's efforts scale with τ_c = M·g·R (N·m; M·g in N where every actuator
  is prismatic) and its motions with T = √(R/g) (M its total mass, R its reach, g standard gravity: a scale,
  also for a mechanism without gravity), so each density is its value on the crank four-bar times the ratio of
  its unit in those scales (efforts: τ_c²/T³, accelerations: 1/T³), and so are the start-up priors (efforts
  τ_c, their rate τ_c/T, velocities 1/T); `model.plausibility.mechanism_scale` gives (τ_c, T).  The
  disturbance's time constant is not scaled: it is the longest the online fit tries (density_adaptation), the
  readings choose a shorter one.  On the crank four-bar the defaults are the measured numbers.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Dict, Optional, Tuple

if TYPE_CHECKING:  # pragma: no cover
    from mbfg_ros.model.spec import MechanismSpec


# the shipped densities of the estimation and fused modes (bench/stochastic_model.py)
ACCELERATION_DENSITY = 1e-3
EFFORT_DENSITY = 5e4        # robust across the bench scenarios: ≤ 1.3× the truth-tuned EKF (docs/decisions.md)
DISTURBANCE_DENSITY = 3e3
DISTURBANCE_TIME_CONSTANT = 1.0   # [s] (the start of the online fit, which only shortens it: density_adaptation)
#: a time constant this long or longer is none (no damping): the node's parameters cannot be infinite
FOREVER = 1e15
DEFLECTION_TIME_CONSTANT = 0.05   # [s] of the encoders' deflection where one is configured (estimation/deflection.py)
EFFORT_RATE_TIME_CONSTANT = FOREVER   # [s] none: the integrated random walk (docs/decisions.md: the readings of
                                      # real motors prefer ~0.1 s, which moves the effort error both ways)


from mbfg_ros.model.plausibility import STANDARD_GRAVITY  # noqa: E402  (the scale's g)

#: the crank four-bar's scale (mechanisms/four_bar_crank.yaml: 7 kg, reach 4 m), where the defaults were measured
REFERENCE_EFFORT_SCALE = 7.0 * STANDARD_GRAVITY * 4.0          # τ_c [N·m]
REFERENCE_TIME_SCALE = math.sqrt(4.0 / STANDARD_GRAVITY)        # T [s]
#: the defaults that follow the mechanism's scale: name -> (power of τ_c, power of T) of their unit
SCALED = {"acceleration_density": (0, -3), "effort_density": (2, -3), "disturbance_density": (2, -3),
          "initial_effort": (1, 0), "initial_effort_rate": (1, -1), "initial_velocity": (0, -1)}


def default_sigmas(spec: Optional["MechanismSpec"] = None) -> Dict[str, float]:
    """The noise parameters by name (see the module docstring), units in the comments; with a mechanism's
    `spec`, those that follow its scale (`SCALED`) scaled to it."""
    sigmas = _reference_sigmas()
    if spec is not None:
        from mbfg_ros.model.plausibility import mechanism_scale
        effort, time = mechanism_scale(spec)
        re, rt = effort / REFERENCE_EFFORT_SCALE, time / REFERENCE_TIME_SCALE
        for name, (pe, pt) in SCALED.items():
            sigmas[name] *= re ** pe * rt ** pt
    return sigmas


def _reference_sigmas() -> Dict[str, float]:
    return {
        "prior_q0": 1e-5,            # f_prior on q0 (covariance 1e-10)
        "prior_v0": 1e-5,
        "integrator": 1e-3,          # f_ti (q–q̇ and q̇–q̈), forward dynamics only
        "dynamics": 1e-3,            # f_dyn / f_idyn rows, acceleration units (with estimated efforts τ absorbs them)
        "position_constraints": 1e-3,
        "velocity_constraints": 1e-3,
        "acceleration_constraints": 1e-3,
        "soft_equality": 10.0,       # f_eq (covariance 1e2)
        # estimation and fused modes: continuous-time white-noise densities in physical units
        "acceleration_density": ACCELERATION_DENSITY,   # unmodelled accelerations, (unit of q)²/s³
        "effort_density": EFFORT_DENSITY,               # τ̈ of unknown efforts (estimation), (N·m)²/s³ or N²/s³
        "disturbance_density": DISTURBANCE_DENSITY,     # d̈ of the disturbance (fused), (N·m)²/s³ or N²/s³
        "disturbance_time_constant": DISTURBANCE_TIME_CONSTANT,  # s: the disturbance damped back to 0 (inf: not)
        "effort_rate_time_constant": EFFORT_RATE_TIME_CONSTANT,  # s: the unknown efforts' rate damped (≥ 1e15: not)
        "deflection_sigma": 0.0,     # stationary σ of the encoders' deflection (units of q; 0: none)
        "deflection_time_constant": DEFLECTION_TIME_CONSTANT,   # s: the deflection's time constant
        "initial_effort_rate": 10.0,  # prior on the effort (disturbance) rate at a window's start, N·m/s
        "initial_effort": 100.0,     # weak prior on the unknown efforts at the first step (estimation, fused)
        "initial_velocity": 10.0,    # weak prior on an unknown initial velocity (estimation, fused; no v0 given)
        "observed_coordinate": 1e-3, # generic observations 'q:<name>', 'v:<name>', 'a:<name>' (unless in sensor_sigmas)
    }


def noise_descriptions() -> Dict[str, str]:
    """What each noise parameter is, with its units (the node's parameter descriptions, the README)."""
    return {
        "prior_q0": "σ of the prior on the initial positions (units of q: m, rad)",
        "prior_v0": "σ of the prior on the initial velocities (m/s, rad/s)",
        "integrator": "σ of the integrator rows, forward_dynamics mode only (a numerical tolerance; units of q, q̇)",
        "dynamics": "σ of the equations-of-motion rows (m/s², rad/s²; a numerical tolerance)",
        "position_constraints": "σ of the position-constraint rows (a numerical tolerance, units of Φ)",
        "velocity_constraints": "σ of the velocity-constraint rows (a numerical tolerance, units of Φ̇)",
        "acceleration_constraints": "σ of the acceleration-constraint rows (independent formulation; units of Φ̈)",
        "soft_equality": "σ of the predictive soft equality on q (independent formulation; m, rad)",
        "acceleration_density": "estimation/fused: spectral density of the unmodelled accelerations, white noise "
                                "on every integrated coordinate [m²/s³ on point coordinates, rad²/s³ on angles]",
        "effort_density": "estimation: spectral density of the unknown efforts' second derivative (integrated "
                          "random walk, per actuator) [(N·m)²/s³ on revolute, N²/s³ on prismatic actuators]",
        "disturbance_density": "fused: spectral density of the disturbance's second derivative (applied = command + "
                               "disturbance, per actuator) [(N·m)²/s³, N²/s³]",
        "disturbance_time_constant": "fused: time constant over which the disturbance's prior returns to 0 "
                                     "(critically damped; bounds its prediction without readings; a very large "
                                     "value: an undamped integrated random walk) [s]",
        "effort_rate_time_constant": "estimation: time constant over which the unknown efforts' rate forgets "
                                     "(τ̈ = −τ̇/T + w: between the integrated random walk, ≥ 1e15, and a random "
                                     "walk of density S·T², T → 0) [s]",
        "deflection_sigma": "estimation/fused: stationary σ of each encoder's deflection, what a motor encoder behind "
                            "a gear reads beyond its coordinate (first-order Gauss–Markov; 0: none) [rad, m]",
        "deflection_time_constant": "estimation/fused: time constant of the encoders' deflection [s]",
        "initial_effort_rate": "σ of the prior on the effort (disturbance) rate when a window starts [N·m/s, N/s]",
        "initial_effort": "σ of the prior on the unknown efforts (disturbance) when a window starts [N·m, N]",
        "initial_velocity": "σ of the prior on an unknown initial velocity (estimation, fused) [m/s, rad/s]",
        "observed_coordinate": "σ of the generic readings 'q:<name>', 'v:<name>', 'a:<name>' (units of the reading)",
    }

