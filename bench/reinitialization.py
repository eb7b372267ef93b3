#!/usr/bin/env python3
"""What repeated re-initializations cost in accuracy (markdown table on stdout).

    python bench/reinitialization.py [--seeds 1,2,3] [--steps 600] [--every 0,48,20]

The pick-and-place robot (fused mode, dt = 5 ms, motor encoders) is simulated with noisy readings;
`FixedLagEstimator.reinitialize()` (what `~/reinitialize` calls) is requested every N steps on the
current branch (0 = never), and the max / RMS error of q against the truth is reported (after the
first 40 steps).  No ROS needed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def run(seed: int, steps: int, every: int, adapt_densities: bool = True):
    """(max, RMS) in mm of max |q − q_true| per step after the first 40, and the largest |Φ| a
    re-initialization reported (test/test_estimator.py checks these too; `adapt_densities`: the online density fit,
    whose bank restarts, with a 0.25-s burn-in, at every re-initialization)."""
    import numpy as np
    from mbfg_ros.estimation.config import EstimatorConfig
    from mbfg_ros.estimation.estimator import FixedLagEstimator
    from mbfg_ros.model.mechanism import load_mechanism
    from mbfg_ros.sim.plant import Actuator, SimulatedPlant
    robot = load_mechanism("pick_and_place_robot")
    plant = SimulatedPlant(robot, dt=5e-3, seed=seed, actuator=Actuator.ideal(robot))   # exact commands (fused)
    est = FixedLagEstimator(robot, EstimatorConfig(dt=5e-3, window=10, mode="fused", adapt_densities=adapt_densities,
                                                   sensor_sigmas={"motor1": 1e-3, "motor2": 1e-3}))
    err, residual = [], 0.0
    for k in range(steps):
        s = plant.step()
        e = est.step(s.t, s.efforts, s.readings)
        err.append(np.abs(e.q - s.q).max())
        if every and k % every == every - 1:
            residual = max(residual, est.reinitialize()[1])
    err = np.array(err[40:])
    return 1e3 * err.max(), 1e3 * np.sqrt(np.mean(err ** 2)), residual


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--every", default="0,48,20", help="re-initialize every N steps (0 = never), comma-separated")
    a = ap.parse_args(argv)
    seeds = [int(x) for x in a.seeds.split(",")]
    everies = [int(x) for x in a.every.split(",")]
    head = " | ".join("never" if n == 0 else f"every {n} steps ({n * 5} ms)" for n in everies)
    print(f"| seed | {head} |")
    print("|---|" + "---|" * len(everies))
    for seed in seeds:
        cells = [run(seed, a.steps, n) for n in everies]
        print(f"| {seed} | " + " | ".join(f"{mx:.2f} / {rms:.2f} mm" for mx, rms, _ in cells) + " |")
    print("\nmax / RMS of max |q − q_true| per step (robot, fused, dt 5 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
