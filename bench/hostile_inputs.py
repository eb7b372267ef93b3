#!/usr/bin/env python3
"""What hostile or broken inputs do to a running estimator node, over real DDS (issue 20, point 6).

    python bench/hostile_inputs.py [--seconds 3] [--steady]

The estimator runs as a subprocess (config/four_bar.yaml, dt = 1 ms, fused) fed the simulated plant's
readings and commands at 1 kHz by a probe node in this process.  Each case runs beside that feed for
`--seconds`, after a baseline of the same length; per case, markdown rows with the node's output rate,
its resident memory (VmRSS), the growth of its log and its longest log line, the 95th percentile of
the published crank angle's error against the plant's truth, the solver recoveries, and the
`rejected.*` counters that moved; first, what decoding one JointState with a 1 MB frame_id costs.
`--steady`: the tests' settings (dt = 4 ms, max_input_delay 30 ms, max_backlog 0.5 s), so that a busy
machine does not overload the node and the crank error shows what the inputs did:

* `frame_id_1MB`: JointState readings whose header.frame_id is 1 MB, published as fast as the probe can;
* `joint_name_1MB`: JointState readings naming a 1 MB joint;
* `bad_cdr_array`: serialized bytes on commanded_effort_array that do not decode as a Float64MultiArray;
* `duplicate_stamps`: the newest crank reading published again with its stamp, once as it was and once
  0.5 rad off (racing the feeder: the copies may come first);
* `max_input_age_0`: `ros2 param set ... max_input_age 0.0` (accepted or refused, and the rate after).

For a before/after, copy this script into another checkout (e.g. `git archive <commit>` unpacked, the
compiled kernel copied into its mbfg_ros/native/) and run it from there: the node runs from the script's tree.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "test"))
sys.path.insert(0, str(REPO))

MB = 1 << 20

# The hostile publisher runs in a process of its own: in the feeder's process, building and sending megabyte
# messages would hold the GIL and delay the feed itself (then the node sees late inputs, not hostile ones).
ATTACKER = r"""
import struct, sys, time
import rclpy
from rclpy.qos import QoSProfile, ReliabilityPolicy
from rclpy.serialization import serialize_message
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray
kind, seconds = sys.argv[1], float(sys.argv[2])
rclpy.init()
node = rclpy.create_node("hostile_publisher")
array = kind == "bad_cdr_array"
pub = node.create_publisher(Float64MultiArray if array else JointState,
                            "/commanded_effort_array" if array else "/joint_observations",
                            QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE))
end = time.monotonic() + 10.0
while pub.get_subscription_count() == 0 and time.monotonic() < end:
    time.sleep(0.05)
if array:
    template = bytearray(b"\x00\x01\x00\x00" + b"\xff" * 12)          # a data length beyond the buffer
else:
    m = JointState()
    if kind == "frame_id_1MB":
        m.header.frame_id, m.name, m.position = "x" * (1 << 20), ["crank"], [3.0]   # a crank reading too
    else:
        m.name, m.position = ["x" * (1 << 20)], [0.0]
    template = bytearray(serialize_message(m))
sent, end = 0, time.monotonic() + seconds
print("ready", flush=True)
while time.monotonic() < end:
    if not array:
        struct.pack_into("<iI", template, 4, *divmod(time.time_ns(), 1_000_000_000))   # stamped now
    pub.publish(bytes(template))
    sent += 1
    time.sleep(0.0005)
print(sent, flush=True)
node.destroy_node()
rclpy.shutdown()
"""


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--steady", action="store_true", help="dt 4 ms and the tests' generous waits")
    args = ap.parse_args(argv)

    import numpy as np
    from ros_helpers import (STEADY_DT, STEADY_PARAMS, Feeder, Probe, PublisherThread, estimator_process,
                             fresh_domain_id, joint_state, wait_until)
    from mbfg_ros.model.mechanism import load_mechanism
    from mbfg_ros.sim.plant import Actuator, SimulatedPlant

    from rclpy.serialization import serialize_message
    from mbfg_ros.ros import conversions as rc
    m = joint_state(time.time_ns(), ["crank"], [0.0])
    m.header.frame_id = "x" * MB
    buf = serialize_message(m)

    def decode():
        try:
            rc.decode_joint_state(buf)
        except ValueError:      # LongString (where the tree has it)
            pass
    decode_us = min(timeit.repeat(decode, number=20, repeat=5)) / 20 * 1e6

    dt = STEADY_DT if args.steady else 0.001
    params = {**(STEADY_PARAMS if args.steady else {}), "thread_priority": 0, "diagnostics_period": 0.25}
    mech = load_mechanism("four_bar_crank")
    cases = ["baseline", "frame_id_1MB", "joint_name_1MB", "bad_cdr_array", "duplicate_stamps", "max_input_age_0"]
    total = args.seconds * (len(cases) + 1) + 40.0      # (+ each attacker process's start-up)
    traj = SimulatedPlant(mech, dt=dt, seed=3, actuator=Actuator.ideal(mech)).simulate(total)
    dom = fresh_domain_id()
    log = Path(tempfile.mkdtemp(prefix="hostile_")) / "estimator.log"
    est = estimator_process(dom, log, params=params)
    probe = Probe(dom)
    rows = []
    try:
        assert probe.wait_for_node(40), est.output()
        feeder = Feeder(probe, traj, dt, mech).start()
        assert wait_until(lambda: len(probe.snapshot("state")) > 200, 20.0), est.output()[-3000:]
        time.sleep(1.0)

        class Attack(PublisherThread):
            def __init__(self, send):
                self.send, self.sent = send, 0
                super().__init__()

            def _run(self):
                while not self._stop.is_set():
                    self.send()
                    self.sent += 1
                    time.sleep(0.0005)

        last = [-1]

        def duplicate():
            k = len(feeder.stamps) - 1
            if k > last[0]:
                last[0] = k
                crank = float(traj.readings["crank"][k])
                probe.pub_obs.publish(joint_state(feeder.stamps[k], ["crank"], [crank]))
                probe.pub_obs.publish(joint_state(feeder.stamps[k], ["crank"], [crank + 0.5]))

        attacks = {"duplicate_stamps": duplicate}
        from mbfg_ros.ros.demo import ros_env

        def diag():
            t = time.time_ns()
            wait_until(lambda: probe.latest_diag(t) is not None, 10.0, 0.05)
            return probe.latest_diag(t) or {}

        for case in cases:
            d0 = diag()
            n0 = len(probe.snapshot("js"))
            n_state0 = len(probe.snapshot("state"))
            log0 = log.stat().st_size
            t0 = time.monotonic()
            attack, note = None, ""
            if case in attacks:
                attack = Attack(attacks[case]).start()
            elif case.endswith("MB") or case == "bad_cdr_array":
                attacker = subprocess.Popen([sys.executable, "-c", ATTACKER, case, str(args.seconds)],
                                            env=ros_env(dom), stdout=subprocess.PIPE, text=True)
                attacker.stdout.readline()                     # "ready": discovered, sending from now
                t0 = time.monotonic()
                n0, n_state0 = len(probe.snapshot("js")), len(probe.snapshot("state"))
            elif case == "max_input_age_0":
                res = probe.set_params({"max_input_age": 0.0})[0]
                note = "accepted" if res.successful else f"refused: {res.reason}"
            rss_peak = rss_mb(est.proc.pid)
            while time.monotonic() - t0 < args.seconds:
                time.sleep(0.1)
                rss_peak = max(rss_peak, rss_mb(est.proc.pid))
            if attack is not None:
                attack.stop()
                note = f"{attack.sent / args.seconds:.0f} msg/s sent"
            elif case.endswith("MB") or case == "bad_cdr_array":
                sent = int(attacker.stdout.readline() or 0)
                attacker.wait(30)
                note = f"{sent / args.seconds:.0f} msg/s sent (another process)"
            rate = (len(probe.snapshot("js")) - n0) / (time.monotonic() - t0)
            d1 = diag()
            text = log.read_text(errors="replace")[log0:]
            longest = max((len(line) for line in text.splitlines()), default=0)
            moved = {k: int(d1[k]) - int(d0.get(k, 0)) for k in d1 if k.startswith("rejected.")
                     and d1[k] != d0.get(k)}
            recoveries = int(d1.get("solver_recoveries", 0)) - int(d0.get("solver_recoveries", 0))
            index = {s: k for k, s in enumerate(list(feeder.stamps))}
            c = mech.coordinate_index("crank")
            err = [abs(msg.points[0].positions[c] - traj.q[index[st]][c])
                   for t, msg in probe.snapshot("state")[n_state0:]
                   if (st := msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec) in index]
            err95 = np.percentile(err, 95) * 1e3 if err else float("nan")
            rows.append(f"| {case} | {note} | {rate:.0f} | {rss_peak:.0f} | {(log.stat().st_size - log0) / 1024:.1f} "
                        f"| {longest} | {err95:.2f} | {recoveries} | {', '.join(f'{k}={v}' for k, v in sorted(moved.items())) or '-'} |")
            if case == "max_input_age_0" and note == "accepted":
                probe.set_params({"max_input_age": 1.0})
            time.sleep(0.5)
        feeder.stop()
    finally:
        probe.close()
        est.stop()
    print(f"node from {REPO}; decoding a JointState with a 1 MB frame_id: {decode_us:.1f} µs")
    print(f"feed {1 / dt:g} Hz readings + commands (dt {dt * 1e3:g} ms); {args.seconds:g} s per case\n")
    print("| case | attack | output rate [Hz] | peak RSS [MB] | log growth [KiB] | longest log line [chars] "
          "| crank error p95 [mrad] | solver recoveries | rejected.* counted |")
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
