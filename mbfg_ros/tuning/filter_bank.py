"""`ReducedEKF` for K parameter vectors at once: the innovation log-likelihood of every candidate of a search
step in one pass over the recording.

The filter of `estimation.reduced_ekf.ReducedEKF` (its docstring has the model), step for step the same
arithmetic, with every per-filter quantity carrying a leading axis of K filters, and the model's Jacobian in closed
form (where the single filter takes central differences: ~10× the model evaluations), so a search evaluates its
candidates in batches.

The per-filter numerics of a step run in the compiled kernel (`mbfg_ros.native`), a loop over the K filters per
call: the model's Jacobian (`MechanismKernel.reduced_linearize`), the Runge–Kutta step of the
means with its stages' poses and z̈ (`reduced_rk4`, the kernel's constrained dynamics), the covariance half
(`kalman_step`: the discretization, the prediction and the readings' update) and the new poses and their tangents
(`reduced_positions`): in numpy the calls themselves and the small stacked solves were most of a step
(docs/decisions.md).  numpy takes the rows the kernel cannot solve (a singular augmented system: the null-space
solver of `dynamics_many`).

With `deflection_sigma` the filters carry the encoders' deflection (estimation/deflection.py) too, which the single
`ReducedEKF` does not: a vanishing σ_b gives the likelihood without it (test_deflection.py).

The log-likelihoods agree with `ReducedEKF`'s to rounding (test_tuning_speed.py checks it on the four-bar and
the double pendulum, in both modes, with missing readings, and the Kalman step against a numpy reference); a filter that
fails (no assembly of its z, a non-finite number) gets −inf, as `likelihood.log_likelihood` gives for a single
filter that raises.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from mbfg_ros import native
from mbfg_ros.dynamics.batched import dynamics_many
from mbfg_ros.estimation.reduced_ekf import DISCRETIZATION_ORDER, ReducedModel, rk4_step
from mbfg_ros.model.mechanism import Mechanism

POSE_TOLERANCE = 1e-11      # max |Φ| of a solved pose (ReducedModel.positions)
POSE_ITERATIONS = 60        # Gauss–Newton iterations before a filter's pose counts as lost


def solve_rows(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """np.linalg.solve over a stack, a singular matrix giving NaN in its own row instead of stopping every row
    (one filter gone astray must not fail the others)."""
    try:
        return np.linalg.solve(A, B)
    except np.linalg.LinAlgError:
        out = np.full(np.broadcast_shapes(A.shape[:-2], B.shape[:-2]) + B.shape[-2:], np.nan)
        for k in range(out.shape[0]):
            try:
                out[k] = np.linalg.solve(A[k], B[k])
            except np.linalg.LinAlgError:
                pass
        return out


class ReducedModelBank:
    """z → (q, q̇) and z̈(z, ż, τ) of `ReducedModel` for many rows at once; failed rows are flagged, not raised."""

    def __init__(self, mech: Mechanism, z: Sequence[int]):
        self.mech = mech
        self.z = np.asarray([int(i) for i in z], np.intp)
        self.free = np.array([i for i in range(mech.n) if i not in set(self.z.tolist())], np.intp)
        self.bc = mech.constraints
        self.gravity = np.asarray(mech.gravity_forces, float)
        self.actuated = np.asarray(mech.actuated, np.intp)
        # the compiled per-row forms; numpy's null-space solver serves the rows the kernel finds singular
        kernel = self.kernel = native.mechanism_kernel(mech)
        if kernel is None:
            raise ValueError(f"the compiled kernel does not know a constraint type of mechanism {mech.name}")
        self.z_index = tuple(int(i) for i in self.z)
        self.free_index = tuple(int(i) for i in self.free)

    @staticmethod
    def supports(mech: Mechanism) -> bool:
        return native.mechanism_kernel(mech) is not None

    def positions(self, z_values: np.ndarray, guess: np.ndarray, basis: Optional[np.ndarray] = None):
        """(poses (N, n), their Φq (N, m, n), their tangents ∂q/∂z (N, n, d), solved (N,)): each row's z held,
        the rest by Gauss–Newton from its guess, first moved along the tangent `basis` (N, n, d) at the guess
        when given (Newton then starts a second-order distance from the pose); an unsolved row's Φq and tangent
        are NaN."""
        N, n, d = z_values.shape[0], self.mech.n, self.z.size
        q, J, R = np.empty((N, n)), np.empty((N, self.mech.m, n)), np.empty((N, n, d))
        ok = np.empty(N)
        self.kernel.reduced_positions(np.ascontiguousarray(z_values, float), np.ascontiguousarray(guess, float),
                                      None if basis is None else np.ascontiguousarray(basis, float),
                                      self.z_index, self.free_index, POSE_TOLERANCE, POSE_ITERATIONS, q, J, R, ok)
        return q, J, R, ok.astype(bool)

    def velocity_basis(self, J: np.ndarray) -> np.ndarray:
        """(N, n, d): the generalized velocities of a unit rate of each z (Φq q̇ = 0, q̇[z] = e_j) at poses of
        constraint Jacobians J (N, m, n)."""
        Jf, Jz = J[:, :, self.free], J[:, :, self.z]
        JfT = np.swapaxes(Jf, 1, 2)
        N, d = J.shape[0], self.z.size
        R = np.zeros((N, self.mech.n, d))
        R[:, self.free, :] = solve_rows(JfT @ Jf, -(JfT @ Jz))
        R[:, self.z, :] = np.eye(d)
        return R

    def accelerations(self, q: np.ndarray, J: np.ndarray, R: np.ndarray, z_rates: np.ndarray,
                      tau: np.ndarray) -> np.ndarray:
        """z̈ (N, d) at the poses q (N, n) with Φq J and tangents R = ∂q/∂z (N, n, d), rates ż (N, d) and actuator
        efforts τ (N, n_actuated)."""
        a, ok = np.empty(z_rates.shape), np.empty(q.shape[0])
        self.kernel.reduced_acceleration(np.ascontiguousarray(q, float), np.ascontiguousarray(R, float),
                                         np.ascontiguousarray(z_rates, float), np.ascontiguousarray(tau, float),
                                         self.gravity, self.z_index, a, ok)
        redo = self._numpy_rows(ok, q, R)
        if redo is not None:
            a[redo] = self._accelerations(q[redo], R[redo], z_rates[redo], tau[redo])
        return a

    @staticmethod
    def _numpy_rows(ok, q, R):
        """The rows the kernel could not solve (a singular or ill-conditioned augmented system) at a finite pose:
        numpy's null-space solver takes them, as it takes them in numpy's form (a failed filter's NaN rows stay);
        None when there are none."""
        if ok.all():
            return None
        redo = (ok == 0.0) & np.all(np.isfinite(q), axis=1) & np.all(np.isfinite(R), axis=(1, 2))
        return redo if redo.any() else None

    def _accelerations(self, q, R, z_rates, tau):
        v = np.einsum("knd,kd->kn", R, z_rates)
        Q = np.broadcast_to(self.gravity, q.shape).copy()
        Q[:, self.actuated] += tau
        a = dynamics_many(self.mech, q, v, Q, kernel=self.kernel, need_jacobians=False)
        return a[:, self.z]


    def linearize(self, q: np.ndarray, J: np.ndarray, basis: np.ndarray, z_rates: np.ndarray, tau: np.ndarray):
        """(z̈ (N, d), ∂z̈/∂z, ∂z̈/∂ż (N, d, d), ∂z̈/∂τ (N, d, n_actuated)) at the poses q with Φq J and tangents
        `basis` (see `ReducedEKFBank._jacobian` for the chain rule)."""
        N, d = z_rates.shape
        a, dz, dzdot = np.empty((N, d)), np.empty((N, d, d)), np.empty((N, d, d))
        de, ok = np.empty((N, d, self.actuated.size)), np.empty(N)
        self.kernel.reduced_linearize(np.ascontiguousarray(q, float), np.ascontiguousarray(basis, float),
                                      np.ascontiguousarray(z_rates, float), np.ascontiguousarray(tau, float),
                                      self.gravity, self.z_index, self.free_index, a, dz, dzdot, de, ok)
        redo = self._numpy_rows(ok, q, basis)
        if redo is not None:
            a[redo], dz[redo], dzdot[redo], de[redo] = self._linearize(q[redo], J[redo], basis[redo], z_rates[redo],
                                                                       tau[redo])
        return a, dz, dzdot, de

    def _linearize(self, q, J, basis, z_rates, tau):
        v = np.einsum("knd,kd->kn", basis, z_rates)
        Q = np.broadcast_to(self.gravity, q.shape).copy()
        Q[:, self.actuated] += tau
        Jv = self.bc.hessian_vector(q, v)                       # ∂(Φq q̇)/∂q, also Φ̇q of the dynamics
        a, da_dq, da_dv, da_dQ = dynamics_many(self.mech, q, v, Q, self.actuated, kernel=self.kernel)
        Jf = J[:, :, self.free]
        JfT = np.swapaxes(Jf, 1, 2)
        dv_dz = np.zeros_like(basis)
        dv_dz[:, self.free, :] = solve_rows(JfT @ Jf, -(JfT @ (Jv @ basis)))
        dz = (da_dq @ basis + da_dv @ dv_dz)[:, self.z, :]
        return a[:, self.z], dz, (da_dv @ basis)[:, self.z, :], da_dQ[:, self.z, :]


class ReducedEKFBank:
    """K `ReducedEKF`s on one recording, filter k with encoder σ `encoder_sigma[k]` (K, d), densities
    `effort_density[k]`, `acceleration_density[k]` and the disturbance's time constant `time_constant[k]` (inf:
    undamped); `log_likelihood` (K,) accumulates as `ReducedEKF.log_likelihood` does (−inf: the filter failed)."""

    def __init__(self, mech: Mechanism, z: Sequence[int], encoder_sigma, effort_density, fused: bool = False,
                 acceleration_density=0.0, time_constant=math.inf, effort_sigma0: float = 100.0,
                 effort_rate_sigma0: float = 100.0, rate_sigma0: float = 0.1, deflection_sigma=None,
                 deflection_time_constant: float = 0.05):
        self.model = ReducedModelBank(mech, z)
        self.mech, self.fused = mech, bool(fused)
        self.d = d = self.model.z.size
        self.na = na = len(mech.actuated)
        self.nx = nx = 2 * d + 2 * na
        effort_density = np.atleast_1d(np.asarray(effort_density, float))
        self.K = K = effort_density.size
        sigma = np.broadcast_to(np.asarray(encoder_sigma, float).reshape(-1, d) if np.ndim(encoder_sigma) else
                                np.asarray(encoder_sigma, float), (K, d))
        self.R = np.zeros((K, d, d))
        self.R[:, np.arange(d), np.arange(d)] = sigma ** 2
        tc = np.broadcast_to(np.asarray(time_constant, float), (K,))
        self.damping = np.where(np.isinf(tc), 0.0, 1.0 / tc)
        self.acceleration_density = np.broadcast_to(np.asarray(acceleration_density, float), (K,)).copy()
        self.accelerating = bool(np.any(self.acceleration_density))
        # G Qc Gᵀ: the effort rates' white noise; the z̈ block (acceleration noise) is the compiled step's
        self.noise = np.zeros((K, nx, nx))
        e_rate = 2 * d + na + np.arange(na)
        self.noise[:, e_rate, e_rate] = effort_density[:, None]
        self.P0 = np.diag(np.r_[np.zeros(d), np.full(d, rate_sigma0 ** 2), np.full(na, effort_sigma0 ** 2),
                                np.full(na, effort_rate_sigma0 ** 2)])
        self.x: Optional[np.ndarray] = None
        self.P: Optional[np.ndarray] = None
        self.pose: Optional[np.ndarray] = None        # each filter's pose of its posterior z (ReducedEKF's q_guess)
        self.pose_jacobian: Optional[np.ndarray] = None   # Φq there
        self.basis: Optional[np.ndarray] = None       # ∂q/∂z there (the pose predictor's tangent)
        self.failed = np.zeros(K, bool)
        self.log_likelihood = np.zeros(K)
        self._A = self._state_jacobian()
        self._command = np.zeros((K, na))
        self._no_command = np.zeros((K, na))
        # the encoders' deflection (estimation/deflection.py): a Gauss–Markov b per encoder that the readings add
        # to z.  The motion's state x stays in z (the kernel's layout); the covariance is kept over
        # x' = (m, ż, e, ė, b) with m = z + b the readings' own coordinate, so the Kalman step reads its first d
        # entries as before: A' = T A T⁻¹ and W' = T W Tᵀ for T: (z, …, b) ↦ (z + b, …, b)
        self.deflection = deflection_sigma is not None
        if self.deflection:
            sb = np.broadcast_to(np.asarray(deflection_sigma, float), (K,)).copy()
            if not (np.all(sb >= 0) and deflection_time_constant > 0):
                raise ValueError("ReducedEKFBank: the deflection's σ must be ≥ 0 and its time constant > 0")
            self.deflection_time_constant = float(deflection_time_constant)
            self.deflection_noise = (2.0 * sb * sb / self.deflection_time_constant)[:, None] * np.ones(d)
            self.deflection_var = (sb * sb)[:, None] * np.ones(d)
            self.b: Optional[np.ndarray] = None

    # -- the model ---------------------------------------------------------------------------------------
    def _efforts(self, x, command):
        e = x[:, 2 * self.d:2 * self.d + self.na]
        return command + e if self.fused else e

    def _f(self, x, command, q, J, R, damping):
        """ẋ of rows x (N, nx) at their poses q (N, n) (solved for x's z; Φq J, tangents R), command (N, na),
        damping (N,)."""
        d = self.d
        return self._rates(x, self.model.accelerations(q, J, R, x[:, d:2 * d], self._efforts(x, command)), damping)

    def _rates(self, x, acceleration, damping):
        """ẋ of rows x (N, nx) with z̈ = `acceleration` (N, d)."""
        d, na = self.d, self.na
        out = np.empty_like(x)
        out[:, :d] = x[:, d:2 * d]
        out[:, d:2 * d] = acceleration
        out[:, 2 * d:2 * d + na] = x[:, 2 * d + na:]
        w = damping[:, None]
        out[:, 2 * d + na:] = -w * w * x[:, 2 * d:2 * d + na] - 2.0 * w * x[:, 2 * d + na:]
        return out

    def _solve(self, z_values, repeat: int = 1):
        """Poses of z_values (K·repeat rows, filter-major) from their filters' poses; lost ones fail their filter."""
        guess, basis = self.pose, self.basis
        if repeat > 1:
            guess, basis = np.repeat(guess, repeat, axis=0), np.repeat(basis, repeat, axis=0)
        q, J, R, ok = self.model.positions(z_values, guess, basis)
        self.failed |= ~ok.reshape(self.K, repeat).all(axis=1)
        return q, J, R

    def _f_solving(self, x, command):
        q, J, R = self._solve(x[:, :self.d])
        return self._f(x, command, q, J, R, self.damping)

    def _jacobian(self, x, command):
        """(∂f/∂x (K, nx, nx), f (K, nx)) in closed form at each filter's x (its stored pose: x has not moved since
        it was solved; f is the first stage of the Runge–Kutta step), by the chain rule through q = q(z), q̇ = R(z) ż: ∂z̈/∂z = [∂q̈/∂q R + ∂q̈/∂q̇ ∂q̇/∂z]_z with
        Φq ∂q̇/∂z = −∂(Φq q̇)/∂q R (∂ż/∂z = 0), ∂z̈/∂ż = [∂q̈/∂q̇ R]_z, ∂z̈/∂e = [∂q̈/∂Q]_{z, actuated}
        (`ReducedModelBank.linearize`); test_tuning_speed.py checks it against ReducedEKF's central
        differences."""
        d, na = self.d, self.na
        acceleration, dz, dzdot, de = self.model.linearize(self.pose, self.pose_jacobian, self.basis,
                                                           x[:, d:2 * d], self._efforts(x, command))
        A = self._A               # its constant blocks set once (`_state_jacobian`), the model's rows per step
        A[:, d:2 * d, :d] = dz
        A[:, d:2 * d, d:2 * d] = dzdot
        A[:, d:2 * d, 2 * d:2 * d + na] = de
        return A, self._rates(x, acceleration, self.damping)

    def _state_jacobian(self) -> np.ndarray:
        """∂f/∂x's blocks that do not change: ∂ż/∂ż = I, the disturbance's ∂ė/∂ė = I and its damping."""
        d, na, nx = self.d, self.na, self.nx
        w = self.damping[:, None, None]
        A = np.zeros((self.K, nx, nx))
        A[:, :d, d:2 * d] = np.eye(d)
        A[:, 2 * d:2 * d + na, 2 * d + na:] = np.eye(na)
        A[:, 2 * d + na:, 2 * d:2 * d + na] = -w * w * np.eye(na)
        A[:, 2 * d + na:, 2 * d + na:] = -2.0 * w * np.eye(na)
        return A

    # -- the filter -------------------------------------------------------------------------------------
    def _start(self, y):
        """Every filter at the readings, at rest, its pose solved as the single filter solves it (from the
        mechanism's drawn pose: the one far move, where the guard against mirrored assemblies matters)."""
        d, K = self.d, self.K
        self.x = np.zeros((K, self.nx))
        self.x[:, :d] = y
        self.P = np.broadcast_to(self.P0, (K, self.nx, self.nx)).copy()
        self.P[:, :d, :d] = self.R
        if self.deflection:
            # over x' (the readings' coordinate m known to R, the deflection to its stationary σ)
            nx, P = self.nx, self.P
            self.P = np.zeros((K, nx + d, nx + d))
            self.P[:, :nx, :nx] = P
            self.P[:, np.arange(nx, nx + d), np.arange(nx, nx + d)] = self.deflection_var
            self.b = np.zeros((K, d))
        pose = np.asarray(ReducedModel(self.mech, self.model.z).positions(y), float)
        self.pose = np.broadcast_to(pose, (K, pose.size)).copy()
        self.pose_jacobian = np.broadcast_to(self.mech.constraints.jacobian(pose), (K, self.mech.m, pose.size)).copy()
        self.basis = self.model.velocity_basis(self.pose_jacobian)

    def step(self, readings: np.ndarray, command: Optional[np.ndarray], dt: float) -> None:
        """`ReducedEKF.step` of every filter: predict by dt (the previous command held), update with the
        readings present (NaN: none of that encoder); the first call starts every filter at the readings."""
        d, na, K = self.d, self.na, self.K
        command = self._no_command if command is None else np.broadcast_to(np.asarray(command, float), (K, na))
        y = np.asarray(readings, float)
        if self.x is None:
            if not np.all(np.isfinite(y)):
                raise ValueError("the first sample needs a reading of every encoder")
            self._start(y)
            self._command = np.array(command)
            return
        A, f = self._jacobian(self.x, self._command)
        # the z̈ block of the noise: the acceleration density over the motions the constraints allow at each
        # filter's pose (encoded_acceleration_noise), which the compiled step sets from the pose's tangents
        accelerations = (self.acceleration_density, np.ascontiguousarray(self.basis)) if self.accelerating else ()
        self.x = self._rk4(f, float(dt))
        # the covariance prediction and the readings' update of every filter, in C
        y = np.ascontiguousarray(y)
        if self.deflection:
            native.module().deflected_kalman_step(A, self.noise, float(dt), DISCRETIZATION_ORDER, self.P, self.x,
                                                  y, self.R, self.log_likelihood, self.b,
                                                  self.deflection_time_constant, self.deflection_noise,
                                                  *accelerations)
        else:
            native.module().kalman_step(A, self.noise, float(dt), DISCRETIZATION_ORDER, self.P, self.x, y, self.R,
                                        self.log_likelihood, *accelerations)
        self._command = np.array(command)
        q, J, R = self._solve(self.x[:, :d])
        if self.failed.any():
            keep = ~self.failed
            self.pose[keep], self.pose_jacobian[keep], self.basis[keep] = q[keep], J[keep], R[keep]
        else:
            self.pose, self.pose_jacobian, self.basis = q, J, R
        self._quarantine()

    def _rk4(self, k1, h):
        """Every filter's mean after one Runge–Kutta step over h (`rk4_step`, the previous command held; k1: the
        first stage), its stages' lost poses failing their filters: in one call of the kernel where it is
        enabled (the same operations as numpy's), unless a stage's augmented system is singular somewhere (numpy's
        null-space solver then, for the whole step)."""
        out, pose_ok, dynamics_ok = np.empty_like(self.x), np.empty(self.K), np.empty(self.K)
        self.model.kernel.reduced_rk4(self.x, np.ascontiguousarray(k1), h, np.ascontiguousarray(self._command, float),
                                      self.damping, int(self.fused), self.pose, self.basis, self.model.gravity,
                                      self.model.z_index, self.model.free_index, POSE_TOLERANCE, POSE_ITERATIONS, out,
                                      pose_ok, dynamics_ok)
        if dynamics_ok.all():
            self.failed |= pose_ok == 0.0
            return out
        return rk4_step(lambda x: self._f_solving(x, self._command), self.x, h, k1=k1)

    def _quarantine(self):
        """A failed filter keeps −inf and stops carrying numbers: its state becomes a copy of a working
        filter's, so that the batched solves of the others stay finite."""
        if not self.failed.any() and np.isfinite(self.log_likelihood).all() and np.isfinite(self.x).all() \
                and np.isfinite(self.P).all():
            return
        bad = self.failed | ~np.isfinite(self.log_likelihood) | ~np.all(np.isfinite(self.x), axis=1) \
            | ~np.all(np.isfinite(self.P), axis=(1, 2))
        if not bad.any():
            return
        self.failed |= bad
        self.log_likelihood[bad] = -math.inf
        good = np.nonzero(~bad)[0]
        if good.size:
            g = good[0]
            self.x[bad], self.P[bad] = self.x[g], self.P[g]
            if self.deflection:
                self.b[bad] = self.b[g]
            self.pose[bad], self.pose_jacobian[bad], self.basis[bad] = self.pose[g], self.pose_jacobian[g], self.basis[g]
        else:
            self.x[bad] = np.where(np.isfinite(self.x[bad]), self.x[bad], 0.0)
            self.P[bad] = 0.0
            self.P[np.ix_(np.nonzero(bad)[0], np.arange(self.nx), np.arange(self.nx))] = self.P0
