"""Numpy references of the units whose only implementation in the package is their kinds in the compiled kernel:
the dynamics units' residuals (`factors.dynamics`: `ForwardDynamics`, `InverseDynamics` and `IdentifiedDynamics` in
the dependent formulation) and the encoder through a deflection (`factors.sensors.Encoder`).  e = q̈(q, q̇; Q) − a and its Jacobians from a dynamics linearization, written from the
units' docstrings.  `ReferenceContext` (test/test_native_kernel.py) evaluates the units with these and the
null-space solver's q̈ and derivatives, the reference the kernel's step is compared with.
"""

import math

import numpy as np


# -- the identified parameters' forces ΔQ (`model.identified`'s docstring), in numpy ----------------------------------

#: the parameter kinds written here (a kind the kernel adds without a reference here fails its comparison)
KINDS = ("gain", "viscous_friction", "coulomb_friction", "payload_mass")


def _masks(P):
    unknown = sorted(set(P.kinds) - set(KINDS))
    assert not unknown, f"no numpy reference of the parameter kinds {unknown}"
    kinds = np.array(P.kinds)
    return tuple(kinds == kind for kind in KINDS)


def identified_regressors(P, v, commands):
    """Y (p,): each parameter's force per unit of θ − θ₀ on its coordinate (0 for a payload: `payload_forces`)."""
    gain, viscous, coulomb, payload = _masks(P)
    w = np.asarray(v, float)[P.coordinates]
    gate = w ** 4 / (w ** 4 + P.gate_velocity ** 4)
    y = np.where(viscous, -w, -(2.0 / math.pi) * np.arctan(w / P.velocity) * gate)
    y = np.where(payload, 0.0, y)
    if gain.any():
        u = np.asarray(commands, float)
        y = np.where(gain, u[P.actuators] if u.size else 0.0, y)
    return y


def identified_rate_slopes(P, theta, v):
    """∂ΔQ_c/∂q̇_c per parameter (p,): −(θ − θ₀) viscous, −(θ − θ₀)(2/π)(g/(v_s(1 + (q̇/v_s)²)) + atan(q̇/v_s) g′)
    Coulomb (g = q̇⁴/(q̇⁴ + v_d⁴)), 0 for a gain or a payload."""
    gain, viscous, coulomb, payload = _masks(P)
    w = np.asarray(v, float)[P.coordinates]
    vs, vd4 = P.velocity, P.gate_velocity ** 4
    s = w / vs
    den = w ** 4 + vd4
    gate, dgate = w ** 4 / den, 4.0 * w ** 3 * vd4 / (den * den)
    d = np.asarray(theta, float) - P.nominal
    out = np.where(viscous, -d, -d * (2.0 / math.pi) * (gate / (vs * (1.0 + s * s)) + np.arctan(s) * dgate))
    return np.where(gain | payload, 0.0, out)


def payload_forces(P, theta, a):
    """Σ m (Cᵀ g − CᵀC q̈) over the payloads (n)."""
    out = np.zeros(P.mech.n)
    for j, C in P.payloads:
        out += float(theta[j]) * (C.T @ P.gravity - C.T @ C @ np.asarray(a, float))
    return out


def payload_jacobians(P, theta, a):
    """(∂ΔQ/∂q̈ (n, n) = −Σ m CᵀC, [(j, ∂ΔQ/∂θⱼ (n,)) per payload])."""
    da = np.zeros((P.mech.n, P.mech.n))
    cols = []
    for j, C in P.payloads:
        da -= float(theta[j]) * C.T @ C
        cols.append((j, C.T @ P.gravity - C.T @ C @ np.asarray(a, float)))
    return da, cols


def identified_forces(P, theta, v, commands, a):
    """ΔQ (n) = Σ regressor × (θ − θ₀) on each parameter's coordinate + the payloads' forces."""
    out = np.zeros(P.mech.n)
    np.add.at(out, P.coordinates, identified_regressors(P, v, commands) * (np.asarray(theta, float) - P.nominal))
    return out + payload_forces(P, theta, a)



def forward_dynamics(unit, ctx, q, v, a, Q):
    d = ctx.dynamics(q, v, Q)
    return d.a - a, [d.da_dq, d.da_dv, -np.eye(unit.dim)]


def inverse_dynamics(unit, ctx, q, v, a, tau, Q_known):
    Q = np.array(Q_known, dtype=float)
    Q[unit.actuated] += tau
    d = ctx.dynamics(q, v, Q)
    return d.a - a, [d.da_dq, d.da_dv, -np.eye(unit.dim), d.da_dQ[:, unit.actuated]]


def identified_dynamics(unit, ctx, q, v, a, tau, theta, Q_known, commands):
    """e = q̈(q, q̇; Q_known + E τ + ΔQ(θ, q̇, u, a)) − a with ΔQ, its rate slopes, regressors and payload Jacobians
    from the references above."""
    P, cols, n = unit.parameters, unit.parameters.coordinates, unit.dim
    Q = np.array(Q_known, dtype=float)
    Q[unit.actuated] += tau
    Q += identified_forces(P, theta, v, commands, a)
    d = ctx.dynamics(q, v, Q)
    da_dv = d.da_dv.copy()
    np.add.at(da_dv.T, cols, (d.da_dQ[:, cols] * identified_rate_slopes(P, theta, v)).T)
    J_theta = d.da_dQ[:, cols] * identified_regressors(P, v, commands)
    J_a = -np.eye(n)
    if P.payloads:
        dQ_da, payload_cols = payload_jacobians(P, theta, a)
        J_a = J_a + d.da_dQ @ dQ_da
        for j, col in payload_cols:
            J_theta[:, j] = d.da_dQ @ col
    return d.a - a, [d.da_dq, da_dv, J_a, d.da_dQ[:, unit.actuated], J_theta]


def offset_selection(unit, ctx, x, b, value):
    """e = x[c] + b[j] − value (an encoder through a deflection), wrapped to [−π, π) on an angle."""
    e = x[unit.coordinate] + b[unit.deflection] - value
    if unit.kernel_kind == "wrapped_offset_selection":
        e -= 2.0 * math.pi * math.floor((e + math.pi) / (2.0 * math.pi))
    Jx, Jb = np.zeros((1, x.size)), np.zeros((1, b.size))
    Jx[0, unit.coordinate] = Jb[0, unit.deflection] = 1.0
    return np.array([e]), [Jx, Jb]


#: the reference of each compiled kind whose only form in the package is the kernel's
REFERENCES = {"forward_dynamics": forward_dynamics, "inverse_dynamics": inverse_dynamics,
              "identified_dynamics": identified_dynamics, "offset_selection": offset_selection,
              "wrapped_offset_selection": offset_selection}


class ReferenceProgram:
    """In place of `native.UnitProgram` for a unit of a kind in `REFERENCES`: its numpy reference."""

    def __init__(self, ctx, unit):
        self.ctx, self.unit, self.reference = ctx, unit, REFERENCES[unit.kernel_kind]

    def evaluate(self, blocks, params):
        e, J = self.reference(self.unit, self.ctx, *blocks, *params)
        return np.array(e, dtype=float), [np.array(j, dtype=float) for j in J]
