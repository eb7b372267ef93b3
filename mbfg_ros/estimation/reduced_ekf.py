"""An extended Kalman filter on a mechanism's exact reduced model, in the independent coordinates z that its
encoders read (the crank angle of a one-DOF mechanism, the two motor angles of the pick-and-place robot): z
determines the whole pose (a position problem with z held), ż the velocities, and the constrained dynamics give
z̈(z, ż, τ) = q̈[z] (`forward_dynamics` on the assembled (q, q̇): on the constraint manifold the dependent
accelerations restricted to z are z̈; the actuators' friction included).

It carries the same stochastic model as the factor-graph estimator (factors/processes.py), so `mbfg tune` fits
that model's densities by this filter's innovation likelihood, and bench/estimation_quality.py compares against
it.  `ReducedEKF`, state x = (z, ż, e, ė), one (e, ė) per actuator:
* estimation mode: e = τ, the unknown effort; fused mode: e = d, the disturbance, τ = command + d (a disturbance
  observer: the command is known, what the actuator adds or loses is estimated);
* ë is white noise of density `effort_density` [effort²/s³] (an integrated random walk: smooth efforts; in
  fused mode the estimator's `disturbance_density`, optionally damped back to 0 with `time_constant` [s], the
  estimator's `disturbance_time_constant`: ë = −(2/T) ė − e/T² + w), optionally z̈ gets the estimator's
  unmodelled accelerations: white noise of density `acceleration_density` S on every generalized coordinate,
  which the constraints restrict to S (JᵀJ)⁻¹ on z (J = ∂q/∂z at the pose; the robot's JᵀJ has eigenvalues 9.7
  and 105, so the same S is 10–100× weaker on its motor angles than an S on z: fitted this way its likelihood
  peaks at S = 1.1e-2, where the estimator beats the truth-tuned EKF);
* prediction: the mean by one RK4 step of the nonlinear model (the command held over the step, as the plant's
  zero-order hold); the covariance by the exact discretization (`discretize`) of the model linearized at the mean,
  the Jacobian by central differences;
* prediction over each sample's own interval (`step(..., dt)`: stamps may jitter);
* update: the encoders read z directly (linear; a missing reading, NaN, is left out); each update adds log N(innovation; 0, S) to
  `log_likelihood` (the prediction-error decomposition of the readings' likelihood).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from mbfg_ros import native
from mbfg_ros.dynamics import constrained as dynamics
from mbfg_ros.dynamics import kinematics
from mbfg_ros.model.mechanism import Mechanism


DISCRETIZATION_ORDER = 12     # terms of the series below, after scaling ‖A h‖∞ ≤ 1/4: truncation < 4^-13/13! ≈ 2e-17


def discretize(A: np.ndarray, W: np.ndarray, h: float):
    """F = e^{A h} and Qd = ∫₀ʰ e^{As} W e^{Aᵀs} ds for one (n, n) or a stack (..., n, n) of A and symmetric W (one A
    over a stack of W: one F).

    The two series F = Σ (Ah)ᵏ/k!, Qd = Σ hᵏ⁺¹/(k+1)! Lᵏ(W) with L(X) = AX + XAᵀ (the derivatives of e^{As} W
    e^{Aᵀs} at s = 0, integrated), over h/2ˢ with ‖A‖∞ h/2ˢ ≤ 1/4 (each matrix of a stack by its own norm), then
    s doublings (F, Q) ← (F F, F Q Fᵀ + Q), in the compiled kernel: the Van Loan exponential's two blocks to
    rounding (test_tuning_speed.py checks against scipy's expm) at a fraction of its cost — expm of the 2n × 2n
    Van Loan matrix, scaled by the noise block's norm, took most of a likelihood evaluation."""
    A, W = np.asarray(A, float), np.asarray(W, float)
    shape = np.broadcast_shapes(A.shape, W.shape)
    F, Q = np.empty(shape), np.empty(shape)
    native.module().discretize(np.ascontiguousarray(np.broadcast_to(A, shape)),
                               np.ascontiguousarray(np.broadcast_to(W, shape)), float(h), DISCRETIZATION_ORDER, F, Q)
    if A.ndim < len(shape):
        F = F[(0,) * (len(shape) - A.ndim)]
    return F, Q


def rk4_step(f, x, h: float, k1=None):
    """x after one classical Runge–Kutta step of ẋ = f(x) over h (x: one state or a stack of states); `k1`: f(x)
    when the caller has it."""
    k1 = f(x) if k1 is None else k1
    k2 = f(x + 0.5 * h * k1)
    k3 = f(x + 0.5 * h * k2)
    k4 = f(x + h * k3)
    return x + h / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)


def encoded_acceleration_noise(mech: Mechanism, q, z: Sequence[int], density: float) -> np.ndarray:
    """The density matrix of z̈'s white noise (d × d) when every generalized coordinate's acceleration gets
    white noise of density S = `density` (the estimator's acceleration noise): restricted to the motions the
    constraints allow (q̈ noise = J ξ, J = ∂q/∂z at the pose q: the generalized velocities of a unit rate of
    each encoded coordinate), ξ ~ S (JᵀJ)⁻¹."""
    J = np.column_stack([kinematics.solve_velocities(mech, q, fixed=list(z), fixed_values=e)
                         for e in np.eye(len(z))])
    return density * np.linalg.inv(J.T @ J)


class ReducedModel:
    """z → (q, q̇) and z̈(z, ż, τ) of a mechanism whose independent coordinates are `z` (column indices)."""

    def __init__(self, mech: Mechanism, z: Sequence[int], q_guess=None):
        self.mech = mech
        self.z = [int(i) for i in z]
        self.q_guess = np.array(mech.q0 if q_guess is None else q_guess, dtype=float)

    def positions(self, z_values, guess=None) -> np.ndarray:
        g = np.array(self.q_guess if guess is None else guess, dtype=float)
        g[self.z] = z_values
        return kinematics.solve_positions(self.mech, g, fixed=self.z, tol=1e-11).q

    def velocities(self, q, z_rates) -> np.ndarray:
        return kinematics.solve_velocities(self.mech, q, fixed=self.z, fixed_values=z_rates)

    def acceleration(self, z_values, z_rates, tau, q=None) -> np.ndarray:
        """z̈ at (z, ż) under the actuator efforts τ (q: the pose of z if already solved)."""
        q = self.positions(z_values) if q is None else q
        v = self.velocities(q, z_rates)
        return dynamics.forward_dynamics(self.mech, q, v, self.mech.generalized_forces(tau))[self.z]


@dataclass
class FilterOutput:
    """One step of a reference filter: the encoded coordinates' angle, rate, acceleration, the actuator
    efforts, and 1σ of angle, rate, effort where the filter has a covariance (else None)."""
    angle: np.ndarray
    rate: np.ndarray
    acceleration: np.ndarray
    effort: np.ndarray
    angle_std: Optional[np.ndarray] = None
    rate_std: Optional[np.ndarray] = None
    effort_std: Optional[np.ndarray] = None


class ReducedEKF:
    """The EKF described in the module docstring.  `encoder_sigma`: σ per encoded coordinate (its units), or one
    for all."""

    def __init__(self, mech: Mechanism, z: Sequence[int], dt: float, encoder_sigma, effort_density: float,
                 fused: bool = False, acceleration_density: float = 0.0, effort_sigma0: float = 100.0,
                 effort_rate_sigma0: float = 100.0, rate_sigma0: float = 0.1, time_constant: float = math.inf):
        self.model = ReducedModel(mech, z)
        # e damped back to 0 with this time constant [s] (ë = −(2/T) ė − e/T² + w; inf: undamped)
        self.damping = 0.0 if math.isinf(time_constant) else 1.0 / float(time_constant)
        self.mech, self.dt, self.fused = mech, float(dt), bool(fused)
        self.d = len(self.model.z)
        self.na = len(mech.actuated)
        d, na = self.d, self.na
        self.nx = 2 * d + 2 * na
        self.R = np.diag(np.broadcast_to(np.asarray(encoder_sigma, float) ** 2, (d,)))
        self.H = np.zeros((d, self.nx))
        self.H[:, :d] = np.eye(d)
        # continuous white-noise input: ë (per actuator) and z̈ (per coordinate)
        self.G = np.zeros((self.nx, d + na))
        self.G[d:2 * d, :d] = np.eye(d)
        self.G[2 * d + na:, d:] = np.eye(na)
        self.Qc = np.diag(np.r_[np.zeros(d), np.full(na, float(effort_density))])
        self.acceleration_density = float(acceleration_density)
        self.P0 = np.diag(np.r_[np.zeros(d), np.full(d, rate_sigma0 ** 2), np.full(na, effort_sigma0 ** 2),
                                np.full(na, effort_rate_sigma0 ** 2)])
        self.x: Optional[np.ndarray] = None
        self.P: Optional[np.ndarray] = None
        self.log_likelihood = 0.0         # Σ log N(innovation; 0, S) over the updates so far
        self.innovation: Optional[np.ndarray] = None              # the last update's y − ẑ and its covariance S
        self.innovation_covariance: Optional[np.ndarray] = None

    # -- the model ---------------------------------------------------------------------------------------
    def _efforts(self, x, command):
        e = x[2 * self.d:2 * self.d + self.na]
        return command + e if self.fused else e

    def _f(self, x, command, q=None):
        d, na = self.d, self.na
        out = np.zeros(self.nx)
        out[:d] = x[d:2 * d]
        out[d:2 * d] = self.model.acceleration(x[:d], x[d:2 * d], self._efforts(x, command), q)
        out[2 * d:2 * d + na] = x[2 * d + na:]
        if self.damping:
            w = self.damping
            out[2 * d + na:] = -w * w * x[2 * d:2 * d + na] - 2.0 * w * x[2 * d + na:]
        return out

    def _jacobian(self, x, command):
        """∂f/∂x by central differences (the z columns re-solve the pose, the others reuse it)."""
        d = self.d
        A = np.zeros((self.nx, self.nx))
        q = self.model.positions(x[:d])
        for j in range(2 * d + self.na):      # f does not depend on ė except through its own row
            h = 1e-6 * max(1.0, abs(x[j]))
            xp, xm = x.copy(), x.copy()
            xp[j] += h
            xm[j] -= h
            if j < d:
                A[:, j] = (self._f(xp, command) - self._f(xm, command)) / (2 * h)
            else:
                A[:, j] = (self._f(xp, command, q) - self._f(xm, command, q)) / (2 * h)
        A[2 * d:2 * d + self.na, 2 * d + self.na:] = np.eye(self.na)
        A[2 * d + self.na:, 2 * d + self.na:] = -2.0 * self.damping * np.eye(self.na)
        return A

    def _rk4(self, x, command, h):
        return rk4_step(lambda y: self._f(y, command), x, h)

    def _acceleration_noise(self, q) -> np.ndarray:
        if not self.acceleration_density:
            return np.zeros((self.d, self.d))
        return encoded_acceleration_noise(self.model.mech, q, self.model.z, self.acceleration_density)

    def _discretize(self, A, h):
        """F = e^{A h} and Qd = ∫ e^{As} G Qc Gᵀ e^{Aᵀs} ds over [0, h] (`discretize`)."""
        return discretize(A, self.G @ self.Qc @ self.G.T, h)

    # -- the filter -------------------------------------------------------------------------------------
    def step(self, readings: np.ndarray, command: Optional[np.ndarray] = None,
             dt: Optional[float] = None) -> FilterOutput:
        """Predict to this sample, `dt` after the previous one (default: the filter's dt; the previous sample's
        command held over the step), then update with the encoder readings (z; NaN: no reading of that
        encoder, the update uses the others); the first call initializes at the readings (all needed), at
        rest."""
        d, na = self.d, self.na
        command = np.zeros(na) if command is None else np.asarray(command, float)
        y = np.asarray(readings, float)
        if self.x is None:
            if not np.all(np.isfinite(y)):
                raise ValueError("the first sample needs a reading of every encoder")
            self.x = np.zeros(self.nx)
            self.x[:d] = y
            self.P = self.P0.copy()
            self.P[:d, :d] = self.R
        else:
            h = self.dt if dt is None else float(dt)
            A = self._jacobian(self.x, self._command)
            self.Qc[:d, :d] = self._acceleration_noise(self.model.q_guess)
            F, Qd = self._discretize(A, h)
            self.x = self._rk4(self.x, self._command, h)
            self.P = F @ self.P @ F.T + Qd
            read = np.isfinite(y)
            if read.all():
                H, R, y_read = self.H, self.R, y
            else:
                H, R, y_read = self.H[read], self.R[np.ix_(read, read)], y[read]
            if y_read.size:
                S = H @ self.P @ H.T + R
                innovation = y_read - H @ self.x
                self.innovation, self.innovation_covariance = innovation, S
                _, logdet = np.linalg.slogdet(S)
                self.log_likelihood -= 0.5 * (innovation @ np.linalg.solve(S, innovation) + logdet
                                              + y_read.size * math.log(2.0 * math.pi))
                K = np.linalg.solve(S, H @ self.P).T
                self.x = self.x + K @ innovation
                I_KH = np.eye(self.nx) - K @ H
                self.P = I_KH @ self.P @ I_KH.T + K @ R @ K.T     # Joseph form: stays symmetric positive
            else:
                self.innovation = self.innovation_covariance = None
        self._command = command
        q = self.model.positions(self.x[:d])
        self.model.q_guess = q                      # track the branch the motion is on
        tau = self._efforts(self.x, command)
        acc = self.model.acceleration(self.x[:d], self.x[d:2 * d], tau, q)
        sd = np.sqrt(np.diag(self.P))
        return FilterOutput(self.x[:d].copy(), self.x[d:2 * d].copy(), acc, tau, sd[:d], sd[d:2 * d],
                            sd[2 * d:2 * d + na])
