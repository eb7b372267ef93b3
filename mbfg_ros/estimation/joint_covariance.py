"""The full covariance of named joints at the newest step, on request (`FixedLagEstimator.joint_covariance`).

For the coordinates c₁ … c_m (columns of q) it is the covariance of the stacked vector
[q_c₁ … q_c_m, q̇_c₁ … q̇_c_m, τ_c₁ … τ_c_m], where τ_c is the effort published on coordinate c: the effort of
the actuator on c (estimated τ in estimation mode; command + disturbance in fused mode, whose uncertainty is the
disturbance's, the command being known), and 0 — with zero rows and columns — on a coordinate without an
actuator, of an actuator whose effort is known (commanded or passive: not in the state) or when the efforts are
the commands (forward dynamics) — but for the stated white part of a non-passive actuator's effort (its
`effort_sigma`), added to its variance.  It is a marginal of the newest step's state
in the window (one `marginalCovariance` of the smoother, about as costly as `compute_covariance`'s per step),
so it is computed only when asked.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from mbfg_ros.graph.layout import StateLayout
from mbfg_ros.model.mechanism import Mechanism


def joint_covariance(P: np.ndarray, layout: StateLayout, mech: Mechanism, coordinates: Sequence[int],
                     state_coordinates: Optional[Sequence[int]] = None,
                     ripple_variances: Optional[Sequence[float]] = None) -> np.ndarray:
    """The (3m × 3m) covariance described in the module docstring, from the newest step's state marginal P
    (ordered as `layout`; its τ block over the actuated coordinates `state_coordinates`, default every
    actuator's in actuator order: `EffortModel.state_coordinates`), plus on each effort's diagonal its
    actuator's `ripple_variances` entry (actuator order; `estimates.ripple_variances`: the stated white part of
    its effort, which no reading resolves and nothing in the state correlates with)."""
    cols = [int(c) for c in coordinates]
    for c in cols:
        if not 0 <= c < mech.n:
            raise ValueError(f"coordinate column {c} out of range (the mechanism has {mech.n} coordinates)")
    m = len(cols)
    q, v = layout.slices["q"], layout.slices["v"]
    tau = layout.slices.get("tau")
    index = [q.start + c for c in cols] + [v.start + c for c in cols]
    actuator_of = {int(a): j for j, a in enumerate(mech.actuated if state_coordinates is None
                                                   else state_coordinates)}
    effort_rows = []                   # (row in the output, index in the state) of the efforts with a state
    for i, c in enumerate(cols):
        j = actuator_of.get(c)
        if tau is not None and j is not None:
            effort_rows.append((2 * m + i, tau.start + j))
    rows = list(range(2 * m)) + [r for r, _ in effort_rows]
    index += [s for _, s in effort_rows]
    out = np.zeros((3 * m, 3 * m))
    out[np.ix_(rows, rows)] = P[np.ix_(index, index)]
    out = 0.5 * (out + out.T)
    if ripple_variances is not None:
        actuator_at = {int(a): j for j, a in enumerate(mech.actuated)}
        for i, c in enumerate(cols):
            if c in actuator_at:
                out[2 * m + i, 2 * m + i] += float(ripple_variances[actuator_at[c]])
    return out
