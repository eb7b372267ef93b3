"""The estimator node with `publish_covariance`: `~/joint_states_covariance` (std_msgs/Float64MultiArray) carries
the full covariance of `~/joint_states`' angle, rate and effort, row-major, its two dimensions labelled with the
row/column order; its diagonal is the 1σ² that `~/joint_states_stddev` publishes for the same step (its
consistency with the errors is checked in the core: test/test_joint_covariance.py)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from ros_helpers import Feeder, rclpy_available, running_estimator, wait_until

pytestmark = pytest.mark.skipif(not rclpy_available(), reason="rclpy and the ROS 2 message packages are not "
                                                              "installed (pip wheels or a sourced ROS 2)")

DT = 0.004


def test_joint_states_covariance_is_published_labelled_and_matches_the_stddev(tmp_path):
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from std_msgs.msg import Float64MultiArray
    from mbfg_ros.model.mechanism import load_mechanism
    from mbfg_ros.sim.plant import Actuator, SimulatedPlant
    mech = load_mechanism("four_bar_crank")
    traj = SimulatedPlant(mech, dt=DT, seed=9, actuator=Actuator.ideal(mech)).simulate(1.5)
    covs, lock = [], threading.Lock()

    def record(msg):
        with lock:
            covs.append(msg)
    params = {"dt": DT, "max_input_delay": 0.03, "max_backlog": 0.5, "publish_stddev": True, "publish_covariance": True}
    with running_estimator(tmp_path / "estimator.log", params=params) as (est, probe):
        probe.node.create_subscription(Float64MultiArray, "/mbfg_estimator/joint_states_covariance", record,
                                       QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE))
        assert wait_until(lambda: probe.node.count_publishers("/mbfg_estimator/joint_states_covariance") > 0, 20)
        f = Feeder(probe, traj, DT, mech).start()
        f.join()
        assert wait_until(lambda: len(covs) > 200 and len(probe.snapshot("stddev")) > 200, 20), est.output()[-3000:]
        with lock:
            C = list(covs)
        sd = probe.snapshot("stddev")
        names = list(sd[0][1].name)
        m = len(names)
        order = ",".join(f"{fld}/{nm}" for fld in ("position", "velocity", "effort") for nm in names)
        msg = C[0]
        assert [d.label for d in msg.layout.dim] == [order, order]
        assert [d.size for d in msg.layout.dim] == [3 * m, 3 * m]
        assert [d.stride for d in msg.layout.dim] == [9 * m * m, 3 * m]
        # its diagonal is the σ² of ~/joint_states_stddev of the same step (published just before it; matched
        # by value: a message dropped by a busy subscriber must not shift a pairing by order)
        by_sigma = {tuple(np.round(np.concatenate((x.position, x.velocity, x.effort)), 12)): x for _, x in sd}
        matched = 0
        for P_msg in C:
            P = np.array(P_msg.data).reshape(3 * m, 3 * m)
            assert np.allclose(P, P.T) and np.all(np.diag(P) >= 0.0)
            assert np.min(np.linalg.eigvalsh(P[:2 * m, :2 * m])) > 0.0      # angles and rates: positive definite
            matched += tuple(np.round(np.sqrt(np.diag(P)), 12)) in by_sigma
        assert matched >= 0.9 * len(C), (matched, len(C))
    assert est.proc.returncode == 0, est.output()[-3000:]
