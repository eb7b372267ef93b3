"""The plausibility limits of the inputs (mbfg_ros.model.plausibility) without ROS: each kind at its
boundary, the default effort_limit formula, the YAML keys and their errors, and the CSV readers of the
command line that apply the same limits."""

import math

import numpy as np
import pytest

from mbfg_ros.model.loader import load_spec_from_string
from mbfg_ros.model.mechanism import Mechanism, load_mechanism
from mbfg_ros.model.plausibility import (DEFAULT_MAX_RATE, ESTIMATE_SPAN_TURNS, POSITION_SPAN_REACHES,
                                         START_SPAN_TURNS, InputLimits, default_effort_limit, mechanism_reach)
from mbfg_ros.model.spec import MechanismError

# a pendulum on a slider: the angle `swing` (actuated, encoder) and the slider point's x (actuated, encoder),
# a gyroscope on the bar with its own max_rate
SLIDER_PENDULUM = """
points:
  - {x: 0, y: 0}
  - {x: 0, y: -2}
planar_bodies:
  - {points: [0, 1], length: auto, mass: 3, I0: 4, cog: [1, 0]}
relative_coordinates:
  - {type: RelativeAngleAbsoluteDOF, points: [0, 1], name: swing}
sliders:
  - {type: fixed, point: 0, line: [[-1, 0], [1, 0]]}
actuators:
  - {coordinate: swing%s}
  - {coordinate: x0, joint: cart}
sensors:
  - {type: encoder, coordinate: swing, sigma: 0.001}
  - {type: encoder, coordinate: x0, sigma: 0.001, name: cart_position}
  - {type: gyroscope, body: 0, sigma: 0.01, name: bar_gyro%s}
"""


def slider_pendulum(actuator_extra="", gyro_extra=""):
    return Mechanism(load_spec_from_string(SLIDER_PENDULUM % (actuator_extra, gyro_extra), "slider_pendulum.yaml"))


def test_default_effort_limit_is_the_documented_formula():
    """10·M·g·R + M·R²·100 rad/s² on an angle, 10·M·g + M·R·100 on a length (M total mass, R reach)."""
    mech = slider_pendulum()
    spec = mech.spec
    M, R, g = 3.0, 2.0, 9.81
    assert mechanism_reach(spec) == pytest.approx(R)
    assert default_effort_limit(spec, angle=True) == pytest.approx(10 * M * g * R + M * R ** 2 * 100)
    assert default_effort_limit(spec, angle=False) == pytest.approx(10 * M * g + M * R * 100)
    limits = InputLimits(mech)
    assert limits.effort_limits.tolist() == pytest.approx([10 * M * g * R + M * R ** 2 * 100, 10 * M * g + M * R * 100])
    assert limits.effort_units == ("N·m", "N")
    # the shipped mechanisms: far above what their simulated controllers command (peaks 117 N·m, 290 N·m)
    assert InputLimits(load_mechanism("four_bar_crank")).effort_limits[0] == pytest.approx(13946.8)
    assert InputLimits(load_mechanism("pick_and_place_robot")).effort_limits == pytest.approx([82278.8] * 2, rel=1e-5)
    # without gravity the inertia term still bounds the efforts
    weightless = Mechanism(load_spec_from_string(SLIDER_PENDULUM.replace("points:\n  - {x: 0, y: 0}",
                                                                        "gravity: [0, 0]\npoints:\n  - {x: 0, y: 0}", 1)
                                                 % ("", ""), "weightless.yaml"))
    assert InputLimits(weightless).effort_limits[0] == pytest.approx(M * R ** 2 * 100)


def test_effort_limits_at_their_boundary():
    limits = InputLimits(slider_pendulum(", effort_limit: 50"))
    assert limits.effort_limits[0] == 50.0
    for value in (50.0, -50.0, 0.0, 49.999):
        assert limits.effort_problem(0, value) is None
    for value in (50.0001, -50.0001, 1e300, -1e300):
        kind, detail = limits.effort_problem(0, value)
        assert kind == "implausible_effort" and "'swing'" in detail and "effort_limit 50 N·m" in detail
    assert limits.effort_problem(0, math.nan)[0] == "non_finite"
    assert limits.effort_problem(1, math.inf)[0] == "non_finite"
    big = limits.effort_limits[1]
    assert limits.effort_problem(1, big) is None
    kind, detail = limits.effort_problem(1, big * 1.0001)
    assert kind == "implausible_effort" and "'cart'" in detail and detail.endswith(" N")
    assert limits.efforts_problem([1.0, 2.0]) is None
    assert limits.efforts_problem([1.0, -1e300])[0] == "implausible_effort"


def test_encoder_readings_near_the_drawn_pose_before_and_near_the_estimate_after_the_start():
    mech = slider_pendulum()
    limits = InputLimits(mech)
    swing = mech.coordinate_index("swing")
    swing0 = -math.pi / 2                                   # the drawn angle of P0 -> P1
    assert mech.q0[swing] == pytest.approx(swing0)
    # before the first estimate: within START_SPAN_TURNS turns of the drawn pose (a multi-turn count)
    start = 2 * math.pi * START_SPAN_TURNS
    assert limits.reading_problem("swing", swing0 + start) is None
    assert limits.reading_problem("swing", swing0 - start) is None
    kind, detail = limits.reading_problem("swing", swing0 + start * 1.0001)
    assert kind == "implausible_position" and "'swing'" in detail and "no estimate yet" in detail
    assert limits.reading_problem("swing", 1e300)[0] == "implausible_position"
    # with an estimate: within ESTIMATE_SPAN_TURNS turns of it, or within a turn of zero (a single-turn encoder)
    span = 2 * math.pi * ESTIMATE_SPAN_TURNS
    q = np.array(mech.q0)
    q[swing] = 2 * math.pi * 1000                           # a multi-turn encoder followed to 1000 turns
    assert limits.reading_problem("swing", q[swing] + span, q) is None
    assert limits.reading_problem("swing", q[swing] - span, q) is None
    kind, detail = limits.reading_problem("swing", q[swing] + span * 1.0001, q)
    assert kind == "implausible_position" and "from the estimate (6283 rad)" in detail
    for near_zero in (0.3, -math.pi, 2 * math.pi):
        assert limits.reading_problem("swing", near_zero, q) is None
    assert limits.reading_problem("swing", 2 * math.pi * 1.0001, np.array(mech.q0)) is None   # near the estimate
    q[swing] = 0.1
    assert limits.reading_problem("swing", 2 * math.pi * 500, q)[0] == "implausible_position"  # a jump of 500 turns
    assert limits.reading_problem("swing", 1e300, q)[0] == "implausible_position"
    # a length: POSITION_SPAN_REACHES reaches of the mechanism (2 m) from the drawn pose or the estimate
    span_m = POSITION_SPAN_REACHES * 2.0
    assert limits.reading_problem("cart_position", span_m) is None
    kind, detail = limits.reading_problem("cart_position", -span_m * 1.0001)
    assert kind == "implausible_position" and detail.split("reads ")[1].split(" ")[1] == "m,"
    q[mech.coordinate_index("x0")] = span_m
    assert limits.reading_problem("cart_position", span_m * 1.5, q) is None
    assert limits.reading_problem("swing", -math.inf)[0] == "non_finite"
    # the same rule for a coordinate by index (prescribed trajectories)
    assert limits.coordinate_problem(swing, swing0 + start) is None
    assert limits.coordinate_problem(swing, 1e300)[0] == "implausible_position"
    assert limits.coordinate_problem(mech.coordinate_index("y1"), 1e3)[0] == "implausible_position"
    assert limits.coordinate_problem(0, math.nan)[0] == "non_finite"


def test_gyroscope_readings_within_max_rate():
    limits = InputLimits(slider_pendulum())
    assert limits.max_rates == {"bar_gyro": DEFAULT_MAX_RATE}
    assert limits.reading_problem("bar_gyro", -DEFAULT_MAX_RATE) is None
    kind, detail = limits.reading_problem("bar_gyro", DEFAULT_MAX_RATE * 1.0001)
    assert kind == "implausible_rate" and "'bar_gyro'" in detail and "max_rate 628.3 rad/s" in detail
    own = InputLimits(slider_pendulum(gyro_extra=", max_rate: 20"))
    assert own.reading_problem("bar_gyro", 20.0) is None and own.reading_problem("bar_gyro", -20.5)[0] == "implausible_rate"
    assert own.reading_problem("bar_gyro", math.nan)[0] == "non_finite"


@pytest.mark.parametrize("extra,where,message", [
    (", effort_limit: 0", "actuators[0].effort_limit", "must be > 0 (got 0)"),
    (", effort_limit: -3", "actuators[0].effort_limit", "must be > 0 (got -3)"),
    (", effort_limit: .inf", "actuators[0].effort_limit", "non-finite"),
    (", effort_limit: [1]", "actuators[0].effort_limit", "expected a number or an expression"),
    (", effort_limit: lots", "actuators[0].effort_limit", "undefined name 'lots'"),
    (", torque_limit: 3", "actuators[0].torque_limit", "unknown key 'torque_limit' (allowed keys: coordinate, joint, "
                                                        "effort_limit, "),
])
def test_effort_limit_yaml_errors_name_file_and_actuator(extra, where, message):
    with pytest.raises(MechanismError) as e:
        slider_pendulum(extra)
    text = str(e.value)
    assert text.startswith(f"slider_pendulum.yaml: {where}: ") and message in text, text


def test_max_rate_yaml_errors_and_expressions():
    with pytest.raises(MechanismError, match=r"slider_pendulum.yaml: sensors\[2\].max_rate: must be > 0"):
        slider_pendulum(gyro_extra=", max_rate: 0")
    with pytest.raises(MechanismError, match=r"sensors\[0\].max_rate: unknown key 'max_rate'"):
        Mechanism(load_spec_from_string(SLIDER_PENDULUM.replace("sigma: 0.001}", "sigma: 0.001, max_rate: 1}", 1)
                                        % ("", ""), "slider_pendulum.yaml"))
    mech = slider_pendulum(", effort_limit: 2*pi*10", ", max_rate: 3000/60*2*pi")
    assert mech.spec.actuators[0].effort_limit == pytest.approx(20 * math.pi)
    assert mech.spec.gyroscopes[0].max_rate == pytest.approx(100 * math.pi)
    assert mech.describe()["effort_limits"][0] == pytest.approx(20 * math.pi)


# -- the command line's CSV readers --------------------------------------------------------------
def _run(argv, capsys):
    from mbfg_ros.cli.commands import main
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, err


@pytest.mark.parametrize("column,value,kind,detail", [
    ("crank", "1e300", "implausible position", "encoder 'crank' reads 1e+300 rad"),
    ("coupler_gyro", "-700", "implausible rate", "gyroscope 'coupler_gyro' reads -700 rad/s, beyond its max_rate"),
])
def test_estimate_refuses_implausible_readings_naming_row_and_column(tmp_path, capsys, column, value, kind, detail):
    obs = tmp_path / "obs.csv"
    rows = ["t,crank,coupler_gyro"] + [f"{k * 0.01:g},0.0,0.0" for k in range(5)]
    cells = rows[4].split(",")
    cells[1 if column == "crank" else 2] = value
    rows[4] = ",".join(cells)
    obs.write_text("\n".join(rows) + "\n")
    code, err = _run(["estimate", "four_bar_crank", "--observations", obs, "-o", tmp_path / "out.csv"], capsys)
    assert code == 2
    assert err.startswith(f"mbfg: error: {obs}: row 5, column '{column}': {kind}: {detail}"), err


def test_efforts_and_trajectories_are_checked_too(tmp_path, capsys):
    torques = tmp_path / "torques.csv"
    torques.write_text("t,tau_crank\n0,1.0\n0.01,2e4\n")
    code, err = _run(["simulate", "four_bar_crank", "--duration", "0.02", "--dt", "0.01", "--torques", torques,
                      "-o", tmp_path / "sim.csv"], capsys)
    assert code == 2
    assert err.startswith(f"mbfg: error: {torques}: row 3, column 'tau_crank': implausible effort: effort 2e+04 N·m "
                          f"for actuator 'crank' beyond its effort_limit 1.395e+04 N·m"), err
    traj = tmp_path / "traj.csv"
    traj.write_text("t,crank\n0,0\n0.01,0.001\n0.02,-1e7\n")
    code, err = _run(["inverse-dynamics", "four_bar_crank", "--trajectory", traj, "-o", tmp_path / "id.csv"], capsys)
    assert code == 2
    assert err.startswith(f"mbfg: error: {traj}: row 4, column 'crank': implausible position: coordinate 'crank' is "
                          f"-1e+07 rad"), err


def test_a_single_turn_encoder_reads_within_one_turn_of_zero(crank):
    """An encoder declared `turns: single` reads within one turn of zero, whatever the estimate and before it."""
    text = open(crank.spec.source).read().replace("coordinate: crank, sigma: 0.001}",
                                                  "coordinate: crank, sigma: 0.001, turns: single}")
    limits = InputLimits(Mechanism(load_spec_from_string(text)))
    q = np.array(crank.q0)
    q[4] = 2 * math.pi * 6 + 1.0                     # the estimate counts turns itself
    for value in (0.3, -math.pi, 2 * math.pi):
        assert limits.reading_problem("crank", value) is None and limits.reading_problem("crank", value, q) is None
    for estimate in (None, q):
        kind, detail = limits.reading_problem("crank", q[4], estimate)
        assert kind == "implausible_position" and "single-turn encoder" in detail
