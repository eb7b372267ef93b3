"""Prescribed motion on the estimator node over real DDS: the `prescribed_motion` topic (set-points of the actuators
whose effort kind is `prescribed`), the `prescribed_sigma` parameter and the `prescribed` diagnostics key.

The node runs as a subprocess (config/pick_and_place.yaml: the closed-loop robot at 200 Hz) in estimation mode with
motor1 in torque mode (`commanded`) and motor2 position-controlled (`prescribed`), set through the
`actuator_efforts` parameter.  A probe node in this process feeds the simulated plant's motor1 encoder, the commands
and motor2's set-points (its simulated angle), and records ~/joint_states.  Waits poll the diagnostics generously:
the machine may be busy.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from ros_helpers import (CONFIG_ROBOT, PublisherThread, joint_state, rclpy_available, running_estimator, stamp_ns,
                         wait_until)

ros = pytest.mark.skipif(not rclpy_available(), reason="rclpy and the ROS 2 message packages are not installed "
                                                       "(pip wheels or a sourced ROS 2)")

DT = 0.005
NS = 1_000_000_000
KINDS = ["motor1=commanded", "motor2=prescribed"]
# a generous wait for late inputs and a large overload bound: a busy machine must not make the node predict or skip
PARAMS = {"mode": "estimation", "actuator_efforts": KINDS, "diagnostics_period": 0.2, "max_input_delay": 0.03,
          "max_backlog": 0.5, "thread_priority": 0, "publish_markers": False}


@pytest.fixture(scope="module")
def robot():
    from mbfg_ros.model.mechanism import load_mechanism
    return load_mechanism("pick_and_place_robot")


@pytest.fixture(scope="module")
def traj(robot):
    from mbfg_ros.sim.plant import Actuator, SimulatedPlant
    return SimulatedPlant(robot, dt=DT, seed=4, actuator=Actuator.ideal(robot)).simulate(3.0)


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    with running_estimator(tmp_path_factory.mktemp("node_prescribed") / "estimator.log", config=CONFIG_ROBOT,
                           params=PARAMS) as (est, probe):
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        from sensor_msgs.msg import JointState
        probe.pub_presc = probe.node.create_publisher(JointState, "/prescribed_motion",
                                                      QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE))
        assert wait_until(lambda: probe.pub_presc.get_subscription_count() > 0, 20), est.output()[-2000:]
        yield est, probe


class RobotFeeder(PublisherThread):
    """The plant in real time: motor1's encoder on joint_observations, both commands on commanded_effort and, with
    `setpoints`, motor2's angle on prescribed_motion (a message of its own, as a position controller publishes
    it), stamped t_start + k·dt on the node clock (system time)."""

    pause_gc = True

    def __init__(self, probe, traj, robot, setpoints: bool = True):
        self.probe, self.traj, self.robot, self.setpoints = probe, traj, robot, setpoints
        self.stamps = []
        super().__init__()

    def _run(self):
        c2 = self.robot.coordinate_index("motor2")
        dt_ns = int(round(DT * NS))
        t0 = wall0 = time.time_ns()
        for k in range(len(self.traj.t)):
            if self._stop.is_set():
                break
            d = (wall0 + k * dt_ns - time.time_ns()) / NS
            if d > 0:
                time.sleep(d)
            st = t0 + k * dt_ns
            self.stamps.append(st)
            self.probe.pub_obs.publish(joint_state(st, ["motor1"], [self.traj.readings["motor1"][k]]))
            self.probe.pub_eff.publish(joint_state(st, self.robot.actuator_names, effort=self.traj.efforts[k]))
            if self.setpoints:
                self.probe.pub_presc.publish(joint_state(st, ["motor2"], [self.traj.q[k, c2]]))


def _counts(d) -> dict:
    return {k: int(v) for k, v in d.items() if k.startswith("rejected.")}


def _publish_setpoint(probe, names, values):
    probe.pub_presc.publish(joint_state(time.time_ns(), names, values))


@ros
def test_the_prescribed_actuators_effort_follows_the_applied_one_and_bad_set_points_are_refused(node, robot, traj):
    est, probe = node
    probe.clear()
    d0 = probe.wait_diag(lambda d: "prescribed" in d, 20)
    assert d0 is not None and d0["prescribed"] == "motor2: never", d0
    assert d0["actuator_efforts"] == "motor1=commanded, motor2=prescribed", d0
    before = _counts(d0)
    feeder = RobotFeeder(probe, traj, robot).start()
    try:
        # set-points the node must refuse while it estimates: a joint that is not prescribed, an unknown joint,
        # NaN, and an angle no motor of this robot reaches (ten million turns)
        assert wait_until(lambda: len(probe.snapshot("js")) > 20, 30, 0.05), est.output()[-3000:]
        for names, values in ((["motor1"], [0.1]), (["elbow"], [0.1]), (["motor2"], [math.nan]),
                              (["motor2"], [2 * math.pi * 1e7]), (["motor1", "motor2"], [0.1, math.nan])):
            _publish_setpoint(probe, names, values)
        feeder.join(30)
    finally:
        feeder.stop()
    d = probe.wait_diag(lambda d: _counts(d)["rejected.not_prescribed"] >= before["rejected.not_prescribed"] + 2, 10)
    after = _counts(d)
    grown = {k: after[k] - before[k] for k in after if after[k] != before[k]}
    assert grown.get("rejected.not_prescribed") == 2 and grown.get("rejected.unknown_joint") == 1, grown
    assert grown.get("rejected.non_finite") == 2 and grown.get("rejected.implausible_position") == 1, grown
    assert d["prescribed"].startswith("motor2: ") and d["prescribed"] != "motor2: never", d
    assert "not_prescribed (1 so far): " in est.output() and "actuator 'motor1' (prescribed: motor2)" in est.output()

    # ~/joint_states' motor2 effort against the plant's applied effort at the same stamps, after the start
    index = {st: k for k, st in enumerate(feeder.stamps)}
    pairs = []
    for _, msg in probe.snapshot("js"):
        k = index.get(stamp_ns(msg.header.stamp))
        if k is not None and k * DT >= 0.5:
            pairs.append((msg.effort[list(msg.name).index("motor2")], traj.applied[k, 1],
                          msg.effort[list(msg.name).index("motor1")], k))
    assert len(pairs) > 0.5 * (len(traj.t) - 0.5 / DT), (len(pairs), est.output()[-3000:])
    p = np.array(pairs)
    rms = float(np.sqrt(np.mean(p[:, 1] ** 2)))
    err = float(np.sqrt(np.mean((p[:, 0] - p[:, 1]) ** 2)))
    print(f"motor2 effort: RMS error {err:.3g} N·m of {rms:.3g} N·m RMS over {len(p)} estimates")
    assert err < 0.4 * rms, (err, rms)
    # torque mode: motor1's effort is its command; estimation mode does not wait for commands (its expected stream
    # is the readings), so a step estimated before its command arrived holds an earlier one (how much earlier
    # depends on the machine's load: any earlier command, never a later one nor another number)
    lag = []
    for effort, k in zip(p[:, 2], p[:, 3].astype(int)):
        same = np.nonzero(np.abs(traj.efforts[:k + 1, 0] - effort) <= 1e-9)[0]
        lag.append(k - same[-1] if same.size else -1)
    lag = np.array(lag)
    # (until the node has a command of motor1 it counts 0: on a busy machine its subscription can be matched after
    # the first commands were sent, discovery being per topic; never once a command has arrived)
    first = int(np.argmax(lag >= 0)) if (lag >= 0).any() else len(lag)
    none_yet = (p[:, 2] == 0.0) & (np.arange(len(lag)) < first)
    assert ((lag >= 0) | none_yet).all(), p[(lag < 0) & ~none_yet][:5]
    assert (lag == 0).mean() > 0.5, np.bincount(lag)
    assert est.alive()


@ros
def test_set_points_are_refused_once_the_actuator_is_commanded_and_missing_ones_are_warned(node, robot, traj):
    est, probe = node
    # prescribed but fed without set-points: the node warns
    assert probe.set_params({"prescribed_sigma": 2e-3})[0].successful
    assert not probe.set_params({"prescribed_sigma": 0.0})[0].successful
    assert probe.get_params(["prescribed_sigma"]) == [2e-3]
    feeder = RobotFeeder(probe, traj.head(int(1.5 / DT)), robot, setpoints=False).start()
    try:
        d = probe.wait_diag(lambda d: "no set-points on prescribed_motion" in d["_message"], 20)
        assert d is not None and d["state"] == "running", (d, est.output()[-3000:])
        assert "motor2" in d["_message"] and d["_level"] >= 1 and int(d["no_setpoints"]) >= 1, d
        assert wait_until(lambda: "no_setpoints (1 so far): no set-points on prescribed_motion" in est.output(), 5)
    finally:
        feeder.stop()

    # commanded now (a run-time change rebuilds the core): its set-points are refused, nothing is prescribed
    result = probe.set_params({"actuator_efforts": ["motor1=commanded", "motor2=commanded"]})[0]
    assert result.successful, result.reason
    d = probe.wait_diag(lambda d: d.get("actuator_efforts") == "motor1=commanded, motor2=commanded", 10)
    assert d is not None and "prescribed" not in d, d
    before = _counts(d)
    for _ in range(3):
        _publish_setpoint(probe, ["motor2"], [0.1])
    d = probe.wait_diag(lambda d: _counts(d)["rejected.not_prescribed"] >= before["rejected.not_prescribed"] + 3, 10)
    assert _counts(d)["rejected.not_prescribed"] == before["rejected.not_prescribed"] + 3, d
    assert est.alive()


@ros
def test_set_points_reach_the_core_as_readings_of_their_coordinates():
    """Without DDS: what `parse_prescribed_motion` makes of a message, and the σ `prescribed_sigma` gives them."""
    from mbfg_ros.estimation.efforts import effort_kinds
    from mbfg_ros.model.mechanism import load_mechanism
    from mbfg_ros.model.plausibility import InputLimits
    from mbfg_ros.ros import conversions as rc
    from mbfg_ros.ros.parameters import prescribed_sigmas
    robot = load_mechanism("pick_and_place_robot")
    prescribed = rc.prescribed_readings(robot, effort_kinds("estimation", robot, {"motor2": "prescribed"}))
    assert prescribed == {"motor2": (robot.coordinate_index("motor2"), "q:motor2")}
    limits = InputLimits(robot)
    values, problems = rc.parse_prescribed_motion(joint_state(1, ["motor2", "motor1"], [0.5, 0.2]), prescribed,
                                                  robot.actuator_names, limits)
    assert values == {"q:motor2": 0.5} and [k for k, _ in problems] == ["not_prescribed"], problems
    assert all("\n" not in text for _, text in problems)
    for msg, kind in ((joint_state(1, []), "empty"), (joint_state(1, ["motor2"]), "empty"),
                      (joint_state(1, ["motor2", "motor2"], [1.0, 1.0]), "bad_size"),
                      (joint_state(1, ["motor2"], [1.0, 2.0]), "bad_size")):
        values, problems = rc.parse_prescribed_motion(msg, prescribed, robot.actuator_names, limits)
        assert values == {} and [k for k, _ in problems] == [kind], (msg, problems)
    assert prescribed_sigmas(robot, 2e-3) == {"q:motor1": 2e-3, "q:motor2": 2e-3}
