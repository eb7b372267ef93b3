#!/usr/bin/env python3
"""Why one shipped effort density cannot be consistent everywhere, and what the readings say about it.

    PYTHONPATH=. python bench/effort_density_sweep.py [--seeds 3] [--seconds 3] [--scenario NAME ...]
                                                      [--density S ...]

For each estimation-mode scenario of bench/estimation_quality.py and each `effort_density` S:
* mbfg_ros (`FixedLagEstimator` with this fixed density (`adapt_densities` off), every other setting at
  its default, covariance computed): RMSE and NEES of the
  encoded angle, rate and the effort against the truth (means over the seeds, scored after 0.5 s);
* what the readings alone say about S, from the innovations of `ReducedEKF` (the same exact model and
  stochastic model: the likelihood engine of `mbfg tune`) on the same runs, after 0.5 s: the mean normalized
  innovation squared per reading (NIS; 1 when the predicted innovation covariance is right: covariance
  matching adapts S until it is 1), the lag-1 autocorrelation of the normalized innovations (0 when white) and
  the innovation log-likelihood relative to its best over the sweep (what `mbfg tune` maximizes), summed
  over the seeds.
Never used in tests.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))

import estimation_quality as eq  # noqa: E402
from mbfg_ros.estimation.config import EstimatorConfig  # noqa: E402
from mbfg_ros.factors.noise import default_sigmas  # noqa: E402
from mbfg_ros.estimation.reduced_ekf import ReducedEKF  # noqa: E402
from mbfg_ros.model.mechanism import load_mechanism  # noqa: E402

SCENARIOS = ("four_bar_estimation", "slider_crank", "robot")
DENSITIES = (1e3, 1e4, 5e4, 1e5, 3e5, 1e6)


def innovation_statistics(sc, mech, traj, density):
    """(NIS per reading, normalized innovations of the first encoder, log-likelihood) of the EKF after SETTLE."""
    names, z = eq.encoded(mech)
    sigma = np.array([s.sigma for s in mech.sensors if s.kind == "encoder"])
    f = ReducedEKF(mech, z, sc.dt, sigma, density,
                   acceleration_density=default_sigmas(mech.spec)["acceleration_density"])
    Y = np.column_stack([traj.readings[n] for n in names])
    nis, nu = [], []
    for k, t in enumerate(traj.t):
        f.step(Y[k])
        if f.innovation is not None and t >= eq.SETTLE:
            v, S = f.innovation, f.innovation_covariance
            nis.append(float(v @ np.linalg.solve(S, v)) / len(v))
            nu.append(v[0] / np.sqrt(S[0, 0]))
    return np.array(nis), np.array(nu), f.log_likelihood


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--scenario", action="append", choices=SCENARIOS)
    ap.add_argument("--density", type=float, action="append", help=f"effort densities (default {DENSITIES})")
    a = ap.parse_args(argv)
    from mbfg_ros.blas import limit_blas_threads
    limit_blas_threads(1)
    for name in a.scenario or SCENARIOS:
        sc = eq.SCENARIOS[name]
        mech = load_mechanism(sc.mechanism)
        trajs = [eq.simulate(sc, mech, s, a.seconds) for s in range(1, a.seeds + 1)]
        rows = []
        for S in a.density or DENSITIES:
            errs, nis, lag1, ll = [], [], [], 0.0
            for traj in trajs:
                base = EstimatorConfig(dt=sc.dt, mode=sc.mode, compute_covariance=True, adapt_densities=False)
                cfg = dataclasses.replace(base, sigmas={**base.sigmas, "effort_density": S})
                r = eq.run_mbfg(sc, mech, traj, cfg)
                errs.append(eq.errors(mech, r, eq.truth_of(mech, traj), traj.t >= eq.SETTLE))
                n_, nu, l_ = innovation_statistics(sc, mech, traj, S)
                nis.append(n_.mean())
                lag1.append(np.corrcoef(nu[1:], nu[:-1])[0, 1])
                ll += l_
            m = {k: float(np.mean([e[k] for e in errs])) for k in errs[0]}
            rows.append((S, m, float(np.mean(nis)), float(np.mean(lag1)), ll))
        best = max(r[4] for r in rows)
        print(f"### {name}: {sc.description} ({a.seeds} seeds of {a.seconds:g} s)\n")
        print("| effort_density | angle RMSE [mrad] | rate RMSE [rad/s] | effort RMSE [N·m] | NEES angle | NEES rate | "
              "NEES effort | EKF NIS | EKF lag-1 autocorr. | EKF log-lik. − best |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for S, m, nis, lag1, ll in rows:
            print(f"| {S:.3g} | {1e3 * m['angle']:.3g} | {m['rate']:.3g} | {m['effort']:.3g} | {m['nees_angle']:.2f} | "
                  f"{m['nees_rate']:.2f} | {m['nees_effort']:.2f} | {nis:.3f} | {lag1:.3f} | {ll - best:.1f} |")
        print(flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
