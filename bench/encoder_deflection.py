#!/usr/bin/env python3
"""Which stochastic model do the real double pendulum's readings choose for what the rigid model leaves out?

    PYTHONPATH=. python bench/encoder_deflection.py [--recording NAME ...] [--fit-seconds 5] [--evaluations 150]

The estimator explains the motion its rigid-body model does not by white acceleration noise (density S_a, the
`acceleration_density`) beside the unknown efforts (an integrated random walk, density S_τ).  On the DFKI
recordings (`bench/real_hardware.py`) the online fit chooses a large S_a, and estimation mode's shoulder torque
then trails the measured one by ~90 ms.  The encoders sit on the motors, behind a gear: what they read differs
from the link's angle by the gear's play and elasticity — a small, correlated, *bounded* offset, not an
acceleration whose integral wanders without bound.  This bench asks the readings: one EKF on the mechanism file's
model (`real_hardware.DfkiModel`, joint coordinates, RK4 mean, series-discretized covariance) per family,

* ``acceleration``: state (q, q̇, τ, τ̇); S_a, S_τ and the encoder σ fitted (the estimator's model today);
* ``deflection``: state (q, q̇, τ, τ̇, b); the encoders read q + b, b a first-order Gauss–Markov deflection
  per joint (ḃ = −b/T_b + w, stationary σ_b): σ_b, T_b, S_τ and σ fitted, no acceleration noise;
* ``both``: deflection and acceleration noise;

fitted by maximum innovation likelihood (Nelder–Mead in log10, from fixed starts) on the first `--fit-seconds`
of the run, then run over the whole run and scored as `real_hardware.score` does (effort against the measured
torque less the friction the model leaves out, full band and ≤ 5 Hz, the low band's lag, 2σ coverage), beside
the truth-tuned textbook EKF of `real_hardware` (tuned on another run of the design).  The log-likelihood
columns are per family over the fit span and the whole run (higher: the readings prefer it).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Dict, Optional, Sequence

import numpy as np
from scipy.optimize import minimize

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_hardware as RH  # noqa: E402

SIMPLEX_STEP = 0.5     # [decades] the first simplex's edges

FAMILIES = {
    # family: (fitted parameters, their log10 starts, fixed values)
    "acceleration": (("acceleration_density", "effort_density", "sigma"), (0.0, 2.0, -3.5), {}),
    "deflection": (("effort_density", "sigma", "deflection_sigma", "deflection_time_constant"),
                   (2.0, -3.5, -2.5, -1.5), {"acceleration_density": 0.0}),
    "both": (("acceleration_density", "effort_density", "sigma", "deflection_sigma", "deflection_time_constant"),
             (-1.0, 2.0, -3.5, -2.5, -1.5), {}),
}


class ModelEKF:
    """EKF on `model` with state (q, q̇, τ, τ̇[, b]) of a two-joint machine, estimation mode (τ unknown): τ̈ white
    (density S_τ), q̈ = M⁻¹(τ − c + G − F) + white noise (S_a), readings q + b (σ), b Gauss–Markov (σ_b, T_b)."""

    def __init__(self, model: "RH.DfkiModel", p: Dict[str, float]):
        self.model = model
        self.deflection = p.get("deflection_sigma", 0.0) > 0
        self.n = 10 if self.deflection else 8
        n = self.n
        self.R = p["sigma"] ** 2 * np.eye(2)
        self.H = np.zeros((2, n))
        self.H[:, :2] = np.eye(2)
        self.Qc = np.zeros((n, n))
        self.Qc[2, 2] = self.Qc[3, 3] = p["acceleration_density"]
        self.Qc[6, 6] = self.Qc[7, 7] = p["effort_density"]
        self.A0 = np.zeros((n, n))
        self.A0[:2, 2:4] = self.A0[4:6, 6:8] = np.eye(2)
        self.P0 = np.diag([p["sigma"] ** 2] * 2 + [1.0] * 6 + [p.get("deflection_sigma", 0.0) ** 2] * (n - 8))
        if self.deflection:
            self.T = p["deflection_time_constant"]
            self.H[:, 8:10] = np.eye(2)
            self.Qc[8, 8] = self.Qc[9, 9] = 2.0 * p["deflection_sigma"] ** 2 / self.T
            self.A0[8:10, 8:10] = -np.eye(2) / self.T
        self.x: Optional[np.ndarray] = None
        self.P = self.P0
        self.log_likelihood = 0.0

    def f(self, x) -> np.ndarray:
        out = self.A0 @ x
        out[2:4] = self.model.accelerations(x[:2], x[2:4], x[4:6])
        return out

    def step(self, h: float, z) -> None:
        n = self.n
        if self.x is None:
            self.x = np.zeros(n)
            self.x[:2] = z
            return
        x = self.x
        A = self.A0.copy()
        for j in range(4):                                     # central differences in q, q̇
            d = np.zeros(n)
            d[j] = 1e-6 * max(1.0, abs(x[j]))
            A[2:4, j] = (self.f(x + d)[2:4] - self.f(x - d)[2:4]) / (2 * d[j])
        A[2:4, 4:6] = np.linalg.inv(self.model.mass_matrix(x[:2]))
        k1 = self.f(x)
        k2 = self.f(x + 0.5 * h * k1)
        k3 = self.f(x + 0.5 * h * k2)
        k4 = self.f(x + h * k3)
        x = x + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        A2 = A @ A
        F = np.eye(n) + A * h + A2 * (h * h / 2) + A2 @ A * (h ** 3 / 6)
        AQ = A @ self.Qc
        Qd = (self.Qc * h + (AQ + AQ.T) * (h * h / 2) + (AQ @ A.T) * (h ** 3 / 3)
              + (A @ AQ + (A @ AQ).T) * (h ** 3 / 6))
        P = F @ self.P @ F.T + Qd
        r = z - self.H @ x
        S = self.H @ P @ self.H.T + self.R
        K = np.linalg.solve(S, self.H @ P).T
        self.x = x + K @ r
        IKH = np.eye(n) - K @ self.H
        self.P = IKH @ P @ IKH.T + K @ self.R @ K.T
        self.log_likelihood += -0.5 * (r @ np.linalg.solve(S, r) + math.log(np.linalg.det(2 * math.pi * S)))


def run(model, rec: "RH.Recording", p: Dict[str, float]):
    """(log-likelihood, Output) of the family's EKF with parameters p over `rec`."""
    ekf = ModelEKF(model, p)
    N = len(rec.t)
    out = RH.Output(*(np.full((N, 2), np.nan) for _ in range(4)))
    for k in range(N):
        ekf.step(float(rec.t[k] - rec.t[k - 1]) if k else 0.0, rec.q[k])
        out.q[k], out.qd[k], out.tau[k] = ekf.x[:2] + (ekf.x[8:10] if ekf.deflection else 0.0), ekf.x[2:4], ekf.x[4:6]
        out.tau_std[k] = np.sqrt(np.diagonal(ekf.P)[4:6])
    return ekf.log_likelihood, out


def fit(model, rec, family: str, evaluations: int) -> Dict[str, float]:
    names, start, fixed = FAMILIES[family]

    def params(z):
        return {**fixed, **{k: 10.0 ** v for k, v in zip(names, z)}}

    def cost(z):
        try:
            ll = run(model, rec, params(z))[0]
        except (np.linalg.LinAlgError, ValueError, FloatingPointError):
            return 1e12
        return -ll if np.isfinite(ll) else 1e12

    x0 = np.array(start, dtype=float)
    simplex = np.vstack([x0] + [x0 + SIMPLEX_STEP * np.eye(len(x0))[i] for i in range(len(x0))])
    best = minimize(cost, x0, method="Nelder-Mead",
                    options={"xatol": 0.05, "fatol": 0.5, "maxfev": evaluations, "initial_simplex": simplex})
    return params(best.x)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recording", nargs="*", default=[n for n in RH.RECORDINGS if "sys_id" in n]
                    + [n for n in RH.RECORDINGS if "acrobot" in n])
    ap.add_argument("--fit-seconds", type=float, default=5.0)
    ap.add_argument("--evaluations", type=int, default=150, help="Nelder–Mead's evaluations per fit")
    ap.add_argument("--families", nargs="*", default=list(FAMILIES), choices=list(FAMILIES))
    args = ap.parse_args(argv)
    rows = []
    for name in args.recording:
        rec = RH.load_recording(name)
        params = RH.dfki_parameters(rec.design)
        modelled = RH.friction_modelled(RH.design_mechanism(rec.design))
        model, truth = RH.DfkiModel(params, friction=modelled), RH.truth_of(rec, params, modelled)
        short = RH.RECORDINGS[name][1]
        tuning = RH.load_recording(RH.TUNING_RUN[name])
        ekf = RH.tuned_ekf(model, rec, tuning, RH.POSITION_STEP / math.sqrt(12), False)
        rows.append((short, "textbook EKF, truth-tuned", "–", None, None, RH.score(rec, truth, ekf)))
        for family in args.families:
            t0 = time.process_time()
            p = fit(model, rec.cut(args.fit_seconds), family, args.evaluations)
            ll_fit = run(model, rec.cut(args.fit_seconds), p)[0]
            ll, out = run(model, rec, p)
            fitted = ", ".join(f"{k.replace('_density', ' S').replace('deflection_', 'b ')} {v:.3g}"
                               for k, v in p.items() if v)
            rows.append((short, family, fitted, ll_fit, ll, RH.score(rec, truth, out)))
            print(f"{short} {family}: {fitted}; log-likelihood {ll_fit:.1f} / {ll:.1f}; "
                  f"{time.process_time() - t0:.0f} s CPU", file=sys.stderr, flush=True)
    print("| run | model | fitted | log-lik. fit / run | effort RMSE τ1 / τ2 [N·m] | ≤ 5 Hz [N·m] "
          "| ≤ 5 Hz lag [ms] | 2σ coverage |")
    print("|---|---|---|---|---|---|---|---|")
    for short, family, fitted, ll_fit, ll, s in rows:
        lik = "–" if ll is None else f"{ll_fit:.0f} / {ll:.0f}"
        cov = "–" if s["coverage"] is None or family.startswith("textbook") else RH._pair(s["coverage"], "{:.0f}", 100, " %")
        print(f"| {short} | {family} | {fitted} | {lik} | {RH._pair(s['effort'])} | {RH._pair(s['effort_band'])} "
              f"| {RH._pair(s['effort_lag'], '{:.0f}', 1000)} | {cov} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
