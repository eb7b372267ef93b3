"""Helpers for the ROS 2 integration tests: node subprocesses, an in-process probe node, waits.

Every test that starts ROS nodes uses its own ROS_DOMAIN_ID and keeps discovery on localhost.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.setswitchinterval(5e-4)   # the feeder thread must not wait 5 ms for the GIL
CONFIG = REPO / "config" / "four_bar.yaml"
CONFIG_ROBOT = REPO / "config" / "pick_and_place.yaml"


def rclpy_available() -> bool:
    try:
        import rclpy  # noqa: F401
        from sensor_msgs.msg import JointState  # noqa: F401
        from std_srvs.srv import Trigger  # noqa: F401
        from trajectory_msgs.msg import JointTrajectory  # noqa: F401
        return True
    except Exception:
        return False


_domain_lock = threading.Lock()
_domain_next = [0]


def fresh_domain_id() -> int:
    """A ROS_DOMAIN_ID for one test: distinct per test in this process, spread by pid across processes
    (xdist workers, concurrent test runs)."""
    with _domain_lock:
        _domain_next[0] += 1
        return 1 + (os.getpid() * 7 + _domain_next[0]) % 100   # domain ids 1..100 (≤ 101 for localhost)


def ros_env(domain_id: int) -> Dict[str, str]:
    env = dict(os.environ)
    env.update(ROS_DOMAIN_ID=str(domain_id), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST", ROS_LOCALHOST_ONLY="1",
               PYTHONUNBUFFERED="1", RCUTILS_COLORIZED_OUTPUT="0")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def set_domain(domain_id: int):
    """Set this process's domain before rclpy.init (each test inits its own context)."""
    os.environ.update(ros_env(domain_id))


class RosProcess:
    """A ROS node run as `python -m <module> --ros-args ...`, output captured to a log file."""

    def __init__(self, module: str, ros_args: List[str], domain_id: int, log_path: Path,
                 extra_env: Optional[Dict[str, str]] = None):
        env = ros_env(domain_id)
        env.update(extra_env or {})
        self.log_path = Path(log_path)
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", module, "--ros-args", *ros_args],
                                     stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=str(REPO),
                                     start_new_session=True)
        _children.append(self)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()
        return self.proc.returncode


def estimator_process(domain_id: int, log_path: Path, params: Optional[Dict[str, object]] = None,
                      config: Path = CONFIG, remaps: Optional[Dict[str, str]] = None,
                      extra_env=None) -> RosProcess:
    args = ["--params-file", str(config)]
    for k, v in (params or {}).items():
        args += ["-p", f"{k}:={_param_text(v)}"]
    for a, b in (remaps or {}).items():
        args += ["-r", f"{a}:={b}"]
    return RosProcess("mbfg_ros.node", args, domain_id, log_path, extra_env)


def _param_text(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_param_text(x) for x in v) + "]"
    return str(v)


def wait_until(pred: Callable[[], bool], timeout: float, period: float = 0.01) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(period)
    return pred()


class Probe:
    """An rclpy node in this process (own context) spinning in a background thread: publishes inputs,
    records outputs with their receive time, calls services and sets parameters."""

    def __init__(self, domain_id: int, node_name: Optional[str] = None, ns: str = "/mbfg_estimator"):
        set_domain(domain_id)
        import rclpy
        from rclpy.context import Context
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        from diagnostic_msgs.msg import DiagnosticArray
        from sensor_msgs.msg import JointState
        from std_msgs.msg import Float64MultiArray
        from trajectory_msgs.msg import JointTrajectory
        from visualization_msgs.msg import MarkerArray
        from rosgraph_msgs.msg import Clock

        self.rclpy = rclpy
        self.context = Context()
        rclpy.init(context=self.context, domain_id=domain_id)
        self.node = rclpy.create_node(node_name or f"mbfg_test_probe_{os.getpid()}_{domain_id}", context=self.context)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.ns = ns
        rel = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)
        self.lock = threading.Lock()
        self.js: List = []        # (recv_ns, msg)
        self.state: List = []
        self.markers: List = []
        self.diag: List = []
        from mbfg_ros import fastloop
        grp = fastloop.DetachedCallbackGroup()
        subs = []
        for typ, topic, lst in ((JointState, f"{ns}/joint_states", self.js), (JointTrajectory, f"{ns}/state", self.state),
                                (MarkerArray, f"{ns}/markers", self.markers), (DiagnosticArray, "/diagnostics", self.diag)):
            cb = (lambda lst_: (lambda m: self._rec(lst_, m)))(lst)
            subs.append((self.node.create_subscription(typ, topic, cb, rel, callback_group=grp), cb))
        self.extra_subs = subs
        self._loop = fastloop.FastLoop(self.node, subs, [], lock=threading.Lock())
        self._loop.start()
        self.pub_obs = self.node.create_publisher(JointState, "/joint_observations", rel)
        self.pub_eff = self.node.create_publisher(JointState, "/commanded_effort", rel)
        self.pub_eff_arr = self.node.create_publisher(Float64MultiArray, "/commanded_effort_array", rel)
        self.pub_clock = self.node.create_publisher(Clock, "/clock", rel)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._spin, daemon=True)
        self.thread.start()

    def _spin(self):
        while not self._stop.is_set() and self.context.ok():
            try:
                self.executor.spin_once(timeout_sec=0.05)
            except Exception:
                if self._stop.is_set():
                    break
                raise

    def _rec(self, lst, msg):
        t = time.time_ns()
        with self.lock:
            lst.append((t, msg))

    def clear(self):
        with self.lock:
            self.js.clear()
            self.state.clear()
            self.markers.clear()
            self.diag.clear()

    def snapshot(self, which: str) -> List:
        with self.lock:
            return list(getattr(self, which))

    # -- discovery --------------------------------------------------------------------------
    def wait_for_node(self, timeout: float = 20.0) -> bool:
        """The estimator subscribes to our inputs and publishes to our subscriptions."""
        return wait_until(lambda: self.pub_obs.get_subscription_count() > 0
                          and self.pub_eff.get_subscription_count() > 0
                          and self.node.count_publishers(f"{self.ns}/state") > 0, timeout)

    # -- services / parameters ---------------------------------------------------------------
    def call(self, srv_type, name: str, request, timeout: float = 5.0):
        cli = self.node.create_client(srv_type, name)
        try:
            if not cli.wait_for_service(timeout_sec=timeout):
                raise TimeoutError(f"service {name} not available")
            t0 = time.monotonic()
            fut = cli.call_async(request)
            if not wait_until(fut.done, timeout, 0.001):
                raise TimeoutError(f"service {name} did not answer in {timeout} s")
            return fut.result(), time.monotonic() - t0
        finally:
            self.node.destroy_client(cli)

    def set_params(self, params: Dict[str, object], node: Optional[str] = None, timeout: float = 5.0):
        from rcl_interfaces.srv import SetParameters
        from rclpy.parameter import Parameter
        req = SetParameters.Request()
        req.parameters = [Parameter(k, value=v).to_parameter_msg() for k, v in params.items()]
        res, _ = self.call(SetParameters, f"{node or self.ns}/set_parameters", req, timeout)
        return res.results

    def get_params(self, names: List[str], node: Optional[str] = None, timeout: float = 5.0):
        from rcl_interfaces.srv import GetParameters
        from rclpy.parameter import parameter_value_to_python
        req = GetParameters.Request()
        req.names = list(names)
        res, _ = self.call(GetParameters, f"{node or self.ns}/get_parameters", req, timeout)
        return [parameter_value_to_python(v) for v in res.values]

    # -- diagnostics ---------------------------------------------------------------------------
    def latest_diag(self, after_ns: int = 0) -> Optional[Dict[str, str]]:
        for t, m in reversed(self.snapshot("diag")):
            if t < after_ns:
                break
            for st in m.status:
                if "estimator" in st.name:
                    d = {kv.key: kv.value for kv in st.values}
                    d["_level"] = int.from_bytes(st.level, "little") if isinstance(st.level, bytes) else int(st.level)
                    d["_message"] = st.message
                    return d
        return None

    def wait_diag(self, pred: Callable[[Dict[str, str]], bool], timeout: float = 10.0) -> Optional[Dict[str, str]]:
        out = [None]

        def ok():
            d = self.latest_diag()
            out[0] = d
            return d is not None and pred(d)
        wait_until(ok, timeout, 0.05)
        return out[0]

    def close(self):
        self._loop.stop()
        self._stop.set()
        self.thread.join(2.0)
        try:
            self.executor.shutdown(timeout_sec=1.0)
            self.node.destroy_node()
        finally:
            if self.context.ok():
                self.rclpy.shutdown(context=self.context)


def stamp_ns(stamp) -> int:
    return int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec)


def joint_state(stamp_ns_: int, names, position=(), velocity=(), effort=()):
    from sensor_msgs.msg import JointState
    from builtin_interfaces.msg import Time
    m = JointState()
    m.header.stamp = Time(sec=int(stamp_ns_ // 1_000_000_000), nanosec=int(stamp_ns_ % 1_000_000_000))
    m.name = list(names)
    m.position = [float(x) for x in position]
    m.velocity = [float(x) for x in velocity]
    m.effort = [float(x) for x in effort]
    return m


# ---------------------------------------------------------------------------------------------
class ShimEstimator:
    """DEVELOPMENT ONLY stand-in for mbfg_ros.estimator.FixedLagEstimator (same contract): RK4 on
    forward dynamics plus a crude encoder correction.  Selected with MBFG_ESTIMATOR_IMPL."""

    def __init__(self, mech, config):
        self.mech, self.config = mech, config
        self.reset()

    def reset(self):
        self.q = self.v = None
        self.last_obs = {}

    def _solve(self, assembly_mode):
        from mbfg_ros import kinematics
        mech = self.mech
        q = np.array(mech.q0 if self.q is None else self.q)
        fixed, vals = [], []
        for s in mech.sensors:
            if s.kind == "encoder" and s.name in self.last_obs:
                fixed.append(s.coordinate)
                q[s.coordinate] = self.last_obs[s.name]
        sol = kinematics.solve_positions_on_mode(mech, q, fixed, assembly_mode)
        return sol

    def reinitialize(self, assembly_mode=None):
        from mbfg_ros import kinematics
        sol = self._solve(assembly_mode or self.config.assembly_mode)
        self.q = sol.q
        self.v = kinematics.solve_velocities(self.mech, self.q, v_guess=self.v if self.v is not None else None)
        return sol.assembly_mode, sol.residual

    def step(self, t, efforts=None, observations=None):
        import time as _t
        from mbfg_ros import dynamics, kinematics
        from mbfg_ros.estimate import Estimate
        t0 = _t.perf_counter()
        mech = self.mech
        if observations:
            self.last_obs.update(observations)
        tau = np.zeros(len(mech.actuated)) if efforts is None else np.nan_to_num(np.asarray(efforts, float))
        Q = mech.generalized_forces(tau)
        status = "ok"
        if self.q is None:
            self.reinitialize()
            self.v = np.zeros(mech.n)
            status = "initialized"
        else:
            h = self.config.dt
            f = lambda q, v: dynamics.forward_dynamics(mech, q, v, Q)  # noqa: E731
            q, v = self.q, self.v
            a1 = f(q, v)
            a2 = f(q + 0.5 * h * v, v + 0.5 * h * a1)
            a3 = f(q + 0.5 * h * (v + 0.5 * h * a1), v + 0.5 * h * a2)
            a4 = f(q + h * (v + 0.5 * h * a2), v + h * a3)
            q = q + h * v + h * h / 6 * (a1 + a2 + a3)
            v = v + h / 6 * (a1 + 2 * a2 + 2 * a3 + a4)
            if observations:
                for s in mech.sensors:
                    if s.kind == "encoder" and s.name in observations:
                        q[s.coordinate] += 0.05 * (observations[s.name] - q[s.coordinate])
            q = kinematics.solve_positions(mech, q).q
            v = kinematics.solve_velocities(mech, q, v_guess=v)
            self.q, self.v = q, v
        a = dynamics.forward_dynamics(mech, self.q, self.v, Q)
        return Estimate(t=t, q=self.q.copy(), v=self.v.copy(), a=a, Q=Q, efforts=tau,
                        assembly_mode=mech.assembly_mode(self.q),
                        constraint_residual=float(np.abs(mech.constraints.phi(self.q)).max(initial=0)),
                        solve_time=_t.perf_counter() - t0, status=status)


class Feeder:
    """Publishes a plant trajectory as the node's inputs in real time from a thread: observations
    (`joint_observations`) and commanded efforts (`commanded_effort`), stamped t_start + k·dt on the
    node clock (system time).  `stamps[k]` gives the stamp of sample k for comparisons with the truth."""

    def __init__(self, probe: "Probe", traj, dt: float, mech, observations: bool = True, efforts: bool = True,
                 t_start_ns: Optional[int] = None, clock: bool = False, rate: float = 1.0):
        self.probe, self.traj, self.dt, self.mech = probe, traj, dt, mech
        self.observations, self.efforts, self.clock, self.rate = observations, efforts, clock, rate
        self.t_start_ns = t_start_ns
        self.stamps: List[int] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self._stop = threading.Event()

    def start(self):
        self.thread.start()
        return self

    def stop(self):
        self._stop.set()
        self.thread.join(10)

    def join(self, timeout=60):
        self.thread.join(timeout)

    def _run(self):
        from rosgraph_msgs.msg import Clock
        from builtin_interfaces.msg import Time
        sensors = list(self.traj.readings)
        gyro = {s.name for s in self.mech.sensors if s.kind == "gyroscope"}
        dt_ns = int(round(self.dt * 1e9))
        t0 = self.t_start_ns if self.t_start_ns is not None else time.time_ns()
        wall0 = time.time_ns()
        for k in range(len(self.traj.t)):
            if self._stop.is_set():
                break
            due = wall0 + int(k * dt_ns / self.rate)
            d = (due - time.time_ns()) / 1e9
            if d > 0:
                time.sleep(d)
            st = t0 + k * dt_ns
            self.stamps.append(st)
            if self.clock:
                self.probe.pub_clock.publish(Clock(clock=Time(sec=st // 1_000_000_000, nanosec=st % 1_000_000_000)))
            if self.observations:
                pos = [float("nan") if s in gyro else self.traj.readings[s][k] for s in sensors]
                vel = [self.traj.readings[s][k] if s in gyro else float("nan") for s in sensors]
                self.probe.pub_obs.publish(joint_state(st, sensors, pos, vel if gyro else []))
            if self.efforts:
                self.probe.pub_eff.publish(joint_state(st, self.mech.actuator_names, effort=self.traj.efforts[k]))


_children: List[RosProcess] = []


def _cleanup_children():
    for p in _children:
        try:
            if p.alive():
                p.proc.kill()
        except Exception:
            pass


atexit.register(_cleanup_children)
