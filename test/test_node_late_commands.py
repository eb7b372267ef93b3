"""The estimator node (fused mode) with commands that arrive after their step was estimated: each one still in
the window replaces the held command in the steps it covers (`late_command_corrections` counts the steps
corrected; the core's side,
exactness included, is checked in test/test_late_commands.py, the routing in test/test_scheduler.py); one
older than the window and than the held command is `too_old`."""

from __future__ import annotations

import time

import numpy as np
import pytest

from ros_helpers import PublisherThread, joint_state, rclpy_available, running_estimator, stamp_ns

pytestmark = pytest.mark.skipif(not rclpy_available(), reason="rclpy and the ROS 2 message packages are not "
                                                              "installed (pip wheels or a sourced ROS 2)")

DT = 0.01
WINDOW_STEPS = 100       # 1 s
POLL_S = 0.001           # how often the feeder looks for newly estimated steps between its readings


def newest_estimated(probe) -> int:
    """The stamp of the newest ~/state the probe has received (-1 before the first)."""
    with probe.lock:
        return stamp_ns(probe.state[-1][1].header.stamp) if probe.state else -1


class LateCommandFeeder(PublisherThread):
    """Readings in time, stamped on the node clock (system time); the commands in time too until the node
    publishes estimates (its first solve takes up to a second), then each command held back until the probe
    has received the estimate of its step, so that it reaches the node after its step was estimated, however
    fast or slow the machine (a fixed delay made commands late only on a node quicker than the delay)."""

    pause_gc = True

    def __init__(self, probe, traj, mech):
        self.probe, self.traj, self.mech = probe, traj, mech
        self.stamps = []              # of the readings
        self.command_stamps = []      # of the commands published late
        super().__init__()

    def _publish_estimated_commands(self, pending):
        newest = newest_estimated(self.probe)
        while pending and pending[0][0] <= newest:
            stamp, effort = pending.pop(0)
            self.probe.pub_eff.publish(joint_state(stamp, self.mech.actuator_names, effort=effort))
            self.command_stamps.append(stamp)

    def _run(self):
        dt_ns = int(round(DT * 1e9))
        t0 = time.time_ns()
        sensors = list(self.traj.readings)
        pending = []                  # (stamp, effort) of the commands whose step is not estimated yet
        for k in range(len(self.traj.t)):
            while not self._stop.is_set():
                self._publish_estimated_commands(pending)
                d = (t0 + k * dt_ns - time.time_ns()) / 1e9
                if d <= 0:
                    break
                time.sleep(min(d, POLL_S))
            if self._stop.is_set():
                return
            self.stamps.append(t0 + k * dt_ns)
            self.probe.pub_obs.publish(joint_state(t0 + k * dt_ns, sensors,
                                                   [self.traj.readings[s][k] for s in sensors]))
            if self.command_stamps or newest_estimated(self.probe) >= 0:
                pending.append((t0 + k * dt_ns, self.traj.efforts[k]))
            else:
                self.probe.pub_eff.publish(joint_state(t0 + k * dt_ns, self.mech.actuator_names,
                                                       effort=self.traj.efforts[k]))
        # the readings have ended: the node predicts the last steps; their commands follow them
        end = time.monotonic() + 10.0
        while pending and not self._stop.is_set() and time.monotonic() < end:
            self._publish_estimated_commands(pending)
            time.sleep(POLL_S)


def test_late_commands_replace_the_held_ones_in_the_window(tmp_path):
    from mbfg_ros.model.mechanism import load_mechanism
    from mbfg_ros.sim.plant import Actuator, SimulatedPlant
    mech = load_mechanism("four_bar_crank")
    traj = SimulatedPlant(mech, dt=DT, seed=4, actuator=Actuator.ideal(mech)).simulate(5.0)
    # a window of WINDOW_STEPS (1 s) keeps the late commands in it while a busy machine stalls the node or the
    # probe for up to a second (with 10 steps of 4 ms, most of them could leave it before the node took them)
    # (max_input_age 5 s: the command older than the window below, 1.2 s, must not be merely stale.)  The node
    # waits up to 0.5 s for a step's inputs: the readings of a stalled feed still come in time (a reading
    # refused after its step was predicted counts as `late` too), the commands never do
    params = {"dt": DT, "max_input_delay": 0.5, "max_backlog": 2.0, "max_input_age": 5.0, "window": WINDOW_STEPS,
              "publish_markers": False}
    with running_estimator(tmp_path / "estimator.log", params=params) as (est, probe):
        f = LateCommandFeeder(probe, traj, mech).start()
        f.join()
        n_commands = len(f.command_stamps)
        assert n_commands > 200, (n_commands, len(f.stamps), est.output()[-3000:])
        # a command older than the window and than the held one: counted and dropped
        d0 = probe.wait_diag(lambda d: True, 10.0)
        assert d0 is not None, est.output()[-3000:]
        newest = newest_estimated(probe)
        probe.pub_eff.publish(joint_state(newest - (WINDOW_STEPS + 20) * int(DT * 1e9), mech.actuator_names,
                                          effort=[0.0]))
        d = probe.wait_diag(lambda d: int(d["rejected.too_old"]) > int(d0["rejected.too_old"]), 10.0)
        assert int(d["rejected.too_old"]) > int(d0["rejected.too_old"]), (d0, d)
        print(f"\n  {n_commands} late commands: " + ", ".join(f"{k}={d[k]}" for k in (
            "steps", "late_command_corrections", "rejected.late", "rejected.too_old", "late_readings_fused")))
        # every command came after its step was estimated: each one still in the window when the node takes it
        # corrects its own step at least (one that a burst of steps has pushed out of the window is too_old)
        assert int(d["late_command_corrections"]) > 0.5 * n_commands, d
        assert int(d["rejected.late"]) < 0.05 * n_commands, d
        S = probe.snapshot("state")
        assert all(np.all(np.isfinite(m.points[0].effort)) for _, m in S)
    assert est.proc.returncode == 0, est.output()[-3000:]
