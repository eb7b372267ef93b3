"""The estimator node (fused mode) with commands that arrive after their step was estimated: each one still in
the window replaces the held command in the steps it covers (`late_command_corrections` counts the steps
corrected; the core's side,
exactness included, is checked in test/test_late_commands.py, the routing in test/test_scheduler.py); one
older than the window and than the held command is `too_old`."""

from __future__ import annotations

import time

import numpy as np
import pytest

from ros_helpers import PublisherThread, joint_state, rclpy_available, running_estimator, stamp_ns, wait_until

pytestmark = pytest.mark.skipif(not rclpy_available(), reason="rclpy and the ROS 2 message packages are not "
                                                              "installed (pip wheels or a sourced ROS 2)")

DT = 0.004
DELAY_STEPS = 3          # each command arrives 12 ms after its stamp: its step (input wait 4 ms) is estimated


class LateCommandFeeder(PublisherThread):
    """Readings in time, each command `DELAY_STEPS` steps late, stamped on the node clock (system time)."""

    def __init__(self, probe, traj, mech):
        self.probe, self.traj, self.mech = probe, traj, mech
        self.stamps = []
        super().__init__()

    def _run(self):
        dt_ns = int(round(DT * 1e9))
        t0 = time.time_ns()
        sensors = list(self.traj.readings)
        for k in range(len(self.traj.t)):
            if self._stop.is_set():
                break
            d = (t0 + k * dt_ns - time.time_ns()) / 1e9
            if d > 0:
                time.sleep(d)
            self.stamps.append(t0 + k * dt_ns)
            self.probe.pub_obs.publish(joint_state(t0 + k * dt_ns, sensors,
                                                   [self.traj.readings[s][k] for s in sensors]))
            j = k - DELAY_STEPS
            if j >= 0:
                self.probe.pub_eff.publish(joint_state(t0 + j * dt_ns, self.mech.actuator_names,
                                                       effort=self.traj.efforts[j]))


def test_late_commands_replace_the_held_ones_in_the_window(tmp_path):
    from mbfg_ros.model.mechanism import load_mechanism
    from mbfg_ros.sim.plant import Actuator, SimulatedPlant
    mech = load_mechanism("four_bar_crank")
    traj = SimulatedPlant(mech, dt=DT, seed=4, actuator=Actuator.ideal(mech)).simulate(2.0)
    params = {"dt": DT, "max_input_delay": 0.004, "max_backlog": 0.5}
    with running_estimator(tmp_path / "estimator.log", params=params) as (est, probe):
        f = LateCommandFeeder(probe, traj, mech).start()
        f.join()
        assert wait_until(lambda: len(probe.snapshot("state")) > 200, 20), est.output()[-3000:]
        # a command older than the window and than the held one: counted and dropped
        newest = stamp_ns(probe.snapshot("state")[-1][1].header.stamp)
        probe.pub_eff.publish(joint_state(newest - 30 * int(DT * 1e9), mech.actuator_names, effort=[0.0]))
        d = probe.wait_diag(lambda d: int(d["rejected.too_old"]) >= 1, 10.0)
        assert d is not None, probe.latest_diag()
        print("\n  " + ", ".join(f"{k}={d[k]}" for k in ("steps", "late_command_corrections", "rejected.late",
                                                          "rejected.too_old", "late_readings_fused")))
        n_commands = len(f.stamps) - DELAY_STEPS
        # each late command corrects its own step at least (under load a command may come before its step is
        # estimated: then it is simply in time)
        assert int(d["late_command_corrections"]) > 0.25 * n_commands, d
        assert int(d["rejected.late"]) < 0.05 * n_commands, d
        S = probe.snapshot("state")
        assert all(np.all(np.isfinite(m.points[0].effort)) for _, m in S)
    assert est.proc.returncode == 0, est.output()[-3000:]
