"""Exact reference motion of the paper's four-bar linkage (Listing 1 geometry), for tests and benchmarks.

Independent of the mbfg_ros model code: one degree of freedom, the crank angle θ (angle of A→P1),
with the loop closed in closed form (intersection of the circle of radius L2 about P1 with the circle
of radius L3 about B, on the branch of the drawn pose: P2 left of the line P1→B).  The equation of
motion of the 1-dof system,

    m(θ) θ̈ = q_θᵀ Q − q_θᵀ M q_θθ θ̇² + τ(t),        m(θ) = q_θᵀ M q_θ,

with q = [x1, y1, x2, y2] (the natural coordinates of P1, P2), q_θ = dq/dθ, q_θθ = d²q/dθ², the constant
mass matrix of three uniform slender bars and the gravity forces written out below, is integrated with
scipy's DOP853 at rtol = atol = 1e-12.  τ(t) is a torque on the crank (positive counter-clockwise); the
crank angle coordinate of `four_bar_crank.yaml` is θ itself.

Geometry: A = (0, 0), P1 = (1, 0), P2 = (1, 2), B = (4, 0); bars A-P1 (1 kg, L = 1), P1-P2 (2 kg, L = 2),
P2-B (4 kg, L = √13); uniform bars: centre of mass at mid-length, I0 = m L²/3 about the first point.
Assembling T = ½ Σ m |v_G|² + ½ I_G ω² over the moving points gives M = [[1, 1/3], [1/3, 2]] ⊗ I₂ and
Q = [0, −1.5 g, 0, −3 g].

Used by test/test_estimator.py and bench/step_latency.py (and shared with other helpers).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
from scipy.integrate import solve_ivp

L1, L2, L3 = 1.0, 2.0, math.sqrt(13.0)
A = np.array([0.0, 0.0])
B = np.array([4.0, 0.0])
MASS_MATRIX = np.kron(np.array([[1.0, 1.0 / 3.0], [1.0 / 3.0, 2.0]]), np.eye(2))
CRANK_INERTIA = 1.0 / 3.0                     # I0 of the crank about A (already inside MASS_MATRIX)


def gravity_forces(g: float) -> np.ndarray:
    return np.array([0.0, -1.5 * g, 0.0, -3.0 * g])


def four_bar_spec(g: float = 9.8, crank: bool = False):
    """The same mechanism as a `MechanismSpec` (optionally with the crank angle coordinate, actuator and
    encoder as in four_bar_crank.yaml), gravity (0, −g)."""
    from mbfg_ros.model.spec import (ActuatorSpec, AssemblyModeSpec, BodySpec, EncoderSpec, GyroscopeSpec,
                               MechanismSpec, PointSpec, RelativeAngleSpec)
    pts = (PointSpec(0.0, 0.0, fixed=True), PointSpec(1.0, 0.0), PointSpec(1.0, 2.0), PointSpec(4.0, 0.0, fixed=True))

    def bar(i, j, L, m):
        return BodySpec(points=(i, j), length=L, mass=m, I0=m * L * L / 3.0, cog=(L / 2.0, 0.0))

    bodies = (bar(0, 1, L1, 1.0), bar(1, 2, L2, 2.0), bar(2, 3, L3, 4.0))
    extra = {}
    if crank:
        extra = dict(relative_angles=(RelativeAngleSpec("crank", (0, 1)),),
                     actuators=(ActuatorSpec("crank", "crank"),),
                     encoders=(EncoderSpec("crank", "crank", 1e-3),),
                     gyroscopes=(GyroscopeSpec("coupler_gyro", 1, 1e-2),),
                     assembly_modes=(AssemblyModeSpec("elbow", (1, 2, 3)),))
    return MechanismSpec(name="four_bar_reference", points=pts, bodies=bodies, gravity=(0.0, -g), **extra)


def _solve2(k00, k01, k10, k11, r0, r1):
    det = k00 * k11 - k01 * k10
    return (r0 * k11 - k01 * r1) / det, (k00 * r1 - k10 * r0) / det


def _closure(theta: float):
    """Floats: p1, p2 and their first and second θ-derivatives (fast path of `loop_closure`)."""
    c, s = math.cos(theta), math.sin(theta)
    x1, y1 = L1 * c, L1 * s
    x1t, y1t = -y1, x1
    x1tt, y1tt = -x1, -y1
    wx, wy = B[0] - x1, B[1] - y1
    d = math.hypot(wx, wy)
    ux, uy = wx / d, wy / d
    a = (L2 * L2 - L3 * L3 + d * d) / (2.0 * d)
    h = math.sqrt(max(L2 * L2 - a * a, 0.0))
    x2, y2 = x1 + a * ux - h * uy, y1 + a * uy + h * ux
    # derivatives from the two loop equations: (p2 − p1)·(p2 − p1) = L2², (p2 − B)·(p2 − B) = L3²
    ex, ey, fx, fy = x2 - x1, y2 - y1, x2 - B[0], y2 - B[1]
    x2t, y2t = _solve2(ex, ey, fx, fy, ex * x1t + ey * y1t, 0.0)
    rx, ry = x2t - x1t, y2t - y1t
    x2tt, y2tt = _solve2(ex, ey, fx, fy, ex * x1tt + ey * y1tt - (rx * rx + ry * ry), -(x2t * x2t + y2t * y2t))
    return (x1, y1, x2, y2), (x1t, y1t, x2t, y2t), (x1tt, y1tt, x2tt, y2tt)


def loop_closure(theta: float):
    """q, q_θ, q_θθ at crank angle θ (closed-form circle intersection on the drawn branch)."""
    return tuple(np.array(x) for x in _closure(theta))


@dataclass
class ReferenceMotion:
    t: np.ndarray          # (N,)
    theta: np.ndarray      # crank angle, rate, acceleration (N,)
    omega: np.ndarray
    alpha: np.ndarray
    q: np.ndarray          # (N, 4) natural coordinates [x1, y1, x2, y2]
    v: np.ndarray
    a: np.ndarray
    tau: np.ndarray        # crank torque (N,)
    g: float

    def q_crank(self) -> np.ndarray:
        """(N, 5) coordinates of four_bar_crank: [x1, y1, x2, y2, crank]."""
        return np.column_stack([self.q, self.theta])

    def v_crank(self) -> np.ndarray:
        return np.column_stack([self.v, self.omega])

    def a_crank(self) -> np.ndarray:
        return np.column_stack([self.a, self.alpha])

    def energy(self) -> np.ndarray:
        """Kinetic + potential energy (exact for τ = 0)."""
        Qg = gravity_forces(self.g)
        T = 0.5 * np.einsum("ki,ij,kj->k", self.v, MASS_MATRIX, self.v)
        return T - self.q @ Qg


_M = MASS_MATRIX.tolist()


def _rhs(theta, omega, t, g, tau_fn):
    q, qt, qtt = _closure(theta)
    Mq = [sum(_M[i][j] * qt[j] for j in range(4)) for i in range(4)]
    m = sum(qt[i] * Mq[i] for i in range(4))
    Qt = -1.5 * g * qt[1] - 3.0 * g * qt[3]
    tau = 0.0 if tau_fn is None else float(tau_fn(t))
    return (Qt - sum(Mq[i] * qtt[i] for i in range(4)) * omega * omega + tau) / m


def simulate(t_end: float = 5.0, dt: float = 1e-3, g: float = 9.8, tau_fn: Optional[Callable[[float], float]] = None,
             theta0: float = 0.0, omega0: float = 0.0, rtol: float = 1e-12, atol: float = 1e-12) -> ReferenceMotion:
    """Reference motion sampled every dt on [0, t_end] (crank torque τ(t) = tau_fn(t), default 0)."""
    n = int(round(t_end / dt))
    t = np.arange(n + 1) * dt

    def f(tt, y):
        return [y[1], _rhs(y[0], y[1], tt, g, tau_fn)]

    sol = solve_ivp(f, (0.0, t[-1]), [theta0, omega0], method="DOP853", t_eval=t, rtol=rtol, atol=atol,
                    max_step=10.0 * dt)   # dense output in between: within 2e-12 of max_step=dt
    if not sol.success:
        raise RuntimeError(sol.message)
    th, om = sol.y
    q = np.zeros((n + 1, 4))
    v = np.zeros_like(q)
    acc = np.zeros_like(q)
    alpha = np.zeros(n + 1)
    tau = np.zeros(n + 1)
    for k in range(n + 1):
        qk, qt, qtt = loop_closure(th[k])
        alpha[k] = _rhs(th[k], om[k], t[k], g, tau_fn)
        q[k], v[k], acc[k] = qk, qt * om[k], qt * alpha[k] + qtt * om[k] ** 2
        tau[k] = 0.0 if tau_fn is None else float(tau_fn(t[k]))
    return ReferenceMotion(t, th, om, alpha, q, v, acc, tau, g)


@functools.lru_cache(maxsize=4)
def free_fall(t_end: float = 5.0, dt: float = 1e-3, g: float = 9.8) -> ReferenceMotion:
    """The paper's experiment: free fall from the drawn pose at rest (cached)."""
    return simulate(t_end, dt, g)


def point_errors(q_est: np.ndarray, ref: ReferenceMotion):
    """(RMSE over all moving-point coordinates and samples, max Euclidean error of P1 or P2), metres."""
    d = np.asarray(q_est)[:, :4] - ref.q[: len(q_est)]
    rmse = float(np.sqrt(np.mean(d ** 2)))
    worst = float(np.max(np.hypot(d[:, 0::2], d[:, 1::2])))
    return rmse, worst
