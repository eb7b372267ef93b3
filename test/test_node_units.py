"""The node's ROS-side helpers without DDS (mbfg_ros.ros.conversions): the message parsers (bad content is
reported, never raised), the serialized input decoder and the serialized output templates and diagnostics
encoder (all against rclpy's own serialization)."""

import math

import numpy as np
import pytest

from sensor_msgs.msg import JointState

from mbfg_ros.ros import conversions as rc

MS = 1_000_000
T0 = 1_000_000 * MS          # an arbitrary positive node-clock time


# -- parsers ------------------------------------------------------------------------------------
SENSORS = {"crank": "position", "coupler_gyro": "velocity"}


@pytest.fixture(scope="module")
def limits():
    """The crank four-bar's plausibility limits (crank: an angle encoder and an actuator; coupler_gyro)."""
    from mbfg_ros.model.mechanism import load_mechanism
    from mbfg_ros.model.plausibility import InputLimits
    return InputLimits(load_mechanism("four_bar_crank"))


def js(names, position=(), velocity=(), effort=()):
    m = JointState()
    m.name, m.position, m.velocity, m.effort = list(names), list(position), list(velocity), list(effort)
    return m


def test_parse_observations_reads_the_field_each_sensor_needs(limits):
    vals, problems = rc.parse_observations(js(["crank", "coupler_gyro"], [0.5, math.nan], [math.nan, 2.0]),
                                           SENSORS, limits)
    assert vals == {"crank": 0.5, "coupler_gyro": 2.0} and problems == []


@pytest.mark.parametrize("msg,kind", [
    (js(["crank", "elbow"], [0.1, 0.2]), "unknown_joint"),
    (js(["crank"], [math.inf]), "non_finite"),
    (js(["crank", "coupler_gyro"], [0.1, 0.2], [1.0]), "bad_size"),
    (js(["crank", "crank"], [0.1, 0.2]), "bad_size"),
    (js([]), "empty"),
    (js([], [0.1]), "empty"),
    (js(["crank"]), "empty"),                                   # names, but no position field
    (js(["crank", "coupler_gyro"], [0.1, math.nan]), "empty"),  # the gyroscope's velocity field is missing
    (js(["crank"], [1e300]), "implausible_position"),
    (js(["coupler_gyro"], [], [-1e300]), "implausible_rate"),
])
def test_parse_observations_reports_bad_content(msg, kind, limits):
    vals, problems = rc.parse_observations(msg, SENSORS, limits)
    assert kind in [p[0] for p in problems]
    assert all(math.isfinite(v) and abs(v) < 1e3 for v in vals.values())


def test_parse_observations_judges_encoders_against_the_estimate(limits):
    """A multi-turn reading 500 turns from the estimate is implausible once there is one, not before (a
    multi-turn count at start-up); a single-turn encoder's reading is plausible whatever turn the estimate
    is on."""
    far = 2 * math.pi * 500 + 0.5
    q = np.array([1.0, 0.0, 1.0, 2.0, 0.2])
    vals, problems = rc.parse_observations(js(["crank"], [far]), SENSORS, limits)
    assert vals == {"crank": far} and not problems
    vals, problems = rc.parse_observations(js(["crank"], [far]), SENSORS, limits, q)
    assert vals == {} and problems[0][0] == "implausible_position" and "from the estimate" in problems[0][1]
    q[4] = far - 0.2
    vals, problems = rc.parse_observations(js(["crank", "coupler_gyro"], [0.3, math.nan], [math.nan, 1.0]),
                                           SENSORS, limits, q)
    assert vals == {"crank": 0.3, "coupler_gyro": 1.0} and not problems


def test_parse_efforts():
    from mbfg_ros.model.loader import load_spec_from_string
    from mbfg_ros.model.mechanism import Mechanism
    from mbfg_ros.model.plausibility import InputLimits
    two = InputLimits(Mechanism(load_spec_from_string("""
points: [{x: 0, y: 0, fixed: true}, {x: 1, y: 0}, {x: 2, y: 0}]
planar_bodies:
  - {points: [0, 1], length: auto, mass: 1, I0: 1, cog: [0.5, 0]}
  - {points: [1, 2], length: auto, mass: 1, I0: 1, cog: [0.5, 0]}
relative_coordinates:
  - {type: RelativeAngleAbsoluteDOF, points: [0, 1], name: a}
  - {type: RelativeAngleAbsoluteDOF, points: [1, 2], name: b}
actuators: [{coordinate: a, effort_limit: 10}, {coordinate: b, effort_limit: 5}]
""", "two.yaml")))
    one = {"a": 0}
    tau, problems = rc.parse_effort_joint_state(js(["b", "a"], effort=[2.0, 1.0]), {"a": 0, "b": 1}, two)
    assert tau.tolist() == [1.0, 2.0] and problems == []
    tau, problems = rc.parse_effort_joint_state(js(["a", "x"], effort=[1.0, 3.0]), {"a": 0, "b": 1}, two)
    assert tau[0] == 1.0 and math.isnan(tau[1]) and problems[0][0] == "unknown_joint"
    tau, problems = rc.parse_effort_joint_state(js(["a", "b"], effort=[1.0, 5.5]), {"a": 0, "b": 1}, two)
    assert tau[0] == 1.0 and math.isnan(tau[1]) and problems[0][0] == "implausible_effort"
    assert "'b'" in problems[0][1] and "effort_limit 5" in problems[0][1]
    for msg, kind in ((js(["a"], effort=[math.nan]), "non_finite"), (js(["a", "b"], effort=[1.0]), "bad_size"),
                      (js(["a"], effort=[]), "empty"), (js([]), "empty"), (js([], effort=[1.0]), "empty"),
                      (js(["x"], effort=[1.0]), "unknown_joint"), (js(["a"], effort=[-1e300]), "implausible_effort")):
        tau, problems = rc.parse_effort_joint_state(msg, one, two)
        assert tau is None and [p[0] for p in problems] == [kind], (msg, problems)
    tau, problems = rc.parse_effort_array([-10.0, 5.0], two)             # the limits themselves are plausible
    assert tau.tolist() == [-10.0, 5.0] and not problems
    assert rc.parse_effort_array([1.0], two)[1][0][0] == "bad_size"
    assert rc.parse_effort_array([], two)[1][0][0] == "empty"
    assert rc.parse_effort_array([1.0, math.inf], two)[1][0][0] == "non_finite"
    tau, problems = rc.parse_effort_array([1.0, 1e300], two)
    assert tau is None and problems[0][0] == "implausible_effort"


def test_every_problem_kind_is_a_diagnostics_kind(limits):
    """The node counts each problem under rejected.<kind>: every kind a parser reports is declared."""
    from mbfg_ros.model.plausibility import KINDS
    from mbfg_ros.ros.diagnostics import REJECT_KINDS
    assert set(KINDS) <= set(REJECT_KINDS) and "empty" in REJECT_KINDS


def test_float_array_and_stamps():
    a = rc.float_array(np.arange(3.0)[::-1])             # non-contiguous view
    assert a.typecode == "d" and a.tolist() == [2.0, 1.0, 0.0]
    assert rc.float_array([1, 2]).tolist() == [1.0, 2.0]
    assert rc.stamp_to_ns(rc.ns_to_stamp(T0 + 5)) == T0 + 5


# -- serialized JointState inputs ---------------------------------------------------------------
@pytest.mark.parametrize("seed", range(40))
def test_decode_joint_state_matches_rclpy(seed):
    """Random JointStates (names of every length mod 4, empty and partial arrays, negative stamps)
    serialized by rclpy decode to the same fields."""
    from rclpy.serialization import serialize_message
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 5))
    names = ["j" * int(rng.integers(1, 9)) + str(i) for i in range(n)]
    m = js(names, *[rng.standard_normal(n * int(rng.integers(0, 2))).tolist() for _ in range(3)])
    m.header.stamp.sec = int(rng.integers(-5, 2**31 - 1))
    m.header.stamp.nanosec = int(rng.integers(0, 10**9))
    m.header.frame_id = "f" * int(rng.integers(0, 7))
    r = rc.decode_joint_state(serialize_message(m))
    assert r.stamp_ns == m.header.stamp.sec * 10**9 + m.header.stamp.nanosec
    assert r.frame_id == m.header.frame_id and r.name == list(m.name)
    for f in ("position", "velocity", "effort"):
        assert list(getattr(r, f)) == list(getattr(m, f))


def test_decode_joint_state_big_endian_and_bad_buffers(limits):
    import struct
    be = (b"\x00\x00\x00\x00" + struct.pack(">iI", 3, 4) + struct.pack(">I", 1) + b"\x00\x00\x00\x00"
          + struct.pack(">I", 1) + struct.pack(">I", 2) + b"a\x00\x00\x00"
          + struct.pack(">I", 1) + struct.pack(">d", 1.5) + struct.pack(">I", 0) + struct.pack(">I", 0))
    r = rc.decode_joint_state(be)
    assert r.stamp_ns == 3 * 10**9 + 4 and r.name == ["a"] and r.position == (1.5,) and r.velocity == ()
    from rclpy.serialization import serialize_message
    good = serialize_message(js(["crank"], [0.5]))
    for bad in (b"", b"\x01\x01\x00\x00" + good[4:], good[:-9], good[:20], good[:4] + b"\xff" * (len(good) - 4)):
        with pytest.raises(ValueError):
            rc.decode_joint_state(bad)
    vals, _ = rc.parse_observations(rc.decode_joint_state(good), SENSORS, limits)
    assert vals == {"crank": 0.5}


def test_long_strings_are_refused_by_their_length_field():
    """A frame_id or joint name longer than MAX_INPUT_STRING raises LongString (the node counts
    `long_string`), read from the length field: the megabyte is never decoded; at the bound it decodes."""
    from rclpy.serialization import serialize_message
    limit = rc.MAX_INPUT_STRING
    m = js(["crank"], [0.5])
    m.header.frame_id = "w" * limit
    assert rc.decode_joint_state(serialize_message(m)).frame_id == "w" * limit
    m.header.frame_id = "w" * (limit + 1)
    with pytest.raises(rc.LongString, match="frame_id of 257 bytes"):
        rc.decode_joint_state(serialize_message(m))
    m.header.frame_id = "world"
    m.name = ["crank", "x" * (1 << 20)]
    m.position = [0.5, 0.0]
    with pytest.raises(rc.LongString, match="joint name of 1048576 bytes"):
        rc.decode_joint_state(serialize_message(m))
    m.name, m.position = [f"j{i}" for i in range(rc.MAX_INPUT_NAMES + 1)], []
    with pytest.raises(rc.LongString, match="1025 joint names"):
        rc.decode_joint_state(serialize_message(m))
    # a length field claiming more than the buffer holds is malformed, not long
    buf = bytearray(serialize_message(js(["crank"], [0.5])))
    buf[12:16] = (10).to_bytes(4, "little") if buf[1] == 1 else (10).to_bytes(4, "big")
    with pytest.raises(ValueError):
        rc.decode_joint_state(bytes(buf[:20]))


def test_outside_strings_are_cut_in_problem_texts(limits):
    """A megabyte joint name is reported in a bounded, one-line detail with a visible cut."""
    name = "evil\n" + "x" * (1 << 20)
    _, problems = rc.parse_observations(js([name], [0.0]), SENSORS, limits)
    assert problems[0][0] == "unknown_joint"
    assert len(problems[0][1]) < 400 and "\n" not in problems[0][1] and "…[+" in problems[0][1]
    _, problems = rc.parse_effort_joint_state(js([name]), {"crank": 0}, limits)
    assert problems[0][0] == "empty" and len(problems[0][1]) < 400


@pytest.mark.parametrize("seed", range(20))
def test_decode_float64_multi_array_matches_rclpy(seed):
    """Random Float64MultiArrays (layouts with labels of every length mod 4, empty data) serialized by rclpy
    decode to the same data."""
    from rclpy.serialization import serialize_message
    from std_msgs.msg import Float64MultiArray, MultiArrayDimension
    rng = np.random.default_rng(seed)
    m = Float64MultiArray(data=rng.standard_normal(int(rng.integers(0, 4))).tolist())
    m.layout.dim = [MultiArrayDimension(label="l" * int(rng.integers(0, 7)), size=int(rng.integers(0, 9)),
                                        stride=int(rng.integers(0, 9))) for _ in range(int(rng.integers(0, 3)))]
    m.layout.data_offset = int(rng.integers(0, 5))
    assert list(rc.decode_float64_multi_array(serialize_message(m))) == list(m.data)


def test_decode_float64_multi_array_bad_buffers():
    from rclpy.serialization import serialize_message
    from std_msgs.msg import Float64MultiArray, MultiArrayDimension
    good = serialize_message(Float64MultiArray(data=[1.0, 2.0]))
    for bad in (b"", b"\x00\x01\x00\x00" + b"\xff" * 12, good[:-1], good[:10], b"\x02\x01" + good[2:]):
        with pytest.raises(ValueError):
            rc.decode_float64_multi_array(bad)
    m = Float64MultiArray(data=[1.0])
    m.layout.dim = [MultiArrayDimension(label="d" * 1000)]
    with pytest.raises(rc.LongString):
        rc.decode_float64_multi_array(serialize_message(m))


# -- parameters ---------------------------------------------------------------------------------
def test_parameters_that_would_stop_estimation_are_refused():
    """max_input_age below max(10 ms, window × dt) (0: every input stale), sensor_timeout below dt, and
    string values beyond their bound are refused with a reason naming the parameter; the shipped values pass."""
    from mbfg_ros.estimation.config import EstimatorConfig
    from mbfg_ros.model.mechanism import load_mechanism
    from mbfg_ros.ros import parameters as P
    mech = load_mechanism("four_bar_crank")
    config = EstimatorConfig(dt=0.001, window=10).validated()
    for name, value, phrase in (("max_input_age", 0.0, "at least 0.01 s"), ("max_input_age", 0.005, "stale"),
                                ("sensor_timeout", 0.0, "at least dt"), ("frame_id", "f" * 257, "at most 256"),
                                ("mode", "m" * 10**6, "at most 256")):
        reason = P.validate_change({name: value}, mech, config)
        assert isinstance(reason, str) and f"'{name}'" in reason and phrase in reason, (name, reason)
        assert len(reason) < 400
    assert P.min_input_age(0.001, 100) == pytest.approx(0.1)
    for name, value in (("max_input_age", 1.0), ("max_input_age", 0.01), ("sensor_timeout", 0.1),
                        ("frame_id", "f" * 256), ("mode", "estimation")):
        assert not isinstance(P.validate_change({name: value}, mech, config), str), name


# -- serialized output templates ------------------------------------------------------------------
@pytest.mark.parametrize("mech_name", ["four_bar_crank", "pick_and_place_robot"])
def test_serialized_templates_equal_rclpy_serialization(mech_name):
    """The node's outputs patched into serialized templates decode to the same messages as rclpy's
    serialization of them (stamps, joint states, the full state, the markers).  (Not compared byte by
    byte: CDR padding bytes are not initialized by the serializer.)"""
    from rclpy.serialization import deserialize_message, serialize_message
    from trajectory_msgs.msg import JointTrajectory
    from visualization_msgs.msg import MarkerArray
    from mbfg_ros.model.mechanism import load_mechanism
    mech = load_mechanism(mech_name)
    n, names = mech.n, list(mech.coordinate_names)
    rng = np.random.default_rng(1)
    from sensor_msgs.msg import JointState
    types = {"js": JointState, "state": JointTrajectory, "markers": MarkerArray, "disturbance": JointState}
    na = len(mech.actuator_names)
    builders = {
        "disturbance": (lambda st, x: rc.joint_state(st, mech.actuator_names, (), (), x), na),
        "js": (lambda st, x: rc.joint_state(st, names[:2], x[:2], x[2:4], x[4:]), 6),
        "state": (lambda st, x: rc.trajectory_state(st, "world", names, x[:n], x[n:2 * n], x[2 * n:3 * n], x[3 * n:]),
                  4 * n),
        "markers": (lambda st, x: rc.mechanism_markers(mech, None, st, "map", xy=x.reshape(-1, 2)),
                    2 * len(mech.spec.points)),
    }
    for name, (build, size) in builders.items():
        tpl = rc.SerializedTemplate(build, size)
        for _ in range(3):
            x = rng.standard_normal(size)
            x[0] = 0.0 if name == "js" else x[0]
            stamp = int(rng.integers(1, (2**31 - 1) * 10**9))
            ref = serialize_message(build(rc.ns_to_stamp(stamp), x))
            out = tpl.fill(stamp, x)
            assert len(out) == len(ref) and deserialize_message(out, types[name]) == deserialize_message(ref, types[name])
    q = np.array(mech.q0, dtype=float)
    tpl = rc.SerializedTemplate(*builders["markers"])
    m = deserialize_message(tpl.fill(T0, mech.point_positions(q).ravel()), MarkerArray)
    ref = rc.mechanism_markers(mech, q, rc.ns_to_stamp(T0), "map")
    assert [[(p.x, p.y) for p in mk.points] for mk in m.markers] == [[(p.x, p.y) for p in mk.points] for mk in ref.markers]
    assert all(rc.stamp_to_ns(mk.header.stamp) == T0 for mk in m.markers)
    st = deserialize_message(rc.SerializedTemplate(*builders["state"]).fill(T0 + 1, np.arange(4.0 * n)), JointTrajectory)
    assert list(st.points[0].accelerations) == list(np.arange(2.0 * n, 3.0 * n)) and st.joint_names == names


@pytest.mark.parametrize("frame_id", ["", "map"])
def test_diagnostic_array_encoder_equals_rclpy_serialization(frame_id):
    """The node's hand-written DiagnosticArray serializer: byte-identical to rclpy's for mixed values
    (floats, ints, bools, strings of every length mod 4, unicode, empty), several statuses, any level."""
    from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue

    def key_values(d):      # the documented text of the values: floats as %.6g, the rest str()
        return [KeyValue(key=str(k), value=f"{v:.6g}" if isinstance(v, float) else str(v)) for k, v in d.items()]
    from rclpy.serialization import deserialize_message, serialize_message
    statuses = [(0, "/ns/mbfg_estimator: estimator", "running", "four_bar_crank",
                 {"state": "running", "dt": 0.001, "window": 10, "late_steps_percent": 33.3333333,
                  "flag": True, "": "", "a": "b", "ab": "cd", "abc": "def", "abcd": "efgh", "θ̇ rate": "1 rad/s"}),
                (2, "x", "", "", {}),
                (1, "yy", "no crank for 0.2 s; waiting", "hw", {"k": float("inf"), "n": float("nan")})]
    stamp = T0 + 123_456_789
    got = rc.encode_diagnostic_array(stamp, statuses, frame_id=frame_id)
    arr = DiagnosticArray()
    arr.header.stamp.sec, arr.header.stamp.nanosec = divmod(stamp, 1_000_000_000)
    arr.header.frame_id = frame_id
    arr.status = [DiagnosticStatus(level=bytes([lv]), name=n, message=m, hardware_id=h, values=key_values(kv))
                  for lv, n, m, h, kv in statuses]
    ref = bytes(serialize_message(arr))
    # the same bytes except for the alignment padding, which rclpy leaves uninitialized
    assert len(got) == len(ref) and got[:4] == ref[:4]
    back = deserialize_message(got, DiagnosticArray)
    assert back == arr
    assert sum(a != b for a, b in zip(got, ref)) <= 3 * (1 + sum(len(st[4]) * 2 + 3 for st in statuses))
    assert back.status[0].values[3].key == "late_steps_percent" and back.status[0].values[3].value == "33.3333"
    assert back.status[2].level == b"\x01" and back.status[0].values[-1].key == "θ̇ rate"
