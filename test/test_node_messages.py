"""What the estimator node says when its inputs are not on time (a live publisher falling behind, a
recording without --clock): which clock is behind and by how much, the recording hint only on /clock
(use_sim_time), one rate-limited WARN and the `input.<stream>.behind_s` / `inputs_behind` diagnostics.
And the plant of each shipped parameter file is named for its mechanism."""

from __future__ import annotations

import re
import time

import pytest

from ros_helpers import CONFIG, CONFIG_ROBOT, STEADY_PARAMS, joint_state, rclpy_available, running_estimator, wait_until

NS = 1_000_000_000
BEHIND_S = 3.0           # the inputs' stamps are this far behind the node clock (max_input_age is 1 s)

ros = pytest.mark.skipif(not rclpy_available(), reason="rclpy and the ROS 2 message packages are not installed")


def _feed_behind(probe, clock_now_ns, seconds: float, publish_clock: bool = False):
    """Readings stamped BEHIND_S behind `clock_now_ns()` at 50 Hz for `seconds` (and /clock, if asked)."""
    from rosgraph_msgs.msg import Clock
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        now = clock_now_ns()
        if publish_clock:
            probe.pub_clock.publish(Clock(clock=joint_state(now, []).header.stamp))
        probe.pub_obs.publish(joint_state(now - int(BEHIND_S * NS), ["crank"], [0.1]))
        time.sleep(0.02)


@ros
def test_stale_inputs_on_wall_time_say_which_clock_is_behind_without_a_bag_hint(tmp_path):
    with running_estimator(tmp_path / "est.log", params=STEADY_PARAMS) as (est, probe):
        started = time.monotonic()
        _feed_behind(probe, time.time_ns, 1.0)
        d = probe.wait_diag(lambda d: int(d["rejected.stale"]) >= 5 and "input.observations.behind_s" in d, 10.0)
        assert d is not None, est.output()[-3000:]
        assert BEHIND_S - 0.5 < float(d["input.observations.behind_s"]) < BEHIND_S + 2.0, d
        _feed_behind(probe, time.time_ns, 0.6)        # inputs keep coming, late: the report says so
        d = probe.wait_diag(lambda d: int(d["inputs_behind"]) >= 1, 10.0)
        assert d is not None, est.output()[-3000:]
        time.sleep(0.5)
        log = est.output()
        elapsed = time.monotonic() - started
    stale = [line for line in log.splitlines() if "stale (" in line]
    print("\n" + "\n".join(line for line in log.splitlines() if "stale (" in line or "inputs_behind (" in line))
    assert stale, log[-3000:]
    m = re.search(r"joint_observations: stamp [0-9.]+ s is ([0-9.]+) s behind the node clock", stale[0])
    assert m and BEHIND_S - 0.5 < float(m.group(1)) < BEHIND_S + 2.0, stale[0]
    assert "wall clock" in stale[0] and "--clock" not in log, stale[0]
    behind = [line for line in log.splitlines() if "inputs_behind (" in line]
    # logged once, then at most every 10 s (the diagnostics report it every 0.2 s)
    assert 1 <= len(behind) <= 1 + elapsed // 10 and "dropped as stale" in behind[0] and "observations 3" in behind[0], behind


@ros
def test_stale_inputs_on_sim_time_give_the_recording_hint(tmp_path):
    params = dict(STEADY_PARAMS, use_sim_time=True)
    sim_now = [100 * NS]

    def clock_now():
        sim_now[0] += 20_000_000
        return sim_now[0]
    with running_estimator(tmp_path / "est.log", params=params) as (est, probe):
        ok = wait_until(lambda: (_feed_behind(probe, clock_now, 0.2, publish_clock=True)
                                 or "stale (" in est.output()), 15.0, 0.0)
        log = est.output()
    print("\n" + "\n".join(line for line in log.splitlines() if "stale (" in line or "inputs_behind (" in line))
    assert ok, log[-3000:]
    stale = next(line for line in log.splitlines() if "stale (" in line)
    assert "behind /clock" in stale and "--clock" in stale, stale


def test_each_shipped_plant_is_named_for_its_mechanism():
    """The plant section of each shipped parameter file (the node name the launch files and the demo give
    the plant) is named for the mechanism it simulates."""
    import yaml
    from mbfg_ros.ros.package_files import plant_node_name
    for config, name in ((CONFIG, "four_bar_sim"), (CONFIG_ROBOT, "pick_and_place_sim")):
        assert plant_node_name(config) == name
        doc = yaml.safe_load(config.read_text())
        mechanism = doc[f"/**/{name}"]["ros__parameters"]["mechanism"]
        assert mechanism.startswith(name[:-len("_sim")]), (config, name, mechanism)
