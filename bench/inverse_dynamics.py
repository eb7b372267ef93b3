#!/usr/bin/env python3
"""Staged batch inverse dynamics (paper §7.2, Table 3): wall time per stage and torque accuracy.

    python bench/inverse_dynamics.py [--engine sparse|gtsam] [--repeat 3] [--quick]

Cases (as in the paper):
  * four-bar with crank (four_bar_crank.yaml): θ(t) = 1.2 (1 − cos 2t), Δt = 5 ms, 2000 samples (10 s);
  * pick-and-place robot: both motors move from the YAML pose by (−0.4, +0.8) rad with a 5th-order
    rest-to-rest polynomial over 5 s, Δt = 5 ms, 1001 samples (1000 steps).
The reference is the closed-form inverse dynamics (`dynamics.inverse_dynamics`) on the exact motion
(analytic θ, θ̇, θ̈; dependent q, q̇, q̈ from the position, velocity and acceleration problems).
Times are the best of --repeat runs; the paper's C++/GTSAM times (i7-8700) are for comparison.
Prints a markdown table.
"""

import argparse
import os
import platform
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from mbfg_ros.batch.inverse_dynamics import staged_inverse_dynamics  # noqa: E402
from mbfg_ros.batch.trajectories import closed_form_efforts, closed_form_motion, quintic_move  # noqa: E402
from mbfg_ros.model.mechanism import load_mechanism  # noqa: E402

PAPER_SECONDS = {"four-bar": 5.3, "robot": 15.9}


def four_bar_case(N=2000, dt=0.005):
    mech = load_mechanism("four_bar_crank")
    t = np.arange(N) * dt
    th, thd, thdd = 1.2 * (1 - np.cos(2 * t)), 2.4 * np.sin(2 * t), 4.8 * np.cos(2 * t)
    return mech, dt, th[:, None], thd[:, None], thdd[:, None]


def robot_case(N=1001, dt=0.005):
    mech = load_mechanism("pick_and_place_robot")
    t = np.arange(N) * dt
    start = np.array(mech.q0)[list(mech.actuated)]
    val, rate, acc = quintic_move(t, start, start + [-0.4, 0.8], 0.0, t[-1])
    return mech, dt, val, rate, acc


def run_case(name, case, engine, repeat):
    mech, dt, val, rate, acc = case
    q, v, a = closed_form_motion(mech, val, rate, acc)
    ref = closed_form_efforts(mech, q, v, a)
    best = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        res = staged_inverse_dynamics(mech, val, dt, engine=engine)
        wall = time.perf_counter() - t0
        if best is None or wall < best[0]:
            best = (wall, res)
    wall, res = best
    err = res.tau - ref
    return {
        "name": name, "samples": len(val), "stages": [s.seconds for s in res.stages],
        "iterations": [s.iterations for s in res.stages], "total": wall,
        "rms": np.sqrt(np.mean(err ** 2, axis=0)), "max": np.abs(err).max(axis=0),
        "tau0": res.tau[0], "ref0": ref[0], "follow": np.abs(res.q[:, list(mech.actuated)] - val).max(),
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", choices=("sparse", "gtsam"), default="sparse")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="a tenth of the samples (smoke test)")
    args = p.parse_args(argv)
    div = 10 if args.quick else 1
    rows = [run_case("four-bar", four_bar_case(2000 // div), args.engine, args.repeat),
            run_case("robot", robot_case(1000 // div + 1), args.engine, args.repeat)]
    print(f"Staged batch inverse dynamics, engine `{args.engine}`, best of {args.repeat}; "
          f"{platform.processor() or platform.machine()}, Python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs\n")
    print("| mechanism | samples | stage 1 [s] | stage 2 [s] | stage 3 [s] | stage 4 [s] | total [s] "
          "| paper C++ [s] | speed-up | LM iterations | RMS τ error [N·m] | max τ error [N·m] | τ(0) [N·m] "
          "| max following error [rad] |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        paper = PAPER_SECONDS[r["name"]] if not args.quick else float("nan")
        st = " | ".join(f"{s:.3f}" for s in r["stages"])
        print(f"| {r['name']} | {r['samples']} | {st} | {r['total']:.2f} | {paper:.1f} | "
              f"{paper / r['total']:.1f}× | {'/'.join(map(str, r['iterations']))} | "
              f"{', '.join(f'{x:.4f}' for x in r['rms'])} | {', '.join(f'{x:.3f}' for x in r['max'])} | "
              f"{', '.join(f'{x:.3f}' for x in r['tau0'])} (closed form {', '.join(f'{x:.3f}' for x in r['ref0'])}) | "
              f"{r['follow']:.1e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
