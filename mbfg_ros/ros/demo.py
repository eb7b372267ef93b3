"""`make demo` / `python -m mbfg_ros.ros.demo`: the estimator node and the simulated plant as real ROS 2 nodes.

Starts, as subprocesses of this Python (no ROS installation needed, rclpy from PyPI works):

* the estimator: ``python -m mbfg_ros.ros.node --ros-args --params-file config/four_bar.yaml -p mechanism:=...``
* the simulated plant: ``python -m mbfg_ros.ros.sim_node`` (noisy encoders + commanded efforts at 1/dt),

talks to them over DDS for a few seconds from an in-process probe node, then prints

* the achieved output rate and the share of missing outputs,
* the input-to-output latency: publish time of each estimate (the DDS source timestamp) minus the
  stamp of the inputs it answers (same machine clock), median / p99 / max, the same up to its receipt
  by a subscriber, and the share of late steps (published more than dt after the input stamp),
* the estimation error against the simulated truth (q of all coordinates, q̇, the actuator effort against
  the effort the plant's actuator applied and against the command it was given: the plant's actuator
  does not apply exactly the command, see `four_bar_sim`'s `actuator.*` parameters),
* the node's own diagnostics (solve time) and the CPU share of each process,

and writes a plot to out/demo.png (the actuated coordinate; the applied, commanded and estimated effort; the
disturbance, applied − commanded, and its estimate, estimated − commanded; latency; errors).  Discovery stays
on localhost on a random ROS_DOMAIN_ID.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, Optional

import numpy as np

from mbfg_ros.ros.package_files import DEFAULT_PLANT_NODE, config_file, discovery_profile_env, plant_node_name
from mbfg_ros.share import PKG_ROOT

NS = 1_000_000_000
TRUTH_DECIMATION = 10     # the plant publishes its truth with every 10th sample (enough to score the estimates)


def ros_env(domain_id: int) -> Dict[str, str]:
    """This process's environment for a node (or probe) of the demo, a bench or a test: domain
    `domain_id`, discovery on loopback, the package's Fast DDS discovery profile (unless one is set:
    `package_files.discovery_profile_env`), the package on PYTHONPATH."""
    env = dict(os.environ)
    env.update(discovery_profile_env(env))
    env.update(ROS_DOMAIN_ID=str(domain_id), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST", ROS_LOCALHOST_ONLY="1",
               PYTHONUNBUFFERED="1", RCUTILS_COLORIZED_OUTPUT="0")
    env["PYTHONPATH"] = str(PKG_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            x = f.read().rsplit(")", 1)[1].split()
        return (int(x[11]) + int(x[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


class _Recorder:
    """In-process probe: estimator ~/state, the plant's ~/truth_state and commanded_effort, /diagnostics."""

    def __init__(self, domain_id: int, plant_node: str = DEFAULT_PLANT_NODE):
        os.environ.update(ros_env(domain_id))
        import rclpy
        from rclpy.context import Context
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        from diagnostic_msgs.msg import DiagnosticArray
        from sensor_msgs.msg import JointState
        from trajectory_msgs.msg import JointTrajectory
        from mbfg_ros.ros import fastloop

        self.rclpy = rclpy
        self.ctx = Context()
        rclpy.init(context=self.ctx, domain_id=domain_id)
        self.node = rclpy.create_node("mbfg_demo_probe", context=self.ctx)
        qos = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)
        self.truth, self.diag = [], []
        # ~/state is kept serialized during the run and decoded afterwards (`state`): the probe shares the
        # two cores with the nodes it measures, and deserializing 1000 messages/s in Python costs much of one
        self._raw_state: list = []
        self._state: list = []
        self._raw_commands: list = []       # the plant's commanded_effort, serialized (decoded in `commands`)
        grp = fastloop.DetachedCallbackGroup()

        def on_state(raw, info):
            # the rmw message info gives when the node published the estimate and when DDS delivered it
            self._raw_state.append((info.get("received_timestamp") or time.time_ns(), raw,
                                    info.get("source_timestamp") or 0))

        def on_command(raw):
            self._raw_commands.append(raw)

        def on_truth(m):
            p = m.points[0]
            self.truth.append((m.header.stamp.sec * NS + m.header.stamp.nanosec, np.array(p.positions),
                               np.array(p.velocities), np.array(p.effort)))

        def on_diag(m):
            for st in m.status:
                if st.name.endswith(": estimator"):
                    self.diag.append({kv.key: kv.value for kv in st.values})

        subs = [(self.node.create_subscription(JointTrajectory, "/mbfg_estimator/state", on_state, qos,
                                               callback_group=grp, raw=True), on_state, True),
                (self.node.create_subscription(JointTrajectory, f"/{plant_node}/truth_state", on_truth, qos,
                                               callback_group=grp), on_truth),
                (self.node.create_subscription(JointState, "/commanded_effort", on_command, qos,
                                               callback_group=grp, raw=True), on_command),
                (self.node.create_subscription(DiagnosticArray, "/diagnostics", on_diag, qos,
                                               callback_group=grp), on_diag)]
        self.loop = fastloop.FastLoop(self.node, subs, [], name="demo_probe")
        self.loop.start()
        self.executor = SingleThreadedExecutor(context=self.ctx)
        self.executor.add_node(self.node)

    def call_services(self, calls: int, span: float, set_mode: bool = True) -> Dict[str, object]:
        """Call ~/reinitialize and (`set_mode`: mechanisms with one assembly-mode indicator) ~/set_assembly_mode
        (data=False: the four-bar's elbow branch −1, the one it runs on) alternately, `calls` times spread
        over `span` s.  Returns the round trips at this client (request sent -> response handled, ms) and the
        node's own handling times (from the replies)."""
        from std_srvs.srv import SetBool, Trigger
        clients = [(self.node.create_client(Trigger, "/mbfg_estimator/reinitialize"), Trigger.Request()),
                   (self.node.create_client(SetBool, "/mbfg_estimator/set_assembly_mode"), SetBool.Request(data=False))]
        for c, _ in clients:
            c.wait_for_service(timeout_sec=5.0)
        round_trips: Dict[str, list] = {"reinitialize": [], "set_assembly_mode": []}
        handling, failures = [], []
        t_next = time.monotonic()
        for i in range(calls):
            time.sleep(max(0.0, t_next - time.monotonic()))
            t_next += span / calls
            j = i % 2 if set_mode else 0
            (client, request), name = clients[j], ("reinitialize", "set_assembly_mode")[j]
            t0 = time.perf_counter()
            future = client.call_async(request)
            self.executor.spin_until_future_complete(future, timeout_sec=2.0)
            rt = (time.perf_counter() - t0) * 1e3
            reply = future.result()
            if reply is None or not reply.success:
                failures.append(f"{name}: {'no reply' if reply is None else reply.message}")
                continue
            round_trips[name].append(rt)
            m = re.search(r"\(in ([0-9.]+) ms\)", reply.message)
            if m:
                handling.append(float(m.group(1)))
        for c, _ in clients:
            self.node.destroy_client(c)
        return {"round_trip_ms": round_trips, "handling_ms": handling, "failures": failures}

    @property
    def state(self) -> list:
        """[(received, stamp, q, q̇, Q, published)] of the ~/state messages so far (ns, arrays)."""
        from rclpy.serialization import deserialize_message
        from trajectory_msgs.msg import JointTrajectory
        for recv, raw, pub in self._raw_state[len(self._state):]:
            m = deserialize_message(raw, JointTrajectory)
            p = m.points[0]
            self._state.append((recv, m.header.stamp.sec * NS + m.header.stamp.nanosec, np.array(p.positions),
                                np.array(p.velocities), np.array(p.effort), pub))
        return self._state

    def commands(self) -> Dict[int, np.ndarray]:
        """{stamp: commanded efforts (actuator order)} of the plant's commanded_effort messages."""
        from rclpy.serialization import deserialize_message
        from sensor_msgs.msg import JointState
        out = {}
        for raw in self._raw_commands:
            m = deserialize_message(raw, JointState)
            out[m.header.stamp.sec * NS + m.header.stamp.nanosec] = np.array(m.effort)
        return out

    def has_state(self) -> bool:
        return bool(self._raw_state)

    def estimator_ready(self) -> bool:
        return self.node.count_publishers("/mbfg_estimator/state") > 0

    def close(self):
        self.loop.stop()
        self.node.destroy_node()
        self.rclpy.shutdown(context=self.ctx)


def start_node_process(module: str, args, env, log: Path, cwd: Path = PKG_ROOT) -> subprocess.Popen:
    """`python -m module --ros-args args` in a session of its own, its output to `log`."""
    with open(log, "w") as f:
        return subprocess.Popen([sys.executable, "-m", module, "--ros-args", *args], stdout=f,
                                stderr=subprocess.STDOUT, env=env, cwd=str(cwd), start_new_session=True)


def stop_process(p: subprocess.Popen, timeout: float = 10.0) -> Optional[int]:
    """SIGINT, then a kill if it has not exited within `timeout` s; its exit code."""
    if p.poll() is None:
        p.send_signal(signal.SIGINT)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)
    return p.returncode


@contextlib.contextmanager
def _interrupts_deferred():
    """SIGINT (Ctrl-C) is held back until the block is done, then raised as KeyboardInterrupt."""
    came = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: came.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if came:
        raise KeyboardInterrupt


ESTIMATOR_NODE = "mbfg_ros.ros.node"


def run_demo(duration: float = 5.0, mechanism: str = "four_bar_crank", config: Optional[str] = None,
             mode: Optional[str] = None, dt: Optional[float] = None, window: Optional[int] = None,
             plot: Optional[str] = "out/demo.png", domain_id: Optional[int] = None, log_dir: Optional[str] = None,
             settle: float = 0.3, verbose: bool = True, params: Optional[Dict[str, object]] = None,
             service_calls: int = 0) -> Dict[str, object]:
    """Run the estimator node + plant for `duration` s of simulated data; return the metrics (see module
    doc).  With `service_calls` > 0, that many calls of ~/reinitialize and ~/set_assembly_mode (alternating,
    on the current branch) are spread over the run and their response times reported."""
    return run_with_plant(ESTIMATOR_NODE, duration, mechanism, config=config, mode=mode, dt=dt, window=window,
                          plot=plot, domain_id=domain_id, log_dir=log_dir, settle=settle, verbose=verbose,
                          params=params, service_calls=service_calls)


def run_with_plant(estimator_module: str, duration: float, mechanism: str, *, config: Optional[str] = None,
                   mode: Optional[str] = None, dt: Optional[float] = None, window: Optional[int] = None,
                   plot: Optional[str] = None, domain_id: Optional[int] = None, log_dir: Optional[str] = None,
                   settle: float = 0.3, verbose: bool = True, params: Optional[Dict[str, object]] = None,
                   service_calls: int = 0, estimator_env: Optional[Dict[str, str]] = None) -> Dict[str, object]:
    """`run_demo` with another estimator node: `python -m estimator_module` (from the repository root), a
    node with the estimator node's interface, e.g. bench/stub_core_node.py (the node with a stand-in core).
    `estimator_env`: more environment variables for the estimator's process only (e.g. a DDS profile)."""
    from mbfg_ros.model.mechanism import load_mechanism
    mech = load_mechanism(mechanism)           # (a bad name fails here, before any process starts)
    cfg = Path(config) if config else config_file("four_bar.yaml" if "four_bar" in mechanism
                                                  else "pick_and_place.yaml")
    domain_id = domain_id if domain_id is not None else random.randint(1, 100)
    env = ros_env(domain_id)
    logs = Path(log_dir or tempfile.mkdtemp(prefix="mbfg_demo_"))
    logs.mkdir(parents=True, exist_ok=True)
    est_args = ["--params-file", str(cfg), "-p", f"mechanism:={mechanism}", "-p", "diagnostics_period:=0.5"]
    plant_node = plant_node_name(cfg)   # named as the parameter file's section for the plant
    sim_args = ["-r", f"__node:={plant_node}", "--params-file", str(cfg), "-p", f"mechanism:={mechanism}",
                "-p", f"duration:={duration}",
                "-p", "wait_for_subscribers:=1", "-p", "wait_for_truth_subscribers:=1",
                "-p", f"truth_decimation:={TRUTH_DECIMATION}"]
    if mode:
        est_args += ["-p", f"mode:={mode}"]
    if dt:
        est_args += ["-p", f"dt:={dt}"]
        sim_args += ["-p", f"dt:={dt}"]
    if window:
        est_args += ["-p", f"window:={window}"]
    for k, v in (params or {}).items():          # more estimator parameters
        est_args += ["-p", f"{k}:={v}"]
    say = print if verbose else (lambda *a, **k: None)
    say(f"[demo] ROS_DOMAIN_ID={domain_id}; logs in {logs}")
    rec = _Recorder(domain_id, plant_node)
    est = start_node_process(estimator_module, est_args, {**env, **(estimator_env or {})}, logs / "estimator.log")
    sim = None
    try:
        t_end = time.monotonic() + 30
        while not rec.estimator_ready() and time.monotonic() < t_end and est.poll() is None:
            time.sleep(0.02)
        if est.poll() is not None or not rec.estimator_ready():
            raise RuntimeError(f"estimator did not start:\n{(logs / 'estimator.log').read_text()[-3000:]}")
        sim = start_node_process("mbfg_ros.ros.sim_node", sim_args, env, logs / "sim.log")
        say(f"[demo] {mechanism}: estimator up; simulating {duration} s (the plant integrates its first seconds before publishing)...")
        # wait for the data to flow, then sample CPU over the run
        t_end = time.monotonic() + 120
        while not rec.has_state() and time.monotonic() < t_end and sim.poll() is None:
            time.sleep(0.01)
        # CPU shares over the middle of the run (while every process is alive)
        pids = {"estimator": est.pid, "plant": sim.pid, "probe": os.getpid()}
        cpu0 = {k: _cpu_seconds(p) for k, p in pids.items()}
        w0 = time.monotonic()
        window = max(0.2, 0.6 * duration)
        services = None
        if service_calls:
            services = rec.call_services(service_calls, window, set_mode=len(mech.assembly_mode_names) == 1)
        time.sleep(max(0.0, w0 + window - time.monotonic()))
        cpu1 = {k: _cpu_seconds(p) for k, p in pids.items()}
        w1 = time.monotonic()
        cpu = {k: (cpu1[k] - cpu0[k]) / max(w1 - w0, 1e-9) for k in pids}
        sim.wait(duration + 60)
        time.sleep(settle)
    finally:
        with _interrupts_deferred():    # a Ctrl-C now would leave the nodes running in their own sessions
            codes = {"estimator": stop_process(est)}
            if sim is not None:
                codes["plant"] = stop_process(sim)
            rec.close()
    res = _analyse(rec, mech, cfg, dt, duration)
    res["cpu_share"] = cpu
    if services is not None:
        res["services"] = services
    res["exit_codes"] = codes
    res["domain_id"] = domain_id
    res["logs"] = str(logs)
    if verbose:
        _print(res)
    if plot:
        _plot(rec, res, plot)
        say(f"[demo] plot written to {plot}")
    return res


def parse_params(items, error) -> Dict[str, str]:
    """`--param NAME=VALUE` arguments as {NAME: VALUE} (the node parses the value as -p NAME:=VALUE);
    `error(message)` for a malformed one."""
    params = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            error(f"--param expects NAME=VALUE (got {item!r})")
        params[name.strip()] = value
    return params


def _publish_times(S) -> np.ndarray:
    """Publish time of each recorded estimate: its DDS source timestamp, or its receive time where the
    rmw gives none."""
    return np.array([s[5] or s[0] for s in S], dtype=np.int64)


def estimator_parameters(cfg) -> Dict[str, object]:
    """The estimator node's `ros__parameters` in a parameter file (e.g. config/four_bar.yaml)."""
    from mbfg_ros.tuning.params_file import node_parameters
    return node_parameters(cfg)[1]


def _analyse(rec, mech, cfg, dt, duration) -> Dict[str, object]:
    mechanism = mech.name
    if dt is None:
        dt = float(estimator_parameters(cfg)["dt"])
    S = rec.state
    if not S:
        raise RuntimeError("no estimate received")
    recv = np.array([s[0] for s in S], dtype=np.int64)
    stamp = np.array([s[1] for s in S], dtype=np.int64)
    pub = _publish_times(S)
    # Latency is that of the estimates answering the plant's inputs: the steps the node predicts after
    # the plant has stopped (no input, estimated one input wait late by design) are left out.
    answered = np.ones(len(S), dtype=bool)
    if rec.truth:      # the truth comes with every TRUTH_DECIMATION-th input and with the last one
        answered = stamp <= max(t[0] for t in rec.truth)
    lat = (pub - stamp)[answered] / 1e6
    lat_rx = (recv - stamp)[answered] / 1e6
    span = (stamp[-1] - stamp[0]) / NS
    expected = int(round(span / dt)) + 1
    uniq = len(np.unique(stamp))

    def stats(x):
        return {"median": float(np.median(x)), "p90": float(np.percentile(x, 90)),
                "p99": float(np.percentile(x, 99)), "max": float(x.max())}

    res: Dict[str, object] = {
        "mechanism": mechanism, "dt": dt, "outputs": len(S), "expected_outputs": expected,
        "missing_percent": 100.0 * max(0, expected - uniq) / expected,
        "output_rate_hz": (uniq - 1) / span if span > 0 else float("nan"),
        "latency_ms": stats(lat),                 # input stamp -> publish of the estimate (DDS source time)
        "delivery_latency_ms": stats(lat_rx),     # input stamp -> estimate received by a subscriber
        "late_percent": float(100.0 * np.mean(lat > dt * 1e3)),
    }
    # errors vs truth, matched by stamp, after a settling time (initialization from rest + noise)
    truth = {t[0]: t for t in rec.truth}
    idx = {s[1]: i for i, s in enumerate(S)}
    commands = rec.commands()
    t0 = stamp[0]
    rows = []
    a = mech.actuated
    na = len(a)
    nan = np.full(na, np.nan)
    for ts, (_, q, v, Q) in sorted(truth.items()):
        i = idx.get(ts)
        if i is None or ts - t0 < 0.2 * NS:
            continue
        _, _, qe, ve, Qe, _ = S[i]
        cmd = commands.get(ts, nan)
        cmd = cmd if cmd.shape == (na,) else nan
        dq = mech.position_difference(qe, q)
        # on an actuated relative angle the generalized force is the actuator effort (gravity acts on points)
        rows.append((ts, np.abs(dq).max(), np.abs(ve - v).max(), np.abs(Qe[a] - Q[a]).max(initial=0.0),
                     qe[a[0]] if na else qe[-1], q[a[0]] if na else q[-1], Qe[a[0]] if na else 0.0,
                     Q[a[0]] if na else 0.0, cmd[0] if na else np.nan,
                     np.abs(Qe[a] - cmd).max(initial=0.0) if na else np.nan))
    if rows:
        E = np.array(rows)
        vs_command = E[:, 9][np.isfinite(E[:, 9])]
        res["errors"] = {"q_max": float(E[:, 1].max()), "q_rms": float(np.sqrt(np.mean(E[:, 1] ** 2))),
                         "v_max": float(E[:, 2].max()), "v_rms": float(np.sqrt(np.mean(E[:, 2] ** 2))),
                         "effort_max": float(E[:, 3].max()), "effort_rms": float(np.sqrt(np.mean(E[:, 3] ** 2))),
                         # the estimate against the command the plant was given (not the truth: the actuator
                         # applies something else) and how far the applied effort was from that command
                         "effort_vs_command_max": float(vs_command.max()) if vs_command.size else float("nan"),
                         "effort_vs_command_rms": (float(np.sqrt(np.mean(vs_command ** 2))) if vs_command.size
                                                   else float("nan")),
                         "applied_vs_command_rms": float(np.sqrt(np.nanmean((E[:, 7] - E[:, 8]) ** 2)))
                         if vs_command.size else float("nan"),
                         "samples": len(rows)}
        res["_series"] = E
    if rec.diag:
        d = rec.diag[-2] if len(rec.diag) > 1 else rec.diag[-1]
        keep = ("mode", "solve_ms_mean", "solve_cpu_ms_mean", "solve_ms_max", "latency_ms_median", "latency_ms_p99",
                "late_steps_percent", "input_delay_ms_median", "late_readings_fused", "rejected.late",
                "rejected.too_old",
                "predicted_steps", "solver_recoveries", "resets", "overruns", "rejected.stale", "inputs_behind",
                "input.observations.behind_s")
        res["node_diagnostics"] = {k: d.get(k) for k in keep if k in d}
    return res


def _print(res):
    L = res["latency_ms"]
    print(f"[demo] {res['mechanism']} at dt = {res['dt'] * 1e3:g} ms "
          f"({res.get('node_diagnostics', {}).get('mode', '?')} mode)")
    print(f"  output rate      : {res['output_rate_hz']:.1f} Hz (target {1 / res['dt']:.0f} Hz), "
          f"{res['outputs']} estimates, {res['missing_percent']:.2f} % missing")
    R = res["delivery_latency_ms"]
    print(f"  latency (ms)     : median {L['median']:.3f}, p90 {L['p90']:.3f}, p99 {L['p99']:.3f}, max {L['max']:.3f}"
          f"  (input stamp -> estimate published)")
    print(f"                     median {R['median']:.3f}, p90 {R['p90']:.3f}, p99 {R['p99']:.3f}, max {R['max']:.3f}"
          f"  (input stamp -> estimate received by a subscriber)")
    print(f"  late steps       : {res['late_percent']:.2f} % (published more than dt after the input stamp)")
    if "errors" in res:
        e = res["errors"]
        print(f"  error vs truth   : q max {e['q_max']:.2e} (rms {e['q_rms']:.2e}), q̇ max {e['v_max']:.2e} "
              f"(rms {e['v_rms']:.2e}) over {e['samples']} truth samples")
        print(f"  effort error     : vs applied max {e['effort_max']:.3g} (rms {e['effort_rms']:.3g}), vs command max "
              f"{e['effort_vs_command_max']:.3g} (rms {e['effort_vs_command_rms']:.3g}) [N·m]; the plant's actuator "
              f"applied {e['applied_vs_command_rms']:.3g} rms off the command")
    if "node_diagnostics" in res:
        print(f"  node diagnostics : {res['node_diagnostics']}")
    print("  CPU share        : " + ", ".join(f"{k} {v * 100:.0f} %" for k, v in res["cpu_share"].items())
          + f" (of one core; {os.cpu_count()} cores)")
    if "services" in res:
        sv = res["services"]
        for name, rts in sv["round_trip_ms"].items():
            if rts:
                print(f"  ~/{name:<18}: {len(rts)} calls, round trip median {np.median(rts):.2f} ms, "
                      f"max {max(rts):.2f} ms (at this client)")
        if sv["handling_ms"]:
            h = sv["handling_ms"]
            print(f"  service handling : median {np.median(h):.2f} ms, max {max(h):.2f} ms (in the node, from the replies)")
        if sv["failures"]:
            print(f"  service failures : {sv['failures']}")
    print(f"  exit codes       : {res['exit_codes']}")


def _plot(rec, res, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    S = rec.state
    stamp = np.array([s[1] for s in S], dtype=np.int64)
    pub = _publish_times(S)
    t = (stamp - stamp[0]) / NS
    lat = (pub - stamp) / 1e6
    fig = plt.figure(figsize=(12, 10))
    grid = fig.add_gridspec(3, 2)
    ax = np.array([[fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1])],
                   [fig.add_subplot(grid[1, 0]), fig.add_subplot(grid[1, 1])]])
    ax_d = fig.add_subplot(grid[2, :])
    E = res.get("_series")
    if E is not None:
        te = (E[:, 0] - stamp[0]) / NS
        ax[0, 0].plot(te, E[:, 5], "k-", lw=2, label="truth")
        ax[0, 0].plot(te, E[:, 4], "r--", lw=1, label="estimate")
        ax[0, 0].set_ylabel("actuated coordinate [rad]")
        ax[0, 1].plot(te, E[:, 7], "k-", lw=2, label="applied (truth)")
        ax[0, 1].plot(te, E[:, 8], "b-", lw=1, label="commanded")
        ax[0, 1].plot(te, E[:, 6], "r--", lw=1, label="estimate")
        ax[0, 1].set_ylabel("actuator effort [N·m]")
        # the disturbance: what the actuator applied beyond the command, and the estimator's view of it
        ax_d.plot(te, E[:, 7] - E[:, 8], "k-", lw=2, label="disturbance: applied − commanded (truth)")
        ax_d.plot(te, E[:, 6] - E[:, 8], "r--", lw=1, label="estimate: estimated − commanded")
        ax_d.set_ylabel("disturbance effort [N·m]")
        ax_d.set_xlabel("t [s]")
        ax_d.legend(loc="upper right", fontsize=8)
        ax[1, 1].semilogy(te, np.maximum(E[:, 1], 1e-12), label="max |q error|")
        ax[1, 1].semilogy(te, np.maximum(E[:, 2], 1e-12), label="max |dq/dt error|")
        ax[1, 1].set_ylabel("error")
        for a in (ax[0, 0], ax[0, 1], ax[1, 1]):
            a.legend(loc="upper right", fontsize=8)
            a.set_xlabel("t [s]")
    ax[1, 0].plot(t, lat, ".", ms=1)
    ax[1, 0].axhline(res["dt"] * 1e3, color="r", lw=1, label="dt")
    ax[1, 0].set_ylabel("latency to publish [ms]")
    ax[1, 0].set_xlabel("t [s]")
    ax[1, 0].set_yscale("log")
    ax[1, 0].legend(loc="upper right", fontsize=8)
    L = res["latency_ms"]
    fig.suptitle(f"mbfg_ros demo: {res['mechanism']} at {1 / res['dt']:.0f} Hz — output {res['output_rate_hz']:.0f} Hz, "
                 f"latency median {L['median']:.2f} ms / p99 {L['p99']:.2f} ms, {res['late_percent']:.1f} % late")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="mbfg-demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=5.0, help="seconds of simulated data (default 5)")
    ap.add_argument("--mechanism", default="four_bar_crank", help="four_bar_crank | pick_and_place_robot | path")
    ap.add_argument("--config", help="parameter file (default: config/four_bar.yaml or pick_and_place.yaml)")
    ap.add_argument("--mode", choices=("forward_dynamics", "estimation", "fused"))
    ap.add_argument("--dt", type=float)
    ap.add_argument("--window", type=int)
    ap.add_argument("--plot", default="out/demo.png")
    ap.add_argument("--json", help="also write the metrics to this file")
    ap.add_argument("--domain-id", type=int)
    ap.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                    help="another estimator parameter, as for -p NAME:=VALUE (repeatable)")
    a = ap.parse_args(argv)
    params = parse_params(a.param, ap.error)
    try:
        import rclpy  # noqa: F401
    except ImportError:
        print("mbfg demo: rclpy is not installed (pip install the ROS 2 wheels, see docs/ros2_interfaces.md)",
              file=sys.stderr)
        return 2
    try:
        res = run_demo(a.duration, a.mechanism, a.config, a.mode, a.dt, a.window, a.plot, a.domain_id, params=params)
    except KeyboardInterrupt:     # the nodes are stopped by then (run_with_plant's clean-up)
        print("mbfg demo: interrupted", file=sys.stderr)
        return 130
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({k: v for k, v in res.items() if not k.startswith("_")}, indent=2))
    return 0 if res["exit_codes"].get("estimator") == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
