#!/usr/bin/env python3
"""Can a busy machine starve the simulated plant?  `make demo` beside CPU-burning processes, the plant's
`thread_priority` as shipped and at 0 (normal scheduling, as before it had one).

    python bench/plant_starvation.py [--burners 2] [--duration 10] [--runs 2] [--mechanism four_bar_crank]
                                     [--priorities shipped,0]

For each run and plant priority: `--burners` processes spinning (`while True: pass`, normal priority)
beside the demo's two nodes (the estimator's loop under SCHED_FIFO 50 as shipped, where the process may),
then one row: how late the plant published its samples (its own log: median / p99 / max after the due
time), the estimator's inputs refused as stale, its predicted steps (no input of their own), overruns,
`inputs_behind` reports, and the largest position error against the simulated truth.  Real-time priorities
need CAP_SYS_NICE or an rtprio limit; without them both rows run under normal scheduling (the nodes say so).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mbfg_ros.ros.demo import run_demo  # noqa: E402
from mbfg_ros.ros.package_files import config_file, plant_node_name  # noqa: E402

BURNER = "while True: pass"


def config_with_plant_priority(mechanism: str, priority, folder: Path) -> Path:
    """The shipped parameter file of `mechanism`, with the plant's thread_priority set to `priority`
    (None: as shipped)."""
    cfg = config_file("four_bar.yaml" if "four_bar" in mechanism else "pick_and_place.yaml")
    if priority is None:
        return cfg
    doc = yaml.safe_load(cfg.read_text())
    doc[f"/**/{plant_node_name(cfg)}"]["ros__parameters"]["thread_priority"] = int(priority)
    out = folder / f"{cfg.stem}_plant_priority_{priority}.yaml"
    out.write_text(yaml.safe_dump(doc))
    return out


def plant_lateness(log_dir: str) -> str:
    m = re.search(r"publish lateness (median [^)]*)\)", (Path(log_dir) / "sim.log").read_text(errors="replace"))
    return m.group(1) if m else "(no summary: the plant did not finish)"


def run_once(mechanism: str, duration: float, burners: int, priority, folder: Path) -> dict:
    cfg = config_with_plant_priority(mechanism, priority, folder)
    procs = [subprocess.Popen([sys.executable, "-c", BURNER]) for _ in range(burners)]
    try:
        res = run_demo(duration=duration, mechanism=mechanism, config=str(cfg), plot=None, verbose=False)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    d = res.get("node_diagnostics", {})
    return {"lateness": plant_lateness(res["logs"]), "stale": d.get("rejected.stale"),
            "predicted": d.get("predicted_steps"), "overruns": d.get("overruns"),
            "inputs_behind": d.get("inputs_behind"), "behind_s": d.get("input.observations.behind_s"),
            "q_max": res.get("errors", {}).get("q_max", float("nan")), "outputs": res["outputs"],
            "logs": res["logs"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--burners", type=int, default=2)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--mechanism", default="four_bar_crank")
    ap.add_argument("--priorities", default="shipped,0",
                    help="plant thread_priority values to compare, 'shipped' = the parameter file's")
    a = ap.parse_args(argv)
    priorities = [None if p == "shipped" else int(p) for p in a.priorities.split(",")]
    folder = Path(tempfile.mkdtemp(prefix="mbfg_starvation_"))
    print(f"{a.mechanism}, {a.duration:g} s, {a.burners} burners; diagnostics from the estimator's last full report")
    for run in range(a.runs):
        for priority in priorities:
            r = run_once(a.mechanism, a.duration, a.burners, priority, folder)
            print(f"run {run + 1}, plant priority {'shipped' if priority is None else priority}: lateness "
                  f"{r['lateness']}; stale {r['stale']}, predicted {r['predicted']}, overruns {r['overruns']}, "
                  f"inputs_behind {r['inputs_behind']} (behind {r['behind_s']} s), {r['outputs']} estimates, "
                  f"max |q error| {r['q_max']:.3g}  [{r['logs']}]", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
