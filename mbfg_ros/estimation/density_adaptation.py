"""Online maximum-likelihood fit of the process densities (`EstimatorConfig.adapt_densities`): the unknown
efforts' density (estimation mode) or the disturbance's density and time constant (fused mode), jointly with the
unmodelled accelerations' density.

No single pair of densities fits every mechanism and motion: the four-bar needs an effort density ≤ 1e4, the
slider-crank ~3e5, the robot ≥ 1e5 (N·m)²/s³ (docs/decisions.md); on a simulation the unmodelled accelerations
are rounding, on a real machine (a gear's play and elasticity, readings stamped late, a model's error) the
readings move 30–300× more than the crank four-bar's default says (bench/real_hardware.py), and with the
acceleration density held there every unexplained motion is read as effort (the double pendulum's estimated
torque 5× the measured one at full band).  Matching the innovations' covariance cannot see a density that is
too large, while the readings' likelihood peaks sharply.  So the estimator fits both, as `mbfg tune` does
offline, by the innovation likelihood of its own readings, online:

* a bank of K = Kₑ × Kₐ (× K_T) Kalman filters, one per pair of densities on a 2-D log grid (half decades, ±
  `GRID_DECADES` around the starting density of the efforts; whole decades, `ACCELERATION_DECADES` below and
  above the starting acceleration density: the estimates stay within it) and, in fused mode with a finite time
  constant, per time constant of the disturbance (half decades, `TIME_CONSTANT_DECADES` below the start, none
  under `MIN_TIME_CONSTANT_SAMPLES` of the bank's sample intervals, that bound itself where the half decades
  step past it; the density's axis then ±
  `FUSED_GRID_DECADES`): a 3-D grid, each filter on the linear model of the encoded
  coordinates z (one encoder per degree of freedom) around the estimator's newest estimate:
      z̈ = u + B τ + ξ,   τ̈ = −(2/T) τ̇ − τ/T² + w,
  u = the model's acceleration without the state's efforts at the estimates (gravity, velocity terms and the
  known efforts: in fused mode the commands, and any actuator declared commanded or passive: a quadratic in time through the estimates of the bank's step, integrated exactly;
  `drift_weights`), B = ∂z̈/∂τ (the reduced inverse inertia, refreshed every `B_REFRESH` s), τ the unknown
  efforts (estimation, T = ∞) or the disturbance (fused, T its time constant) of the actuators whose τ is a
  state (``actuated``: the estimator's `EffortModel.state_coordinates`), w white of the filter's effort
  density, ξ the unmodelled accelerations (white of the filter's acceleration density on every generalized
  coordinate, which the constraints restrict to Sₐ (JᵀJ)⁻¹ on z, J = ∂q/∂z); the exact discretization over
  the bank's step (`reduced_ekf.discretize`), the state (z, ż, τ, τ̇);
* every filter predicts and updates with the same encoder readings; the log-likelihood of each filter's
  innovation (log N(ν; 0, S)) is summed per filter, old evidence forgotten with time constant `MEMORY` s;
* the densities are the maximum of the summed log-likelihood plus weak log-normal priors around the starting
  values (σ `PRIOR_DECADES` decades), located by a parabola along each axis through the best grid point
  and its neighbours (in log density; the time constant's in its bandwidth 1/T) (fused mode: once the readings
  reject the starting values, `RELEASE_PROBABILITY`).

With `effort_bandwidth` f > 0 (estimation mode's bank of undamped efforts) the estimate handed on is the best
grid point whose efforts' spectrum stays above the white accelerations' up to f (`_within_bandwidth`): by the
likelihood alone the accelerations may take in motion down to ~1 Hz on a machine whose readings move faster than
its model says, and the efforts then follow none of it; the likelihood's own estimate (`free_density`,
`free_acceleration_density`) is kept beside it for the other banks and the edges (`limits`).

A bank may fit one more axis at the others' current estimates (`FixedLagEstimator` runs them in a coordinate
ascent): the encoders' deflection σ (`fit_deflection`), the efforts' shares of the density (`fit_shares`), or
boosts (`boosts`): the efforts' densities are fitted to the motion of the last `MEMORY` s, and a machine that
turns fast (the DFKI acrobot's last second, its elbow's torque reversing by 10 N·m within 20 ms) outruns them:
the estimate trails its readings by 10–15 mrad.  The boosts' bank forgets over `BOOST_MEMORY` s and raises one
actuator's density by 0.5–2 decades while that short evidence rejects the unraised densities (½ χ²₁ at
`GATE_PROBABILITY`, 12 nats); the estimator multiplies that actuator's density by it (the long fits do not see it).

Robustness: the bank steps at most every `BANK_INTERVAL` s of readings (decimated like `mbfg tune`: the
densities are continuous-time quantities); a reading whose normalized innovation is improbable (χ² gate) under
every filter's densities is not counted (outliers; `MAX_REJECTED` in a row restart the filters: they lost the
motion), one improbable under some of them enters their likelihood at the gate's value (a bounded influence), nor any reading during `BURN_IN` s after the bank (re)starts (its filters start from the estimator's
estimate with broad priors: start-up, re-initialization, recovery, a gap over `MAX_GAP` s, a branch change); the
estimates change only with counted readings (steps without readings do nothing) and are used only after
`MIN_EVIDENCE` s of counted readings.  Units: the effort density in (N·m)²/s³ (revolute actuators) or N²/s³
(prismatic), the acceleration density in rad²/s³ on angles, m²/s³ on point coordinates.
"""

from __future__ import annotations

import math
from typing import Dict, Optional

import numpy as np

from mbfg_ros.dynamics import constrained as dynamics
from mbfg_ros.estimation.reduced_ekf import discretize, encoded_acceleration_noise
from mbfg_ros.factors.noise import FOREVER
from mbfg_ros.model.mechanism import Mechanism

__all__ = ["DensityAdaptation", "encoded_coordinates", "drift_weights", "round_to_ns", "limits_warning",
           "effort_directions", "bandwidth_gain", "crossover_frequency"]

GRID_DECADES = 4.0     # the bank's effort densities: start × 10^(−4 … +4) ...
GRID_STEP = 0.5        # ... every half decade (17) ...
ACCELERATION_DECADES = (2.0, 4.0)   # ... its acceleration densities: start × 10^(−2 … +4): the default is a
                       # simulation's (a floor), real machines sit 1.5–4 decades above it (bench/real_hardware.py) ...
ACCELERATION_STEP = 1.0   # ... every decade (7): the likelihood is flat over a decade about its peak, and the
                       # bank's cost is its filter count (docs/decisions.md)
TIME_CONSTANT_DECADES = (1.5, 0.0)  # fused mode: the disturbance's time constants, start × 10^(−1.5 … 0) ...
TIME_CONSTANT_STEP = 0.5   # ... every half decade (4), none below `min_time_constant` (itself one where the
                       # ladder steps past it).  Shorter only: the start is the slowest correction a trusted
                       # actuator's command needs; on real motors the readings ask for 0.1 s or less
                       # (docs/decisions.md)
FUSED_GRID_DECADES = 3.0   # fused mode: the disturbance densities, start × 10^(−3 … +3) (the time constant's axis
                       # takes up what the effort axis's outer decades covered: fits within ±1 decade of the start)
PRIOR_DECADES = 1.0    # σ of the weak log-normal priors around the starting densities [decades]
MEMORY = 10.0          # [s] time constant over which old evidence is forgotten (follows a change of motion)
BANK_INTERVAL = 0.02   # [s] the bank steps at most this often (every m-th estimator step; longer, a quadratic
                       # through a swinging crank's drift biases the density: docs/decisions.md)
B_REFRESH = 0.1        # [s] ∂z̈/∂τ refreshed this often (it changes with the pose) ...
SA_REFRESH = 1.0       # [s] ... and the acceleration noise's shape on z this often
BURN_IN = 0.25         # [s] of readings after a (re)start that update the filters but are not counted
EARLY = 0.1            # [s] after a (re)start from which the burn-in's readings are `early_evidence`
MIN_EVIDENCE = 0.25    # [s] of counted readings before the estimate is used
MAX_GAP = 0.1          # [s] a longer time between the bank's steps restarts it
GATE_PROBABILITY = 1e-6  # a reading whose normalized innovation is this improbable (χ²) under every filter is
                       # not counted; under some filters only, it enters their likelihood at this quantile (robust:
                       # a wrong command for 0.2 s, probable only under the grid's largest densities, otherwise
                       # took both fits to the grid's top for the memory's 10 s)
MAX_REJECTED = 3       # readings refused in a row after which the filters restart (they lost the motion)
CHANGE = 0.1           # [decades] a smaller change of an estimate is not passed on (saves rebuilding units)
MIN_TIME_CONSTANT_SAMPLES = 2.0   # no disturbance time constant shorter than this many of the bank's sample
                       # intervals (max(dt, BANK_INTERVAL), dt the estimator's step), which is then itself a grid point: shorter, the
                       # disturbance is white between samples and trades against the acceleration density; a
                       # longer bound held the real motors' fits at it (docs/decisions.md)
DEFLECTION_REFERENCE = 1e-3   # [rad, m] the middle of the deflection's grid (`fit_deflection`): a gear's play
DEFLECTION_STEP = 0.5          # [decades] between its points ...
DEFLECTION_GRID = (0.0,) + tuple(DEFLECTION_REFERENCE * 10.0 ** (DEFLECTION_STEP * k) for k in range(-2, 3))
                               # ... none, then 0.1–10 mrad (mm)
BOOST_MEMORY = 0.5     # [s] the boosts' bank (`boosts`) forgets its evidence this fast: a swing's worth ...
BOOST_GRID = (0.5, 1.0, 1.5, 2.0)   # ... and puts each actuator's density this many decades above its own;
BOOST_SETTLED = 2.0    # [s] the estimator applies the boosts once the density fit's evidence spans this (four of the
                       # boosts' memories: before, the two are as quick; on the simulated slider-crank the boosts
                       # raised a density the fit was still moving towards, +8 % effort error)
SHARE_DECADES = 1.5    # the efforts' shares (`fit_shares`): each actuator's log10 share on a grid of ± this ...
SHARE_STEP = 0.25      # ... every quarter decade (13; two actuators: their ratio ± 3 decades every half decade)
RELEASE_PROBABILITY = 0.05  # with `hold_start` (fused mode), the starting densities (and time constant) are kept
                       # until the best grid point's log-likelihood exceeds theirs by ½ χ²ₖ(95 %) nats, k the axes
                       # fitted (a likelihood-ratio test; 3.0 nats for 2 axes, 3.9 for 3): the disturbance's start is the belief of a small, slow correction, which
                       # a second's readings move by chance (the crank four-bar's to a tenth and back: +4–6 %
                       # angle and rate error over 3 s).  Estimation mode fits from the first evidence: its
                       # effort density's start is a compromise across mechanisms, a decade off on some (held,
                       # the robot's acceleration error +4 % over 3 s, bench/estimation_quality.py)


def encoded_coordinates(mech: Mechanism):
    """(encoder names, their coordinate columns, their σ) when the mechanism has one encoder per degree of
    freedom on distinct coordinates (what the bank's measurement model needs), else None."""
    enc = [s for s in mech.sensors if s.kind == "encoder"]
    coords = [int(s.coordinate) for s in enc]
    if not enc or len(enc) != int(mech.degrees_of_freedom()) or len(set(coords)) != len(coords):
        return None
    return [s.name for s in enc], coords, np.array([float(s.sigma) for s in enc])


def round_to_ns(x: float) -> float:
    """round(x, 9) (the sample times of the drift's fit, to 1 ns) at half its cost: Python rounds the exact decimal
    value and converts back; x·10⁹ rounded to an integer and divided by 10⁹ (both exact in binary, the division
    correctly rounded) is the same number wherever x·10⁹ is not within 10⁻³ of a tie and below 2⁴³ (its own
    rounding error under 10⁻³), else Python's round is asked."""
    y = x * 1e9
    if abs(y) < 8.0e12:
        r = round(y)
        if abs(abs(y - r) - 0.5) > 1e-3:
            return r / 1e9
    return round(x, 9)


def drift_weights(times: np.ndarray, H: float) -> np.ndarray:
    """(2, m) weights W such that W @ U = [∫₀ᴴ p(s)(H − s) ds, ∫₀ᴴ p(s) ds] for the least-squares polynomial
    p of degree min(m − 1, 2) through the samples U (m rows) at `times` (in [0, H))."""
    m = len(times)
    deg = min(m - 1, 2)
    V = np.vander(times, deg + 1, increasing=True)
    k = np.arange(deg + 1)
    # ∫₀ᴴ sᵏ (H − s) ds = Hᵏ⁺² / ((k + 1)(k + 2)),  ∫₀ᴴ sᵏ ds = Hᵏ⁺¹ / (k + 1)
    moments = np.vstack((H ** (k + 2) / ((k + 1) * (k + 2)), H ** (k + 1) / (k + 1)))
    return moments @ np.linalg.pinv(V)



def chi_square_survival(x: float, d: int) -> float:
    """P(X > x) for X ~ χ² with d degrees of freedom, in closed form (integer d)."""
    if x <= 0.0:
        return 1.0
    h = 0.5 * x
    if d % 2 == 0:
        term, total = 1.0, 1.0
        for k in range(1, d // 2):
            term *= h / k
            total += term
        return math.exp(-h) * total
    r = math.sqrt(x)
    total = math.erfc(r / math.sqrt(2.0))
    term = math.sqrt(2.0 * x / math.pi) * math.exp(-h)
    for k in range(1, (d + 1) // 2):
        total += term
        term *= x / (2 * k + 1)
    return total


def chi_square_quantile(tail: float, d: int) -> float:
    """The x with P(X > x) = tail, X ~ χ²_d, by bisection on the closed form: scipy.stats would add
    ~0.35 s to the node's start-up for this one number."""
    lo, hi = 0.0, 1.0
    while chi_square_survival(hi, d) > tail:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if chi_square_survival(mid, d) > tail:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return 0.5 * (lo + hi)


def limits_warning(limits: Optional[Dict[str, str]]) -> str:
    """What a user is told when fitted densities sit at the top of their range (`DensityAdaptation.limits`,
    `FixedLagEstimator.density_fit_limits`), "" when none does (a bottom edge is not a warning: the model explains
    the readings better than the range expects, as on a simulation of the model itself)."""
    top = [name for name, edge in (limits or {}).items() if edge == "top"]
    if not top:
        return ""
    return (f"the online density fit is at the top of its range for {', '.join(top)}: the readings move more than "
            f"the model and its noise explain (a gear's play, readings stamped late, a wrong model, efforts that turn "
            f"faster than the range); the estimates' σ are optimistic")


class DensityAdaptation:
    """See the module docstring.  ``observe(t, readings, q, v, a, tau, restarted)`` after each estimator step
    (readings: dict sensor name → value of this step; the estimate's q, q̇, q̈ and its state's efforts τ: the
    estimated efforts, or in fused mode the disturbance, of the actuated coordinates ``actuated`` (default:
    every actuator's, in actuator order); restarted: the estimator started a new window this
    step); ``density`` and ``acceleration_density`` are the current estimates (the starting densities until
    there is enough evidence), ``changed`` says whether the last `observe` moved one of them by more than
    `CHANGE` decades since it was last passed on."""

    def __init__(self, mech: Mechanism, initial_density: float, acceleration_density: float,
                 layout=None, sensor_sigmas: Optional[Dict[str, float]] = None,
                 time_constant: float = math.inf, fit_acceleration: bool = True, hold_start: bool = False,
                 actuated=None, dt: float = 0.0, rate_time_constant: float = math.inf,
                 deflection: Optional[tuple] = None, fit_deflection: bool = False, fit_effort: bool = True,
                 shares=None, fit_shares: bool = False, boosts: bool = False, effort_bandwidth: float = 0.0):
        layout = layout or encoded_coordinates(mech)
        if layout is None:
            raise ValueError(f"{mech.spec.source}: fitting the densities online needs one encoder per degree of "
                             f"freedom on distinct coordinates (the likelihood's measurement model)")
        for what, value in (("effort", initial_density), ("acceleration", acceleration_density)):
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"the starting {what} density must be positive and finite (got {value})")
        if not time_constant > 0:
            raise ValueError(f"the disturbance's time constant must be > 0 s (got {time_constant})")
        self.mech = mech
        self.names, self.z, sig = layout
        sig = np.array([float((sensor_sigmas or {}).get(n, s)) for n, s in zip(self.names, sig)])
        self.d = d = len(self.z)
        self.actuated = np.array(mech.actuated if actuated is None else actuated, dtype=np.intp)
        self.na = na = len(self.actuated)
        # the encoders' deflection (σ_b, T_b; estimation/deflection.py), where the estimator has one: each filter
        # carries it too (the readings are z + b; σ_b = 0: none), so its densities are those of the estimator's
        # model; with `fit_deflection` σ_b is the grid's fourth axis (`DEFLECTION_GRID`, none included)
        self.deflection = None if deflection is None else (float(deflection[0]), float(deflection[1]))
        if self.deflection is not None and not (self.deflection[0] >= 0 and self.deflection[1] > 0):
            raise ValueError(f"the deflection's σ must be ≥ 0 and its time constant > 0 s (got {deflection})")
        if fit_deflection and self.deflection is None:
            raise ValueError("fitting the deflection needs one (σ_b, T_b)")
        self.fit_deflection = bool(fit_deflection)
        # the efforts' shares: actuator j's density is the density × shares[j] (their geometric mean 1); with
        # `fit_shares` (two or more actuated efforts) the shares are the grid's fifth axis, one family of points
        # per actuator but the last (`_share_table`)
        shares = np.ones(na) if shares is None else np.asarray(shares, dtype=float).reshape(-1)
        if len(shares) != na or not np.all(np.isfinite(shares) & (shares > 0)):
            raise ValueError(f"the efforts' shares must be {na} positive finite numbers (got {shares.tolist()})")
        if fit_shares and na < 2:
            raise ValueError("fitting the efforts' shares needs two or more actuated efforts")
        self.fit_shares = bool(fit_shares)
        # the boosts (`boosts`): each filter raises one actuator's density by a point of `BOOST_GRID` (the first
        # raises none), the evidence forgotten over `BOOST_MEMORY`; `boost` (log10 per actuator) is the best
        # filter's raise where the last half second rejects none (`_update_boost`)
        if boosts and (fit_shares or fit_deflection or fit_effort or fit_acceleration or time_constant < FOREVER):
            raise ValueError("the boosts' bank holds every other axis at one point (the shares, deflection, "
                             "densities and time constant given), and fits none of them")
        self.boosts = bool(boosts)
        self.memory = BOOST_MEMORY if self.boosts else MEMORY
        # the efforts' bandwidth (`_within_bandwidth`): only where this bank fits the two densities of undamped
        # efforts and nothing else
        if not (effort_bandwidth >= 0 and math.isfinite(effort_bandwidth)):
            raise ValueError(f"the efforts' bandwidth must be a finite number of Hz ≥ 0 (got {effort_bandwidth})")
        if effort_bandwidth > 0 and (not (fit_effort and fit_acceleration) or time_constant < FOREVER
                                     or fit_shares or fit_deflection or boosts):
            raise ValueError("the efforts' bandwidth holds where a bank fits the effort and acceleration densities "
                             "of undamped efforts, and no other axis")
        self.effort_bandwidth = float(effort_bandwidth)
        self.boost = np.zeros(na)
        self.log10_shares = np.log10(shares) - np.mean(np.log10(shares))
        self.share_grid = SHARE_STEP * np.arange(-round(SHARE_DECADES / SHARE_STEP),
                                                 round(SHARE_DECADES / SHARE_STEP) + 1)
        self.nb = d if self.deflection is not None else 0
        self.nx = 2 * d + 2 * na + self.nb
        self.R = np.diag(sig ** 2)
        self.time_constant = float(time_constant)     # the current estimate (fixed unless fitted)
        self.angles = np.isin(self.z, mech.relative_angle_columns)
        self.any_angles = bool(np.any(self.angles))
        # the grid: effort densities along axis 0, acceleration densities along axis 1, the disturbance's time
        # constants along axis 2 (flattened: k = (i Kₐ + j) K_T + l)
        self.log10_start = math.log10(initial_density)
        self.log10_acceleration_start = math.log10(acceleration_density)
        self.fit_time_constant = self.time_constant < FOREVER      # (fused: a damped disturbance)
        self.rate_time_constant = float(rate_time_constant) if rate_time_constant < FOREVER else math.inf
        if not self.rate_time_constant > 0:
            raise ValueError(f"the efforts' rate time constant must be > 0 s (got {rate_time_constant})")
        if math.isfinite(self.rate_time_constant) and self.time_constant < FOREVER:
            raise ValueError("the efforts' rate is damped only where they are not damped themselves")
        n_side = int(round((FUSED_GRID_DECADES if self.fit_time_constant else GRID_DECADES) / GRID_STEP))
        self.log10_grid = self.log10_start + GRID_STEP * np.arange(-n_side, n_side + 1) if fit_effort else \
            np.array([self.log10_start])
        if fit_acceleration:
            below, above = (int(round(x / ACCELERATION_STEP)) for x in ACCELERATION_DECADES)
            self.log10_acceleration_grid = (self.log10_acceleration_start
                                            + ACCELERATION_STEP * np.arange(-below, above + 1))
        else:
            self.log10_acceleration_grid = np.array([self.log10_acceleration_start])
        if self.fit_time_constant:
            self.log10_time_constant_start = math.log10(self.time_constant)
            below, above = (int(round(x / TIME_CONSTANT_STEP)) for x in TIME_CONSTANT_DECADES)
            steps = np.arange(-below, above + 1)
            # none shorter than the bank's samples resolve (the start always stays, the grid's top)
            floor = math.log10(MIN_TIME_CONSTANT_SAMPLES * max(dt, BANK_INTERVAL))
            steps = steps[(self.log10_time_constant_start + TIME_CONSTANT_STEP * steps >= floor) | (steps == 0)]
            grid = self.log10_time_constant_start + TIME_CONSTANT_STEP * steps
            if grid.min() - floor >= 0.5 * TIME_CONSTANT_STEP and grid.min() - TIME_CONSTANT_STEP < floor:
                grid = np.r_[floor, grid]            # the shortest allowed, where the ladder steps past it
            self.log10_time_constant_grid = grid
            self.time_constant_grid = 10.0 ** self.log10_time_constant_grid
        else:
            self.log10_time_constant_start = math.inf          # (not fitted: never compared)
            self.time_constant_grid = np.array([self.time_constant])
        self.grid = 10.0 ** self.log10_grid
        self.acceleration_grid = 10.0 ** self.log10_acceleration_grid
        # the deflection's σ: the grid's (0: none, then whole-to-half decades) or the one given
        self.deflection_sigma = 0.0 if self.deflection is None else self.deflection[0]
        self.deflection_grid = np.array(DEFLECTION_GRID if self.fit_deflection else [self.deflection_sigma])
        self.shape = (len(self.grid), len(self.acceleration_grid), len(self.time_constant_grid),
                      len(self.deflection_grid), (na - 1) * len(self.share_grid) if self.fit_shares else
                      1 + na * len(BOOST_GRID) if self.boosts else 1)
        self.K = int(np.prod(self.shape))
        E, A_, T_, B_, S_ = self.shape
        self._time_index = np.tile(np.repeat(np.arange(T_), B_ * S_), E * A_)
        self._spread_over_filters()
        prior_t = (((self.log10_time_constant_grid - self.log10_time_constant_start) / PRIOR_DECADES) ** 2
                   if self.fit_time_constant else np.zeros(1))
        # (no prior on the deflection: the readings alone say whether there is one)
        self.log_prior = -0.5 * ((((self.log10_grid - self.log10_start) / PRIOR_DECADES) ** 2)[:, None, None, None]
                                 + (((self.log10_acceleration_grid - self.log10_acceleration_start)
                                     / PRIOR_DECADES) ** 2)[None, :, None, None]
                                 + prior_t[None, None, :, None] + np.zeros(B_)[None, None, None, :]).reshape(-1)
        # (the shares' prior: each share's log within PRIOR_DECADES of 1; the same for every filter of the main
        # bank, whose shares are given)
        self._axes_prior = self.log_prior
        self.log_prior = (self._axes_prior[:, None] + self._share_prior()[None, :]).reshape(-1)
        axes = (len(self.grid) > 1) + (len(self.acceleration_grid) > 1) + (self.shape[2] > 1) + (B_ > 1) + (S_ > 1)
        self.release = 0.5 * chi_square_quantile(RELEASE_PROBABILITY, axes)
        # (`early_evidence` beyond this: the early readings reject the starting densities at GATE_PROBABILITY)
        self.early_rejection = 0.5 * chi_square_quantile(GATE_PROBABILITY, max(axes, 1))
        # (a boost where the last half second rejects none at GATE_PROBABILITY, one axis: 12 nats)
        self.boost_rejection = 0.5 * chi_square_quantile(GATE_PROBABILITY, 1)
        self.gate = chi_square_quantile(GATE_PROBABILITY, d)
        self.log_likelihood = np.zeros(self.K)   # forgotten sums of log N(ν; 0, S) per filter
        self.evidence = 0.0                      # [s] of counted readings (forgotten alike)
        self.density = float(initial_density)
        self.acceleration_density = float(acceleration_density)
        # the likelihood's own estimates, before the efforts' bandwidth (the same without one): what the other
        # banks fit their axis at (`FixedLagEstimator._follow_main`)
        self.free_density = self.density
        self.free_acceleration_density = self.acceleration_density
        self.passed_free = (self.log10_start, self.log10_acceleration_start)
        self.passed_log10 = (self.log10_start, self.log10_acceleration_start,   # the estimates last passed on
                             self.log10_time_constant_start, _log10_or_none(self.deflection_sigma))
        self.changed = False
        self.counted = 0                          # readings counted so far (diagnostics, tests)
        self.rejected = 0                         # readings refused by the gate
        # the filter of the starting densities (and of the grid's deflection nearest the starting one, and of the
        # shares given)
        m0 = int(np.argmin(np.abs(self.deflection_grid - self.deflection_sigma)))
        s0 = int(np.argmin(np.abs(self.share_grid - self.log10_shares[0]))) if self.fit_shares else 0
        candidates = np.arange(self.K).reshape(self.shape)[:, :, :, m0, s0].reshape(-1)
        self.start = int(candidates[np.argmax(self.log_prior[candidates])])
        self.released = not hold_start            # the data have rejected the starting densities (`release`)
        self.best: Optional[tuple] = None         # the grid point of the newest estimate (`limits`)
        self._weights: Dict[tuple, np.ndarray] = {}   # drift_weights by the bank step's sample times
        self.identity = np.eye(self.nx)
        self.Hm = np.eye(d, self.nx)                 # the encoders read z (+ b)
        if self.nb:
            self.Hm[:, 2 * d + 2 * na:] = np.eye(d)
        self._restart()

    def set_sensor_sigmas(self, sigmas: Dict[str, float]):
        """New σ of encoders (name → σ; others unchanged): the filters' measurement noise from the next reading."""
        for i, name in enumerate(self.names):
            if name in sigmas:
                self.R[i, i] = float(sigmas[name]) ** 2

    # -- life cycle ---------------------------------------------------------------------------------------
    def _restart(self):
        """The filters start again at the next reading (the evidence so far is kept)."""
        self.x: Optional[np.ndarray] = None
        self.P: Optional[np.ndarray] = None
        self.t_bank = None          # time of the bank's last step
        self.t_start = None
        self.t_B = None             # time B was refreshed
        self.t_Sa = None            # time the acceleration noise's shape on z was
        self.held = []              # (t, q̈, τ) of the estimates since the bank's last step
        self.rejected_in_a_row = 0
        self.early_log_likelihood = np.zeros(self.K)   # the burn-in's second half (`early_evidence`) ...
        self.early_steps = 0                           # ... over this many of the bank's steps

    def restart(self):
        """The estimator started a new window (re-initialization, recovery, reset): the filters restart
        from its next estimate and their first `BURN_IN` s are not counted."""
        self._restart()

    # -- the model ------------------------------------------------------------------------------------------
    def _refresh(self, q, t: float):
        """B = ∂z̈/∂τ at the pose q (`effort_directions`), every `B_REFRESH` s; the acceleration noise's shape on
        z, (JᵀJ)⁻¹ with J = ∂q/∂z (a velocity solve per coordinate: ~0.1 ms), every `SA_REFRESH` s."""
        self.B = effort_directions(self.mech, q, self.z, self.actuated)
        self.t_B = t
        if self.t_Sa is None or t - self.t_Sa >= SA_REFRESH:
            self.Sa = encoded_acceleration_noise(self.mech, q, self.z, 1.0)
            self.t_Sa = t
        self._H = None

    def _matrices(self, H: float):
        """(F, Fᵀ, each filter's process noise: its effort density × the effort noise + its acceleration density
        × the acceleration noise) of a step H (cached for the last H, to 1 ns, and the last B)."""
        H = round(H, 9)
        if self._H != H:
            d, na, nx = self.d, self.na, self.nx
            ne = 2 * d + 2 * na                       # (the efforts' rate ends here, the deflection follows)
            W = np.zeros((na + 2, nx, nx))            # unit densities: each actuator's w, the accelerations' ξ;
            for j in range(na):                       # the deflection's own
                W[j, 2 * d + na + j, 2 * d + na + j] = 1.0
            W[na, d:2 * d, d:2 * d] = self.Sa
            if self.nb:
                W[na + 1, ne:, ne:] = 2.0 / self.deflection[1] * np.eye(d)       # (a unit σ_b: scaled per filter)
            Fs, Qs = [], []
            for T in self.time_constant_grid:
                A = np.zeros((nx, nx))
                A[:d, d:2 * d] = np.eye(d)
                A[d:2 * d, 2 * d:2 * d + na] = self.B
                A[2 * d:2 * d + na, 2 * d + na:ne] = np.eye(na)
                if T < FOREVER:
                    w = 1.0 / T
                    A[2 * d + na:ne, 2 * d:2 * d + na] = -w * w * np.eye(na)
                    A[2 * d + na:ne, 2 * d + na:ne] = -2.0 * w * np.eye(na)
                elif math.isfinite(self.rate_time_constant):     # (a configured damping of the efforts' rate)
                    A[2 * d + na:ne, 2 * d + na:ne] = -np.eye(na) / self.rate_time_constant
                if self.nb:
                    A[ne:, ne:] = -np.eye(d) / self.deflection[1]
                F, Qd = discretize(A, W, H)            # (one F, the two noises: W broadcasts over A)
                Fs.append(F)
                Qs.append(Qd)
            effort = self._effort_of_filter[:, None] * self._share_of_filter       # (K, na) densities
            if len(Fs) == 1:
                F, Qd = Fs[0], Qs[0]
                self._F, self._Ft = F, np.ascontiguousarray(F.T)
                Qa, Qb = Qd[na], Qd[na + 1]
                Q = np.einsum("kj,jab->kab", effort, Qd[:na])
            else:
                # one transition per filter (its time constant's); the product per filter in `_step`
                F = np.stack(Fs)[self._time_index]
                self._F, self._Ft = F, np.ascontiguousarray(F.transpose(0, 2, 1))
                Qd = np.stack(Qs)
                Qa, Qb = Qd[:, na][self._time_index], Qd[:, na + 1][self._time_index]
                Q = np.einsum("kj,kjab->kab", effort, Qd[:, :na][self._time_index])
            self._H = H
            self._Q = Q + self._acceleration_of_filter[:, None, None] * Qa
            if self.nb:
                self._Q += (self._deflection_of_filter ** 2)[:, None, None] * Qb
        return self._F, self._Ft, self._Q

    # -- per estimator step ---------------------------------------------------------------------------------
    def observe(self, t: float, readings: Dict[str, float], q, v, a, tau, restarted: bool = False) -> bool:
        """One estimator step (see the class docstring); returns `changed`.  Between the bank's steps this only
        records the estimate's time, accelerations and efforts (the drift's samples)."""
        self.changed = False
        if self.held and t == self.held[-1][0] and not restarted:
            return False                    # the same time again (the estimator's previous estimate)
        if restarted or (self.held and not (0.0 < t - self.held[-1][0] <= MAX_GAP)) or \
                (self.t_bank is not None and t - self.t_bank > MAX_GAP + BANK_INTERVAL):
            # (the last: steps without every encoder's reading for longer than that, whose samples would
            # otherwise pile up in `held`)
            self._restart()
        if self.x is None:
            y = self._reading(readings)
            if y is not None:
                self._start(t, q, v, tau)
                self.held.append((t, a, tau))
            return False
        if t - self.t_bank >= BANK_INTERVAL - 1e-9:
            y = self._reading(readings)
            if y is not None:
                c = self._drift_input(t)
                self._step(t - self.t_bank, y, c, t - self.t_start >= BURN_IN, t - self.t_start >= EARLY)
                if self.x is None:
                    return self.changed      # the filters lost the motion and restart at the next reading
                self.t_bank = t
                self.held.clear()
                if t - self.t_B >= B_REFRESH:
                    self._refresh(q, t)
        self.held.append((t, a, tau))
        return self.changed

    def _reading(self, readings) -> Optional[np.ndarray]:
        """This step's readings of the encoded coordinates, or None unless every one is there and finite."""
        y = [readings.get(n) for n in self.names]
        if None in y:
            return None
        y = np.array(y, dtype=float)
        return y if all(map(math.isfinite, y.tolist())) else None

    def _drift_input(self, t: float) -> np.ndarray:
        """What the drift adds to (z, ż) over the bank's step to t.  The drift u = q̈[z] − B τ (the model's
        acceleration without the state's efforts) of each estimate since the bank's last step is fitted by a polynomial
        in time (least squares, degree ≤ 2), which is integrated exactly up to t: ż gains ∫ u, z gains
        ∫ u(s) (t − s) ds.  Holding each sample until the next biased the velocity by u̇ h / 2 and a linear
        interpolation still by ü h² H / 12, which the filters took for effort variation (a density 30 % to 5×
        too large on a swinging crank); the estimate at t itself is left out (it has seen the reading the
        filters are about to be scored on)."""
        held, t_bank = self.held, self.t_bank
        rel = tuple(round_to_ns(h[0] - t_bank) for h in held)
        key = (rel, round_to_ns(t - t_bank))
        weights = self._weights.get(key)
        if weights is None:
            weights = self._weights[key] = drift_weights(np.array(rel), key[1])
            if len(self._weights) > 64:
                self._weights.clear()
                self._weights[key] = weights
        A = np.array([h[1] for h in held]).take(self.z, axis=1)
        E = np.array([h[2] for h in held])
        U = A - E @ self.B.T
        c = np.zeros(self.nx)
        d = self.d
        c[:2 * d] = (weights @ U).reshape(-1)
        return c

    def _start(self, t, q, v, tau):
        d, na = self.d, self.na
        self._refresh(q, t)
        x = np.zeros(self.nx)
        x[:d] = q[self.z]
        x[d:2 * d] = v[self.z]
        x[2 * d:2 * d + na] = tau
        P0 = np.zeros((self.nx, self.nx))
        P0[:d, :d] = self.R
        # broad: the estimate's rate and efforts are uncertain at a (re)start; the burn-in hides the transient
        P0[d:2 * d, d:2 * d] = np.eye(d) * 1.0
        P0[2 * d:2 * d + na, 2 * d:2 * d + na] = np.eye(na) * 100.0 ** 2
        P0[2 * d + na:2 * d + 2 * na, 2 * d + na:2 * d + 2 * na] = np.eye(na) * 100.0 ** 2
        self.x = np.repeat(x[None, :], self.K, axis=0)
        self.P = np.repeat(P0[None, :, :], self.K, axis=0)
        if self.nb:
            b = np.arange(2 * d + 2 * na, self.nx)
            self.P[:, b, b] = (self._deflection_of_filter ** 2)[:, None]
        self.t_start = self.t_bank = t

    def _step(self, H: float, y: np.ndarray, c: np.ndarray, count: bool, early: bool = False):
        """Predict every filter over H (drift input c), then update with the readings y and, when counted,
        add each filter's innovation log-likelihood.  Written for few µs: d ≤ 2 in closed form."""
        d = self.d
        F, Ft, Q = self._matrices(H)
        x = self.x @ Ft if F.ndim == 2 else (F @ self.x[:, :, None])[:, :, 0]
        x += c
        P = F @ self.P @ Ft
        P += Q
        if self.nb:
            b = slice(self.nx - d, self.nx)
            nu = y - x[:, :d] - x[:, b]
            PHt = P[:, :, :d] + P[:, :, b]
            S = PHt[:, :d] + PHt[:, b] + self.R
        else:
            nu = y - x[:, :d]
            PHt = P[:, :, :d]
            S = P[:, :d, :d] + self.R
        if self.any_angles:
            nu[:, self.angles] = (nu[:, self.angles] + math.pi) % (2.0 * math.pi) - math.pi
        if d == 1:
            s = S[:, 0, 0]
            Sinv = (1.0 / s)[:, None, None]
            logdet = np.log(s)
        elif d == 2:
            a, b, e = S[:, 0, 0], S[:, 0, 1], S[:, 1, 1]
            det = a * e - b * b
            Sinv = np.empty_like(S)
            Sinv[:, 0, 0], Sinv[:, 1, 1] = e / det, a / det
            Sinv[:, 0, 1] = Sinv[:, 1, 0] = -b / det
            logdet = np.log(det)
        else:
            Sinv = np.linalg.inv(S)
            logdet = np.linalg.slogdet(S)[1]
        w = Sinv @ nu[:, :, None]                 # S⁻¹ ν
        m = (nu[:, None, :] @ w)[:, 0, 0]         # νᵀ S⁻¹ ν
        if m.min() > self.gate:
            # improbable under every density: an outlier, no update, no evidence (the filters only predicted)
            self.rejected += 1
            self.rejected_in_a_row += 1
            self.x, self.P = x, P
            if self.rejected_in_a_row >= MAX_REJECTED:
                self._restart()      # the filters lost the motion (not the readings): start again, burn-in
            return
        self.rejected_in_a_row = 0
        self.x = x + (PHt @ w)[:, :, 0]
        # Joseph form, (I − K H) P (I − K H)ᵀ + K R Kᵀ: the covariances span 12 decades (encoder σ² against
        # the efforts' broad start), where P − K S Kᵀ loses positive definiteness to round-off
        Kg = PHt @ Sinv
        IKH = self.identity - Kg @ self.Hm
        self.P = IKH @ P @ IKH.transpose(0, 2, 1) + Kg @ self.R @ Kg.transpose(0, 2, 1)
        if not count:
            if early:
                self.early_log_likelihood -= 0.5 * (np.minimum(m, self.gate) + logdet)
                self.early_steps += 1
            return
        forget = math.exp(-H / self.memory)
        self.log_likelihood = forget * self.log_likelihood - 0.5 * (np.minimum(m, self.gate) + logdet)
        self.evidence = forget * self.evidence + H
        self.counted += 1
        if self.evidence >= MIN_EVIDENCE:
            self._update_estimate()

    def limits(self) -> Dict[str, str]:
        """The fitted axes whose newest estimate is the grid's first or last point: {"density" /
        "acceleration_density": "bottom" or "top", "deflection_sigma": "top"} (a deflection of none is an answer,
        not a limit; the time constant's range is the start and shorter, by design).  There the likelihood
        still rises beyond the range: the readings ask for more than the model and its noise describe.  {} before
        the first estimate."""
        if self.best is None or self.boosts:
            return {}
        i, j, _, m, _ = self.best
        out = {}
        for name, index, size in (("density", i, len(self.grid)),
                                  ("acceleration_density", j, len(self.acceleration_grid))):
            if size > 1 and index in (0, size - 1):
                out[name] = "bottom" if index == 0 else "top"
        if self.fit_deflection and m == len(self.deflection_grid) - 1:
            out["deflection_sigma"] = "top"
        return out

    def early_evidence(self) -> float:
        """How far [nats] the best filter's log-likelihood over the burn-in's second half (from `EARLY` s after
        the filters' start; not counted in the fit) is above the starting densities' filter's: before the fit's
        first estimate, how clearly the readings already reject the starting densities (0 without such
        readings)."""
        if not self.early_steps:
            return 0.0
        return float(np.max(self.early_log_likelihood) - self.early_log_likelihood[self.start])

    def _update_estimate(self):
        if self.boosts:
            self._update_boost()
            return
        score = self.log_likelihood + self.log_prior
        best = int(np.argmax(score))
        if not self.released:
            if self.log_likelihood[best] - self.log_likelihood[self.start] < self.release:
                return
            self.released = True
        score = score.reshape(self.shape)
        i, j, l, m, n = np.unravel_index(best, self.shape)
        self.best = (int(i), int(j), int(l), int(m), int(n))
        x = self.log10_grid[i] + GRID_STEP * _vertex_offset(score[:, j, l, m, n], i)
        y = self.log10_acceleration_grid[j] + ACCELERATION_STEP * _vertex_offset(score[i, :, l, m, n], j)
        free = (x, y)
        self.free_density, self.free_acceleration_density = float(10.0 ** x), float(10.0 ** y)
        if self.effort_bandwidth > 0:
            x, y = self._within_bandwidth(score[:, :, 0, 0, 0], x, y)
        self.density = float(10.0 ** x)
        self.acceleration_density = float(10.0 ** y)
        z = self.log10_time_constant_start
        if self.fit_time_constant:
            # along the time constants' axis the likelihood is far closer to a parabola in the bandwidth 1/T than
            # in log T (a disturbance of 0.2 s on the crank four-bar: 0.21–0.28 s against 0.39–0.48 s)
            self.time_constant = 1.0 / _vertex(1.0 / self.time_constant_grid, score[i, j, :, m, n], l)
            z = math.log10(self.time_constant)
        if self.fit_deflection:
            # none (the grid's first point), or along the rest in log σ
            self.deflection_sigma = 0.0 if m == 0 else float(10.0 ** (
                math.log10(self.deflection_grid[m]) + DEFLECTION_STEP * _vertex_offset(score[i, j, l, 1:, n], m - 1)))
        w = _log10_or_none(self.deflection_sigma)
        if self.fit_shares and self._fit_shares(score[i, j, l, m]):
            self.changed = True
        px, py, pz, pw = self.passed_log10
        fx, fy = self.passed_free
        # (only the axes this bank fits: a value set from outside, `set_fixed`, is not news to pass back)
        if (len(self.grid) > 1 and max(abs(x - px), abs(free[0] - fx)) >= CHANGE) \
                or (len(self.acceleration_grid) > 1 and max(abs(y - py), abs(free[1] - fy)) >= CHANGE) \
                or (self.fit_time_constant and abs(z - pz) >= CHANGE) \
                or (self.fit_deflection and ((w is None) != (pw is None) or (w is not None and abs(w - pw) >= CHANGE))):
            self.passed_log10 = (x, y, z, w)
            self.passed_free = free
            self.changed = True

    def bandwidth_gain(self) -> float:
        """`bandwidth_gain` at the newest pose's B and Sₐ, with the bank's shares."""
        return bandwidth_gain(self.B, self.Sa, self.shares)

    def _within_bandwidth(self, scores: np.ndarray, x: float, y: float) -> tuple:
        """The densities (log10 effort, log10 acceleration) of the best grid point whose efforts' spectrum stays
        above the unmodelled accelerations' up to `effort_bandwidth` Hz (for the effort with the largest
        `bandwidth_gain`; `scores` (effort, acceleration) at the bank's other axes' point), refined along each
        axis by a parabola through its neighbours where they too are within, the acceleration density then held
        to that crossing: the likelihood alone lets white accelerations take in motion down to ~1 Hz where a
        machine's readings move faster than its model says (the DFKI pendubot's limit cycle, the geared
        encoders' play), and the efforts, whose spectrum is steeper, follow none of it (docs/decisions.md).  An
        acceleration density up to the configured one (the start: how exact the model is said to be) is always
        within: slow efforts on an exact model cross low, and the readings have not asked for more.  The
        likelihood's own (x, y) where they already are within."""
        gain = self.bandwidth_gain()
        w4 = (2.0 * math.pi * self.effort_bandwidth) ** 4
        floor = self.log10_acceleration_start + 1e-9
        if not gain > 0:
            return x, y
        if y <= floor or x + math.log10(gain) - y >= math.log10(w4):
            return x, y
        within = (self.grid[:, None] * gain / self.acceleration_grid[None, :] >= w4) \
            | (self.log10_acceleration_grid[None, :] <= floor)
        masked = np.where(within, scores, -np.inf)
        i, j = np.unravel_index(int(np.argmax(masked)), masked.shape)
        x = self.log10_grid[i] + GRID_STEP * _vertex_offset(masked[:, j], i)
        y = self.log10_acceleration_grid[j] + ACCELERATION_STEP * _vertex_offset(masked[i, :], j)
        return x, min(y, max(x + math.log10(gain / w4), self.log10_acceleration_start))

    def _update_boost(self):
        """The best filter's raise of one actuator's density where its log-likelihood over the last
        `BOOST_MEMORY` s exceeds the unraised filter's by `boost_rejection` nats, else none (no prior: the test
        is the hold)."""
        best = int(np.argmax(self.log_likelihood))
        boost = np.zeros(self.na)
        if self.log_likelihood[best] - self.log_likelihood[0] > self.boost_rejection:
            boost = self._share_table()[best] - self.log10_shares
        if np.max(np.abs(boost - self.boost)) >= CHANGE:
            self.boost = boost
            self.changed = True

    def set_fixed(self, density: Optional[float] = None, acceleration_density: Optional[float] = None,
                  time_constant: Optional[float] = None, deflection_sigma: Optional[float] = None):
        """New values of the axes this bank does not fit (one grid point each: the other bank's estimates,
        `FixedLagEstimator._deflection_fit`); the filters keep their state and evidence, their noise follows from
        the next step."""
        for value, fitted, name in ((density, len(self.grid) > 1, "grid"),
                                    (acceleration_density, len(self.acceleration_grid) > 1, "acceleration_grid"),
                                    (time_constant, self.fit_time_constant, "time_constant_grid"),
                                    (deflection_sigma, self.fit_deflection, "deflection_grid")):
            if value is None or fitted:
                continue
            setattr(self, name, np.array([float(value)]))
        if density is not None and len(self.grid) == 1:
            self.density = float(density)
            self.log10_grid = np.log10(self.grid)
        if acceleration_density is not None and len(self.acceleration_grid) == 1:
            self.acceleration_density = float(acceleration_density)
            self.log10_acceleration_grid = np.log10(self.acceleration_grid)
        if time_constant is not None and not self.fit_time_constant:
            self.time_constant = float(time_constant)
        if deflection_sigma is not None and not self.fit_deflection:
            self.deflection_sigma = float(deflection_sigma)
        self._spread_over_filters()
        self._H = None

    def set_shares(self, shares):
        """New shares of the efforts' density (the other bank's estimate, `FixedLagEstimator._shares_fit`; a bank
        that fits them keeps its own): the filters keep their state and evidence, their noise follows from the
        next step."""
        if self.fit_shares:
            return
        log10 = np.log10(np.asarray(shares, dtype=float).reshape(-1))
        self.log10_shares = log10 - np.mean(log10)
        self._spread_over_filters()
        self._H = None

    @property
    def shares(self) -> np.ndarray:
        """Each actuated effort's share of the density (the density's multiplier; geometric mean 1)."""
        return 10.0 ** self.log10_shares

    def _share_table(self) -> np.ndarray:
        """(the share axis's points, na): the log10 shares of each point.  Without `fit_shares` one point, the
        shares given.  With it, per actuator f but the last a family along the grid: f's log10 share at each
        grid point, the others' moved by the opposite over na − 1 each (the geometric mean stays 1; with two
        actuators the family is the ratio's grid).  With `boosts`: the shares given, then per actuator the
        shares with its own raised by each point of `BOOST_GRID`."""
        if self.boosts:
            rows = np.repeat(self.log10_shares[None, :], self.shape[4], axis=0)
            for f in range(self.na):
                rows[1 + f * len(BOOST_GRID):1 + (f + 1) * len(BOOST_GRID), f] += BOOST_GRID
            return rows
        if not self.fit_shares:
            return self.log10_shares[None, :]
        na, G = self.na, len(self.share_grid)
        table = np.repeat(self.log10_shares[None, :], (na - 1) * G, axis=0)
        for f in range(na - 1):
            rows = table[f * G:(f + 1) * G]
            delta = self.share_grid - self.log10_shares[f]
            rows -= delta[:, None] / (na - 1)
            rows[:, f] = self.share_grid
        return table

    def _share_prior(self) -> np.ndarray:
        if self.boosts:
            return np.zeros(self.shape[4])
        return -0.5 * np.sum((self._share_table() / PRIOR_DECADES) ** 2, axis=1)

    def _fit_shares(self, scores: np.ndarray) -> bool:
        """The shares at the vertex of each family's scores (the last actuator's from the geometric mean);
        whether one moved by `CHANGE` decades or more (then the families move with them)."""
        na, G = self.na, len(self.share_grid)
        new = self.log10_shares.copy()
        for f in range(na - 1):
            s = scores[f * G:(f + 1) * G]
            p = int(np.argmax(s))
            new[f] = self.share_grid[p] + SHARE_STEP * _vertex_offset(s, p)
        new[na - 1] = -np.sum(new[:na - 1])
        if np.max(np.abs(new - self.log10_shares)) < CHANGE:
            return False
        self.log10_shares = new
        if na > 2:
            # the families' other actuators follow the new shares: their points' noise and prior change
            self._spread_over_filters()
            self.log_prior = (self._axes_prior[:, None] + self._share_prior()[None, :]).reshape(-1)
            self._H = None
        return True

    def _spread_over_filters(self):
        """Each filter's effort density, acceleration density, deflection σ and efforts' shares from the grid's
        axes (filter k = (((i Kₐ + j) K_T + l) K_b + m) K_s + n)."""
        E, A_, T_, B_, S_ = self.shape
        self._effort_of_filter = np.repeat(self.grid, A_ * T_ * B_ * S_)
        self._acceleration_of_filter = np.tile(np.repeat(self.acceleration_grid, T_ * B_ * S_), E)
        self._deflection_of_filter = np.tile(np.repeat(self.deflection_grid, S_), E * A_ * T_)
        self._share_of_filter = np.tile(10.0 ** self._share_table(), (E * A_ * T_ * B_, 1))


def effort_directions(mech: Mechanism, q, z, actuated) -> np.ndarray:
    """B = ∂z̈/∂τ (d, na) at the pose q: forward dynamics is linear in Q at rest, where γ = 0, so column j is
    q̈[z] at (q, 0, e_j), gravity left out."""
    zero = np.zeros(mech.n)
    B = np.empty((len(z), len(actuated)))
    for j, a in enumerate(actuated):
        Q = np.zeros(mech.n)
        Q[int(a)] = 1.0
        B[:, j] = dynamics.forward_dynamics(mech, q, zero, Q)[np.asarray(z, dtype=np.intp)]
    return B


def bandwidth_gain(B: np.ndarray, Sa: np.ndarray, shares=None) -> float:
    """max over the efforts of share_j ‖b_j‖⁴ / (b_jᵀ Sₐ b_j), b_j = B's column j (∂z̈/∂τ_j), Sₐ the unmodelled
    accelerations' shape on z: along b_j an effort of density S (τ̈ white) moves z̈ with the spectrum
    S share_j ‖b_j‖² / ω⁴ and the accelerations of density Sₐ with Sₐ b_jᵀ Sₐ b_j / ‖b_j‖², so the two cross at
    ω⁴ = S × this / Sₐ (`crossover_frequency`; 0 where no effort moves an encoded coordinate)."""
    shares = np.ones(B.shape[1]) if shares is None else np.asarray(shares, dtype=float)
    best = 0.0
    for j in range(B.shape[1]):
        b = B[:, j]
        across = float(b @ Sa @ b)
        if across > 0:
            best = max(best, float(shares[j] * (b @ b) ** 2 / across))
    return best


def crossover_frequency(density: float, acceleration_density: float, gain: float) -> float:
    """[Hz] where an effort of `density` (τ̈ white) and white accelerations of `acceleration_density` move the
    encoded coordinates alike, along the effort of `gain` (`bandwidth_gain`): below it the efforts take the
    unexplained motion, above it the accelerations."""
    if not (gain > 0 and density > 0):
        return 0.0
    if not acceleration_density > 0:
        return math.inf
    return (density * gain / acceleration_density) ** 0.25 / (2.0 * math.pi)


def _log10_or_none(x: float) -> Optional[float]:
    return math.log10(x) if x > 0 else None


def _vertex_offset(scores: np.ndarray, i: int) -> float:
    """The offset of the parabola's vertex through scores[i − 1 … i + 1] from point i, in grid steps (within
    ±½); 0 at an edge of the grid or where the scores do not curve down."""
    if not 0 < i < len(scores) - 1:
        return 0.0
    s0, s1, s2 = scores[i - 1], scores[i], scores[i + 1]
    if not (math.isfinite(s0) and math.isfinite(s2)):
        return 0.0                                  # (a neighbour outside a constraint: `_within_bandwidth`)
    curv = s0 - 2.0 * s1 + s2
    return 0.5 * (s0 - s2) / curv if curv < 0 else 0.0


def _vertex(x: np.ndarray, scores: np.ndarray, i: int) -> float:
    """The abscissa of the parabola's vertex through (x, scores)[i − 1 … i + 1] (x not evenly spaced), within
    the neighbours' span; x[i] at an edge of the grid or where the scores do not curve down."""
    if not 0 < i < len(scores) - 1:
        return float(x[i])
    x0, x1, x2 = (float(v) for v in x[i - 1:i + 2])
    s0, s1, s2 = (float(v) for v in scores[i - 1:i + 2])
    d01, d12 = (s1 - s0) / (x1 - x0), (s2 - s1) / (x2 - x1)
    curv = (d12 - d01) / (x2 - x0)              # the parabola's leading coefficient
    if not curv < 0:
        return x1
    vertex = 0.5 * (x0 + x1) - d01 / (2.0 * curv)
    return min(max(vertex, min(x0, x2)), max(x0, x2))
