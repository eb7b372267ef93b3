#!/usr/bin/env python3
"""A consumer of the estimator's output in a process of its own, as a controller, a recorder or RViz would
be: an ordinary rclpy node (default executor, deserialized messages) subscribed to one topic.

    python bench/consumer.py --topic /mbfg_estimator/joint_states --type JointState --out seen.json

Runs until SIGINT/SIGTERM, then writes what it saw to `--out` (JSON): the messages received, the distinct
estimates among them (by header stamp), and the delay from each estimate's stamp (the stamp of its inputs)
to its receipt here (same machine clock), so `bench/node_latency.py --consumers` can tell how many of the
estimates a real subscriber gets and how late.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time

import numpy as np

NS = 1_000_000_000


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--topic", required=True)
    ap.add_argument("--type", choices=("JointState", "JointTrajectory"), required=True)
    ap.add_argument("--reliability", choices=("reliable", "best_effort"), default="reliable")
    ap.add_argument("--depth", type=int, default=10)
    ap.add_argument("--out", required=True, help="JSON file written at exit")
    a = ap.parse_args(argv)

    import rclpy
    from rclpy.executors import ExternalShutdownException
    from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
    from rclpy.signals import SignalHandlerOptions
    if a.type == "JointState":
        from sensor_msgs.msg import JointState as Msg
    else:
        from trajectory_msgs.msg import JointTrajectory as Msg

    stamps: list = []
    delays_ns: list = []
    stop = []

    def on_msg(m):
        st = m.header.stamp.sec * NS + m.header.stamp.nanosec
        delays_ns.append(time.time_ns() - st)
        stamps.append(st)

    # our own handlers: the first signal ends the spin loop below, the node is destroyed in order
    rclpy.init(signal_handler_options=SignalHandlerOptions.NO)
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda *_: stop.append(True))
    node = rclpy.create_node("mbfg_bench_consumer")
    rel = ReliabilityPolicy.RELIABLE if a.reliability == "reliable" else ReliabilityPolicy.BEST_EFFORT
    node.create_subscription(Msg, a.topic, on_msg,
                             QoSProfile(depth=a.depth, reliability=rel, history=HistoryPolicy.KEEP_LAST))
    t0 = time.monotonic()
    try:
        while not stop:
            rclpy.spin_once(node, timeout_sec=0.05)
    except ExternalShutdownException:
        pass
    wall = time.monotonic() - t0
    node.destroy_node()
    rclpy.try_shutdown()
    d = np.asarray(delays_ns, dtype=float) / 1e6
    with open(a.out, "w") as f:
        json.dump({"topic": a.topic, "received": len(stamps), "distinct": len(set(stamps)),
                   "first_stamp": min(stamps) if stamps else None, "last_stamp": max(stamps) if stamps else None,
                   "delay_ms_median": float(np.median(d)) if d.size else None,
                   "delay_ms_p99": float(np.percentile(d, 99)) if d.size else None, "wall_s": wall}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
