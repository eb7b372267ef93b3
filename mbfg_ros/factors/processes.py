"""Continuous-time white-noise process models, exactly discretized over a step (the process noise of the
estimation and fused modes; densities in physical units).

* `IntegratedRandomWalk`: a block x (e.g. the unknown efforts) and its rate ẋ under white noise on ẍ of
  spectral density S (per component, units of x² / s³): a static linear factor between two steps.
* `white_acceleration_sigmas`: the sigmas of the integrator rows when the coordinates' accelerations carry
  white noise of density S (units of q² / s³) — the unmodelled part of the dynamics.
"""

from __future__ import annotations

import math
from typing import Tuple

import numpy as np

from mbfg_ros.factors.base import Factor, prev


def _densities(density, d: int, what: str) -> np.ndarray:
    s = np.broadcast_to(np.asarray(density, dtype=float), (d,)).copy()
    if d and not (np.all(s > 0) and np.all(np.isfinite(s))):
        raise ValueError(f"{what}: densities must be positive and finite (got {density})")
    return s


class IntegratedRandomWalk(Factor):
    """GP prior of white noise on ẍ between two steps h apart (slots x_prev, x, xd_prev, xd):

        r = [x − x_prev − h ẋ_prev;  ẋ − ẋ_prev] ~ N(0, S ⊗ [[h³/3, h²/2], [h²/2, h]])   (per component),

    the exact transition of ẍ = w, E[w(t) w(s)] = S δ(t − s).  The rows are whitened by the inverse Cholesky
    factor of that covariance (unit sigmas), so the factor stays static and linear: e = W r.  Row order:
    the d position rows, then the d rate rows."""

    linear = True
    static = True

    def __init__(self, x: str, xd: str, d: int, dt: float, density):
        self.dim = 2 * int(d)
        self.dt = h = float(dt)
        self.density = _densities(density, int(d), "IntegratedRandomWalk")
        self.slots = (prev(x), x, prev(xd), xd)
        self.sigmas = np.ones(self.dim)
        # per component: L = chol(S [[h³/3, h²/2], [h²/2, h]]) = √S [[l11, 0], [l21, l22]], W = L⁻¹
        l11 = math.sqrt(h ** 3 / 3.0)
        l21 = (h * h / 2.0) / l11
        l22 = math.sqrt(h - l21 * l21)             # = √(h/4)
        root = np.sqrt(self.density)
        w11 = 1.0 / (root * l11)
        w21 = -l21 / (root * l11 * l22)
        w22 = 1.0 / (root * l22)
        D = np.diag
        Z = np.zeros((int(d), int(d)))
        # ∂r/∂(x_prev, x, ẋ_prev, ẋ) = [[−I, I, −hI, 0], [0, 0, −I, I]], then e = W r
        self.jacobians = [np.vstack((D(-w11), D(-w21))), np.vstack((D(w11), D(w21))),
                          np.vstack((D(-h * w11), D(-h * w21 - w22))), np.vstack((Z, D(w22)))]
        self.name = f"integrated_random_walk({x},{xd})"

    def evaluate(self, x0, x1, xd0, xd1, ctx=None):
        J = self.jacobians
        e = J[0].dot(x0) + J[1].dot(x1) + J[2].dot(xd0) + J[3].dot(xd1)
        return e, J


def white_acceleration_sigmas(density: float, dt: float, integrator: str) -> Tuple[float, float]:
    """(σ of the position rows, σ of the velocity rows) of the integrators between two steps dt apart when
    the accelerations carry white noise of spectral density `density` (the state's q̈ is the model's
    acceleration; the motion's is q̈ + w).  Trapezoidal and Hermite rules: the noise of
    q₁ − q₀ − dt/2 (q̇₀ + q̇₁) (− …) is ∫(dt/2 − s) w ds, variance S dt³/12, that of q̇₁ − q̇₀ − … is ∫w ds,
    variance S dt, and the two are uncorrelated (∫(dt/2 − s) ds = 0): the diagonal sigmas are exact.
    Euler: q₁ − q₀ − dt q̇₀ carries ∫(dt − s) w ds, variance S dt³/3, correlated with the velocity row
    (S dt²/2); the correlation is dropped (Euler is a first-order rule anyway)."""
    if not (density > 0 and math.isfinite(density)):
        raise ValueError(f"acceleration density must be positive and finite (got {density})")
    cq = 1.0 / 3.0 if integrator == "euler" else 1.0 / 12.0
    return math.sqrt(density * dt ** 3 * cq), math.sqrt(density * dt)
