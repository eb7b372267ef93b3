"""The causal Savitzky–Golay reference filter of `bench/estimation_quality.py` (its EKF on the exact reduced model
is product code: `mbfg_ros.estimation.reduced_ekf`).

`CausalSavitzkyGolay`: the least-squares polynomial (order 3) through the last `window` readings of each
encoder, evaluated at the newest sample: angle, rate, acceleration; the pose, velocities and accelerations
follow from z, ż, z̈ and the effort from closed-form inverse dynamics.
"""

from __future__ import annotations

from typing import Dict, Sequence

import numpy as np

from mbfg_ros.dynamics import constrained as dynamics
from mbfg_ros.dynamics import kinematics
from mbfg_ros.estimation.reduced_ekf import FilterOutput, ReducedModel
from mbfg_ros.model.mechanism import Mechanism


class CausalSavitzkyGolay:
    """The causal Savitzky–Golay estimator of the module docstring (order `order`, `window` samples)."""

    def __init__(self, mech: Mechanism, z: Sequence[int], dt: float, window: int = 101, order: int = 3):
        self.model = ReducedModel(mech, z)
        self.mech, self.dt, self.window, self.order = mech, float(dt), int(window), int(order)
        self.history: list = []
        self._weights: Dict[int, np.ndarray] = {}

    def weights(self, n: int) -> np.ndarray:
        """Rows: value, first and second derivative (per sample) at the newest of n samples."""
        if n not in self._weights:
            order = min(self.order, n - 1)
            s = np.arange(-(n - 1), 1, dtype=float)
            V = np.vander(s, order + 1, increasing=True)
            W = np.zeros((3, n))
            W[:order + 1] = np.linalg.pinv(V)[:3]
            W[2] *= 2.0                                # p''(0) = 2 c2
            self._weights[n] = W
        return self._weights[n]

    def step(self, readings: np.ndarray) -> FilterOutput:
        self.history.append(np.asarray(readings, float))
        if len(self.history) > self.window:
            self.history.pop(0)
        Y = np.array(self.history)                     # (n, d)
        W = self.weights(len(Y))
        z, zd, zdd = W[0] @ Y, W[1] @ Y / self.dt, W[2] @ Y / self.dt ** 2
        m = self.model
        q = m.positions(z)
        m.q_guess = q
        v = m.velocities(q, zd)
        a = kinematics.solve_accelerations(self.mech, q, v, fixed=m.z, fixed_values=zdd)
        tau = dynamics.inverse_dynamics(self.mech, q, v, a)
        return FilterOutput(z, zd, zdd, np.asarray(tau, float))
