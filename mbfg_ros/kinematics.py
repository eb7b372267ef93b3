"""Position, velocity and acceleration problems, and assembly modes (branches) of closed loops."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from .model import Mechanism


class AssemblyError(RuntimeError):
    """The constraints cannot be satisfied (e.g. a crank angle out of reach) or not on the requested branch."""


@dataclass
class PositionSolution:
    q: np.ndarray
    residual: float            # max |Φ|
    iterations: int
    assembly_mode: np.ndarray  # ±1 per indicator


def _lstsq_step(J: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Minimum-norm least-squares Newton step: redundant rows and free directions are both fine."""
    if J.size == 0:
        return np.zeros(J.shape[1])
    U, s, Vt = np.linalg.svd(J, full_matrices=False)
    keep = s > 1e-10 * max(1.0, s[0])
    return Vt[keep].T @ ((U[:, keep].T @ r) / s[keep])


def sync_relative_angles(mech: Mechanism, q: np.ndarray, keep: Sequence[int] = ()) -> np.ndarray:
    """Set each relative angle (except those in `keep`) to the direction of its points, choosing
    the 2π-multiple nearest to its current value so angles stay continuous."""
    q = np.array(q, dtype=float)
    xy = mech.point_positions(q)
    keep = set(int(k) for k in keep)
    for k, r in enumerate(mech.spec.relative_angles):
        col = mech.n_point_coordinates + k
        if col in keep:
            continue
        d = xy[r.points[1]] - xy[r.points[0]]
        ang = math.atan2(d[1], d[0])
        q[col] = ang + 2.0 * math.pi * round((q[col] - ang) / (2.0 * math.pi))
    return q


def solve_positions(mech: Mechanism, q_guess, fixed: Sequence[int] = (), tol: float = 1e-12,
                    max_iterations: int = 60) -> PositionSolution:
    """Newton–Raphson on Φ(q) = 0 over the coordinates not in `fixed`, from `q_guess`."""
    fixed = [int(i) for i in fixed]
    free = np.setdiff1d(np.arange(mech.n), fixed)
    q = sync_relative_angles(mech, q_guess, keep=fixed)
    C = mech.constraints
    phi, J = C.phi_and_jacobian(q)
    err = float(np.abs(phi).max(initial=0.0))
    it = 0
    while err > tol and it < max_iterations:
        it += 1
        step = _lstsq_step(J[:, free], -phi)
        # Backtracking keeps far-away guesses from jumping to another branch or diverging.
        alpha = 1.0
        while True:
            q_new = q.copy()
            q_new[free] += alpha * step
            phi_new, J_new = C.phi_and_jacobian(q_new)
            err_new = float(np.abs(phi_new).max(initial=0.0))
            if err_new < err or alpha < 1e-3:
                break
            alpha *= 0.5
        if err_new >= err and alpha < 1e-3:
            break
        q, phi, J, err = q_new, phi_new, J_new, err_new
    if not np.all(np.isfinite(q)) or err > max(tol, 1e-9) * 1e3:
        raise AssemblyError(f"{mech.name}: no assembly found near the guess (max |Φ| = {err:.3g} after "
                            f"{it} Newton iterations); fixed coordinates "
                            f"{[mech.coordinate_names[i] for i in fixed]} may be out of reach")
    return PositionSolution(q, err, it, mech.assembly_mode(q))


def _reflect(p, a, b):
    d = (b - a) / np.linalg.norm(b - a)
    w = p - a
    return a + 2.0 * (w @ d) * d - w


def solve_positions_on_mode(mech: Mechanism, q_guess, fixed: Sequence[int] = (),
                            assembly_mode: Optional[Sequence[int]] = None, tol: float = 1e-12,
                            attempts: int = 12, seed: int = 0) -> PositionSolution:
    """Position problem that lands on the requested assembly mode (±1 per indicator).

    When Newton lands on the wrong branch, the middle point of each wrong indicator is reflected
    across the line through the other two (that is the other branch of a dyad) and Newton restarts;
    random perturbations of the guess are the last resort."""
    sol = solve_positions(mech, q_guess, fixed, tol)
    if assembly_mode is None or len(mech.assembly_mode_points) == 0:
        return sol
    target = np.asarray(assembly_mode, dtype=int).reshape(-1)
    if target.shape != (len(mech.assembly_mode_points),) or not np.all(np.isin(target, (-1, 1))):
        raise ValueError(f"assembly_mode must be {len(mech.assembly_mode_points)} values of +1/-1 "
                         f"(indicators: {', '.join(mech.assembly_mode_names)}), got {list(target)}")
    rng = np.random.default_rng(seed)
    q = sol.q
    for attempt in range(attempts):
        wrong = np.nonzero(mech.assembly_mode(q) != target)[0]
        if wrong.size == 0:
            return PositionSolution(q, sol.residual, sol.iterations, mech.assembly_mode(q))
        guess = q.copy()
        xy = mech.point_positions(guess)
        for w in wrong:
            i, j, k = mech.assembly_mode_points[w]
            for mover, (a, b) in ((j, (i, k)), (k, (i, j)), (i, (j, k))):
                cols = mech.point_columns[mover]
                if cols[0] >= 0 and not set(cols) & set(fixed):
                    guess[cols] = _reflect(xy[mover], xy[a], xy[b])
                    break
        if attempt >= attempts // 2:
            scale = 0.1 * max(1.0, float(np.abs(q[:mech.n_point_coordinates]).max(initial=1.0)))
            free = np.setdiff1d(np.arange(mech.n_point_coordinates), list(fixed))
            guess[free] += scale * rng.standard_normal(free.size)
        try:
            sol = solve_positions(mech, guess, fixed, tol)
        except AssemblyError:
            continue
        q = sol.q
    raise AssemblyError(f"{mech.name}: no assembly on mode {dict(zip(mech.assembly_mode_names, target.tolist()))} "
                        f"with the given fixed coordinates")


def solve_velocities(mech: Mechanism, q, fixed: Sequence[int] = (), fixed_values=None, v_guess=None) -> np.ndarray:
    """q̇ with Φq q̇ = 0 and q̇[fixed] = fixed_values; the other entries closest to `v_guess`."""
    n = mech.n
    v = np.zeros(n) if v_guess is None else np.array(v_guess, dtype=float)
    fixed = [int(i) for i in fixed]
    if fixed:
        v[fixed] = np.asarray(fixed_values, dtype=float)
    free = np.setdiff1d(np.arange(n), fixed)
    J = mech.constraints.jacobian(q)
    v[free] += _lstsq_step(J[:, free], -J @ v)
    return v


def solve_accelerations(mech: Mechanism, q, v, fixed: Sequence[int] = (), fixed_values=None, a_guess=None) -> np.ndarray:
    """q̈ with Φq q̈ = −Φ̇q q̇ and q̈[fixed] = fixed_values."""
    n = mech.n
    a = np.zeros(n) if a_guess is None else np.array(a_guess, dtype=float)
    fixed = [int(i) for i in fixed]
    if fixed:
        a[fixed] = np.asarray(fixed_values, dtype=float)
    free = np.setdiff1d(np.arange(n), fixed)
    C = mech.constraints
    J = C.jacobian(q)
    rhs = -C.jacobian_dot(q, v) @ v - J @ a
    a[free] += _lstsq_step(J[:, free], rhs)
    return a


def constraint_residuals(mech: Mechanism, q, v=None, a=None) -> dict:
    """max |Φ|, |Φq q̇|, |Φq q̈ + Φ̇q q̇| (those that can be computed from what is given)."""
    C = mech.constraints
    out = {"position": float(np.abs(C.phi(q)).max(initial=0.0))}
    if v is not None:
        J = C.jacobian(q)
        out["velocity"] = float(np.abs(J @ v).max(initial=0.0))
        if a is not None:
            out["acceleration"] = float(np.abs(J @ a + C.jacobian_dot(q, v) @ v).max(initial=0.0))
    return out
