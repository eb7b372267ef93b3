"""`four_bar_sim`: a simulated plant as a ROS 2 node (node name `four_bar_sim`).

Runs `mbfg_ros.sim.plant.SimulatedPlant` (any mechanism; the four-bar crank by default) and publishes,
every dt:

* `joint_observations` (sensor_msgs/JointState): noisy sensor readings by sensor name, encoders in
  `position`, gyroscopes in `velocity` (NaN in the field a joint does not use);
* `commanded_effort` (sensor_msgs/JointState): the commanded effort by actuator joint name (and, with
  `publish_effort_array`, `commanded_effort_array` as std_msgs/Float64MultiArray in actuator order);
* `~/truth` (sensor_msgs/JointState, all generalized coordinates: q, q̇ and the applied efforts on
  the actuated coordinates) and `~/truth_state` (trajectory_msgs/JointTrajectory: q, q̇, q̈, Q of the
  applied efforts);
* `/clock` when `publish_clock` is true: the plant is then the time source (use_sim_time on the
  other nodes) and runs at `real_time_factor`.

The commands act through an actuator model (`actuator.gain`, `actuator.coulomb`,
`actuator.coulomb_rate_scale`, `actuator.viscous`, `actuator.bias`: one number for every actuator or one
per actuator; default a realistic mismatch, `actuator.ideal:=true` applies the commands exactly), so the
applied effort of the truth differs from the command as on a real machine.

Samples are stamped on a fixed grid (t_start + k·dt, or the simulated time with `publish_clock`).
The plant is integrated ahead of time (`lookahead` seconds, or a whole `duration` of up to
PREINTEGRATED_MAX_S) so publishing keeps to the grid even though one RK4 step costs a sizeable part of a
millisecond in Python.
"""

from __future__ import annotations

if __name__ == "__main__":   # `python -m mbfg_ros.ros.sim_node`: a stop signal during the imports is a clean stop
    from mbfg_ros.ros import stop_signals
    stop_signals.install()

import collections
import math
import sys
import threading
import time
from typing import Callable, Deque

import numpy as np

import rclpy
from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import QoSProfile, ReliabilityPolicy
from rosgraph_msgs.msg import Clock as ClockMsg
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory

from mbfg_ros.ros import conversions as rc
from mbfg_ros.ros import fastloop, lifecycle
from mbfg_ros.model.mechanism import load_mechanism, resolve_mechanism_path
from mbfg_ros.sim.plant import Actuator, PlantSample, SimulatedPlant
from mbfg_ros.shown import shown

NODE_NAME = "four_bar_sim"
NS = rc.NS
SPIN_S = 1.5e-4          # the last part of each wait is spent spinning (see SimNode._loop)
# A run of `duration` is integrated before publishing up to this long (short demos and tests then cost no
# CPU for the plant while they are measured); a longer one integrates the rest just ahead while it publishes,
# as an endless run does (all of a 600-s run first took minutes of start-up and ~600 000 samples of memory).
PREINTEGRATED_MAX_S = 10.0
QOS = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)


class ConfigError(ValueError):
    """A bad parameter value at start-up; the message names the parameter."""


class LatenessStats:
    """How late each sample was published (ns after its due time), in fixed memory whatever the run's length:
    count, maximum and a histogram of BIN_NS-wide bins up to BINS·BIN_NS (later ones share a last bin), from
    which the median and p99 are read to within a bin.  (A list of every value grew the plant by ~24 kB/s at
    1 kHz: 86 MB an hour.)"""

    BIN_NS = 1_000             # 1 µs
    BINS = 20_000              # up to 20 ms; beyond, only the maximum is exact

    def __init__(self):
        self.counts = [0] * (self.BINS + 1)
        self.n = 0
        self.max_ns = 0

    def add(self, lateness_ns: int) -> None:
        i = lateness_ns // self.BIN_NS if lateness_ns > 0 else 0
        self.counts[i if i < self.BINS else self.BINS] += 1
        self.n += 1
        if lateness_ns > self.max_ns:
            self.max_ns = lateness_ns

    def percentile_ns(self, p: float) -> float:
        """The p-th percentile (0..100) as the upper edge of its bin (the maximum if beyond the bins)."""
        if not self.n:
            return math.nan
        i = int(np.searchsorted(np.cumsum(self.counts), math.ceil(p / 100.0 * self.n)))
        return float(self.max_ns) if i >= self.BINS else float(min((i + 1) * self.BIN_NS, self.max_ns))

    def summary(self) -> str:
        return (f"median {self.percentile_ns(50) / 1e6:.3f} ms, p99 {self.percentile_ns(99) / 1e6:.3f} ms, "
                f"max {self.max_ns / 1e6:.3f} ms")


class SimNode(Node):
    """See the module docstring.  `stop_requested()` (e.g. a signal came) cuts the integration ahead of
    publishing short at start-up: with a long `duration` it takes many seconds."""

    def __init__(self, stop_requested: Callable[[], bool] = lambda: False, **kwargs):
        super().__init__(NODE_NAME, **kwargs)
        self.stop_requested = stop_requested
        PD = ParameterDescriptor
        fr = lambda lo, hi: [FloatingPointRange(from_value=float(lo), to_value=float(hi), step=0.0)]  # noqa: E731
        d = self.declare_parameter
        mech_name = d("mechanism", "four_bar_crank", PD(description="Mechanism YAML path or name",
                                                        read_only=True)).value
        self.dt = d("dt", 1e-3, PD(description="Sample period [s]", read_only=True,
                                   floating_point_range=fr(1e-5, 1.0))).value
        substeps = d("substeps", 1, PD(description="RK4 substeps per dt", read_only=True,
                                       integer_range=[IntegerRange(from_value=1, to_value=1000, step=1)])).value
        seed = d("seed", 0, PD(description="Noise RNG seed", read_only=True)).value
        noise = d("noise", True, PD(description="Add sensor noise (sigma from the mechanism file)",
                                    read_only=True)).value
        sensors = d("sensors", Parameter.Type.STRING_ARRAY, PD(
            description="Sensors to publish (default: all of the mechanism's)", read_only=True)).value
        self.duration = d("duration", 0.0, PD(description="Stop after this many seconds (0 = run forever)",
                                              read_only=True, floating_point_range=fr(0.0, 1e6))).value
        self.lookahead = d("lookahead", 1.0, PD(description="Seconds integrated ahead of publishing",
                                                read_only=True, floating_point_range=fr(0.0, 60.0))).value
        self.exit_at_end = d("exit_at_end", True, PD(description="Exit when `duration` is reached")).value
        self.publish_clock = d("publish_clock", False, PD(
            description="Publish /clock with the simulated time (be the sim-time source)", read_only=True)).value
        self.clock_start = d("clock_start", 100.0, PD(description="Simulated time of the first sample when "
                                                                  "publish_clock [s] (> 0: time 0 means 'unset')",
                                                      read_only=True, floating_point_range=fr(1e-3, 1e9))).value
        self.rtf = d("real_time_factor", 1.0, PD(description="Speed of simulated time when publish_clock",
                                                  read_only=True, floating_point_range=fr(1e-3, 100.0))).value
        self.wait_for_subscribers = d("wait_for_subscribers", 0, PD(
            description="Start only when joint_observations has this many subscribers", read_only=True)).value
        self.wait_for_truth_subscribers = d("wait_for_truth_subscribers", 0, PD(
            description="Start only when ~/truth_state has this many subscribers (a recorder of the truth)",
            read_only=True)).value
        self.publish_effort_array = d("publish_effort_array", False, PD(
            description="Also publish commanded_effort_array (Float64MultiArray)")).value
        self.publish_truth = d("publish_truth", True, PD(description="Publish ~/truth and ~/truth_state")).value
        self.thread_priority = d("thread_priority", 0, PD(
            description="SCHED_FIFO priority of the publishing thread (0 = normal scheduling); at or above the "
                        "estimator's thread_priority, so that a busy machine (or the estimator) cannot starve the "
                        "plant", read_only=True, integer_range=[IntegerRange(from_value=0, to_value=99, step=1)])).value
        self.truth_decimation = d("truth_decimation", 1, PD(
            description="Publish the truth every N-th sample", read_only=True,
            integer_range=[IntegerRange(from_value=1, to_value=1000000, step=1)])).value

        # the actuator model: `actuator.<field>` = one number (every actuator) or one per actuator
        ideal = d("actuator.ideal", False, PD(
            description="Apply the commands exactly (ignores the other actuator.* parameters)", read_only=True)).value
        units = {"gain": "applied effort per unit of command", "coulomb": "Coulomb friction [N·m or N]",
                 "coulomb_rate_scale": "rate over which the Coulomb friction changes sign, tanh(rate/scale) "
                                       "[rad/s or m/s]",
                 "viscous": "viscous friction [N·m·s/rad or N·s/m]", "bias": "constant offset [N·m or N]"}
        actuator_values = {}
        for f in Actuator.FIELDS:
            p = d(f"actuator.{f}", None, PD(
                description=f"Actuator {units[f]}: one number for every actuator or a list, one per actuator "
                            f"(default {Actuator.MISMATCH[f]:g})", read_only=True, dynamic_typing=True)).value
            if p is not None:
                if isinstance(p, (bool, str)) or (not isinstance(p, (int, float)) and not all(
                        isinstance(x, (int, float)) and not isinstance(x, bool) for x in p)):
                    raise ConfigError(f"parameter 'actuator.{f}' must be a number or a list of numbers (got {shown(repr(p))})")
                actuator_values[f] = list(p) if not isinstance(p, (int, float)) else float(p)

        if self.publish_clock and self.get_parameter("use_sim_time").value:
            self.get_logger().warning("publish_clock is true: this node is the clock source, ignoring use_sim_time")
            self.set_parameters([Parameter("use_sim_time", Parameter.Type.BOOL, False)])

        try:    # a bad file: one line naming the parameter and what is wrong (as the estimator says it)
            self.mech = load_mechanism(resolve_mechanism_path(mech_name))
        except Exception as e:  # MechanismError, AssemblyError (no pose), YAML errors
            raise ConfigError(f"parameter 'mechanism' ('{mech_name}'): {e}") from None
        try:
            actuator = Actuator.from_values(self.mech, actuator_values,
                                            base=Actuator.IDEAL if ideal else Actuator.MISMATCH,
                                            label="parameter 'actuator.{}'")
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if ideal and actuator_values:
            self.get_logger().warning(f"actuator.ideal is true: ignoring actuator.{', actuator.'.join(actuator_values)}")
            actuator = Actuator.ideal(self.mech)
        self.plant = SimulatedPlant(self.mech, dt=self.dt, substeps=substeps, seed=seed, noise=noise,
                                    sensors=list(sensors) if sensors else None, actuator=actuator)
        self.sensor_names = [s.name for s in self.plant.sensors]
        self._gyro = [s.kind == "gyroscope" for s in self.plant.sensors]
        self.n_total = int(round(self.duration / self.dt)) + 1 if self.duration > 0 else None
        n_ahead = max(1, int(round(self.lookahead / self.dt)))
        if self.n_total:
            n_ahead = max(n_ahead, min(self.n_total, int(round(PREINTEGRATED_MAX_S / self.dt))))
        self.queue: Deque[PlantSample] = collections.deque()
        self.n_filled = 0
        self._fill(n_ahead)
        self.k = 0
        self.finished = threading.Event()
        self.lateness = LatenessStats()

        self.pub_obs = self.create_publisher(JointState, "joint_observations", QOS)
        self.pub_eff = self.create_publisher(JointState, "commanded_effort", QOS)
        self.pub_eff_arr = self.create_publisher(Float64MultiArray, "commanded_effort_array", QOS)
        self.pub_truth = self.create_publisher(JointState, "~/truth", QOS)
        self.pub_truth_state = self.create_publisher(JointTrajectory, "~/truth_state", QOS)
        self.pub_clock = self.create_publisher(ClockMsg, "/clock", QOS) if self.publish_clock else None
        # the inputs go out serialized from templates (only stamps and values change): converting message
        # objects is a large share of a 1 kHz loop and would delay the second input behind the first
        ns, names = len(self.sensor_names), list(self.sensor_names)
        self._obs_tpl = rc.SerializedTemplate(lambda st, x: rc.joint_state(st, names, x[:ns], x[ns:], []), 2 * ns)
        act = list(self.mech.actuator_names)
        self._eff_tpl = rc.SerializedTemplate(lambda st, x: rc.joint_state(st, act, [], [], x), len(act))
        self.t_start_ns = None
        self.done = False
        self._stop = threading.Event()
        # Publishing runs in its own thread on a sleep-until schedule (a 1 kHz rclpy timer costs a
        # large share of a core in Python and jitters); the executor only serves parameters.
        self._thread = threading.Thread(target=self._run, name="four_bar_sim", daemon=True)
        self.get_logger().info(f"simulating {self.mech.name} at dt={self.dt} s; sensors {self.sensor_names}, "
                               f"actuators {list(self.mech.actuator_names)} "
                               f"({self.plant.actuator.describe()})"
                               + (f"; {self.duration} s ({self.n_filled * self.dt:g} s integrated before publishing)"
                                  if self.duration else ""))

    def _fill(self, n):
        for i in range(n):
            if i % 1000 == 999 and self.stop_requested():
                return
            self.queue.append(self.plant.step())
            self.n_filled += 1

    def _more_to_integrate(self) -> bool:
        return not self.n_total or self.n_filled < self.n_total

    def start(self):
        # The plant stands for the physical world: it must keep its time grid whatever else runs.  Its
        # publishing thread runs under SCHED_FIFO at thread_priority, and so does this (main) thread, which
        # serves the parameters and shares the GIL with it: the publishing thread, handing the GIL over, waits
        # until this one has taken it, so this one must get a core as soon as it asks (at a lower priority a
        # busy real-time thread elsewhere stalled the plant for 0.3 s; it sleeps in rcl_wait nearly always).
        if self.thread_priority > 0:
            refused = fastloop.make_thread_realtime(self.thread_priority, threading.get_native_id())
            if refused:
                self._priority_refused(refused)
        self._thread.start()

    def _priority_refused(self, reason: str):
        self.get_logger().warning(
            f"thread_priority {self.thread_priority}: {reason}; the plant runs under normal scheduling and a busy "
            "machine can make it fall behind (allow real-time priorities with CAP_SYS_NICE or an rtprio limit, "
            "see docs/ros2_interfaces.md)")
        self.thread_priority = 0

    def stop(self):
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2.0)

    def _run(self):
        if self.thread_priority > 0:
            refused = fastloop.make_thread_realtime(self.thread_priority, threading.get_native_id())
            if refused:
                self._priority_refused(refused)
        try:
            self._loop()
        except Exception as e:  # noqa: BLE001
            if rclpy.ok():
                self.get_logger().error(f"simulation thread: {type(e).__name__}: {e}")

    def _loop(self):
        while not self._stop.is_set() and (
                self.count_subscribers("joint_observations") < self.wait_for_subscribers
                or self.pub_truth_state.get_subscription_count() < self.wait_for_truth_subscribers):
            time.sleep(0.01)
        # Sample k is due at wall time wall_start + k·dt/rtf; it is stamped with the node clock at
        # that instant (t_start + k·dt), or with the simulated time when this node owns /clock.
        wall_start = time.time_ns()
        self.t_start_ns = int(self.clock_start * NS) if self.publish_clock else self.get_clock().now().nanoseconds
        dt_wall = self.dt / (self.rtf if self.publish_clock else 1.0)
        n_ahead = max(1, int(round(self.lookahead / self.dt)))
        while not self._stop.is_set() and not self.done and rclpy.ok():
            due_ns = wall_start + int(round(self.k * dt_wall * NS))
            wait = (due_ns - time.time_ns()) / NS
            if wait > 0:
                if self._more_to_integrate() and len(self.queue) < n_ahead and wait > 0.6 * dt_wall:
                    self._fill(1)      # integrate ahead while there is time
                    continue
                # time.sleep overshoots by ~0.1 ms: sleep to just before the due time, then spin, so the
                # stamp is the publish time like a driver that stamps at acquisition
                if wait > SPIN_S:
                    time.sleep(wait - SPIN_S)
                while time.time_ns() < due_ns:
                    pass
            lateness_ns = time.time_ns() - due_ns
            if self._publish_next():
                self.lateness.add(lateness_ns)
        if self.done and self.exit_at_end:
            self.get_logger().info(f"end of the {self.duration} s simulation ({self.k} samples; publish lateness "
                                   f"{self.lateness.summary()})")
            self.finished.set()

    def _publish_next(self) -> bool:
        """Publish the next sample (False: none left, the run of `duration` is over)."""
        if not self.queue:
            if not self._more_to_integrate():
                self.done = True
                return False
            self._fill(1)
        s = self.queue.popleft()
        t_ns = self.t_start_ns + int(round(self.k * self.dt * NS))
        self.k += 1
        stamp = rc.ns_to_stamp(t_ns)
        if self.pub_clock is not None:
            self.pub_clock.publish(ClockMsg(clock=stamp))
        vals = [s.readings[n] for n in self.sensor_names]
        nan = math.nan
        obs = [nan if g else v for g, v in zip(self._gyro, vals)] + [v if g else nan for g, v in zip(self._gyro, vals)]
        obs_bytes, eff_bytes = self._obs_tpl.fill(t_ns, obs), self._eff_tpl.fill(t_ns, s.efforts)
        self.pub_obs.publish(obs_bytes)
        self.pub_eff.publish(eff_bytes)
        if self.publish_effort_array:
            self.pub_eff_arr.publish(Float64MultiArray(data=rc.float_array(s.efforts)))
        # (the last sample's truth always: it marks the end of the inputs for whoever compares)
        if self.publish_truth and ((self.k - 1) % self.truth_decimation == 0 or (not self.queue and not self._more_to_integrate())):
            eff = np.zeros(self.mech.n)
            eff[self.mech.actuated] = s.applied
            self.pub_truth.publish(rc.joint_state(stamp, self.mech.coordinate_names, s.q, s.v, eff))
            self.pub_truth_state.publish(rc.trajectory_state(stamp, "world", self.mech.coordinate_names,
                                                             s.q, s.v, s.a, s.Q))
        return True


def main(args=None) -> int:
    sys.setswitchinterval(5e-4)   # quick GIL hand-over to the publishing thread
    return lifecycle.run_node(args, lambda stop: SimNode(stop_requested=stop.is_set),
                              (ConfigError, rclpy.exceptions.InvalidParameterValueException,
                               rclpy.exceptions.InvalidParameterTypeException), NODE_NAME,
                              done=lambda node: node.finished.is_set)


if __name__ == "__main__":
    sys.exit(main())
