#!/usr/bin/env python3
"""CPU per step of the estimator's core as the node runs it, and the iSAM2 update's share of it.

    python bench/core_step_cost.py [--steps 4000] [--repeat 3]

The four-bar with crank, fused mode, dt = 1 ms, window 10, encoder + gyroscope, as `config/four_bar.yaml`
sets the node up (the simulated plant's readings and commanded efforts, fed in process: no ROS):
`step()` + `prepare_next_step()` per 1-ms step, and inside it the `IncrementalFixedLagSmoother.update`
calls (the new step's factor and, now and then, a relinearized one).  Thread CPU time, mean / median
per step over the steps after the first 200, one line per repetition.  `bench/node_latency.py
--core-cost` says what a core of a given cost means for the node's latency.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


class _TimedSmoother:
    """Forwards to the smoother, adding the thread CPU of each `update` call to `spent`."""

    def __init__(self, smoother):
        self._smoother = smoother
        self.spent = 0.0

    def update(self, *args):
        t = time.thread_time()
        try:
            return self._smoother.update(*args)
        finally:
            self.spent += time.thread_time() - t

    def __getattr__(self, name):
        return getattr(self._smoother, name)


def run(steps: int):
    import numpy as np
    from mbfg_ros.ros.demo import estimator_parameters
    from mbfg_ros.estimation.config import EstimatorConfig
    from mbfg_ros.blas import limit_blas_threads
    from mbfg_ros.estimation.estimator import FixedLagEstimator
    from mbfg_ros.model.mechanism import load_mechanism
    from mbfg_ros.sim.plant import Actuator, SimulatedPlant
    limit_blas_threads(1)
    p = estimator_parameters(REPO / "config" / "four_bar.yaml")
    mech = load_mechanism(p["mechanism"])
    dt = float(p["dt"])
    cfg = EstimatorConfig(dt=dt, window=int(p["window"]), mode=p["mode"], formulation=p["formulation"],
                          integrator=p["integrator"], sensor_sigmas=dict(p["sensor_sigmas"]), max_substeps=1,
                          assembly_mode=tuple(p["assembly_mode"])).validated()
    plant = SimulatedPlant(mech, dt=dt, seed=1, actuator=Actuator.ideal(mech))   # the measured inputs of before
    samples = [plant.step() for _ in range(steps)]
    est = FixedLagEstimator(mech, cfg)
    step_cpu, update_cpu = [], []
    timed = None
    for k, s in enumerate(samples):
        w = est.window
        if w is not None and not isinstance(w.smoother, _TimedSmoother):   # (a new window after a re-seed)
            timed = w.smoother = _TimedSmoother(w.smoother)
        before = timed.spent if timed is not None else 0.0
        t = time.thread_time()
        est.step(k * dt, efforts=s.efforts, observations=s.readings)
        est.prepare_next_step()
        step_cpu.append(time.thread_time() - t)
        update_cpu.append((timed.spent if timed is not None else 0.0) - before)
    a, b = 1e6 * np.array(step_cpu[200:]), 1e6 * np.array(update_cpu[200:])
    return a.mean(), np.median(a), b.mean(), np.median(b)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args(argv)
    print("| run | step + prepare, mean / median | iSAM2 update, mean / median | update share |")
    print("|---|---|---|---|")
    for i in range(a.repeat):
        sm, smed, um, umed = run(a.steps)
        print(f"| {i + 1} | {sm:.0f} / {smed:.0f} µs | {um:.0f} / {umed:.0f} µs | {100 * um / sm:.0f} % |")
    print("\nfour-bar with crank, fused, dt 1 ms, window 10, encoder + gyroscope; thread CPU per step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
