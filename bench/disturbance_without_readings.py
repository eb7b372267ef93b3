#!/usr/bin/env python3
"""Fused mode over steps predicted without readings: how far the disturbance estimate drifts.

    PYTHONPATH=. python bench/disturbance_without_readings.py [--seeds 3] [--seconds 1.5]
                                                             [--time-constant T ...] [--gap-steps 10 ...]

The setting of test/test_bag_replay.py's robot, in the core (no DDS): the pick-and-place robot at 200 Hz
with config/pick_and_place.yaml's estimator parameters (fused, actuators trusted), the plant's exact
actuator (the bags' one: the disturbance is 0) and its PD controller.  The encoder readings are withheld
in gaps of `--gap-steps` consecutive steps, one gap every 0.1 s (what a replay over DDS on a loaded machine
has now and then: steps published from the prediction when the inputs are late): the estimator predicts
those steps from the model and the previous command, held (as the node does with a late command), and the
gap's readings arrive after it (`add_late_observations`, as the node fuses late readings).
`--fresh-commands`: the commands arrive in time; `--never-deliver`: the readings never arrive.  Printed per `disturbance_time_constant` (`inf`: the undamped
integrated random walk): p95 and max of |applied − estimated effort| over both motors after 0.3 s (the
test's scoring), and the RMSE of angle and effort on the steps with readings.  Never used in tests.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

from mbfg_ros.estimation.config import EstimatorConfig  # noqa: E402
from mbfg_ros.estimation.estimator import FixedLagEstimator  # noqa: E402
from mbfg_ros.model.mechanism import load_mechanism  # noqa: E402
from mbfg_ros.sim.plant import Actuator, SimulatedPlant  # noqa: E402
from mbfg_ros.tuning.params_file import read_params  # noqa: E402

SETTLE = 0.3         # [s] as test_bag_replay.py
GAP_PERIOD = 0.1     # [s] one gap of withheld readings this often


def robot_config(time_constant: float) -> EstimatorConfig:
    mech = load_mechanism("pick_and_place_robot")
    p = read_params(ROOT.parent / "config" / "pick_and_place.yaml", mech)
    base = EstimatorConfig()
    sigmas = {**base.sigmas, **p.get("sigmas", {}), "disturbance_time_constant": time_constant}
    return dataclasses.replace(base, dt=5e-3, window=p["window"], mode="fused", integrator=p["integrator"],
                               sigmas=sigmas, sensor_sigmas={**p.get("sensor_sigmas", {})}).validated()


def run(seed: int, seconds: float, time_constant: float, gap_steps: int, stale_commands: bool,
        deliver_late: bool):
    mech = load_mechanism("pick_and_place_robot")
    cfg = robot_config(time_constant)
    traj = SimulatedPlant(mech, dt=cfg.dt, seed=seed, actuator=Actuator.ideal(mech)).simulate(seconds)
    names = [s.name for s in mech.sensors if s.kind == "encoder"]
    z = [int(s.coordinate) for s in mech.sensors if s.kind == "encoder"]
    period = int(round(GAP_PERIOD / cfg.dt))
    est = FixedLagEstimator(mech, cfg)
    err_effort, err_angle, with_readings = [], [], []
    late, held = [], None           # (estimate step, readings) withheld in the current gap; the held command
    for k, t in enumerate(traj.t):
        withheld = gap_steps > 0 and k >= period and (k % period) < gap_steps
        readings = {nm: float(traj.readings[nm][k]) for nm in names}
        if not withheld and late and deliver_late:
            for step, r in late:        # the gap's readings arrive now: fused into the window if still in it
                est.add_late_observations(step, r)
        if not withheld:
            late, held = [], traj.efforts[k]
        command = held if (withheld and stale_commands) else traj.efforts[k]
        e = est.step(float(t), command, None if withheld else readings)
        if withheld:
            late.append((e.step, readings))
        if t >= SETTLE:
            err_effort.append(np.abs(np.asarray(e.efforts) - traj.applied[k]).max())
            err_angle.append(np.abs(e.q[z] - traj.q[k, z]).max())
            with_readings.append(not withheld)
    E, A, W = np.array(err_effort), np.array(err_angle), np.array(with_readings)
    return {"p95": float(np.percentile(E, 95)), "max": float(E.max()),
            "effort_rmse_read": float(np.sqrt(np.mean(E[W] ** 2))),
            "angle_rmse_read": float(np.sqrt(np.mean(A[W] ** 2)))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--time-constant", type=float, action="append",
                    help="disturbance_time_constant values [s] (repeatable; 'inf' allowed; default inf, 3, 1, 0.3)")
    ap.add_argument("--gap-steps", type=int, action="append", help="steps per gap (repeatable; default 0, 4, 10)")
    ap.add_argument("--fresh-commands", action="store_true",
                    help="the commands of the gaps' steps arrive in time (default: late too, the previous one held)")
    ap.add_argument("--never-deliver", action="store_true",
                    help="the gaps' readings never arrive (default: they arrive after the gap, fused late)")
    a = ap.parse_args(argv)
    taus = a.time_constant or [math.inf, 3.0, 1.0, 0.3]
    gaps = a.gap_steps or [0, 4, 10]
    from mbfg_ros.blas import limit_blas_threads
    limit_blas_threads(1)
    print(f"pick-and-place robot, fused, config/pick_and_place.yaml, exact actuator; {a.seeds} seeds of "
          f"{a.seconds:g} s; a gap of withheld readings every {GAP_PERIOD:g} s (commands "
          f"{'in time' if a.fresh_commands else 'late: previous held'}, readings "
          f"{'never delivered' if a.never_deliver else 'delivered late'}); scored after {SETTLE:g} s\n")
    print("| disturbance_time_constant [s] | gap [steps] | effort error p95 [N·m] | effort error max [N·m] | "
          "effort RMSE, steps with readings [N·m] | angle RMSE, steps with readings [mrad] |")
    print("|---|---|---|---|---|---|")
    for gap in gaps:
        for T in taus:
            r = [run(s, a.seconds, T, gap, not a.fresh_commands, not a.never_deliver)
                 for s in range(1, a.seeds + 1)]
            m = {k: float(np.mean([x[k] for x in r])) for k in r[0]}
            worst = max(x["p95"] for x in r)
            print(f"| {T:g} | {gap} | {m['p95']:.3g} (worst seed {worst:.3g}) | {m['max']:.3g} | "
                  f"{m['effort_rmse_read']:.3g} | {1e3 * m['angle_rmse_read']:.3g} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
