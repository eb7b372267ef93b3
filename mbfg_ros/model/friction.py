"""Joint friction of the actuators: viscous and smoothed Coulomb, a generalized force on each actuator's coordinate.

An actuator with ``viscous_friction: b``, ``coulomb_friction: c`` and ``coulomb_velocity: v_s`` (mechanism YAML)
loses

    F(q̇ₖ) = b q̇ₖ + c (2/π) atan(q̇ₖ / v_s)

on its coordinate k: the generalized force −F(q̇ₖ) acts besides gravity and the efforts.  The Coulomb part is ±c
well above v_s and smooth through 0 (slope 2c/(π v_s) there), so q̈ stays differentiable and the dynamics'
Jacobians exact.  DFKI's identified friction b·q̇ + cf·atan(100·q̇) is this with c = cf·π/2 and v_s = 0.01.

Every path that computes q̈ (or inverse-dynamics efforts) takes the generalized forces Q *without* friction and
applies it itself (`applied`: Q − F on the friction coordinates); the derivatives gain ∂q̈/∂q̇ −= ∂q̈/∂Q·∂F/∂q̇
(the compiled kernel's dynamics linearization).  F itself is the kernel's too (`native.friction_kernel`): its only
implementation.  An estimated effort is then the actuator's own effort (a motor's torque), not the
torque left after friction.  A mechanism without friction has ``Mechanism.friction`` None: no extra work.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from mbfg_ros import native
from mbfg_ros.model.spec import ActuatorSpec

__all__ = ["Friction"]


def _readonly(a, dtype=float) -> np.ndarray:
    a = np.array(a, dtype=dtype)
    a.setflags(write=False)
    return a


class Friction:
    """The friction of a mechanism's actuators with friction: per friction coordinate (`columns`, indices in q)
    b (`viscous`), c (`coulomb`) and v_s (`velocity`)."""

    __slots__ = ("columns", "viscous", "coulomb", "velocity", "_kernel")

    def __init__(self, columns: Sequence[int], viscous: Sequence[float], coulomb: Sequence[float],
                 velocity: Sequence[float]):
        self.columns = _readonly(columns, np.intp)
        self.viscous = _readonly(viscous)
        self.coulomb = _readonly(coulomb)
        self.velocity = _readonly(velocity)
        self._kernel = native.friction_kernel(self.viscous, self.coulomb, self.velocity)

    @classmethod
    def of_actuators(cls, actuated: Sequence[int], actuators: Sequence[ActuatorSpec]) -> Optional["Friction"]:
        """The friction of the actuators (their coordinates `actuated`, in actuator order) that have any; None
        when none has."""
        rows = [(int(c), a.viscous_friction, a.coulomb_friction, a.coulomb_velocity)
                for c, a in zip(actuated, actuators) if a.viscous_friction or a.coulomb_friction]
        if not rows:
            return None
        return cls(*zip(*rows))

    def forces(self, v) -> np.ndarray:
        """F(q̇ₖ) per friction coordinate, (..., k) for rates v (..., n)."""
        w = np.ascontiguousarray(np.asarray(v, dtype=float)[..., self.columns])
        out = np.empty(w.shape)
        self._kernel.friction(w, out)
        return out

    def applied(self, Q, v) -> np.ndarray:
        """Q − F(q̇) on the friction coordinates, as a new array ((n,) or (N, n), the shape of Q)."""
        out = np.array(Q, dtype=float)
        out[..., self.columns] -= self.forces(v)
        return out

    def describe(self, coordinate: int) -> Optional[dict]:
        """{viscous, coulomb, coulomb_velocity} of the friction on a coordinate, or None where it has none."""
        hit = np.nonzero(self.columns == coordinate)[0]
        if not hit.size:
            return None
        i = int(hit[0])
        return {"viscous": float(self.viscous[i]), "coulomb": float(self.coulomb[i]),
                "coulomb_velocity": float(self.velocity[i])}
