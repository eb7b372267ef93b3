#!/usr/bin/env python3
"""Start-up time of the estimator node over DDS: from starting its process to its first estimate on
`~/joint_states`, while the simulated plant is already publishing (the situation of a node restarted
on a running robot), stage by stage.  `bench/startup.py` times the core alone.

    python bench/node_startup.py [--rounds 5] [--mechanism four_bar_crank] [--param NAME=VALUE ...]
                                 [--dds-profile package|none|PATH]

Each round starts `python -m mbfg_ros.ros.node` anew (imports, mechanism load, assembly, the first
window; any compilation cache is kept across rounds as it would be across runs) and stops it with
SIGINT.  Prints one row per round and the medians: the node's own stages as it logs them at its first
estimate (s after its process started: interpreter = its first module began to import, imports, rclpy.init,
node = the DDS participant exists, parameters = mechanism loaded, core built, interfaces created, started
= its loop runs, first input received, first estimate published), then this probe's view (s after it
started the process): when its subscription to `~/joint_states` matched the node's publisher, and when
the first estimate arrived (the total).

--dds-profile: the Fast DDS profile of every process here (plant, probe, estimators): `package` (default)
= config/fastdds_discovery.xml unless FASTDDS_DEFAULT_PROFILES_FILE is set, `none` = Fast DDS's defaults
(a remote that announces itself every 3 s), or a file.  Run `package` and `none` alternately to compare.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

STARTUP_LINE = re.compile(r"start-up, s after the process started: (.*)$", re.M)


def node_stages(log_text: str) -> dict:
    """The stages of the node's start-up log line: {stage: s after its process started}."""
    m = STARTUP_LINE.search(log_text)
    if not m:
        return {}
    stages = {}
    for item in m.group(1).split(", "):
        name, at = item.rsplit(" ", 1)
        stages[name] = float(at)
    return stages


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--mechanism", default="four_bar_crank")
    ap.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                    help="another estimator parameter, as for -p NAME:=VALUE (repeatable)")
    ap.add_argument("--dds-profile", default="package", metavar="package|none|PATH",
                    help="Fast DDS profile of all processes (default: the package's, unless the environment "
                         "sets FASTDDS_DEFAULT_PROFILES_FILE)")
    a = ap.parse_args(argv)
    import numpy as np
    from mbfg_ros.ros.demo import parse_params, ros_env, start_node_process, stop_process
    from mbfg_ros.ros.package_files import PROFILE_VARIABLE, plant_node_name
    params = parse_params(a.param, ap.error)
    domain_id = random.randint(1, 100)
    env = ros_env(domain_id)
    if a.dds_profile == "none":
        env.pop(PROFILE_VARIABLE, None)
        os.environ.pop(PROFILE_VARIABLE, None)
    elif a.dds_profile != "package":
        if not Path(a.dds_profile).is_file():
            ap.error(f"--dds-profile {a.dds_profile}: no such file")
        env[PROFILE_VARIABLE] = str(Path(a.dds_profile).resolve())
    os.environ.update(env)                  # this probe's participant too
    import rclpy
    from rclpy.event_handler import SubscriptionEventCallbacks
    from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import JointState

    cfg = REPO / "config" / ("four_bar.yaml" if "four_bar" in a.mechanism else "pick_and_place.yaml")
    logs = Path(tempfile.mkdtemp(prefix="mbfg_startup_"))
    plant = start_node_process("mbfg_ros.ros.sim_node", ["-r", f"__node:={plant_node_name(cfg)}",
                                                         "--params-file", str(cfg), "-p", f"mechanism:={a.mechanism}",
                                                         "-p", "duration:=0.0"],   # 0: runs until stopped
                               env, logs / "plant.log", cwd=REPO)
    rclpy.init()
    node = rclpy.create_node("mbfg_bench_startup")
    qos = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST)
    seen = {"obs": 0}
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
            probe = {}
            name = f"mbfg_startup_{i}"
            events = SubscriptionEventCallbacks(matched=lambda info: probe.setdefault("matched", time.monotonic()))
            sub = node.create_subscription(JointState, f"/{name}/joint_states",
                                           lambda m: probe.setdefault("received", time.monotonic()), qos,
                                           event_callbacks=events)
            log = logs / f"estimator_{i}.log"
            t0 = time.monotonic()
            est = start_node_process("mbfg_ros.ros.node", [*est_args, "-r", f"__node:={name}"], env, log, cwd=REPO)
            while "received" not in probe and time.monotonic() < t0 + 60 and est.poll() is None:
                rclpy.spin_once(node, timeout_sec=0.005)
            stop_process(est, timeout=20.0)
            node.destroy_subscription(sub)
            if "received" not in probe:
                raise RuntimeError(f"no estimate from round {i}:\n{log.read_text()[-2000:]}")
            row = node_stages(log.read_text())
            row.update({f"probe {k}": v - t0 for k, v in probe.items()})
            rows.append(row)
            print(f"round {i + 1}: {row['probe received']:.2f} s", flush=True)
    finally:
        stop_process(plant, timeout=20.0)
        node.destroy_node()
        rclpy.try_shutdown()
    # the stages in the order they came (by median: the loop's thread can take its first input before the
    # main thread stamps `started`)
    columns = sorted(dict.fromkeys(k for r in rows for k in r),      # (ties: in the order first seen)
                     key=lambda c: np.median([r[c] for r in rows if c in r]))
    print(f"\n{a.mechanism}, DDS profile: {env.get(PROFILE_VARIABLE, 'none (Fast DDS defaults)')}")
    print("\ns after the estimator's process started:\n")
    print("| round | " + " | ".join(columns) + " |\n|---|" + "---|" * len(columns))
    for i, r in enumerate(rows):
        print(f"| {i + 1} | " + " | ".join(f"{r[c]:.2f}" if c in r else "" for c in columns) + " |")
    print("| median | " + " | ".join(f"{np.median([r[c] for r in rows if c in r]):.2f}" for c in columns) + " |")
    total = [r["probe received"] for r in rows]
    # what discovery adds once the node is ready: its wait for the plant, and the probe's for the node
    node_wait = [max(0.0, r["first input"] - r["started"]) for r in rows if "first input" in r and "started" in r]
    probe_wait = [max(0.0, r["probe received"] - r["first estimate"]) for r in rows if "first estimate" in r]
    if node_wait and probe_wait:
        print(f"\nwaiting for discovery, median / max: the node for its first input after `started` "
              f"{np.median(node_wait):.2f} / {max(node_wait):.2f} s; the probe for the first estimate after "
              f"it was published {np.median(probe_wait):.2f} / {max(probe_wait):.2f} s")
    print(f"\n| mechanism | rounds | process start -> first estimate: median / max |\n|---|---|---|\n"
          f"| {a.mechanism} | {len(rows)} | {np.median(total):.2f} / {max(total):.2f} s |")
    print(f"\n{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} (1 min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
