"""launch_testing test of launch/four_bar.launch.py (estimator + simulated plant).

Runs where launch_testing / launch_ros are installed and mbfg_ros is built and sourced (colcon); it is
skipped elsewhere.  On a ROS 2 machine:

    colcon build --packages-select mbfg_ros && source install/setup.bash
    colcon test --packages-select mbfg_ros --pytest-args -k four_bar_launch && colcon test-result --verbose
    # or directly:  launch_test test/test_four_bar_launch.py

Checks: the outputs arrive at the configured rate, the services answer, /diagnostics reports, and
both processes exit cleanly (code 0) on shutdown.
"""

import os
import time
import unittest
from pathlib import Path

import pytest

pytest.importorskip(
    "launch_testing", reason="launch_testing is not installed (it comes with a ROS 2 installation: "
                             "source /opt/ros/<distro>/setup.bash); the node itself is tested by test_node.py")
launch_ros = pytest.importorskip("launch_ros", reason="launch_ros is not installed (ROS 2 installation needed)")

import launch_testing.actions  # noqa: E402
import launch_testing.asserts  # noqa: E402
import launch_testing.markers  # noqa: E402
from launch import LaunchDescription  # noqa: E402
from launch.actions import IncludeLaunchDescription  # noqa: E402
from launch.launch_description_sources import PythonLaunchDescriptionSource  # noqa: E402

# Own DDS domain, localhost discovery: parallel launch tests must not see each other.
os.environ["ROS_DOMAIN_ID"] = str(80 + os.getpid() % 20)
os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
os.environ.setdefault("ROS_LOCALHOST_ONLY", "1")

DT = 0.001   # config/four_bar.yaml
# Share of the configured rate below which the node must report overruns.  Python + GTSAM need ~0.8 ms of a
# 1 ms step for the four-bar, and four_bar_sim integrates the plant live on the same machine: a loaded 2-core
# CI runner falls short (the node then skips steps and says so in /diagnostics).  Override with
# MBFG_MIN_RATE_SHARE.
MIN_RATE_SHARE = float(os.environ.get("MBFG_MIN_RATE_SHARE", "0.5"))


def _launch_file() -> str:
    try:
        from ament_index_python.packages import get_package_share_directory
        p = Path(get_package_share_directory("mbfg_ros")) / "launch" / "four_bar.launch.py"
        if p.exists():
            return str(p)
    except Exception:
        pass
    return str(Path(__file__).resolve().parents[1] / "launch" / "four_bar.launch.py")


@pytest.mark.launch_test
@launch_testing.markers.keep_alive
def generate_test_description():
    four_bar = IncludeLaunchDescription(PythonLaunchDescriptionSource(_launch_file()),
                                        launch_arguments={"sim": "true", "use_sim_time": "false"}.items())
    return LaunchDescription([four_bar, launch_testing.actions.ReadyToTest()])


class TestFourBarRunning(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        import rclpy
        rclpy.init()
        cls.node = rclpy.create_node("four_bar_launch_test")
        # unittest runs the tests in name order: wait for the estimator before any of them
        end = time.monotonic() + 30
        while cls.node.count_publishers("/mbfg_estimator/state") == 0 and time.monotonic() < end:
            rclpy.spin_once(cls.node, timeout_sec=0.1)

    @classmethod
    def tearDownClass(cls):
        import rclpy
        cls.node.destroy_node()
        rclpy.shutdown()

    def _collect(self, msg_type, topic, seconds, qos=10):
        import rclpy
        got = []
        sub = self.node.create_subscription(msg_type, topic, lambda m: got.append((time.monotonic(), m)), qos)
        try:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                rclpy.spin_once(self.node, timeout_sec=0.05)
        finally:
            self.node.destroy_subscription(sub)
        return got

    def test_outputs_arrive_at_the_configured_rate(self, proc_output):
        from trajectory_msgs.msg import JointTrajectory
        from sensor_msgs.msg import JointState
        # wait for the first estimate (node start-up + the plant's look-ahead integration)
        first = self._collect(JointTrajectory, "/mbfg_estimator/state", 0.1)
        end = time.monotonic() + 30
        while not first and time.monotonic() < end:
            first = self._collect(JointTrajectory, "/mbfg_estimator/state", 0.5, qos=100)
        self.assertTrue(first, "no ~/state within 30 s")
        got = self._collect(JointTrajectory, "/mbfg_estimator/state", 1.0, qos=1000)
        self.assertGreater(len(got), 50)
        stamps = [m.header.stamp.sec + 1e-9 * m.header.stamp.nanosec for _, m in got]
        self.assertTrue(all(b > a for a, b in zip(stamps, stamps[1:])), "stamps not increasing")
        # the rate: counted by the node itself (a Python subscriber here cannot take 1 kHz reliably)
        from diagnostic_msgs.msg import DiagnosticArray
        diags = self._collect(DiagnosticArray, "/diagnostics", 2.5)
        est = [{kv.key: kv.value for kv in st.values} for _, m in diags for st in m.status
               if st.name.endswith(": estimator")]
        self.assertTrue(est, "no estimator diagnostics")
        rate = float(est[-1]["output_rate_hz"])
        print(f"~/state rate {rate:.0f} Hz (target {1 / DT:.0f}); solve {est[-1].get('solve_ms_mean')} ms; "
              f"latency median {est[-1].get('latency_ms_median')} ms; skipped {est[-1].get('skipped_steps')}")
        # a busy machine may not give the node the CPU for the full rate: then it must skip steps and say so
        # (overruns, skipped_steps) rather than fall further and further behind
        if rate <= MIN_RATE_SHARE / DT:
            self.assertTrue(int(est[-1]["overruns"]) > 0 and int(est[-1]["skipped_steps"]) > 0,
                            f"~/state at {rate:.0f} Hz of {1 / DT:.0f} and no overrun reported: {est[-1]}")
        m = got[-1][1]
        self.assertEqual(list(m.joint_names), ["x1", "y1", "x2", "y2", "crank"])
        self.assertEqual(len(m.points[0].accelerations), 5)
        js = self._collect(JointState, "/mbfg_estimator/joint_states", 0.5, qos=1000)
        self.assertTrue(js)
        self.assertEqual(list(js[-1][1].name), ["crank"])

    def test_services_answer(self):
        import rclpy
        from std_srvs.srv import SetBool, Trigger
        for name, srv, req in (("/mbfg_estimator/reinitialize", Trigger, Trigger.Request()),
                               ("/mbfg_estimator/set_assembly_mode", SetBool, SetBool.Request(data=False)),
                               ("/mbfg_estimator/reset", Trigger, Trigger.Request())):
            cli = self.node.create_client(srv, name)
            self.assertTrue(cli.wait_for_service(timeout_sec=20.0), name)
            fut = cli.call_async(req)
            rclpy.spin_until_future_complete(self.node, fut, timeout_sec=5.0)
            self.assertTrue(fut.done(), f"{name} did not answer")
            print(f"{name}: {fut.result().success} {fut.result().message}")
            self.node.destroy_client(cli)

    def test_diagnostics(self):
        from diagnostic_msgs.msg import DiagnosticArray
        got = self._collect(DiagnosticArray, "/diagnostics", 4.0)
        names = {st.name for _, m in got for st in m.status}
        self.assertTrue(any(n.endswith(": estimator") for n in names), names)


@launch_testing.post_shutdown_test()
class TestFourBarShutdown(unittest.TestCase):

    def test_exit_codes(self, proc_info):
        # SIGINT from launch: both nodes catch it and exit 0
        launch_testing.asserts.assertExitCodes(proc_info, allowable_exit_codes=[0])
