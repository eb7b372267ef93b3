"""Helpers between ROS 2 messages and numpy (no estimation).

The conversions take and return plain message objects, serialized bytes and numpy arrays so that they
can be unit tested without DDS.  Input parsers never raise on bad content: they return the usable part plus a
list of `(kind, detail)` problems that the node counts and reports in its diagnostics.
"""

from __future__ import annotations

import array
import math
import struct
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from builtin_interfaces.msg import Duration as DurationMsg
from builtin_interfaces.msg import Time as TimeMsg
from geometry_msgs.msg import Point
from sensor_msgs.msg import JointState
from std_msgs.msg import ColorRGBA
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint
from visualization_msgs.msg import Marker, MarkerArray

from mbfg_ros.model.plausibility import InputLimits, Problem
from mbfg_ros.shown import shown

NS = 1_000_000_000


# ---------------------------------------------------------------------------------------------
# time
def stamp_to_ns(stamp) -> int:
    return int(stamp.sec) * NS + int(stamp.nanosec)


def ns_to_stamp(ns: int) -> TimeMsg:
    sec, nsec = divmod(int(ns), NS)
    return TimeMsg(sec=int(sec), nanosec=int(nsec))


def clock_reader(clock) -> Callable[[], int]:
    """A function reading an rclpy Clock in ns.  Clock.now() wraps the rcl clock's reading in two objects;
    the rcl clock is read directly where this rclpy allows it."""
    try:
        get_now = clock.handle.get_now
        get_now().nanoseconds
    except Exception:  # pragma: no cover
        return lambda: clock.now().nanoseconds
    return lambda: get_now().nanoseconds


def float_array(x) -> array.array:
    """Fast conversion for float64[] message fields (rclpy accepts array('d') without checks)."""
    if type(x) is not np.ndarray or x.dtype != np.float64 or not x.flags.c_contiguous:
        x = np.ascontiguousarray(x, dtype=np.float64)
    return array.array("d", x.tobytes())


# ---------------------------------------------------------------------------------------------
# inputs
class RawJointState:
    """The fields of a `sensor_msgs/JointState` decoded straight from its serialized (CDR) form.

    The node takes its inputs serialized: building rclpy's message objects (JointState, Header, Time and
    their checked setters) costs more than the estimator's whole bookkeeping for a step."""

    __slots__ = ("stamp_ns", "frame_id", "name", "position", "velocity", "effort")

    def __init__(self, stamp_ns: int, frame_id: str, name, position, velocity, effort):
        self.stamp_ns, self.frame_id = stamp_ns, frame_id
        self.name, self.position, self.velocity, self.effort = name, position, velocity, effort


_LE, _BE = struct.Struct("<I"), struct.Struct(">I")
_STAMP = {"<": struct.Struct("<iI"), ">": struct.Struct(">iI")}

# Longest frame_id, joint name or dimension label an input may carry, in bytes (UTF-8).  ROS frame and
# joint names are a few dozen characters; a publisher on the domain could send megabytes, which every
# message would then drag through decoding and every log line about it.  A longer one drops the
# message (`rejected.long_string`); the check reads the length field only.
MAX_INPUT_STRING = 256
# Most joint names (or layout dimensions) an input may carry: each costs Python work in the decoder, and a
# whole robot's /joint_states has tens.  More drops the message (`long_string`, it is oversized the same way).
MAX_INPUT_NAMES = 1024


class LongString(ValueError):
    """An input message carries a string longer than MAX_INPUT_STRING (counted as `long_string`)."""


def _encapsulation(buf: bytes, what: str):
    """(byte order, u32 unpacker) of a CDR-encapsulated message (XCDR1 / plain CDR as rmw
    implementations write it: a 4-byte encapsulation header, then the fields aligned to their size
    relative to the end of that header).  Offsets below are absolute; alignment is relative to 4."""
    if len(buf) < 8 or buf[0] != 0 or buf[1] not in (0, 1):
        raise ValueError(f"not a CDR-encapsulated {what}")
    e = "<" if buf[1] == 1 else ">"
    return e, (_LE if e == "<" else _BE).unpack_from


_MAX_CDR_STRING = MAX_INPUT_STRING + 1      # the length field counts the terminating NUL


def _bad_string(length: int, what: str) -> ValueError:
    """The error for a CDR string length that is 0, beyond the buffer or beyond MAX_INPUT_STRING."""
    if length > _MAX_CDR_STRING:
        return LongString(f"{what} of {length - 1} bytes (at most {MAX_INPUT_STRING})")
    return ValueError(f"bad {what} length")


def decode_joint_state(buf: bytes) -> RawJointState:
    """Decode a serialized JointState.  Raises LongString for a frame_id or joint name longer than
    MAX_INPUT_STRING or more than MAX_INPUT_NAMES names, ValueError on a truncated or malformed buffer."""
    n = len(buf)
    if n < 16 or buf[0] != 0 or buf[1] not in (0, 1):
        raise ValueError("not a CDR-encapsulated JointState")
    e = "<" if buf[1] == 1 else ">"
    u32 = (_LE if e == "<" else _BE).unpack_from
    try:
        sec, nanosec = _STAMP[e].unpack_from(buf, 4)
        (length,) = u32(buf, 12)
        p = 16 + length
        if length > _MAX_CDR_STRING or p > n:      # (length 0, without the NUL, is read as "")
            raise _bad_string(length, "frame_id")
        frame_id = buf[16:p - 1].decode("utf-8", "replace")
        p += -p % 4
        (count,) = u32(buf, p)
        p += 4
        if count > n:
            raise ValueError("bad name count")
        if count > MAX_INPUT_NAMES:
            raise LongString(f"{count} joint names (at most {MAX_INPUT_NAMES})")
        names = []
        for _ in range(count):
            (length,) = u32(buf, p)
            q = p + 4 + length
            if not 0 < length <= _MAX_CDR_STRING or q > n:
                raise _bad_string(length, "joint name")
            names.append(buf[p + 4:q - 1].decode("utf-8", "replace"))
            p = q + (-q % 4)
        arrays = []
        for _ in range(3):
            (count,) = u32(buf, p)
            p += 4
            if count:
                p += -(p - 4) % 8
                q = p + 8 * count
                if q > n:
                    raise ValueError("truncated float64 sequence")
                arrays.append(struct.unpack_from(f"{e}{count}d", buf, p))
                p = q + (-q % 4)
            else:
                arrays.append(())
    except struct.error as exc:
        raise ValueError(f"truncated JointState ({exc})") from None
    return RawJointState(sec * NS + nanosec, frame_id, names, *arrays)


def decode_float64_multi_array(buf: bytes) -> Tuple[float, ...]:
    """The `data` of a serialized std_msgs/Float64MultiArray (its layout is checked for well-formedness
    and skipped: the node takes the efforts in actuator order).  Raises LongString for a dimension label
    longer than MAX_INPUT_STRING, ValueError on a truncated or malformed buffer.  Taken serialized so
    that a buffer rclpy could not deserialize is counted (`bad_message`) like a bad JointState."""
    n = len(buf)
    e, u32 = _encapsulation(buf, "Float64MultiArray")
    try:
        (dims,) = u32(buf, 4)
        p = 8
        if dims > n:
            raise ValueError("bad layout.dim count")
        if dims > MAX_INPUT_NAMES:
            raise LongString(f"{dims} layout dimensions (at most {MAX_INPUT_NAMES})")
        for _ in range(dims):           # MultiArrayDimension: label, size, stride
            (length,) = u32(buf, p)
            q = p + 4 + length
            if not 0 < length <= _MAX_CDR_STRING or q > n:
                raise _bad_string(length, "layout.dim label")
            p = q + (-q % 4) + 8
        p += 4                          # layout.data_offset
        (count,) = u32(buf, p)
        p += 4
        if not count:
            return ()
        p += -(p - 4) % 8
        if p + 8 * count > n:
            raise ValueError("truncated float64 sequence")
        return struct.unpack_from(f"{e}{count}d", buf, p)
    except struct.error as exc:
        raise ValueError(f"truncated Float64MultiArray ({exc})") from None


def sensor_fields(mech) -> Dict[str, str]:
    """The `sensors` map of `parse_observations` for a mechanism's sensors: joint name -> the field that
    carries its reading."""
    return {s.name: ("position" if s.kind == "encoder" else "velocity") for s in mech.sensors}


def parse_observations(msg, sensors: Dict[str, str], limits: InputLimits, q=None
                       ) -> Tuple[Dict[str, float], List[Problem]]:
    """Sensor readings from a JointState (a message object or a `RawJointState`).

    `sensors` maps a joint name (= the sensor's name) to its field: 'position' for encoders, 'velocity'
    for gyroscopes.  Only the fields a known joint needs are read, so NaN in unused fields (a common
    driver convention) is fine.  Each reading must be plausible (`limits`; q: the current estimate's
    coordinates, None before there is one).  Returns the usable readings and the problems found."""
    names = msg.name
    if not names:
        return {}, [("empty", "JointState without joint names")]
    if len(set(names)) != len(names):
        return {}, [("bad_size", "JointState repeats a joint name")]
    problems: List[Problem] = []
    out: Dict[str, float] = {}
    missing = None                    # fields a known joint needs that the message does not carry
    for i, name in enumerate(names):
        fld = sensors.get(name)
        if fld is None:
            problems.append(("unknown_joint", f"unknown joint '{shown(name)}' (known: {', '.join(sorted(sensors))})"))
            continue
        values = getattr(msg, fld)
        if len(values) != len(names):
            if not values:
                missing = missing or {}
                missing.setdefault(fld, []).append(name)
            else:
                problems.append(("bad_size", f"JointState has {len(names)} names but {len(values)} {fld} values "
                                             f"(joint '{shown(name)}' needs {fld})"))
            continue
        val = float(values[i])
        problem = limits.reading_problem(name, val, q)
        if problem is not None:
            problems.append(problem)
            continue
        out[name] = val
    if missing:
        problems += [("empty", f"JointState has no {fld} values (joint(s) {shown(joints)} need {fld})")
                     for fld, joints in missing.items()]
    return out, problems


def prescribed_readings(mech, kinds: Sequence[str]) -> Dict[str, Tuple[int, str]]:
    """The `parse_prescribed_motion` map of the actuators whose effort kind (`kinds`, actuator order) is
    `prescribed`: joint name -> (coordinate index, the reading name 'q:<coordinate>' the core takes)."""
    out = {}
    for name, kind, actuator in zip(mech.actuator_names, kinds, mech.spec.actuators):
        if kind == "prescribed":
            out[name] = (mech.coordinate_index(actuator.coordinate), f"q:{actuator.coordinate}")
    return out


def parse_prescribed_motion(msg, prescribed: Dict[str, Tuple[int, str]], actuators: Sequence[str],
                            limits: InputLimits, q=None) -> Tuple[Dict[str, float], List[Problem]]:
    """Set-points from a JointState's `position` (a message object or a `RawJointState`) as readings
    {'q:<coordinate>': value} of the prescribed actuators (`prescribed_readings`).  A joint that is an actuator
    but not prescribed (`actuators`: every actuator's name) is refused as `not_prescribed`: its coordinate would
    be held to a trajectory its effort kind does not follow.  Each set-point must be plausible for its coordinate
    (`limits`, the rule of an encoder on it; q: the current estimate's coordinates, None before there is one)."""
    names = msg.name
    if not names:
        return {}, [("empty", "JointState without joint names")]
    if len(set(names)) != len(names):
        return {}, [("bad_size", "JointState repeats a joint name")]
    if len(msg.position) != len(names):
        if not msg.position:
            return {}, [("empty", f"JointState names {shown(names)} but has no position values (the set-points)")]
        return {}, [("bad_size", f"JointState has {len(names)} names but {len(msg.position)} position values")]
    problems: List[Problem] = []
    out: Dict[str, float] = {}
    for name, val in zip(names, msg.position):
        target = prescribed.get(name)
        if target is None:
            if name in actuators:
                problems.append(("not_prescribed", f"actuator '{shown(name)}' (prescribed: "
                                                   f"{', '.join(prescribed) or 'none'})"))
            else:
                problems.append(("unknown_joint", f"unknown actuator joint '{shown(name)}' (actuators: "
                                                  f"{', '.join(actuators) or 'none'})"))
            continue
        coordinate, reading = target
        val = float(val)
        problem = limits.coordinate_problem(coordinate, val, q)
        if problem is not None:
            problems.append((problem[0], f"set-point of '{shown(name)}': {problem[1]}"))
            continue
        out[reading] = val
    return out, problems


def parse_effort_joint_state(msg, actuators: Dict[str, int], limits: InputLimits
                             ) -> Tuple[Optional[np.ndarray], List[Problem]]:
    """Efforts (actuator order, NaN where the message does not say) from a JointState's `effort`; each
    must be plausible (`limits`).  None if no effort is usable."""
    names = msg.name
    if not names:
        return None, [("empty", "JointState without joint names")]
    if not msg.effort:
        return None, [("empty", f"JointState names {shown(names)} but has no effort values")]
    if len(msg.effort) != len(names):
        return None, [("bad_size", f"JointState has {len(names)} names but {len(msg.effort)} effort values")]
    if len(set(names)) != len(names):
        return None, [("bad_size", "JointState repeats a joint name")]
    problems: List[Problem] = []
    tau = [math.nan] * len(limits.effort_limits)
    found = False
    for name, val in zip(names, msg.effort):
        k = actuators.get(name)
        if k is None:
            problems.append(("unknown_joint", f"unknown actuator joint '{shown(name)}' (known: {', '.join(actuators)})"))
            continue
        val = float(val)
        problem = limits.effort_problem(k, val)
        if problem is not None:
            problems.append(problem)
            continue
        tau[k] = val
        found = True
    # not found: every joint was refused, each with its problem
    return (np.array(tau) if found else None), problems


def parse_effort_array(data: Sequence[float], limits: InputLimits) -> Tuple[Optional[np.ndarray], List[Problem]]:
    """Efforts from a Float64MultiArray's data in actuator order (forward_command_controller); the whole
    message is refused if one of them is not plausible (`limits`)."""
    n_actuators = len(limits.effort_limits)
    if len(data) != n_actuators:
        if not len(data):
            return None, [("empty", f"Float64MultiArray without values (expected {n_actuators}, one per actuator)")]
        return None, [("bad_size", f"Float64MultiArray has {len(data)} values, expected {n_actuators} "
                                   f"(one per actuator, in actuator order)")]
    tau = np.array(data, dtype=float)
    problem = limits.efforts_problem(tau)
    if problem is not None:
        return None, [problem]
    return tau, []


# ---------------------------------------------------------------------------------------------
# outputs
def joint_state(stamp: TimeMsg, names: Sequence[str], position, velocity, effort, msg: Optional[JointState] = None
                ) -> JointState:
    msg = msg or JointState()
    msg.header.stamp = stamp
    msg.name = list(names)
    msg.position = float_array(position)
    msg.velocity = float_array(velocity)
    msg.effort = float_array(effort)
    return msg


def trajectory_state(stamp: TimeMsg, frame_id: str, names: Sequence[str], q, v, a, Q,
                     msg: Optional[JointTrajectory] = None) -> JointTrajectory:
    """One JointTrajectoryPoint over all generalized coordinates: q, q̇, q̈ and Q."""
    msg = msg or JointTrajectory()
    msg.header.stamp = stamp
    msg.header.frame_id = frame_id
    msg.joint_names = list(names)
    pt = msg.points[0] if msg.points else JointTrajectoryPoint()
    pt.positions = float_array(q)
    pt.velocities = float_array(v)
    pt.accelerations = float_array(a)
    pt.effort = float_array(Q)
    pt.time_from_start = DurationMsg()
    if not msg.points:
        msg.points = [pt]
    return msg


_BODY_COLOR = ColorRGBA(r=0.2, g=0.45, b=0.9, a=1.0)
_POINT_COLOR = ColorRGBA(r=0.95, g=0.5, b=0.1, a=1.0)
_FIXED_COLOR = ColorRGBA(r=0.3, g=0.3, b=0.3, a=1.0)


def mechanism_markers(mech, q, stamp: TimeMsg, frame_id: str, ns_prefix: str = "mbfg", xy=None) -> MarkerArray:
    """Bodies as line strips (closed for N-point bodies) and points as one sphere list (`xy`: the
    points' positions, instead of computing them from q)."""
    if xy is None:
        xy = mech.point_positions(np.asarray(q, dtype=float))
    out = MarkerArray()
    for b, body in enumerate(mech.spec.bodies):
        m = Marker()
        m.header.stamp = stamp
        m.header.frame_id = frame_id
        m.ns = f"{ns_prefix}/bodies"
        m.id = b
        m.type = Marker.LINE_STRIP
        m.action = Marker.ADD
        m.pose.orientation.w = 1.0
        m.scale.x = 0.04
        m.color = _BODY_COLOR
        idx = list(body.points) + ([body.points[0]] if len(body.points) > 2 else [])
        m.points = [Point(x=float(xy[i, 0]), y=float(xy[i, 1]), z=0.0) for i in idx]
        out.markers.append(m)
    pts = Marker()
    pts.header.stamp = stamp
    pts.header.frame_id = frame_id
    pts.ns = f"{ns_prefix}/points"
    pts.id = 0
    pts.type = Marker.SPHERE_LIST
    pts.action = Marker.ADD
    pts.pose.orientation.w = 1.0
    pts.scale.x = pts.scale.y = pts.scale.z = 0.08
    pts.points = [Point(x=float(p[0]), y=float(p[1]), z=0.0) for p in xy]
    fixed = [p.fixed for p in mech.spec.points]
    pts.colors = [_FIXED_COLOR if f else _POINT_COLOR for f in fixed]
    out.markers.append(pts)
    return out


class SerializedTemplate:
    """A message whose layout never changes (same names, array sizes, strings), published serialized:
    built and serialized once with sentinel values in its stamps and in the float64 fields that change,
    then each output is a copy of those bytes with the real values written at the sentinels' offsets.
    rclpy's conversion of a message object walks every field in Python each time: for ~/markers (about
    40 small messages) a stall of the 1 kHz loop; a copy and a few `pack_into` are cheap.

    `build(stamp, values)` must return the message for a `TimeMsg` stamp and a float64 array of
    `n_values` values; it is called once with sentinels.  `fill(stamp_ns, values)` returns the bytes."""

    STAMP = (0x6D626667, 987654321)          # (sec, nanosec) that no real header carries

    def __init__(self, build, n_values: int):
        from rclpy.serialization import serialize_message
        self.n_values = int(n_values)
        # distinct, huge doubles: their 8-byte patterns cannot occur by accident in the other fields
        sentinel = 1.0e300 * (1.0 + np.arange(self.n_values) / 4096.0)
        buf = serialize_message(build(TimeMsg(sec=self.STAMP[0], nanosec=self.STAMP[1]), sentinel))
        if len(buf) < 4 or buf[0] != 0 or buf[1] not in (0, 1):
            raise ValueError("unexpected serialization (not CDR)")
        e = "<" if buf[1] == 1 else ">"
        self._stamp = struct.Struct(e + "iI")
        self._stamp_offsets = _find_all(buf, self._stamp.pack(*self.STAMP))
        if not self._stamp_offsets:
            raise ValueError("stamp sentinel not found")
        # offsets of each value, grouped into runs of consecutive values stored contiguously
        occurrences = []
        for k, x in enumerate(sentinel):
            offs = _find_all(buf, struct.pack(e + "d", x))
            if not offs:
                raise ValueError(f"value sentinel {k} not found")
            occurrences += [(off, k) for off in offs]
        occurrences.sort()
        runs = []                             # [first offset, first value index, count]
        for off, k in occurrences:
            if runs and off == runs[-1][0] + 8 * runs[-1][2] and k == runs[-1][1] + runs[-1][2]:
                runs[-1][2] += 1
            else:
                runs.append([off, k, 1])
        self._runs = [(off, k, k + n, struct.Struct(f"{e}{n}d")) for off, k, n in runs]
        self._template = bytes(buf)

    def fill(self, stamp_ns: int, values) -> bytes:
        b = bytearray(self._template)
        sec, nsec = divmod(int(stamp_ns), NS)
        for off in self._stamp_offsets:
            self._stamp.pack_into(b, off, sec, nsec)
        vals = values.tolist() if isinstance(values, np.ndarray) else list(values)
        for off, a, z, st in self._runs:
            st.pack_into(b, off, *vals[a:z])
        return bytes(b)


def _find_all(buf: bytes, pattern: bytes) -> List[int]:
    out, i = [], buf.find(pattern)
    while i >= 0:
        out.append(i)
        i = buf.find(pattern, i + 1)
    return out


def _value_text(v) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def encode_diagnostic_array(stamp_ns: int, statuses: Sequence[Tuple[int, str, str, str, Dict[str, object]]],
                            frame_id: str = "") -> bytes:
    """A `diagnostic_msgs/DiagnosticArray` serialized (CDR, little endian) straight from Python values:
    statuses = [(level, name, message, hardware_id, {key: value})] (level an int or, as rclpy's
    `DiagnosticStatus.OK` etc., one byte; floats as %.6g, the rest str()).
    rclpy's conversion of the message objects is slow enough in Python for the node's ~60 key/values
    that the hot path felt it through the GIL at every diagnostics period (docs/decisions.md).  The
    tests check it against rclpy's own serialization (equal but for the padding bytes, which rclpy
    leaves uninitialized and this writes as zeros)."""
    out = bytearray(b"\x00\x01\x00\x00")          # encapsulation: CDR little endian
    u32 = _LE

    def align4():
        pad = -(len(out) - 4) % 4                    # offsets count from after the encapsulation header
        if pad:
            out.extend(b"\x00" * pad)

    def string(text: str):
        b = text.encode("utf-8")
        align4()
        out.extend(u32.pack(len(b) + 1))
        out.extend(b)
        out.append(0)

    sec, nsec = divmod(int(stamp_ns), NS)
    out.extend(_STAMP["<"].pack(sec, nsec))
    string(frame_id)
    align4()
    out.extend(u32.pack(len(statuses)))
    for level, name, message, hardware_id, values in statuses:
        out.append(level[0] if isinstance(level, bytes) else int(level) & 0xFF)
        string(name)
        string(message)
        string(hardware_id)
        align4()
        out.extend(u32.pack(len(values)))
        for k, v in values.items():
            string(str(k))
            string(_value_text(v))
    return bytes(out)

