"""The node's ROS-free pieces without DDS: the input scheduler (grid assignment, waiting, held commands,
late/too-old inputs, skip-ahead), the message parsers (bad content is reported, never raised), the
serialized input decoder and the serialized output templates (both against rclpy's own serialization)."""

import math

import numpy as np
import pytest

from sensor_msgs.msg import JointState

from mbfg_ros.ros import conversions as rc
from mbfg_ros.ros.node import InputScheduler

MS = 1_000_000
T0 = 1_000_000 * MS          # an arbitrary positive node-clock time


def scheduler(window=5, n_actuators=1):
    s = InputScheduler(dt=1e-3, window=window, n_actuators=n_actuators)
    s.sensor_timeout_ns = 100 * MS
    s.input_delay_ns = 3 * MS
    return s


EXPECTED = ("observations", "efforts")


def test_steps_wait_for_both_streams_then_pop_in_order():
    s = scheduler()
    assert s.add_observations(T0, {"crank": 0.1}, now_ns=T0) is None
    assert s.ready(T0, EXPECTED) is False                 # start-up: waits for the efforts too
    assert s.add_efforts(T0, np.array([2.0]), now_ns=T0) is None
    assert s.ready(T0, EXPECTED)
    k, eff, obs = s.pop()
    assert k == 0 and eff.tolist() == [2.0] and obs == {"crank": 0.1}
    # stamps are rounded to the grid anchored at the first input
    s.add_observations(T0 + MS + 200_000, {"crank": 0.2}, now_ns=T0 + 2 * MS)
    s.add_efforts(T0 + MS - 300_000, np.array([3.0]), now_ns=T0 + 2 * MS)
    k, eff, obs = s.pop()
    assert k == 1 and eff.tolist() == [3.0] and obs == {"crank": 0.2}


def test_missing_input_is_waited_for_at_most_the_input_delay():
    s = scheduler()
    for k in range(3):
        s.add_observations(T0 + k * MS, {"crank": 0.0}, now_ns=T0 + k * MS)
        s.add_efforts(T0 + k * MS, np.array([1.0]), now_ns=T0 + k * MS)
        s.pop()
    s.add_observations(T0 + 3 * MS, {"crank": 0.0}, now_ns=T0 + 3 * MS)   # the command for step 3 is late
    assert not s.ready(T0 + 3 * MS + 100_000, EXPECTED)
    assert s.ready(T0 + 6 * MS, EXPECTED)                                # t_3 + input delay
    k, eff, obs = s.pop()
    assert k == 3 and eff.tolist() == [1.0]                              # the command is held (zero-order hold)


@pytest.mark.parametrize("adaptive", [True, False])
def test_inputs_that_arrive_later_are_waited_for_longer(adaptive):
    """Inputs arriving 8 ms after their stamps (a loaded machine, a slow link; the estimator window is
    5 steps, so they would be too old for it): with the adaptive wait a step whose readings are missing
    is held 1.5 × 8 = 12 ms instead of
    the 3 ms max_input_delay, so the readings still make it; without it the step is predicted at 3 ms and
    the readings are dropped as too old.  Once the delays are over, the wait decays back (~1 s memory), and it
    never exceeds sensor_timeout."""
    s = scheduler()
    s.adaptive_input_delay = adaptive
    assert s.wait_ns(T0, list(s.streams.values())) == 3 * MS
    # delays the window absorbs (up to max_input_delay + (window − 2) steps = 6 ms) change nothing: the
    # step is predicted at 3 ms and a late reading is fused into the window
    s.add_observations(T0 - 100 * MS, {"crank": 0.0}, now_ns=T0 - 100 * MS + 5 * MS)
    assert s.wait_ns(T0 - 95 * MS, list(s.streams.values())) == 3 * MS
    s.clear()
    late = 8 * MS
    for k in range(20):
        s.add_observations(T0 + k * MS, {"crank": 0.0}, now_ns=T0 + k * MS + late)
        s.add_efforts(T0 + k * MS, np.array([1.0]), now_ns=T0 + k * MS + late)
        assert s.ready(T0 + k * MS + late, EXPECTED)
        s.pop()
    # step 20: the command comes on time, the readings are 8 ms late as before
    t20 = T0 + 20 * MS
    s.add_efforts(t20, np.array([1.0]), now_ns=t20 + 100_000)
    assert not s.ready(t20 + 3 * MS, EXPECTED) if adaptive else s.ready(t20 + 3 * MS, EXPECTED)
    if adaptive:
        assert 11.9 * MS < s.wait_ns(t20 + 3 * MS, list(s.streams.values())) <= 12 * MS
        assert s.add_observations(t20, {"crank": 0.0}, now_ns=t20 + late) is None
        k, _, obs = s.pop()
        assert k == 20 and obs == {"crank": 0.0}
    else:
        for _ in range(7):               # predicted one after the other; their readings come too late
            s.pop()
        assert s.add_observations(t20, {"crank": 0.0}, now_ns=t20 + late) == "too_old"
    # the delays end: the wait decays back to max_input_delay within a few seconds
    t = t20 + 3_000 * MS
    assert s.wait_ns(t, list(s.streams.values())) == 3 * MS
    # a huge delay is waited for at most sensor_timeout
    s.add_observations(t - 500 * MS, {"crank": 0.0}, now_ns=t)
    assert s.wait_ns(t, list(s.streams.values())) == (100 * MS if adaptive else 3 * MS)


def test_commands_are_held_until_the_sensor_timeout_and_unknown_after():
    s = scheduler(n_actuators=2)
    s.add_efforts(T0, np.array([1.0, math.nan]), now_ns=T0)
    s.add_observations(T0, {"crank": 0.0}, now_ns=T0)
    k, eff, _ = s.pop()
    assert eff[0] == 1.0 and math.isnan(eff[1])
    s.skip_to(50)
    _, eff, _ = s.pop()
    assert eff.tolist()[0] == 1.0                                        # 50 ms old: still valid
    s.skip_to(150)
    _, eff, _ = s.pop()
    assert eff is None                                                   # older than sensor_timeout: unknown


def test_a_command_stream_that_misses_a_step_gives_unknown_without_hold():
    s = scheduler()
    for k in range(5):                                                   # a 1 kHz command stream...
        s.add_efforts(T0 + k * MS, np.array([float(k)]), now_ns=T0 + k * MS)
        s.add_observations(T0 + k * MS, {"crank": 0.0}, now_ns=T0 + k * MS)
        s.pop(hold_missing=False)
    s.add_observations(T0 + 5 * MS, {"crank": 0.0}, now_ns=T0 + 5 * MS)  # ...misses step 5
    k, eff, _ = s.pop(hold_missing=False)
    assert k == 5 and eff is None                                        # estimated, not the stale value
    s.add_observations(T0 + 6 * MS, {"crank": 0.0}, now_ns=T0 + 6 * MS)
    k, eff, _ = s.pop(hold_missing=True)
    assert k == 6 and eff.tolist() == [4.0]                              # forward dynamics holds it


def test_late_too_old_and_inadmissible_inputs_are_named():
    s = scheduler(window=5)
    for k in range(20):
        s.add_observations(T0 + k * MS, {"crank": 0.0}, now_ns=T0 + k * MS)
        s.pop()
    now = T0 + 20 * MS
    assert s.add_observations(T0 + 18 * MS, {"crank": 0.0}, now) == "late"
    assert s.add_observations(T0 + 2 * MS, {"crank": 0.0}, now) == "too_old"
    assert s.add_observations(0, {"crank": 0.0}, now) == "bad_stamp"
    assert s.add_observations(now + 10**9, {"crank": 0.0}, now) == "future"
    assert s.add_observations(now - 2 * 10**9, {"crank": 0.0}, now) == "stale"
    # a late command that is newer than the held one still applies from now on
    assert s.add_efforts(T0 + 19 * MS, np.array([7.0]), now) is None
    _, eff, _ = s.pop()
    assert eff.tolist() == [7.0]


def test_skip_to_drops_observations_and_applies_commands():
    s = scheduler()
    s.add_observations(T0, {"crank": 0.0}, now_ns=T0)
    for k in range(1, 10):
        s.add_observations(T0 + k * MS, {"crank": float(k)}, now_ns=T0 + k * MS)
        s.add_efforts(T0 + k * MS, np.array([float(k)]), now_ns=T0 + k * MS)
    assert s.backlog_ns(T0 + 10 * MS) == 10 * MS
    assert s.skip_to(8) == 8
    k, eff, obs = s.pop()
    assert k == 8 and obs == {"crank": 8.0} and eff.tolist() == [8.0]
    assert s.obs.keys() == {9}


# -- parsers ------------------------------------------------------------------------------------
SENSORS = {"crank": ("position", "crank"), "coupler_gyro": ("velocity", "coupler_gyro")}


def js(names, position=(), velocity=(), effort=()):
    m = JointState()
    m.name, m.position, m.velocity, m.effort = list(names), list(position), list(velocity), list(effort)
    return m


def test_parse_observations_reads_the_field_each_sensor_needs():
    vals, problems = rc.parse_observations(js(["crank", "coupler_gyro"], [0.5, math.nan], [math.nan, 2.0]), SENSORS)
    assert vals == {"crank": 0.5, "coupler_gyro": 2.0} and problems == []


@pytest.mark.parametrize("msg,kind", [
    (js(["crank", "elbow"], [0.1, 0.2]), "unknown_joint"),
    (js(["crank"], [math.inf]), "non_finite"),
    (js(["crank", "coupler_gyro"], [0.1, 0.2], [1.0]), "bad_size"),
    (js(["crank", "crank"], [0.1, 0.2]), "bad_size"),
])
def test_parse_observations_reports_bad_content(msg, kind):
    vals, problems = rc.parse_observations(msg, SENSORS)
    assert kind in [p[0] for p in problems]
    assert all(math.isfinite(v) for v in vals.values())


def test_parse_efforts():
    tau, problems = rc.parse_effort_joint_state(js(["b", "a"], effort=[2.0, 1.0]), {"a": 0, "b": 1}, 2)
    assert tau.tolist() == [1.0, 2.0] and problems == []
    tau, problems = rc.parse_effort_joint_state(js(["a", "x"], effort=[1.0, 3.0]), {"a": 0, "b": 1}, 2)
    assert tau[0] == 1.0 and math.isnan(tau[1]) and problems[0][0] == "unknown_joint"
    for msg, kind in ((js(["a"], effort=[math.nan]), "non_finite"), (js(["a"], effort=[]), "bad_size"),
                      (js(["x"], effort=[1.0]), "unknown_joint")):
        tau, problems = rc.parse_effort_joint_state(msg, {"a": 0}, 1)
        assert tau is None and problems[0][0] == kind
    tau, problems = rc.parse_effort_array([1.0, 2.0], 2)
    assert tau.tolist() == [1.0, 2.0] and not problems
    assert rc.parse_effort_array([1.0], 2)[1][0][0] == "bad_size"
    assert rc.parse_effort_array([1.0, math.inf], 2)[1][0][0] == "non_finite"


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


def test_decode_joint_state_big_endian_and_bad_buffers():
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
    vals, _ = rc.parse_observations(rc.decode_joint_state(good), SENSORS)
    assert vals == {"crank": 0.5}


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
    types = {"js": JointState, "state": JointTrajectory, "markers": MarkerArray}
    builders = {
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


def test_start_up_waits_for_every_input_the_mode_uses():
    """Commands arrive but the readings' topic is still being discovered: no step is estimated from a
    guess until the readings come (or startup_wait passes); then steps start at once."""
    s = scheduler()
    s.startup_wait_ns = 1000 * MS
    for k in range(50):
        s.add_efforts(T0 + k * MS, np.array([1.0]), now_ns=T0 + k * MS)
        assert not s.ready(T0 + k * MS + 4 * MS, EXPECTED)        # beyond max_input_delay, still waiting
    assert s.start_step(T0 + 50 * MS, EXPECTED) is None             # not every input heard from yet
    s.add_observations(T0 + 50 * MS, {"crank": 0.1}, now_ns=T0 + 50 * MS)
    s.add_efforts(T0 + 50 * MS, np.array([2.0]), now_ns=T0 + 50 * MS)
    assert s.ready(T0 + 50 * MS, EXPECTED)
    # the node starts at the first step with every input (the 50 older ones hold commands only)
    assert s.start_step(T0 + 50 * MS, EXPECTED) == 50
    assert s.skip_to(50) == 50
    k, eff, obs = s.pop()
    assert k == 50 and obs == {"crank": 0.1} and eff.tolist() == [2.0]
    assert s.start_step(T0 + 51 * MS, EXPECTED) is None             # started: no more start-up skipping
    # inputs that come together from the start: nothing to skip
    s = scheduler()
    s.add_observations(T0, {"crank": 0.1}, now_ns=T0)
    s.add_efforts(T0, np.array([2.0]), now_ns=T0)
    assert s.start_step(T0, EXPECTED) == 0
    # a sensor that never comes: estimation starts after startup_wait without it
    s = scheduler()
    s.startup_wait_ns = 200 * MS
    s.add_efforts(T0, np.array([1.0]), now_ns=T0)
    assert not s.ready(T0 + 199 * MS, EXPECTED) and s.ready(T0 + 200 * MS, EXPECTED)
    # after the first step, a missing input is waited for only max_input_delay
    s.pop()
    assert s.ready(T0 + 201 * MS, EXPECTED)


@pytest.mark.parametrize("frame_id", ["", "map"])
def test_diagnostic_array_encoder_equals_rclpy_serialization(frame_id):
    """The node's hand-written DiagnosticArray serializer: byte-identical to rclpy's for mixed values
    (floats, ints, bools, strings of every length mod 4, unicode, empty), several statuses, any level."""
    from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
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
    arr.status = [DiagnosticStatus(level=bytes([lv]), name=n, message=m, hardware_id=h, values=rc.key_values(kv))
                  for lv, n, m, h, kv in statuses]
    ref = bytes(serialize_message(arr))
    # the same bytes except for the alignment padding, which rclpy leaves uninitialized
    assert len(got) == len(ref) and got[:4] == ref[:4]
    back = deserialize_message(got, DiagnosticArray)
    assert back == arr
    assert sum(a != b for a, b in zip(got, ref)) <= 3 * (1 + sum(len(st[4]) * 2 + 3 for st in statuses))
    assert back.status[0].values[3].key == "late_steps_percent" and back.status[0].values[3].value == "33.3333"
    assert back.status[2].level == b"\x01" and back.status[0].values[-1].key == "θ̇ rate"
