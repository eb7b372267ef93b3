"""Position, velocity and acceleration problems, assembly modes, energy conservation."""

import numpy as np
import pytest
from scipy.integrate import solve_ivp

from mbfg_ros.dynamics import constrained as D
from mbfg_ros.dynamics import kinematics as K
from mbfg_ros.model.mechanism import load_mechanism

from test_constraints import MECHANISMS


def test_position_problem_with_a_fixed_crank_angle(crank):
    col = crank.coordinate_index("crank")
    q = np.array(crank.q0)
    q[col] = 0.7
    sol = K.solve_positions(crank, q, fixed=[col])
    assert sol.residual < 1e-12
    assert sol.q[col] == 0.7
    xy = crank.point_positions(sol.q)
    np.testing.assert_allclose(xy[1], [np.cos(0.7), np.sin(0.7)], atol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(xy[2] - xy[1]), 2.0, atol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(xy[3] - xy[2]), np.sqrt(13), atol=1e-12)
    assert list(sol.assembly_mode) == [-1]   # continuity from the drawn (elbow −1) pose


def test_position_difference_takes_relative_angles_modulo_a_turn(crank):
    col = crank.coordinate_index("crank")
    assert col in crank.relative_angle_columns and 0 not in crank.relative_angle_columns
    q = np.array(crank.q0, dtype=float)
    other = q.copy()
    other[col] += 2 * np.pi + 0.25     # a turn and a quarter radian further: 0.25 rad off
    other[0] += 7.0                    # a point coordinate: never wrapped
    d = crank.position_difference(other, q)
    np.testing.assert_allclose(d[col], 0.25, atol=1e-12)
    assert d[0] == pytest.approx(7.0)
    mask = np.ones(crank.n, dtype=bool)
    mask[[0, col]] = False
    assert np.all(d[mask] == 0.0)
    # rows of a trajectory at once, and the sign
    both = crank.position_difference(np.stack([q, q]), np.stack([other, q]))
    np.testing.assert_allclose(both[0, col], -0.25, atol=1e-12)
    assert np.all(both[1] == 0.0)


def test_requested_assembly_mode_is_reached_and_both_branches_are_solutions(crank):
    col = crank.coordinate_index("crank")
    q = np.array(crank.q0)
    q[col] = 0.7
    up = K.solve_positions_on_mode(crank, q, fixed=[col], assembly_mode=[-1])
    down = K.solve_positions_on_mode(crank, q, fixed=[col], assembly_mode=[+1])
    assert list(up.assembly_mode) == [-1] and list(down.assembly_mode) == [1]
    assert up.residual < 1e-12 and down.residual < 1e-12
    # the crank tip is shared; P2 is mirrored across the line P1–B
    np.testing.assert_allclose(up.q[:2], down.q[:2], atol=1e-12)
    assert np.linalg.norm(up.q[2:4] - down.q[2:4]) > 1.0


def test_bad_assembly_mode_request_is_a_clear_error(crank):
    with pytest.raises(ValueError, match="assembly_mode"):
        K.solve_positions_on_mode(crank, np.array(crank.q0), assembly_mode=[2])
    with pytest.raises(ValueError, match="assembly_mode"):
        K.solve_positions_on_mode(crank, np.array(crank.q0), assembly_mode=[1, 1])


def test_unreachable_pose_raises_assembly_error(crank):
    # the crank tip can never be 3 m from the crank pivot
    q = np.array(crank.q0)
    q[0], q[1] = 3.0, 0.0
    with pytest.raises(K.AssemblyError, match="no assembly"):
        K.solve_positions(crank, q, fixed=[0, 1])


@pytest.mark.parametrize("name", MECHANISMS)
def test_velocity_and_acceleration_problems(name):
    mech = load_mechanism(f"mechanisms/{name}.yaml")
    rng = np.random.default_rng(4)
    q = np.array(mech.q0)
    v = K.solve_velocities(mech, q, v_guess=rng.normal(size=mech.n))
    a = K.solve_accelerations(mech, q, v, a_guess=rng.normal(size=mech.n))
    res = K.constraint_residuals(mech, q, v, a)
    assert res["velocity"] < 1e-10 and res["acceleration"] < 1e-9


def test_robot_position_problem_with_motor_angles_fixed():
    robot = load_mechanism("mechanisms/pick_and_place_robot.yaml")
    cols = [robot.coordinate_index("motor1"), robot.coordinate_index("motor2")]
    q = np.array(robot.q0)
    q[cols] += [0.1, -0.05]
    sol = K.solve_positions(robot, q, fixed=cols)
    assert sol.residual < 1e-11
    np.testing.assert_allclose(sol.q[cols], np.array(robot.q0)[cols] + [0.1, -0.05])


def integrate_free_motion(mech, duration, q0, v0):
    """Index-1 DAE integrated at 1e-12 (the fine reference integrator for conservation checks)."""
    n = mech.n

    def rhs(t, y):
        return np.concatenate((y[n:], D.forward_dynamics(mech, y[:n], y[n:])))

    return solve_ivp(rhs, (0, duration), np.concatenate((q0, v0)), method="DOP853", rtol=1e-12, atol=1e-12,
                     dense_output=False, t_eval=np.linspace(0, duration, 101))


@pytest.mark.parametrize("name,duration", [("four_bar", 2.0), ("pendulum_nary", 1.0), ("slider_crank", 1.0)])
def test_free_fall_conserves_energy_and_constraints(name, duration):
    mech = load_mechanism(f"mechanisms/{name}.yaml")
    q0, v0 = np.array(mech.q0), np.zeros(mech.n)
    sol = integrate_free_motion(mech, duration, q0, v0)
    E0 = mech.energy(q0, v0)
    n = mech.n
    for y in sol.y.T:
        q, v = y[:n], y[n:]
        assert abs(mech.energy(q, v) - E0) < 1e-8 * max(1.0, abs(E0))
        assert np.abs(mech.constraints.phi(q)).max() < 1e-8
    # and it actually moved
    assert np.abs(sol.y[:n] - q0[:, None]).max() > 0.1


def test_four_bar_free_fall_passes_the_dead_point():
    """The crank-angle-free four-bar released from rest reaches the rocker dead point near t = 1.515 s
    (g = 9.8): the rocker tip P2 momentarily stops while the system keeps moving."""
    from mbfg_ros.model.mechanism import Mechanism
    import dataclasses
    base = load_mechanism("mechanisms/four_bar.yaml")
    mech = Mechanism(dataclasses.replace(base.spec, gravity=(0.0, -9.8)))
    start = integrate_free_motion(mech, 1.45, np.array(mech.q0), np.zeros(4)).y[:, -1]
    fine = solve_ivp(lambda t, y: np.concatenate((y[4:], D.forward_dynamics(mech, y[:4], y[4:]))),
                     (1.45, 1.58), start, method="DOP853", rtol=1e-12, atol=1e-12,
                     t_eval=np.linspace(1.45, 1.58, 1301))
    speed_p2 = np.hypot(fine.y[6], fine.y[7])
    k = int(np.argmin(speed_p2))
    assert fine.t[k] == pytest.approx(1.515, abs=0.005)
    assert speed_p2[k] < 1e-2 and np.hypot(fine.y[4, k], fine.y[5, k]) > 1.0
