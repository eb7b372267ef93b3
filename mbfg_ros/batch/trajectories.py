"""Prescribed trajectories and their closed-form references: the quintic rest-to-rest move, the per-step
position problems with continuation, and the exact motion and efforts for prescribed actuated
coordinates."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mbfg_ros.dynamics import batched
from mbfg_ros.dynamics import kinematics
from mbfg_ros.dynamics.constrained import inverse_dynamics
from mbfg_ros.model.mechanism import Mechanism

__all__ = ["Motion", "quintic_move", "position_continuation", "closed_form_motion", "closed_form_efforts"]


@dataclass
class Motion:
    """A solved trajectory: times and the generalized positions, velocities and accelerations."""
    t: np.ndarray             # (N,)
    q: np.ndarray             # (N, n)
    v: np.ndarray             # (N, n)
    a: np.ndarray             # (N, n)

_COARSE_MOTION = 0.25  # position continuation: largest move of an actuated coordinate per coarse interval


def quintic_move(t, start, end, t0: float, t1: float):
    """Smooth rest-to-rest move (5th-order polynomial) from `start` at t0 to `end` at t1.

    Returns (value, rate, acceleration) arrays of shape (len(t), len(start)); constant outside [t0, t1].
    """
    t = np.asarray(t, dtype=float).reshape(-1, 1)
    start, end = np.atleast_1d(np.asarray(start, float)), np.atleast_1d(np.asarray(end, float))
    T = t1 - t0
    s = np.clip((t - t0) / T, 0.0, 1.0)
    inside = ((t > t0) & (t < t1)).astype(float)
    p = 10 * s ** 3 - 15 * s ** 4 + 6 * s ** 5
    dp = (30 * s ** 2 - 60 * s ** 3 + 30 * s ** 4) / T * inside
    ddp = (60 * s - 180 * s ** 2 + 120 * s ** 3) / T ** 2 * inside
    d = end - start
    return start + p * d, dp * d, ddp * d


def position_continuation(mech: Mechanism, values: np.ndarray, q_start=None, assembly_mode=None,
                           tol: float = 1e-12, stride: int = 16):
    """Per-step position problems with the actuated coordinates at `values` (N, n_actuated).

    Step 0 is the full position problem (`kinematics.solve_positions[_on_mode]`).  Then every
    `stride`-th step is solved in sequence by a few Newton iterations from the quadratic extrapolation
    of the previous solutions (continuation: keeps the branch, the assembly mode); where that fails
    (no convergence, another branch) the steps since the last solved one are solved one by one
    instead.  The steps in between start from the cubic interpolation of the solved ones and are
    solved all at once (`batched.newton_positions`); any that do not converge, land on another
    branch or on a point mirrored across a relative angle's direction are redone in sequence from
    their predecessors.  `stride` = 1 solves every step in sequence
    (each from the extrapolation of the three before it).
    """
    act = list(mech.actuated)
    free = np.setdiff1d(np.arange(mech.n), act)
    N = len(values)
    q = np.empty((N, mech.n))
    guess = np.array(mech.q0 if q_start is None else q_start, dtype=float)
    guess[act] = values[0]
    first = (kinematics.solve_positions_on_mode(mech, guess, fixed=act, assembly_mode=assembly_mode)
             if assembly_mode is not None else kinematics.solve_positions(mech, guess, fixed=act))
    q[0] = first.q
    mode0 = mech.assembly_mode(q[0])
    bc = mech.constraints
    solved = [0]
    # the coarse grid: the actuated coordinates move by at most _COARSE_MOTION per interval
    while stride > 1 and N > stride and np.abs(values[stride:] - values[:-stride]).max(initial=0.0) > _COARSE_MOTION:
        stride //= 2
    if stride <= 1 or N < 4 * stride:
        for k in range(1, N):
            _position_step(mech, values, q, k, solved[-3:], free, mode0, tol, fallback=True)
            solved.append(k)
        return q

    def spaced():                  # up to three solved steps about `stride` apart, the last one first
        out = [solved[-1]]
        for j in reversed(solved[:-1]):
            if len(out) == 3:
                break
            if out[-1] - j >= stride:
                out.append(j)
        return out

    for c in np.unique(np.r_[np.arange(stride, N, stride), N - 1]).tolist():
        if _position_step(mech, values, q, c, spaced(), free, mode0, tol, fallback=False):
            solved.append(c)
            continue
        for k in range(solved[-1] + 1, c + 1):           # hard stretch: step by step
            _position_step(mech, values, q, k, solved[-3:], free, mode0, tol, fallback=True)
            solved.append(k)
    grid = np.array(solved)
    others = np.setdiff1d(np.arange(N), grid)
    if not others.size:
        return q
    guess = _cubic_interpolation(grid, q[grid], others)
    guess[:, act] = values[others]
    x = guess.copy()
    ok = batched.newton_positions(bc, x, free, tol) & batched.angles_consistent(mech, x)
    if len(mode0):
        ok &= np.all(batched.assembly_modes(mech, x) == mode0, axis=1)
    # a Newton correction that is not small against the motion over the grid interval means the
    # interpolation was poor there (near a singular pose): solve those steps in sequence instead
    j = np.searchsorted(grid, others)
    motion = np.abs(q[grid[j]] - q[grid[j - 1]]).max(axis=1)
    ok &= np.abs(x - guess).max(axis=1) <= 0.1 * motion + 1e-12
    q[others] = x
    for k in others[~ok].tolist():              # in order: their predecessors are solved by then
        _position_step(mech, values, q, k, [j for j in (k - 3, k - 2, k - 1) if j >= 0], free, mode0, tol,
                       fallback=True)
    return q


def _position_step(mech, values, q, k, prev, free, mode0, tol, fallback: bool) -> bool:
    """Solve the position problem of step k into q[k]: Newton on the free coordinates from the
    Lagrange extrapolation through the solved steps `prev` (any spacing).  Returns whether Newton
    converged on the branch `mode0`; if not, with `fallback` q[k] is the full position problem from
    the nearest solved step (as `kinematics.solve_positions`), else q[k] is left unset."""
    act = list(mech.actuated)
    C = mech.constraints
    x = np.zeros(mech.n)
    for a_ in prev:
        w = 1.0
        for b_ in prev:
            if b_ != a_:
                w *= (k - b_) / (a_ - b_)
        x += w * q[a_]
    x[act] = values[k]
    x0 = x.copy()
    ok = False
    for _ in range(8):
        phi, J = C.phi_and_jacobian(x)
        if np.abs(phi).max(initial=0.0) <= tol:
            ok = True
            break
        Jf = J[:, free]
        try:
            step = np.linalg.solve(Jf.T @ Jf, -(Jf.T @ phi))
        except np.linalg.LinAlgError:
            break
        x[free] += step
    ok = ok and not (len(mode0) and np.any(mech.assembly_mode(x) != mode0))
    if ok and not fallback:
        # a coarse step: also reject a point mirrored across a relative angle's direction, and a
        # Newton correction that is not small against the motion since the last solved step
        ok = (bool(batched.angles_consistent(mech, x[None, :])[0]) and
              np.abs(x - x0).max() <= 0.5 * np.abs(x0 - q[prev[0]]).max() + 1e-12)
    if ok:
        q[k] = x
    elif fallback:
        guess = q[max(prev)].copy()
        guess[act] = values[k]
        q[k] = kinematics.solve_positions(mech, guess, fixed=act, tol=tol).q
    return ok


def _cubic_interpolation(grid, values, at):
    """Values at the points `at` of the cubic through the four grid points around each (Lagrange)."""
    G = len(grid)
    j = np.clip(np.searchsorted(grid, at) - 2, 0, max(G - 4, 0))          # first of the 4 points
    idx = j[:, None] + np.arange(min(4, G))[None, :]
    xs = grid[idx].astype(float)                                          # (P, 4)
    t = np.asarray(at, float)[:, None]
    w = np.ones_like(xs)
    for a_ in range(xs.shape[1]):
        for b_ in range(xs.shape[1]):
            if a_ != b_:
                w[:, a_] *= (t[:, 0] - xs[:, b_]) / (xs[:, a_] - xs[:, b_])
    return np.einsum("pa,pan->pn", w, values[idx])


def closed_form_motion(mech: Mechanism, values, rates, accelerations, q_start=None, assembly_mode=None):
    """Exact (q, q̇, q̈) per step for prescribed actuated coordinates and their exact derivatives:
    position problems with continuation, then the velocity and acceleration problems."""
    values = np.asarray(values, float).reshape(len(values), -1)
    rates = np.asarray(rates, float).reshape(values.shape)
    accelerations = np.asarray(accelerations, float).reshape(values.shape)
    act = list(mech.actuated)
    q = position_continuation(mech, values, q_start, assembly_mode)
    v = np.empty_like(q)
    a = np.empty_like(q)
    for k in range(len(q)):
        v[k] = kinematics.solve_velocities(mech, q[k], act, rates[k])
        a[k] = kinematics.solve_accelerations(mech, q[k], v[k], act, accelerations[k])
    return q, v, a


def closed_form_efforts(mech: Mechanism, q, v, a, Q_known=None) -> np.ndarray:
    """τ_k = closed-form inverse dynamics (`constrained.inverse_dynamics`) at every step, (N, n_actuated)."""
    return np.array([inverse_dynamics(mech, q[k], v[k], a[k], Q_known) for k in range(len(q))]
                    ).reshape(len(q), len(mech.actuated))
