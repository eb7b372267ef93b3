"""Position, velocity and acceleration problems, and assembly modes (branches) of closed loops."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from mbfg_ros.model.mechanism import Mechanism


class AssemblyError(RuntimeError):
    """The constraints cannot be satisfied (e.g. a crank angle out of reach) or not on the requested branch."""


@dataclass
class PositionSolution:
    q: np.ndarray
    residual: float            # max |Φ|
    iterations: int
    assembly_mode: np.ndarray  # ±1 per indicator


def _free_columns(n: int, fixed) -> np.ndarray:
    """0..n−1 without `fixed` (a list comprehension: np.setdiff1d's sorting costs more at these sizes)."""
    fixed = set(int(i) for i in fixed)
    return np.array([i for i in range(n) if i not in fixed], dtype=np.intp)


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


def hold_joint_angles(mech: Mechanism, q: np.ndarray, fixed: Sequence[int] = ()):
    """(q, held): every joint angle not in `fixed` set to θ_child − θ_parent + offset (its constraint row exact),
    and for a joint angle in `fixed` whose parent angle is held (or the ground) θ_child set from it instead and
    added to `held` (= `fixed` + those θ_child, sorted): held joint angles pin their children's absolute angles, which
    then place the children's points like any fixed angle (`_place_fixed_angles`)."""
    q = np.array(q, dtype=float)
    held = set(int(i) for i in fixed)
    for col, child, parent, offset in mech.joint_angle_rows:
        parent_value = q[parent] if parent >= 0 else 0.0
        if col in held:
            if child not in held and (parent < 0 or parent in held):
                q[child] = q[col] + parent_value - offset
                held.add(child)
        else:
            q[col] = q[child] - parent_value + offset
    return q, sorted(held)


def _place_fixed_angles(mech: Mechanism, q: np.ndarray, fixed: Sequence[int]) -> np.ndarray:
    """Move the free end point of every relative angle held fixed onto the angle's direction.

    The single-row angle constraint (Δx = L cos θ or Δy = L sin θ, whichever is well conditioned) together
    with the bar length also admits the point mirrored across the other axis; from a guess far from θ
    Newton often converges to that spurious assembly (e.g. the crank four-bar from its drawn pose with the
    crank fixed anywhere in (π/2, 3π/2) + 2πk), which then breaks when θ crosses the row-form switch."""
    fixed = set(int(i) for i in fixed)
    xy = mech.point_positions(q)
    for k, r in enumerate(mech.spec.relative_angles):
        col = mech.n_point_coordinates + k
        if col not in fixed:
            continue
        i0, i1 = r.points
        c0, c1 = mech.point_columns[i0], mech.point_columns[i1]
        L = float(np.hypot(*(xy[i1] - xy[i0])))
        u = np.array([math.cos(q[col]), math.sin(q[col])])
        if c1[0] >= 0 and not fixed & set(c1.tolist()):
            q[c1] = xy[i0] + L * u
        elif c0[0] >= 0 and not fixed & set(c0.tolist()):
            q[c0] = xy[i1] - L * u
        xy = mech.point_positions(q)
    return q


def solve_positions(mech: Mechanism, q_guess, fixed: Sequence[int] = (), tol: float = 1e-12,
                    max_iterations: int = 60) -> PositionSolution:
    """Newton–Raphson on Φ(q) = 0 over the coordinates not in `fixed`, from `q_guess`.

    Relative angles held fixed first move their free end point onto their direction (see
    `_place_fixed_angles`), and so do the absolute angles that fixed joint angles determine
    (`hold_joint_angles`); a solution whose points still contradict a fixed angle is re-placed and
    solved once more."""
    sol = _solve_positions(mech, q_guess, fixed, tol, max_iterations)
    held = hold_joint_angles(mech, sol.q, fixed)[1]
    if _mirrored_fixed_angles(mech, sol.q, held):
        sol = _solve_positions(mech, sol.q, fixed, tol, max_iterations)
        if _mirrored_fixed_angles(mech, sol.q, held):
            raise AssemblyError(f"{mech.name}: the position problem converged to a point that contradicts the "
                                f"fixed relative angles {[mech.coordinate_names[i] for i in fixed]}")
    return sol


def _mirrored_fixed_angles(mech: Mechanism, q: np.ndarray, fixed: Sequence[int]) -> bool:
    xy = mech.point_positions(q)
    fixed = set(int(i) for i in fixed)
    for k, r in enumerate(mech.spec.relative_angles):
        col = mech.n_point_coordinates + k
        if col in fixed:
            d = xy[r.points[1]] - xy[r.points[0]]
            if abs(math.remainder(math.atan2(d[1], d[0]) - q[col], 2.0 * math.pi)) > 1e-6:
                return True
    return False


def _solve_positions(mech: Mechanism, q_guess, fixed, tol, max_iterations) -> PositionSolution:
    fixed = [int(i) for i in fixed]
    q, held = hold_joint_angles(mech, sync_relative_angles(mech, q_guess, keep=fixed), fixed)
    free = _free_columns(mech.n, held)
    q = _place_fixed_angles(mech, q, held)
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
    if target.shape != (len(mech.assembly_mode_points),) or not all(m in (-1, 1) for m in target.tolist()):
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
            free = _free_columns(mech.n_point_coordinates, fixed)
            guess[free] += scale * rng.standard_normal(free.size)
        try:
            sol = solve_positions(mech, guess, fixed, tol)
        except AssemblyError:
            continue
        q = sol.q
    raise AssemblyError(f"{mech.name}: no assembly on mode {dict(zip(mech.assembly_mode_names, target.tolist()))} "
                        f"with the given fixed coordinates")


def _solve_linear_level(J, rhs, n, fixed, fixed_values, guess) -> np.ndarray:
    """x with J x = rhs and x[fixed] = fixed_values; the other entries closest to `guess`."""
    x = np.zeros(n) if guess is None else np.array(guess, dtype=float)
    fixed = [int(i) for i in fixed]
    if fixed:
        x[fixed] = np.asarray(fixed_values, dtype=float)
    free = _free_columns(n, fixed)
    x[free] += _lstsq_step(J[:, free], rhs - J @ x)
    return x


def solve_velocities(mech: Mechanism, q, fixed: Sequence[int] = (), fixed_values=None, v_guess=None) -> np.ndarray:
    """q̇ with Φq q̇ = 0 and q̇[fixed] = fixed_values; the other entries closest to `v_guess`."""
    J = mech.constraints.jacobian(q)
    return _solve_linear_level(J, np.zeros(J.shape[0]), mech.n, fixed, fixed_values, v_guess)


def solve_accelerations(mech: Mechanism, q, v, fixed: Sequence[int] = (), fixed_values=None, a_guess=None) -> np.ndarray:
    """q̈ with Φq q̈ = −Φ̇q q̇ and q̈[fixed] = fixed_values."""
    C = mech.constraints
    return _solve_linear_level(C.jacobian(q), -C.jacobian_dot(q, v) @ v, mech.n, fixed, fixed_values, a_guess)


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
