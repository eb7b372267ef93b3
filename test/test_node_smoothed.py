"""The estimator node with `smoothed_lag`: `~/smoothed/joint_states` and `~/smoothed/state` carry each estimate
again, stamped with its own step's time, once the window holds that many steps after it (the core's
`smoothed_estimates`, checked in test/test_smoothed.py); a lag the window cannot hold is refused at start-up."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from ros_helpers import STEADY_PARAMS, Feeder, rclpy_available, running_estimator, start_up_error, wait_until

pytestmark = pytest.mark.skipif(not rclpy_available(), reason="rclpy and the ROS 2 message packages are not "
                                                              "installed (pip wheels or a sourced ROS 2)")

LAG = 6


def test_each_estimate_comes_again_smoothed_with_its_own_stamp(tmp_path):
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import JointState
    from trajectory_msgs.msg import JointTrajectory
    from mbfg_ros.model.mechanism import load_mechanism
    from mbfg_ros.sim.plant import Actuator, SimulatedPlant
    mech = load_mechanism("four_bar_crank")
    dt = STEADY_PARAMS["dt"]
    traj = SimulatedPlant(mech, dt=dt, seed=11, actuator=Actuator.ideal(mech)).simulate(1.5)
    got = {"js": [], "state": []}
    lock = threading.Lock()

    def recorder(key):
        def record(msg):
            with lock:
                got[key].append(msg)
        return record
    params = {**STEADY_PARAMS, "mode": "estimation", "smoothed_lag": LAG}
    with running_estimator(tmp_path / "estimator.log", params=params) as (est, probe):
        qos = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)
        probe.node.create_subscription(JointState, "/mbfg_estimator/smoothed/joint_states", recorder("js"), qos)
        probe.node.create_subscription(JointTrajectory, "/mbfg_estimator/smoothed/state", recorder("state"), qos)
        assert wait_until(lambda: probe.node.count_publishers("/mbfg_estimator/smoothed/joint_states") > 0, 20)
        f = Feeder(probe, traj, dt, mech).start()
        f.join()
        assert wait_until(lambda: len(got["js"]) > 200 and len(got["state"]) > 200, 20), est.output()[-3000:]
        # (on a busy machine the node works through its inputs after the feeder stopped: until nothing more arrives)
        counts = []

        def settled():
            with lock:
                counts.append((len(got["js"]), len(got["state"]), len(probe.snapshot("js"))))
            return len(counts) > 10 and counts[-1] == counts[-11]
        assert wait_until(settled, 30, 0.05), counts[-3:]
        causal = {m.header.stamp.sec * 10 ** 9 + m.header.stamp.nanosec: m for _, m in probe.snapshot("js")}
        with lock:
            smoothed = list(got["js"])
            states = list(got["state"])
    assert est.proc.returncode == 0, est.output()[-3000:]
    stamps = [m.header.stamp.sec * 10 ** 9 + m.header.stamp.nanosec for m in smoothed]
    assert stamps == sorted(set(stamps))                          # each step once, in time order
    # on the node's grid (the feeder's stamps), and nearly all the stamps of estimates the probe saw published
    # before: on a busy machine its subscription to the causal topic may be matched a few steps after the
    # smoothed topic's (discovery is per topic), and it misses their first estimates
    dt_ns = int(round(dt * 1e9))
    sample = {s: round((s - f.stamps[0]) / dt_ns) for s in stamps}
    assert all(abs(s - f.stamps[0] - sample[s] * dt_ns) < dt_ns // 10 for s in stamps)
    published = [s for s in stamps if s in causal]
    assert len(published) >= 0.9 * len(stamps)
    assert len(smoothed) >= 0.9 * (len(causal) - LAG)
    assert [m.header.stamp for m in states[:50]] == [m.header.stamp for m in smoothed[:50]]
    assert list(smoothed[0].name) == list(causal[published[0]].name)
    # the readings after each step moved it: the smoothed rate is nearer the truth than the causal one
    c = next(int(u.coordinate) for u in mech.sensors if u.kind == "encoder")
    j = list(smoothed[0].name).index(next(u.name for u in mech.sensors if u.kind == "encoder"))
    pairs = [(m.velocity[j], causal[s].velocity[j], traj.v[sample[s], c])
             for m, s in zip(smoothed, stamps) if s in causal and 0 <= sample[s] < len(traj.t)][50:]
    assert len(pairs) > 150
    err = np.array(pairs)
    smoothed_rms = np.sqrt(np.mean((err[:, 0] - err[:, 2]) ** 2))
    causal_rms = np.sqrt(np.mean((err[:, 1] - err[:, 2]) ** 2))
    assert smoothed_rms < causal_rms, (smoothed_rms, causal_rms)


def test_a_lag_the_window_cannot_hold_is_refused_at_start_up():
    assert "parameter 'smoothed_lag' must be an integer from 0 to window − 1 = 7" in \
        start_up_error("mode:=estimation", "window:=8", "smoothed_lag:=8")
