"""Kinematic constraint factors: position, velocity and acceleration, dependent and independent
(z-parametrized) forms."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np


from mbfg_ros.factors.base import Factor, batch_mechanism, context_or_new, sigma_array, sigma_or_default
from mbfg_ros.model.mechanism import Mechanism

TWO_PI = 2.0 * math.pi


class PositionConstraints(Factor):
    """f_pc: e = Φ(q); ∂e/∂q = Φq."""

    kernel_kind = "position"

    def __init__(self, mech: Mechanism, sigma=None):
        self.mech = mech
        self.slots = ("q",)
        self.dim = mech.m
        self.sigmas = sigma_array(sigma_or_default(sigma, "position_constraints"), self.dim)
        self.name = "position_constraints"

    def evaluate(self, q, *, params, ctx=None):
        phi, J = context_or_new(ctx, self.mech).phi_and_jacobian(q)
        return phi, [J]

    def error(self, q, *, params, ctx=None):
        return context_or_new(ctx, self.mech).phi_and_jacobian(q)[0]

    @classmethod
    def vectorized(cls, units, params):
        if batch_mechanism(units) is None:
            return None

        def evaluate_many(ctx, keys, q):
            phi, J = ctx.phi_and_jacobian(keys[0], q)
            return phi, [J]
        return evaluate_many


class VelocityConstraints(Factor):
    """f_vc: e = Φq q̇; ∂e/∂q = ∂(Φq q̇)/∂q = Φ̇q, ∂e/∂q̇ = Φq."""

    kernel_kind = "velocity"

    def __init__(self, mech: Mechanism, sigma=None):
        self.mech = mech
        self.slots = ("q", "v")
        self.dim = mech.m
        self.sigmas = sigma_array(sigma_or_default(sigma, "velocity_constraints"), self.dim)
        self.name = "velocity_constraints"

    def evaluate(self, q, v, *, params, ctx=None):
        c = context_or_new(ctx, self.mech)
        J = c.phi_and_jacobian(q)[1]
        Jd = c.jacobian_dot(q, v)
        return J.dot(v), [Jd, J]

    def error(self, q, v, *, params, ctx=None):
        return context_or_new(ctx, self.mech).phi_and_jacobian(q)[1].dot(v)

    @classmethod
    def vectorized(cls, units, params):
        if batch_mechanism(units) is None:
            return None

        def evaluate_many(ctx, keys, q, v):
            J = ctx.phi_and_jacobian(keys[0], q)[1]
            Jd = ctx.jacobian_dot((keys[0], keys[1]), q, v)
            return (J @ v[:, :, None])[:, :, 0], [Jd, J]
        return evaluate_many


class AccelerationConstraints(Factor):
    """f_ac: e = Φq q̈ + Φ̇q q̇;
    ∂e/∂q = ∂(Φq q̈)/∂q + ∂(Φ̇q q̇)/∂q, ∂e/∂q̇ = 2 Φ̇q, ∂e/∂q̈ = Φq."""

    def __init__(self, mech: Mechanism, sigma=None):
        self.mech = mech
        self.slots = ("q", "v", "a")
        self.dim = mech.m
        self.sigmas = sigma_array(sigma_or_default(sigma, "acceleration_constraints"), self.dim)
        self.name = "acceleration_constraints"

    def evaluate(self, q, v, a, *, params, ctx=None):
        c = context_or_new(ctx, self.mech)
        C = self.mech.constraints
        J = c.phi_and_jacobian(q)[1]
        Jd = c.jacobian_dot(q, v)
        Jq = C.hessian_vector(q, a) + C.jacobian_dot_times_v_derivative(q, v)
        return J @ a + Jd @ v, [Jq, 2.0 * Jd, J]

    @classmethod
    def vectorized(cls, units, params):
        if batch_mechanism(units) is None:
            return None

        def evaluate_many(ctx, keys, q, v, a):
            J = ctx.phi_and_jacobian(keys[0], q)[1]
            Jd = ctx.jacobian_dot((keys[0], keys[1]), q, v)
            Jq = ctx.bc.hessian_vector(q, a) + ctx.bc.jacobian_dot_times_v_derivative(q, v)
            return (J @ a[:, :, None] + Jd @ v[:, :, None])[:, :, 0], [Jq, 2.0 * Jd, J]
        return evaluate_many


class _IndepBase(Factor):
    def __init__(self, mech, z, sigma, key, slots, title):
        self.mech = mech
        self.z = np.array(z, dtype=np.intp)
        d = self.z.size
        self.slots = slots
        self.dim = mech.m + d
        s = sigma_or_default(sigma, key)
        self.sigmas = sigma_array(s, self.dim)
        self._B = np.eye(mech.n)[self.z]                                 # selector I_idx (d × n)
        self._zero_n = np.zeros((d, mech.n))
        self._zero_d = np.zeros((mech.m, d))
        self._minus_I = np.vstack([self._zero_d, -np.eye(d)])              # ∂e/∂z = [0; −I]
        self.name = title


class PositionConstraintsIndep(_IndepBase):
    """f_pc^i: e = [Φ(q); q[z] − z] (slots q, z); ∂e/∂q = [Φq; I_idx], ∂e/∂z = [0; −I]."""

    def __init__(self, mech: Mechanism, z: Sequence[int], sigma=None):
        super().__init__(mech, z, sigma, "position_constraints", ("q", "z"), "position_constraints_indep")

    def evaluate(self, q, zz, *, params, ctx=None):
        phi, J = context_or_new(ctx, self.mech).phi_and_jacobian(q)
        return np.concatenate((phi, q[self.z] - zz)), [np.vstack((J, self._B)), self._minus_I]


class VelocityConstraintsIndep(_IndepBase):
    """f_vc^i: e = [Φq q̇; q̇[z] − ż] (slots q, v, zd); ∂e/∂q = [Φ̇q; 0], ∂e/∂q̇ = [Φq; I_idx], ∂e/∂ż = [0; −I]."""

    def __init__(self, mech: Mechanism, z: Sequence[int], sigma=None):
        super().__init__(mech, z, sigma, "velocity_constraints", ("q", "v", "zd"), "velocity_constraints_indep")

    def evaluate(self, q, v, zd, *, params, ctx=None):
        c = context_or_new(ctx, self.mech)
        J = c.phi_and_jacobian(q)[1]
        Jd = c.jacobian_dot(q, v)
        return (np.concatenate((J @ v, v[self.z] - zd)),
                [np.vstack((Jd, self._zero_n)), np.vstack((J, self._B)), self._minus_I])


class AccelerationConstraintsIndep(_IndepBase):
    """f_ac^i: e = [Φq q̈ + Φ̇q q̇; q̈[z] − z̈] (slots q, v, a, zdd)."""

    def __init__(self, mech: Mechanism, z: Sequence[int], sigma=None):
        super().__init__(mech, z, sigma, "acceleration_constraints", ("q", "v", "a", "zdd"),
                         "acceleration_constraints_indep")

    def evaluate(self, q, v, a, zdd, *, params, ctx=None):
        c = context_or_new(ctx, self.mech)
        C = self.mech.constraints
        J = c.phi_and_jacobian(q)[1]
        Jd = c.jacobian_dot(q, v)
        Jq = C.hessian_vector(q, a) + C.jacobian_dot_times_v_derivative(q, v)
        return (np.concatenate((J @ a + Jd @ v, a[self.z] - zdd)),
                [np.vstack((Jq, self._zero_n)), np.vstack((2.0 * Jd, self._zero_n)), np.vstack((J, self._B)),
                 self._minus_I])
