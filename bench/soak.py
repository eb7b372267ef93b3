#!/usr/bin/env python3
"""Soak run: the estimator node and the simulated plant over DDS for a long time; their memory, sampled.

    python bench/soak.py [--seconds 600] [--every 10] [--dt 0.001] [--code DIR]

Starts both nodes as processes (as `make demo` does: loopback discovery, a random ROS_DOMAIN_ID, the plant
running without end), samples the resident memory (VmRSS in /proc/<pid>/status) of both every `--every`
seconds, and the estimator's own counters from /diagnostics, and prints one row per sample:

    t [s] | RSS plant [MB] | RSS estimator [MB] | estimates/s | readings/s

(estimates/s: the node's `steps` counter over the interval; readings/s: the observation messages it accepted,
`input.observations.received`: on an overloaded machine the node skips ahead and refuses stale ones).  At the
end: each process's growth in kB/min, a least-squares slope over the second half of the run (the first
half holds the warm-up: allocator arenas, DDS buffers and the estimator's caches filling), and over the
whole run; then both nodes are stopped with SIGINT and their exit codes printed.  `--code DIR` runs the
nodes of another checkout (e.g. the previous version, for an A/B of the same bench).
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from mbfg_ros.ros.demo import ros_env, start_node_process, stop_process  # noqa: E402


def rss_kb(pid: int) -> float:
    """Resident memory of a process [kB] (NaN once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return float(line.split()[1])
    except OSError:
        pass
    return float("nan")


def growth_kb_per_min(t_s, rss_kb_values) -> float:
    """Least-squares slope of RSS over time [kB/min] (NaN with fewer than 2 samples)."""
    t, r = np.asarray(t_s, dtype=float), np.asarray(rss_kb_values, dtype=float)
    ok = np.isfinite(r)
    if ok.sum() < 2:
        return float("nan")
    return float(np.polyfit(t[ok], r[ok], 1)[0] * 60.0)


def steady_growth_kb_per_min(t_s, rss_kb_values) -> float:
    """The rise of RSS over time less its largest single rise between two samples [kB/min]: an allocator takes
    memory in steps (one arena extension of 32 kB within 12 s is 160 kB/min of slope, and no leak), a leak rises in
    every interval (NaN with fewer than 3 samples)."""
    t, r = np.asarray(t_s, dtype=float), np.asarray(rss_kb_values, dtype=float)
    ok = np.isfinite(r)
    t, r = t[ok], r[ok]
    if len(r) < 3 or t[-1] <= t[0]:
        return float("nan")
    rises = np.diff(r)
    return float((r[-1] - r[0] - max(rises.max(), 0.0)) / (t[-1] - t[0]) * 60.0)


class DiagnosticsCounters:
    """The estimator's latest /diagnostics counters, from a probe node in this process."""

    def __init__(self, domain_id: int):
        os.environ.update(ros_env(domain_id))      # loopback discovery for this process's probe too
        import rclpy
        from rclpy.context import Context
        from rclpy.executors import SingleThreadedExecutor
        from diagnostic_msgs.msg import DiagnosticArray
        self.rclpy = rclpy
        self.context = Context()
        rclpy.init(context=self.context, domain_id=domain_id)
        self.node = rclpy.create_node("mbfg_soak_probe", context=self.context)
        self.latest: Dict[str, str] = {}
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, 10)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._spin, daemon=True)
        self.thread.start()

    def _on_diag(self, msg):
        for st in msg.status:
            if st.name.endswith(": estimator"):
                self.latest = {kv.key: kv.value for kv in st.values}

    def _spin(self):
        while not self._stop.is_set() and self.context.ok():
            self.executor.spin_once(timeout_sec=0.1)

    def counter(self, key: str) -> float:
        try:
            return float(self.latest[key])
        except (KeyError, ValueError):
            return float("nan")

    def close(self):
        self._stop.set()
        self.thread.join(2.0)
        self.executor.shutdown(timeout_sec=1.0)
        self.node.destroy_node()
        self.rclpy.shutdown(context=self.context)


def _start(code: Path, module: str, args: List[str], env: Dict[str, str], log: Path,
           package: Optional[Path] = None) -> subprocess.Popen:
    """The node of checkout `code` (its package first on the path, or the one in folder `package`: an installed
    copy, whose kernel is built for this interpreter)."""
    env = dict(env, PYTHONPATH=str(package or code) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return start_node_process(module, args, env, log, cwd=code)


def run_soak(seconds: float = 600.0, every: float = 10.0, dt: float = 0.001, code: Path = REPO,
             domain_id: Optional[int] = None, log_dir: Optional[Path] = None, verbose: bool = True,
             startup_timeout: float = 60.0, package: Optional[Path] = None) -> Dict[str, object]:
    """Run both nodes for `seconds` after the first estimate; returns {"rows": [(t, rss plant kB, rss
    estimator kB, estimates/s, readings/s)], "growth_kb_per_min": {process: {"second_half", "whole"}},
    "exit_codes", "logs"}."""
    say = print if verbose else (lambda *a, **k: None)
    domain_id = domain_id if domain_id is not None else random.randint(1, 100)
    env = ros_env(domain_id)
    logs = Path(log_dir or tempfile.mkdtemp(prefix="mbfg_soak_"))
    logs.mkdir(parents=True, exist_ok=True)
    config = code / "config" / "four_bar.yaml"
    common = ["--params-file", str(config), "-p", f"dt:={dt}"]
    probe = DiagnosticsCounters(domain_id)
    procs = {"estimator": _start(code, "mbfg_ros.ros.node", common, env, logs / "estimator.log", package)}
    procs["plant"] = _start(code, "mbfg_ros.ros.sim_node", common + ["-p", "duration:=0.0"], env, logs / "plant.log",
                            package)
    rows = []
    try:
        t_end = time.monotonic() + startup_timeout
        while not probe.counter("steps") > 0 and time.monotonic() < t_end:
            if any(p.poll() is not None for p in procs.values()):
                break
            time.sleep(0.1)
        if not probe.counter("steps") > 0:
            raise RuntimeError(f"no estimates within {startup_timeout} s; logs in {logs}")
        say(f"[soak] ROS_DOMAIN_ID={domain_id}, dt={dt} s, {seconds:g} s, nodes of {code}; logs in {logs}")
        say(f"{'t [s]':>8} | {'RSS plant [MB]':>14} | {'RSS estimator [MB]':>18} | {'estimates/s':>11} | "
            f"{'readings/s':>10}")
        t0 = time.monotonic()
        last = (t0, probe.counter("steps"), probe.counter("input.observations.received"))
        k = 0
        while True:
            now = time.monotonic()
            steps, received = probe.counter("steps"), probe.counter("input.observations.received")
            span = max(now - last[0], 1e-9)
            row = (now - t0, rss_kb(procs["plant"].pid), rss_kb(procs["estimator"].pid),
                   (steps - last[1]) / span if k else float("nan"), (received - last[2]) / span if k else float("nan"))
            rows.append(row)
            say(f"{row[0]:8.1f} | {row[1] / 1024:14.2f} | {row[2] / 1024:18.2f} | {row[3]:11.0f} | {row[4]:10.0f}")
            last = (now, steps, received)
            k += 1
            if now - t0 >= seconds or any(p.poll() is not None for p in procs.values()):
                break
            time.sleep(max(0.0, t0 + k * every - time.monotonic()))
    finally:
        codes = {name: stop_process(p, timeout=20.0) for name, p in procs.items()}
        probe.close()
    t = [r[0] for r in rows]
    half = [i for i, ti in enumerate(t) if ti >= t[-1] / 2]
    growth = {}
    for col, name in ((1, "plant"), (2, "estimator")):
        growth[name] = {"second_half": growth_kb_per_min([t[i] for i in half], [rows[i][col] for i in half]),
                        "second_half_steady": steady_growth_kb_per_min([t[i] for i in half],
                                                                       [rows[i][col] for i in half]),
                        "whole": growth_kb_per_min(t, [r[col] for r in rows])}
    say("growth [kB/min]: " + ", ".join(f"{n} {g['second_half']:+.1f} (second half), {g['whole']:+.1f} (whole run)"
                                         for n, g in growth.items()))
    say(f"exit codes: {codes}")
    return {"rows": rows, "growth_kb_per_min": growth, "exit_codes": codes, "logs": str(logs)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=600.0, help="run length after the first estimate (default 600)")
    ap.add_argument("--every", type=float, default=10.0, help="sampling period [s] (default 10)")
    ap.add_argument("--dt", type=float, default=0.001, help="step of both nodes [s] (default 0.001: 1 kHz)")
    ap.add_argument("--code", type=Path, default=REPO, help="checkout whose nodes run (default: this one)")
    ap.add_argument("--domain-id", type=int)
    a = ap.parse_args(argv)
    if a.seconds <= 0 or a.every <= 0 or a.dt <= 0:
        ap.error("--seconds, --every and --dt must be positive")
    if not (a.code / "mbfg_ros" / "ros" / "node.py").exists():
        ap.error(f"--code {a.code}: not a checkout of mbfg_ros (no mbfg_ros/ros/node.py)")
    res = run_soak(a.seconds, a.every, a.dt, a.code.resolve(), a.domain_id)
    return 0 if all(c == 0 for c in res["exit_codes"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
