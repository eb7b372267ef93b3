"""Real-time fixed-lag factor-graph estimator of a planar mechanism (ROS-free).

`FixedLagEstimator(mech, config)` keeps a window of the last ``config.window`` steps in a
`gtsam.IncrementalFixedLagSmoother` (iSAM2 with QR factorization: Cholesky breaks down at dead points,
real marginalization, lag in steps).  Each step's state is one stacked vector (`graph.StateLayout`)

    dependent:    X_k = [q, q̇, q̈ (, τ)]
    independent:  X_k = [q, q̇, q̈, z, ż, z̈ (, z⃛) (, τ)]

(z⃛ = dz̈/dt only with the 4th-order `hermite` integrator; τ = the actuator efforts, a state in the
`estimation` and `fused` modes), and each step's factors are linearized once in Python at a continuity
predictor and handed to GTSAM as one linear C++ factor, with the relinearization safeguard of
`graph.FixedLagWindow`.

Factors per step k (see `mbfg_ros.factors`):

* integrators between X_{k−1} and X_k (trapezoidal | hermite | euler) on (q, q̇, q̈) or, independent
  formulation, on (z, ż, z̈) plus the soft equality f_eq(q_{k−1}, q_k); the dependent hermite velocity
  integrator computes the jerk at both ends from the states (`factors.HermiteVelocityIntegrator`), the
  independent one has z⃛ in the state and the jerk factor;
* f_pc, f_vc (dependent) or f_pc^i, f_vc^i, f_ac^i (independent);
* dynamics: f_dyn with the commanded efforts (`forward_dynamics`), or f_idyn with τ as a variable
  (`estimation`, `fused`) plus the random walk τ_k − τ_{k−1} (sigma effort_random_walk·√Δt); in `fused`
  mode the commanded efforts are a prior on τ (sigma commanded_effort); independent hermite: the jerk factor;
* sensors present in this step's observations (`estimation`, `fused`; the `forward_dynamics` digital
  twin ignores observations): encoders, gyroscopes and generic observations ``'q:<coordinate>'``,
  ``'v:<coordinate>'``, ``'a:<coordinate>'`` (sigma from ``sensor_sigmas`` or ``observed_coordinate``);
* first step after (re)initialization: priors on q0, q̇0 (and a weak one on τ0).
"""

from __future__ import annotations

import copy
import math
import time
from typing import Dict, List, Optional, Tuple

import numpy as np

import mbfg_ros.factors as F
from mbfg_ros.dynamics.cache import EvalContext
from mbfg_ros.blas import limit_blas_threads
from mbfg_ros.dynamics.coordinates import choose_independent, degrees_of_freedom
from mbfg_ros.estimation.config import Estimate, EstimatorConfig
from mbfg_ros.factors.noise import default_sigmas
from mbfg_ros.graph.layout import StateLayout
from mbfg_ros.graph.step_model import StepModel, linearize_step
from mbfg_ros.graph.window import FixedLagWindow
from mbfg_ros.dynamics.kinematics import AssemblyError, solve_positions_on_mode, solve_velocities
from mbfg_ros.model.mechanism import Mechanism

__all__ = ["FixedLagEstimator"]

TWO_PI = 2.0 * math.pi
_max = np.maximum.reduce
MAX_EXTRAPOLATION = 0.1    # [s] longest gap over which the last estimate is extrapolated (constant q̈)
UNCONFIRMED_REJECTIONS = 2  # readings of a sensor not yet confirmed after a guessed seed: believed at the third


class StepFailure(RuntimeError):
    """A numerical failure detected after a step (non-finite, |Φ| too large, divergence...)."""


class _Resync(Exception):
    """Readings kept disagreeing with the prediction: re-initialize from them."""


# ----------------------------------------------------------------------------------------------




def _wrap_near(value: float, reference: float) -> float:
    """value + 2πk closest to reference."""
    return value + TWO_PI * round((reference - value) / TWO_PI)


# ----------------------------------------------------------------------------------------------
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
    a linearization that does not converge, leaving a requested assembly mode) never raise: the window is
    re-seeded at the last good estimate and integrated forward (``status='recovered'``, ``message``).

    ``reinitialize(assembly_mode=None) -> (mode, max |Φ|)`` re-solves the position problem on the
    requested (or current) assembly mode from the latest estimate and readings; the next step re-seeds
    the window from that solution at the latest estimate's time and advances it;
    ``reset()`` forgets everything.  Attributes: ``layout`` (the stacked state), ``independent_coordinates``,
    ``relinearizations``, ``recoveries``, ``last`` (latest Estimate), ``relinearize_threshold``.
    """

    def __init__(self, mech: Mechanism, config: Optional[EstimatorConfig] = None, q0=None, v0=None):
        self.mech = mech
        self.config = c = (config if config is not None else EstimatorConfig()).validated()
        self.sigmas = {**default_sigmas(), **dict(c.sigmas)}
        # Relinearization threshold (whitened units).  A mismatch ε moves the estimate by at most what an
        # ε-sigma perturbation of that factor would.  Steps without readings are pure predictions (the
        # digital twin, or an observer between sensor samples) and need ε ≪ 1 to keep the model's
        # discretization-level accuracy (their mismatches are ~1e-5 anyway).  In steps with readings the
        # innovations (~σ of the sensors) make the dynamics rows' mismatch 0.3 / 1.9 / 5 σ_dyn (median / 90 % /
        # 99 %, encoder-only crank four-bar) while the unknown efforts let q̈ move by ~1e3 σ_dyn per step:
        # there 10 σ catches genuinely bad linearizations without re-linearizing routine steps (measured:
        # estimates within 4 % of the estimation error of the full nonlinear smoother, see
        # test_default_relinearization_close_to_full_nonlinear_smoother).
        thr = c.relinearize_threshold
        self.relinearize_threshold = float(1e-3 if thr is None else thr)            # prediction steps
        self.relinearize_threshold_readings = float(10.0 if thr is None else thr)   # steps with readings
        # With sensors, later steps move earlier states (smoothing) and only "window" re-checks them all
        # (the full nonlinear fixed-lag smoother, ~15 relinearizations per step at 1e-6 σ); the default
        # "newest" checks the step just added.
        self.relinearize_scope = c.relinearize_scope
        if self.relinearize_scope not in FixedLagWindow.SCOPES:
            raise ValueError(f"relinearize_scope must be one of {FixedLagWindow.SCOPES} (got {c.relinearize_scope!r})")
        if c.blas_threads:
            limit_blas_threads(int(c.blas_threads))
        n = mech.n
        self._q0_arg = None if q0 is None else self._vector(q0, n, "q0")
        self._v0_arg = None if v0 is None else self._vector(v0, n, "v0")
        self.na = len(mech.actuated)
        self.has_tau = c.mode != "forward_dynamics" and self.na > 0
        self.hermite = c.integrator == "hermite"
        self.independent = c.formulation == "independent"
        self._hermite_lite = self.hermite and not self.independent    # jerk-free velocity integrator
        self.dof = degrees_of_freedom(mech)
        self._z_user = None
        if c.independent:
            z = [mech.coordinate_index(name, "independent coordinates") for name in c.independent]
            if len(z) != self.dof:
                raise ValueError(f"{len(z)} independent coordinates {list(c.independent)} given for "
                                 f"{self.dof} degrees of freedom")
            self._z_user = np.array(z, dtype=np.intp)
        if c.assembly_mode is not None:
            self._check_mode(c.assembly_mode)
        self.ctx = EvalContext(mech)
        self._zero_rate = np.zeros(mech.n)
        self._zero_rate.flags.writeable = False
        self.layout = self._make_layout()
        self._a_slice = self.layout.slices["a"]
        self._Qg = np.array(mech.gravity_forces, dtype=float)
        self._Qg.flags.writeable = False          # shared by units and estimates: never modified
        self._no_efforts = np.full(self.na, np.nan)
        self._no_efforts.flags.writeable = False
        # sensors: one persistent unit each (readings are set per step)
        self._sensor_units: Dict[str, F.Factor] = {}
        for s in mech.sensors:
            sigma = float(c.sensor_sigmas.get(s.name, s.sigma))
            if s.kind == "encoder":
                self._sensor_units[s.name] = F.Encoder(mech, s.coordinate, 0.0, sigma)
            else:
                self._sensor_units[s.name] = F.Gyroscope(mech, s.body, 0.0, sigma)
        self._sensor_order = list(self._sensor_units)
        self._generic_units: Dict[str, F.ObservedCoordinate] = {}
        self._requested_mode = None if c.assembly_mode is None else np.array(c.assembly_mode, dtype=int)
        self.z = None
        self._first_id = self._next_id = 0
        self.reset()

    # -- public API ---------------------------------------------------------------------------
    def reset(self):
        """Forget everything: the next `step` re-initializes (position problem, priors)."""
        self._window: Optional[FixedLagWindow] = None
        self._x = None
        self._k = -1
        self._t = None
        self._last: Optional[Estimate] = None
        self._last_obs: Dict[str, float] = {}
        self._last_efforts = np.full(self.na, np.nan)
        self._tau_hist: List[np.ndarray] = []
        self._mode = None if self._requested_mode is None else self._requested_mode.copy()
        self._pending_q = None
        self._reseed = None        # requested re-initialization at the last estimate: (solved q, readings, efforts,
        #                            whether on the estimate's branch)
        self._prediction = None    # (x, h, q̈ before, prediction) made by `prepare_next_step`
        self._reseeded = False     # the window was re-seeded on request: the next step says so
        self._switch_next = False
        self._retry = None
        self._failures = 0
        self._rejections: Dict[str, int] = {}
        self._seen_k: Dict[str, int] = {}       # step of each sensor's last reading (accepted or not)
        self._unconfirmed: set = set()          # sensors the seed (a guess) had no reading of, none accepted yet
        self._rejected: List[str] = []
        self._a_prev, self._h_prev = None, self.config.dt
        self._models: Dict[tuple, StepModel] = {}
        self._step_models: Dict[tuple, StepModel] = {}
        self._int_cache: Dict[float, list] = {}
        self._effort_priors: Dict[tuple, F.Prior] = {}
        self.relinearizations = 0
        self.recoveries = 0
        self.init_residual = float("nan")

    @property
    def independent_coordinates(self) -> Tuple[str, ...]:
        return () if self.z is None else tuple(self.mech.coordinate_names[i] for i in self.z)

    @property
    def last(self) -> Optional[Estimate]:
        return self._last

    def step(self, t: float, efforts=None, observations: Optional[Dict[str, float]] = None) -> Estimate:
        t_start = time.perf_counter()
        t = float(t)
        efforts = self._efforts_in(efforts)
        obs = self._observations_in(observations)
        try:
            est = self._step(t, efforts, obs)
        except Exception as exc:          # numerical failure: never escapes
            est = self._recover(t, efforts, obs, exc)
        est.solve_time = time.perf_counter() - t_start
        return est

    def prepare_next_step(self) -> bool:
        """Do now the part of the next step (one dt after the newest) that does not depend on its inputs:
        the prediction and the dynamics linearization at it, which the step then finds in the evaluation
        context.  A real-time caller runs this while it waits for the next inputs, which takes about a
        fifth of a step off the input-to-output path; the estimates are identical either way.  Only where
        the prediction is input-free: estimated efforts (estimation, fused) with the trapezoidal or Euler
        integrator (the forces of forward dynamics and the jerk of hermite come with the inputs).
        Returns whether anything was done; never raises."""
        if self._window is None or self._x is None or not self.has_tau or self.hermite:
            return False
        try:
            x, dt = self._x, self.config.dt
            xp = self._predict(x, dt)
        except Exception:      # the step itself meets (and handles) whatever failed here
            return False
        self._prediction = (x, dt, self._a_prev, xp)
        return True

    REINITIALIZED = "re-initialized on request"

    def reinitialize(self, assembly_mode=None):
        """Re-solve the position problem from the latest estimate on the requested (or the current) assembly
        mode; the next step clears the window, re-seeds it from this solution at the latest estimate's
        time (with that time's velocity, readings and efforts, under a prior of the estimate's marginal
        covariance) and advances it.  Returns (mode, max |Φ|) of the solution; raises AssemblyError
        (nothing changed) when there is no assembly on that mode.

        On the branch the estimate is on, the solution is the estimate projected onto the constraints
        (Newton from it with every coordinate free: the nearest assembly), and the re-seed's prior keeps
        the correlations of q and q̇: re-initializing then costs no accuracy (robot re-initialized every
        0.1 s: max error 2.6-5.1 mm vs 3.1-4.9 mm undisturbed over three runs).  Holding the observed
        coordinates instead moved the robot's platform by 15 mm near a singular pose (the motors held, the
        rest must absorb the constraint residual), and per-coordinate sigmas let the re-seed drift along
        that weakly observed direction.  On another branch the observed coordinates are held at their
        estimates (they fuse the readings and define the pose there; before the first estimate: the latest
        readings), under per-coordinate marginal sigmas (the old branch's correlations do not apply).  The
        window is re-seeded by the next step rather than here so that a caller answering a request (a ROS
        service) can reply after the position problem alone."""
        mode = self._mode if assembly_mode is None else self._check_mode(assembly_mode)
        last = self._last
        same_branch = last is not None and (self._mode is None or np.array_equal(mode, self._mode))
        if last is None:
            q_guess = self._initial_guess()
            fixed = self._fix_readings(q_guess, self._last_obs)
        else:
            q_guess = (last.q if self._reseed is None else self._reseed[0]).copy()
            fixed = [] if same_branch else self._read_coordinate_indices(self._last_obs)
        sol = solve_positions_on_mode(self.mech, q_guess, fixed, mode)
        if assembly_mode is not None:
            self._requested_mode = np.array(mode, dtype=int)
        self._mode = np.array(sol.assembly_mode, dtype=int)
        self.init_residual = float(sol.residual)
        if last is None:
            self._pending_q = sol.q
        else:
            self._reseed = (sol.q, dict(self._last_obs), self._last_efforts, same_branch)
        return tuple(int(m) for m in sol.assembly_mode), float(sol.residual)

    def add_late_observations(self, step: int, observations: Dict[str, float]) -> Tuple[List[str], List[str]]:
        """Readings of an earlier step that is still in the window (they arrived after it was estimated),
        addressed by that step's `Estimate.step`: each becomes a factor on that step's state and the
        window is updated, so the next estimates use them.  Returns (fused, refused) reading names;
        refused: unknown, NaN, outside the innovation gate, or the step no longer (or never) in the
        window."""
        obs = self._observations_in(observations)
        names = list(obs)
        window = self._window
        if window is None or not obs or self.config.mode == "forward_dynamics":   # (no readings in that mode)
            return [], names
        j = int(step) - self._first_id
        if j not in window.records:
            return [], names
        fused, refused, units = [], [], []
        for name, val in obs.items():
            u = self._sensor_units.get(name) or self._generic_unit(name)
            if u is None:
                refused.append(name)
                continue
            late = copy.copy(u)                 # the shared unit's value belongs to the newest step
            late.value = val
            units.append((name, late))
        if not units:
            return [], names
        x_j = window.estimate(j)
        _, A, r = linearize_step([u for _, u in units], self.layout, None, x_j, self.ctx)
        gate, rows, row = self.config.outlier_gate, [], 0
        for name, u in units:
            block = r[row:row + u.dim]
            # the gate's bookkeeping as for on-time readings: a sensor read late is not silent, and
            # refusals count towards max_rejections (persistent disagreement re-initializes)
            if gate and float(_max(np.abs(block))) > gate:
                refused.append(name)
                self._rejections[u.name] = self._rejections.get(u.name, 0) + 1
            else:
                rows.extend(range(row, row + u.dim))
                fused.append(name)
                self._rejections.pop(u.name, None)
                self._seen_k[u.name] = max(self._seen_k.get(u.name, j), j)
            row += u.dim
        if rows:
            if not window.add_factor(j, A[rows], r[rows], x_j):
                return [], names
            self._x = window.estimate(self._k)
        return fused, refused

    # -- inputs ---------------------------------------------------------------------------------
    @staticmethod
    def _vector(x, n, what):
        x = np.array(x, dtype=float).reshape(-1)
        if x.shape != (n,):
            raise ValueError(f"{what}: expected {n} values, got {x.size}")
        return x

    def _efforts_in(self, efforts):
        if efforts is None:
            return self._no_efforts
        e = np.array(efforts, dtype=float).reshape(-1)
        if e.size != self.na:
            raise ValueError(f"expected {self.na} efforts (actuators {list(self.mech.actuator_names)}), got {e.size}")
        return e

    def _observations_in(self, observations):
        out = {}
        if observations:
            for name, val in observations.items():
                try:
                    val = float(val)
                except (TypeError, ValueError):
                    continue
                if math.isfinite(val):
                    out[str(name)] = val
        return out

    def _check_mode(self, mode):
        m = np.array(mode, dtype=int).reshape(-1)
        k = len(self.mech.assembly_mode_points)
        if m.shape != (k,) or not np.all(np.isin(m, (-1, 1))):
            raise ValueError(f"assembly_mode must be {k} values of +1/-1 (indicators: "
                             f"{', '.join(self.mech.assembly_mode_names) or 'none'}), got {list(mode)}")
        return m

    # -- graph structure ----------------------------------------------------------------------
    def _make_layout(self) -> StateLayout:
        n, d = self.mech.n, self.dof
        blocks = [("q", n), ("v", n), ("a", n)]
        if self.independent:
            blocks += [("z", d), ("zd", d), ("zdd", d)] + ([("zj", d)] if self.hermite else [])
        if self.has_tau:
            blocks += [("tau", self.na)]
        return StateLayout(blocks)

    def _build_units(self, z):
        """Persistent units of the current window (parameters are updated in place every step)."""
        mech, s, n = self.mech, self.sigmas, self.mech.n
        self.z = None if z is None else np.asarray(z, dtype=np.intp)
        if self.independent:
            self._u_kin = [F.PositionConstraintsIndep(mech, self.z, s["position_constraints"]),
                           F.VelocityConstraintsIndep(mech, self.z, s["velocity_constraints"]),
                           F.AccelerationConstraintsIndep(mech, self.z, s["acceleration_constraints"])]
            self._u_dyn = (F.InverseDynamicsIndep(mech, self.z, sigma=s["dynamics"]) if self.has_tau
                           else F.ForwardDynamicsIndep(mech, self.z, sigma=s["dynamics"]))
            self._u_eq = F.SoftEquality("q", n, s["soft_equality"], offset=np.zeros(n))
        else:
            self._u_kin = [F.PositionConstraints(mech, s["position_constraints"]),
                           F.VelocityConstraints(mech, s["velocity_constraints"])]
            self._u_dyn = (F.InverseDynamics(mech, sigma=s["dynamics"]) if self.has_tau
                           else F.ForwardDynamics(mech, sigma=s["dynamics"]))
            self._u_eq = None
        self._u_jerk = None
        if self.hermite and self.independent:
            self._u_jerk = F.Jerk(mech, sigma=s["dynamics"], select=self.z, efforts=self.has_tau)
        self._forces_last = None        # (Q or Q_known, Q̇) of the newest step (jerk-free hermite)
        self._models.clear()
        self._step_models.clear()
        self._int_cache.clear()
        self._effort_priors.clear()

    def _integrators(self, h: float) -> list:
        units = self._int_cache.get(h)
        if units is None:
            s, n, d = self.sigmas, self.mech.n, self.dof
            x, xd, xdd, x3, dim = (("z", "zd", "zdd", "zj", d) if self.independent else ("q", "v", "a", None, n))
            si = s["integrator"]
            kind = self.config.integrator
            if kind == "hermite" and self.independent:
                units = [F.HermiteIntegrator(x, xd, xdd, dim, h, si), F.HermiteIntegrator(xd, xdd, x3, dim, h, si)]
            elif kind == "hermite":
                units = [F.HermiteIntegrator(x, xd, xdd, dim, h, si),
                         F.HermiteVelocityIntegrator(self.mech, h, sigma=si, efforts=self.has_tau)]
            elif kind == "euler":
                units = [F.EulerIntegrator(x, xd, dim, h, si), F.EulerIntegrator(xd, xdd, dim, h, si)]
            else:
                units = [F.TrapezoidalIntegrator(x, xd, dim, h, si), F.TrapezoidalIntegrator(xd, xdd, dim, h, si)]
            if self._u_eq is not None:
                units.append(self._u_eq)
            if self.has_tau:
                units.append(F.SoftEquality("tau", self.na, s["effort_random_walk"] * math.sqrt(h)))
            if len(self._int_cache) > 16:
                self._int_cache.clear()
            self._int_cache[h] = units
        return units

    def _commanded(self, efforts):
        """Commanded efforts for the forward-dynamics mode (unknown = 0)."""
        if not self.na:
            return efforts
        return np.where(np.isfinite(efforts), efforts, 0.0)

    def _effort_rate(self, tau, h):
        """Q̇ for the jerk factor from the commanded efforts: second-order backward differences."""
        if not self.na:
            return self._zero_rate
        hist = self._tau_hist
        if len(hist) >= 2:
            tdot = (3.0 * tau - 4.0 * hist[-1] + hist[-2]) / (2.0 * h)
        elif len(hist) == 1:
            tdot = (tau - hist[-1]) / h
        else:
            tdot = np.zeros(self.na)
        hist.append(tau)
        if len(hist) > 2:
            del hist[0]
        Qdot = np.zeros(self.mech.n)
        Qdot[self.mech.actuated] = tdot
        return Qdot

    def _set_forces(self, efforts, h):
        """Update the dynamics/jerk parameters for this step's efforts; return the effort-prior unit (fused).

        Jerk (hermite): Q̇ from the commanded efforts (forward_dynamics; fused, unknown entries count as
        constant), zero in estimation mode (the random-walk effort model has no expected rate).
        Sets ``_step_forces`` = (Q, or Q_known with estimated efforts; Q̇ or None)."""
        if not self.has_tau:
            if self.na:
                tau = self._commanded(efforts)
                Q = self._Qg.copy()
                Q[self.mech.actuated] += tau
            else:
                tau, Q = efforts, self._Qg
            self._u_dyn.Q = Q
            Qdot = None
            if self.hermite:
                Qdot = self._effort_rate(tau, h)
                if self._u_jerk is not None:
                    self._u_jerk.Q = Q
                    self._u_jerk.Qdot = Qdot
            self._step_forces = (Q, Qdot)
            return None
        fused = self.config.mode == "fused"
        Qdot = None
        if self.hermite:
            Qdot = self._effort_rate(self._commanded(efforts), h) if fused else self._zero_rate
            if self._u_jerk is not None and fused:
                self._u_jerk.Qdot = Qdot
        self._step_forces = (self._u_dyn.Q_known, Qdot)
        if not fused:
            return None
        known = np.isfinite(efforts)
        if not known.any():
            return None
        key = tuple(np.nonzero(known)[0])
        prior = self._effort_priors.get(key)
        if prior is None:
            prior = self._effort_priors[key] = F.Prior("tau", efforts[known], self.sigmas["commanded_effort"],
                                                        select=np.array(key, dtype=np.intp), size=self.na)
        prior.mean = efforts[known].copy()
        return prior

    def _observation_units(self, obs) -> list:
        if self.config.mode == "forward_dynamics" or not obs:
            return []
        units = []
        for name in self._sensor_order:
            val = obs.get(name)
            if val is not None:
                u = self._sensor_units[name]
                u.value = val
                units.append(u)
        if len(units) == len(obs):          # only named sensors
            return units
        for name in sorted(obs):
            if name in self._sensor_units:
                continue
            u = self._generic_unit(name)
            if u is not None:
                u.value = obs[name]
                units.append(u)
        return units

    def _generic_unit(self, name):
        u = self._generic_units.get(name)
        if u is None and ":" in name:
            kind, coord = name.split(":", 1)
            order = {"q": 0, "v": 1, "a": 2}.get(kind.strip())
            if order is None or coord.strip() not in self.mech.coordinate_names:
                return None
            sigma = float(self.config.sensor_sigmas.get(name, self.sigmas["observed_coordinate"]))
            u = self._generic_units[name] = F.ObservedCoordinate(
                self.mech, self.mech.coordinate_index(coord.strip()), order, 0.0, sigma)
        return u

    def _unknown_observations(self, obs):
        return [k for k in obs if k not in self._sensor_units and self._generic_unit(k) is None]

    def _model(self, units) -> StepModel:
        key = tuple(map(id, units))
        m = self._models.get(key)
        if m is None:
            if len(self._models) > 64:
                self._models.clear()
            m = self._models[key] = StepModel(self.layout, units)
        return m

    def _step_units(self, efforts, obs, h, with_observations=True) -> list:
        units = list(self._integrators(h)) if h is not None else []
        units += self._u_kin
        units += self._dynamic_units(self._step_params(efforts, h))
        if with_observations:
            units += self._observation_units(obs)
        return units

    def _dynamic_units(self, prior) -> list:
        units = [self._u_dyn]
        if self._u_jerk is not None:
            units.append(self._u_jerk)
        if prior is not None:
            units.append(prior)
        return units

    def _step_params(self, efforts, h):
        """Set this step's per-step unit parameters (forces, effort rates, the hermite velocity integrator's
        ends); returns the effort-prior unit (fused mode) or None."""
        prior = self._set_forces(efforts, self.config.dt if h is None else h)
        if self._hermite_lite:
            if h is not None:
                # the velocity integrator's forces at both ends, and the previous step's linearization point
                # (its jerk's linear model: see factors.HermiteVelocityIntegrator)
                hv = self._integrators(h)[1]
                Q0, Qd0 = self._forces_last
                Q1, Qd1 = self._step_forces
                zero = self._zero_rate
                hv.Q_prev, hv.Qdot_prev = Q0, (None if Qd0 is zero else Qd0)
                hv.Q, hv.Qdot = Q1, (None if Qd1 is zero else Qd1)
                x = self._window.last.x_cur
                n = self.mech.n
                hv.lin_prev = (x[:n], x[n:2 * n], x[self.layout.slices["tau"]] if self.has_tau else None)
            self._forces_last = self._step_forces
        return prior

    def _gate(self, units, whitened, k):
        """Innovation gate: drop readings whose whitened residual at the prediction exceeds
        ``outlier_gate`` (a sensor glitch would otherwise be traded against the constraints, which have
        comparable sigmas); after ``max_rejections`` consecutive rejections of a sensor it is believed again
        (the prediction is the likelier culprit, e.g. after an outage): then the window is re-initialized
        from the readings (the position problem with the encoder coordinates fixed) instead of adding a
        factor whose innovation no linearization could absorb.  After an outage of a sensor longer than
        ``outage_steps`` the prediction has run on the model alone, so a reading outside the gate
        re-initializes at once rather than being rejected ``max_rejections`` times.  A sensor that the
        window's seed had no reading of, when that seed was a guess (start-up, a skip or a disagreement:
        see `_initialize`), is believed after UNCONFIRMED_REJECTIONS rejections until one of its readings
        is accepted: the guess is then the likelier culprit, and one glitch is still not believed."""
        gate = self.config.outlier_gate
        kept = []
        for u in units:
            m = float(_max(np.abs(whitened(u))))
            since = k - self._seen_k.get(u.name, k)
            self._seen_k[u.name] = k
            if m > gate:
                if since > self.config.outage_steps:
                    self._rejections.clear()
                    raise _Resync(f"{u.name} disagreed with the prediction by {m:.3g} σ after "
                                  f"{since} steps without a reading")
                limit = self.config.max_rejections
                if u.name in self._unconfirmed:
                    limit = min(limit, UNCONFIRMED_REJECTIONS)
                if self._rejections.get(u.name, 0) >= limit:
                    self._rejections.clear()
                    raise _Resync(f"{u.name} disagreed with the prediction by {m:.3g} σ for {limit + 1} steps"
                                  + (" (the start was a guess)" if u.name in self._unconfirmed else ""))
                self._rejections[u.name] = self._rejections.get(u.name, 0) + 1
                self._rejected.append(f"{u.name} ({m:.3g} σ)")
                continue
            self._rejections.pop(u.name, None)
            self._unconfirmed.discard(u.name)
            kept.append(u)
        return kept

    # -- stepping -----------------------------------------------------------------------------
    def _step(self, t, efforts, obs) -> Estimate:
        self._last_obs.update(obs)
        if self._reseed is not None and self._last is not None:
            self._reseed_at_last()
        if self._reseeded and self._window is not None:
            return self._advance_after_reseed(t, efforts, obs)
        if self._window is None:
            retry, self._retry = self._retry, None
            if retry is not None and self._last is not None:
                # an earlier recovery could not re-initialize: try again from the last good estimate
                return self._reseed_and_advance(t, efforts, obs, "recovered", f"re-initialized after: {retry}")
            return self._initialize(t, efforts, obs, status="initialized", message="initialized")
        gap = t - self._t
        dt = self.config.dt
        if gap < -1e-9 * dt:
            self.reset()
            self._last_obs.update(obs)
            return self._initialize(t, efforts, obs, status="initialized",
                                    message=f"time went backwards by {-gap:.6g} s: re-initialized")
        if gap <= 1e-9 * dt:
            est = self._copy_estimate(self._last)
            est.status, est.message = "ok", "time did not advance: previous estimate"
            return est
        if self._switch_next:
            old = self.independent_coordinates
            est = self._reseed_and_advance(t, efforts, obs, "ok", "")
            est.message = "; ".join(filter(None, [f"independent coordinates {list(old)} -> "
                                                  f"{list(self.independent_coordinates)} (window re-seeded)",
                                                  est.message]))
            return est
        nsub = max(1, int(round(gap / dt)))
        if nsub > self.config.max_substeps:
            return self._initialize_from_last(t, efforts, obs, "initialized",
                                              f"gap of {gap:.6g} s ({nsub} steps): re-initialized")
        return self._advance_or_resync(t, efforts, obs, "ok", [])

    def _advance_or_resync(self, t, efforts, obs, status, messages) -> Estimate:
        try:
            return self._advance_to(t, efforts, obs, status, messages)
        except _Resync as why:
            return self._initialize_from_last(t, efforts, obs, "recovered", f"{why}: re-initialized from the readings")

    def _reseed_at_last(self):
        """The new window at the last estimate's time from the position `reinitialize` solved there (with
        that time's readings and efforts, the last velocity and efforts)."""
        (q, obs_then, efforts_then, same_branch), self._reseed = self._reseed, None
        last = self._last
        prior = self._marginal_covariance() if same_branch else self._marginal_sigmas()
        self._initialize(last.t, efforts_then, obs_then, q_guess=q, v_guess=last.v,
                         tau_guess=last.efforts if self.has_tau else None, mode=self._mode,
                         status="initialized", message=self.REINITIALIZED, prior=prior,
                         fix_readings=False, from_estimate=True)
        self._reseeded = True

    def _advance_after_reseed(self, t, efforts, obs) -> Estimate:
        self._reseeded = False
        if t - self._t <= 1e-9 * self.config.dt:
            return self._last
        return self._advance_or_resync(t, efforts, obs, "initialized", [self.REINITIALIZED])

    def apply_reinitialization(self) -> bool:
        """Re-seed the window now if `reinitialize` asked for it, instead of at the next step: a caller that
        has answered the request runs this in its idle time, so that the next step costs no more than
        usual.  The same estimates either way; returns whether anything was done; never raises (a
        failure re-seeds at the last estimate at the next step)."""
        if self._reseed is None or self._last is None:
            return False
        try:
            self._reseed_at_last()
        except Exception as exc:
            self._window = None
            self._retry = f"{type(exc).__name__}: {exc}"
        return True

    def _newest_marginal(self):
        """The marginal covariance of the newest state in the current window, or None."""
        if self._window is None:
            return None
        try:
            P = self._window.marginal_covariance(self._k)
        except Exception:      # (the window may be what failed)
            return None
        return P if np.isfinite(P).all() else None

    def _marginal_covariance(self):
        """The (q, q̇) block of the newest state's marginal covariance, or None: a re-seed from the last
        estimate under this prior (instead of the tight `prior_q0`/`prior_v0`) keeps what the window knew,
        correlations included, without claiming more."""
        P = self._newest_marginal()
        if P is None:
            return None
        sl = self.layout.slices
        idx = np.r_[sl["q"], sl["v"]]
        return P[np.ix_(idx, idx)]

    def _marginal_sigmas(self):
        """(σ_q, σ_q̇) per coordinate of the newest state's marginal, or None (see `_marginal_covariance`)."""
        P = self._newest_marginal()
        if P is None:
            return None
        sl = self.layout.slices
        d = np.sqrt(np.clip(np.diagonal(P), 0.0, None))
        sq, sv = np.maximum(d[sl["q"]], self.sigmas["prior_q0"]), np.maximum(d[sl["v"]], self.sigmas["prior_v0"])
        if not (np.isfinite(sq).all() and np.isfinite(sv).all()):
            return None
        return sq, sv

    def _initialize_from_last(self, t, efforts, obs, status, message) -> Estimate:
        """A new window at t seeded by the last estimate extrapolated to t (q, q̇ after a gap or a disagreement
        with the readings are guesses: with readings, the velocity gets the weak initial prior)."""
        last = self._last
        q, v = self._extrapolated(t)
        return self._initialize(t, efforts, obs, q_guess=q, v_guess=v, v_uncertain=True,
                                tau_guess=last.efforts if self.has_tau else None, mode=self._mode,
                                status=status, message=message)

    def _extrapolated(self, t):
        """(q, q̇) of the last estimate extrapolated to t at constant acceleration (for gaps up to
        MAX_EXTRAPOLATION; beyond, the last q and q̇ are better guesses than a long parabola)."""
        last = self._last
        gap = t - last.t
        if not 0.0 <= gap <= MAX_EXTRAPOLATION:
            return last.q, last.v
        return last.q + gap * last.v + 0.5 * gap * gap * last.a, last.v + gap * last.a

    def _advance_to(self, t, efforts, obs, status, messages) -> Estimate:
        """Integrate from the window's newest time to t (sub-steps of about dt) and make the estimate."""
        dt = self.config.dt
        gap = t - self._t
        nsub = max(1, int(round(gap / dt)))
        h = dt if abs(gap - nsub * dt) <= 1e-6 * dt else gap / nsub
        if nsub > 1:
            messages.append(f"{nsub - 1} missed step(s) integrated")
        for i in range(nsub):
            self._advance(h, efforts, obs if i == nsub - 1 else {})
        self._t = t
        if obs:
            unknown = self._unknown_observations(obs)
            if unknown:
                messages.append(f"ignored unknown observations {unknown}")
        if self._rejected:
            messages.append(f"rejected outlier readings {self._rejected}")
            self._rejected = []
        est = self._estimate(t, self._x, efforts, status, messages)
        self._check_failure(est)
        self._last = est
        self._last_efforts = efforts
        self._failures = 0
        return est

    def _reseed_and_advance(self, t, efforts, obs, status, message) -> Estimate:
        """Re-seed the window AT the last good estimate (same time, so no extrapolation error; priors on
        its q, q̇ projected on the constraints) and integrate to t as usual."""
        last = self._last
        self._initialize(last.t, self._last_efforts, {}, q_guess=last.q, v_guess=last.v,
                         tau_guess=last.efforts if self.has_tau else None, mode=self._mode,
                         status=status, message="", from_estimate=True)
        if t - self._t > 1e-9 * self.config.dt:
            est = self._advance_to(t, efforts, obs, status, [message])
        else:
            est = self._last
            est.message = message
        return est

    def _predict(self, x, h):
        """Continuity predictor: Taylor expansion of q, q̇ (through q̈ and, hermite, the jerk) from the
        previous estimate, then q̈ (and j) from the dynamics at the predicted (q, q̇) — the same dynamics
        linearization the step's factors use (shared through the context), so it costs nothing extra."""
        p = self._prediction
        if p is not None:
            self._prediction = None
            if p[0] is x and p[1] == h and p[2] is self._a_prev:    # prepared by `prepare_next_step`
                return p[3]
        sl = self.layout.slices
        n = self.mech.n
        n2, n3 = 2 * n, 3 * n
        q, a = x[:n], x[n2:n3]                      # the layout starts with q, q̇, q̈
        xp = x.copy()
        h2 = 0.5 * h * h
        h3 = h * h2 / 3.0
        if self._hermite_lite:
            # the jerk at the previous estimate, on the linear model the step factors use for it
            hv = self._integrators(h)[1]
            j = hv.jerk(hv.dynamics_prev(q, x[n:n2], ctx=self.ctx), x[n:n2], a, hv.Qdot_prev)
        elif self._a_prev is not None:
            j = (a - self._a_prev) / self._h_prev      # backward-difference jerk
        else:
            j = None
        qp, vp = xp[:n], xp[n:n2]
        xp[:n2] += h * x[n:n3]                      # q + h q̇, q̇ + h q̈
        if j is not None:
            qp += h2 * a + h3 * j
            vp += h2 * j
        else:
            qp += h2 * a
        if self.has_tau:
            Q = self._u_dyn.forces(xp[sl["tau"]])
        else:
            Q = self._u_dyn.Q
        d = self.ctx.dynamics(qp, vp, Q)
        ap = d.a
        xp[n2:n3] = ap
        if self._u_jerk is not None:
            jp = d.da_dq @ vp + d.da_dv @ ap + d.da_dQ @ self._u_jerk.Qdot
        if self._u_eq is not None:
            self._u_eq.offset = qp - q           # predictive soft equality (see factors.SoftEquality)
        if self.independent:
            z = self.z
            if self.hermite:
                zz, zd, zdd, zj = x[sl["z"]], x[sl["zd"]], x[sl["zdd"]], x[sl["zj"]]
                xp[sl["z"]] = zz + h * zd + h2 * zdd + h3 * zj
                xp[sl["zd"]] = zd + h * zdd + h2 * zj
                xp[sl["zdd"]] = ap[z]
                xp[sl["zj"]] = jp[z]
            else:
                xp[sl["z"]] = qp[z]
                xp[sl["zd"]] = vp[z]
                xp[sl["zdd"]] = ap[z]
        return xp

    def _advance(self, h, efforts, obs):
        k = self._k + 1
        prior = self._step_params(efforts, h)
        x_prev = self._x
        xp = self._predict(x_prev, h)
        readings = self._observation_units(obs) if obs else []
        window = self._window
        thr = self.relinearize_threshold_readings
        rec = window.prepare(k, self._step_model(h, prior, readings), xp, x_prev, thr if readings else None)
        if readings and self.config.outlier_gate:
            # the innovation gate, on the readings' rows of the linearization at the prediction
            kept = self._gate(readings, rec.model.whitened_rows, k)
            if len(kept) != len(readings):
                rec = window.prepare(k, self._step_model(h, prior, kept), xp, x_prev, thr if kept else None)
        x = window.commit(rec)
        self._a_prev, self._h_prev = x_prev[self._a_slice], h      # (estimates are never modified in place)
        if self.hermite and self.config.mode != "estimation" and self.na and k <= 2:
            x = self._correct_first_effort_rates(k, h)
        rec = self._window.last
        self.relinearizations = self._window.total_relinearizations
        if rec.mismatch > max(1e3 * (rec.threshold or self.relinearize_threshold), 1e3):
            raise StepFailure(f"linearization did not converge at step {k} (mismatch {rec.mismatch:.3g} after "
                              f"{rec.relinearizations} relinearizations)")
        self._k, self._x = k, x

    def _step_model(self, h, prior, readings) -> StepModel:
        key = (h, prior, *readings)
        model = self._step_models.get(key)
        if model is None:
            units = list(self._integrators(h)) + self._u_kin + self._dynamic_units(prior)
            model = self._model(units + readings)
            if len(self._step_models) > 64:
                self._step_models.clear()
            self._step_models[key] = model
        return model

    def _correct_first_effort_rates(self, k, h):
        """The jerk factor needs Q̇; at steps 0 and 1 the backward differences of the commanded efforts do
        not exist yet (0, then first order).  Once τ₁, τ₂ are known the two first jerk factors get
        second-order differences (forward at 0, central at 1), which keeps the hermite integrator 4th-order
        under time-varying efforts."""
        taus = self._tau_first
        taus.append(self._tau_hist[-1])
        E = self.mech.actuated
        w = self._window

        def qdot(tdot):
            Q = np.zeros(self.mech.n)
            Q[E] = tdot
            return Q

        if self._hermite_lite:
            # step j's velocity integrator reads Q̇ at steps j − 1 and j
            hv = self._integrators(h)[1]
            if k == 1 and len(taus) == 2:
                w.reparametrize(1, hv, Qdot_prev=qdot((taus[1] - taus[0]) / h))
            elif k == 2 and len(taus) == 3:
                q1 = qdot((taus[2] - taus[0]) / (2.0 * h))
                w.reparametrize(1, hv, Qdot_prev=qdot((-3.0 * taus[0] + 4.0 * taus[1] - taus[2]) / (2.0 * h)),
                                Qdot=q1)
                w.reparametrize(2, hv, Qdot_prev=q1)
        elif k == 1 and len(taus) == 2:
            w.reparametrize(0, self._u_jerk, Qdot=qdot((taus[1] - taus[0]) / h))
        elif k == 2 and len(taus) == 3:
            w.reparametrize(0, self._u_jerk, Qdot=qdot((-3.0 * taus[0] + 4.0 * taus[1] - taus[2]) / (2.0 * h)))
            w.reparametrize(1, self._u_jerk, Qdot=qdot((taus[2] - taus[0]) / (2.0 * h)))
        return w.estimate(k)

    def _estimate(self, t, x, efforts, status, messages) -> Estimate:
        L, mech = self.layout, self.mech
        n = mech.n
        qva = x[:3 * n].copy()                     # the layout starts with q, q̇, q̈
        q, v, a = qva[:n], qva[n:2 * n], qva[2 * n:]
        if self.has_tau:
            tau = x[L.slices["tau"]].copy()
        elif self.config.mode == "forward_dynamics" and self.na:
            tau = self._commanded(efforts)
        else:
            tau = np.zeros(0)
        Q = self._Qg.copy()
        if tau.size:
            Q[mech.actuated] += tau
        phi = self.ctx.phi(q)
        residual = float(_max(np.abs(phi))) if phi.size else 0.0
        self._x_abs_max = float(x.dot(x))       # |x|²: NaN / inf propagate (checked in _check_failure)
        self._speed = float(_max(np.abs(v))) if n else 0.0
        mode = mech.assembly_mode(q)
        if self._mode is not None and mode.size and mode.tolist() != self._mode.tolist():
            if self._requested_mode is not None and not np.array_equal(mode, self._requested_mode):
                raise StepFailure(f"assembly mode left the requested {self._mode_text(self._requested_mode)} "
                                  f"(now {self._mode_text(mode)})")
            messages.append(f"assembly mode changed from {self._mode_text(self._mode)} to {self._mode_text(mode)}")
        if mode.size:
            self._mode = mode
        cov = None
        if self.config.compute_covariance and self._window is not None:
            try:
                P = self._window.marginal_covariance(self._k)
                idx = np.r_[L.slices["q"], L.slices["v"]]
                cov = P[np.ix_(idx, idx)]
            except Exception as exc:      # covariance is a by-product: report, do not fail
                messages.append(f"covariance unavailable ({exc})")
        if self.independent and self._k % 10 == 0 and self._z_user is None:
            self._maybe_switch_independent(q, messages)
        step = self._first_id + self._k
        self._next_id = max(self._next_id, step + 1)
        return Estimate(t, q, v, a, Q, tau, mode, residual, 0.0, status, "; ".join(messages), cov, step)

    def _mode_text(self, mode):
        return "{" + ", ".join(f"{n}: {int(m):+d}" for n, m in zip(self.mech.assembly_mode_names, mode)) + "}"

    def _check_failure(self, est: Estimate):
        if not self._x_abs_max < math.inf or not (est.efforts.size == 0 or np.isfinite(est.efforts).all()):
            raise StepFailure("non-finite estimate")
        if est.constraint_residual > self.config.max_constraint_residual:
            raise StepFailure(f"constraint residual max |Φ| = {est.constraint_residual:.3g} exceeds "
                              f"{self.config.max_constraint_residual:g}")
        speed = self._speed
        if speed > self.config.max_speed:
            raise StepFailure(f"diverged: max |q̇| = {speed:.3g} exceeds {self.config.max_speed:g}")

    def _maybe_switch_independent(self, q, messages):
        """Independent formulation with automatic z: when the current z has become much worse conditioned
        than the best choice here (σ_min of N[z], N the orthonormal null space of Φq, 25 % hysteresis, checked every 10 steps), re-seed
        the window with the new z at the next step.  The integrators act on z, so a badly conditioned z
        costs accuracy long before it becomes singular (5-s four-bar fall in natural coordinates, trapezoidal:
        6 mm RMSE when switching only near singularity, 0.13 mm with this rule; hermite 2.5e-6 mm)."""
        z_best, N = choose_independent(self.mech, q, return_basis=True)
        if np.array_equal(np.sort(z_best), np.sort(self.z)):
            return
        s_cur = np.linalg.svd(N[self.z], compute_uv=False)[-1]
        s_best = np.linalg.svd(N[z_best], compute_uv=False)[-1]
        if s_cur * 1.25 >= s_best:
            return
        messages.append(f"independent coordinates {list(self.independent_coordinates)} are poorly conditioned "
                        f"here: switching to {[self.mech.coordinate_names[i] for i in z_best]} at the next step")
        self._switch_next = True

    # -- (re)initialization -------------------------------------------------------------------
    def _initial_guess(self):
        if self._pending_q is not None:
            return self._pending_q.copy()
        return np.array(self._q0_arg if self._q0_arg is not None else self.mech.q0, dtype=float)

    def _read_coordinates(self, obs) -> List[Tuple[int, float]]:
        """(coordinate, value) of the encoder / 'q:' readings in obs."""
        out = []
        for name, val in obs.items():
            u = self._sensor_units.get(name)
            if isinstance(u, F.Encoder):
                out.append((u.coordinate, val))
            elif name.startswith("q:"):
                g = self._generic_unit(name)
                if g is not None:
                    out.append((g.coordinate, val))
        return out

    def _read_coordinate_indices(self, obs) -> List[int]:
        """The coordinates the encoder / 'q:' readings in obs observe (sorted, once each)."""
        return sorted({c for c, _ in self._read_coordinates(obs)})

    def _fix_readings(self, q_guess, obs) -> List[int]:
        """Put encoder / 'q:' readings into q_guess; return the coordinates they fix."""
        first = self.mech.n_point_coordinates
        readings = self._read_coordinates(obs)
        for c, val in readings:
            q_guess[c] = _wrap_near(val, q_guess[c]) if c >= first else val
        return sorted({c for c, _ in readings})

    def _initialize(self, t, efforts, obs, q_guess=None, v_guess=None, tau_guess=None, mode=None,
                    status="initialized", message="", v_uncertain=False, prior=None,
                    fix_readings=True, from_estimate=False) -> Estimate:
        mech, c, L = self.mech, self.config, self.layout
        q_guess = self._initial_guess() if q_guess is None else np.array(q_guess, dtype=float)
        fixed = self._fix_readings(q_guess, obs) if fix_readings else self._read_coordinate_indices(obs)
        target = mode if mode is not None else self._mode
        try:
            sol = solve_positions_on_mode(mech, q_guess, fixed, target)
        except AssemblyError:
            if not fixed:
                raise
            # readings out of reach of the guess's branch / inconsistent: fall back to the guess alone
            sol = solve_positions_on_mode(mech, q_guess, (), target)
        q0 = sol.q
        self.init_residual = float(sol.residual)
        z = self._z_user if self._z_user is not None else choose_independent(mech, q0)
        self._build_units(z if self.independent else None)
        v_known = v_guess is not None
        if v_guess is None:
            v_known = self._v0_arg is not None and self._last is None
            v_guess = self._v0_arg if v_known else np.zeros(mech.n)
        v_guess = np.asarray(v_guess, dtype=float)
        zsel = z if len(z) else choose_independent(mech, q0)
        fixed_v = [int(i) for i in zsel]
        vals = [float(v_guess[i]) for i in zsel]
        for name, val in obs.items():
            if name.startswith("v:"):
                g = self._generic_unit(name)
                if g is not None and g.coordinate not in fixed_v:
                    fixed_v.append(g.coordinate)
                    vals.append(val)
        v0 = solve_velocities(mech, q0, fixed_v, vals, v_guess=v_guess)
        self._tau_hist = []
        if self.has_tau:
            tau0 = np.zeros(self.na) if tau_guess is None else np.array(tau_guess, dtype=float)
            known = np.isfinite(efforts)
            if c.mode == "fused" and known.any():
                tau0[known] = efforts[known]
            tau0 = np.where(np.isfinite(tau0), tau0, 0.0)
            Q0 = self._Qg.copy()
            Q0[mech.actuated] += tau0
        else:
            tau0 = None
            Q0 = self._Qg.copy()
            if self.na:
                Q0[mech.actuated] += self._commanded(efforts)
        self.ctx.clear()
        d = self.ctx.dynamics(q0, v0, Q0)
        a0 = d.a.copy()
        blocks = dict(q=q0, v=v0, a=a0)
        if self.hermite and self.independent:
            j0 = d.da_dq @ v0 + d.da_dv @ a0
            blocks["zj"] = j0[z]
        if self.independent:
            blocks.update(z=q0[z], zd=v0[z], zdd=a0[z])
        if self.has_tau:
            blocks["tau"] = tau0
        x0 = L.pack(**blocks)
        s = self.sigmas
        # With sensors an unknown initial velocity gets a weak prior: the mechanism may be moving when the
        # observer starts (a tight "at rest" prior would take ~100 steps and huge effort errors to unlearn).
        # (Only when readings arrive: without them every v0 fits and a weak prior leaves the trajectory free
        # to drift along that direction.)
        observed = c.mode != "forward_dynamics" and any(
            n in self._sensor_units or self._generic_unit(n) is not None for n in obs)
        sigma_v0 = s["initial_velocity"] if (observed and (v_uncertain or not v_known)) else s["prior_v0"]
        sigma_q0 = s["prior_q0"]
        # `prior`: the marginal of the estimate the window is re-seeded from, as (σ_q, σ_q̇) or as the
        # covariance of (q, q̇)
        if isinstance(prior, np.ndarray):
            n = mech.n
            priors = [F.CorrelatedPrior.from_covariance(("q", "v"), (n, n), np.concatenate((q0, v0)), prior,
                                                        floor=min(sigma_q0, s["prior_v0"]))]
        else:
            if prior is not None:
                sigma_q0, sigma_v0 = prior
            priors = [F.Prior("q", q0, sigma_q0), F.Prior("v", v0, sigma_v0)]
        if self.has_tau:
            priors.append(F.Prior("tau", tau0, s["initial_effort"]))
        units = priors + self._step_units(efforts, obs, None)
        self._window = FixedLagWindow(L, c.window, self.ctx, self.relinearize_threshold, c.max_relinearizations,
                                      scope=self.relinearize_scope, check_interval=c.check_interval)
        self._k = 0
        self._first_id = self._next_id          # step ids are never reused, across windows and resets
        # A seed that is a guess (start-up, re-initialization after a gap or a disagreement) has not been
        # confirmed by the sensors it had no reading of: their readings outside the gate re-initialize from
        # the readings after UNCONFIRMED_REJECTIONS rejections, not max_rejections, while the guess drifts.
        # (A re-seed at an estimate keeps the gate.)
        self._seen_k = {}
        self._unconfirmed = set() if from_estimate or c.mode == "forward_dynamics" else {
            u.name for name, u in self._sensor_units.items() if name not in obs}
        self._x = self._window.add_step(0, StepModel(L, units), x0)
        self._tau_first = list(self._tau_hist[-1:])
        self._a_prev, self._h_prev = None, c.dt
        self._t = t
        self._pending_q = None
        self._switch_next = False
        messages = [message] if message else []
        unknown = self._unknown_observations(obs)
        if unknown:
            messages.append(f"ignored unknown observations {unknown}")
        mode_before = self._mode
        self._mode = None          # the new window defines the mode
        est = self._estimate(t, self._x, efforts, status, messages)
        if mode_before is not None and est.assembly_mode.size and not np.array_equal(est.assembly_mode, mode_before):
            est.message = "; ".join(filter(None, [est.message, f"assembly mode is now {self._mode_text(est.assembly_mode)}"]))
        self._check_failure(est)
        self._last = est
        self._last_efforts = efforts
        return est

    def _recover(self, t, efforts, obs, exc) -> Estimate:
        """After a numerical failure: re-seed at the last good estimate and integrate to t; if that fails
        too (or failures repeat), re-initialize at t from an extrapolation; if even that fails, return the
        previous estimate and retry at the next step.  Never raises."""
        reason = f"{type(exc).__name__}: {exc}"
        last = self._last
        self.recoveries += 1
        self._failures += 1
        attempts = []
        if last is not None and self._failures <= 2:
            attempts.append("reseed")
        if last is not None:
            attempts.append("extrapolate")
        errors = []
        for how in attempts:
            try:
                if how == "reseed":
                    return self._reseed_and_advance(
                        t, efforts, obs, "recovered",
                        f"numerical failure ({reason}): re-seeded at the last good estimate (t={last.t:.6g})")
                return self._initialize_from_last(t, efforts, obs, "recovered",
                                                  f"numerical failure ({reason}): re-initialized at t={t:.6g}")
            except Exception as exc2:
                errors.append(f"{type(exc2).__name__}: {exc2}")
        self._window = None           # retry the initialization at the next step
        self._retry = reason
        detail = "; ".join(errors) or "no previous estimate"
        if last is not None:
            est = self._copy_estimate(last)
            est.q, est.v = self._extrapolated(t)
            est.t = t
            est.status = "recovered"
            est.message = (f"numerical failure ({reason}); re-initialization failed ({detail}): extrapolated "
                           f"previous estimate, retrying at the next step")
            return est
        q = self._initial_guess()
        n = self.mech.n
        na = self.na if (self.has_tau or self.config.mode == "forward_dynamics") else 0
        return Estimate(t, q, np.zeros(n), np.zeros(n), self._Qg.copy(), np.zeros(na),
                        self.mech.assembly_mode(q), float(np.abs(self.mech.constraints.phi(q)).max(initial=0.0)),
                        0.0, "waiting", f"cannot initialize yet ({reason})")

    @staticmethod
    def _copy_estimate(e: Estimate) -> Estimate:
        return Estimate(e.t, e.q.copy(), e.v.copy(), e.a.copy(), e.Q.copy(), e.efforts.copy(),
                        np.array(e.assembly_mode), e.constraint_residual, 0.0, e.status, e.message,
                        None if e.covariance is None else e.covariance.copy(), e.step)
