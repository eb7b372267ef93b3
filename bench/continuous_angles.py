#!/usr/bin/env python3
"""Does the estimated crank stay on its encoder's turn through every path of the estimator (issue 13)?

    PYTHONPATH=. python bench/continuous_angles.py

The crank four-bar (estimation mode, 1 kHz, encoder + gyroscope) watching a plant whose crank swings around
1.38 + k·2π (k = 0, 6, -3), 1.5 s, with one path exercised at 0.4 s: none, ~reinitialize, reset, the
branch [1] then [-1] (0.2 s apart), the branch [-1], a 0.4-s gap bridged by integration, a 0.6-s gap
over max_substeps (re-initialized from an extrapolation), and 60 readings 2π + 0.5 off (believed after
max_rejections: re-initialized from them).  Per case: the largest |crank estimate − reading| from 0.2 s on
(outside the disturbed readings) and the whole turns of the last estimate from its reading.  Public API
only, so that it runs on older versions of the code too (a table to compare).

In the last case the estimate follows the off readings once they are believed, on their turn (2π + 0.5
away), and is re-initialized back from the good readings max_rejections steps after they return: the
largest offset there is 2π + 0.5 (a code that wrapped the readings near its guess followed them only
0.5 rad away).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from mbfg_ros.dynamics import kinematics                        # noqa: E402
from mbfg_ros.estimation.config import EstimatorConfig          # noqa: E402
from mbfg_ros.estimation.estimator import FixedLagEstimator     # noqa: E402
from mbfg_ros.model.mechanism import load_mechanism             # noqa: E402
from mbfg_ros.sim.plant import SimulatedPlant                   # noqa: E402

TWO_PI = 2.0 * math.pi
AT = 400                    # the step where a path is exercised


def plant(mech, turns):
    c = mech.coordinate_index("crank")
    guess = np.array(mech.q0, dtype=float)
    guess[c] = 1.38 + turns * TWO_PI
    q0 = kinematics.solve_positions(mech, guess, fixed=[c]).q
    return SimulatedPlant(mech, dt=1e-3, q0=q0, seed=7).simulate(1.5)


def run(mech, traj, case):
    c = mech.coordinate_index("crank")
    est = FixedLagEstimator(mech, EstimatorConfig(window=10, mode="estimation",
                                                  max_substeps=100 if case == "gap over max_substeps" else 10000))
    readings = {n: v.copy() for n, v in traj.readings.items()}
    skip = set()
    if case == "readings 2π+0.5 off":
        readings["crank"][AT:AT + 60] += TWO_PI + 0.5
    elif case == "gap integrated":
        skip = set(range(AT, AT + 400))
    elif case == "gap over max_substeps":
        skip = set(range(AT, AT + 600))
    offsets, last = [], None
    for k in range(len(traj.t)):
        if k == AT:
            if case == "reinitialize":
                est.reinitialize()
            elif case == "reset":
                est.reset()
            elif case == "branch [1] then [-1]":
                est.reinitialize(assembly_mode=(1,))
            elif case == "branch [-1]":
                est.reinitialize(assembly_mode=(-1,))
        if k == AT + 200 and case == "branch [1] then [-1]":
            est.reinitialize(assembly_mode=(-1,))
        if k in skip:
            continue
        e = est.step(float(traj.t[k]), observations={n: float(v[k]) for n, v in readings.items()})
        d = e.q[c] - readings["crank"][k]
        last = d
        if k >= 200 and not (case == "readings 2π+0.5 off" and AT <= k < AT + 60):
            offsets.append(d)
    return float(np.abs(offsets).max()), int(round(last / TWO_PI))


def main():
    mech = load_mechanism("four_bar_crank")
    cases = ["none", "reinitialize", "reset", "branch [1] then [-1]", "branch [-1]", "gap integrated",
             "gap over max_substeps", "readings 2π+0.5 off"]
    turns = (0, 6, -3)
    trajs = {k: plant(mech, k) for k in turns}
    print("| path (at 0.4 s) | " + " | ".join(f"crank at 1.38{k:+d}·2π: max \\|est − reading\\|, turns off"
                                              for k in turns) + " |")
    print("|---|" + "---|" * len(turns))
    for case in cases:
        cells = []
        for k in turns:
            worst, off = run(mech, trajs[k], case)
            cells.append(f"{worst:.3g} rad, {off:+d}")
        print(f"| {case} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
