"""The estimator node with `publish_covariance`: `~/joint_states_covariance` (std_msgs/Float64MultiArray) carries
the full covariance of `~/joint_states`' angle, rate and effort, row-major, its two dimensions labelled with the
row/column order; its diagonal is the 1σ² that `~/joint_states_stddev` publishes for the same step, and it is
consistent with the actual errors over DDS."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from ros_helpers import Feeder, Probe, estimator_process, fresh_domain_id, rclpy_available, stamp_ns, wait_until

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
    dom = fresh_domain_id()
    est = estimator_process(dom, tmp_path / "estimator.log",
                            params={"dt": DT, "max_input_delay": 0.03, "max_backlog": 0.5, "publish_stddev": True,
                                    "publish_covariance": True})
    probe = Probe(dom)
    covs, lock = [], threading.Lock()

    def record(msg):
        with lock:
            covs.append(msg)
    probe.node.create_subscription(Float64MultiArray, "/mbfg_estimator/joint_states_covariance", record,
                                   QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE))
    try:
        assert probe.wait_for_node(40), est.output()
        assert wait_until(lambda: probe.node.count_publishers("/mbfg_estimator/joint_states_covariance") > 0, 20)
        f = Feeder(probe, traj, DT, mech).start()
        f.join()
        assert wait_until(lambda: len(covs) > 200 and len(probe.snapshot("stddev")) > 200, 20), est.output()[-3000:]
        with lock:
            C = list(covs)
        sd = probe.snapshot("stddev")
        js = {stamp_ns(m.header.stamp): m for _, m in probe.snapshot("js")}
        names = list(sd[0][1].name)
        m = len(names)
        order = ",".join(f"{fld}/{nm}" for fld in ("position", "velocity", "effort") for nm in names)
        msg = C[0]
        assert [d.label for d in msg.layout.dim] == [order, order]
        assert [d.size for d in msg.layout.dim] == [3 * m, 3 * m]
        assert [d.stride for d in msg.layout.dim] == [9 * m * m, 3 * m]
        # published right after ~/joint_states_stddev of the same step: the i-th of each belong together
        index = {s_: k for k, s_ in enumerate(f.stamps)}
        c = int(mech.actuated[0])
        z2, matched = [], 0
        for (_, s), P_msg in zip(sd, C):
            P = np.array(P_msg.data).reshape(3 * m, 3 * m)
            assert np.allclose(P, P.T)
            sigma = np.concatenate((s.position, s.velocity, s.effort))
            matched += np.allclose(np.sqrt(np.diag(P)), sigma, rtol=1e-6, atol=1e-12)
            st = stamp_ns(s.header.stamp)
            k = index.get(st)
            if k is not None and k * DT >= 0.3 and st in js:
                j = js[st]
                i = names.index(mech.actuator_names[0])
                e = np.array([j.position[i] - traj.q[k, c], j.velocity[i] - traj.v[k, c]])
                S = P[np.ix_([i, m + i], [i, m + i])]
                z2.append(e @ np.linalg.solve(S, e))
        assert matched >= 0.95 * min(len(sd), len(C)), (matched, len(sd), len(C))
        # (angle, rate) NEES of the crank over DDS: 2 when consistent (the node tests' loose bounds)
        assert len(z2) > 100 and 0.4 < np.mean(z2) / 2 < 5.0, np.mean(z2) / 2
    finally:
        probe.close()
        assert est.stop() == 0, est.output()[-3000:]
