#!/usr/bin/env python3
"""Per-step latency and accuracy of the fixed-lag estimator (markdown table on stdout).

    PYTHONPATH=. python bench/step_latency.py [--seconds 5] [--robot-steps 300] [--repeat 1]

* four-bar free fall (the paper's experiment, g = 9.8, from the Listing-1 pose at rest), forward
  dynamics, dependent coordinates, Δt = 1 ms, Nw = 2, 5, 10, trapezoidal and hermite: RMSE and max error
  of the moving points against the exact reference (test/reference_four_bar.py);
* pick-and-place robot driven by smooth motor torques, RMSE of all moving points against a DOP853
  integration (rtol 1e-11) of the index-1 equations q̈(q, q̇) of the same model;
* four-bar-with-crank in estimation mode (encoder σ = 1 mrad at 1 kHz, torque unknown): crank-rate and
  torque RMSE after 0.5 s.

Wall time per `step()` call (solve_time, whole step: prediction, linearization, gtsam update,
relinearization check, Estimate) excluding the initialization step; CPU time of the calling thread is
given too because this machine is shared (wall-time outliers are other processes).  Never used in tests.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
from scipy.integrate import solve_ivp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "test"))

import reference_four_bar as R                            # noqa: E402
from mbfg_ros.dynamics.constrained import forward_dynamics            # noqa: E402
from mbfg_ros.estimation.config import EstimatorConfig             # noqa: E402
from mbfg_ros.estimation.estimator import FixedLagEstimator          # noqa: E402
from mbfg_ros.model.mechanism import Mechanism, load_mechanism      # noqa: E402


def timed_run(est, times, efforts=None, observations=None):
    out, wall, cpu = [], [], []
    for k, t in enumerate(times):
        c0 = time.thread_time()
        e = est.step(float(t), None if efforts is None else efforts(k), None if observations is None else observations(k))
        cpu.append(time.thread_time() - c0)
        wall.append(e.solve_time)
        out.append(e)
    return out, np.array(wall[1:]) * 1e3, np.array(cpu[1:]) * 1e3


def stats(ms):
    return f"{ms.mean():.3f} | {np.median(ms):.3f} | {np.percentile(ms, 99):.3f} | {ms.max():.3f}"


def robot_reference(mech, times, tau_fn):
    n = mech.n

    def f(t, y):
        Q = mech.generalized_forces(tau_fn(t))
        return np.concatenate((y[n:], forward_dynamics(mech, y[:n], y[n:], Q)))

    sol = solve_ivp(f, (times[0], times[-1]), np.concatenate((mech.q0, np.zeros(n))), method="DOP853",
                    t_eval=times, rtol=1e-11, atol=1e-11)
    return sol.y[:n].T


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="four-bar horizon (default 5 s)")
    ap.add_argument("--robot-steps", type=int, default=300)
    ap.add_argument("--repeat", type=int, default=1, help="repeat each forward-dynamics run, keep the fastest "
                                                          "(mean wall time): the machine may be shared")
    args = ap.parse_args(argv)

    dt = 1e-3
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load average "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}; Python {platform.python_version()}\n")
    print("| case | integrator | Nw | steps | wall mean | median | p99 | max (ms) | CPU mean | CPU p99 (ms) "
          "| RMSE (mm) | max err (mm) | relin. |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")

    ref = R.free_fall(args.seconds, dt, 9.8)
    four_bar = Mechanism(R.four_bar_spec(9.8))
    for integrator in ("trapezoidal", "hermite"):
        for nw in (2, 5, 10):
            best = None
            for _ in range(max(1, args.repeat)):
                est = FixedLagEstimator(four_bar, EstimatorConfig(dt=dt, window=nw, integrator=integrator))
                out, wall, cpu = timed_run(est, ref.t)
                if best is None or wall.mean() < best[1].mean():
                    best = (out, wall, cpu, est)
            out, wall, cpu, est = best
            rmse, worst = R.point_errors(np.array([e.q for e in out]), ref)
            print(f"| four-bar free fall | {integrator} | {nw} | {len(out)} | {stats(wall)} | {cpu.mean():.3f} | "
                  f"{np.percentile(cpu, 99):.3f} | {rmse * 1e3:.3g} | {worst * 1e3:.3g} | {est.relinearizations} |")

    robot = load_mechanism(str(ROOT / "mechanisms" / "pick_and_place_robot.yaml"))
    times = np.arange(args.robot_steps + 1) * dt

    def tau_fn(t):
        return np.array([3.0 * np.sin(4.0 * t), -2.0 * np.cos(3.0 * t)])

    qref = robot_reference(robot, times, tau_fn)
    pts = slice(0, robot.n_point_coordinates)
    for integrator in ("trapezoidal", "hermite"):
        for nw in (2, 10):
            best = None
            for _ in range(max(1, args.repeat)):
                est = FixedLagEstimator(robot, EstimatorConfig(dt=dt, window=nw, integrator=integrator))
                run_ = timed_run(est, times, efforts=lambda k: tau_fn(times[k]))
                if best is None or run_[1].mean() < best[1].mean():
                    best = run_
            out, wall, cpu = best
            q = np.array([e.q for e in out])
            d = q[:, pts] - qref[:, pts]
            rmse = float(np.sqrt(np.mean(d ** 2)))
            worst = float(np.max(np.hypot(d[:, 0::2], d[:, 1::2])))
            print(f"| pick-and-place robot | {integrator} | {nw} | {len(out)} | {stats(wall)} | {cpu.mean():.3f} | "
                  f"{np.percentile(cpu, 99):.3f} | {rmse * 1e3:.3g} | {worst * 1e3:.3g} | {est.relinearizations} |")

    # online estimation: encoder only, torque unknown
    crank = load_mechanism(str(ROOT / "mechanisms" / "four_bar_crank.yaml"))

    def torque(t):
        return 20 * np.sin(3 * t) + 5 * np.cos(7 * t) - 5

    drv = R.simulate(2.0, dt, 9.81, torque)
    rng = np.random.default_rng(0)
    readings = drv.theta + 1e-3 * rng.standard_normal(drv.t.size)
    lines = []
    for nw in (2, 10):
        est = FixedLagEstimator(crank, EstimatorConfig(dt=dt, window=nw, mode="estimation"))
        out, wall, cpu = timed_run(est, drv.t, observations=lambda k: {"crank": readings[k]})
        sel = drv.t >= 0.5
        w = np.array([e.v[4] for e in out])[sel] - drv.omega[sel]
        tq = np.array([e.efforts[0] for e in out])[sel] - drv.tau[sel]
        th = np.array([e.q[4] for e in out])[sel] - drv.theta[sel]
        print(f"| crank four-bar, estimation (encoder) | trapezoidal | {nw} | {len(out)} | {stats(wall)} | "
              f"{cpu.mean():.3f} | {np.percentile(cpu, 99):.3f} | – | – | {est.relinearizations} |")
        lines.append(f"estimation Nw={nw}: crank angle RMSE {np.sqrt(np.mean(th ** 2)) * 1e3:.3f} mrad, "
                     f"rate RMSE {np.sqrt(np.mean(w ** 2)):.4f} rad/s (max {np.abs(w).max():.3f}), "
                     f"torque RMSE {np.sqrt(np.mean(tq ** 2)):.3f} N·m (max {np.abs(tq).max():.2f}) after 0.5 s")
    print()
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
