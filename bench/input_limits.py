#!/usr/bin/env python3
"""The input plausibility limits (mbfg_ros.model.plausibility) against what the shipped mechanisms really
see, what commands up to the limit do to a running estimate, and what the checks cost (markdown on stdout).

    python bench/input_limits.py [--seconds 4] [--attack 0.5] [--factors 0.01,0.1,1]

1. Per shipped mechanism with actuators: the default effort_limit and max_rate against the largest
   command and gyroscope rate of the simulated plant's controller (`sim.plant`, seed 1).
2. The crank four-bar in fused mode at dt = 1 ms (in process, exact commands): for `--attack` seconds
   the commands given to the estimator are replaced by factor × effort_limit (the plant keeps its own);
   the estimator's recoveries and its crank-angle error after the attack ended (what a command just
   inside the limit can do; a command outside it is refused before the estimator sees it).
3. The cost of parsing an input message with the checks (the node's `conversions` parsers), in µs.
No ROS needed for 1 and 2; 3 needs the ROS message packages (skipped without them).
"""

from __future__ import annotations

import argparse
import math
import sys
import timeit
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def limits_table(seconds: float) -> str:
    from mbfg_ros.model.mechanism import load_mechanism
    from mbfg_ros.model.plausibility import InputLimits
    from mbfg_ros.sim.plant import SimulatedPlant
    rows = ["| mechanism | actuator | effort_limit | plant's max \\|command\\| | ratio | gyroscope | max_rate | "
            "plant's max \\|rate\\| |", "|---|---|---|---|---|---|---|---|"]
    for name, dt in (("four_bar_crank", 1e-3), ("slider_crank", 1e-3), ("pick_and_place_robot", 5e-3)):
        mech = load_mechanism(name)
        limits = InputLimits(mech)
        traj = SimulatedPlant(mech, dt=dt, seed=1).simulate(seconds)
        peak = np.abs(np.asarray(traj.efforts)).max(axis=0)
        gyros = [s.name for s in mech.sensors if s.kind == "gyroscope"]
        for k, joint in enumerate(mech.actuator_names):
            g = gyros[k] if k < len(gyros) else None
            rate = (f"{g} | {limits.max_rates[g]:.4g} rad/s | {np.abs(traj.readings[g]).max():.3g} rad/s" if g
                    else "– | – | –")
            rows.append(f"| {name} | {joint} | {limits.effort_limits[k]:.5g} {limits.effort_units[k]} | "
                        f"{peak[k]:.4g} | {limits.effort_limits[k] / peak[k]:.0f}× | {rate} |")
    return "\n".join(rows)


def attack_row(factor: float, seconds: float, attack: float, seed: int = 3) -> str:
    """Fused crank four-bar, dt 1 ms: commands replaced by factor × effort_limit from t = 1 s for `attack` s."""
    from mbfg_ros.estimation.config import EstimatorConfig
    from mbfg_ros.estimation.estimator import FixedLagEstimator
    from mbfg_ros.model.mechanism import load_mechanism
    from mbfg_ros.model.plausibility import InputLimits
    from mbfg_ros.sim.plant import Actuator, SimulatedPlant
    dt = 1e-3
    mech = load_mechanism("four_bar_crank")
    limit = InputLimits(mech).effort_limits
    traj = SimulatedPlant(mech, dt=dt, seed=seed, actuator=Actuator.ideal(mech)).simulate(seconds)
    est = FixedLagEstimator(mech, EstimatorConfig(dt=dt, window=10, mode="fused"))
    c = mech.coordinate_index("crank")
    t_on, t_off = 1.0, 1.0 + attack
    recoveries, err_after, first_ok = 0, [], None
    for k, t in enumerate(traj.t):
        cmd = traj.efforts[k]
        if factor and t_on <= t < t_off:
            cmd = factor * limit
        readings = {name: float(v[k]) for name, v in traj.readings.items()}
        e = est.step(float(t), cmd, readings)
        recoveries += e.status == "recovered"
        if t >= t_off:
            err = abs(e.q[c] - traj.q[k][c])          # not modulo 2π: a turn off counts
            err_after.append(err)
            if first_ok is None and err < 1e-2:
                first_ok = t - t_off
    err_after = np.array(err_after)
    back = f"{first_ok * 1e3:.0f} ms" if first_ok is not None else "never"
    return (f"| {factor:g} × effort_limit ({factor * limit[0]:.4g} N·m) | {recoveries} | {back} | "
            f"{err_after[err_after.size // 2:].max():.3g} rad |")


def parse_cost() -> str:
    try:
        from rclpy.serialization import serialize_message
        from sensor_msgs.msg import JointState
    except ImportError:
        return "(parsing cost: skipped, no ROS message packages)"
    from mbfg_ros.model.mechanism import load_mechanism
    from mbfg_ros.model.plausibility import InputLimits
    from mbfg_ros.ros import conversions as rc
    mech = load_mechanism("four_bar_crank")
    limits = InputLimits(mech)
    q = np.array(mech.q0)
    obs, eff = JointState(), JointState()
    obs.name, obs.position, obs.velocity = ["crank", "coupler_gyro"], [0.1, math.nan], [math.nan, 0.2]
    eff.name, eff.effort = ["crank"], [1.0]
    raw_obs, raw_eff = (serialize_message(m) for m in (obs, eff))
    sensors, actuators = rc.sensor_fields(mech), {"crank": 0}
    cases = {"decode a JointState (encoder + gyroscope)": lambda: rc.decode_joint_state(raw_obs),
             "parse_observations (2 readings, with the checks)":
                 lambda d=rc.decode_joint_state(raw_obs): rc.parse_observations(d, sensors, limits, q),
             "parse_effort_joint_state (1 effort, with the check)":
                 lambda d=rc.decode_joint_state(raw_eff): rc.parse_effort_joint_state(d, actuators, limits),
             "parse_effort_array (1 effort, with the check)": lambda: rc.parse_effort_array([1.0], limits)}
    rows = ["| call | µs (best of 5 × 20000) |", "|---|---|"]
    for label, fn in cases.items():
        rows.append(f"| {label} | {min(timeit.repeat(fn, number=20000, repeat=5)) / 20000 * 1e6:.2f} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=4.0, help="simulated seconds per run")
    ap.add_argument("--attack", type=float, default=0.5, help="seconds of commands at factor × effort_limit")
    ap.add_argument("--factors", default="0,0.01,0.1,1", help="comma-separated (0: the plant's own commands)")
    a = ap.parse_args(argv)
    print("Default limits against the simulated plant's controller (seed 1, "
          f"{a.seconds:g} s):\n\n{limits_table(a.seconds)}\n")
    print(f"Crank four-bar, fused, dt 1 ms, in process: the estimator's commands replaced by factor × "
          f"effort_limit for {a.attack:g} s from t = 1 s (the plant keeps its own):\n")
    print("| commands during the attack | recoveries | crank error < 0.01 rad again after | "
          "max crank error over the last half after |\n|---|---|---|---|")
    for f in (float(x) for x in a.factors.split(",")):
        print(attack_row(f, a.seconds, a.attack), flush=True)
    print(f"\nParsing cost (the node's input path):\n\n{parse_cost()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
