#!/usr/bin/env python3
"""CPU per step of the estimator's core as the node runs it, and the iSAM2 update's share of it.

    python bench/core_step_cost.py [--steps 4000] [--repeat 3] [--mode fused estimation] [--window 10] [--breakdown]

The four-bar with crank, dt = 1 ms, window 10 (`--window`), encoder + gyroscope, as `config/four_bar.yaml`
sets the node up (fused mode there; `--mode` runs the given modes interleaved, repetition by repetition, so
that they see the same machine load; the simulated plant's readings and commanded efforts, fed in process:
no ROS):
`step()` + `prepare_next_step()` per 1-ms step, and inside it the `IncrementalFixedLagSmoother.update`
calls (the new step's factor and, now and then, a relinearized one).  Thread CPU time, mean / median
per step over the steps after the first 200, one line per repetition and mode; `ratio` is the median
step + prepare over the median update of the same run (issue 14's target: ≤ 2).  `estimate reads`: the
median thread CPU of the step's `calculateEstimateVector` calls, inside step + prepare: iSAM2 defers an
update's back-substitution to the first estimate read after it, so this is solver work the Python around
the solver does not control.  `--breakdown` then prints the mean cost of each part of a step (`PartTimers`,
`breakdown`).  `bench/node_latency.py --core-cost` says what a core of a given cost means for the node's
latency.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


class TimedSmoother:
    """Forwards to the smoother, adding the thread CPU of each `update` call to `spent` and of each
    `calculateEstimateVector` call to `estimate_spent` (iSAM2 defers the back-substitution of an update to the
    first estimate read after it: solver work, not the Python around it)."""

    def __init__(self, smoother):
        self._smoother = smoother
        self.spent = 0.0
        self.estimate_spent = 0.0

    def update(self, *args):
        t = time.thread_time()
        try:
            return self._smoother.update(*args)
        finally:
            self.spent += time.thread_time() - t

    def calculateEstimateVector(self, *args):
        t = time.thread_time()
        try:
            return self._smoother.calculateEstimateVector(*args)
        finally:
            self.estimate_spent += time.thread_time() - t

    def __getattr__(self, name):
        return getattr(self._smoother, name)


def step_costs(est, samples, dt: float, first: int = 0, budget: float = math.inf, min_steps: int = 30,
               alternate: bool = True):
    """Thread CPU of `step()` + `prepare_next_step()`, of the iSAM2 updates inside it and of its estimate reads
    (`TimedSmoother`), per sample (s; NaN where not measured); sample k is stepped at time (first + k)·dt.
    With `alternate` the steps of even index (first + k) run without the update timers and give the step's cost,
    the odd ones with them and give the update's and the reads' (each timer reads the thread's CPU clock, a
    system call of ~0.4 µs: four of them and their wrappers would add ~2 µs to the step they sit in); without,
    every step gives all three (the step's cost then includes the timers).  Stops early once `min_steps` steps
    have taken `budget` s."""
    step_cpu, update_cpu, estimate_cpu = [], [], []
    nan = math.nan
    for k, s in enumerate(samples):
        w = est.window
        timed_step = not alternate or (first + k) % 2 == 1
        if w is not None:
            raw = w.smoother._smoother if isinstance(w.smoother, TimedSmoother) else w.smoother
            w.smoother = TimedSmoother(raw) if timed_step else raw
        timed = w.smoother if w is not None and timed_step else None
        t = time.thread_time()
        est.step((first + k) * dt, efforts=s.efforts, observations=s.readings)
        est.smoothed_estimates()            # (empty unless smoothed_lag: what the node takes after each step)
        est.prepare_next_step()
        spent = time.thread_time() - t
        # (a step that re-seeds replaces the window: its update is not counted)
        same = timed is not None and est.window is w
        step_cpu.append(spent if not alternate or not timed_step else nan)
        update_cpu.append(timed.spent if same else (0.0 if not alternate else nan))
        estimate_cpu.append(timed.estimate_spent if same else (0.0 if not alternate else nan))
        if len(step_cpu) >= min_steps and sum(x for x in step_cpu if x == x) >= budget / (2 if alternate else 1):
            break
    return step_cpu, update_cpu, estimate_cpu


def setup(steps: int, mode: str = "fused", window: int = 10, identify: tuple = (), smoothed_lag: int = 0):
    """(estimator, samples, dt): the node's four-bar set-up and `steps` samples of the simulated plant (`identify`:
    actuator parameters identified online, `EstimatorConfig.identify`; `smoothed_lag`: the smoothed estimates)."""
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
    cfg = EstimatorConfig(dt=dt, window=window, mode=mode, formulation=p["formulation"],
                          integrator=p["integrator"], sensor_sigmas=dict(p["sensor_sigmas"]), max_substeps=1,
                          assembly_mode=tuple(p["assembly_mode"]), identify=tuple(identify),
                          smoothed_lag=int(smoothed_lag)).validated()
    plant = SimulatedPlant(mech, dt=dt, seed=1, actuator=Actuator.ideal(mech))   # the measured inputs of before
    return FixedLagEstimator(mech, cfg), [plant.step() for _ in range(steps)], dt


def run(steps: int, mode: str = "fused", window: int = 10, identify: tuple = (), smoothed_lag: int = 0):
    """(mean, median) step + prepare, (mean, median) update and median estimate reads in µs over the steps after
    the first 200."""
    import numpy as np
    est, samples, dt = setup(steps, mode, window, identify, smoothed_lag)
    step_cpu, update_cpu, estimate_cpu = step_costs(est, samples, dt)
    a, b, c = (1e6 * np.array(x[200:]) for x in (step_cpu, update_cpu, estimate_cpu))
    a, b, c = a[a == a], b[b == b], c[c == c]      # (each on its own steps: see `step_costs`)
    return a.mean(), np.median(a), b.mean(), np.median(b), np.median(c)


class PartTimers:
    """Thread CPU of parts of a step, through the core's public collaborators: the prediction
    (`StepFactors.predict`, made by `prepare_next_step`), the step's linearization (`FixedLagWindow.prepare`:
    the units, the dynamics linearization, the whitening, the gtsam factor), its addition
    (`FixedLagWindow.commit`: the iSAM2 update, the estimate read, the relinearization safeguard) and the
    Estimate (`Estimates.make` + `check`).  Each wrapper adds ~0.3 µs to the step it times."""

    PARTS = ("prediction", "linearization", "commit", "estimate")

    def __init__(self, est):
        self.spent = dict.fromkeys(self.PARTS, 0.0)
        self._wrap(est.factors, "predict", "prediction")
        self._wrap(est.estimates, "make", "estimate")
        self._wrap(est.estimates, "check", "estimate")
        self._window = None

    def watch(self, window):
        """Time this window's calls too (a re-seed makes a new window)."""
        if window is not None and window is not self._window:
            self._wrap(window, "prepare", "linearization")
            self._wrap(window, "commit", "commit")
            self._window = window

    def _wrap(self, obj, name, part):
        call, spent = getattr(obj, name), self.spent

        def timed(*args, **kwargs):
            t = time.thread_time()
            try:
                return call(*args, **kwargs)
            finally:
                spent[part] += time.thread_time() - t
        setattr(obj, name, timed)


def breakdown(steps: int, mode: str = "fused", window: int = 10, identify: tuple = ()) -> dict:
    """Mean thread CPU per step (µs) of step + prepare and of its parts (`PartTimers`, the update and the
    estimate reads of `TimedSmoother`) over the steps after the first 200; `rest` is what the facade, the
    stepper, the gate and the sensors take besides."""
    est, samples, dt = setup(steps, mode, window, identify)
    step_costs(est, samples[:200], dt, alternate=False)
    parts = PartTimers(est)
    totals = [0.0, 0.0, 0.0]
    for k in range(200, len(samples)):
        parts.watch(est.window)
        for i, x in enumerate(step_costs(est, samples[k:k + 1], dt, first=k, alternate=False)):
            totals[i] += x[0]
    n = len(samples) - 200
    out = {"step + prepare": totals[0], **parts.spent, "update": totals[1], "estimate reads": totals[2]}
    out = {key: 1e6 * val / n for key, val in out.items()}
    out["safeguard, rest of commit"] = out["commit"] - out["update"] - out["estimate reads"]
    out["rest"] = out["step + prepare"] - sum(out[p] for p in PartTimers.PARTS)
    return out


def kernel_choice(kernel: str):
    """(The compiled kernel is the package's only form of the per-step numbers: one choice.)"""
    return contextlib.nullcontext()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--mode", nargs="+", default=["fused"], choices=["fused", "estimation", "forward_dynamics"],
                    help="modes to run, interleaved (default: fused)")
    ap.add_argument("--window", type=int, default=10)
    ap.add_argument("--breakdown", action="store_true",
                    help="then the mean cost of each part of a step, per mode (one more run each)")
    ap.add_argument("--kernel", nargs="+", default=["compiled"], choices=["compiled"],
                    help="(the compiled kernel, mbfg_ros.native: the only form since it is required)")
    ap.add_argument("--identify", nargs="+", default=None, metavar="JOINT.PARAMETER",
                    help="also each case with these actuator parameters identified online (e.g. crank.gain "
                         "crank.viscous_friction), interleaved with the case without")
    ap.add_argument("--smoothed-lag", type=int, default=0, metavar="N",
                    help="also each case with the smoothed estimates N steps later (smoothed_lag), interleaved")
    a = ap.parse_args(argv)
    cases = [((), 0)] + ([(tuple(a.identify), 0)] if a.identify else []) + \
        ([((), a.smoothed_lag)] if a.smoothed_lag else [])
    if a.steps <= 200:
        ap.error("--steps must be over 200 (the first 200 steps are not counted)")
    print("| run | mode | kernel | identified | step + prepare, mean / median | iSAM2 update, mean / median | "
          "update share | ratio | estimate reads, median |")
    print("|---|---|---|---|---|---|---|---|---|")
    for i in range(a.repeat):
        for mode in a.mode:
            for kernel in a.kernel:
                for identify, lag in cases:
                    with kernel_choice(kernel):
                        sm, smed, um, umed, emed = run(a.steps, mode, a.window, identify, lag)
                    shown_mode = f"{mode}, smoothed {lag}" if lag else mode
                    print(f"| {i + 1} | {shown_mode} | {kernel} | {', '.join(identify) or 'none'} | {sm:.0f} / {smed:.0f} µs "
                          f"| {um:.0f} / {umed:.0f} µs | {100 * um / sm:.0f} % | {smed / umed:.2f} | {emed:.1f} µs |",
                          flush=True)
    print(f"\nfour-bar with crank, dt 1 ms, window {a.window}, encoder + gyroscope; thread CPU per step; "
          f"ratio = median step + prepare / median update; estimate reads = the step's calculateEstimateVector "
          f"calls (the first after an update does iSAM2's deferred back-substitution)")
    if a.breakdown:
        cols = ("step + prepare", "prediction", "linearization", "update", "estimate reads",
                "safeguard, rest of commit", "estimate", "rest")
        print("\n| mode | kernel | identified | " + " | ".join(cols) + " |")
        print("|---|---|---|" + "---|" * len(cols))
        for mode in a.mode:
            for kernel in a.kernel:
                for identify, lag in cases:
                    if lag:
                        continue
                    with kernel_choice(kernel):
                        b = breakdown(a.steps, mode, a.window, identify)
                    print(f"| {mode} | {kernel} | {', '.join(identify) or 'none'} | "
                          + " | ".join(f"{b[c]:.1f}" for c in cols) + " |", flush=True)
        print("\nmeans in µs per step: prediction = StepFactors.predict (in prepare_next_step); linearization = "
              "FixedLagWindow.prepare (units, dynamics, whitening, gtsam factor); update and estimate reads inside "
              "FixedLagWindow.commit; estimate = Estimates.make + check; rest = facade, stepper, gate, sensors "
              "(and the timers, ~2 µs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
