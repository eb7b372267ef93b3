"""The choice of independent coordinates of a mechanism at a configuration, and the turn count of its
relative angles."""

from __future__ import annotations

import math
from typing import List, Sequence

import numpy as np

from mbfg_ros.dynamics.constrained import null_space_basis
from mbfg_ros.model.mechanism import Mechanism

TWO_PI = 2.0 * math.pi


def unwrap_angles(mech: Mechanism, q: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """q with each relative angle moved by the whole turns (2πk) that bring it within half a turn of its
    value in `reference` (a NaN there: left as it is); the point coordinates (lengths) are never moved.
    Every pose has one value per turn of each angle, all equally valid for the constraints, the encoders
    and the gyroscopes; which turn an angle is on is only set by what it must stay continuous with.

    A joint angle's row (q = θ_child − θ_parent + offset) is linear, not periodic: where the angles' turns moved
    apart, θ_child takes the joint angle's turn (the joint angle is what encoders read and what is published),
    or, when an earlier joint already set θ_child's turn (a loop of joint angles), the joint angle takes its
    angles' turn."""
    q = np.array(q, dtype=float)
    for c in mech.relative_angle_columns:
        ref = reference[c]
        if math.isfinite(ref) and math.isfinite(q[c]):
            q[c] += TWO_PI * round((ref - q[c]) / TWO_PI)
    moved = set()
    for col, child, parent, offset in mech.joint_angle_rows:
        turns = (q[col] - q[child] + (q[parent] if parent >= 0 else 0.0) - offset) / TWO_PI
        if math.isfinite(turns) and round(turns):
            if child not in moved:
                q[child] += TWO_PI * round(turns)
                moved.add(child)
            else:
                q[col] -= TWO_PI * round(turns)
    return q


def choose_independent(mech: Mechanism, q: np.ndarray, prefer: Sequence[int] = (), return_basis: bool = False):
    """Independent coordinates z (d = degrees of freedom) that parametrize the motion well at q.

    Relative angles (then `prefer`) are tried first: the first subset whose selector B gives a
    well-conditioned B N (N = orthonormal null space of Φq) wins; otherwise the remaining coordinates are
    added greedily by the smallest singular value of N[z].  With `return_basis`, returns (z, N)."""
    N = null_space_basis(mech.constraints.jacobian(q))
    d = N.shape[1]
    chosen: List[int] = []
    if d:
        candidates = list(dict.fromkeys([int(i) for i in mech.relative_angle_columns] + [int(i) for i in prefer]))
        for c in candidates:
            trial = chosen + [c]
            s = np.linalg.svd(N[trial], compute_uv=False)
            if s[-1] > 0.2 * s[0] and s[-1] > 1e-3:
                chosen = trial
                if len(chosen) == d:
                    break
        while len(chosen) < d:
            best, best_s = None, -1.0
            for c in range(mech.n):
                if c in chosen:
                    continue
                s = np.linalg.svd(N[chosen + [c]], compute_uv=False)[-1]
                if s > best_s:
                    best, best_s = c, s
            chosen.append(best)
    z = np.array(chosen, dtype=np.intp)
    return (z, N) if return_basis else z
