"""Readings placed at their true times on the node's time grid (rclpy-free).

The node estimates on its own grid t_k = t0 + k·dt and puts a reading on the step nearest its stamp; a reading
stamped δ = stamp − t_k off its step (|δ| ≤ dt/2: a driver's jitter, or a clock that drifts against the grid)
read the angle at t_k + δ, not at t_k.  Left there, a crank turning at 10 rad/s on a 1-ms grid is read up to
5 mrad off, a hundred encoder σ.  `ReadingAlignment` moves each encoder reading onto its step by the newest
estimate's motion: z(t_k) = z − δ·q̇(t_k) − ½δ²·q̈, with q̇(t_k) = q̇_e + (t_k − t_e)·q̈_e from the estimate at t_e
(the previous step, normally).  What is left is δ times the estimate's rate error, a second-order term
(bench/jittered_stamps.py, "grid, readings shifted to the step": as accurate as a step per reading).

Gyroscope readings are left as they are (their shift would need the angular acceleration, a further
derivative of the estimate; a gyroscope's σ is normally far above δ times it).
"""

from __future__ import annotations

import math
from typing import Dict, Mapping, Optional

from mbfg_ros.model.mechanism import Mechanism
from mbfg_ros.ros.scheduler import NS

__all__ = ["ReadingAlignment", "MAX_EXTRAPOLATION", "NS"]

MAX_EXTRAPOLATION = 0.1   # [s] an estimate further than this from the step is too old to move readings by


class ReadingAlignment:
    """Per encoder name (and generic 'q:<coordinate>' name), its coordinate: `to_step` shifts readings stamped off
    their step onto it."""

    def __init__(self, mech: Mechanism):
        self.columns: Dict[str, int] = {s.name: int(s.coordinate) for s in mech.sensors if s.kind == "encoder"}
        # a prescribed actuator's set-point ('q:<coordinate>', prescribed_motion) is read like an encoder
        self.columns.update({f"q:{name}": c for c, name in enumerate(mech.coordinate_names)})

    def to_step(self, values: Mapping[str, float], stamps_ns: Mapping[str, int], t_k_ns: int,
                v, a, t_estimate_ns: Optional[int]) -> Dict[str, float]:
        """`values` (name → reading) stamped `stamps_ns` (name → stamp; a name without one is not moved),
        moved to the step at `t_k_ns` by the rates `v` and accelerations `a` of the estimate at
        `t_estimate_ns` (None: no estimate yet, nothing is moved).  Returns a new dict."""
        out = dict(values)
        if t_estimate_ns is None or v is None:
            return out
        gap = (t_k_ns - t_estimate_ns) / NS
        if not abs(gap) <= MAX_EXTRAPOLATION:
            return out
        for name, z in values.items():
            c = self.columns.get(name)
            stamp = stamps_ns.get(name)
            if c is None or stamp is None or stamp == t_k_ns:
                continue
            delta = (stamp - t_k_ns) / NS
            acc = float(a[c])
            rate = float(v[c]) + gap * acc
            shift = delta * rate + 0.5 * delta * delta * acc
            if math.isfinite(shift):
                out[name] = z - shift
        return out
