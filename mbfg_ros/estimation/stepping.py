"""The current window and the steps added to it.  A step gathers its per-step values (the effort
model's forces, the prediction's offset, the readings) without setting anything on the units, predicts the
state, lets the window linearize the step there (`FixedLagWindow.prepare`), lets the innovation gate screen
the readings on that linearization (a rejected reading: the step is linearized again without it), and adds
it with the relinearization safeguard (`FixedLagWindow.commit`).  Late readings of a step still in the
window become extra factors on its state; late commands of such a step replace the ones its factor was made
with (`correct_commands`).

An encoder's residual is wrapped (a reading matches its angle on any turn), so a prediction that has
gone a whole turn away from the readings (a long gap bridged without them, a diverging step, a skip ahead
under overload) would stay there with every reading accepted: a step whose reading of a multi-turn encoder
(the default: the reading is the angle, whole turns included) passed the gate but is whole turns from the
prediction raises `ReadingsDisagree`, and the facade re-initializes from the readings, on their turn (see
`seeding`).  Whatever made the two disagree, the reading is what says which turn the angle is on.  A
single-turn encoder (declared `turns: single` in the mechanism's sensors) says nothing about turns: its
readings are never checked so, and the estimate stays continuous with its own past.  Whether an encoder
is single-turn is never guessed from its readings (a guess that an encoder wrapped is indistinguishable
from an estimate that drifted a turn while steps were skipped).
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from mbfg_ros.dynamics.cache import EvalContext
from mbfg_ros.estimation.config import EstimatorConfig
from mbfg_ros.estimation.efforts import EARLY_RATE_STEPS, EffortModel
from mbfg_ros.estimation.estimates import StepFailure
from mbfg_ros.estimation.reading_timing import late_spread
from mbfg_ros.estimation.sensors import InnovationGate, ReadingsDisagree, Sensors, TrackMonitor
from mbfg_ros.estimation.step_factors import StepFactors
from mbfg_ros.graph.step_model import linearize_step
from mbfg_ros.graph.window import FixedLagWindow

__all__ = ["Stepper"]

TWO_PI = 2.0 * math.pi
FAILURE_NOISE = 5.0     # a step's dynamics rows may be off by this many of the accelerations' per-step σ


class Stepper:
    """The current window (``window``, None before a seed), its newest step ``k`` (id ``first_id + k``:
    ids are never reused, across windows and resets), time ``t`` and estimate ``x``."""

    def __init__(self, config: EstimatorConfig, factors: StepFactors, efforts: EffortModel, sensors: Sensors,
                 gate: InnovationGate, ctx: EvalContext, monitor: Optional[TrackMonitor] = None):
        self.dt = config.dt
        self.factors, self.efforts, self.sensors, self.gate, self.ctx = factors, efforts, sensors, gate, ctx
        # Relinearization threshold (whitened units).  A mismatch ε moves the estimate by at most what an
        # ε-sigma perturbation of that factor would.  Steps without readings are pure predictions (the
        # digital twin, or an observer between sensor samples) and need ε ≪ 1 to keep the model's
        # discretization-level accuracy.  In steps with readings the innovations (~σ of the sensors) make
        # the dynamics rows' mismatch a few σ_dyn while the unknown efforts let q̈ move by ~1e3 σ_dyn per
        # step: there 10 σ catches genuinely bad linearizations without re-linearizing routine steps (see
        # test_default_relinearization_close_to_full_nonlinear_smoother).  With sensors, later steps move
        # earlier states (smoothing) and only the scope "window" re-checks them all (the full nonlinear
        # fixed-lag smoother); the default "newest" checks the step just added.
        thr = config.relinearize_threshold
        self.threshold = float(1e-3 if thr is None else thr)              # prediction steps
        self.threshold_readings = float(10.0 if thr is None else thr)     # steps with readings
        # the prediction is input-free (`prepare_next`) with estimated efforts and a jerk-free integrator
        # (fused mode: the prediction uses the newest step's commands, `StepFactors.predict`)
        self._input_free_prediction = efforts.has_state and config.integrator != "hermite"
        self.monitor = monitor if monitor is not None and monitor.enabled else None
        self.sensors_changed()
        self._sensor_names = sensors.units.keys()
        self._v_start = factors.layout.slices["v"].start
        self._q_slice = factors.layout.slices["q"]
        self.first_id = self.next_id = 0
        self.reset()

    def sensors_changed(self):
        """The sensors' units were replaced (a new σ: `Sensors.set_sigma`)."""
        # the multi-turn encoders of relative angles (unit -> (sensor name, coordinate)): their readings'
        # turns are checked
        single = self.sensors.single_turn_coordinates
        self._angle_encoders = {u: (name, u.coordinate) for name, u in self.sensors.units.items()
                                if getattr(u, "angle", False) and u.coordinate not in single}
        if self.monitor is not None:
            self.monitor.refresh()

    def reset(self):
        self.window: Optional[FixedLagWindow] = None
        self.x: Optional[np.ndarray] = None
        self.k = -1
        self.t: Optional[float] = None
        self.relinearizations = 0       # of the current window
        self._unsettled: Optional[str] = None   # a note on a step kept unsettled (`_within_acceleration_noise`)
        self._prediction = None         # (x, h, q̈ before, (prediction, offset)) made by `prepare_next`
        self.a_prev, self.h_prev = None, self.dt
        # a late multi-turn encoder reading whole turns from its step's estimate: (name, reading, turns, coordinate)
        self.late_turns: Optional[Tuple[str, float, int, int]] = None

    def start(self, window: FixedLagWindow, x: np.ndarray, t: float):
        """A new window (seeded at t, first estimate x)."""
        self.window, self.x, self.k, self.t = window, x, 0, t
        if self.monitor is not None:
            self.monitor.restart()
        self.first_id = self.next_id
        self.a_prev, self.h_prev = None, self.dt

    def estimated(self):
        """The newest step's estimate was made: its id is taken."""
        self.next_id = max(self.next_id, self.first_id + self.k + 1)

    def substeps(self, t: float) -> Tuple[int, float]:
        """(number, length) of the sub-steps of about dt from the newest time to t."""
        dt = self.dt
        gap = t - self.t
        nsub = max(1, int(round(gap / dt)))
        return nsub, (dt if abs(gap - nsub * dt) <= 1e-6 * dt else gap / nsub)

    def advance_to(self, t: float, efforts: np.ndarray, obs: Dict[str, float], messages: list,
                   substeps: Optional[Tuple[int, float]] = None):
        """Integrate from the newest time to t (`substeps` of about dt, if the caller has them already); notes
        for the estimate's message go to `messages`."""
        nsub, h = self.substeps(t) if substeps is None else substeps
        if nsub == 1:
            self.advance(h, efforts, obs)
        else:
            messages.append(f"{nsub - 1} missed step(s) integrated")
            for i in range(nsub):
                self.advance(h, efforts, obs if i == nsub - 1 else {})
        self.t = t
        if obs and not self._sensor_names >= obs.keys():      # (usually only the mechanism's sensors read)
            unknown = self.sensors.unknown(obs)
            if unknown:
                messages.append(f"ignored unknown observations {unknown}")
        if self.gate.rejected:
            messages.append(f"rejected outlier readings {self.gate.take_rejected()}")
        if self._unsettled is not None:
            messages.append(self._unsettled)
            self._unsettled = None

    def advance(self, h: float, efforts: np.ndarray, obs: Dict[str, float]):
        """One step h after the newest."""
        k = self.k + 1
        factors, window = self.factors, self.window
        values, prior = factors.step_values(efforts, h, window)
        x_prev = self.x
        # the prediction `prepare_next` made, if for this step
        prepared, self._prediction = self._prediction, None
        if prepared is not None and prepared[0] is x_prev and prepared[1] == h and prepared[2] is self.a_prev:
            xp, offset = prepared[3]
        else:
            xp, offset = factors.predict(x_prev, h, self.a_prev, self.h_prev, values)
        if offset is not None:
            factors.prediction_values(offset, values)
        readings = self.sensors.step_units(obs, values, self._timing_spreads(obs, xp)) if obs else []
        thr = self.threshold_readings
        rec = window.prepare(k, factors.model(h, prior, readings), xp, x_prev, thr if readings else None, values)
        if readings and self.gate.enabled:
            kept = self.gate.screen(readings, rec.model.whitened_rows, k)
            if len(kept) != len(readings):
                rec = window.prepare(k, factors.model(h, prior, kept), xp, x_prev, thr if kept else None, values)
            readings = kept
        if readings and self._angle_encoders:
            self._check_turns(readings, obs, xp)
        x = window.commit(rec)
        self.a_prev, self.h_prev = x_prev[factors.a_slice], h      # (estimates are never modified in place)
        rates = self.efforts.early_rates(k, h) if k <= EARLY_RATE_STEPS else None
        if rates is not None:
            if rates:
                factors.correct_early_rates(window, k, h, rates)
            x = window.estimate(k)
        rec = window.last
        self.relinearizations = window.total_relinearizations
        # (more than max(1e3 × the threshold, 1e3): the usual step stops at the first comparison)
        if rec.mismatch > 1e3 and rec.mismatch > 1e3 * (rec.threshold or self.threshold) \
                and not self._within_acceleration_noise(rec, h, k, x):
            raise StepFailure(f"linearization did not converge at step {k} (mismatch {rec.mismatch:.3g} after "
                              f"{rec.relinearizations} relinearizations)")
        if obs and self.monitor is not None:
            self.monitor.check(obs, x)
        self.k, self.x = k, x

    def _within_acceleration_noise(self, rec, h: float, k: int, x: np.ndarray) -> bool:
        """Is a step whose relinearization did not settle off only in its dynamics rows, and there by less than
        `FAILURE_NOISE` of the per-step σ of the accelerations' white noise (2 √(S/h), S the acceleration density:
        the velocity rows' σ √(S h) over h/2)?  The dynamics rows' σ is a numerical tolerance; their mismatch, in
        accelerations, is a model error the white noise already admits."""
        if not self.efforts.has_state:
            return False
        window = self.window
        off = window.row_mismatches(rec, window.estimate(k - 1) if rec.x_prev is not None else None, x)
        limit = 1e3 * (rec.threshold or self.threshold)
        noise = FAILURE_NOISE * 2.0 * math.sqrt(self.factors.sigmas["acceleration_density"] / h)
        worst = 0.0
        for u, a, b in rec.model.check_blocks:
            if u is self.factors.dynamics:
                worst = max(worst, float(np.max(off[a:b] * u.sigmas)))
                if worst > noise:
                    return False
            elif np.any(off[a:b] > limit):
                return False
        self._unsettled = (f"linearization left unsettled (its dynamics rows {worst:.3g} off: under "
                           f"{FAILURE_NOISE:g}× the accelerations' noise, {noise / FAILURE_NOISE:.3g} a step)")
        return True

    def _timing_spreads(self, obs: Dict[str, float], xp: np.ndarray) -> Optional[Dict[str, float]]:
        """The encoders of this step's readings stamped late (`reading_timing`): name → the 1σ that adds at the
        predicted speed of the encoder's coordinate."""
        excess = self.sensors.timing.excess
        if not excess:
            return None
        v0, units, spreads = self._v_start, self.sensors.units, {}
        q, slices = xp[self._q_slice], self.factors.layout.slices
        for name, (e, h) in excess.items():
            y = obs.get(name)
            if y is None:
                continue
            u = units[name]
            # the reading's lag behind the prediction: the encoder's own residual, prediction − reading
            blocks = [q] if len(u.slots) == 1 else [xp[slices[slot]] for slot in u.slots]
            s = late_spread(u.error(*blocks, params=(y,)).item(), xp.item(v0 + u.coordinate), e, h, float(u.sigmas[0]))
            if s > 0.0:
                spreads[name] = s
        return spreads

    def _check_turns(self, units: list, obs: Dict[str, float], x: np.ndarray):
        """Raise ReadingsDisagree if a multi-turn angle encoder's reading among a step's `units` is whole turns
        (within a quarter turn) from its angle in x (see the module docstring)."""
        for u in units:
            encoder = self._angle_encoders.get(u)
            if encoder is None:
                continue
            name, c = encoder
            d = obs[name] - float(x[c])     # (plain floats: numpy's scalar overhead dominates here)
            turns = round(d / TWO_PI)
            if turns and abs(d - TWO_PI * turns) <= 0.25 * TWO_PI:
                # (farther from a whole turn: a disagreement the gate judges, not a turn; only with the gate off)
                raise ReadingsDisagree(f"{name} reads {obs[name]:.6g} rad, {turns:+d} turn(s) from the predicted "
                                       f"{x[c]:.6g} rad (a multi-turn encoder; declare `turns: single` in the "
                                       f"mechanism's sensors if it reads modulo one turn)", turns=True)

    def prepare_next(self) -> bool:
        """Predict the next step (one dt after the newest) now, if the prediction does not depend on the
        step's inputs (see `FixedLagEstimator.prepare_next_step`); never raises."""
        if self.window is None or self.x is None or not self._input_free_prediction:
            return False
        x, dt = self.x, self.dt
        try:
            prediction = self.factors.predict(x, dt, self.a_prev, self.h_prev)
        except Exception:      # the step itself meets (and handles) whatever failed here
            return False
        self._prediction = (x, dt, self.a_prev, prediction)
        return True

    def correct_commands(self, corrections: Sequence[Tuple[int, np.ndarray]]) -> List[int]:
        """Replace the commanded efforts that steps already in the window were estimated with (`corrections`:
        (step id, efforts in actuator order) pairs): their factors become those of the new commands, in one
        window update (`FixedLagWindow.replace_values`).  Returns the step ids corrected: those still in the
        window, where the commands enter the step's factor alone (`StepFactors.command_values`)."""
        window = self.window
        if window is None:
            return []
        changes, first = {}, self.first_id
        for step, efforts in corrections:
            j = int(step) - first
            if j in window.records:
                values = self.factors.command_values(efforts)
                if values is None:
                    return []
                changes[j] = values
        done = window.replace_values(changes)
        if done:
            if self.k in done:
                self.factors.newest_commands_replaced(changes[self.k])
            self.x = window.estimate(self.k)     # (a prediction prepared from the old estimate is not used)
        return [first + j for j in done]

    def add_late(self, step: int, obs: Dict[str, float]) -> Tuple[List[str], List[str]]:
        """Readings of step id `step` as factors on its state, through the innovation gate: (fused, refused)."""
        names = list(obs)
        window = self.window
        if window is None or not obs or not self.sensors.active:
            return [], names
        j = int(step) - self.first_id
        if j not in window.records:
            return [], names
        fused, refused, units, readings = [], [], [], []
        x_j = window.estimate(j)
        for name, val in obs.items():
            u = self.sensors.unit(name)
            if u is None:
                refused.append(name)
                continue
            encoder = self._angle_encoders.get(u)
            if encoder is not None:
                # a multi-turn encoder's late reading whole turns from its step's estimate (which its wrapped
                # residual would accept): not fused; the facade moves the estimate onto the reading's turn
                d = float(val) - float(x_j[encoder[1]])
                turns = round(d / TWO_PI)
                if turns and abs(d - TWO_PI * turns) <= 0.25 * TWO_PI:
                    refused.append(name)
                    self.late_turns = (name, float(val), int(turns), encoder[1])
                    continue
            units.append((name, u))
            readings.append((val,))
        if not units:
            return [], names
        _, A, r = linearize_step([u for _, u in units], self.factors.layout, None, x_j, self.ctx, params=readings)
        rows, row = [], 0
        for (name, u), passed in zip(units, self.gate.screen_late([u for _, u in units], r, j)):
            if passed:
                rows.extend(range(row, row + u.dim))
                fused.append(name)
            else:
                refused.append(name)
            row += u.dim
        if rows:
            if not window.add_factor(j, A[rows], r[rows], x_j):
                return [], names
            self.x = window.estimate(self.k)
        return fused, refused
