"""Joint angles (`joint_angles:`) and geared motors (`gear_ratio`, `rotor_inertia`) in the mechanism format: the
loader's results and errors, the constraint row, equal and opposite torques of a motor between two bodies, the
rotor's kinetic energy, the position problem and the angles' turns with joint angles held or unwrapped."""

import math

import numpy as np
import pytest

from mbfg_ros.dynamics import constrained
from mbfg_ros.dynamics.coordinates import unwrap_angles
from mbfg_ros.dynamics.kinematics import solve_positions, solve_velocities
from mbfg_ros.model.loader import load_spec_from_string
from mbfg_ros.model.mechanism import Mechanism
from mbfg_ros.model.spec import MechanismError

# a double pendulum drawn at an angle (so no drawn angle is a multiple of π/2), and a file's sections to add
DOUBLE = """
name: double
gravity: [0, {g}]
points:
  - {{x: 0, y: 0{ground}}}
  - {{x: 0.3, y: -0.2}}
  - {{x: 0.5, y: -0.1}}
  - {{x: 0.45, y: -0.3}}
planar_bodies:
  - {{points: [0, 1], length: auto, mass: 0.5, I0: 0.04, cog: [0.2, 0.01], name: link1}}
  - {{points: [1, 2, 3], mass: 0.7, I0: 0.03, cog: [0.1, -0.02], name: link2}}
"""


def mechanism(extra: str, g: float = -9.81, ground: bool = True) -> Mechanism:
    text = DOUBLE.format(g=g, ground=", fixed: true" if ground else "") + extra
    return Mechanism(load_spec_from_string(text, source="m.yaml"))


def load_error(extra: str) -> str:
    with pytest.raises(MechanismError) as e:
        mechanism(extra)
    return str(e.value)


JOINTS = """
joint_angles:
  - {name: shoulder, bodies: [ground, link1], value: pi/2}
  - {name: elbow, bodies: [link1, 1]}
"""


def angle_of(mech, q, i, j):
    xy = mech.point_positions(q)
    d = xy[j] - xy[i]
    return math.atan2(d[1], d[0])


# -- loader ------------------------------------------------------------------------------------------------------
def test_joint_angles_are_coordinates_after_the_body_angles_the_loader_adds():
    mech = mechanism(JOINTS)
    assert mech.coordinate_names[-4:] == ("theta_link1", "theta_link2", "shoulder", "elbow")
    assert mech.spec.angle_names == ("theta_link1", "theta_link2", "shoulder", "elbow")
    assert [r.points for r in mech.spec.relative_angles] == [(0, 1), (1, 2)]     # each body's points[0] → points[1]
    q0 = mech.q0
    assert q0[mech.coordinate_index("shoulder")] == pytest.approx(math.pi / 2, abs=1e-15)    # the drawn `value`
    assert q0[mech.coordinate_index("elbow")] == pytest.approx(0.0, abs=1e-15)
    assert np.abs(mech.constraints.phi(np.array(q0))).max() < 1e-15
    assert mech.degrees_of_freedom() == 2
    assert set(mech.relative_angle_columns.tolist()) == set(range(mech.n_point_coordinates, mech.n))


def test_a_body_angle_given_on_other_points_is_used_with_its_drawn_offset():
    mech = mechanism("""
relative_coordinates:
  - {type: RelativeAngleAbsoluteDOF, points: [3, 2], name: tilt}
joint_angles:
  - {name: elbow, bodies: [link1, link2], value: 0.25}
""")
    assert mech.coordinate_names[-3:] == ("tilt", "theta_link1", "elbow")
    j = mech.spec.joint_angles[0]
    assert (j.parent_angle, j.child_angle) == ("theta_link1", "tilt")
    q = solve_positions(mech, mech.q0).q
    # the joint angle is the angle between the bodies' frames (points[0] → points[1]) plus its drawn value, whatever
    # points the coordinate it is written with is on
    rng = np.random.default_rng(0)
    for _ in range(5):
        guess = np.array(q)
        guess[:mech.n_point_coordinates] += 0.1 * rng.standard_normal(mech.n_point_coordinates)
        sol = solve_positions(mech, guess).q
        frames = angle_of(mech, sol, 1, 2) - angle_of(mech, sol, 0, 1)
        drawn = angle_of(mech, mech.q0, 1, 2) - angle_of(mech, mech.q0, 0, 1)
        assert math.remainder(sol[mech.coordinate_index("elbow")] - (frames - drawn + 0.25), 2 * math.pi) \
            == pytest.approx(0.0, abs=1e-9)


def test_joint_angle_defaults_and_body_indices():
    mech = mechanism("""
joint_angles:
  - {bodies: [0, 1]}
  - {bodies: [ground, 0], value: 2*deg2rad(10)}
""")
    assert mech.coordinate_names[-2:] == ("joint0", "joint1")
    assert mech.q0[-1] == pytest.approx(math.radians(20))


@pytest.mark.parametrize("extra,where,message", [
    ("joint_angles:\n  - {bodies: [link1, lnk2]}", "joint_angles[0].bodies[1]",
     "unknown body 'lnk2' (known: link1, link2)"),
    ("joint_angles:\n  - {bodies: [ground, 5]}", "joint_angles[0].bodies[1]", "body index 5 out of range"),
    ("joint_angles:\n  - {bodies: [link1, ground]}", "joint_angles[0].bodies[1]",
     "the child of a joint angle is a body, not the ground"),
    ("joint_angles:\n  - {bodies: [link2, link2]}", "joint_angles[0].bodies",
     "parent and child are the same body (link2)"),
    ("joint_angles:\n  - {bodies: [link1]}", "joint_angles[0].bodies", "expected exactly 2 bodies"),
    ("joint_angles:\n  - {bodies: [link1, link2], angle: 1}", "joint_angles[0].angle", "unknown key 'angle'"),
    ("joint_angles:\n  - {name: e}", "joint_angles[0]", "missing required key 'bodies'"),
    ("joint_angles:\n  - {bodies: [link1, link2], value: nope}", "joint_angles[0].value", "undefined name 'nope'"),
    ("joint_angles:\n  - {bodies: [link1, link2], name: x2}", "joint_angles[0].name",
     "looks like a point coordinate name"),
    ("joint_angles:\n  - {bodies: [link1, link2], name: e}\n  - {bodies: [ground, link1], name: e}",
     "joint_angles[1].name", "duplicate coordinate name 'e'"),
    ("relative_coordinates:\n  - {type: RelativeAngleAbsoluteDOF, points: [1, 2], name: e}\n"
     "joint_angles:\n  - {bodies: [ground, link2], name: e}", "joint_angles[0].name",
     "duplicate coordinate name 'e' (already used by relative_coordinates)"),
    ("joint_angles:\n  - {bodies: [ground, link1], name: theta_link2}\n  - {bodies: [link1, link2]}",
     "joint_angles[1]", "default name 'theta_link2' is taken"),
    ("joint_angles: {bodies: [link1, link2]}", "joint_angles", "expected a list of joint angles"),
])
def test_joint_angle_errors_name_the_key(extra, where, message):
    text = load_error(extra)
    assert text.startswith(f"m.yaml: {where}: ") and message in text, text


def test_ground_is_ambiguous_when_a_body_is_named_so():
    text = DOUBLE.format(g=-9.81, ground=", fixed: true").replace("name: link1", "name: ground")
    with pytest.raises(MechanismError, match=r"joint_angles\[0\]\.bodies\[0\]: 'ground' is ambiguous"):
        load_spec_from_string(text + "joint_angles:\n  - {bodies: [ground, link2]}", source="m.yaml")


@pytest.mark.parametrize("actuator,where,message", [
    ("{coordinate: x1, gear_ratio: 3}", "actuators[0].gear_ratio", "coordinate 'x1' is a point coordinate"),
    ("{coordinate: y2, rotor_inertia: 1e-4}", "actuators[0].rotor_inertia", "only expressible for an angle"),
    ("{coordinate: elbow, gear_ratio: 0}", "actuators[0].gear_ratio", "must be a non-zero number"),
    ("{coordinate: elbow, gear_ratio: [6]}", "actuators[0].gear_ratio", "expected a number or an expression"),
    ("{coordinate: elbow, rotor_inertia: -1e-5}", "actuators[0].rotor_inertia", "must be >= 0"),
    ("{coordinate: elbow, rotor_inertia: .inf}", "actuators[0].rotor_inertia", "non-finite"),
    ("{coordinate: elbow, gear: 6}", "actuators[0].gear", "unknown key 'gear'"),
])
def test_motor_errors_name_the_key(actuator, where, message):
    text = load_error(JOINTS + f"actuators:\n  - {actuator}\n")
    assert text.startswith(f"m.yaml: {where}: ") and message in text, text


def test_joint_angle_actuators_and_encoders_are_angles():
    mech = mechanism(JOINTS + """
actuators:
  - {coordinate: elbow}
sensors:
  - {type: encoder, coordinate: elbow, counts_per_turn: 4096, turns: single}
""")
    info = mech.describe()
    assert info["effort_units"] == ["N·m"] and info["actuated"] == ["elbow"]
    assert mech.sensors[0].single_turn and mech.sensors[0].sigma == pytest.approx(2 * math.pi / 4096 / math.sqrt(12))
    # the effort limit's default and the time/effort scale treat it as a torque
    from mbfg_ros.model.plausibility import STANDARD_GRAVITY, default_effort_limit, mechanism_reach, mechanism_scale
    assert info["effort_limits"] == [pytest.approx(default_effort_limit(mech.spec, angle=True))]
    assert mechanism_scale(mech.spec)[0] == pytest.approx(mech.total_mass * STANDARD_GRAVITY
                                                          * mechanism_reach(mech.spec))   # M·g·R, not a force


# -- the constraint row and the dynamics -------------------------------------------------------------------------
def test_joint_angle_row_is_linear_and_native():
    mech = mechanism(JOINTS)
    rows = [i for i, nm in enumerate(mech.constraints.names) if "joint_angle" in nm]
    assert len(rows) == 2
    rng = np.random.default_rng(1)
    q = np.array(mech.q0) + rng.standard_normal(mech.n)
    J = mech.constraints.jacobian(q)
    shoulder, elbow = mech.coordinate_index("shoulder"), mech.coordinate_index("elbow")
    t1, t2 = mech.coordinate_index("theta_link1"), mech.coordinate_index("theta_link2")
    expected = np.zeros((2, mech.n))
    expected[0, [shoulder, t1]] = 1.0, -1.0
    expected[1, [elbow, t2, t1]] = 1.0, -1.0, 1.0
    np.testing.assert_array_equal(J[rows], expected)
    assert not mech.constraints.hessian_vector(q, rng.standard_normal(mech.n))[rows].any()
    assert mech.constraints.native_form() is not None


def angular_momentum(mech: Mechanism, q, v) -> float:
    """About the origin, of every body: m·r_G × v_G + I_G·ω."""
    xy, vv = mech.point_positions(q), mech.point_velocities(v)
    total = 0.0
    for b, body in enumerate(mech.spec.bodies):
        i, j = body.points[0], body.points[1]
        C = Mechanism._body_shape(body.length, *body.cog)
        r = xy[i] + C @ (xy[j] - xy[i])
        rd = vv[i] + C @ (vv[j] - vv[i])
        inertia = body.I0 - body.mass * (body.cog[0] ** 2 + body.cog[1] ** 2)
        total += body.mass * (r[0] * rd[1] - r[1] * rd[0]) + inertia * mech.body_angular_rate(b, q, v)
    return total


def momentum_rate(mech, q, v, a, h=1e-6) -> float:
    return (angular_momentum(mech, q + h * v, v + h * a) - angular_momentum(mech, q - h * v, v - h * a)) / (2 * h)


@pytest.mark.parametrize("rotor", [0.0, 2e-3])
def test_a_motor_between_two_bodies_applies_equal_and_opposite_torques(rotor):
    # free-floating in zero gravity: a torque between the links cannot change the angular momentum of the links
    # (nor can a rotor on link 1 driving the joint, once its own spin is counted); the same torque on a body's
    # absolute angle (a motor on the ground) changes it at the torque's rate
    mech = mechanism(f"""
joint_angles:
  - {{name: elbow, bodies: [link1, link2]}}
actuators:
  - {{coordinate: elbow, gear_ratio: 5, rotor_inertia: {rotor}}}
""", g=0.0, ground=False)
    ground_motor = mechanism("""
relative_coordinates:
  - {type: RelativeAngleAbsoluteDOF, points: [1, 2], name: tilt}
actuators:
  - {coordinate: tilt}
""", g=0.0, ground=False)
    rng = np.random.default_rng(2)
    t1, elbow = mech.coordinate_index("theta_link1"), mech.coordinate_index("elbow")
    for _ in range(4):
        tau = rng.uniform(-2, 2, 1)
        for m, expected in ((mech, 0.0), (ground_motor, tau[0])):
            q = solve_positions(m, np.array(m.q0) + 0.1 * rng.standard_normal(m.n)).q
            v = solve_velocities(m, q, v_guess=rng.standard_normal(m.n))
            a = constrained.forward_dynamics(m, q, v, m.generalized_forces(efforts=tau))
            rate = momentum_rate(m, q, v, a)
            if m is mech:
                rate += rotor * (a[t1] + 5 * a[elbow])      # the rotor's own angular momentum Ir·φ̇
            assert rate == pytest.approx(expected, abs=1e-6)


DFKI_LIKE = """
points:
  - {{x: 0, y: 0, fixed: true}}
  - {{x: 0, y: -0.2}}
  - {{x: 0, y: -0.5}}
planar_bodies:
  - {{points: [0, 1], length: 0.2, mass: 0.64, I0: 0.027, cog: [0.2, 0], name: link1}}
  - {{points: [1, 2], length: 0.3, mass: 0.56, I0: 0.054, cog: [0.3, 0], name: link2}}
{extra}
"""


def test_acrobot_elbow_motor_equals_the_virtual_work_mapping_on_absolute_angles():
    # the acrobot (passive shoulder, motor at the elbow) written with a joint angle, against the same pendulum on
    # absolute link angles with the elbow torque mapped by virtual work (Q_θ1 = −τ2, Q_θ2 = τ2)
    acrobot = Mechanism(load_spec_from_string(DFKI_LIKE.format(extra="""
joint_angles:
  - {name: q1, bodies: [ground, link1]}
  - {name: q2, bodies: [link1, link2]}
actuators:
  - {coordinate: q2}
""")))
    absolute = Mechanism(load_spec_from_string(DFKI_LIKE.format(extra="""
relative_coordinates:
  - {type: RelativeAngleAbsoluteDOF, points: [0, 1], name: theta1}
  - {type: RelativeAngleAbsoluteDOF, points: [1, 2], name: theta2}
actuators:
  - {coordinate: theta1}
  - {coordinate: theta2}
""")))
    assert acrobot.n == absolute.n + 2
    rng = np.random.default_rng(3)
    q1, q2 = acrobot.coordinate_index("q1"), acrobot.coordinate_index("q2")
    for _ in range(10):
        joints, rates, tau2 = rng.uniform(-3, 3, 2), rng.uniform(-5, 5, 2), rng.uniform(-2, 2)
        x0 = np.array(acrobot.q0)
        x0[[q1, q2]] = joints
        x = solve_positions(acrobot, x0, fixed=[q1, q2]).q
        v = solve_velocities(acrobot, x, fixed=[q1, q2], fixed_values=rates)
        a = constrained.forward_dynamics(acrobot, x, v, acrobot.generalized_forces(efforts=[tau2]))
        # the same state on absolute angles: the point coordinates are shared, θ1 = q1 − π/2, θ2 = θ1 + q2
        n_pts = absolute.n_point_coordinates
        xa = np.concatenate((x[:n_pts], [joints[0] - math.pi / 2, joints[0] + joints[1] - math.pi / 2]))
        va = np.concatenate((v[:n_pts], [rates[0], rates[0] + rates[1]]))
        aa = constrained.forward_dynamics(absolute, xa, va, absolute.generalized_forces(efforts=[-tau2, tau2]))
        np.testing.assert_allclose([a[q1], a[q2]], [aa[-2], aa[-1] - aa[-2]], rtol=1e-9, atol=1e-9)


def test_rotor_inertia_is_the_rotor_kinetic_energy():
    mech = mechanism(JOINTS + """
actuators:
  - {coordinate: shoulder, gear_ratio: 10, rotor_inertia: 3e-4}
  - {coordinate: elbow, gear_ratio: -6, rotor_inertia: 2e-4}
""")
    plain = mechanism(JOINTS)
    t1 = mech.coordinate_index("theta_link1")
    shoulder, elbow = mech.coordinate_index("shoulder"), mech.coordinate_index("elbow")
    assert [a.stator_angle for a in mech.spec.actuators] == [None, "theta_link1"]
    rng = np.random.default_rng(4)
    q = solve_positions(mech, mech.q0).q
    for _ in range(5):
        v = solve_velocities(mech, q, v_guess=rng.standard_normal(mech.n))
        rotors = 0.5 * 3e-4 * (10 * v[shoulder]) ** 2 + 0.5 * 2e-4 * (v[t1] - 6 * v[elbow]) ** 2
        assert mech.kinetic_energy(v) - plain.kinetic_energy(v) == pytest.approx(rotors, rel=1e-12)
    # on a body's absolute angle the stator is the ground
    on_angle = mechanism("""
relative_coordinates:
  - {type: RelativeAngleAbsoluteDOF, points: [0, 1], name: swing}
actuators:
  - {coordinate: swing, gear_ratio: 4, rotor_inertia: 1e-3}
""")
    col = on_angle.coordinate_index("swing")
    assert on_angle.spec.actuators[0].stator_angle is None
    extra = np.array(on_angle.mass_matrix) - np.array(mechanism("""
relative_coordinates:
  - {type: RelativeAngleAbsoluteDOF, points: [0, 1], name: swing}
""").mass_matrix)
    expected = np.zeros_like(extra)
    expected[col, col] = 16e-3
    np.testing.assert_allclose(extra, expected, atol=1e-18)


# -- positions and turns -----------------------------------------------------------------------------------------
def test_position_problem_with_held_joint_angles_many_turns_away():
    mech = mechanism(JOINTS)
    shoulder, elbow = mech.coordinate_index("shoulder"), mech.coordinate_index("elbow")
    rng = np.random.default_rng(5)
    for _ in range(10):
        held = rng.uniform(-20, 20, 2)
        guess = np.array(mech.q0)
        guess[[shoulder, elbow]] = held
        sol = solve_positions(mech, guess, fixed=[shoulder, elbow])
        q = sol.q
        assert np.abs(mech.constraints.phi(q)).max() < 1e-10
        np.testing.assert_array_equal(q[[shoulder, elbow]], held)
        # the points are where the angles say (not a mirrored assembly of the single-row angle constraints)
        frame1 = angle_of(mech, q, 0, 1)
        assert math.remainder(frame1 - angle_of(mech, mech.q0, 0, 1) - (held[0] - math.pi / 2), 2 * math.pi) \
            == pytest.approx(0.0, abs=1e-9)
        assert math.remainder(angle_of(mech, q, 1, 2) - frame1 - (angle_of(mech, mech.q0, 1, 2)
                                                                  - angle_of(mech, mech.q0, 0, 1)) - held[1],
                              2 * math.pi) == pytest.approx(0.0, abs=1e-9)


def test_unwrapping_keeps_the_joint_rows_and_the_joint_angles_turns():
    mech = mechanism(JOINTS)
    shoulder, elbow = mech.coordinate_index("shoulder"), mech.coordinate_index("elbow")
    q = solve_positions(mech, mech.q0).q
    # a reference a turn away on the joint angles (e.g. a multi-turn encoder's readings) and on θ_link2
    reference = np.array(q)
    reference[shoulder] += 2 * math.pi
    reference[elbow] -= 4 * math.pi
    reference[mech.coordinate_index("theta_link2")] += 2 * math.pi
    out = unwrap_angles(mech, q, reference)
    assert np.abs(mech.constraints.phi(out)).max() < 1e-12
    np.testing.assert_allclose(out[[shoulder, elbow]], reference[[shoulder, elbow]], atol=1e-12)
    # the point coordinates never move
    np.testing.assert_array_equal(out[:mech.n_point_coordinates], q[:mech.n_point_coordinates])


# -- the estimator on joint angles ---------------------------------------------------------------------------------
@pytest.mark.parametrize("turns", ["multi", "single"])
def test_estimator_follows_a_spinning_acrobot_over_many_turns(turns):
    # the elbow motor spins the acrobot up: both joint angles run through two turns and more; the encoders read
    # the joint angles (whole, or modulo a turn) and the estimate follows them without a re-initialization
    from mbfg_ros.estimation.config import EstimatorConfig
    from mbfg_ros.estimation.estimator import FixedLagEstimator
    from mbfg_ros.sim.plant import Actuator, SimulatedPlant
    acrobot = Mechanism(load_spec_from_string(DFKI_LIKE.format(extra=f"""
joint_angles:
  - {{name: q1, bodies: [ground, link1]}}
  - {{name: q2, bodies: [link1, link2]}}
actuators:
  - {{coordinate: q2, gear_ratio: -6, rotor_inertia: 1e-4}}
sensors:
  - {{type: encoder, coordinate: q1, sigma: 1e-4, turns: {turns}}}
  - {{type: encoder, coordinate: q2, sigma: 1e-4, turns: {turns}}}
""")))
    cols = [acrobot.coordinate_index("q1"), acrobot.coordinate_index("q2")]
    spin = lambda m, t, q, v: np.array([0.5 * (12.0 - v[cols[1]])])     # noqa: E731
    traj = SimulatedPlant(acrobot, dt=2e-3, profile=spin, seed=1, actuator=Actuator.ideal(acrobot)).simulate(2.0)
    assert (traj.q[-1, cols] > 4 * math.pi).all()
    for mode in ("fused", "estimation"):
        est = FixedLagEstimator(acrobot, EstimatorConfig(dt=2e-3, mode=mode))
        worst = 0.0
        for k in range(len(traj.t)):
            readings = {n: float(v[k]) for n, v in traj.readings.items()}
            if turns == "single":
                readings = {n: math.remainder(v, 2 * math.pi) for n, v in readings.items()}
            e = est.step(float(traj.t[k]), efforts=traj.efforts[k] if mode == "fused" else None,
                         observations=readings)
            assert k == 0 or e.status == "ok", (mode, k, e.status, e.message)
            assert np.abs(acrobot.constraints.phi(e.q)).max() < 1e-4      # soft constraints; a turn off: 2π
            if k >= 10:
                worst = max(worst, float(np.abs(e.q[cols] - traj.q[k, cols]).max()))
        assert worst < 2e-3, (mode, worst)


def test_estimator_starts_on_the_readings_turns():
    # multi-turn encoders whole turns from the drawn pose: the first window starts on the readings' turns, its body
    # angles on the same turns (the joint rows exact), not on the drawn pose's
    from mbfg_ros.estimation.config import EstimatorConfig
    from mbfg_ros.estimation.estimator import FixedLagEstimator
    mech = mechanism(JOINTS + """
sensors:
  - {type: encoder, coordinate: shoulder, sigma: 1e-4}
  - {type: encoder, coordinate: elbow, sigma: 1e-4}
""")
    readings = {"shoulder": 6 * math.pi + 0.3, "elbow": -4 * math.pi + 0.2}
    est = FixedLagEstimator(mech, EstimatorConfig(dt=1e-3, mode="estimation"))
    for k in range(5):
        e = est.step(k * 1e-3, observations=readings)
        assert e.status in ("initialized", "ok")
        np.testing.assert_allclose(e.q[[mech.coordinate_index(n) for n in readings]], list(readings.values()),
                                   atol=1e-3)
        assert np.abs(mech.constraints.phi(e.q)).max() < 1e-4
