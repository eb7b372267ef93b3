"""Forward and inverse dynamics in dependent and independent natural coordinates.

All solves go through `ConstrainedSolver`, which splits R^n with one SVD of Φq into the row space
(handled with the pseudo-inverse) and the null space N (the admissible motions, reduced mass NᵀMN).
That stays exact with redundant constraints (rank Φq < m, e.g. the pick-and-place robot's
parallelograms) and with the zero-mass relative-angle coordinates, where the classic augmented
[[M, Φqᵀ], [Φq, 0]] system is singular.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from mbfg_ros import native
from mbfg_ros.model.constraints import RANK_TOL, numerical_rank
from mbfg_ros.model.mechanism import Mechanism



def _rank_split(Phi_q: np.ndarray, rank_tol: float):
    """SVD of Φq (m ≥ 1 rows) and its numerical rank r: (U, s, Vt, r); Vt[r:] spans the null space."""
    U, s, Vt = np.linalg.svd(Phi_q)
    return U, s, Vt, numerical_rank(s, rank_tol)


def null_space_basis(Phi_q: np.ndarray, rank_tol: float = RANK_TOL) -> np.ndarray:
    """Orthonormal basis (columns) of the null space of Φq: the admissible motions (redundant rows allowed)."""
    if Phi_q.shape[0] == 0:
        return np.eye(Phi_q.shape[1])
    _, _, Vt, r = _rank_split(Phi_q, rank_tol)
    return Vt[r:].T


class ConstrainedSolver:
    """Solves M x + Φqᵀ μ = r1, Φq x = r2 for x (and μ of minimum norm) at one configuration."""

    def __init__(self, M: np.ndarray, Phi_q: np.ndarray, rank_tol: float = RANK_TOL):
        n = M.shape[0]
        if Phi_q.shape[0] == 0:
            self.U_r = np.zeros((0, 0))
            self.s_r = np.zeros(0)
            self.V_r = np.zeros((n, 0))
            self.N = np.eye(n)
        else:
            U, s, Vt, r = _rank_split(Phi_q, rank_tol)
            self.U_r, self.s_r, self.V_r = U[:, :r], s[:r], Vt[:r].T
            self.N = Vt[r:].T
        self.M = M
        self.reduced_mass = self.N.T @ M @ self.N
        self._chol = np.linalg.cholesky(self.reduced_mass)

    def pinv_apply(self, r2):
        """Φq⁺ r2 (least squares for an inconsistent r2 with redundant rows)."""
        return self.V_r @ ((self.U_r.T @ r2) / (self.s_r if r2.ndim == 1 else self.s_r[:, None]))

    def reduced_solve(self, b):
        return np.linalg.solve(self._chol.T, np.linalg.solve(self._chol, b))

    def solve(self, r1, r2):
        x_p = self.pinv_apply(r2)
        y = self.reduced_solve(self.N.T @ (r1 - self.M @ x_p))
        return x_p + self.N @ y

    def multipliers(self, r1, x):
        """Minimum-norm μ with Φqᵀ μ = r1 − M x."""
        res = r1 - self.M @ x
        return self.U_r @ ((self.V_r.T @ res) / self.s_r)


def _rows(mech: Mechanism, A):
    """Keep the independent constraint rows (all of them unless the mechanism has redundant ones)."""
    return A if len(mech.independent_rows) == mech.m else A[mech.independent_rows]


def solver_at(mech: Mechanism, q) -> ConstrainedSolver:
    return ConstrainedSolver(mech.mass_matrix, _rows(mech, mech.constraints.jacobian(q)))


def gamma(mech: Mechanism, q, v):
    """Right-hand side of the (independent) acceleration constraints Φq q̈ = γ = −Φ̇q q̇."""
    return -_rows(mech, mech.constraints.jacobian_dot(q, v)) @ v


def _augmented_solve(M, Phi_q, rhs_top, rhs_bottom):
    """Solve [[M, Φqᵀ], [Φq, 0]] [x; μ] = [r1; r2] in one LU; None if singular or ill-conditioned.

    With the independent rows of Φq and M positive definite on the admissible motions this matrix is
    regular; one dense LU is several times cheaper than the SVD route for small mechanisms.
    """
    n, r = M.shape[0], Phi_q.shape[0]
    A = np.empty((n + r, n + r))
    A[:n, :n] = M
    A[:n, n:] = Phi_q.T
    A[n:, :n] = Phi_q
    A[n:, n:] = 0.0
    try:
        x = np.linalg.solve(A, np.concatenate((rhs_top, rhs_bottom)))
    except np.linalg.LinAlgError:
        return None
    if not np.all(np.isfinite(x)) or np.abs(x).max(initial=0.0) > 1e12:
        return None
    return x


def forward_dynamics(mech: Mechanism, q, v, Q=None) -> np.ndarray:
    """q̈(q, q̇, Q) in dependent coordinates (Lagrange equations, eq. 5–6 of the paper); Q without the actuators'
    friction, which is applied here (`model.friction`)."""
    Q = mech.gravity_forces if Q is None else Q
    if mech.friction is not None:
        Q = mech.friction.applied(Q, v)
    C = mech.constraints
    Phi_q = _rows(mech, C.jacobian(q))
    g = -_rows(mech, C.jacobian_dot(q, v)) @ v
    x = _augmented_solve(mech.mass_matrix, Phi_q, Q, g)
    if x is not None:
        return x[:mech.n]
    return ConstrainedSolver(mech.mass_matrix, Phi_q).solve(Q, g)


@dataclass
class DynamicsLinearization:
    """q̈ and its exact first derivatives at one (q, q̇, Q)."""
    a: np.ndarray
    da_dq: np.ndarray
    da_dv: np.ndarray
    da_dQ: np.ndarray
    multipliers: np.ndarray       # λ per constraint row (zero on dropped redundant rows)
    Phi_q: np.ndarray             # Φq (all rows) at q
    Phi_q_dot: np.ndarray         # Φ̇q (all rows) at q, q̇


def has_third_derivatives(mech: Mechanism) -> bool:
    """Do the constraints have third derivatives (∂(Φ̇q q̇)/∂q ≠ 0)?  Quadratic ones (distances, sliders)
    do not, relative angles do: probed once at a random point near the drawn pose."""
    rng = np.random.default_rng(0)
    qr, vr = np.array(mech.q0) + 0.1 * rng.standard_normal(mech.n), rng.standard_normal(mech.n)
    return bool(np.any(mech.constraints.jacobian_dot_times_v_derivative(qr, vr) != 0.0))


#: per mechanism, a kernel for the derivative products of `forward_dynamics_jacobians` (its own work buffers)
_PRODUCTS: "weakref.WeakKeyDictionary[Mechanism, object]" = weakref.WeakKeyDictionary()


def _products_kernel(mech: Mechanism):
    kernel = _PRODUCTS.get(mech)
    if kernel is None:
        kernel = _PRODUCTS[mech] = native.mechanism_kernel(mech)
    return kernel


def forward_dynamics_jacobians(mech: Mechanism, q, v, Q=None) -> DynamicsLinearization:
    """q̈ and ∂q̈/∂q, ∂q̈/∂q̇, ∂q̈/∂Q at one (q, q̇, Q): q̈, λ and the first n rows [A B] of K⁻¹ by one dense
    solve of the augmented system, or by the null-space solver where K is singular or ill-conditioned; the
    derivatives from them by the compiled kernel's formula (`MechanismKernel.derivatives`: ∂q̈/∂q = −(A Σλᵢ∂²Φᵢ +
    B low), ∂q̈/∂q̇ = −2 B Φ̇q − A ∂F/∂q̇, the one written form of those products).  The actuators' friction (a
    force of q̇, `model.friction`) is applied here: Q is without it."""
    Q = mech.gravity_forces if Q is None else Q
    friction = mech.friction
    if friction is not None:
        Q = friction.applied(Q, v)
    C, n, M = mech.constraints, mech.n, mech.mass_matrix
    Phi_q_all = C.jacobian(q)
    Phi_q_dot_all = C.jacobian_dot(q, v)
    Phi_q, Phi_q_dot = _rows(mech, Phi_q_all), _rows(mech, Phi_q_dot_all)
    r = Phi_q.shape[0]
    g = -Phi_q_dot @ v
    # right-hand sides [Q | I_n] over [γ | 0]: x = [q̈; λ] and the first n columns of K⁻¹ (K symmetric:
    # their transpose is its first n rows)
    top = np.zeros((n, 1 + n))
    top[:, 0] = Q
    top[:, 1:] = np.eye(n)
    bottom = np.zeros((r, 1 + n))
    bottom[:, 0] = g
    X = _augmented_solve(M, Phi_q, top, bottom)
    if X is not None:
        a, lam_rows = X[:n, 0], X[n:, 0]
        AB = X[:, 1:].T
        A, B = AB[:, :n], AB[:, n:]
    else:
        solver = ConstrainedSolver(M, Phi_q)
        a = solver.solve(Q, g)
        lam_rows = solver.multipliers(Q, a)
        A = solver.solve(np.eye(n), np.zeros((r, n)))
        B = solver.solve(np.zeros((n, r)), np.eye(r))
    lam = np.zeros(mech.m)
    lam[mech.independent_rows] = lam_rows
    a = np.ascontiguousarray(a, dtype=float)
    da_dq, da_dv = np.empty((n, n)), np.empty((n, n))
    _products_kernel(mech).derivatives(np.ascontiguousarray(q, dtype=float), np.ascontiguousarray(v, dtype=float),
                                       a, lam, np.ascontiguousarray(np.hstack((A, B)), dtype=float), da_dq, da_dv)
    return DynamicsLinearization(a, da_dq, da_dv, np.array(A), lam, Phi_q_all, Phi_q_dot_all)


def independent_basis(solver: ConstrainedSolver, z: Sequence[int]):
    """R with Φq R = 0, B R = I for the selector B of independent coordinates z (eq. 13–14)."""
    BN = solver.N[list(z)]
    if BN.shape[0] != BN.shape[1]:
        raise ValueError(f"{len(z)} independent coordinates given for {BN.shape[1]} degrees of freedom")
    if np.linalg.cond(BN) > 1e10:
        raise np.linalg.LinAlgError("the chosen independent coordinates do not parametrize the motion here")
    return solver.N @ np.linalg.inv(BN)


def independent_accelerations(mech: Mechanism, q, v, z: Sequence[int], Q=None) -> np.ndarray:
    """z̈ = (RᵀMR)⁻¹ Rᵀ(Q − M S γ) in independent coordinates (eq. 15), S γ with B S γ = 0 (Q without friction)."""
    Q = mech.gravity_forces if Q is None else Q
    if mech.friction is not None:
        Q = mech.friction.applied(Q, v)
    solver = solver_at(mech, q)
    R = independent_basis(solver, z)
    x_p = solver.pinv_apply(gamma(mech, q, v))
    S_gamma = x_p - R @ x_p[list(z)]
    M = mech.mass_matrix
    return np.linalg.solve(R.T @ M @ R, R.T @ (Q - M @ S_gamma))


def inverse_dynamics(mech: Mechanism, q, v, a, Q_known=None, actuated: Optional[Sequence[int]] = None):
    """Efforts τ on the actuated coordinates that make (q, q̇, q̈) a motion: Rᵀ(M q̈ − Q) = Rᵀ E τ.

    `Q_known` are the known generalized forces (gravity by default).  With as many actuators as
    degrees of freedom R can be chosen with E ᵀR = I and τ = Rᵀ(M q̈ − Q); otherwise τ is the
    least-squares answer.  With friction (`model.friction`) the known forces are Q_known − F(q̇): τ is the
    actuators' own effort (a motor's torque).
    """
    Q_known = mech.gravity_forces if Q_known is None else Q_known
    if mech.friction is not None:
        Q_known = mech.friction.applied(Q_known, v)
    actuated = list(mech.actuated if actuated is None else actuated)
    N = solver_at(mech, q).N
    rhs = N.T @ (mech.mass_matrix @ a - Q_known)
    NE = N[actuated].T
    tau, *_ = np.linalg.lstsq(NE, rhs, rcond=None)
    return tau
