#!/usr/bin/env python3
"""Real time stamps: is the estimate as accurate on readings whose stamps jitter and drift as on uniform ones,
and which way of stepping the estimator through them is better (docs/decisions.md, "Inputs and time").

    PYTHONPATH=. python bench/jittered_stamps.py [--scenario four_bar_estimation ...] [--seeds 3] [--seconds 3]
                                                 [--late-share 0.05] [--late-max 2.7] [--drift 0.01]

The truth is `SimulatedPlant` at a tenth of the scenario's step (the scenarios of bench/estimation_quality.py,
encoders only, σ from the mechanism file); between its samples the encoded coordinates are interpolated by
cubic Hermite polynomials (angle from angle and rate, rate from rate and acceleration), the effort is the one
the plant held over that sample.  Readings = truth at the stamp + N(0, σ).

Stamps:
* "uniform": every scenario step dt;
* "jittered": every interval dt·(1 + drift) (a logger whose loop runs slow: the stamps are true times), and a
  share `--late-share` of them stretched by a factor uniform in [1.2, `--late-max`] (late samples);
  the issue's acrobot recording: 4.7 % of steps up to 2.7×, its clock 107 ms behind over 12 s (0.9 %).

Ways through the jittered stamps (each `FixedLagEstimator`, shipped defaults, `dt` the median interval as
`mbfg estimate` takes it):
* "a step per reading": `step(t_k)` at each stamp (what `mbfg estimate` does: a step of the actual interval;
  an interval over 1.5 dt is bridged by sub-steps of about dt, the reading at the last);
* "grid + readings at their times": steps at the uniform grid k·dt and at each stamp (the union, in order),
  the readings at their stamps: the estimator's own grid with the readings placed at their true times;
* "grid, readings at the nearest step": steps on the grid only, each reading put on the nearest grid step
  (what a user who resamples gets; the later reading wins where two land on one step);
* "grid, readings shifted to the step": as the last, each reading moved onto its step by the previous
  estimate's motion (`mbfg_ros.ros.alignment.ReadingAlignment`: what the node does).

Scored at the times each way estimates (the stamps; the grid for the last) after 0.5 s: RMS error of the encoded
coordinates' angle [mrad], rate [rad/s] and the actuator effort [N·m] (pooled over actuators), the share of
steps whose angle is > 10 σ of the encoder from the truth, and the CPU per reading [µs].  Means over the seeds.
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))

from estimation_quality import SCENARIOS, Scenario, encoded  # noqa: E402
from mbfg_ros.estimation.config import EstimatorConfig  # noqa: E402
from mbfg_ros.estimation.estimator import FixedLagEstimator  # noqa: E402
from mbfg_ros.model.mechanism import Mechanism, load_mechanism  # noqa: E402
from mbfg_ros.ros.alignment import NS, ReadingAlignment  # noqa: E402
from mbfg_ros.sim.plant import Actuator, SimulatedPlant  # noqa: E402

SETTLE = 0.5        # [s] scored from here on
FINE = 10           # truth samples per scenario step
LOST_SIGMAS = 10.0  # an angle error above this many encoder σ: the estimate is not following


class Truth:
    """The plant at a fine step; the encoded coordinates' angle and rate and the efforts at any time."""

    def __init__(self, sc: Scenario, mech: Mechanism, seconds: float):
        actuator = Actuator.default_mismatch(mech) if sc.mismatch else Actuator.ideal(mech)
        plant = SimulatedPlant(mech, dt=sc.dt / FINE, substeps=1, profile=sc.law, actuator=actuator, noise=False)
        traj = plant.simulate(seconds + 5 * sc.dt)
        _, z = encoded(mech)
        self.t, self.h = traj.t, sc.dt / FINE
        self.q, self.v, self.a = traj.q[:, z], traj.v[:, z], traj.a[:, z]
        self.applied, self.command = traj.applied, traj.efforts

    def at(self, t: np.ndarray) -> Dict[str, np.ndarray]:
        k = np.clip(np.floor((t - self.t[0]) / self.h + 1e-9).astype(int), 0, len(self.t) - 2)
        s = ((t - self.t[k]) / self.h)[:, None]
        h = self.h

        def hermite(p0, p1, m0, m1):
            return ((2 * s ** 3 - 3 * s ** 2 + 1) * p0 + (s ** 3 - 2 * s ** 2 + s) * h * m0
                    + (-2 * s ** 3 + 3 * s ** 2) * p1 + (s ** 3 - s ** 2) * h * m1)

        return {"angle": hermite(self.q[k], self.q[k + 1], self.v[k], self.v[k + 1]),
                "rate": hermite(self.v[k], self.v[k + 1], self.a[k], self.a[k + 1]),
                "effort": self.applied[k], "command": self.command[k]}


def stamps(kind: str, dt: float, seconds: float, rng, late_share: float, late_max: float, drift: float):
    if kind == "uniform":
        return np.arange(int(round(seconds / dt)) + 1) * dt
    n = int(seconds / dt) + 1
    steps = np.full(n, dt * (1.0 + drift))
    late = rng.random(n) < late_share
    steps[late] *= rng.uniform(1.2, late_max, late.sum())
    t = np.concatenate([[0.0], np.cumsum(steps)])
    return t[t <= seconds]


def run(sc: Scenario, mech: Mechanism, truth: Truth, t_read: np.ndarray, readings: np.ndarray, way: str,
        dt: float) -> Tuple[np.ndarray, Dict[str, np.ndarray], float]:
    """(times of the scored estimates, their angle/rate/effort, CPU s per reading) of one way of stepping."""
    names, z = encoded(mech)
    fused = sc.mode == "fused"
    if way == "per_reading":
        times, reading_at = t_read, {k: k for k in range(len(t_read))}
    else:
        grid = np.arange(int(math.floor(t_read[-1] / dt)) + 1) * dt
        if way == "grid_union":
            times = np.union1d(grid, t_read)
            reading_at = {int(np.searchsorted(times, tr)): k for k, tr in enumerate(t_read)}
        else:    # grid_nearest, grid_shifted
            times = grid
            nearest = np.clip(np.rint(t_read / dt).astype(int), 0, len(grid) - 1)
            reading_at = {int(g): k for k, g in enumerate(nearest)}
    commands = truth.at(times)["command"] if fused else None
    est = FixedLagEstimator(mech, EstimatorConfig(dt=dt, mode=sc.mode))
    out = {q: np.empty((len(times), len(z))) for q in ("angle", "rate")}
    out["effort"] = np.empty((len(times), len(mech.actuated)))
    alignment = ReadingAlignment(mech) if way == "grid_shifted" else None
    last = None
    c0 = time.process_time()
    for i, t in enumerate(times):
        k = reading_at.get(i)
        obs = {} if k is None else {nm: float(readings[k, j]) for j, nm in enumerate(names)}
        if obs and alignment is not None and last is not None:
            obs = alignment.to_step(obs, dict.fromkeys(obs, int(round(t_read[k] * NS))), int(round(t * NS)),
                                    last.v, last.a, int(round(last.t * NS)))
        e = last = est.step(float(t), commands[i] if fused else None, obs)
        out["angle"][i], out["rate"][i], out["effort"][i] = e.q[z], e.v[z], e.efforts
    cpu = (time.process_time() - c0) / len(t_read)
    if way == "grid_union":       # scored where the readings are
        idx = sorted(reading_at)
        times = times[idx]
        out = {q: v[idx] for q, v in out.items()}
    return times, out, cpu


def score(truth: Truth, times, est, sigma) -> Dict[str, float]:
    sel = times >= SETTLE
    ref = truth.at(times[sel])
    res = {}
    for q in ("angle", "rate", "effort"):
        e = est[q][sel] - ref[q]
        if q == "angle":
            e = (e + math.pi) % (2 * math.pi) - math.pi
            res["lost"] = float(np.mean(np.any(np.abs(e) > LOST_SIGMAS * sigma, axis=1)))
        res[q] = float(np.sqrt(np.mean(e ** 2)))
    return res


WAYS = {"per_reading": "a step per reading", "grid_union": "grid + readings at their times",
        "grid_nearest": "grid, readings at the nearest step", "grid_shifted": "grid, readings shifted to the step"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", nargs="+", default=["four_bar_estimation", "robot"], choices=sorted(SCENARIOS))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--late-share", type=float, default=0.05)
    p.add_argument("--late-max", type=float, default=2.7)
    p.add_argument("--drift", type=float, default=0.01)
    a = p.parse_args(argv)
    print(f"# {platform.machine()}, Python {platform.python_version()}; {a.seeds} seeds × {a.seconds:g} s, "
          f"jitter: {100 * a.late_share:g} % of intervals × U(1.2, {a.late_max:g}), drift {100 * a.drift:g} %")
    for name in a.scenario:
        sc = SCENARIOS[name]
        mech = load_mechanism(sc.mechanism)
        names, _ = encoded(mech)
        sigma = np.array([next(s.sigma for s in mech.sensors if s.name == nm) for nm in names])
        rows: Dict[str, List[Dict[str, float]]] = {}
        for seed in range(a.seeds):
            truth = Truth(sc, mech, a.seconds)
            rng = np.random.default_rng(seed)
            for kind in ("uniform", "jittered"):
                t_read = stamps(kind, sc.dt, a.seconds, rng, a.late_share, a.late_max, a.drift)
                readings = truth.at(t_read)["angle"] + sigma * rng.standard_normal((len(t_read), len(names)))
                dt = float(np.median(np.diff(t_read)))
                ways = ["per_reading"] if kind == "uniform" else list(WAYS)
                for way in ways:
                    times, est, cpu = run(sc, mech, truth, t_read, readings, way, dt)
                    r = score(truth, times, est, sigma)
                    r["cpu_us"] = 1e6 * cpu
                    label = "uniform stamps" if kind == "uniform" else f"jittered: {WAYS[way]}"
                    rows.setdefault(label, []).append(r)
        print(f"\n## {name}: {sc.description}, mode {sc.mode}\n")
        print("| stamps: way | angle [mrad] | rate [rad/s] | effort [N·m] | steps > 10σ off | CPU per reading [µs] |")
        print("|---|---|---|---|---|---|")
        for label, rs in rows.items():
            m = {k: float(np.mean([r[k] for r in rs])) for k in rs[0]}
            print(f"| {label} | {1e3 * m['angle']:.3f} | {m['rate']:.4f} | {m['effort']:.3f} | "
                  f"{100 * m['lost']:.2f} % | {m['cpu_us']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
