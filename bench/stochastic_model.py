#!/usr/bin/env python3
"""Accuracy of the estimator's stochastic model on the crank four-bar (markdown table on stdout).

    PYTHONPATH=. python bench/stochastic_model.py [--seconds 2] [--seeds 0 1 2] [--param NAME=VALUE ...]

Scenarios (encoder σ = 1 mrad at 1 kHz, window 10, trapezoidal, dependent coordinates, scored after 0.5 s):

* ``estimation``: unknown torque τ = 20 sin 3t + 5 cos 7t − 5 (the work of `bench/step_latency.py`'s
  estimation rows), estimation mode;
* ``fused``: the same command, applied through a mismatched actuator
  τ_applied = 0.9 τ_cmd − 1.5 N·m · tanh(θ̇ / 0.05 rad/s) − 0.3 N·m·s · θ̇, fused mode (and estimation mode on
  the same data, which fused mode must not lose to).

RMSE of the crank angle, rate and effort (against the applied effort) per scenario, their NEES (mean
squared error over the estimator's own marginal variance, `Estimate.std` / `efforts_std`: 1 when
consistent), mean over the seeds, and the mean wall time of a step (with the marginal covariance of the
newest state computed every step, `compute_covariance`).  ``--param`` overrides an estimator parameter of ``EstimatorConfig.sigmas``
(for sweeps).  Never used in tests.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from scipy.integrate import solve_ivp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mbfg_ros.dynamics.constrained import forward_dynamics            # noqa: E402
from mbfg_ros.estimation.config import EstimatorConfig               # noqa: E402
from mbfg_ros.estimation.estimator import FixedLagEstimator          # noqa: E402
from mbfg_ros.factors.noise import default_sigmas                    # noqa: E402
from mbfg_ros.model.mechanism import load_mechanism                  # noqa: E402

CRANK = 4             # index of the crank angle in q = [x1 y1 x2 y2 crank]
ENCODER_SIGMA = 1e-3  # rad


def command(t):
    return 20 * np.sin(3 * t) + 5 * np.cos(7 * t) - 5


def applied_mismatch(t, omega):
    return 0.9 * command(t) - 1.5 * np.tanh(omega / 0.05) - 0.3 * omega


def simulate(mech, seconds, dt, applied):
    """Truth sampled every dt: q, q̇ and the applied effort, by DOP853 on the index-1 equations."""
    n = mech.n
    times = np.arange(int(round(seconds / dt)) + 1) * dt

    def f(t, y):
        Q = mech.generalized_forces([applied(t, y[n + CRANK])])
        return np.concatenate((y[n:], forward_dynamics(mech, y[:n], y[n:], Q)))

    sol = solve_ivp(f, (0.0, times[-1]), np.concatenate((mech.q0, np.zeros(n))), method="DOP853",
                    t_eval=times, rtol=1e-11, atol=1e-11, max_step=10 * dt)
    q, v = sol.y[:n].T, sol.y[n:].T
    tau = np.array([applied(t, w) for t, w in zip(times, v[:, CRANK])])
    return times, q, v, tau


def run(mech, config, times, readings, commands):
    est = FixedLagEstimator(mech, config)
    out = []
    for k, t in enumerate(times):
        out.append(est.step(float(t), None if commands is None else [commands[k]], {"crank": readings[k]}))
    return out


def scores(out, times, q, v, tau, start=0.5):
    sel = times >= start
    th = np.array([e.q[CRANK] for e in out])[sel] - q[sel, CRANK]
    w = np.array([e.v[CRANK] for e in out])[sel] - v[sel, CRANK]
    ef = np.array([e.efforts[0] for e in out])[sel] - tau[sel]
    cost = np.mean([e.solve_time for e in out[1:]]) * 1e3
    rms = lambda x: float(np.sqrt(np.mean(x ** 2)))      # noqa: E731
    n = len(out[-1].q)
    sd = np.array([(e.std[CRANK], e.std[n + CRANK], e.efforts_std[0]) for e in out])[sel]
    nees = [float(np.mean((x / s) ** 2)) for x, s in zip((th, w, ef), sd.T)]
    return np.array([rms(th) * 1e3, rms(w), rms(ef), *nees, cost])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--window", type=int, default=10)
    ap.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                    help="override a parameter of EstimatorConfig.sigmas")
    args = ap.parse_args(argv)
    dt = 1e-3
    sigmas = default_sigmas()
    for item in args.param:
        name, _, value = item.partition("=")
        if name not in sigmas:
            ap.error(f"--param {item}: unknown name {name!r} (known: {', '.join(sorted(sigmas))})")
        sigmas[name] = float(value)
    mech = load_mechanism(str(ROOT / "mechanisms" / "four_bar_crank.yaml"))

    def config(mode):
        return EstimatorConfig(dt=dt, window=args.window, mode=mode, sigmas=dict(sigmas),
                               compute_covariance=True).validated()

    scenarios = [
        ("estimation (unknown smooth torque)", lambda t, w: command(t), [("estimation", False)]),
        ("fused, mismatched actuator", applied_mismatch, [("fused", True), ("estimation", False)]),
    ]
    print(f"window {args.window}, dt {dt * 1e3:g} ms, seeds {args.seeds}, scored after 0.5 s; "
          f"parameters {', '.join(args.param) or 'shipped defaults'}")
    print()
    print("| scenario | mode | angle RMSE [mrad] | rate RMSE [rad/s] | effort RMSE vs applied [N·m] | "
          "NEES angle | NEES rate | NEES effort | step incl. covariance [ms] |")
    print("|---|---|---|---|---|---|---|---|---|")
    for title, applied, modes in scenarios:
        times, q, v, tau = simulate(mech, args.seconds, dt, applied)
        cmd = command(times)
        for mode, with_commands in modes:
            res = []
            for seed in args.seeds:
                rng = np.random.default_rng(seed)
                readings = q[:, CRANK] + ENCODER_SIGMA * rng.standard_normal(times.size)
                out = run(mech, config(mode), times, readings, cmd if with_commands else None)
                res.append(scores(out, times, q, v, tau))
            m = np.mean(res, axis=0)
            print(f"| {title} | {mode} | {m[0]:.3f} | {m[1]:.4f} | {m[2]:.3f} | {m[3]:.2f} | {m[4]:.2f} | "
                  f"{m[5]:.2f} | {m[6]:.3f} |")


if __name__ == "__main__":
    main()
