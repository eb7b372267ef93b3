"""Numpy references of the dynamics units' residuals, whose only implementation in the package is their kinds in
the compiled kernel (`factors.dynamics`: `ForwardDynamics`, `InverseDynamics` and `IdentifiedDynamics` in the
dependent formulation): e = q̈(q, q̇; Q) − a and its Jacobians from a dynamics linearization, written from the
units' docstrings.  `ReferenceContext` (test/test_native_kernel.py) evaluates the units with these and the
null-space solver's q̈ and derivatives, the reference the kernel's step is compared with.
"""

import numpy as np


def forward_dynamics(unit, ctx, q, v, a, Q):
    d = ctx.dynamics(q, v, Q)
    return d.a - a, [d.da_dq, d.da_dv, -np.eye(unit.dim)]


def inverse_dynamics(unit, ctx, q, v, a, tau, Q_known):
    Q = np.array(Q_known, dtype=float)
    Q[unit.actuated] += tau
    d = ctx.dynamics(q, v, Q)
    return d.a - a, [d.da_dq, d.da_dv, -np.eye(unit.dim), d.da_dQ[:, unit.actuated]]


def identified_dynamics(unit, ctx, q, v, a, tau, theta, Q_known, commands):
    """e = q̈(q, q̇; Q_known + E τ + ΔQ(θ, q̇, u, a)) − a with ΔQ from `model.identified` (the parameters' forces,
    their rate slopes, regressors and payload Jacobians)."""
    P, cols, n = unit.parameters, unit.parameters.coordinates, unit.dim
    Q = np.array(Q_known, dtype=float)
    Q[unit.actuated] += tau
    Q += P.forces(theta, v, commands, n, a)
    d = ctx.dynamics(q, v, Q)
    da_dv = d.da_dv.copy()
    np.add.at(da_dv.T, cols, (d.da_dQ[:, cols] * P.rate_slopes(theta, v)).T)
    J_theta = d.da_dQ[:, cols] * P.regressors(v, commands)
    J_a = -np.eye(n)
    if P.payloads:
        dQ_da, payload_cols = P.payload_jacobians(theta, a)
        J_a = J_a + d.da_dQ @ dQ_da
        for j, col in payload_cols:
            J_theta[:, j] = d.da_dQ @ col
    return d.a - a, [d.da_dq, da_dv, J_a, d.da_dQ[:, unit.actuated], J_theta]


#: the reference of each compiled dynamics kind
REFERENCES = {"forward_dynamics": forward_dynamics, "inverse_dynamics": inverse_dynamics,
              "identified_dynamics": identified_dynamics}


class ReferenceProgram:
    """In place of `native.UnitProgram` for a unit of a kind in `REFERENCES`: its numpy reference."""

    def __init__(self, ctx, unit):
        self.ctx, self.unit, self.reference = ctx, unit, REFERENCES[unit.kernel_kind]

    def evaluate(self, blocks, params):
        e, J = self.reference(self.unit, self.ctx, *blocks, *params)
        return np.array(e, dtype=float), [np.array(j, dtype=float) for j in J]
