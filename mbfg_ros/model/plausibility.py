"""Plausibility limits on the inputs of an estimator: what a reading or a commanded effort of a mechanism
can be at all, derived from the mechanism where it can be.

A value outside these limits is not a disagreement with the estimate (the estimator's innovation gate
judges those) but something no sensor or actuator of this mechanism can produce: 1e300 on a torque
topic, a gyroscope reading faster than any link turns, an encoder thousands of turns away.  Such a value
must never start, move or re-initialize an estimate: the node counts and drops it (`rejected.<kind>`),
the command line refuses the CSV cell.  One set of rules for both (`InputLimits`), ROS-free.

The rules (docs/mechanism_format.md; docs/decisions.md has the reasons):

* every value must be finite (``non_finite``);
* an encoder reading (a coordinate: an angle, or a length for a point coordinate) must be near where the
  coordinate can be (``implausible_position``).  An angle: before the first estimate, within
  `START_SPAN_TURNS` turns of the drawn pose (a 32-bit count of a 4096-count multi-turn encoder spans
  ±5.2e5 turns); once there is an estimate, within `ESTIMATE_SPAN_TURNS` turns of it, or within one turn
  of zero.  An encoder declared single-turn (`turns: single`: it reads in [−π, π) or [0, 2π) whatever turn
  the angle is on; the encoder factor wraps an angle's residual) must always read within one turn of
  zero.  A length: within `POSITION_SPAN_REACHES` times the
  mechanism's reach of the drawn pose, or (once there is one) of the estimate.  Should an estimate ever
  be more than 100 turns off a multi-turn encoder, that encoder's readings are refused until the
  estimator starts again (the node's ``~/reset``), which the start rule then allows;
* a gyroscope reading must not exceed its sensor's ``max_rate`` (YAML, default `DEFAULT_MAX_RATE`)
  (``implausible_rate``);
* a commanded effort must not exceed its actuator's ``effort_limit`` in magnitude (YAML, default
  `default_effort_limit`) (``implausible_effort``).
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from mbfg_ros.model.spec import MechanismSpec

__all__ = ["InputLimits", "Problem", "default_effort_limit", "mechanism_reach", "mechanism_scale", "STANDARD_GRAVITY", "START_SPAN_TURNS",
           "ESTIMATE_SPAN_TURNS", "POSITION_SPAN_REACHES", "DEFAULT_MAX_RATE", "EFFORT_LIMIT_GRAVITY_FACTOR",
           "EFFORT_LIMIT_ACCELERATION", "KINDS"]

Problem = Tuple[str, str]

#: before the first estimate, an angle reading farther than this many turns from the drawn pose is implausible
START_SPAN_TURNS = 1e6
#: once there is an estimate, an angle reading farther than this many turns from it (and outside the single
#: turn around zero) is implausible
ESTIMATE_SPAN_TURNS = 100.0
#: a length reading farther than this many reaches (`mechanism_reach`) from the drawn pose (and from the
#: estimate) is implausible
POSITION_SPAN_REACHES = 100.0
#: default `max_rate` of a gyroscope [rad/s]: 100 turns a second (6000 rpm)
DEFAULT_MAX_RATE = 2.0 * math.pi * 100.0
#: default effort_limit = EFFORT_LIMIT_GRAVITY_FACTOR × (whole weight at full reach)
#:                        + (whole mass at full reach) × EFFORT_LIMIT_ACCELERATION  (see default_effort_limit)
EFFORT_LIMIT_GRAVITY_FACTOR = 10.0
EFFORT_LIMIT_ACCELERATION = 100.0          # rad/s² (× reach: m/s² on a length coordinate)

#: the problem kinds these rules report, and what they mean (the node's `rejected.<kind>` diagnostics)
KINDS = {
    "non_finite": "NaN or Inf value",
    "implausible_position": f"encoder reading of an angle more than {START_SPAN_TURNS:g} turns from the drawn pose "
                            f"(before the first estimate) or more than {ESTIMATE_SPAN_TURNS:g} turns from the "
                            f"estimate and outside one turn of zero, or outside one turn of zero for a single-turn "
                            f"encoder; of a length, more than "
                            f"{POSITION_SPAN_REACHES:g} reaches of the mechanism from the drawn pose and the estimate",
    "implausible_rate": "gyroscope reading faster than the sensor's max_rate",
    "implausible_effort": "commanded effort larger in magnitude than the actuator's effort_limit",
}


def mechanism_reach(spec: MechanismSpec) -> float:
    """The mechanism's size: the largest distance between two of its points in the drawn pose [m] (> 0: a
    body's points are distinct).  Every point of a grounded mechanism stays within about this of a fixed
    point, and no body is longer."""
    xy = np.array([(p.x, p.y) for p in spec.points], dtype=float)
    d = xy[:, None, :] - xy[None, :, :]
    return float(np.sqrt((d * d).sum(-1)).max())


STANDARD_GRAVITY = 9.80665   # [m/s²] the scale's g (not the mechanism's gravity, which may be 0)


def mechanism_scale(spec: MechanismSpec) -> Tuple[float, float]:
    """(τ_c, T): the mechanism's effort scale τ_c = M·g·R [N·m] (M·g [N] where every actuator is prismatic) and
    time scale T = √(R/g) [s], M its total mass, R its reach, g standard gravity (a scale: also for a mechanism
    without gravity).  The noise densities' defaults follow them (`factors.noise`)."""
    mass = float(sum(b.mass for b in spec.bodies))
    reach = mechanism_reach(spec)
    angles = set(spec.angle_names)
    prismatic = bool(spec.actuators) and all(a.coordinate not in angles for a in spec.actuators)
    return mass * STANDARD_GRAVITY * (1.0 if prismatic else reach), math.sqrt(reach / STANDARD_GRAVITY)


def default_effort_limit(spec: MechanismSpec, angle: bool) -> float:
    """The default `effort_limit` of an actuator: a bound no real command of this mechanism comes near,
    from its scale only (M the total mass, R its reach, g = |gravity|):

        torque (an actuated angle):  10 · M·g·R  +  M·R² · 100 rad/s²
        force (a point coordinate):  10 · M·g    +  M·R  · 100 rad/s²

    M·g·R bounds the static gravity torque of the whole mass held at full reach and M·R² the moment of
    inertia of the whole mass about a point within reach (a closed chain's transmission can exceed them
    near its singular poses, hence the factor 10); 100 rad/s² takes a link of the mechanism's size from
    rest to 10 rad/s in 0.1 s.  The crank four-bar gets 1.39e4 N·m, 119× the simulated controller's peak,
    the pick-and-place robot 8.2e4 N·m, 284× (bench/input_limits.py).  Set `effort_limit` to the actuator's
    real peak to catch more than absurd values."""
    mass = float(sum(b.mass for b in spec.bodies))
    reach = mechanism_reach(spec)
    g = math.hypot(*spec.gravity)
    force = EFFORT_LIMIT_GRAVITY_FACTOR * mass * g + mass * reach * EFFORT_LIMIT_ACCELERATION
    return force * reach if angle else force


def _text(x: float) -> str:
    return f"{x:.4g}"


class _SingleTurn:
    """The rule of a single-turn encoder's readings: within one turn of zero, whatever the estimate."""
    __slots__ = ()
    span = 2.0 * math.pi

    def problem(self, value: float, q, what: str) -> Optional[Problem]:
        if abs(value) <= self.span:
            return None
        return ("implausible_position", f"{what} {_text(value)} rad, more than one turn ({_text(self.span)} rad) "
                                        f"from 0 (a single-turn encoder)")


class _Coordinate:
    """The rule of a coordinate's readings: [start_centre ± start_span] before the first estimate; then
    [estimate ± estimate_span] or [fixed_centre ± fixed_span] (see the module docstring)."""
    __slots__ = ("coordinate", "drawn", "start_span", "estimate_span", "fixed_centre", "fixed_span", "unit")

    def __init__(self, coordinate: int, drawn: float, angle: bool, reach: float):
        self.coordinate, self.drawn = coordinate, drawn
        if angle:
            self.start_span = 2.0 * math.pi * START_SPAN_TURNS
            self.estimate_span = 2.0 * math.pi * ESTIMATE_SPAN_TURNS
            self.fixed_centre, self.fixed_span, self.unit = 0.0, 2.0 * math.pi, "rad"
        else:
            self.start_span = self.estimate_span = self.fixed_span = POSITION_SPAN_REACHES * reach
            self.fixed_centre, self.unit = drawn, "m"

    def problem(self, value: float, q, what: str) -> Optional[Problem]:
        if q is None:
            if abs(value - self.drawn) <= self.start_span:
                return None
            return ("implausible_position", f"{what} {_text(value)} {self.unit}, more than {_text(self.start_span)} "
                                            f"{self.unit} from the drawn pose ({_text(self.drawn)} {self.unit}); "
                                            f"no estimate yet")
        estimate = q[self.coordinate]
        if abs(value - estimate) <= self.estimate_span or abs(value - self.fixed_centre) <= self.fixed_span:
            return None
        return ("implausible_position", f"{what} {_text(value)} {self.unit}, more than {_text(self.estimate_span)} "
                                        f"{self.unit} from the estimate ({_text(float(estimate))} {self.unit}) and "
                                        f"{_text(self.fixed_span)} {self.unit} from {_text(self.fixed_centre)} "
                                        f"{self.unit}")


class InputLimits:
    """The plausibility limits of one mechanism's inputs (see the module docstring).

    `reading_problem(sensor, value, q)` and `effort_problem(k, value)` return None for a plausible
    value, else a `(kind, detail)` problem; `efforts_problem(tau)` checks a whole vector in actuator order.
    `effort_limits[k]` is actuator k's limit, `max_rates[name]` a gyroscope's."""

    def __init__(self, mech):
        # (mech: a `model.mechanism.Mechanism`, which imports this module: no import of it here)
        spec = mech.spec
        self.mech = mech
        self.reach = mechanism_reach(spec)
        angles = set(int(c) for c in mech.relative_angle_columns)
        self.effort_limits = np.array(
            [a.effort_limit if a.effort_limit is not None
             else default_effort_limit(spec, int(c) in angles)
             for a, c in zip(spec.actuators, mech.actuated)], dtype=float)
        self.effort_limits.setflags(write=False)
        self.effort_units = tuple("N·m" if int(c) in angles else "N" for c in mech.actuated)
        self.max_rates: Dict[str, float] = {
            g.name: (g.max_rate if g.max_rate is not None else DEFAULT_MAX_RATE) for g in spec.gyroscopes}
        self._coordinates = [_Coordinate(c, float(mech.q0[c]), c in angles, self.reach) for c in range(mech.n)]
        self._encoders = {s.name: _SingleTurn() if s.single_turn else self._coordinates[s.coordinate]
                          for s in mech.sensors if s.kind == "encoder"}
        self._limits_list = self.effort_limits.tolist()

    @property
    def sensor_names(self) -> List[str]:
        return [s.name for s in self.mech.sensors]

    def reading_problem(self, sensor: str, value: float, q: Optional[Sequence[float]] = None) -> Optional[Problem]:
        """Is `value` a plausible reading of sensor `sensor` (q: the current estimate's coordinates, None
        before there is one)?  A name that is no sensor of the mechanism is the caller's business."""
        if not math.isfinite(value):
            return ("non_finite", f"non-finite reading {value} of sensor '{sensor}'")
        rule = self._encoders.get(sensor)
        if rule is not None:
            return rule.problem(value, q, f"encoder '{sensor}' reads")
        limit = self.max_rates.get(sensor)
        if limit is not None and abs(value) > limit:
            return ("implausible_rate", f"gyroscope '{sensor}' reads {_text(value)} rad/s, beyond its max_rate "
                                        f"{_text(limit)} rad/s")
        return None

    def coordinate_problem(self, coordinate: int, value: float, q: Optional[Sequence[float]] = None
                           ) -> Optional[Problem]:
        """Is `value` a plausible value of coordinate `coordinate` (an index in q)?  The rule of an
        encoder on it (a prescribed trajectory, a reading)."""
        if not math.isfinite(value):
            return ("non_finite", f"non-finite value {value} of coordinate "
                                  f"'{self.mech.coordinate_names[coordinate]}'")
        return self._coordinates[coordinate].problem(value, q,
                                                     f"coordinate '{self.mech.coordinate_names[coordinate]}' is")

    def effort_problem(self, k: int, value: float) -> Optional[Problem]:
        """Is `value` a plausible command of actuator k (actuator order)?"""
        if not math.isfinite(value):
            return ("non_finite", f"non-finite effort {value} for actuator '{self.mech.actuator_names[k]}'")
        limit = self._limits_list[k]
        if abs(value) > limit:
            unit = self.effort_units[k]
            return ("implausible_effort", f"effort {_text(value)} {unit} for actuator "
                                          f"'{self.mech.actuator_names[k]}' beyond its effort_limit "
                                          f"{_text(limit)} {unit}")
        return None

    def efforts_problem(self, tau: Sequence[float]) -> Optional[Problem]:
        """The first problem of a vector of commands in actuator order (None: all plausible)."""
        for k, value in enumerate(tau):
            p = self.effort_problem(k, float(value))
            if p is not None:
                return p
        return None
