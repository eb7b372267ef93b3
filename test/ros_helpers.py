"""Helpers for the ROS 2 integration tests: node subprocesses, an in-process probe node, waits.

Every test that starts ROS nodes uses its own ROS_DOMAIN_ID and keeps discovery on localhost.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import ctypes
import fcntl
import gc
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional


REPO = Path(__file__).resolve().parents[1]
TEST_DIR = Path(__file__).resolve().parent
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
# Test runs of several worktrees (or CI jobs) on one machine: two tests on one domain would take each other's
# inputs and diagnostics (estimates radians off, counters of messages never sent).  Each domain id in use is
# reserved by an flock on a file here, released when this process ends (also when killed) or when it holds
# DOMAINS_HELD newer ones.
DOMAIN_LOCK_DIR = Path(tempfile.gettempdir()) / "mbfg_ros_test_domains"
DOMAINS_HELD = 16
_held_domains: "collections.OrderedDict[int, int]" = collections.OrderedDict()   # domain id -> lock file fd


from mbfg_ros.ros.demo import ros_env  # noqa: E402  (the demo and the tests start nodes the same way)


def start_up_error(*overrides: str) -> str:
    """The `ConfigError` message of an estimator node built in this process from config/four_bar.yaml with the
    `-p` overrides (NAME:=VALUE); fails the test if the node starts."""
    import rclpy
    from rclpy.context import Context
    from mbfg_ros.ros import node as N
    from mbfg_ros.ros.parameters import ConfigError
    args = ["--ros-args", "--params-file", str(CONFIG)]
    for override in overrides:
        args += ["-p", override]
    ctx = Context()
    rclpy.init(args=args, context=ctx, domain_id=fresh_domain_id())
    try:
        try:
            node = N.EstimatorNode(context=ctx)
        except ConfigError as e:
            return str(e)
        node.destroy_node()
        raise AssertionError(f"the node started with {list(overrides)}")
    finally:
        rclpy.shutdown(context=ctx)


@contextlib.contextmanager
def estimator_node_here(*overrides: str):
    """An estimator node built in this process (not spun) from the `-p` overrides (NAME:=VALUE), on a fresh domain;
    destroyed and its context shut down after."""
    import rclpy
    from rclpy.context import Context
    from mbfg_ros.ros import node as N
    args = ["--ros-args"]
    for override in overrides:
        args += ["-p", override]
    ctx = Context()
    rclpy.init(args=args, context=ctx, domain_id=fresh_domain_id())
    try:
        node = N.EstimatorNode(context=ctx)
        try:
            yield node
        finally:
            node.destroy_node()
    finally:
        rclpy.shutdown(context=ctx)


def fresh_domain_id() -> int:
    """A ROS_DOMAIN_ID for one test (1..100; ≤ 101 for localhost): distinct per test in this process, and
    from those of the other test processes on this machine that use this function (reserved: DOMAIN_LOCK_DIR)."""
    with _domain_lock:
        DOMAIN_LOCK_DIR.mkdir(mode=0o777, exist_ok=True)
        _domain_next[0] += 1
        start = os.getpid() * 7 + _domain_next[0]
        for i in range(100):
            domain = 1 + (start + i) % 100
            if domain in _held_domains:
                continue
            fd = os.open(DOMAIN_LOCK_DIR / f"{domain}.lock", os.O_CREAT | os.O_RDWR, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:               # another test process has it
                os.close(fd)
                continue
            _held_domains[domain] = fd
            while len(_held_domains) > DOMAINS_HELD:
                os.close(_held_domains.popitem(last=False)[1])      # the oldest: its test is over
            _domain_next[0] += i
            return domain
        raise RuntimeError(f"every ROS domain id 1..100 is in use by test processes on this machine "
                           f"(locks in {DOMAIN_LOCK_DIR})")


def set_domain(domain_id: int):
    """Set this process's domain before rclpy.init (each test inits its own context)."""
    os.environ.update(ros_env(domain_id))


_prctl = ctypes.CDLL(None, use_errno=True).prctl     # looked up before any fork (a child must not load it)
PR_SET_PDEATHSIG = 1


def _dies_with_this_process(then: Optional[Callable[[], None]]) -> Callable[[], None]:
    """A preexec_fn: the child gets SIGTERM (a clean stop) when this process dies, also when it is killed (a
    test run stopped by a timeout would otherwise leave its nodes running, in sessions of their own, on a
    domain that the next run may take), then runs `then`."""
    def preexec():
        _prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if then is not None:
            then()
    return preexec


class RosProcess:
    """A ROS node run as `python -m <module> --ros-args ...`, output captured to a log file; it stops when
    this process dies."""

    def __init__(self, module: str, ros_args: List[str], domain_id: int, log_path: Path,
                 extra_env: Optional[Dict[str, str]] = None, preexec_fn: Optional[Callable[[], None]] = None):
        env = ros_env(domain_id)
        env.update(extra_env or {})
        self.log_path = Path(log_path)
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", module, "--ros-args", *ros_args],
                                     stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=str(REPO),
                                     start_new_session=True, preexec_fn=_dies_with_this_process(preexec_fn))
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
                      extra_env=None, preexec_fn: Optional[Callable[[], None]] = None,
                      step_cost: Optional[float] = None) -> RosProcess:
    """The estimator node; with `step_cost` [s] its core's every step lasts at least that long (wall clock:
    test/slow_core_node.py), so that a `dt` below it overloads the node on any machine."""
    args = ["--params-file", str(config)]
    for k, v in (params or {}).items():
        args += ["-p", f"{k}:={_param_text(v)}"]
    for a, b in (remaps or {}).items():
        args += ["-r", f"{a}:={b}"]
    if step_cost is None:
        return RosProcess("mbfg_ros.ros.node", args, domain_id, log_path, extra_env, preexec_fn)
    env = {"MBFG_TEST_STEP_COST_S": repr(float(step_cost)),
           "PYTHONPATH": str(TEST_DIR) + os.pathsep + ros_env(domain_id)["PYTHONPATH"], **(extra_env or {})}
    return RosProcess("slow_core_node", args, domain_id, log_path, env, preexec_fn)


# Test-only overrides of config/four_bar.yaml: a 4 ms step, a generous wait for late inputs and a large
# overload bound keep the checks deterministic on a busy machine; fast diagnostics keep the tests short.
# max_backlog 0.5 s: a loaded machine must not make the node skip steps (the overload tests use
# OVERLOAD_PARAMS for that).
STEADY_DT = 0.004
STEADY_PARAMS = {"dt": STEADY_DT, "diagnostics_period": 0.2, "max_input_delay": 0.03, "max_backlog": 0.5}

# A step far below the solve time: the node cannot keep up and skips ahead.  (0.2 ms was enough before the
# compiled kernel: the node now keeps up with a 5-kHz feed; at 0.1 ms the feed asks 10 k steps a second.)
# Whether the real core is slower than 0.1 ms depends on the machine: `overloaded_estimator` makes sure.
OVERLOAD_DT = 0.0001
OVERLOAD_PARAMS = {"max_backlog": 0.05, "max_input_delay": 0.001}
# The least wall time of a core step in `overloaded_estimator`: 30 × OVERLOAD_DT, 3 × a 1-ms step.
OVERLOAD_STEP_COST = 0.003


@contextlib.contextmanager
def running_estimator(log_path: Path, **kwargs):
    """An estimator node (`estimator_process`, keyword arguments as there) and a `Probe` on a fresh
    domain, yielded as (est, probe) once the node is up; on exit the probe is closed and the node stopped
    with SIGINT (its exit code then in `est.proc.returncode`)."""
    dom = fresh_domain_id()
    est = estimator_process(dom, log_path, **kwargs)
    probe = Probe(dom)
    try:
        assert probe.wait_for_node(40), f"estimator did not come up:\n{est.output()}"
        yield est, probe
    finally:
        probe.close()
        est.stop()


@contextlib.contextmanager
def overloaded_estimator(log_path: Path, dt: float = OVERLOAD_DT, step_cost: float = OVERLOAD_STEP_COST,
                         params: Optional[Dict[str, object]] = None, **kwargs):
    """`running_estimator` with a node that is overloaded on any machine: step `dt` with OVERLOAD_PARAMS
    (skip ahead once 50 ms behind) over `params`, and every core step lasting at least `step_cost` s (>
    dt: test/slow_core_node.py).  Yields (est, probe); feed it at `dt` (e.g. `Feeder(probe, traj, dt, mech)`)
    and it overruns and skips steps however fast the machine is."""
    if not step_cost > dt:
        raise ValueError(f"step_cost ({step_cost} s) must exceed dt ({dt} s) to overload the node")
    with running_estimator(log_path, params={**(params or {}), **OVERLOAD_PARAMS, "dt": dt}, step_cost=step_cost,
                           **kwargs) as (est, probe):
        yield est, probe


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
        self.disturbance: List = []
        self.stddev: List = []
        from mbfg_ros.ros import fastloop
        grp = fastloop.DetachedCallbackGroup()
        subs = []
        for typ, topic, lst in ((JointState, f"{ns}/joint_states", self.js), (JointTrajectory, f"{ns}/state", self.state),
                                (MarkerArray, f"{ns}/markers", self.markers), (DiagnosticArray, "/diagnostics", self.diag),
                                (JointState, f"{ns}/disturbance", self.disturbance),
                                (JointState, f"{ns}/joint_states_stddev", self.stddev)):
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
        # held by the spin thread around each wait: an entity destroyed while the executor waits on it raises
        # InvalidHandle in that thread, which then dies, and every later service call times out
        self._spinning = threading.Lock()
        self.thread = threading.Thread(target=self._spin, daemon=True)
        self.thread.start()

    def _spin(self):
        while not self._stop.is_set() and self.context.ok():
            try:
                with self._spinning:
                    self.executor.spin_once(timeout_sec=0.05)
            except Exception:
                if self._stop.is_set():
                    break
                raise

    def destroy_clock_publisher(self):
        """Stop publishing /clock (the publisher destroyed between two waits of the spin thread)."""
        with self._spinning:
            self.node.destroy_publisher(self.pub_clock)
            self.pub_clock = None

    def create_clock_publisher(self):
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        from rosgraph_msgs.msg import Clock
        with self._spinning:
            self.pub_clock = self.node.create_publisher(
                Clock, "/clock", QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE))

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
    def latest_diag(self, after_ns: int = 0,
                    pred: Optional[Callable[[Dict[str, str]], bool]] = None) -> Optional[Dict[str, str]]:
        """The newest estimator status received at or after `after_ns` (and meeting `pred`, when given)."""
        for t, m in reversed(self.snapshot("diag")):
            if t < after_ns:
                break
            for st in m.status:
                if "estimator" in st.name:
                    d = {kv.key: kv.value for kv in st.values}
                    d["_level"] = int.from_bytes(st.level, "little") if isinstance(st.level, bytes) else int(st.level)
                    d["_message"] = st.message
                    if pred is None or pred(d):
                        return d
                    break
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


class PublisherThread:
    """A publisher running `_run` in a daemon thread: `start()` (returns self), `join()`, `stop()`
    (`_run` checks `self._stop`).  With `pause_gc`, the process's garbage collector is off while `_run` runs:
    a full collection of the test process's garbage (tens of thousands of objects left by earlier tests)
    stalls every thread for tens of ms, and the inputs would reach the node late and be (rightly) counted as
    late; a real sensor driver is not paused by the test process's GC."""

    pause_gc = False

    def __init__(self):
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._main, daemon=True)

    def _main(self):
        paused = self.pause_gc and gc.isenabled()
        if paused:
            gc.disable()
        try:
            self._run()
        finally:
            if paused:
                gc.enable()

    def start(self):
        self.thread.start()
        return self

    def join(self, timeout=60):
        self.thread.join(timeout)

    def stop(self):
        self._stop.set()
        self.thread.join(10)

    def _run(self):
        raise NotImplementedError


class Feeder(PublisherThread):
    """Publishes a plant trajectory as the node's inputs in real time from a thread: observations
    (`joint_observations`) and commanded efforts (`commanded_effort`), stamped t_start + k·dt on the
    node clock (system time).  `stamps[k]` gives the stamp of sample k for comparisons with the truth.
    `observations_until`: readings only for the samples before it (then commands alone)."""

    pause_gc = True

    def __init__(self, probe: "Probe", traj, dt: float, mech, observations: bool = True, efforts: bool = True,
                 t_start_ns: Optional[int] = None, clock: bool = False, rate: float = 1.0,
                 observations_until: Optional[int] = None):
        self.probe, self.traj, self.dt, self.mech = probe, traj, dt, mech
        self.observations_until = observations_until
        self.observations, self.efforts, self.clock, self.rate = observations, efforts, clock, rate
        self.t_start_ns = t_start_ns
        self.stamps: List[int] = []
        self.lateness_ns: List[int] = []      # publish time - due time, per sample
        super().__init__()

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
            self.lateness_ns.append(time.time_ns() - due)
            if self.clock:
                self.probe.pub_clock.publish(Clock(clock=Time(sec=st // 1_000_000_000, nanosec=st % 1_000_000_000)))
            if self.observations and (self.observations_until is None or k < self.observations_until):
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


def message_class(type_name: str):
    """rclpy message class from 'pkg/msg/Type'."""
    import importlib
    pkg, _, name = type_name.split("/")
    return getattr(importlib.import_module(f"{pkg}.msg"), name)


class BagPlayer(PublisherThread):
    """Replays a rosbag2 folder (read with `rosbags`) into the ROS graph with the recorded timing, like
    `ros2 bag play --clock`: the serialized messages are published unchanged, and the recorded /clock
    (one tick per sample) drives the nodes' sim time.  `rate` scales the playback speed."""

    def __init__(self, probe: "Probe", path, topics=None, rate: float = 1.0, clock: bool = True):
        from rosbags.highlevel import AnyReader
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        self.rate = rate
        self.records = []
        self.pubs = {}
        qos = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)
        with AnyReader([Path(path)]) as r:
            conns = [c for c in r.connections if (topics is None or c.topic in topics)
                     and (clock or c.topic != "/clock")]
            for c in conns:
                if c.topic not in self.pubs:
                    self.pubs[c.topic] = probe.node.create_publisher(message_class(c.msgtype), c.topic, qos)
            for c, t, raw in r.messages(connections=conns):
                self.records.append((t, c.topic, bytes(raw)))
        self.published = 0
        super().__init__()

    def join(self, timeout=120):
        super().join(timeout)

    def _run(self):
        t_first = self.records[0][0]
        wall0 = time.time_ns()
        for t, topic, raw in self.records:
            if self._stop.is_set():
                break
            due = wall0 + int((t - t_first) / self.rate)
            d = (due - time.time_ns()) / 1e9
            if d > 0:
                time.sleep(d)
            self.pubs[topic].publish(raw)
            self.published += 1
