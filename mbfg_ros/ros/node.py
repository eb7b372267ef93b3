"""`estimator`: the rclpy node around `mbfg_ros.estimation.estimator.FixedLagEstimator` (node name `mbfg_estimator`).

A thin shell: all estimation happens in the ROS-free core.  This module turns stamped ROS inputs
into calls `FixedLagEstimator.step(t, efforts, observations)` on a fixed time grid and publishes
each estimate; see docs/ros2_interfaces.md for the parameters, topics and services.

Time grid.  The first accepted input after a (re)start anchors the grid t_k = t_0 + k·dt; every
input is assigned to the nearest grid step.  Step k is estimated as soon as every input stream that
is currently delivering at the timestep rate has delivered data for step k (so latency is one solve,
not up to one timer period), or, at the latest, when the node clock reaches t_k + the input wait
(a timer at dt on the node clock: outputs keep coming when inputs stop, as forward predictions).  The
wait is max_input_delay, longer while the inputs are seen arriving later (`adaptive_input_delay`):
inputs that are only delayed are waited for rather than predicted over and then dropped as too old.
Outputs are stamped t_k.  Inputs for steps already estimated are counted and dropped; inputs stamped
before the last reset, in the future, or far from the node clock are rejected.

Everything bad (malformed messages, unknown joints, NaN/Inf, bad stamps, impossible branches,
solver failures, clock jumps) is counted, logged once per kind (throttled) and shown on
/diagnostics; the node never dies of it.
"""

from __future__ import annotations

import math
import sys
import threading
import time
import traceback
from dataclasses import replace
from typing import Dict, List, Optional, Tuple

import numpy as np

import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from rcl_interfaces.msg import (FloatingPointRange, IntegerRange, ParameterDescriptor, SetParametersResult)
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.clock import Clock, ClockType, JumpThreshold
from rclpy.duration import Duration
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import (HistoryPolicy, QoSProfile, ReliabilityPolicy, DurabilityPolicy)
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray
from std_srvs.srv import SetBool, Trigger
from trajectory_msgs.msg import JointTrajectory
from visualization_msgs.msg import MarkerArray

try:  # Humble+: lets users change QoS via qos_overrides.<topic>.* parameters
    from rclpy.qos_overriding_options import QoSOverridingOptions
except ImportError:  # pragma: no cover
    QoSOverridingOptions = None

from mbfg_ros.ros import fastloop
from mbfg_ros.ros import conversions as rc
from mbfg_ros.estimation.estimator import FixedLagEstimator
from mbfg_ros.estimation.config import FORMULATIONS, INTEGRATORS, MODES, Estimate, EstimatorConfig
from mbfg_ros.factors.noise import default_sigmas
from mbfg_ros.model.mechanism import load_mechanism, resolve_mechanism_path

NODE_NAME = "mbfg_estimator"
NS = rc.NS

# Inputs: best effort (accepts reliable and best-effort publishers), 100 deep (0.1 s at 1 kHz: a
# momentarily busy node must not lose samples).  Outputs: reliable, 10 deep.  Both overridable with the
# qos_overrides.<topic>.* parameters.
INPUT_QOS = QoSProfile(depth=100, reliability=ReliabilityPolicy.BEST_EFFORT, history=HistoryPolicy.KEEP_LAST,
                       durability=DurabilityPolicy.VOLATILE)
OUTPUT_QOS = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST,
                        durability=DurabilityPolicy.VOLATILE)

POLL_NS = 300_000      # longest poll for the second half of a step's inputs (see FastLoop.poll_window)
LISTENER_CHECK_NS = 50_000_000   # how often the outputs' subscriber counts are refreshed (node clock)

# Dynamic parameters held as `p_<name>` and applied as they are set (float ones are durations in seconds,
# checked >= 0); the others (mode, sigmas, assembly_mode) have their own handling.
DYNAMIC_SETTINGS = {"sensor_timeout": float, "max_input_delay": float, "startup_wait": float, "max_input_age": float,
                    "future_tolerance": float, "marker_period": float, "max_backlog": float,
                    "publish_markers": bool, "frame_id": str, "reset_on_time_jump": bool,
                    "adaptive_input_delay": bool}
LATE_STEPS_KEPT = 256              # grid steps whose core step ids are kept for late readings (> any window)
DELAY_MEMORY_NS = NS           # time constant of the inputs' recent largest delay (adaptive input wait)
DELAY_FACTOR = 1.5             # the adaptive wait: this × the recent largest delay

def _new_period_stats() -> dict:
    """What the hot path accumulates between two diagnostics reports."""
    return {"steps": 0, "solve": [], "solve_cpu": [], "latency": [], "late": 0, "input_delay": []}


# Kinds of rejected input and what they mean (keys of the `rejected.*` diagnostics).
REJECT_KINDS = {
    "bad_message": "serialized message that does not decode as a JointState",
    "bad_size": "array sizes inconsistent (names vs values, or wrong number of efforts)",
    "unknown_joint": "joint name matches no sensor / actuator of the mechanism",
    "non_finite": "NaN or Inf value",
    "bad_stamp": "zero or negative header stamp",
    "no_clock": "node clock not valid yet (use_sim_time without /clock)",
    "future": "stamp later than node clock + future_tolerance",
    "stale": "stamp older than node clock - max_input_age (clock mismatch? play bags with --clock)",
    "before_reset": "stamp before the last reset",
    "late": "input of a step already estimated that could not be used: a reading outside the innovation "
            "gate (or whose step left the window meanwhile), or a command older than the one applied",
    "too_old": "stamp older than the estimator window",
}


class ConfigError(ValueError):
    """A bad parameter value at start-up; the message names the parameter."""


# ---------------------------------------------------------------------------------------------
class Stream:
    """Bookkeeping of one input kind ('observations' or 'efforts')."""

    def __init__(self, name: str):
        self.name = name
        self.total = 0
        self.clear()

    def clear(self):
        self.last_k: Optional[int] = None
        self.last_stamp_ns: Optional[int] = None
        self.last_rx_ns: Optional[int] = None
        self.period_ns: Optional[float] = None
        self.delay_hi_ns = 0.0       # largest recent delay (receipt − stamp), decaying (DELAY_MEMORY_NS)
        self.delay_at_ns = 0

    def note_delay(self, delay_ns: int, rx_ns: int):
        """Every admitted input, on time or late: the late ones are what the adaptive wait learns from."""
        self.delay_hi_ns = max(float(delay_ns), self.recent_delay_ns(rx_ns))
        self.delay_at_ns = rx_ns

    def recent_delay_ns(self, now_ns: int) -> float:
        hi = self.delay_hi_ns
        if hi <= 0.0:
            return 0.0
        return hi * math.exp(-max(0, now_ns - self.delay_at_ns) / DELAY_MEMORY_NS)

    def note(self, k: int, stamp_ns: int, rx_ns: int):
        if self.last_stamp_ns is not None and stamp_ns > self.last_stamp_ns:
            d = stamp_ns - self.last_stamp_ns
            self.period_ns = d if self.period_ns is None else 0.9 * self.period_ns + 0.1 * d
        if self.last_stamp_ns is None or stamp_ns > self.last_stamp_ns:
            self.last_stamp_ns = stamp_ns
        self.last_k = k if self.last_k is None else max(self.last_k, k)
        self.last_rx_ns = rx_ns
        self.total += 1


class InputScheduler:
    """ROS-free: assigns stamped inputs to grid steps and decides when a step can be estimated.

    All times are integer nanoseconds on the node clock."""

    def __init__(self, dt: float, window: int, n_actuators: int):
        self.dt_ns = int(round(dt * NS))
        self.window = int(window)
        self.n_actuators = n_actuators
        self.streams = {"observations": Stream("observations"), "efforts": Stream("efforts")}
        # acceptance policy (seconds → ns), set by the node
        self.future_tolerance_ns = NS // 2
        self.max_input_age_ns = NS
        self.sensor_timeout_ns = NS // 10
        self.input_delay_ns = 2 * self.dt_ns
        self.adaptive_input_delay = True
        self.startup_wait_ns = NS
        self.reset_stamp_ns = 0
        self.clear()

    def clear(self, reset_stamp_ns: int = 0):
        self.t0_ns: Optional[int] = None
        self.k_next = 0
        self.started = False                     # a step has been handed out since the (re)start
        self.first_rx_ns: Optional[int] = None   # receipt of the first accepted input
        self.obs: Dict[int, Dict[str, float]] = {}
        self.pending_efforts: List = []          # (k, stamp_ns, tau) not yet applied
        self.held_effort = np.full(self.n_actuators, np.nan)
        self.held_effort_stamp = np.full(self.n_actuators, -1, dtype=np.int64)
        self.reset_stamp_ns = reset_stamp_ns
        for s in self.streams.values():
            s.clear()

    @property
    def anchored(self) -> bool:
        return self.t0_ns is not None

    def t_of(self, k: int) -> int:
        return self.t0_ns + k * self.dt_ns

    def _admit(self, stamp_ns: int, now_ns: int) -> Optional[str]:
        if stamp_ns <= 0:
            return "bad_stamp"
        if now_ns <= 0:
            return "no_clock"
        if stamp_ns > now_ns + self.future_tolerance_ns:
            return "future"
        if stamp_ns < now_ns - self.max_input_age_ns:
            return "stale"
        if stamp_ns < self.reset_stamp_ns:
            return "before_reset"
        return None

    def _k_of(self, stamp_ns: int) -> int:
        if self.t0_ns is None:
            self.t0_ns = stamp_ns
            self.k_next = 0
        return int(math.floor((stamp_ns - self.t0_ns) / self.dt_ns + 0.5))

    def step_of(self, stamp_ns: int) -> int:
        """The grid step of a stamp (the scheduler must be anchored)."""
        return self._k_of(stamp_ns)

    def _late_kind(self, k: int) -> str:
        return "late" if self.k_next - k <= self.window else "too_old"

    def _step_of_input(self, stamp_ns: int, now_ns: int, stream: Stream) -> Tuple[Optional[str], int]:
        """(why it is refused, or None; its grid step) for an input stamped stamp_ns received at now_ns."""
        bad = self._admit(stamp_ns, now_ns)
        if bad:
            return bad, -1
        stream.note_delay(now_ns - stamp_ns, now_ns)
        if self.first_rx_ns is None:
            self.first_rx_ns = now_ns
        return None, self._k_of(stamp_ns)

    def add_observations(self, stamp_ns: int, values: Dict[str, float], now_ns: int) -> Optional[str]:
        bad, k = self._step_of_input(stamp_ns, now_ns, self.streams["observations"])
        if bad:
            return bad
        if k < self.k_next:
            return self._late_kind(k)
        self.obs.setdefault(k, {}).update(values)
        self.streams["observations"].note(k, stamp_ns, now_ns)
        return None

    def add_efforts(self, stamp_ns: int, tau: np.ndarray, now_ns: int) -> Optional[str]:
        bad, k = self._step_of_input(stamp_ns, now_ns, self.streams["efforts"])
        if bad:
            return bad
        if k < self.k_next:
            # a command is valid until replaced: a newer one that arrives a little late still applies now
            known = ~np.isnan(tau)
            if np.all(stamp_ns > self.held_effort_stamp[known]):
                self.held_effort[known] = tau[known]
                self.held_effort_stamp[known] = stamp_ns
                self.streams["efforts"].note(self.k_next - 1, stamp_ns, now_ns)
                return None
            return self._late_kind(k)
        self.pending_efforts.append((k, stamp_ns, tau))
        self.streams["efforts"].note(k, stamp_ns, now_ns)
        return None

    def waited_streams(self, now_ns: int, expected) -> List[Stream]:
        out = []
        for name, s in self.streams.items():
            if s.last_rx_ns is None:
                if name in expected and not self.started:
                    out.append(s)      # at start-up: wait (≤ startup_wait) for every input the mode uses
                continue
            if now_ns - s.last_rx_ns > self.sensor_timeout_ns:
                continue               # gone quiet: do not wait for it
            if s.period_ns is not None and s.period_ns > 1.5 * self.dt_ns:
                continue               # slower than the timestep: held (efforts) or sparse (sensors)
            out.append(s)
        return out

    def start_step(self, now_ns: int, expected) -> Optional[int]:
        """At start-up, once every waited input has been heard from: the newest step all of them have
        reached.  The steps before it hold only part of the inputs (one topic was still being discovered)
        and are already old: estimating them first would start with a backlog."""
        if self.started:
            return None
        waited = self.waited_streams(now_ns, expected)
        if not waited or any(s.last_k is None for s in waited):
            return None
        return min(s.last_k for s in waited)

    def ready(self, now_ns: int, expected) -> bool:
        if self.t0_ns is None:
            return False
        k = self.k_next
        waited = self.waited_streams(now_ns, expected)
        if waited and all(s.last_k is not None and s.last_k >= k for s in waited):
            return True
        if not self.started and any(s.last_rx_ns is None for s in waited):
            # an input the mode uses has not been heard from yet (e.g. its topic is still being
            # discovered): initializing without it would start from a guess
            return now_ns >= self.first_rx_ns + self.startup_wait_ns
        return now_ns >= self.t_of(k) + self.wait_ns(now_ns, waited)

    @staticmethod
    def recent_delay_ns(now_ns: int, waited: List[Stream]) -> float:
        """The largest recent delay (receipt − stamp) of the waited inputs."""
        return max((s.recent_delay_ns(now_ns) for s in waited), default=0.0)

    def wait_ns(self, now_ns: int, waited: List[Stream]) -> int:
        """How long after a step's time its missing inputs are waited for: `input_delay_ns`; adaptive, once
        the largest recent delay of the waited inputs is more than the window can absorb: DELAY_FACTOR ×
        that delay, at most sensor_timeout (a stream silent that long is not waited for at all).

        Delays up to input_delay + (window − 2)·dt cost nothing to wait out in accuracy: the step is
        predicted, its readings are fused into the window when they come (a late command is replaced by the
        held one for that step), and the latency stays low.  Longer ones would be dropped as too old."""
        base = self.input_delay_ns
        if not self.adaptive_input_delay:
            return base
        hi = self.recent_delay_ns(now_ns, waited)
        if hi <= base + max(0, self.window - 2) * self.dt_ns:
            return base
        return int(min(max(base, DELAY_FACTOR * hi), max(base, self.sensor_timeout_ns)))

    def pop(self, hold_missing: bool = True):
        """Inputs of step k_next: (k, efforts in actuator order or None, observations or None); advances.

        Efforts are commands, held (zero-order hold) until replaced or older than sensor_timeout.  With
        `hold_missing` false, a command stream that normally delivers every step but missed this one
        gives "unknown" instead of the previous value (the estimator then estimates the effort)."""
        k = self.k_next
        t_k = self.t_of(k)
        fresh = False
        if self.pending_efforts:
            keep = []
            for (ke, st, tau) in self.pending_efforts:
                if ke <= k:
                    known = ~np.isnan(tau)
                    newer = known & (st >= self.held_effort_stamp)
                    self.held_effort[newer] = tau[newer]
                    self.held_effort_stamp[newer] = st
                    fresh = fresh or ke == k
                else:
                    keep.append((ke, st, tau))
            self.pending_efforts = keep
        # a handful of actuators: plain Python is faster than numpy here (this runs at every step)
        max_age = self.sensor_timeout_ns
        if not hold_missing and not fresh:
            s = self.streams["efforts"]
            if s.period_ns is not None and s.period_ns <= 1.5 * self.dt_ns:
                max_age = min(max_age, self.dt_ns // 2)
        eff = [v if st >= 0 and t_k - st <= max_age else math.nan
               for v, st in zip(self.held_effort.tolist(), self.held_effort_stamp.tolist())]
        efforts = np.array(eff) if any(v == v for v in eff) else None
        self.started = True
        obs = self.obs.pop(k, None)
        if self.obs and min(self.obs) < k:        # cannot happen (late inputs are refused); be safe
            for kk in [kk for kk in self.obs if kk < k]:
                del self.obs[kk]
        self.k_next = k + 1
        return k, efforts, (obs or None)

    def skip_to(self, k: int) -> int:
        """Drop the steps before k (observations discarded, commands applied); return how many."""
        skipped = k - self.k_next
        for kk in [kk for kk in self.obs if kk < k]:
            del self.obs[kk]
        keep = []
        for (ke, st, tau) in self.pending_efforts:
            if ke < k:
                known = ~np.isnan(tau)
                newer = known & (st >= self.held_effort_stamp)
                self.held_effort[newer] = tau[newer]
                self.held_effort_stamp[newer] = st
            else:
                keep.append((ke, st, tau))
        self.pending_efforts = keep
        self.k_next = k
        return skipped

    def backlog_ns(self, now_ns: int) -> int:
        return 0 if self.t0_ns is None else now_ns - self.t_of(self.k_next)


# ---------------------------------------------------------------------------------------------
def _float_range(lo, hi):
    return [FloatingPointRange(from_value=float(lo), to_value=float(hi), step=0.0)]


class EstimatorNode(Node):
    """See the module docstring and docs/ros2_interfaces.md."""

    def __init__(self, **kwargs):
        super().__init__(NODE_NAME, **kwargs)
        self._log_times: Dict[str, float] = {}
        self._lock = threading.RLock()
        self._loop: Optional[fastloop.FastLoop] = None
        self._declare_and_load()
        self._setup_state()
        self._setup_interfaces()
        self.add_on_set_parameters_callback(self._on_set_parameters)
        self.get_logger().info(
            f"{self.mech.name}: mode={self.config.mode} formulation={self.config.formulation} "
            f"integrator={self.config.integrator} dt={self.config.dt} window={self.config.window}; "
            f"sensors {[s.name for s in self.mech.sensors]}, actuators {list(self.mech.actuator_names)}")

    # ----------------------------------------------------------------------------- parameters
    def _declare_and_load(self):
        d = self.declare_parameter
        PD = ParameterDescriptor
        mech_name = d("mechanism", "", PD(
            description="Mechanism YAML: a path, or the name of a file in the installed mechanisms/ folder "
                        "(e.g. four_bar_crank)", read_only=True)).value
        if not mech_name:
            raise ConfigError("parameter 'mechanism' is required (a YAML path or a name such as four_bar_crank)")
        try:
            self.mechanism_path = str(resolve_mechanism_path(mech_name))
            self.mech = load_mechanism(self.mechanism_path)
        except Exception as e:  # MechanismError, YAML errors
            raise ConfigError(f"parameter 'mechanism' ('{mech_name}'): {e}") from None
        mech = self.mech

        dt = d("dt", 1e-3, PD(description="Timestep [s]: estimate and output period", read_only=True,
                               floating_point_range=_float_range(1e-5, 1.0))).value
        window = d("window", 10, PD(description="Steps kept in the fixed-lag window (Nw)", read_only=True,
                                    integer_range=[IntegerRange(from_value=1, to_value=10000, step=1)])).value
        mode = d("mode", "forward_dynamics", PD(
            description="forward_dynamics (commanded efforts drive the model) | estimation (sensors only, "
                        "efforts estimated) | fused (both); changing it restarts the estimator",
            additional_constraints="one of: " + ", ".join(MODES))).value
        formulation = d("formulation", "dependent", PD(
            description="dependent | independent coordinates", read_only=True,
            additional_constraints="one of: " + ", ".join(FORMULATIONS))).value
        integrator = d("integrator", "trapezoidal", PD(
            description="Time integrator in the graph", read_only=True,
            additional_constraints="one of: " + ", ".join(INTEGRATORS))).value
        independent = d("independent", Parameter.Type.STRING_ARRAY, PD(
            description="Independent coordinate names (independent formulation); empty/unset = automatic",
            read_only=True)).value or []
        sigmas = {}
        for k, v in default_sigmas().items():
            sigmas[k] = d(f"sigmas.{k}", float(v), PD(
                description=f"Noise sigma of the '{k}' factors; changing it restarts the estimator",
                floating_point_range=_float_range(1e-15, 1e15))).value
        sensor_sigmas = {}
        for s in mech.sensors:
            sensor_sigmas[s.name] = d(f"sensor_sigmas.{s.name}", float(s.sigma), PD(
                description=f"Noise sigma of {s.kind} '{s.name}' (default from the mechanism file)",
                floating_point_range=_float_range(1e-15, 1e15))).value
        defaults = EstimatorConfig()
        outlier_gate = d("outlier_gate", float(defaults.outlier_gate), PD(
            description="Reject a sensor reading whose residual at the prediction exceeds this many sigmas "
                        "(0 = off)", read_only=True, floating_point_range=_float_range(0.0, 1e12))).value
        max_rejections = d("max_rejections", int(defaults.max_rejections), PD(
            description="...unless rejected this many consecutive steps: then re-initialize from the readings",
            read_only=True, integer_range=[IntegerRange(from_value=1, to_value=1000000, step=1)])).value
        n_ind = len(mech.assembly_mode_names)
        am_default = [int(x) for x in mech.assembly_mode(np.array(mech.q0))] if n_ind else Parameter.Type.INTEGER_ARRAY
        am = d("assembly_mode", am_default, PD(
            description="Requested branch: one +1/-1 per assembly-mode indicator "
                        f"({', '.join(mech.assembly_mode_names) or 'none in this mechanism'}); "
                        "setting it re-initializes on that branch",
            additional_constraints="values in {-1, +1}, one per indicator")).value
        self.p_sensor_timeout = d("sensor_timeout", 0.1, PD(
            description="An input silent for longer raises a WARN; efforts older than this count as unknown [s]",
            floating_point_range=_float_range(0.0, 3600.0))).value
        self.p_max_input_delay = d("max_input_delay", 0.003, PD(
            description="Wait for late inputs before a step is estimated without them (longer with "
                        "adaptive_input_delay while the inputs arrive later) [s]",
            floating_point_range=_float_range(0.0, 10.0))).value
        self.p_adaptive_input_delay = d("adaptive_input_delay", True, PD(
            description="While inputs arrive later than the window can absorb (max_input_delay + (window - 2) "
                        "steps; a loaded machine, a slow link), wait "
                        f"{DELAY_FACTOR:g} x their largest recent delay (memory ~{DELAY_MEMORY_NS / NS:g} s, at most "
                        "sensor_timeout) instead of predicting the steps and dropping the inputs as too old")).value
        self.p_startup_wait = d("startup_wait", 1.0, PD(
            description="After a (re)start, longest wait for every input the mode uses (its topic may still be "
                        "being discovered) before estimating without the missing ones [s]",
            floating_point_range=_float_range(0.0, 3600.0))).value
        self.p_max_input_age = d("max_input_age", 1.0, PD(
            description="Inputs stamped more than this before the node clock are rejected [s]",
            floating_point_range=_float_range(0.0, 1e6))).value
        self.p_future_tolerance = d("future_tolerance", 0.5, PD(
            description="Inputs stamped more than this after the node clock are rejected [s]",
            floating_point_range=_float_range(0.0, 1e6))).value
        self.p_publish_markers = d("publish_markers", True, PD(description="Publish ~/markers for RViz")).value
        self.p_marker_period = d("marker_period", 0.05, PD(
            description="Minimum period of ~/markers [s] (0 = every step)",
            floating_point_range=_float_range(0.0, 3600.0))).value
        self.p_frame_id = d("frame_id", "world", PD(description="frame_id of ~/state and ~/markers")).value
        self.p_diag_period = d("diagnostics_period", 1.0, PD(
            description="Period of /diagnostics [s] (wall clock)", read_only=True,
            floating_point_range=_float_range(0.01, 60.0))).value
        self.p_reset_on_time_jump = d("reset_on_time_jump", True, PD(
            description="Reset when the node clock jumps backwards (looping bag)")).value
        self.p_max_backlog = d("max_backlog", 0.1, PD(
            description="If estimation falls further behind the node clock (solves slower than dt), skip to "
                        "the newest inputs and re-seed from the last estimate [s] (0 = never)",
            floating_point_range=_float_range(0.0, 3600.0))).value
        self.p_fast_loop = d("fast_loop", True, PD(
            description="Serve the inputs and the step timer from a lean wait loop in its own thread "
                        "(about 10x less overhead than rclpy's executor); false = plain rclpy executor",
            read_only=True)).value

        try:
            # The node calls step() on every grid step (gaps only when it skips ahead on overload, where the
            # core must re-seed from its last estimate rather than integrate every skipped step).
            base = EstimatorConfig(dt=float(dt), window=int(window), mode=str(mode), formulation=str(formulation),
                                   integrator=str(integrator), independent=tuple(independent),
                                   sigmas=dict(sigmas), sensor_sigmas=dict(sensor_sigmas), max_substeps=1,
                                   outlier_gate=float(outlier_gate), max_rejections=int(max_rejections))
            self.config = base.validated()
        except ValueError as e:
            raise ConfigError(f"bad estimator parameters: {self._name_params(str(e))}") from None
        problem = self._check_assembly_mode(am)
        if problem:
            raise ConfigError(f"parameter 'assembly_mode': {problem}")
        self.assembly_mode = tuple(int(x) for x in am) if am else None
        if self.assembly_mode:
            self.config = replace(self.config, assembly_mode=self.assembly_mode)

    @staticmethod
    def _name_params(msg: str) -> str:
        """Config errors say 'sigma 'x''; say which ROS parameter that is."""
        return (msg.replace("sigma '", "parameter sigmas.*/sensor_sigmas.* '")
                .replace("dt must", "parameter 'dt' must").replace("window must", "parameter 'window' must")
                .replace("mode must", "parameter 'mode' must")
                .replace("formulation must", "parameter 'formulation' must")
                .replace("integrator must", "parameter 'integrator' must"))

    def _check_assembly_mode(self, am) -> Optional[str]:
        n_ind = len(self.mech.assembly_mode_names)
        am = list(am or [])
        if not am:
            return None
        if len(am) != n_ind:
            return (f"needs {n_ind} values (one per indicator: {', '.join(self.mech.assembly_mode_names)})"
                    if n_ind else "this mechanism has no assembly-mode indicators; leave it unset")
        if any(int(x) not in (-1, 1) for x in am):
            return f"values must be -1 or +1 (got {am})"
        return None

    # ------------------------------------------------------------------------------- state
    def _setup_state(self):
        mech = self.mech
        self._clock_handle = None
        self.Estimator = FixedLagEstimator
        self.estimator = self.Estimator(mech, self.config)
        self.sched = InputScheduler(self.config.dt, self.config.window, len(mech.actuated))
        self._apply_scheduler_params()
        # joint-name maps
        self.sensor_map = {}
        for s in mech.sensors:
            self.sensor_map[s.name] = ("position" if s.kind == "encoder" else "velocity", s.name)
        self.actuator_map = {nm: i for i, nm in enumerate(mech.actuator_names)}
        # ~/joint_states: actuated and encoded relative coordinates (named after actuator / encoder)
        names_by_coord = {}
        for i, c in enumerate(mech.actuated):
            names_by_coord[int(c)] = mech.actuator_names[i]
        for s in mech.sensors:
            if s.kind == "encoder":
                names_by_coord.setdefault(int(s.coordinate), s.name)
        self.js_coords = np.array(sorted(names_by_coord), dtype=np.intp)
        self.js_names = [names_by_coord[int(c)] for c in self.js_coords]
        act_pos = {int(c): i for i, c in enumerate(mech.actuated)}
        self.js_effort_index = np.array([act_pos.get(int(c), -1) for c in self.js_coords], dtype=np.intp)
        # status
        self.state = "waiting"        # waiting | running
        self.last_estimate: Optional[Estimate] = None
        self._estimate_steps: Dict[int, int] = {}   # grid step -> the core's step id of its estimate (late readings)
        self.last_k: Optional[int] = None
        self.counters = {k: 0 for k in REJECT_KINDS}
        self.events = {"resets": 0, "time_jumps": 0, "reinitializations": 0, "solver_recoveries": 0,
                       "solver_failures": 0, "overruns": 0, "skipped_steps": 0, "predicted_steps": 0, "steps": 0,
                       "late_readings_fused": 0,
                       "late_steps": 0}
        self.period_stats = _new_period_stats()
        self.last_error = ""
        self.last_message = ""
        self._jump_pending: Optional[str] = None
        self._last_now_ns = 0
        self._last_marker_ns = -10 ** 19
        self._listeners_checked_ns = -10 ** 19
        self._listened = (True, True)          # (~/state, ~/joint_states) have subscribers
        self._failures_reported = 0

    def _apply_scheduler_params(self):
        s = self.sched
        s.future_tolerance_ns = int(self.p_future_tolerance * NS)
        s.max_input_age_ns = int(self.p_max_input_age * NS)
        s.sensor_timeout_ns = int(self.p_sensor_timeout * NS)
        s.input_delay_ns = int(self.p_max_input_delay * NS)
        s.adaptive_input_delay = bool(self.p_adaptive_input_delay)
        s.startup_wait_ns = int(self.p_startup_wait * NS)

    def _expected_streams(self):
        return {"forward_dynamics": ("efforts",), "estimation": ("observations",),
                "fused": ("efforts", "observations")}[self.config.mode]

    # ---------------------------------------------------------------------------- interfaces
    def _setup_interfaces(self):
        qo = {"qos_overriding_options": QoSOverridingOptions.with_default_policies()} if QoSOverridingOptions else {}
        self.pub_js = self.create_publisher(JointState, "~/joint_states", OUTPUT_QOS, **qo)
        self.pub_state = self.create_publisher(JointTrajectory, "~/state", OUTPUT_QOS, **qo)
        self.pub_markers = self.create_publisher(MarkerArray, "~/markers", OUTPUT_QOS, **qo)
        self.pub_diag = self.create_publisher(DiagnosticArray, "/diagnostics", OUTPUT_QOS)
        # Hot path (inputs + step timer): a FastLoop thread, or a plain executor group as fallback.
        self._fast = bool(self.p_fast_loop) and fastloop.available()
        if self.p_fast_loop and not self._fast:
            self.get_logger().warning("fast_loop unavailable in this rclpy: using the stock executor")
        hot = fastloop.DetachedCallbackGroup() if self._fast else MutuallyExclusiveCallbackGroup()
        subs = [
            (self.create_subscription(JointState, "joint_observations", self._on_observations, INPUT_QOS,
                                      callback_group=hot, raw=True, **qo), self._on_observations),
            (self.create_subscription(JointState, "commanded_effort", self._on_effort_js, INPUT_QOS,
                                      callback_group=hot, raw=True, **qo), self._on_effort_js),
            (self.create_subscription(Float64MultiArray, "commanded_effort_array", self._on_effort_array,
                                      INPUT_QOS, callback_group=hot, **qo), self._on_effort_array),
        ]
        self.step_timer = self.create_timer(self.config.dt, self._on_timer, callback_group=hot)
        # Services: in the fast loop too (answered between two steps), else on the executor under the lock.
        # Parameters and diagnostics: the executor in the main thread.
        ctl = MutuallyExclusiveCallbackGroup()
        srv_group = hot if self._fast else ctl
        services = [(self.create_service(Trigger, "~/reinitialize", self._locked(self._srv_reinitialize),
                                          callback_group=srv_group), self._srv_reinitialize),
                    (self.create_service(Trigger, "~/reset", self._locked(self._srv_reset),
                                         callback_group=srv_group), self._srv_reset),
                    (self.create_service(SetBool, "~/set_assembly_mode", self._srv_set_assembly_mode,
                                         callback_group=srv_group), self._srv_set_assembly_mode)]
        self.diag_timer = self.create_timer(self.p_diag_period, self._on_diagnostics_timer,
                                            callback_group=ctl, clock=Clock(clock_type=ClockType.STEADY_TIME))
        if self._fast:
            self._loop = fastloop.FastLoop(self, subs, [(self.step_timer, self._on_timer)],
                                           after_batch=self._after_batch, lock=self._lock,
                                           on_error=self._on_loop_error, poll_window=self._poll_window,
                                           services=services)
        self._jump_handle = self.get_clock().create_jump_callback(
            JumpThreshold(min_forward=None, min_backward=Duration(nanoseconds=-1), on_clock_change=True),
            post_callback=self._on_time_jump)
        try:   # rclpy's Clock.now() wraps this in two objects; read the rcl clock directly when possible
            h = self.get_clock().handle
            h.get_now().nanoseconds
            self._clock_handle = h
        except Exception:  # pragma: no cover
            self._clock_handle = None
        self._make_templates()

    def _locked(self, fn):
        def wrapper(*args):
            with self._lock:
                return fn(*args)
        return wrapper

    def start(self):
        if self._loop is not None:
            self._loop.start()

    def stop(self):
        if self._loop is not None:
            self._loop.stop()

    def _on_loop_error(self, e: BaseException):
        self.events["handler_errors"] = self.events.get("handler_errors", 0) + 1
        self._warn_kind("handler_errors", f"unexpected error in an input handler: {type(e).__name__}: {e}")
        self.get_logger().debug(traceback.format_exc())

    # ------------------------------------------------------------------------------- logging
    def _warn_kind(self, kind: str, detail: str):
        """Log the first occurrence of each kind, then at most every 10 s with the running count."""
        now = time.monotonic()
        last = self._log_times.get(kind)
        if last is None or now - last > 10.0:
            self._log_times[kind] = now
            n = self.counters.get(kind, self.events.get(kind, 0))
            self.get_logger().warning(f"{kind} ({n} so far): {detail}")

    def _reject(self, kind: str, detail: str):
        self.counters[kind] = self.counters.get(kind, 0) + 1
        self._warn_kind(kind, f"{REJECT_KINDS.get(kind, kind)}: {detail}" if kind in REJECT_KINDS else detail)

    # -------------------------------------------------------------------------------- inputs
    def _now_ns(self) -> int:
        """Node clock (ROS time: sim time when use_sim_time) in ns; the direct read skips two objects."""
        h = self._clock_handle
        if h is not None:
            return h.get_now().nanoseconds
        return self.get_clock().now().nanoseconds

    def _decoded(self, raw: bytes, topic: str) -> Optional[rc.RawJointState]:
        """JointState inputs are taken serialized (see `ros_conversions.decode_joint_state`)."""
        try:
            return rc.decode_joint_state(raw)
        except ValueError as e:
            self._reject("bad_message", f"{topic}: {e}")
            return None

    def _on_observations(self, raw: bytes):
        now = self._now_ns()
        self._check_time(now)          # a clock jump resets before inputs of the new time are judged
        msg = self._decoded(raw, "joint_observations")
        values, problems = rc.parse_observations(msg, self.sensor_map) if msg is not None else ({}, ())
        for kind, detail in problems:
            self._reject(kind, detail)
        if values:
            stamp = msg.stamp_ns
            self.period_stats["input_delay"].append(now - stamp)
            bad = self.sched.add_observations(stamp, values, now)
            if bad == "late":
                bad = self._fuse_late(stamp, values)
            if bad:
                self._reject(bad, self._stamp_detail(stamp, now))
        if not self._fast:
            self._pump(now, max_steps=1000)

    def _estimate_step_of(self, k: int) -> int:
        """The core's id of the step estimated for grid step k (-1: none kept)."""
        return self._estimate_steps.get(k, -1)

    def _fuse_late(self, stamp_ns: int, values) -> Optional[str]:
        """Readings of a step already estimated but still in the window become factors on that step
        (the smoother revises the window, the newest estimate included); None if all were fused."""
        k = self.sched.step_of(stamp_ns)
        try:
            fused, refused = self.estimator.add_late_observations(self._estimate_step_of(k), values)
        except Exception as e:  # never let a late reading break the node
            self.get_logger().debug(f"late reading not fused: {e!r}")
            fused, refused = [], list(values)
        self.events["late_readings_fused"] += len(fused)
        return "late" if refused else None

    def _on_effort_js(self, raw: bytes):
        now = self._now_ns()
        self._check_time(now)
        msg = self._decoded(raw, "commanded_effort")
        tau, problems = (rc.parse_effort_joint_state(msg, self.actuator_map, len(self.mech.actuated))
                         if msg is not None else (None, ()))
        for kind, detail in problems:
            self._reject(kind, detail)
        if tau is not None:
            stamp = msg.stamp_ns
            bad = self.sched.add_efforts(stamp, tau, now)
            if bad:
                self._reject(bad, self._stamp_detail(stamp, now))
        if not self._fast:
            self._pump(now, max_steps=1000)

    def _on_effort_array(self, msg: Float64MultiArray):
        now = self._now_ns()
        self._check_time(now)
        tau, problems = rc.parse_effort_array(msg.data, len(self.mech.actuated))
        for kind, detail in problems:
            self._reject(kind, detail)
        if tau is not None:   # unstamped: stamped on receipt
            bad = self.sched.add_efforts(now, tau, now)
            if bad:
                self._reject(bad, self._stamp_detail(now, now))
        if not self._fast:
            self._pump(now, max_steps=1000)

    def _after_batch(self) -> bool:
        return self._pump(self._now_ns())

    def _poll_window(self) -> int:
        """ns to poll for the rest of the next step's inputs when part of them has arrived (they are
        published together, so the rest follows within microseconds)."""
        sched = self.sched
        k = sched.k_next
        if not sched.anchored or not any(s.last_k is not None and s.last_k >= k for s in sched.streams.values()):
            return 0
        return POLL_NS

    def _stamp_detail(self, stamp_ns: int, now_ns: int) -> str:
        s = f"stamp {stamp_ns / NS:.6f} s, node clock {now_ns / NS:.6f} s"
        if self.sched.anchored:
            s += f", next step {self.sched.t_of(self.sched.k_next) / NS:.6f} s"
        return s

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
            self.events["time_jumps"] += 1
            if self.p_reset_on_time_jump:
                self._do_reset(f"time jump ({reason})", reset_stamp_ns=0)
            else:
                self._warn_kind("time_jumps", f"{reason}; reset_on_time_jump is false: keeping state")

    # ---------------------------------------------------------------------------- stepping
    def _on_timer(self):
        if not self.sched.anchored:
            # nothing received since the start or the last reset: no step can be due.  The timer sleeps
            # until an input comes (an idle node at 1 kHz cost 11 % of a core in empty wake-ups)
            self.step_timer.cancel()
            return False
        if self._fast:
            return self._pump(self._now_ns())
        with self._lock:
            return self._pump(self._now_ns(), max_steps=1000)

    def _pump(self, now_ns: int, max_steps: int = 4) -> bool:
        """Estimate the ready steps (at most `max_steps`, so that services are not kept waiting);
        True if more are ready (the fast loop then comes back at once)."""
        self._check_time(now_ns)
        sched = self.sched
        if sched.anchored and self.step_timer.is_canceled():
            self.step_timer.reset()         # inputs again: steps (and predictions without inputs) are due
        if sched.anchored and self.p_max_backlog > 0 and sched.backlog_ns(now_ns) > self.p_max_backlog * NS:
            self._skip_ahead(now_ns)
        expected = self._expected_streams()
        if not sched.started:
            k0 = sched.start_step(now_ns, expected)
            if k0 is not None and k0 > sched.k_next:
                sched.skip_to(k0)
        n = 0
        while sched.ready(now_ns, expected):
            if n == max_steps:
                return True
            k, efforts, obs = sched.pop(hold_missing=self.config.mode == "forward_dynamics")
            self._step(k, efforts, obs)
            n += 1
        if n:
            if self._fast:
                # the step timer only has to catch steps whose inputs are missing: while inputs keep the
                # steps going it is pushed back, which saves a wake-up of the loop per step
                self.step_timer.reset()
            # caught up: the input-free part of the next step is done now, while its inputs are on their way
            self.estimator.prepare_next_step()
        return False

    def _skip_ahead(self, now_ns: int):
        """Estimation fell more than max_backlog behind the clock (solves slower than dt): jump to the newest
        data instead of queueing; the core re-seeds from its last estimate at the new time."""
        sched = self.sched
        k_clock = (now_ns - sched.wait_ns(now_ns, sched.waited_streams(now_ns, self._expected_streams()))
                   - sched.t0_ns) // sched.dt_ns
        newest = [s.last_k for s in sched.streams.values() if s.last_k is not None and s.last_k >= sched.k_next]
        target = int(min(max(newest), k_clock) if newest else k_clock)
        if target <= sched.k_next:
            return
        if not sched.started:         # still waiting for the inputs at start-up: keep only recent ones
            sched.skip_to(target)
            return
        behind = sched.backlog_ns(now_ns) / NS
        skipped = sched.skip_to(target)
        self.events["overruns"] += 1
        self.events["skipped_steps"] += skipped
        self._warn_kind("overruns", f"estimation fell {behind:.3f} s behind the node clock "
                                    f"(max_backlog {self.p_max_backlog} s; mean solve "
                                    f"{1e3 * np.mean(self.period_stats['solve'] or [0]):.2f} ms for a "
                                    f"{self.config.dt * 1e3:g} ms step): skipped {skipped} steps")

    def _step(self, k: int, efforts, observations):
        t_rel = k * self.config.dt
        t_k = self.sched.t_of(k)
        t_start = time.perf_counter()
        c_start = time.thread_time()
        try:
            est = self.estimator.step(t_rel, efforts=efforts, observations=observations)
        except Exception as e:  # numerical failure inside the core: never let it kill the node
            self.events["solver_failures"] += 1
            self.last_error = f"{type(e).__name__}: {e}"
            self._warn_kind("solver_failures", f"step at t={t_k / NS:.6f} failed ({self.last_error}); "
                                               "re-initializing")
            self.get_logger().debug(traceback.format_exc())
            try:
                self.estimator.reinitialize(assembly_mode=self.assembly_mode)
                self.events["reinitializations"] += 1
            except Exception as e2:
                self._do_reset(f"re-initialization after a solver failure failed too ({type(e2).__name__}: {e2})",
                               reset_stamp_ns=t_k + 1)
            return
        solve = time.perf_counter() - t_start
        solve_cpu = time.thread_time() - c_start
        if est.status == "recovered":
            self.events["solver_recoveries"] += 1
            self._warn_kind("solver_recoveries", f"the core re-initialized (numerical failure, or readings that "
                                                 f"contradict the prediction) at "
                                                 f"t={t_k / NS:.6f}: {est.message}")
        if est.status == "waiting":
            return
        if efforts is None and observations is None:
            self.events["predicted_steps"] += 1
        self.state = "running"
        self.last_estimate = est
        self.last_k = k
        steps = self._estimate_steps
        steps[k] = est.step
        if len(steps) > LATE_STEPS_KEPT:
            del steps[next(iter(steps))]
        self.last_message = est.message
        self._publish(est, t_k)
        now = self._now_ns()
        lat = now - t_k
        ps = self.period_stats
        ps["steps"] += 1
        ps["solve"].append(solve)
        ps["solve_cpu"].append(solve_cpu)
        ps["latency"].append(lat)
        self.events["steps"] += 1
        if lat > self.sched.dt_ns:
            ps["late"] += 1
            self.events["late_steps"] += 1

    def _make_templates(self):
        """Serialized templates of the three outputs (see `ros_conversions.SerializedTemplate`): ~/joint_states,
        ~/state, ~/markers (rebuilt when frame_id changes)."""
        mech, n, nj, frame = self.mech, self.mech.n, len(self.js_coords), self.p_frame_id
        names, coords = self.js_names, mech.coordinate_names
        self._templates = (
            rc.SerializedTemplate(lambda st, x: rc.joint_state(st, names, x[:nj], x[nj:2 * nj], x[2 * nj:]),
                                  3 * nj),
            rc.SerializedTemplate(lambda st, x: rc.trajectory_state(st, frame, coords, x[:n], x[n:2 * n],
                                                                    x[2 * n:3 * n], x[3 * n:]), 4 * n),
            rc.SerializedTemplate(lambda st, x: rc.mechanism_markers(mech, None, st, frame, xy=x.reshape(-1, 2)),
                                  2 * len(mech.spec.points)))

    def _publish(self, est: Estimate, t_k: int):
        q, v = est.q, est.v
        markers = self.p_publish_markers and t_k - self._last_marker_ns >= self.p_marker_period * NS
        if markers:
            self._last_marker_ns = t_k
        if t_k - self._listeners_checked_ns >= LISTENER_CHECK_NS or t_k < self._listeners_checked_ns:
            # a topic nobody subscribes to is not built and written at every step (a new subscriber is
            # served within LISTENER_CHECK_NS)
            self._listeners_checked_ns = t_k
            self._listened = (self.pub_state.get_subscription_count() > 0,
                              self.pub_js.get_subscription_count() > 0)
        to_state, to_js = self._listened
        js_tpl, state_tpl, markers_tpl = self._templates
        if to_state:
            self.pub_state.publish(state_tpl.fill(t_k, np.concatenate((q, v, est.a, est.Q))))
        if to_js:
            c, idx = self.js_coords, self.js_effort_index
            eff = np.zeros(len(c))
            has = idx >= 0
            if np.any(has):
                eff[has] = np.asarray(est.efforts, dtype=float)[idx[has]]
            self.pub_js.publish(js_tpl.fill(t_k, np.concatenate((q[c], v[c], eff))))
        if markers:
            self.pub_markers.publish(markers_tpl.fill(t_k, self.mech.point_positions(q).ravel()))

    # ----------------------------------------------------------------------------- resets
    def _do_reset(self, reason: str, reset_stamp_ns: int = 0):
        self.events["resets"] += 1
        try:
            self.estimator.reset()
        except Exception as e:   # a broken core: rebuild it
            self.get_logger().error(f"estimator.reset() failed ({e}); rebuilding the estimator")
            self.estimator = self.Estimator(self.mech, self.config)
        self.sched.clear(reset_stamp_ns=reset_stamp_ns)
        self.state = "waiting"
        self.last_estimate = None
        self.last_k = None
        self._estimate_steps.clear()
        self._last_marker_ns = -10 ** 19
        self.last_message = f"reset: {reason}"
        self.get_logger().info(f"reset: {reason}")

    def _reinitialize(self, assembly_mode):
        """Re-solve the position problem from the latest estimate on `assembly_mode`; (mode, residual).  The
        window is re-seeded by the fast loop right after the reply goes out (else by the next step)."""
        mode, residual = self.estimator.reinitialize(assembly_mode=assembly_mode)
        self.events["reinitializations"] += 1
        if self._loop is not None:
            self._loop.call_soon(self.estimator.apply_reinitialization)
        return mode, residual

    def _branch_text(self, mode) -> str:
        names = self.mech.assembly_mode_names
        if not names:
            return "no assembly-mode indicators"
        return ", ".join(f"{n}={int(m):+d}" for n, m in zip(names, list(mode)))

    # ---------------------------------------------------------------------------- services
    def _srv_reinitialize(self, request, response):
        if self.state != "running":
            response.success = False
            response.message = "no estimate yet (waiting for the first input): nothing to re-initialize"
            return response
        t0 = time.perf_counter()
        try:
            mode, residual = self._reinitialize(self.assembly_mode)
        except Exception as e:
            response.success = False
            response.message = f"re-initialization failed: {type(e).__name__}: {e}"
            self.get_logger().warning(response.message)
            return response
        response.success = True
        response.message = (f"re-initialized on branch {self._branch_text(mode)}; |Phi| = {residual:.3g}; the window "
                            f"is re-seeded before the next estimate (in {(time.perf_counter() - t0) * 1e3:.2f} ms)")
        self.get_logger().info(response.message)
        return response

    def _srv_reset(self, request, response):
        self._do_reset("~/reset service", reset_stamp_ns=max(self._now_ns(), 0))
        response.success = True
        response.message = "reset: all state cleared, waiting for the first input stamped after now"
        return response

    def _srv_set_assembly_mode(self, request, response):
        n_ind = len(self.mech.assembly_mode_names)
        if n_ind != 1:
            response.success = False
            response.message = (
                f"{self.mech.name} has {n_ind} assembly-mode indicators "
                f"({', '.join(self.mech.assembly_mode_names) or 'none'}); "
                "set the 'assembly_mode' parameter (an integer array of +1/-1) instead"
                if n_ind else f"{self.mech.name} has no assembly-mode indicators: there is no branch to choose")
            return response
        value = 1 if request.data else -1
        results = self.set_parameters([Parameter("assembly_mode", Parameter.Type.INTEGER_ARRAY, [value])])
        r = results[0]
        response.success = bool(r.successful)
        response.message = (self._last_branch_message if r.successful else f"rejected: {r.reason}")
        return response

    # ------------------------------------------------------------------------- dynamic params
    def _on_set_parameters(self, params) -> SetParametersResult:
        with self._lock:
            return self._on_set_parameters_locked(params)

    def _on_set_parameters_locked(self, params) -> SetParametersResult:
        new = {p.name: p.value for p in params}
        rebuild = {}
        # validate everything first, then apply (all or nothing)
        for name, value in new.items():
            if DYNAMIC_SETTINGS.get(name) is float:
                if value is None or not math.isfinite(float(value)) or float(value) < 0:
                    return SetParametersResult(successful=False, reason=f"parameter '{name}' must be >= 0 seconds")
            elif name == "mode":
                if value not in MODES:
                    return SetParametersResult(successful=False,
                                               reason=f"parameter 'mode' must be one of {', '.join(MODES)}")
                rebuild["mode"] = value
            elif name.startswith("sigmas.") or name.startswith("sensor_sigmas."):
                if value is None or not (float(value) > 0 and math.isfinite(float(value))):
                    return SetParametersResult(successful=False, reason=f"parameter '{name}' must be > 0")
                rebuild[name] = float(value)
            elif name == "assembly_mode":
                problem = self._check_assembly_mode(value)
                if problem:
                    return SetParametersResult(successful=False, reason=f"parameter 'assembly_mode': {problem}")
        config = self.config
        if rebuild:
            sig, ssig = dict(config.sigmas), dict(config.sensor_sigmas)
            for name, value in rebuild.items():
                if name.startswith("sigmas."):
                    sig[name[len("sigmas."):]] = value
                elif name.startswith("sensor_sigmas."):
                    ssig[name[len("sensor_sigmas."):]] = value
            try:
                config = replace(config, mode=rebuild.get("mode", config.mode), sigmas=sig,
                                 sensor_sigmas=ssig).validated()
            except ValueError as e:
                return SetParametersResult(successful=False, reason=self._name_params(str(e)))
        if "assembly_mode" in new:
            am = tuple(int(x) for x in (new["assembly_mode"] or ())) or None
            if self.state == "running" and am is not None:
                t0 = time.perf_counter()
                try:
                    mode, residual = self._reinitialize(am)
                except Exception as e:
                    reason = (f"parameter 'assembly_mode' {list(am)}: impossible here "
                              f"({type(e).__name__}: {e}); keeping {self._branch_text(self.assembly_mode or ())}")
                    self._warn_kind("bad_assembly_mode", reason)
                    return SetParametersResult(successful=False, reason=reason)
                self._last_branch_message = (f"re-initialized on branch {self._branch_text(mode)}; "
                                             f"|Phi| = {residual:.3g}; the window is re-seeded before the next "
                                             f"estimate (in {(time.perf_counter() - t0) * 1e3:.2f} ms)")
            else:
                self._last_branch_message = (f"branch {self._branch_text(am or ())} will be used at the next "
                                             "initialization")
            self.get_logger().info(self._last_branch_message)
            self.assembly_mode = am
            config = replace(config, assembly_mode=am)
        # apply
        for name, value in new.items():
            kind = DYNAMIC_SETTINGS.get(name)
            if kind is not None:
                setattr(self, f"p_{name}", kind(value))
        if "frame_id" in new:
            self._make_templates()
        self._apply_scheduler_params()
        self.config = config
        if rebuild:
            self.estimator = self.Estimator(self.mech, self.config)
            self._do_reset(f"parameters {sorted(rebuild)} changed: estimator rebuilt", reset_stamp_ns=0)
        return SetParametersResult(successful=True)

    _last_branch_message = ""

    # --------------------------------------------------------------------------- diagnostics
    def _on_diagnostics_timer(self):
        # published by the fast loop between two steps: built here, it would share the GIL with the hot
        # path for a few ms at every period (a burst of late steps)
        if self._loop is not None:
            self._loop.call_soon(self._publish_diagnostics)
        else:
            self._publish_diagnostics()

    def _publish_diagnostics(self):
        with self._lock:
            now, ps, kv, level, msgs = self._diagnostics_snapshot()
        dt = self.config.dt
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
        status = (level, f"{self.get_fully_qualified_name()}: estimator", "; ".join(msgs) or kv["state"],
                  self.mech.name, kv)
        self.pub_diag.publish(rc.encode_diagnostic_array(max(now, 0), [status]))

    def _diagnostics_snapshot(self):
        """(now, period statistics, key/values, level, messages) of the diagnostics (under the lock)."""
        now = self._now_ns()
        ps = self.period_stats
        self.period_stats = _new_period_stats()
        dt = self.config.dt
        level, msgs = DiagnosticStatus.OK, []
        st = self.state
        if now <= 0:
            level, st = DiagnosticStatus.WARN, "waiting for valid ROS time"
        kv = {"state": st, "mechanism": self.mech.name, "mode": self.config.mode,
              "formulation": self.config.formulation, "integrator": self.config.integrator,
              "dt": dt, "window": self.config.window}
        est = self.last_estimate
        if est is not None:
            kv["assembly_mode"] = self._branch_text(est.assembly_mode)
            kv["constraint_residual"] = float(est.constraint_residual)
            kv["status"] = est.status
            kv["estimate_time"] = (self.sched.t_of(self.last_k) / NS) if self.last_k is not None else ""
        else:
            kv["assembly_mode"] = self._branch_text(self.assembly_mode) if self.assembly_mode else "auto"
        period = self.p_diag_period
        kv["output_rate_hz"] = ps["steps"] / period
        kv["target_rate_hz"] = 1.0 / dt
        kv["budget_ms"] = dt * 1e3
        for k, v in self.events.items():
            kv[k] = v
        for k, v in self.counters.items():
            kv[f"rejected.{k}"] = v
        if self.sched.anchored:
            kv["next_step_time"] = self.sched.t_of(self.sched.k_next) / NS
        waited = self.sched.waited_streams(now, self._expected_streams())
        wait = self.sched.wait_ns(now, waited)
        kv["input_wait_ms"] = wait / 1e6     # how long a missing input is waited for now
        if wait > self.sched.input_delay_ns and self.state == "running":
            # the adaptive wait is up: inputs arrive later than max_input_delay (and so do the outputs);
            # said, not warned: a loaded machine delays a few inputs by some ms now and then
            delay = self.sched.recent_delay_ns(now, waited)
            msgs.append(f"inputs arrive up to {delay / 1e6:.3g} ms after their stamps "
                        f"(max_input_delay {self.p_max_input_delay * 1e3:g} ms): missing inputs are waited for "
                        f"{wait / 1e6:.3g} ms")
        kv["clock"] = now / NS
        for name, s in self.sched.streams.items():
            kv[f"input.{name}.received"] = s.total
            if s.last_stamp_ns is not None:
                kv[f"input.{name}.last_stamp"] = s.last_stamp_ns / NS
            age = (now - s.last_rx_ns) / NS if s.last_rx_ns is not None else float("inf")
            kv[f"input.{name}.age_s"] = age if math.isfinite(age) else "never"
            if name in self._expected_streams() and st == "running" and age > self.p_sensor_timeout:
                level = max(level, DiagnosticStatus.WARN)
                msgs.append(f"no {name} for {age:.3g} s (sensor_timeout {self.p_sensor_timeout} s)"
                            if math.isfinite(age) else f"no {name} received yet")
        if self.state == "waiting" and now > 0:
            msgs.append("waiting for the first input")
        if self.events["solver_failures"] and self.last_error:
            kv["last_error"] = self.last_error
        if ps["steps"] == 0 and self.state == "running":
            level = max(level, DiagnosticStatus.WARN)
            msgs.append("no output in the last period")
        if self.last_message:
            kv["last_message"] = self.last_message
        if self.events["solver_failures"] > self._failures_reported:
            level = DiagnosticStatus.ERROR
            msgs.insert(0, f"solver failed {self.events['solver_failures'] - self._failures_reported} time(s) "
                           f"since the last report (auto re-initialized): {self.last_error}")
            self._failures_reported = self.events["solver_failures"]
        return now, ps, kv, level, msgs


# ---------------------------------------------------------------------------------------------
def main(args=None):
    sys.setswitchinterval(5e-4)   # quick GIL hand-over between the fast loop and the executor thread
    rclpy.init(args=args)
    node = None
    try:
        try:
            node = EstimatorNode()
        except (ConfigError, rclpy.exceptions.InvalidParameterValueException,
                rclpy.exceptions.InvalidParameterTypeException) as e:
            print(f"[{NODE_NAME}] error: {e}", file=sys.stderr)
            return 2
        executor = rclpy.executors.SingleThreadedExecutor()
        executor.add_node(node)
        rc.start_node(node)
        try:
            executor.spin()
        except (KeyboardInterrupt, rc.ExternalShutdownException):
            pass
        return 0
    finally:
        rc.close_node(node)


if __name__ == "__main__":
    sys.exit(main())
