"""Plain, validated description of a mechanism as written in YAML.

The loader (`mbfg_ros.model.loader`) turns a YAML file into a `MechanismSpec`; `mbfg_ros.model.mechanism.Mechanism`
turns a spec into the immutable numerical model.  Everything here is already numbers: expressions
are evaluated, indices checked, names resolved.  Point indices are 0-based, as in the YAML file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Tuple


#: [rad/s or m/s] the rate v_s of an actuator's smoothed Coulomb friction when the YAML gives none (`ActuatorSpec`)
DEFAULT_COULOMB_VELOCITY = 0.01

#: what an actuator's effort is to the estimator (`ActuatorSpec.effort`): a state to estimate, the commanded effort
#: (a known force), zero (a passive joint of an underactuated machine: its motor is off, its friction still acts), or
#: a state to estimate whose coordinate's motion is prescribed (a position-controlled joint: its set-points come as
#: readings 'q:<coordinate>' of the coordinate, a soft prior of σ `sensor_sigmas['q:<coordinate>']`)
EFFORT_KINDS = ("estimated", "commanded", "passive", "prescribed")

#: the parameters of an actuator that the estimator can identify online (`IdentifySpec`, `model.identified`)
IDENTIFIABLE = ("gain", "viscous_friction", "coulomb_friction")
#: the parameters of a body that the estimator can identify online: an added point mass at a stated point
BODY_IDENTIFIABLE = ("payload_mass",)


class MechanismError(ValueError):
    """Any problem with a mechanism description.  The message names the file, the key path and what is wrong."""


@dataclass(frozen=True)
class PointSpec:
    x: float
    y: float
    fixed: bool = False
    name: Optional[str] = None


@dataclass(frozen=True)
class BodySpec:
    points: Tuple[int, ...]   # 2 or more point indices; the body frame is at points[0], +X toward points[1]
    length: float             # |points[1] - points[0]|, as declared (2-point bodies) or drawn (N-ary bodies)
    mass: float
    I0: float                 # moment of inertia about points[0], out of plane
    cog: Tuple[float, float]  # centre of mass in the body frame
    name: str = ""


@dataclass(frozen=True)
class RelativeAngleSpec:
    """Absolute angle of the vector points[0] -> points[1] from +X, counter-clockwise: one extra coordinate."""
    name: str
    points: Tuple[int, int]


@dataclass(frozen=True)
class JointAngleSpec:
    """A joint (relative) angle coordinate q = θ_child − θ_parent + offset between two bodies, with one linear
    constraint row.  θ of a body is one of its absolute angle coordinates (`RelativeAngleSpec`, on any two of its
    points; the loader adds ``theta_<body>`` on points[0] → points[1] where a body has none); `offset` makes q the
    YAML's `value` in the drawn pose whichever points those angles are on."""
    name: str
    parent: Optional[int]     # body index; None: the ground (θ = 0)
    child: int                # body index
    parent_angle: Optional[str]   # the coordinate of θ_parent (None: the ground)
    child_angle: str          # the coordinate of θ_child
    offset: float             # q − (θ_child − θ_parent) [rad], constant


@dataclass(frozen=True)
class FixedSliderSpec:
    """`point` moves on the fixed line through `line[0]` and `line[1]` (global coordinates)."""
    name: str
    point: int
    line: Tuple[Tuple[float, float], Tuple[float, float]]


@dataclass(frozen=True)
class MobileSliderSpec:
    """`point` moves on the line through the two (moving or fixed) points `line_points`."""
    name: str
    point: int
    line_points: Tuple[int, int]


MAX_ACTUATOR_DELAY = 1.0    # [s] an actuator's `delay` is a driver's latency (ms): a second or more is a unit's mistake


def is_actuator_delay(value) -> bool:
    """Is `value` an actuator's `delay`: a number of seconds (not a bool), 0 ≤ value < MAX_ACTUATOR_DELAY?"""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and 0.0 <= value < MAX_ACTUATOR_DELAY


def is_effort_sigma(value) -> bool:
    """Is `value` an actuator's `effort_sigma`: a finite number (not a bool) ≥ 0?"""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and 0.0 <= value < math.inf


@dataclass(frozen=True)
class ActuatorSpec:
    """A commanded generalized force (torque on an angle, force on a point coordinate) on `coordinate`."""
    coordinate: str           # a coordinate name, as `Mechanism.coordinate_names` lists it
    joint: str                # the name used on ROS topics (defaults to the coordinate name)
    effort_limit: Optional[float] = None   # |command| above it is implausible; None: from the mechanism's scale
    # A geared motor: the rotor's angle is φ = θ_stator + gear_ratio·q (q the actuated angle; the stator is the
    # parent body of a joint angle, the ground for an absolute body angle), so its kinetic energy adds
    # rotor_inertia·a·aᵀ (a = ∂φ/∂q) to the mass matrix.  The effort is the joint-side torque.
    gear_ratio: float = 1.0
    rotor_inertia: float = 0.0            # [kg·m²] about the rotor axis
    stator_angle: Optional[str] = None    # the coordinate of θ_stator (None: the ground)
    # joint friction on the coordinate, F(q̇) = b q̇ + c (2/π) atan(q̇ / v_s), a generalized force −F
    # (`model.friction.Friction`): b [N·m·s/rad or N·s/m], c [N·m or N] (the friction well above v_s), v_s > 0
    viscous_friction: float = 0.0
    coulomb_friction: float = 0.0
    coulomb_velocity: float = DEFAULT_COULOMB_VELOCITY
    # one of EFFORT_KINDS, or None: as the estimator's mode says (estimation: estimated; fused, forward dynamics:
    # commanded); `estimation.efforts.effort_kinds`
    effort: Optional[str] = None
    # [s] the actuator applies a command this long after it is given (a driver's latency on its bus:
    # `estimation.actuator_delay`)
    delay: float = 0.0
    # [s] after the delay the applied effort follows the command through a first-order lag of this time constant
    # (a current loop's rise; 0: none; `estimation.actuator_delay`)
    time_constant: float = 0.0
    # 1σ [N·m or N] of the effort it applies about that response to its command that no reading resolves (its
    # torque ripple, the response model's error): part of the published σ of its effort unless it is passive
    # (`estimation.estimates`); 0: the command is exact
    effort_sigma: float = 0.0


@dataclass(frozen=True)
class IdentifySpec:
    """A parameter of an actuator (or a body) estimated online as a slowly varying state (the mechanism's
    `identify:`): `parameter` one of IDENTIFIABLE of the actuator whose joint is `joint` (or of BODY_IDENTIFIABLE of
    body `body`, named `joint`); its prior (`value`, `sigma`; value None:
    the actuator's declared value, 1 for a gain) and the density of its random walk [unit²/s] (None: the
    default, `model.identified.default_density`)."""
    joint: str
    parameter: str
    sigma: Optional[float] = None
    value: Optional[float] = None
    density: Optional[float] = None
    # a body's parameter (BODY_IDENTIFIABLE; `joint` is then the body's name): its index, and where the payload sits
    # in the body frame (as `cog`: from the body's first point, +X toward its second) [m]
    body: Optional[int] = None
    at: Tuple[float, float] = (0.0, 0.0)


@dataclass(frozen=True)
class EncoderSpec:
    """Measures one coordinate (normally a relative angle)."""
    name: str                 # joint name on ROS topics (defaults to the coordinate name)
    coordinate: str
    sigma: float              # given, or the quantization σ of `counts_per_turn` (one count / √12)
    # an angle encoder's readings: 'multi' (the angle itself, whole turns included) or 'single' (the angle
    # modulo one turn, in [−π, π) or [0, 2π)); lengths are always read whole ('multi')
    turns: str = "multi"
    counts_per_turn: Optional[int] = None   # resolution of an angle encoder (None: not stated)


@dataclass(frozen=True)
class GyroscopeSpec:
    """Measures the angular rate of a body, from its first two points."""
    name: str
    body: int
    sigma: float
    max_rate: Optional[float] = None       # |reading| above it is implausible [rad/s]; None: the default


@dataclass(frozen=True)
class AssemblyModeSpec:
    """Branch indicator: sign of (p[j] - p[i]) x (p[k] - p[i]) for points (i, j, k)."""
    name: str
    points: Tuple[int, int, int]


@dataclass(frozen=True)
class MechanismSpec:
    name: str
    points: Tuple[PointSpec, ...]
    bodies: Tuple[BodySpec, ...]
    gravity: Tuple[float, float] = (0.0, -9.81)
    relative_angles: Tuple[RelativeAngleSpec, ...] = ()
    joint_angles: Tuple[JointAngleSpec, ...] = ()
    fixed_sliders: Tuple[FixedSliderSpec, ...] = ()
    mobile_sliders: Tuple[MobileSliderSpec, ...] = ()
    actuators: Tuple[ActuatorSpec, ...] = ()
    encoders: Tuple[EncoderSpec, ...] = ()
    gyroscopes: Tuple[GyroscopeSpec, ...] = ()
    assembly_modes: Tuple[AssemblyModeSpec, ...] = ()
    identify: Tuple[IdentifySpec, ...] = ()
    source: str = "<memory>"
    parameters: Tuple[Tuple[str, float], ...] = field(default=())

    @property
    def angle_names(self) -> Tuple[str, ...]:
        """The names of the angle coordinates: the relative (absolute body) angles, then the joint angles; every
        other coordinate is a point coordinate (a length)."""
        return tuple(r.name for r in self.relative_angles) + tuple(j.name for j in self.joint_angles)
