"""The estimator node's bookkeeping of what happened: counters of rejected inputs and events, per-period
statistics of the steps, throttled warnings, and the /diagnostics status built from them."""

from __future__ import annotations

import math
import time
from typing import Dict, Optional

import numpy as np

from diagnostic_msgs.msg import DiagnosticStatus

from mbfg_ros import native
from mbfg_ros.estimation.actuator_delay import configured_delays, configured_effort_sigmas, configured_time_constants
from mbfg_ros.estimation.config import Estimate, EstimatorConfig
from mbfg_ros.estimation.density_adaptation import limits_warning
from mbfg_ros.estimation.efforts import effort_kinds
from mbfg_ros.estimation.identification import CONFOUNDED
from mbfg_ros.model.mechanism import Mechanism
from mbfg_ros.model.plausibility import KINDS
from mbfg_ros.ros.parameters import Settings
from mbfg_ros.ros.scheduler import NS, InputScheduler, expected_streams
from mbfg_ros.shown import MAX_LINE, shown

# Kinds of rejected input and what they mean (keys of the `rejected.*` diagnostics).
REJECT_KINDS = {
    "bad_message": "serialized message that does not decode as its type (JointState, Float64MultiArray)",
    "long_string": "frame_id, joint name or layout label longer than 256 bytes, or more than 1024 names",
    "empty": "JointState without joint names, or without the values (position / velocity / effort) its topic "
             "needs; Float64MultiArray without values",
    "bad_size": "array sizes inconsistent (names vs values, or wrong number of efforts)",
    "unknown_joint": "joint name matches no sensor / actuator of the mechanism",
    "not_prescribed": "set-point on prescribed_motion for an actuator whose effort kind is not 'prescribed' "
                      "(parameter actuator_efforts, or the mechanism file's effort key)",
    **KINDS,       # non_finite, implausible_position / _rate / _effort (the mechanism's plausibility limits)
    "bad_stamp": "zero or negative header stamp",
    "no_clock": "node clock not valid yet (use_sim_time without /clock)",
    "future": "stamp later than node clock + future_tolerance",
    "stale": "stamp older than node clock - max_input_age",
    "before_reset": "stamp before the last reset",
    "late": "input of a step already estimated that could not be used: a reading outside the innovation "
            "gate (or whose step left the window meanwhile), or a command older than the ones its steps used",
    "too_old": "stamp older than the estimator window",
    "duplicate": "the same reading (sensor, stamp, value) or command (stamp, values) again",
    "conflicting": "a reading or command with the stamp of an earlier one but another value (both dropped while "
                   "their step is pending, else the second)",
    "same_step": "another reading of a sensor for a step that has one (a sensor faster than the timestep): "
                 "the one stamped nearest the step's time is used while the step is pending, else the first",
}
EVENTS = ("resets", "time_jumps", "reinitializations", "solver_recoveries", "turn_recoveries", "lost_track",
          "solver_failures",
          "overruns",
          "skipped_steps", "predicted_steps", "steps", "late_readings_fused", "late_command_corrections",
          "late_steps", "inputs_behind", "no_setpoints", "prediction_stops")
WARN_EVERY_S = 10.0     # a kind of problem is logged at its first occurrence, then at most this often


def clock_hint(lag_ns: int, use_sim_time: bool) -> str:
    """Which clock is behind, for inputs stamped `lag_ns` behind (> 0) or ahead of (< 0) the node clock:
    the recording hint only for a node on /clock (a live publisher that falls behind is not a bag)."""
    if lag_ns >= 0:
        if use_sim_time:
            return ("the inputs' stamps are behind /clock (use_sim_time): play a recording with --clock, and let "
                    "one source publish /clock")
        return ("the inputs' publisher is behind this node's wall clock: starved of CPU or overloaded (give it a "
                "real-time priority, see docs/ros2_interfaces.md), or its machine's clock is not synchronized")
    if use_sim_time:
        return "the inputs' stamps are ahead of /clock (use_sim_time): another /clock source, or a recording played without --clock"
    return "the inputs' publisher's clock is ahead of this node's wall clock: clocks of two machines not synchronized"


def new_period_stats() -> dict:
    """What the hot path accumulates between two diagnostics reports."""
    return {"steps": 0, "solve": [], "solve_cpu": [], "latency": [], "late": 0, "input_delay": []}


def kernel_text(numerics: Optional[Dict[str, str]]) -> str:
    """The `kernel` diagnostic: 'compiled' (`native.describe`) where every model of the core runs in the kernel,
    else each model's form ('step: numpy (no compiled form of hermite_velocity), dynamics: compiled')."""
    overall = native.describe()
    if not numerics or all(form == overall for form in numerics.values()):
        return overall
    return ", ".join(f"{model}: {form}" for model, form in numerics.items())


def parameter_texts(parameters: Optional[dict]) -> Dict[str, str]:
    """The diagnostics of the identified parameters (`EstimatorCore.parameters`): `parameter.<name>` =
    "<value> ± <σ> (excitation <e>)" each, `identification` = learning | settling | frozen, where friction is
    identified of an actuator whose effort is estimated `identification.confounded` naming it, and where a friction or
    a payload was moved onto its bound 0 `identification.bounded` with the times; {} when nothing is identified."""
    if not parameters:
        return {}
    kv = {f"parameter.{name}": f"{value:.6g} ± {std:.3g} (excitation {excitation:.2f})"
          for name, value, std, excitation in zip(parameters["names"], parameters["values"], parameters["std"],
                                                  parameters["excitation"])}
    kv["identification"] = ("frozen" if parameters["frozen"] else
                            "settling" if parameters.get("settling") else "learning")
    if parameters.get("confounded"):
        kv["identification.confounded"] = f"{', '.join(parameters['confounded'])} ({CONFOUNDED}: weakly determined)"
    moved = [(name, int(n)) for name, n in zip(parameters["names"], parameters.get("projections", ())) if n]
    if moved:
        kv["identification.bounded"] = (", ".join(f"{name} {n}×" for name, n in moved)
                                        + " (estimated below 0 and moved onto it: the model's error, not theirs)")
    return kv


def branch_text(mech: Mechanism, mode) -> str:
    names = mech.assembly_mode_names
    if not names:
        return "no assembly-mode indicators"
    return ", ".join(f"{n}={int(m):+d}" for n, m in zip(names, list(mode)))


class Diagnostics:
    """Counters (`counters`: rejected inputs by kind; `events`), the current period's step statistics
    (`period_stats`, appended to by the hot path), the last error and message, throttled warnings."""

    def __init__(self, logger, mech: Mechanism):
        self.logger = logger
        self.mech = mech
        self.counters = {k: 0 for k in REJECT_KINDS}
        self.events = {k: 0 for k in EVENTS}
        self.period_stats = new_period_stats()
        self.last_error = ""
        self.last_message = ""
        # why estimation stopped (max_prediction passed without readings) until it runs again; "" otherwise
        self.stopped = ""
        self._failures_reported = 0
        # what each angle encoder's readings say about turns (mechanism YAML `turns:`): fixed for the node's life
        self.encoder_turns = ", ".join(f"{s.name}={'single' if s.single_turn else 'multi'}" for s in mech.sensors
                                       if s.kind == "encoder" and s.coordinate >= mech.n_point_coordinates)
        self._log_times: Dict[str, float] = {}

    def warn_kind(self, kind: str, detail):
        """Log the first occurrence of each kind, then at most every WARN_EVERY_S with the running count of a
        counted kind (a state, e.g. the density fit at an edge, has none) (`detail`: a text, or a function that
        makes it, called only when the line is logged)."""
        now = time.monotonic()
        last = self._log_times.get(kind)
        if last is None or now - last > WARN_EVERY_S:
            self._log_times[kind] = now
            n = self.counters.get(kind, self.events.get(kind))
            count = "" if n is None else f" ({n} so far)"
            # details quote outside strings (each already cut by `shown`): the line is bounded as a whole too
            self.logger.warning(f"{kind}{count}: {shown(detail() if callable(detail) else detail, MAX_LINE)}")

    def reject(self, kind: str, detail):
        self.counters[kind] = self.counters.get(kind, 0) + 1
        if kind in REJECT_KINDS:
            self.warn_kind(kind, lambda: f"{REJECT_KINDS[kind]}: {detail() if callable(detail) else detail}")
        else:
            self.warn_kind(kind, detail)

    def reject_all(self, problems):
        """(kind, detail) problems of one input."""
        for kind, detail in problems:
            self.reject(kind, detail)

    def snapshot(self, now: int, state: str, config: EstimatorConfig, last_estimate: Optional[Estimate],
                 last_t_k: Optional[int], assembly_mode, sched: InputScheduler, settings: Settings,
                 fitted_densities: Optional[Dict[str, float]] = None, use_sim_time: bool = False,
                 fitted_sensor_sigmas: Optional[Dict[str, float]] = None,
                 numerics: Optional[Dict[str, str]] = None, parameters: Optional[dict] = None,
                 setpoints: Optional[Dict[str, Optional[int]]] = None,
                 density_limits: Optional[Dict[str, str]] = None):
        """(period statistics, key/values, level, messages) of a report; starts a new period.  Under the
        node's lock: it reads what the hot path writes.  `numerics`: the core's form per model (`kernel_text`);
        `parameters`: the identified parameters (`EstimatorCore.parameters`, `parameter_texts`); `setpoints`: per
        prescribed actuator, when its newest set-point was received (node clock ns, None: never);
        `density_limits`: the fitted densities at the edge of their range (`FixedLagEstimator.density_fit_limits`)."""
        ps = self.period_stats
        self.period_stats = new_period_stats()
        dt = config.dt
        level, msgs = DiagnosticStatus.OK, []
        st = state
        if now <= 0:
            level, st = DiagnosticStatus.WARN, "waiting for valid ROS time"
        kv = {"state": st, "mechanism": self.mech.name, "mode": config.mode,
              "formulation": config.formulation, "integrator": config.integrator,
              "dt": dt, "window": config.window, "kernel": kernel_text(numerics)}
        if self.encoder_turns:
            kv["encoder_turns"] = self.encoder_turns
        if self.mech.actuator_names:
            kinds = effort_kinds(config.mode, self.mech, config.actuator_efforts)
            kv["actuator_efforts"] = ", ".join(f"{n}={k}" for n, k in zip(self.mech.actuator_names, kinds))
            for key, times in (("actuator_delays", configured_delays(self.mech, config.actuator_delays)),
                               ("actuator_time_constants",
                                configured_time_constants(self.mech, config.actuator_time_constants))):
                if any(times):
                    kv[key] = ", ".join(f"{n}={1e3 * x:g} ms" for n, x in zip(self.mech.actuator_names, times))
            ripples = configured_effort_sigmas(self.mech, config.actuator_effort_sigmas)
            if any(ripples):
                kv["actuator_effort_sigmas"] = ", ".join(f"{n}={x:g}"
                                                         for n, x in zip(self.mech.actuator_names, ripples))
        est = last_estimate
        if est is not None:
            kv["assembly_mode"] = branch_text(self.mech, est.assembly_mode)
            kv["constraint_residual"] = float(est.constraint_residual)
            kv["status"] = est.status
            kv["estimate_time"] = (last_t_k / NS) if last_t_k is not None else ""
        else:
            kv["assembly_mode"] = branch_text(self.mech, assembly_mode) if assembly_mode else "auto"
        for name, density in (fitted_densities or {}).items():
            kv[name] = density                               # the online fit's value now
        for name, sigma in (fitted_sensor_sigmas or {}).items():
            kv[f"sensor_sigma.{name}"] = sigma               # the online fit's σ of each encoder now
        if density_limits is not None:
            kv["density_fit_limits"] = ", ".join(f"{n} {edge}" for n, edge in density_limits.items()) or "none"
            text = limits_warning(density_limits)
            if text and st == "running":
                level = max(level, DiagnosticStatus.WARN)
                msgs.append(text)
                self.warn_kind("density_fit_limits", text)
        kv.update(parameter_texts(parameters))
        kv["output_rate_hz"] = ps["steps"] / settings.diagnostics_period
        kv["target_rate_hz"] = 1.0 / dt
        kv["budget_ms"] = dt * 1e3
        if setpoints:
            # a prescribed joint without set-points has its effort estimated from the other readings alone (the
            # estimate goes on, worse): said like a silent input stream
            ages = {n: (now - rx) / NS if rx is not None else math.inf for n, rx in setpoints.items()}
            kv["prescribed"] = ", ".join(f"{n}: {age:.3g} s" if math.isfinite(age) else f"{n}: never"
                                         for n, age in ages.items())
            silent = [n for n, age in ages.items() if age > settings.sensor_timeout]
            if silent and st == "running":
                level = max(level, DiagnosticStatus.WARN)
                text = (f"no set-points on prescribed_motion for prescribed actuator(s) {', '.join(silent)} "
                        f"(sensor_timeout {settings.sensor_timeout} s): their efforts are estimated without their "
                        f"motion")
                msgs.append(text)
                self.events["no_setpoints"] += 1
                self.warn_kind("no_setpoints", text)
        for k, v in self.events.items():
            kv[k] = v
        for k, v in self.counters.items():
            kv[f"rejected.{k}"] = v
        if sched.anchored:
            kv["next_step_time"] = sched.t_of(sched.k_next) / NS
        expected = expected_streams(config.mode, effort_kinds(config.mode, self.mech, config.actuator_efforts))
        waited = sched.waited_streams(now, expected)
        wait = sched.wait_ns(now, waited)
        kv["input_wait_ms"] = wait / 1e6     # how long a missing input is waited for now
        if wait > sched.input_delay_ns and state == "running":
            # the adaptive wait is up: inputs arrive later than max_input_delay (and so do the outputs);
            # said, not warned: a loaded machine delays a few inputs by some ms now and then
            delay = sched.recent_delay_ns(now, waited)
            msgs.append(f"inputs arrive up to {delay / 1e6:.3g} ms after their stamps "
                        f"(max_input_delay {settings.max_input_delay * 1e3:g} ms): missing inputs are waited for "
                        f"{wait / 1e6:.3g} ms")
        kv["clock"] = now / NS
        behind = []
        for name, s in sched.streams.items():
            kv[f"input.{name}.received"] = s.total
            if s.arrival_lag_ns is not None:
                # how far the newest input (admitted or refused) was stamped behind the node clock on arrival
                kv[f"input.{name}.behind_s"] = s.arrival_lag_ns / NS
                recent = now - s.arrived_ns <= max(settings.sensor_timeout, 2 * settings.diagnostics_period) * NS
                if name in expected and recent and s.arrival_lag_ns > settings.sensor_timeout * NS:
                    behind.append((name, s.arrival_lag_ns))
            if s.last_stamp_ns is not None:
                kv[f"input.{name}.last_stamp"] = s.last_stamp_ns / NS
            age = (now - s.last_rx_ns) / NS if s.last_rx_ns is not None else float("inf")
            kv[f"input.{name}.age_s"] = age if math.isfinite(age) else "never"
            if name in expected and st == "running" and age > settings.sensor_timeout:
                level = max(level, DiagnosticStatus.WARN)
                msgs.append(f"no {name} for {age:.3g} s (sensor_timeout {settings.sensor_timeout} s)"
                            if math.isfinite(age) else f"no {name} received yet")
        if behind:
            # inputs keep coming but not on time (older than sensor_timeout on arrival): as good as missing,
            # and beyond max_input_age refused as stale.  Said once per report, logged at most every WARN_EVERY_S
            self.events["inputs_behind"] += 1
            level = max(level, DiagnosticStatus.WARN)
            worst = max(lag for _, lag in behind)
            text = (f"inputs arrive late: {', '.join(f'{n} {lag / NS:.3g} s' for n, lag in behind)} behind the node "
                    f"clock (sensor_timeout {settings.sensor_timeout:g} s"
                    + (f"; older than max_input_age {settings.max_input_age:g} s: dropped as stale"
                       if worst > settings.max_input_age * NS else "")
                    + f"): {clock_hint(worst, use_sim_time)}")
            msgs.insert(0, text)
            self.warn_kind("inputs_behind", text)
        if state == "waiting" and now > 0:
            if self.stopped:
                level = max(level, DiagnosticStatus.WARN)
                msgs.insert(0, self.stopped)
            elif sched.anchored and sched.awaits_first_readings(expected):
                msgs.append("waiting for the first readings (joint_observations): the estimate starts from them")
            else:
                msgs.append("waiting for the first input")
        if self.events["solver_failures"] and self.last_error:
            kv["last_error"] = self.last_error
        if ps["steps"] == 0 and state == "running":
            level = max(level, DiagnosticStatus.WARN)
            msgs.append("no output in the last period")
        if self.last_message:
            kv["last_message"] = self.last_message
        if self.events["solver_failures"] > self._failures_reported:
            level = DiagnosticStatus.ERROR
            msgs.insert(0, f"solver failed {self.events['solver_failures'] - self._failures_reported} time(s) "
                           f"since the last report (auto re-initialized): {self.last_error}")
            self._failures_reported = self.events["solver_failures"]
        return ps, kv, level, msgs

    @staticmethod
    def status(name: str, hardware_id: str, dt: float, ps: dict, kv: dict, level, msgs: list):
        """The diagnostic status (level, name, message, hardware id, key/values) of a snapshot, with the
        period's step statistics (outside the lock: the hot path need not wait for the arithmetic)."""
        if ps["solve"]:
            s = np.array(ps["solve"]) * 1e3
            kv["solve_ms_mean"], kv["solve_ms_max"] = float(s.mean()), float(s.max())
            # CPU time of the solves: well below the wall time = the thread was waiting for a core
            kv["solve_cpu_ms_mean"] = 1e3 * float(np.mean(ps["solve_cpu"]))
            lat = np.array(ps["latency"]) / 1e6
            kv["latency_ms_median"], kv["latency_ms_p99"] = float(np.median(lat)), float(np.percentile(lat, 99))
            kv["late_steps_percent"] = 100.0 * ps["late"] / ps["steps"]
            if s.mean() > dt * 1e3:
                level = max(level, DiagnosticStatus.WARN)
                msgs.append(f"mean solve {s.mean():.2f} ms over the {dt * 1e3:.2f} ms budget")
        if ps["input_delay"]:
            d = np.array(ps["input_delay"]) / 1e6
            kv["input_delay_ms_median"], kv["input_delay_ms_max"] = float(np.median(d)), float(d.max())
        return (level, name, "; ".join(msgs) or kv["state"], hardware_id, kv)
