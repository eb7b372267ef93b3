#!/usr/bin/env python3
"""Start-up of the estimator's core: from starting a Python process to its first estimate.

    python bench/startup.py [--repeat 5] [--mechanism four_bar_crank] [--mode fused]
    python bench/startup.py --imports [--repeat 5]     # the node's imports by top-level package

Each repetition starts a fresh interpreter (`sys.executable`) that imports the estimator, loads the
mechanism, builds a `FixedLagEstimator` (window 10, dt 1 ms) and makes its first estimate from the drawn
pose's readings (the position problem, the seed, the first window); the child stamps each stage with the
wall clock and the parent subtracts the time it started the process.  Issue 14's target is ≤ 2 s for the
whole.  This is the core's share of a node's start-up: rclpy, DDS discovery and the first inputs come on top
(`bench/node_startup.py`).

`--imports`: what importing the estimator node (`mbfg_ros.ros.node`) costs, by package: each fresh
interpreter runs with `-X importtime`; a module's own import time is charged to the package that the
interpreter or mbfg_ros imported and that pulled it in (the numpy modules that scipy imports are scipy's).
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
NODE_MODULE = "mbfg_ros.ros.node"


def import_times(env, repeat: int) -> int:
    """`--imports`: the node module's import time by package (ms, median over `repeat` runs)."""
    import re
    from collections import defaultdict
    line = re.compile(r"import time:\s+(\d+) \|\s+\d+ \| ( *)(\S+)")
    per_run = []
    for _ in range(repeat):
        out = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {NODE_MODULE}"], env=env,
                             capture_output=True, text=True)
        if out.returncode != 0:
            print(f"the child failed (exit {out.returncode}):\n{out.stderr[-3000:]}", file=sys.stderr)
            return 1
        # -X importtime lists a module after the modules its import imported, indented one level deeper
        stack = []          # [level, name, self ms, children]
        for m in line.finditer(out.stderr):
            node = [len(m.group(2)) // 2, m.group(3), int(m.group(1)) / 1e3, []]
            while stack and stack[-1][0] > node[0]:
                node[3].insert(0, stack.pop())
            stack.append(node)
        charged = defaultdict(float)

        def charge(node, owner):
            # a package imported by the interpreter or by mbfg_ros answers for all it pulls in
            if owner in (None, "mbfg_ros"):
                owner = node[1].split(".")[0]
            charged[owner] += node[2]
            for child in node[3]:
                charge(child, owner)

        for root in stack:
            charge(root, None)
        per_run.append(charged)

    def median(package):
        return sorted(r.get(package, 0.0) for r in per_run)[repeat // 2]

    packages = sorted({p for r in per_run for p in r}, key=lambda p: -median(p))
    total = sorted(sum(r.values()) for r in per_run)[repeat // 2]
    print(f"Importing {NODE_MODULE}: each package that the interpreter or mbfg_ros imports, with all it pulls "
          f"in (e.g. scipy's share of numpy), ms (median of {repeat} fresh interpreters)\n")
    print("| package | ms |\n|---|---|")
    for p in packages[:10]:
        print(f"| {p} | {median(p):.0f} |")
    print(f"| (the rest) | {total - sum(median(p) for p in packages[:10]):.0f} |\n| total | {total:.0f} |")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--mechanism", default="four_bar_crank")
    ap.add_argument("--mode", default="fused", choices=["fused", "estimation", "forward_dynamics"])
    ap.add_argument("--imports", action="store_true", help=f"time the imports of {NODE_MODULE} by package")
    a = ap.parse_args(argv)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    if a.imports:
        return import_times(env, a.repeat)
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
