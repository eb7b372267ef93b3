"""Sensor factors: encoders, gyroscopes, generic observations of one coordinate."""

from __future__ import annotations

from typing import Optional

from mbfg_ros.factors.base import Factor, compiled_evaluation, sigma_array
from mbfg_ros.factors.priors import Selection
from mbfg_ros.model.mechanism import Mechanism



def _coordinate(mech: Mechanism, coordinate) -> int:
    """Coordinate index from an index or a name (`Mechanism.coordinate_names`)."""
    if isinstance(coordinate, str):
        return mech.coordinate_index(coordinate)
    c = int(coordinate)
    if not 0 <= c < mech.n:
        raise ValueError(f"coordinate index {c} out of range 0..{mech.n - 1}")
    return c


class _CoordinateReading(Selection):
    """A reading of one coordinate of one block (q, q̇ or q̈): e = x[c] − reading (`Selection`), one row."""

    params = ('value',)

    def __init__(self, mech: Mechanism, coordinate, block: str, value: float, sigma: float, wrap: bool = False):
        self.coordinate = _coordinate(mech, coordinate)
        self.value = float(value)
        self._select(block, mech.n, [self.coordinate], 1, wrap=wrap, one=self.coordinate)
        self.sigmas = sigma_array(sigma, 1)


class Encoder(_CoordinateReading):
    """Encoder on one coordinate: e = q[c] − reading.  On a relative angle the difference is wrapped to
    [−π, π), so a reading in any 2π range matches a continuous angle.

    With `deflection` j the encoder reads the coordinate through entry j of the ``deflection`` block b (a motor
    encoder behind a gear's play and elasticity, `estimation.deflection`): e = q[c] + b[j] − reading, Jacobians 1
    on q[c] and on b[j]; compiled kinds ``offset_selection`` / ``wrapped_offset_selection``, its only form."""

    def __init__(self, mech: Mechanism, coordinate, value: float = 0.0, sigma: float = 1e-3,
                 deflection: Optional[int] = None):
        c = _coordinate(mech, coordinate)
        self.angle = c >= mech.n_point_coordinates
        super().__init__(mech, c, "q", value, sigma, wrap=self.angle)
        self.name = f"encoder({mech.coordinate_names[self.coordinate]})"
        self.deflection = None if deflection is None else int(deflection)
        if self.deflection is not None:
            if self.deflection < 0:
                raise ValueError(f"{self.name}: the deflection index must be >= 0 (got {deflection})")
            self.mech = mech
            self.slots = ("q", "deflection")
            self.kernel_kind = "wrapped_offset_selection" if self.angle else "offset_selection"
            self.name = f"deflected_encoder({mech.coordinate_names[self.coordinate]})"

    def evaluate(self, *blocks, params, ctx=None):
        if self.deflection is None:
            return super().evaluate(*blocks, ctx=ctx, params=params)
        return compiled_evaluation(self, blocks, ctx, params)

    def kernel_arguments(self):
        if self.deflection is None:
            return super().kernel_arguments()
        return [self.coordinate, self.deflection], []


class ObservedCoordinate(_CoordinateReading):
    """Generic observation of one named coordinate's position (order 0), velocity (1) or acceleration (2):
    e = x[c] − reading with x = q, q̇ or q̈.  `coordinate` is an index or a name."""

    BLOCKS = ("q", "v", "a")

    def __init__(self, mech: Mechanism, coordinate, order=0, value: float = 0.0, sigma: float = 1e-3):
        self.order = {"q": 0, "position": 0, "v": 1, "velocity": 1, "a": 2, "acceleration": 2}.get(order, order)
        if self.order not in (0, 1, 2):
            raise ValueError(f"order must be 0/'position', 1/'velocity' or 2/'acceleration' (got {order!r})")
        super().__init__(mech, coordinate, self.BLOCKS[self.order], value, sigma)
        self.name = f"observed_{self.slots[0]}({mech.coordinate_names[self.coordinate]})"


class Gyroscope(Factor):
    """Gyroscope on a body: e = ω(q, q̇) − reading with ω = (Δ × Δ̇)/|Δ|², Δ = p₁ − p₀ of the body's first
    two points (`Mechanism.body_angular_rate`).  With r = |Δ|²:
    ∂ω/∂Δ̇ = (−Δy, Δx)/r,  ∂ω/∂Δ = (Δ̇y, −Δ̇x)/r − 2ω Δ/r, scattered with ±1 onto the point columns."""

    params = ('value',)
    kernel_kind = "gyroscope"

    def __init__(self, mech: Mechanism, body: int, value: float = 0.0, sigma: float = 1e-2):
        self.mech = mech
        self.body = int(body)
        b = mech.spec.bodies[self.body]
        i, j = b.points[0], b.points[1]
        self.cols_i, self.cols_j = mech.point_columns[i].copy(), mech.point_columns[j].copy()
        self._ci, self._cj = tuple(int(c) for c in self.cols_i), tuple(int(c) for c in self.cols_j)
        self.fixed_i = mech.spec.points[i] if self.cols_i[0] < 0 else None
        self.fixed_j = mech.spec.points[j] if self.cols_j[0] < 0 else None
        self.value = float(value)
        self.slots = ("q", "v")
        self.dim = 1
        self.sigmas = sigma_array(sigma, 1)
        self.n = mech.n
        self.name = f"gyroscope(body {self.body})"

    def evaluate(self, q, v, *, params, ctx=None):
        # (`eval_gyroscope` in _kernel.c; test_factors checks its Jacobians by finite differences, test_native_kernel
        # the rate against Mechanism.body_angular_rate)
        return compiled_evaluation(self, (q, v), ctx, params)

    def kernel_arguments(self):
        # a fixed point: its columns −1 and its position among the floats
        fi, fj = self.fixed_i, self.fixed_j
        ints = [-1, -1] if fi is not None else list(self._ci)
        ints += [-1, -1] if fj is not None else list(self._cj)
        floats = [fi.x, fi.y] if fi is not None else [0.0, 0.0]
        floats += [fj.x, fj.y] if fj is not None else [0.0, 0.0]
        return ints, [float(f) for f in floats]
