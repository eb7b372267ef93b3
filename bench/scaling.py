#!/usr/bin/env python3
"""Per-step cost of the estimator's core against mechanism size and window (issue 14, point 4).

    python bench/scaling.py [--windows 2 10 50] [--ladders 20 40 80] [--budget 3] [--node-overhead 330]

For the four-bar with crank, the slider-crank, `pendulum_nary`, the pick-and-place robot and ladders of
four-bars of 20, 40 and 80 coordinates (`bench/ladder.py`), each at windows 2, 10 and 50: the thread CPU of
`step()` + `prepare_next_step()` and of the iSAM2 update inside it, medians in µs, as
`bench/core_step_cost.py` measures them (the same function), fed in process with the simulated plant's
readings and commands (exact actuator).  Fused mode, dependent coordinates, trapezoidal, dt = 1 ms, the
sensors' own sigmas; a mechanism without actuators (`pendulum_nary`) runs forward dynamics (what the
estimator does with it in any mode).  Each run counts the steps after a warm-up of `--warmup` steps,
at least 30 and at most `--steps`, and stops once the counted steps have taken `--budget` s of CPU.

Then the growth: cost ≈ c·n^p fitted (least squares in log-log) over every mechanism at window 10, n the
number of coordinates, for step + prepare and for the update; and the largest n at which a rate is
sustainable, i.e. step + prepare ≤ the period minus the node's own work per step (`--node-overhead`,
default 330 µs: the node with a zero-cost stand-in core took 33–35 % of a core at 1 kHz,
`bench/node_latency.py --core-cost`), from the fit and among the measured mechanisms.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
for p in (REPO, BENCH):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

MECHANISMS = ("four_bar_crank", "slider_crank", "pendulum_nary", "pick_and_place_robot")
RATES = (1000.0, 500.0, 200.0)


def measure(mech, samples, window: int, dt: float, warmup: int, budget: float):
    """Median step + prepare and median update (µs) over the steps after the warm-up, and their number."""
    import numpy as np
    from core_step_cost import step_costs
    from mbfg_ros.estimation.config import EstimatorConfig
    from mbfg_ros.estimation.estimator import FixedLagEstimator
    cfg = EstimatorConfig(dt=dt, window=window, mode="fused", formulation="dependent", integrator="trapezoidal",
                          max_substeps=1).validated()
    est = FixedLagEstimator(mech, cfg)
    step_costs(est, samples[:warmup], dt)
    steps, updates, _ = step_costs(est, samples[warmup:], dt, first=warmup, budget=budget)
    # (the step's cost and the update's on alternate steps: see `step_costs`)
    return 1e6 * float(np.nanmedian(steps)), 1e6 * float(np.nanmedian(updates)), len(steps)


def fit_power(xs, ys):
    """(c, p) of y ≈ c·x^p, least squares in log-log."""
    import numpy as np
    lx, ly = np.log(np.asarray(xs, float)), np.log(np.asarray(ys, float))
    p, logc = np.polyfit(lx, ly, 1)
    return math.exp(logc), float(p)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--windows", type=int, nargs="+", default=[2, 10, 50])
    ap.add_argument("--ladders", type=int, nargs="*", default=[20, 40, 80], help="ladder sizes (coordinates)")
    ap.add_argument("--mechanisms", nargs="*", default=list(MECHANISMS))
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--steps", type=int, default=400, help="most counted steps per run")
    ap.add_argument("--budget", type=float, default=3.0, help="CPU seconds of counted steps per run")
    ap.add_argument("--node-overhead", type=float, default=330.0, help="the node's own µs per step")
    a = ap.parse_args(argv)
    if any(w < 1 for w in a.windows):
        ap.error("--windows must be ≥ 1")
    from ladder import ladder_yaml
    from mbfg_ros.blas import limit_blas_threads
    from mbfg_ros.model.mechanism import load_mechanism
    from mbfg_ros.sim.plant import Actuator, SimulatedPlant
    limit_blas_threads(1)
    dt = 1e-3
    mechs = [(name, load_mechanism(name)) for name in a.mechanisms]
    with tempfile.TemporaryDirectory() as tmp:
        for n in a.ladders:
            path = Path(tmp) / f"ladder_{n}.yaml"
            path.write_text(ladder_yaml(n))
            mechs.append((f"ladder_{n}", load_mechanism(path)))
    rows = []
    print("| mechanism | n | mode | window | step + prepare, median | iSAM2 update, median | ratio | steps |")
    print("|---|---|---|---|---|---|---|---|")
    for name, mech in mechs:
        plant = SimulatedPlant(mech, dt=dt, seed=1, actuator=Actuator.ideal(mech))
        samples = [plant.step() for _ in range(a.warmup + a.steps)]
        mode = "fused" if len(mech.actuated) else "forward dynamics"
        for w in a.windows:
            s, u, count = measure(mech, samples, w, dt, a.warmup, a.budget)
            rows.append((name, mech.n, w, s, u))
            print(f"| {name} | {mech.n} | {mode} | {w} | {s:.0f} µs | {u:.0f} µs | {s / u:.1f} | {count} |",
                  flush=True)
    print()
    for w in a.windows:
        at = [r for r in rows if r[2] == w]
        if len({r[1] for r in at}) < 2:
            continue
        cs, ps = fit_power([r[1] for r in at], [r[3] for r in at])
        cu, pu = fit_power([r[1] for r in at], [r[4] for r in at])
        print(f"window {w}: step + prepare ≈ {cs:.3g} µs · n^{ps:.2f}, iSAM2 update ≈ {cu:.3g} µs · n^{pu:.2f}")
        for rate in RATES:
            allowed = 1e6 / rate - a.node_overhead
            n_fit = (allowed / cs) ** (1.0 / ps) if allowed > 0 and ps > 0 else float("nan")
            fits = [r for r in at if r[3] <= allowed]
            best = max(fits, key=lambda r: r[1]) if fits else None
            print(f"  {rate:.0f} Hz (step + prepare ≤ {allowed:.0f} µs): up to n ≈ {n_fit:.0f} by the fit; "
                  f"largest measured: {f'{best[0]} (n = {best[1]}, {best[3]:.0f} µs)' if best else 'none'}")
    if len(a.windows) >= 2:
        print("\ngrowth with the window (exponent of cost ≈ c·window^p, per mechanism):")
        for name, mech in mechs:
            at = [r for r in rows if r[0] == name]
            _, ps = fit_power([r[2] for r in at], [r[3] for r in at])
            _, pu = fit_power([r[2] for r in at], [r[4] for r in at])
            print(f"  {name} (n = {mech.n}): step + prepare p = {ps:.2f}, update p = {pu:.2f}")
    print(f"\nthread CPU per step, medians; dt 1 ms; fused (forward dynamics without actuators); "
          f"node overhead {a.node_overhead:.0f} µs per step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
