#!/usr/bin/env python3
"""Fused mode over steps predicted without readings: how far the disturbance estimate drifts, and what late
commands cost.

    PYTHONPATH=. python bench/disturbance_without_readings.py [--seeds 3] [--seconds 1.5]
        [--time-constant T ...] [--gap-steps 10 ...] [--commands in_time|unknown|held|held+corrected ...]
        [--start-step N ...] [--seed N ...] [--never-deliver]

The setting of test/test_bag_replay.py's robot, in the core (no DDS): the pick-and-place robot at 200 Hz
with config/pick_and_place.yaml's estimator parameters (fused, actuators trusted), the plant's exact
actuator (the bags' one: the disturbance is 0) and its PD controller.  The encoder readings are withheld
in gaps of `--gap-steps` consecutive steps, one gap every 0.1 s (what a replay over DDS on a loaded machine
has now and then: steps published from the prediction when the inputs are late): the estimator predicts
those steps from the model, and the gap's readings arrive after it (`add_late_observations`, as the node
fuses late readings).  The gap's commands (`--commands`, repeatable; default all four):

* ``in_time``: they arrive in time;
* ``unknown``: they arrive after the gap and are dropped, the steps having had no command (what the node
  handed a fused step whose per-step command did not come, before commands were held in every mode);
* ``held``: they arrive after the gap and are dropped, the steps having held the previous command (the
  zero-order hold of `InputScheduler.pop`; this bench's model before late commands were corrected);
* ``held+corrected``: as ``held``, and each late command replaces the held one in the steps it covers when it
  comes (the node now: `InputScheduler` routes it, `FixedLagEstimator.correct_commands` applies it).  The
  steps of the gap were published before their commands came: only the steps after are corrected.

The commands go through the node's `InputScheduler` (stamped on the grid, received in time or after the
gap).  `--never-deliver`: the readings never arrive.  Printed per commands × gap × `disturbance_time_constant`
(`inf`: the undamped integrated random walk): p95 and max of |applied − estimated effort| over both motors
after 0.3 s (the test's scoring), and on the steps with readings (published after the late inputs of the gap
before them came) the effort error's p95 and the RMSE of angle and effort; the median thread CPU of a step and
of a `correct_commands` call (one per gap, as the node makes one before its next step: every step the gap's
late commands cover, in one smoother update).  Never used
in tests.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

from mbfg_ros.estimation.config import EstimatorConfig  # noqa: E402
from mbfg_ros.estimation.estimator import FixedLagEstimator  # noqa: E402
from mbfg_ros.model.mechanism import load_mechanism  # noqa: E402
from mbfg_ros.ros.scheduler import NS, InputScheduler  # noqa: E402
from mbfg_ros.sim.plant import Actuator, SimulatedPlant  # noqa: E402
from mbfg_ros.tuning.params_file import read_params  # noqa: E402

SETTLE = 0.3         # [s] as test_bag_replay.py
GAP_PERIOD = 0.1     # [s] one gap of withheld readings this often
T0_NS = 1_000 * NS   # the node clock at the first step (any positive time)


def robot_config(time_constant: float) -> EstimatorConfig:
    mech = load_mechanism("pick_and_place_robot")
    p = read_params(ROOT.parent / "config" / "pick_and_place.yaml", mech)
    base = EstimatorConfig()
    sigmas = {**base.sigmas, **p.get("sigmas", {}), "disturbance_time_constant": time_constant}
    return dataclasses.replace(base, dt=5e-3, window=p["window"], mode="fused", integrator=p["integrator"],
                               sigmas=sigmas, sensor_sigmas={**p.get("sensor_sigmas", {})}).validated()


COMMANDS = ("in_time", "unknown", "held", "held+corrected")


def run(seed: int, seconds: float, time_constant: float, gap_steps: int, commands: str, deliver_late: bool,
        start: int = 0):
    mech = load_mechanism("pick_and_place_robot")
    cfg = robot_config(time_constant)
    traj = SimulatedPlant(mech, dt=cfg.dt, seed=seed, actuator=Actuator.ideal(mech)).simulate(seconds)
    names = [s.name for s in mech.sensors if s.kind == "encoder"]
    z = [int(s.coordinate) for s in mech.sensors if s.kind == "encoder"]
    period = int(round(GAP_PERIOD / cfg.dt))
    dt_ns = int(round(cfg.dt * NS))
    est = FixedLagEstimator(mech, cfg)
    sched = InputScheduler(cfg.dt, cfg.window, len(mech.actuated))
    err_effort, err_angle, with_readings = [], [], []
    correction_cpu, step_cpu = [], []
    late = []           # (estimate step, readings, grid step) withheld in the current gap
    step_ids = {}       # grid step -> estimate step (as the node keeps it)
    for k, t in enumerate(traj.t):
        if k < start:
            continue
        withheld = gap_steps > 0 and k >= period and (k % period) < gap_steps
        stamp = T0_NS + k * dt_ns
        readings = {nm: float(traj.readings[nm][k]) for nm in names}
        if not withheld and late:
            for step, r, j in late:     # the gap's inputs arrive now (readings, then commands)
                if deliver_late:
                    est.add_late_observations(step, r)
            if commands != "in_time":
                for step, r, j in late:
                    sched.add_efforts(T0_NS + j * dt_ns, np.asarray(traj.efforts[j], dtype=float), stamp)
                # the node applies the late commands received since its last step before the next one
                fixes = sched.take_command_corrections()
                if commands.endswith("+corrected") and fixes:
                    c0 = time.thread_time()
                    est.correct_commands([(step_ids[i + start], c) for i, c in fixes if i + start in step_ids])
                    correction_cpu.append(time.thread_time() - c0)
            late = []
        if not withheld or commands == "in_time":
            sched.add_efforts(stamp, np.asarray(traj.efforts[k], dtype=float), stamp)
        j, command, _ = sched.pop()
        assert j == k - start                      # (the scheduler's grid starts at the first command)
        if withheld and commands == "unknown":
            command = None
        c0 = time.thread_time()
        e = est.step(float(t), command, None if withheld else readings)
        step_cpu.append(time.thread_time() - c0)
        step_ids[k] = e.step
        if withheld:
            late.append((e.step, readings, k))
        if t >= SETTLE:
            err_effort.append(np.abs(np.asarray(e.efforts) - traj.applied[k]).max())
            err_angle.append(np.abs(e.q[z] - traj.q[k, z]).max())
            with_readings.append(not withheld)
    E, A, W = np.array(err_effort), np.array(err_angle), np.array(with_readings)
    return {"p95": float(np.percentile(E, 95)), "max": float(E.max()),
            "p95_read": float(np.percentile(E[W], 95)),
            "step_us": 1e6 * float(np.median(step_cpu)),
            "correction_us": 1e6 * float(np.median(correction_cpu)) if correction_cpu else math.nan,
            "effort_rmse_read": float(np.sqrt(np.mean(E[W] ** 2))),
            "angle_rmse_read": float(np.sqrt(np.mean(A[W] ** 2)))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=3, help="plant seeds 1 … N")
    ap.add_argument("--seed", type=int, action="append", help="this plant seed instead (repeatable; the bag of "
                                                               "test/test_bag_replay.py is seed 3)")
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--time-constant", type=float, action="append",
                    help="disturbance_time_constant values [s] (repeatable; 'inf' allowed; default inf, 3, 1, 0.3)")
    ap.add_argument("--gap-steps", type=int, action="append", help="steps per gap (repeatable; default 0, 4, 10)")
    ap.add_argument("--commands", choices=COMMANDS, action="append",
                    help="how the gaps' commands come (repeatable; default all): see the module docstring")
    ap.add_argument("--start-step", type=int, action="append",
                    help="the estimator starts at this step of the run (repeatable; default 0): the node starts "
                         "when its inputs are first heard, a few steps into a replay")
    ap.add_argument("--never-deliver", action="store_true",
                    help="the gaps' readings never arrive (default: they arrive after the gap, fused late)")
    a = ap.parse_args(argv)
    taus = a.time_constant or [math.inf, 3.0, 1.0, 0.3]
    gaps = a.gap_steps or [0, 4, 10]
    kinds = a.commands or list(COMMANDS)
    starts = a.start_step or [0]
    seeds = a.seed or list(range(1, a.seeds + 1))
    from mbfg_ros.blas import limit_blas_threads
    limit_blas_threads(1)
    print(f"pick-and-place robot, fused, config/pick_and_place.yaml, exact actuator; {len(seeds)} seeds of "
          f"{a.seconds:g} s; a gap of withheld readings every {GAP_PERIOD:g} s (readings "
          f"{'never delivered' if a.never_deliver else 'delivered late'}); scored after {SETTLE:g} s\n")
    print("| start [steps] | gap's commands | disturbance_time_constant [s] | gap [steps] | effort error p95 [N·m] | "
          "effort error max [N·m] | steps with readings: effort error p95 [N·m] | effort RMSE [N·m] | "
          "angle RMSE [mrad] | CPU median: step / correct_commands call [µs] |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for start, kind, gap, T in itertools.product(starts, kinds, gaps, taus):
        r = [run(s, a.seconds, T, gap, kind, not a.never_deliver, start) for s in seeds]
        m = {k: float(np.mean([x[k] for x in r])) for k in r[0]}
        worst = max(x["p95"] for x in r)
        print(f"| {start} | {kind} | {T:g} | {gap} | {m['p95']:.3g} (worst seed {worst:.3g}) | {m['max']:.3g} | "
              f"{m['p95_read']:.3g} | {m['effort_rmse_read']:.3g} | {1e3 * m['angle_rmse_read']:.3g} | "
              f"{m['step_us']:.0f} / {m['correction_us']:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
