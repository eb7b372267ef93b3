"""Continuous-time white-noise process models, exactly discretized over a step (the process noise of the
estimation and fused modes; densities in physical units).

* `IntegratedRandomWalk`: a block x (e.g. the unknown efforts) and its rate ẋ under white noise on ẍ of
  spectral density S (per component, units of x² / s³), optionally damped back to 0 with a time constant
  (the disturbance of fused mode): a static linear factor between two steps.
* `GaussMarkov`: a block under a first-order Gauss–Markov (Ornstein–Uhlenbeck) process of stationary σ and time
  constant T (the encoders' deflection): a static linear factor between two steps.
* `white_acceleration_sigmas`: the sigmas of the integrator rows when the coordinates' accelerations carry
  white noise of density S (units of q² / s³) — the unmodelled part of the dynamics.
"""

from __future__ import annotations

import math
from typing import Tuple

import numpy as np

from mbfg_ros.factors.base import Factor, prev
from mbfg_ros.factors.noise import FOREVER


def _densities(density, d: int, what: str) -> np.ndarray:
    s = np.broadcast_to(np.asarray(density, dtype=float), (d,)).copy()
    if d and not (np.all(s > 0) and np.all(np.isfinite(s))):
        raise ValueError(f"{what}: densities must be positive and finite (got {density})")
    return s


def _exponential_moments(rate: float, h: float) -> Tuple[float, float, float]:
    """(J0, J1, J2), Jn = ∫₀ʰ sⁿ e^{−rate·s} ds, without cancellation for small rate·h (a series there)."""
    x = rate * h
    if x < 1.0:
        # ∫₀¹ uⁿ e^{−xu} du = Σ_k (−x)^k / (k! (n + k + 1)); 25 terms: x^25/25! < 1e-25
        g = [0.0, 0.0, 0.0]
        term = 1.0                                   # (−x)^k / k!
        for k in range(25):
            for n in range(3):
                g[n] += term / (n + k + 1)
            term *= -x / (k + 1)
    else:
        e = math.exp(-x)
        g = [(1.0 - e) / x, (1.0 - e * (1.0 + x)) / x ** 2, (2.0 - e * (2.0 + 2.0 * x + x * x)) / x ** 3]
    return g[0] * h, g[1] * h * h, g[2] * h ** 3


def damped_walk_transition(h: float, time_constant: float):
    """(Φ, C): the exact transition over h of (x, ẋ) under ẍ = −(2/T) ẋ − x/T² + w (critically damped,
    ω = 1/T; T = ∞: the integrated random walk ẍ = w), and the covariance C of its noise for a unit density,
    per component: x(h) = Φ (x, ẋ)(0) + ∫ Φ(h − s) [0, 1]ᵀ w ds, C = ∫₀ʰ φ(s) φ(s)ᵀ ds with
    φ(s) = e^{−ωs} (s, 1 − ωs)."""
    w = 0.0 if math.isinf(time_constant) else 1.0 / float(time_constant)
    e = math.exp(-w * h)
    Phi = e * np.array([[1.0 + w * h, h], [-w * w * h, 1.0 - w * h]])
    J0, J1, J2 = _exponential_moments(2.0 * w, h)
    c11 = J2
    c12 = J1 - w * J2
    c22 = J0 - 2.0 * w * J1 + w * w * J2
    return Phi, np.array([[c11, c12], [c12, c22]])


def rate_damped_walk_transition(h: float, rate_time_constant: float):
    """(Φ, C) as `damped_walk_transition` for ẍ = −ẋ/T_v + w (the rate an Ornstein–Uhlenbeck process of time
    constant T_v, x its integral: between the integrated random walk, T_v = ∞, and a random walk of density
    S T_v², T_v → 0).  With a = 1/T_v, φ(s) = ((1 − e^{−as})/a, e^{−as}); the moments by a double series where
    a·h < 1 (the closed forms cancel there)."""
    a = 0.0 if math.isinf(rate_time_constant) else 1.0 / float(rate_time_constant)
    x = a * h
    e1 = -math.expm1(-x)                             # 1 − e^{−ah}
    Phi = np.array([[1.0, h if x == 0.0 else e1 / a], [0.0, 1.0 - e1]])
    if x < 1.0:
        # (1 − e^{−as})/a = Σᵢ (−a)ⁱ s^{i+1}/(i+1)!, e^{−as} = Σⱼ (−a)ʲ sʲ/j!, integrated term by term
        c11 = c12 = 0.0
        fi = 1.0                                     # (−x)ⁱ/(i+1)!
        for i in range(25):
            fj = 1.0                                 # (−x)ʲ/j!
            for j in range(25 - i):
                c11 += fi * fj / ((j + 1) * (i + j + 3))
                c12 += fi * fj / (i + j + 2)
                fj *= -x / (j + 1)
            fi *= -x / (i + 2)
        c11 *= h ** 3
        c12 *= h * h
        c22 = h * (-math.expm1(-2.0 * x) / (2.0 * x) if x > 0.0 else 1.0)
    else:
        e2 = -math.expm1(-2.0 * x)                   # 1 − e^{−2ah}
        c11 = (h - 2.0 * e1 / a + e2 / (2.0 * a)) / (a * a)
        c12 = (e1 - 0.5 * e2) / (a * a)
        c22 = e2 / (2.0 * a)
    return Phi, np.array([[c11, c12], [c12, c22]])


class IntegratedRandomWalk(Factor):
    """GP prior of white noise on ẍ between two steps h apart (slots x_prev, x, xd_prev, xd), optionally
    damped back to 0 with a time constant T (critically damped: ẍ = −(2/T) ẋ − x/T² + w):

        r = [x; ẋ] − Φ(h) [x_prev; ẋ_prev] ~ N(0, S ⊗ C(h))   (per component),

    the exact transition of that linear SDE with E[w(t) w(s)] = S δ(t − s) (`damped_walk_transition`), or with
    its rate alone damped, ẍ = −ẋ/T_v + w (`rate_time_constant` T_v: a smooth effort whose rate forgets,
    `rate_damped_walk_transition`).
    T = ∞ (the default) is the integrated random walk: Φ = [[1, h], [0, 1]], C = [[h³/3, h²/2], [h²/2, h]];
    its prediction without readings keeps x's rate, so x drifts without bound.  A finite T keeps the
    prior bounded (stationary σ_x = √(S T³/4), σ_ẋ = √(S T/4)) and pulls x back to 0 over a few T: for a
    quantity whose expected value is 0, such as the disturbance of a trusted actuator.
    The rows are whitened by the inverse Cholesky factor of S C (unit sigmas), so the factor stays static and
    linear: e = W r.  Row order: the d position rows, then the d rate rows."""

    linear = True
    static = True

    def __init__(self, x: str, xd: str, d: int, dt: float, density, time_constant: float = math.inf,
                 rate_time_constant: float = math.inf):
        self.dim = 2 * int(d)
        self.dt = h = float(dt)
        self.density = _densities(density, int(d), "IntegratedRandomWalk")
        for what, value in (("time constant", time_constant), ("rate's time constant", rate_time_constant)):
            if not (value > 0):
                raise ValueError(f"IntegratedRandomWalk: the {what} must be > 0 seconds or inf (got {value})")
        if math.isfinite(time_constant) and math.isfinite(rate_time_constant):
            raise ValueError("IntegratedRandomWalk: either a time constant or the rate's, not both")
        self.time_constant = float(time_constant)
        self.rate_time_constant = float(rate_time_constant) if rate_time_constant < FOREVER else math.inf
        self.slots = (prev(x), x, prev(xd), xd)
        self.sigmas = np.ones(self.dim)
        if math.isfinite(self.rate_time_constant):
            Phi, C = rate_damped_walk_transition(h, self.rate_time_constant)
        else:
            Phi, C = damped_walk_transition(h, self.time_constant)
        self.transition = Phi
        # per component: chol(S C) = √S [[l11, 0], [l21, l22]], W = its inverse
        l11 = math.sqrt(C[0, 0])
        l21 = C[0, 1] / l11
        l22 = math.sqrt(C[1, 1] - l21 * l21)
        root = np.sqrt(self.density)
        w11 = 1.0 / (root * l11)
        w21 = -l21 / (root * l11 * l22)
        w22 = 1.0 / (root * l22)
        D = np.diag
        # ∂r/∂(x_prev, x, ẋ_prev, ẋ) = [[−Φ11 I, I, −Φ12 I, 0], [−Φ21 I, 0, −Φ22 I, I]], then e = W r
        (f11, f12), (f21, f22) = Phi
        self.jacobians = [np.vstack((D(-w11 * f11), D(-w21 * f11 - w22 * f21))), np.vstack((D(w11), D(w21))),
                          np.vstack((D(-w11 * f12), D(-w21 * f12 - w22 * f22))),
                          np.vstack((np.zeros((int(d), int(d))), D(w22)))]
        damped = ("" if math.isinf(self.time_constant) else f",T={self.time_constant:g}") + \
            ("" if math.isinf(self.rate_time_constant) else f",Tv={self.rate_time_constant:g}")
        self.name = f"integrated_random_walk({x},{xd}{damped})"

    def evaluate(self, x0, x1, xd0, xd1, *, params, ctx=None):
        J = self.jacobians
        e = J[0].dot(x0) + J[1].dot(x1) + J[2].dot(xd0) + J[3].dot(xd1)
        return e, J


class RandomWalk(Factor):
    """Random walk of a slowly varying block x (slots x_prev, x: e.g. identified parameters): white noise on ẋ of
    density S per component [units of x² / s], exact over a step h: x − x_prev ~ N(0, S h).  Static and linear;
    the rows are whitened (unit sigmas)."""

    linear = True
    static = True

    def __init__(self, x: str, d: int, dt: float, density):
        self.dim = int(d)
        self.dt = float(dt)
        self.density = _densities(density, self.dim, "RandomWalk")
        self.slots = (prev(x), x)
        self.sigmas = np.ones(self.dim)
        w = 1.0 / np.sqrt(self.density * self.dt)
        self.jacobians = [np.diag(-w), np.diag(w)]
        self.name = f"random_walk({x})"

    def evaluate(self, x0, x1, *, params, ctx=None):
        J = self.jacobians
        return J[0].dot(x0) + J[1].dot(x1), J


class GaussMarkov(Factor):
    """First-order Gauss–Markov process of a block x between two steps h apart (slots x_prev, x): ẋ = −x/T + w,
    stationary σ per component, exact over the step: x − φ x_prev ~ N(0, σ²(1 − φ²)), φ = e^{−h/T}.  Static
    and linear; the rows are whitened (unit sigmas): e = (x − φ x_prev) / (σ √(1 − φ²))."""

    linear = True
    static = True

    def __init__(self, x: str, d: int, dt: float, sigma, time_constant: float):
        self.dim = int(d)
        self.dt = h = float(dt)
        self.sigma = _densities(sigma, self.dim, "GaussMarkov (σ)")
        if not (time_constant > 0 and math.isfinite(time_constant)):
            raise ValueError(f"GaussMarkov: the time constant must be a positive number of seconds (got "
                             f"{time_constant})")
        if not h > 0:
            raise ValueError(f"GaussMarkov: the step must be > 0 s (got {dt})")
        self.time_constant = float(time_constant)
        phi = math.exp(-h / self.time_constant)
        w = 1.0 / (self.sigma * math.sqrt(-math.expm1(-2.0 * h / self.time_constant)))
        self.slots = (prev(x), x)
        self.sigmas = np.ones(self.dim)
        self.jacobians = [np.diag(-phi * w), np.diag(w)]
        self.name = f"gauss_markov({x},T={self.time_constant:g})"

    def evaluate(self, x0, x1, *, params, ctx=None):
        J = self.jacobians
        return J[0].dot(x0) + J[1].dot(x1), J


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
