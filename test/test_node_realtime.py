"""The estimator node's `thread_priority`: its fast loop thread (inputs, steps, publishing, services) under
SCHED_FIFO, read back from the running process with os.sched_getscheduler on that thread's id (the thread is
named `mbfg_fastloop`); the node's other threads keep the normal policy, and parameters, services and
diagnostics keep working.  Without the right to a real-time policy (no CAP_SYS_NICE, RLIMIT_RTPRIO 0: here
made so for the node's process only) the node warns once and runs under the normal policy.  Bad values fail
at start-up naming the parameter."""

from __future__ import annotations

import ctypes
import os
import resource
import threading

import pytest

from ros_helpers import (STEADY_DT, STEADY_PARAMS, Feeder, estimator_process, fresh_domain_id, rclpy_available,
                         running_estimator, wait_until)

pytestmark = pytest.mark.skipif(not rclpy_available(), reason="rclpy and the ROS 2 message packages are not "
                                                              "installed (pip wheels or a sourced ROS 2)")

DT = STEADY_DT
PRIORITY = 50
PARAMS = {**STEADY_PARAMS, "thread_priority": PRIORITY}
PR_CAPBSET_DROP = 24        # prctl(2)
CAP_SYS_NICE = 23           # capability(7)


def realtime_permitted(priority: int) -> bool:
    """Whether this process may put a thread under SCHED_FIFO at `priority` (tried on a throwaway thread)."""
    from mbfg_ros.ros.fastloop import make_thread_realtime
    refused = []
    t = threading.Thread(target=lambda: refused.append(make_thread_realtime(priority, threading.get_native_id())))
    t.start()
    t.join()
    return refused[0] is None


def threads_of(pid: int) -> dict:
    """{thread id: (name, scheduling policy, priority)} of a running process."""
    out = {}
    for entry in os.listdir(f"/proc/{pid}/task"):
        tid = int(entry)
        try:
            with open(f"/proc/{pid}/task/{entry}/comm") as f:
                name = f.read().strip()
            out[tid] = (name, os.sched_getscheduler(tid), os.sched_getparam(tid).sched_priority)
        except (FileNotFoundError, ProcessLookupError):   # a thread that just ended
            pass
    return out


def fast_loop_threads(pid: int) -> list:
    """[(thread id, policy, priority)] of the process's fast loop threads, once it has one (the node is
    discoverable a little before its loop starts)."""
    def loops():
        return [(tid, policy, prio) for tid, (name, policy, prio) in threads_of(pid).items()
                if name == "mbfg_fastloop"]
    wait_until(lambda: bool(loops()), 20.0)
    return loops()


def without_realtime_rights():
    """(In the node's process, before exec) no right to a real-time policy: RLIMIT_RTPRIO 0 and, for root,
    CAP_SYS_NICE dropped from the bounding set, so the executed program does not get it (a non-root test
    run lacks it anyway: prctl then fails, harmlessly)."""
    resource.setrlimit(resource.RLIMIT_RTPRIO, (0, 0))
    ctypes.CDLL(None, use_errno=True).prctl(PR_CAPBSET_DROP, CAP_SYS_NICE, 0, 0, 0)


def _trajectory(seconds: float):
    from mbfg_ros.model.mechanism import load_mechanism
    from mbfg_ros.sim.plant import Actuator, SimulatedPlant
    mech = load_mechanism("four_bar_crank")
    return mech, SimulatedPlant(mech, dt=DT, seed=11, actuator=Actuator.ideal(mech)).simulate(seconds)


def _estimates_follow(probe, feeder, mech, traj) -> None:
    """Feed the trajectory; the node publishes an estimate for nearly every step."""
    feeder.start().join()
    assert wait_until(lambda: len(probe.snapshot("state")) >= 0.9 * len(traj.t), 10.0), \
        f"{len(probe.snapshot('state'))} estimates for {len(traj.t)} steps"


def test_bad_thread_priority_fails_fast_naming_it(tmp_path):
    cases = {"above": {"thread_priority": 100}, "negative": {"thread_priority": -1},
             "text": {"thread_priority": "high"}}
    procs = {k: estimator_process(fresh_domain_id(), tmp_path / f"{k}.log", params=p) for k, p in cases.items()}
    for name, p in procs.items():
        p.proc.wait(60)
        out = p.output()
        assert p.proc.returncode != 0, f"{name}: {out}"
        assert "thread_priority" in out, f"{name}: {out}"
        assert "Traceback" not in out, f"{name}: {out}"


def test_fast_loop_thread_runs_under_sched_fifo_and_the_node_works(tmp_path):
    from std_srvs.srv import Trigger
    if not realtime_permitted(PRIORITY):
        pytest.skip("this process may not use SCHED_FIFO (no CAP_SYS_NICE, RLIMIT_RTPRIO below "
                    f"{PRIORITY}): the fallback test covers it")
    mech, traj = _trajectory(1.0)
    with running_estimator(tmp_path / "est.log", params=PARAMS) as (est, probe):
        pid = est.proc.pid
        loops = fast_loop_threads(pid)
        assert [(policy, prio) for _, policy, prio in loops] == [(os.SCHED_FIFO, PRIORITY)], threads_of(pid)
        # only the hot path is real-time: the main thread (parameters, diagnostics) keeps the normal policy;
        # the Fast DDS receive threads the inputs come through run one priority below the loop
        assert threads_of(pid)[pid][1] == os.SCHED_OTHER
        receive = {name: (policy, prio) for _, (name, policy, prio) in threads_of(pid).items()
                   if name.startswith(("dds.shm.", "dds.udp.")) and name != "dds.shm.wdog"}
        if os.environ.get("RMW_IMPLEMENTATION", "rmw_fastrtps_cpp") == "rmw_fastrtps_cpp":
            assert receive and set(receive.values()) == {(os.SCHED_FIFO, PRIORITY - 1)}, threads_of(pid)
        _estimates_follow(probe, Feeder(probe, traj, DT, mech), mech, traj)
        res, _ = probe.call(Trigger, "/mbfg_estimator/reinitialize", Trigger.Request())
        assert res.success, res.message
        r = probe.set_params({"max_input_delay": 0.02})[0]
        assert r.successful, r.reason
        assert probe.get_params(["max_input_delay", "thread_priority"]) == [0.02, PRIORITY]
        r = probe.set_params({"thread_priority": 10})[0]
        assert not r.successful                                          # read-only
        assert probe.wait_diag(lambda d: "state" in d, 5.0) is not None
        assert "thread_priority" not in est.output()                     # no warning: it was applied
    assert est.proc.returncode == 0


def test_without_realtime_rights_the_node_warns_once_and_runs_normally(tmp_path):
    mech, traj = _trajectory(1.0)
    with running_estimator(tmp_path / "est.log", params=PARAMS, preexec_fn=without_realtime_rights) as (est, probe):
        loops = fast_loop_threads(est.proc.pid)
        assert [policy for _, policy, _ in loops] == [os.SCHED_OTHER], threads_of(est.proc.pid)
        assert {policy for _, policy, _ in threads_of(est.proc.pid).values()} == {os.SCHED_OTHER}
        _estimates_follow(probe, Feeder(probe, traj, DT, mech), mech, traj)
        out = est.output()
        warnings = [line for line in out.splitlines() if f"thread_priority {PRIORITY}:" in line]
        assert len(warnings) == 1, out
        assert "WARN" in warnings[0] and "not permitted" in warnings[0] and "limits.conf" in warnings[0]
    assert est.proc.returncode == 0
