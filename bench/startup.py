#!/usr/bin/env python3
"""Start-up of the estimator's core: from starting a Python process to its first estimate.

    python bench/startup.py [--repeat 5] [--mechanism four_bar_crank] [--mode fused]

Each repetition starts a fresh interpreter (`sys.executable`) that imports the estimator, loads the
mechanism, builds a `FixedLagEstimator` (window 10, dt 1 ms) and makes its first estimate from the drawn
pose's readings (the position problem, the seed, the first window); the child stamps each stage with the
wall clock and the parent subtracts the time it started the process.  Issue 14's target is ≤ 2 s for the
whole.  This is the core's share of a node's start-up: rclpy, DDS discovery and the first inputs come on top
(`bench/node_latency.py`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
stamps = {}
import numpy as np
from mbfg_ros.estimation.config import EstimatorConfig
from mbfg_ros.estimation.estimator import FixedLagEstimator
from mbfg_ros.model.mechanism import load_mechanism
stamps["imports"] = time.time()
mech = load_mechanism(sys.argv[1])
stamps["mechanism"] = time.time()
est = FixedLagEstimator(mech, EstimatorConfig(dt=1e-3, window=10, mode=sys.argv[2]))
stamps["estimator"] = time.time()
q0 = np.array(mech.q0, dtype=float)
readings = {s.name: float(q0[s.coordinate]) if s.kind == "encoder" else 0.0 for s in mech.sensors}
e = est.step(0.0, efforts=np.zeros(len(mech.actuated)), observations=readings)
stamps["first estimate"] = time.time()
stamps["status"] = e.status
print(json.dumps(stamps))
"""

STAGES = ("imports", "mechanism", "estimator", "first estimate")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--mechanism", default="four_bar_crank")
    ap.add_argument("--mode", default="fused", choices=["fused", "estimation", "forward_dynamics"])
    a = ap.parse_args(argv)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    print("| run | " + " | ".join(f"{s} (from process start)" for s in STAGES) + " |")
    print("|---|" + "---|" * len(STAGES))
    totals = []
    for i in range(a.repeat):
        t0 = time.time()
        out = subprocess.run([sys.executable, "-c", CHILD, a.mechanism, a.mode], env=env, capture_output=True,
                             text=True)
        if out.returncode != 0:
            print(f"the child failed (exit {out.returncode}):\n{out.stderr}", file=sys.stderr)
            return 1
        stamps = json.loads(out.stdout.strip().splitlines()[-1])
        if stamps["status"] != "initialized":
            print(f"unexpected first status {stamps['status']!r}", file=sys.stderr)
            return 1
        totals.append(stamps["first estimate"] - t0)
        print(f"| {i + 1} | " + " | ".join(f"{stamps[s] - t0:.2f} s" for s in STAGES) + " |", flush=True)
    totals.sort()
    print(f"\n{a.mechanism}, {a.mode}: process start to first estimate, median {totals[len(totals) // 2]:.2f} s "
          f"(target ≤ 2 s); wall clock")
    return 0


if __name__ == "__main__":
    sys.exit(main())
