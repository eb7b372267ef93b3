#!/usr/bin/env python3
"""Start-up time of the estimator node over DDS: from starting its process to its first estimate on
`~/joint_states`, while the simulated plant is already publishing (the situation of a node restarted
on a running robot).  `bench/startup.py` times the core alone, by stage.

    python bench/node_startup.py [--rounds 5] [--mechanism four_bar_crank] [--param NAME=VALUE ...]

Each round starts `python -m mbfg_ros.ros.node` anew (imports, mechanism load, assembly, the first
window; any compilation cache is kept across rounds as it would be across runs) and stops it with
SIGINT.  Prints one row per round and the median.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--mechanism", default="four_bar_crank")
    ap.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                    help="another estimator parameter, as for -p NAME:=VALUE (repeatable)")
    a = ap.parse_args(argv)
    import numpy as np
    from mbfg_ros.ros.demo import parse_params, ros_env, start_node_process, stop_process
    params = parse_params(a.param, ap.error)
    domain_id = random.randint(1, 100)
    env = ros_env(domain_id)
    import os
    os.environ.update(env)
    import rclpy
    from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import JointState

    cfg = REPO / "config" / ("four_bar.yaml" if "four_bar" in a.mechanism else "pick_and_place.yaml")
    logs = Path(tempfile.mkdtemp(prefix="mbfg_startup_"))
    plant = start_node_process("mbfg_ros.ros.sim_node", ["--params-file", str(cfg), "-p", f"mechanism:={a.mechanism}",
                                                         "-p", "duration:=0.0"],   # 0: runs until stopped
                               env, logs / "plant.log", cwd=REPO)
    rclpy.init()
    node = rclpy.create_node("mbfg_bench_startup")
    qos = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST)
    seen = {"obs": 0, "est": 0}
    obs_sub = node.create_subscription(JointState, "/joint_observations",
                                       lambda m: seen.__setitem__("obs", seen["obs"] + 1), qos)
    rows = []
    try:
        t_end = time.monotonic() + 120
        while not seen["obs"] and time.monotonic() < t_end and plant.poll() is None:
            rclpy.spin_once(node, timeout_sec=0.05)
        if not seen["obs"]:
            raise RuntimeError(f"the plant did not start publishing:\n{(logs / 'plant.log').read_text()[-2000:]}")
        node.destroy_subscription(obs_sub)          # (1 kHz of readings would only load this process)
        est_args = ["--params-file", str(cfg), "-p", f"mechanism:={a.mechanism}"]
        for k, v in params.items():
            est_args += ["-p", f"{k}:={v}"]
        for i in range(a.rounds):
            # a node name of its own each round: no estimate of an earlier round is taken for this one's
            seen["est"] = 0
            name = f"mbfg_startup_{i}"
            sub = node.create_subscription(JointState, f"/{name}/joint_states",
                                           lambda m: seen.__setitem__("est", seen["est"] + 1), qos)
            log = logs / f"estimator_{i}.log"
            t0 = time.monotonic()
            est = start_node_process("mbfg_ros.ros.node", [*est_args, "-r", f"__node:={name}"], env, log, cwd=REPO)
            while not seen["est"] and time.monotonic() < t0 + 60 and est.poll() is None:
                rclpy.spin_once(node, timeout_sec=0.005)
            t1 = time.monotonic()
            stop_process(est, timeout=20.0)
            node.destroy_subscription(sub)
            if not seen["est"]:
                raise RuntimeError(f"no estimate from round {i}:\n{log.read_text()[-2000:]}")
            rows.append(t1 - t0)
            print(f"round {i + 1}: {t1 - t0:.2f} s", flush=True)
    finally:
        stop_process(plant, timeout=20.0)
        node.destroy_node()
        rclpy.try_shutdown()
    print(f"\n| mechanism | rounds | process start -> first estimate: median / max |\n|---|---|---|\n"
          f"| {a.mechanism} | {len(rows)} | {np.median(rows):.2f} / {max(rows):.2f} s |")
    print(f"\n{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} (1 min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
