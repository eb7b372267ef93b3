"""`estimator`: the rclpy node around an estimation core (node name `mbfg_estimator`).

A thin shell around the ROS-free core (`FixedLagEstimator` unless another `EstimatorCore` factory is
given): stamped inputs become calls `core.step(t, efforts, observations)` on a fixed time grid (the
`scheduler` says which step is due; outputs keep coming when inputs stop, as forward predictions), each
estimate is published by `outputs`, stamped t_k.  `parameters` and `diagnostics` hold the rest; see
docs/ros2_interfaces.md for the parameters, topics and services.

Everything bad (malformed or empty messages, unknown joints, NaN/Inf, implausible values
(`model.plausibility`), bad stamps, impossible branches, solver failures, clock jumps) is counted, logged once per kind (throttled) and shown on
/diagnostics; the node never dies of it.
"""

from __future__ import annotations

import time

# stamped before the imports below, which the start-up log then tells from the interpreter's own start
IMPORTS_STARTED = time.monotonic()

if __name__ == "__main__":   # `python -m mbfg_ros.ros.node`: a stop signal during the imports is a clean stop
    from mbfg_ros.ros import stop_signals
    stop_signals.install()

import math
import sys
import traceback
from dataclasses import replace
from typing import Dict, List, Optional

import numpy as np

import rclpy
from rcl_interfaces.msg import SetParametersResult
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.clock import Clock, ClockType, JumpThreshold
from rclpy.duration import Duration
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray
from std_srvs.srv import SetBool, Trigger

try:  # Humble+: lets users change QoS via qos_overrides.<topic>.* parameters
    from rclpy.qos_overriding_options import QoSOverridingOptions
except ImportError:  # pragma: no cover
    QoSOverridingOptions = None

from mbfg_ros.estimation.config import Estimate
from mbfg_ros.estimation.efforts import effort_kinds
from mbfg_ros.estimation.estimator import FixedLagEstimator
from mbfg_ros.model.plausibility import InputLimits
from mbfg_ros.ros import conversions as rc
from mbfg_ros.ros import fastloop
from mbfg_ros.ros import lifecycle
from mbfg_ros.ros import parameters as P
from mbfg_ros.ros.alignment import ReadingAlignment
from mbfg_ros.ros.core import CoreFactory
from mbfg_ros.ros.diagnostics import Diagnostics, branch_text, clock_hint
from mbfg_ros.ros.handoff_lock import HandOffLock
from mbfg_ros.ros.outputs import Outputs
from mbfg_ros.ros.scheduler import NS, InputScheduler, expected_streams
from mbfg_ros.shown import shown

NODE_NAME = "mbfg_estimator"

# Best effort (accepts reliable and best-effort publishers), 100 deep (0.1 s at 1 kHz: a momentarily busy
# node must not lose samples); overridable with the qos_overrides.<topic>.* parameters.
INPUT_QOS = QoSProfile(depth=100, reliability=ReliabilityPolicy.BEST_EFFORT, history=HistoryPolicy.KEEP_LAST,
                       durability=DurabilityPolicy.VOLATILE)
# Services: a request queue deep enough for a burst (rclpy's default, 10, silently dropped all but 35-49 of
# 200 requests sent at once by one client).  KEEP_LAST, not KEEP_ALL: with KEEP_ALL a client that stops
# taking its responses could block the fast loop's send_response (a reliable writer with a full history
# waits); with KEEP_LAST the oldest of more than 1000 waiting requests is dropped instead.  The client's
# own response queue (its QoS depth) bounds how many answers it can receive at once: see
# docs/ros2_interfaces.md.
SERVICE_QOS = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST,
                         durability=DurabilityPolicy.VOLATILE)
LATE_STEPS_KEPT = 256              # grid steps whose core step ids are kept for late readings (> any window)


class EstimatorNode(Node):
    """See the module docstring and docs/ros2_interfaces.md.  `core_factory(mech, config)` builds the
    estimation core (an `EstimatorCore`), at start-up and whenever the node must rebuild it."""

    def __init__(self, core_factory: CoreFactory = FixedLagEstimator,
                 startup_times: Optional[lifecycle.StartupTimes] = None, **kwargs):
        super().__init__(NODE_NAME, **kwargs)
        # start-up stages, logged at the first estimate (then None); the DDS participant exists from here on
        self.startup_times = (startup_times if startup_times is not None
                              else lifecycle.StartupTimes(time.monotonic()))
        self.startup_times.mark("node")
        self._lock = HandOffLock()     # (the fast loop hands it to a waiting parameter/service callback)
        self._loop: Optional[fastloop.FastLoop] = None
        self.now_ns = rc.clock_reader(self.get_clock())   # node clock (sim time when use_sim_time), ns
        startup = P.declare_parameters(self)
        self.mechanism_path, self.mech = startup.mechanism_path, startup.mech
        self.settings = startup.settings
        self.assembly_mode = startup.assembly_mode
        self.core_factory = core_factory
        self._setpoint_rx: Dict[str, Optional[int]] = {}
        self._set_config(startup.config)
        self.startup_times.mark("parameters")
        self.core = core_factory(self.mech, self.config)
        self.startup_times.mark("core")
        self.sched = InputScheduler(self.config.dt, self.config.window, len(self.mech.actuated))
        P.configure_scheduler(self.sched, self.settings)
        self.diag = Diagnostics(self.get_logger(), self.mech)
        self.sensor_map = rc.sensor_fields(self.mech)
        self.actuator_map = {nm: i for i, nm in enumerate(self.mech.actuator_names)}
        self.limits = InputLimits(self.mech)     # what a reading or a command can be at all
        self.alignment = ReadingAlignment(self.mech)   # readings stamped off their grid step moved onto it
        self.state = "waiting"        # waiting | running
        self.last_estimate: Optional[Estimate] = None
        self.last_k: Optional[int] = None
        self._estimate_steps: Dict[int, int] = {}   # grid step -> the core's step id of its estimate
        self._step_stamps: Dict[int, int] = {}      # the core's step id -> its grid time [ns] (~/smoothed/ stamps)
        self._jump_pending: Optional[str] = None
        self._last_now_ns = 0
        self._branch_applied = None   # a branch ~/set_assembly_mode has applied and now stores as the parameter
        self._setup_interfaces()
        self.add_on_set_parameters_callback(self._on_set_parameters)
        self.startup_times.mark("interfaces")
        self.get_logger().info(
            f"{self.mech.name}: mode={self.config.mode} formulation={self.config.formulation} "
            f"integrator={self.config.integrator} dt={self.config.dt} window={self.config.window}; "
            f"sensors {[s.name for s in self.mech.sensors]}, actuators {list(self.mech.actuator_names)}")
        self._note_confounded()

    def _note_confounded(self):
        """Warn where the core identifies friction of an actuator whose effort it estimates (the effort takes it in)."""
        ident = getattr(self.core, "identification", None)
        note = ident.confounded_note() if ident is not None else ""
        if note:
            self.get_logger().warning(f"identify: {note}")

    def _set_config(self, config):
        self.config = config
        # which actuators take set-points, and which inputs a step waits for, follow the core's configuration
        # (actuator_efforts, mode); forward dynamics reads no readings, so no set-points there
        kinds = effort_kinds(config.mode, self.mech, config.actuator_efforts)
        self._expected = expected_streams(config.mode, kinds)
        self.prescribed = rc.prescribed_readings(
            self.mech, kinds if config.mode != "forward_dynamics" else ("commanded",) * len(kinds))
        # a joint that stays prescribed keeps its set-points' age over a rebuild; a newly prescribed one has none
        self._setpoint_rx = {n: self._setpoint_rx.get(n) for n in self.prescribed}

    # ---------------------------------------------------------------------------- interfaces
    def _setup_interfaces(self):
        qo = {"qos_overriding_options": QoSOverridingOptions.with_default_policies()} if QoSOverridingOptions else {}
        self.outputs = Outputs(self, self.mech, self.settings, qo)
        self._publish = self.outputs.publish
        # Hot path (inputs + step timer): a FastLoop thread, or a plain executor group as fallback.
        self._fast = bool(self.settings.fast_loop) and fastloop.available()
        if self.settings.fast_loop and not self._fast:
            self.get_logger().warning("fast_loop unavailable in this rclpy: using the stock executor")
        if self.settings.thread_priority and not self._fast:   # (the executor's thread serves parameters too)
            self.get_logger().warning(f"thread_priority {self.settings.thread_priority} ignored: it applies to the "
                                      "fast loop only, and the stock executor serves the hot path")
        hot = fastloop.DetachedCallbackGroup() if self._fast else MutuallyExclusiveCallbackGroup()
        subs = [(self.create_subscription(JointState, "joint_observations", self.on_observations, INPUT_QOS,
                                          callback_group=hot, raw=True, **qo), self.on_observations),
                (self.create_subscription(JointState, "commanded_effort", self.on_effort_joint_state, INPUT_QOS,
                                          callback_group=hot, raw=True, **qo), self.on_effort_joint_state),
                (self.create_subscription(Float64MultiArray, "commanded_effort_array", self.on_effort_array,
                                          INPUT_QOS, callback_group=hot, raw=True, **qo), self.on_effort_array),
                (self.create_subscription(JointState, "prescribed_motion", self.on_prescribed_motion, INPUT_QOS,
                                          callback_group=hot, raw=True, **qo), self.on_prescribed_motion)]
        self.step_timer = self.create_timer(self.config.dt, self.on_step_timer, callback_group=hot)
        # Services: in the fast loop too (answered between two steps), else on the executor under the lock.
        # Parameters and diagnostics: the executor in the main thread.
        ctl = MutuallyExclusiveCallbackGroup()
        srv_group = hot if self._fast else ctl
        services = [(Trigger, "~/reinitialize", self._srv_reinitialize), (Trigger, "~/reset", self._srv_reset),
                    (SetBool, "~/set_assembly_mode", self._srv_set_assembly_mode),
                    (SetBool, "~/freeze_parameters", self._srv_freeze_parameters),
                    (Trigger, "~/reset_parameters", self._srv_reset_parameters)]
        services = [(self.create_service(t, name, self._locked(handler), qos_profile=SERVICE_QOS,
                                         callback_group=srv_group), handler)
                    for t, name, handler in services]
        self.diag_timer = self.create_timer(self.settings.diagnostics_period, self._on_diagnostics_timer,
                                            callback_group=ctl, clock=Clock(clock_type=ClockType.STEADY_TIME))
        # ~/parameters: on the executor, never in the fast loop (each asks the core for a marginal of the window)
        self.parameters_timer = self.create_timer(self.settings.parameters_period, self._publish_parameters,
                                                  callback_group=ctl, clock=Clock(clock_type=ClockType.STEADY_TIME))
        if self._fast:
            self._loop = fastloop.FastLoop(self, subs, [(self.step_timer, self.on_step_timer)],
                                           after_batch=self.after_batch, lock=self._lock,
                                           on_error=self._on_loop_error, poll_window=self.sched.poll_window_ns,
                                           services=services, thread_priority=self.settings.thread_priority,
                                           on_priority_refused=self._on_priority_refused)
        self._jump_handle = self.get_clock().create_jump_callback(
            JumpThreshold(min_forward=None, min_backward=Duration(nanoseconds=-1), on_clock_change=True),
            post_callback=self._on_time_jump)

    def _locked(self, fn):
        def wrapper(*args):
            with self._lock:
                return fn(*args)
        return wrapper

    def start(self):
        if self._loop is not None:
            self._loop.start()
        if self.startup_times is not None:
            self.startup_times.mark("started")

    def stop(self):
        if self._loop is not None:
            self._loop.stop()

    def _on_priority_refused(self, reason: str):
        self.get_logger().warning(
            f"thread_priority {self.settings.thread_priority}: {reason}; the fast loop runs under normal "
            "scheduling (allow real-time priorities with CAP_SYS_NICE or an rtprio limit, e.g. "
            "'@realtime - rtprio 99' in /etc/security/limits.conf; see docs/ros2_interfaces.md)")

    def _on_loop_error(self, e: BaseException):
        events = self.diag.events
        events["handler_errors"] = events.get("handler_errors", 0) + 1
        self.diag.warn_kind("handler_errors", f"unexpected error in an input handler: {type(e).__name__}: {shown(e)}")
        self.get_logger().debug(traceback.format_exc())

    # -------------------------------------------------------------------------------- inputs
    def _decoded(self, raw: bytes, topic: str, decode=rc.decode_joint_state):
        """Inputs are taken serialized (see `conversions.decode_joint_state`); None if refused (counted)."""
        try:
            return decode(raw)
        except rc.LongString as e:
            self.diag.reject("long_string", f"{topic}: {e}")
        except ValueError as e:
            self.diag.reject("bad_message", f"{topic}: {e}")
        return None

    def on_observations(self, raw: bytes):
        """A serialized JointState on joint_observations."""
        now = self.now_ns()
        self._check_time(now)          # a clock jump resets before inputs of the new time are judged
        msg = self._decoded(raw, "joint_observations")
        # encoder readings are judged against the drawn pose and the newest estimate: an implausible one
        # is dropped here, so it can never start, move or re-initialize the estimate
        last = self.last_estimate
        values, problems = (rc.parse_observations(msg, self.sensor_map, self.limits,
                                                  last.q if last is not None else None)
                            if msg is not None else ({}, ()))
        if problems:
            self.diag.reject_all(problems)
        if values:
            self._add_readings(now, msg.stamp_ns, values, "joint_observations")
        if not self._fast:
            self._pump(now, max_steps=1000)

    def _add_readings(self, now: int, stamp: int, values, topic: str):
        self.diag.period_stats["input_delay"].append(now - stamp)
        bad = self.sched.add_observations(stamp, values, now)
        if bad == "late":
            bad = self._fuse_late(stamp, values)
        if bad:
            self.diag.reject(bad, self._stamp_problem(bad, topic, stamp, now))

    def on_prescribed_motion(self, raw: bytes):
        """A serialized JointState on prescribed_motion: the set-points of the prescribed actuators, which the
        core takes as readings of their coordinates (with the encoder readings, through the same steps)."""
        now = self.now_ns()
        self._check_time(now)
        msg = self._decoded(raw, "prescribed_motion")
        last = self.last_estimate
        values, problems = (rc.parse_prescribed_motion(msg, self.prescribed, self.actuator_map, self.limits,
                                                       last.q if last is not None else None)
                            if msg is not None else ({}, ()))
        if problems:
            self.diag.reject_all(problems)
        if values:
            for name, (_, reading) in self.prescribed.items():
                if reading in values:
                    self._setpoint_rx[name] = now
            self._add_readings(now, msg.stamp_ns, values, "prescribed_motion")
        if not self._fast:
            self._pump(now, max_steps=1000)

    def _stamp_problem(self, kind: str, topic: str, stamp_ns: int, now_ns: int):
        """The log detail of an input refused for its stamp (made only if logged): the topic, how far the
        stamp is behind or ahead of the node clock, and for a clock problem, which clock and why."""
        def detail() -> str:
            text = f"{topic}: {self.sched.stamp_detail(stamp_ns, now_ns)}"
            if kind in ("stale", "future"):
                text += f"; {clock_hint(now_ns - stamp_ns, self._on_sim_time())}"
            return text
        return detail

    def _on_sim_time(self) -> bool:
        return bool(self.get_parameter("use_sim_time").value)

    def _fuse_late(self, stamp_ns: int, values) -> Optional[str]:
        """Readings of a step already estimated but still in the window become factors on that step
        (the smoother revises the window, the newest estimate included); None if all were fused."""
        k = self.sched.step_of(stamp_ns)
        step = self._estimate_steps.get(k, -1)
        values = self._at_step(k, values, dict.fromkeys(values, stamp_ns))
        try:
            fused, refused = self.core.add_late_observations(step, values)
        except Exception as e:  # never let a late reading break the node
            self.get_logger().debug(f"late reading not fused: {e!r}")
            fused, refused = [], list(values)
        self.diag.events["late_readings_fused"] += len(fused)
        return "late" if refused else None

    def on_effort_joint_state(self, raw: bytes):
        """A serialized JointState on commanded_effort."""
        now = self.now_ns()
        self._check_time(now)
        msg = self._decoded(raw, "commanded_effort")
        tau, problems = (rc.parse_effort_joint_state(msg, self.actuator_map, self.limits)
                         if msg is not None else (None, ()))
        self._add_efforts(now, msg.stamp_ns if tau is not None else now, tau, problems)

    def on_effort_array(self, raw: bytes):
        """A serialized Float64MultiArray on commanded_effort_array: efforts, unstamped, stamped on receipt."""
        now = self.now_ns()
        self._check_time(now)
        data = self._decoded(raw, "commanded_effort_array", rc.decode_float64_multi_array)
        tau, problems = rc.parse_effort_array(data, self.limits) if data is not None else (None, ())
        self._add_efforts(now, now, tau, problems, "commanded_effort_array")

    def _add_efforts(self, now: int, stamp: int, tau, problems, topic: str = "commanded_effort"):
        if problems:
            self.diag.reject_all(problems)
        if tau is not None:
            bad = self.sched.add_efforts(stamp, tau, now)
            if bad:
                self.diag.reject(bad, self._stamp_problem(bad, topic, stamp, now))
        if not self._fast:
            self._pump(now, max_steps=1000)

    def _correct_commands(self, corrections):
        """Commands of steps already estimated but still in the window replace the ones those steps (and the
        later ones each covers) were estimated with, in their factors: the smoother revises the window, so the
        next outputs use them (as with late readings)."""
        steps = self._estimate_steps
        by_id = [(steps[k], efforts, self._command_times(k, latest=False)) for k, efforts in corrections if k in steps]
        if not by_id:
            return
        try:
            done = self.core.correct_commands(by_id)
        except Exception as e:  # never let a late command break the node
            self.get_logger().debug(f"late command not applied: {e!r}")
            return
        if done:
            self.diag.events["late_command_corrections"] += len(done)

    def after_batch(self) -> bool:
        """After the inputs that arrived together: estimate the steps they complete (True: more are ready)."""
        return self._pump(self.now_ns())

    # ---------------------------------------------------------------------------- time jumps
    def _on_time_jump(self, jump):   # any thread: only sets a flag the hot path acts on
        if getattr(jump, "clock_change", None) not in (None, 0) or jump.delta.nanoseconds < 0:
            self._jump_pending = (f"clock jumped by {jump.delta.nanoseconds / NS:+.3f} s" if jump.delta.nanoseconds
                                  else "clock source changed")

    def _check_time(self, now_ns: int):
        if now_ns < self._last_now_ns and self._jump_pending is None:
            self._jump_pending = f"clock went back by {(self._last_now_ns - now_ns) / NS:.3f} s"
        self._last_now_ns = now_ns
        if self._jump_pending is not None:
            reason, self._jump_pending = self._jump_pending, None
            self.diag.events["time_jumps"] += 1
            if self.settings.reset_on_time_jump:
                self.reset_estimation(f"time jump ({reason})")
            else:
                self.diag.warn_kind("time_jumps", f"{reason}; reset_on_time_jump is false: keeping state")

    # ---------------------------------------------------------------------------- stepping
    def on_step_timer(self) -> bool:
        """The step timer (period dt): estimates the steps whose input wait is over (True: more are ready)."""
        if not self.sched.anchored:
            # nothing received since the start or the last reset: no step can be due.  The timer sleeps
            # until an input comes (an idle node would wake up at every dt for nothing)
            self.step_timer.cancel()
            return False
        if self._fast:
            return self._pump(self.now_ns())
        with self._lock:
            return self._pump(self.now_ns(), max_steps=1000)

    def _pump(self, now_ns: int, max_steps: int = 4) -> bool:
        """Estimate the ready steps (at most `max_steps`, so that services are not kept waiting);
        True if more are ready (the fast loop then comes back at once)."""
        self._check_time(now_ns)
        sched = self.sched
        if sched.command_corrections or sched.deferred_corrections:
            # late commands received since the last pump (a burst: one smoother update), before the next step
            self._correct_commands(sched.take_command_corrections())
        if sched.anchored and self.step_timer.is_canceled():
            self.step_timer.reset()         # inputs again: steps (and predictions without inputs) are due
        if sched.overloaded(now_ns):
            self._skip_ahead(now_ns)
        expected = self._expected
        if not sched.started:
            if self.startup_times is not None:
                self.startup_times.mark("first input")
            k0 = sched.start_step(now_ns, expected)
            if k0 is not None and k0 > sched.k_next:
                sched.skip_to(k0)
        n = 0
        while sched.ready(now_ns, expected):
            if n == max_steps:
                return True
            if sched.beyond_prediction(sched.k_next, expected):
                self._stop_without_readings()
                return False
            k, efforts, obs = sched.pop()
            self._step(k, efforts, obs)
            n += 1
        if n:
            if self._fast:
                # the step timer only has to catch steps whose inputs are missing: while inputs keep the
                # steps going it is pushed back, which saves a wake-up of the loop per step
                self.step_timer.reset()
            # caught up: the input-free part of the next step is done now, while its inputs are on their way
            self.core.prepare_next_step()
        return False

    def _skip_ahead(self, now_ns: int):
        """Estimation fell more than max_backlog behind the clock (solves slower than dt): jump to the newest
        data instead of queueing; the core re-seeds from its last estimate at the new time."""
        skipped, behind = self.sched.skip_ahead(now_ns, self._expected)
        if skipped:
            events = self.diag.events
            events["overruns"] += 1
            events["skipped_steps"] += skipped
            self.diag.warn_kind("overruns", f"estimation fell {behind / NS:.3f} s behind the node clock "
                                            f"(max_backlog {self.settings.max_backlog} s; mean solve "
                                            f"{1e3 * np.mean(self.diag.period_stats['solve'] or [0]):.2f} ms "
                                            f"for a {self.config.dt * 1e3:g} ms step): skipped {skipped} steps")

    def _at_step(self, k: int, values, stamps_ns) -> dict:
        """`values` stamped `stamps_ns` (name → stamp) moved onto grid step k by the newest estimate's motion."""
        last = self.last_estimate
        if last is None or self.last_k is None:
            return values
        return self.alignment.to_step(values, stamps_ns, self.sched.t_of(k), last.v, last.a,
                                      self.sched.t_of(self.last_k))

    def _command_times(self, k: int, latest: bool = True) -> Optional[List[float]]:
        """When the commands held at step k were given, on the core's clock (its step k is at k·dt): their stamps,
        which the grid rounds to the nearest step (NaN: none yet; a late command replaces them with its own).  An
        actuator's delay interpolates the commands by them (`ActuatorDelay.applied`).  `latest`: k is the step
        just popped; else any step of the window's (None where it is gone)."""
        used = self.sched.used_commands
        entry = (used[-1] if used and used[-1][0] == k else None) if latest else \
            next((u for u in reversed(used) if u[0] == k), None)
        if entry is None:
            return None
        t0, dt, grid = self.sched.t0_ns, self.config.dt, self.sched.dt_ns
        return [k * dt + (st - t0 - k * grid) / NS if st >= 0 else math.nan for st in entry[2]]

    def _step(self, k: int, efforts, observations):
        t_k = self.sched.t_of(k)
        diag = self.diag
        if observations:
            seen = self.sched.obs_seen.get(k)
            if seen:
                observations = self._at_step(k, observations, {n: st for n, (st, _) in seen.items()})
        t_start = time.perf_counter()
        c_start = time.thread_time()
        try:
            est = self.core.step(k * self.config.dt, efforts=efforts, observations=observations,
                                 command_times=self._command_times(k) if efforts is not None else None)
        except Exception as e:  # numerical failure inside the core: never let it kill the node
            self._recover(e, t_k)
            return
        solve = time.perf_counter() - t_start
        solve_cpu = time.thread_time() - c_start
        events = diag.events
        if est.status == "recovered":
            events["solver_recoveries"] += 1
            if est.recovery == "turn":
                events["turn_recoveries"] += 1
                diag.warn_kind("turn_recoveries", f"an encoder read whole turns from the prediction at "
                                                  f"t={t_k / NS:.6f}; re-initialized on the reading's turn: "
                                                  f"{est.message}")
            elif est.recovery == "lost_track":
                events["lost_track"] += 1
                diag.warn_kind("lost_track", f"the estimate stopped following its readings at t={t_k / NS:.6f}; "
                                             f"re-initialized from the readings: {est.message}")
            else:
                diag.warn_kind("solver_recoveries", f"the core re-initialized (numerical failure, or readings "
                                                    f"that contradict the prediction) at t={t_k / NS:.6f}: "
                                                    f"{est.message}")
        if est.status == "waiting":
            return
        if observations is None and not self.sched.own_command:
            events["predicted_steps"] += 1      # no input of its own (a held command may be applied)
        self.state = "running"
        diag.stopped = ""
        self.last_estimate = est
        self.last_k = k
        steps = self._estimate_steps
        steps[k] = est.step
        if len(steps) > LATE_STEPS_KEPT:
            del steps[next(iter(steps))]
        diag.last_message = est.message
        self._publish(est, t_k)
        if self.outputs.pub_smoothed is not None:
            stamps = self._step_stamps
            stamps[est.step] = t_k
            if len(stamps) > LATE_STEPS_KEPT:
                del stamps[next(iter(stamps))]
            self._publish_smoothed()
        if self.startup_times is not None:
            self.startup_times.mark("first estimate")
            self.get_logger().info(self.startup_times.summary())
            self.startup_times = None
        lat = self.now_ns() - t_k
        ps = diag.period_stats
        ps["steps"] += 1
        ps["solve"].append(solve)
        ps["solve_cpu"].append(solve_cpu)
        ps["latency"].append(lat)
        events["steps"] += 1
        if lat > self.sched.dt_ns:
            ps["late"] += 1
            events["late_steps"] += 1

    def _publish_smoothed(self):
        """The core's newly smoothed estimates (`smoothed_lag`) on ~/smoothed/, each stamped with its own step's
        time."""
        stamps = self._step_stamps
        for est in self.core.smoothed_estimates():
            t_k = stamps.get(est.step)
            if t_k is not None:
                self.outputs.publish_smoothed(est, t_k)

    def _stop_without_readings(self):
        """The next step would be more than max_prediction past the newest readings: stop estimating there (no
        open-loop prediction is published for longer) and start again from the next readings, on their turns."""
        sched = self.sched
        t_k = sched.t_of(sched.k_next)
        silent = (sched.k_next - sched.reading_k) * sched.dt_ns / NS
        self.diag.events["prediction_stops"] += 1
        reason = (f"no readings for {silent:.3g} s (max_prediction {self.settings.max_prediction:g} s): estimation "
                  f"stopped at t={t_k / NS:.6f} and starts again from the next readings")
        self.diag.warn_kind("prediction_stops", reason)
        self._restart(reason, reset_stamp_ns=t_k)
        self.diag.stopped = reason

    def _recover(self, e: Exception, t_k: int):
        """The core's step raised: re-initialize it, else reset."""
        diag = self.diag
        diag.events["solver_failures"] += 1
        diag.last_error = f"{type(e).__name__}: {shown(e)}"
        diag.warn_kind("solver_failures", f"step at t={t_k / NS:.6f} failed ({diag.last_error}); re-initializing")
        self.get_logger().debug(traceback.format_exc())
        try:
            self.core.reinitialize(assembly_mode=self.assembly_mode)
            diag.events["reinitializations"] += 1
        except Exception as e2:
            self.reset_estimation(f"re-initialization after a solver failure failed too ({type(e2).__name__}: {e2})",
                                  reset_stamp_ns=t_k + 1)

    # ----------------------------------------------------------------------------- resets
    def reset_estimation(self, reason: str, reset_stamp_ns: int = 0):
        """Clear all state and wait for the first input stamped at or after reset_stamp_ns."""
        self.diag.events["resets"] += 1
        self._restart(f"reset: {reason}", reset_stamp_ns)
        self.get_logger().info(f"reset: {reason}")

    def _restart(self, message: str, reset_stamp_ns: int):
        """Clear the core's and the scheduler's state: the next inputs stamped at or after reset_stamp_ns
        start estimation again."""
        self.diag.stopped = ""
        try:
            self.core.reset()
        except Exception as e:   # a broken core: rebuild it
            self.get_logger().error(f"estimator.reset() failed ({e}); rebuilding the estimator")
            self.core = self.core_factory(self.mech, self.config)
        if self.outputs.pub_smoothed is not None:
            self._publish_smoothed()          # (the steps the reset left unsmoothed: at their window's last values)
        self._step_stamps.clear()
        self.sched.clear(reset_stamp_ns=reset_stamp_ns)
        self.state = "waiting"
        self.last_estimate = None
        self.last_k = None
        self._estimate_steps.clear()
        self.outputs.forget_markers()
        self.diag.last_message = message

    def _reinitialize(self, assembly_mode) -> str:
        """Re-solve the position problem from the latest estimate on `assembly_mode`; what was done.  The
        window is re-seeded by the fast loop right after the reply goes out (else by the next step)."""
        t0 = time.perf_counter()
        mode, residual = self.core.reinitialize(assembly_mode=assembly_mode)
        self.diag.events["reinitializations"] += 1
        if self._loop is not None:
            self._loop.call_soon(self.core.apply_reinitialization)
        return (f"re-initialized on branch {branch_text(self.mech, mode)}; |Phi| = {residual:.3g}; the window is "
                f"re-seeded before the next estimate (in {(time.perf_counter() - t0) * 1e3:.2f} ms)")

    def _change_branch(self, am):
        """Use branch `am` (None: automatic) from now on, re-initializing on it if running: (done, message)."""
        if am is not None:
            try:
                if self.state == "running":
                    message = self._reinitialize(am)
                else:
                    # the core keeps the branch it was last asked for over a reset: without an estimate its
                    # `reinitialize` solves the start on `am`, which its next initialization then uses
                    self.core.reinitialize(assembly_mode=am)
                    message = f"branch {branch_text(self.mech, am)} will be used at the next initialization"
            except Exception as e:
                reason = (f"parameter 'assembly_mode' {list(am)}: impossible here ({type(e).__name__}: {e}); "
                          f"keeping {branch_text(self.mech, self.assembly_mode or ())}")
                self.diag.warn_kind("bad_assembly_mode", reason)
                return False, reason
        else:
            message = f"branch {branch_text(self.mech, am or ())} will be used at the next initialization"
        self.get_logger().info(message)
        self.assembly_mode = am
        self._set_config(replace(self.config, assembly_mode=am))
        return True, message

    # ---------------------------------------------------------------------------- services
    def _srv_reinitialize(self, request, response):
        if self.state != "running":
            response.success = False
            response.message = "no estimate yet (waiting for the first input): nothing to re-initialize"
            return response
        try:
            response.message = self._reinitialize(self.assembly_mode)
        except Exception as e:
            response.success = False
            response.message = f"re-initialization failed: {type(e).__name__}: {e}"
            self.get_logger().warning(response.message)
            return response
        response.success = True
        self.get_logger().info(response.message)
        return response

    def _srv_reset(self, request, response):
        self.reset_estimation("~/reset service", reset_stamp_ns=max(self.now_ns(), 0))
        response.success = True
        response.message = "reset: all state cleared, waiting for the first input stamped after now"
        return response

    def _srv_set_assembly_mode(self, request, response):
        problem = P.no_single_indicator(self.mech)
        if problem:
            response.success, response.message = False, problem
            return response
        am = (1 if request.data else -1,)
        response.success, message = self._change_branch(am)
        response.message = message if response.success else f"rejected: {message}"
        if response.success:   # the parameter shows the branch (its callback sees it is applied already)
            self._branch_applied = am
            try:
                self.set_parameters([Parameter("assembly_mode", Parameter.Type.INTEGER_ARRAY, list(am))])
            finally:
                self._branch_applied = None
        return response

    def _no_identification(self) -> str:
        """Why a parameter service cannot act, and how to turn identification on."""
        if not self.mech.actuator_names:
            return f"nothing is identified: {self.mech.name} has no actuators, so no actuator parameter to identify"
        example = f"{self.mech.actuator_names[0]}.viscous_friction"
        return (f"nothing is identified: set the 'identify' parameter (e.g. ['{example}']; estimation or fused "
                f"mode) or give the mechanism file an identify: section")

    def _parameters_call(self, response, call, failed: str, done_message):
        """Answer a parameters service: `call()` on the core (False: nothing identified), else `done_message()`."""
        try:
            done = call()
        except Exception as e:
            response.success = False
            response.message = f"{failed} failed: {type(e).__name__}: {shown(e)}"
            self.get_logger().warning(response.message)
            return response
        response.success = bool(done)
        if not done:
            response.message = self._no_identification()
            return response
        response.message = done_message()
        self.get_logger().info(response.message)
        return response

    def _srv_freeze_parameters(self, request, response):
        frozen = bool(request.data)
        names = lambda: ", ".join(self.core.parameter_names)  # noqa: E731
        return self._parameters_call(
            response, lambda: self.core.freeze_parameters(frozen), "freezing" if frozen else "thawing",
            lambda: (f"frozen at their newest values: {names()}" if frozen
                     else f"learning again from their newest values: {names()}"))

    def _srv_reset_parameters(self, request, response):
        return self._parameters_call(
            response, self.core.reset_parameters, "resetting the parameters",
            lambda: (f"back to their priors, learning: {', '.join(self.core.parameter_names)} (the window is "
                     "re-seeded at the next step)"))

    def _publish_parameters(self):
        """~/parameters from the current core (a rebuild replaces it), stamped with the newest estimate's time;
        nothing without identification, before the first estimate or while nobody subscribes (the marginal would
        be computed for nobody)."""
        with self._lock:
            if not self.core.parameter_names or self.last_k is None or not self.outputs.parameters_listened():
                return
            t_k = self.sched.t_of(self.last_k)
            try:
                parameters = self.core.parameters()
            except Exception as e:       # a failing marginal must not stop the executor (diagnostics, parameters)
                self.diag.warn_kind("parameters_failed", f"~/parameters not published: {type(e).__name__}: {shown(e)}")
                return
        if parameters is not None:
            self.outputs.publish_parameters(parameters, t_k)

    # ------------------------------------------------------------------------- dynamic params
    def _on_set_parameters(self, params) -> SetParametersResult:
        with self._lock:
            new = {p.name: p.value for p in params}
            change = P.validate_change(new, self.mech, self.config)
            if isinstance(change, str):
                return SetParametersResult(successful=False, reason=change)
            if new.get("use_sim_time") is True and not self.get_clock().ros_time_is_active \
                    and self.count_publishers("/clock") == 0:
                # (this callback runs before rclpy's TimeSource, which would switch the clock at once)
                return SetParametersResult(successful=False, reason=(
                    "parameter 'use_sim_time': nothing publishes /clock, so the node clock would stand still "
                    "and every input be rejected (no_clock); start the clock source first (ros2 bag play "
                    "--clock, four_bar_sim with publish_clock)"))
            if "assembly_mode" in new:
                am = tuple(int(x) for x in (new["assembly_mode"] or ())) or None
                if am != self._branch_applied:
                    done, reason = self._change_branch(am)
                    if not done:
                        return SetParametersResult(successful=False, reason=reason)
            P.update_settings(self.settings, new)
            P.configure_scheduler(self.sched, self.settings)
            self.outputs.configure(self.settings)
            self._set_config(replace(change.config, assembly_mode=self.assembly_mode))
            if change.rebuild:
                self.core = self.core_factory(self.mech, self.config)
                self.reset_estimation(f"parameters {list(change.rebuild)} changed: estimator rebuilt")
                self._note_confounded()
            return SetParametersResult(successful=True)

    # --------------------------------------------------------------------------- diagnostics
    def _on_diagnostics_timer(self):
        # published by the fast loop between two steps: built here, it would share the GIL with the hot
        # path for a few ms at every period (a burst of late steps)
        if self._loop is not None:
            self._loop.call_soon(self._publish_diagnostics)
        else:
            self._publish_diagnostics()

    def _publish_diagnostics(self):
        now, status = self.diagnostic_status()
        self.outputs.publish_diagnostics(max(now, 0), [status])

    def _parameters_for_diagnostics(self):
        try:
            return self.core.parameters()
        except Exception as e:       # the rest of the report still goes out
            self.diag.warn_kind("parameters_failed", f"identified parameters not reported: {type(e).__name__}: "
                                                     f"{shown(e)}")
            return None

    def diagnostic_status(self):
        """(node time, (level, name, message, hardware id, key/values)) of a report; starts a new period."""
        with self._lock:
            now = self.now_ns()
            t_k = self.sched.t_of(self.last_k) if self.last_k is not None else None
            snapshot = self.diag.snapshot(now, self.state, self.config, self.last_estimate, t_k,
                                          self.assembly_mode, self.sched, self.settings,
                                          self.core.fitted_densities(), self._on_sim_time(),
                                          self.core.fitted_sensor_sigmas(), self.core.numerics(),
                                          self._parameters_for_diagnostics(), self._setpoint_rx,
                                          self.core.density_fit_limits())
        return now, Diagnostics.status(f"{self.get_fully_qualified_name()}: estimator", self.mech.name,
                                       self.config.dt, *snapshot)


# ---------------------------------------------------------------------------------------------
def main(args=None, core_factory: CoreFactory = FixedLagEstimator) -> int:
    startup_times = lifecycle.StartupTimes(IMPORTS_STARTED)
    startup_times.mark("interpreter", IMPORTS_STARTED)
    startup_times.mark("imports")
    sys.setswitchinterval(5e-4)   # quick GIL hand-over between the fast loop and the executor thread

    def build(stop):
        startup_times.mark("rclpy.init")
        return EstimatorNode(core_factory=core_factory, startup_times=startup_times)

    return lifecycle.run_node(args, build,
                              (P.ConfigError, rclpy.exceptions.InvalidParameterValueException,
                               rclpy.exceptions.InvalidParameterTypeException), NODE_NAME)


if __name__ == "__main__":
    sys.exit(main())
