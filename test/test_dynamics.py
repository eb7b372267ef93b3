"""Mass matrix, generalized forces, forward/inverse dynamics and their Jacobians."""

import numpy as np
import pytest

from mbfg_ros.dynamics import constrained as D
from mbfg_ros.dynamics import kinematics as K
from mbfg_ros.model.mechanism import load_mechanism

from test_constraints import MECHANISMS, fd_jacobian


@pytest.fixture(scope="module")
def four_bar():
    return load_mechanism("mechanisms/four_bar.yaml")


def test_four_bar_mass_matrix_and_gravity(four_bar):
    M = np.kron(np.array([[1, 1 / 3], [1 / 3, 2]]), np.eye(2))
    np.testing.assert_allclose(four_bar.mass_matrix, M, atol=1e-12)
    np.testing.assert_allclose(four_bar.gravity_forces, [0, -14.715, 0, -29.43], atol=1e-12)


def test_four_bar_free_fall_initial_acceleration(four_bar, crank):
    a = D.forward_dynamics(four_bar, np.array(four_bar.q0), np.zeros(4))
    np.testing.assert_allclose(a, [0, -9.69037, -6.46024, -9.69037], atol=1e-5)
    a = D.forward_dynamics(crank, np.array(crank.q0), np.zeros(5))
    np.testing.assert_allclose(a[crank.coordinate_index("crank")], -9.69037, atol=1e-5)


def crank_motion(mech, t):
    """θ(t) = 1.2 (1 − cos 2t) and the dependent q, q̇, q̈ from the position, velocity, acceleration problems."""
    col = mech.coordinate_index("crank")
    th, thd, thdd = 1.2 * (1 - np.cos(2 * t)), 2.4 * np.sin(2 * t), 4.8 * np.cos(2 * t)
    q = np.array(mech.q0)
    q[col] = th
    q = K.solve_positions(mech, q, fixed=[col]).q
    v = K.solve_velocities(mech, q, [col], [thd])
    a = K.solve_accelerations(mech, q, v, [col], [thdd])
    return q, v, a


def test_four_bar_crank_inverse_dynamics_torque(crank):
    q, v, a = crank_motion(crank, 0.0)
    tau = D.inverse_dynamics(crank, q, v, a)
    assert tau.shape == (1,)
    assert tau[0] == pytest.approx(66.01, abs=0.01)


def test_inverse_dynamics_reproduces_forward_dynamics(crank):
    """The torque from inverse dynamics, fed to forward dynamics, gives back the prescribed q̈."""
    for t in (0.3, 1.1, 2.7):
        q, v, a = crank_motion(crank, t)
        tau = D.inverse_dynamics(crank, q, v, a)
        a_fd = D.forward_dynamics(crank, q, v, crank.generalized_forces(tau))
        np.testing.assert_allclose(a_fd, a, atol=1e-9)


def test_robot_rank_and_holding_torques(robot):
    info = robot.describe()
    assert (info["n"], info["rank"], info["dof"]) == (22, 20, 2)
    assert info["pose_consistent"]
    tau = D.inverse_dynamics(robot, np.array(robot.q0), np.zeros(22), np.zeros(22))
    assert abs(tau[0]) == pytest.approx(117.72, abs=0.01)
    assert abs(tau[1]) == pytest.approx(117.72, abs=0.01)
    assert np.sign(tau[0]) == -np.sign(tau[1])
    # holding those torques, the robot stays at rest despite its redundant constraints
    a = D.forward_dynamics(robot, np.array(robot.q0), np.zeros(22), robot.generalized_forces(tau))
    assert np.abs(a).max() < 1e-9


@pytest.mark.parametrize("name", MECHANISMS)
def test_forward_dynamics_jacobians_match_finite_differences(name):
    mech = load_mechanism(f"mechanisms/{name}.yaml")
    rng = np.random.default_rng(11)
    for _ in range(3):
        q = K.solve_positions(mech, np.array(mech.q0) + 0.05 * rng.normal(size=mech.n)).q
        v = K.solve_velocities(mech, q, v_guess=rng.normal(size=mech.n))
        Q = mech.gravity_forces + rng.normal(size=mech.n)
        lin = D.forward_dynamics_jacobians(mech, q, v, Q)
        np.testing.assert_allclose(lin.a, D.forward_dynamics(mech, q, v, Q), atol=1e-10)
        scale = max(1.0, np.abs(lin.da_dq).max())
        np.testing.assert_allclose(lin.da_dq, fd_jacobian(lambda x: D.forward_dynamics(mech, x, v, Q), q),
                                   atol=2e-6 * scale)
        np.testing.assert_allclose(lin.da_dv, fd_jacobian(lambda x: D.forward_dynamics(mech, q, x, Q), v),
                                   atol=2e-6 * scale)
        np.testing.assert_allclose(lin.da_dQ, fd_jacobian(lambda x: D.forward_dynamics(mech, q, v, x), Q),
                                   atol=1e-6)
        # q̈ satisfies the acceleration constraints
        C = mech.constraints
        assert np.abs(C.jacobian(q) @ lin.a + C.jacobian_dot(q, v) @ v).max() < 1e-8


def test_jacobians_off_the_manifold_match_finite_differences(crank):
    """The factor graph linearizes at predicted states that violate Φ slightly."""
    mech = crank
    rng = np.random.default_rng(5)
    q = np.array(mech.q0) + 0.02 * rng.normal(size=mech.n)
    v, Q = rng.normal(size=mech.n), mech.gravity_forces + rng.normal(size=mech.n)
    lin = D.forward_dynamics_jacobians(mech, q, v, Q)
    np.testing.assert_allclose(lin.da_dq, fd_jacobian(lambda x: D.forward_dynamics(mech, x, v, Q), q), atol=1e-5)


def test_independent_accelerations_equal_dependent(crank, robot):
    rng = np.random.default_rng(2)
    for mech, z in ((crank, ["crank"]), (robot, ["motor1", "motor2"])):
        zi = [mech.coordinate_index(n) for n in z]
        q = np.array(mech.q0)
        v = K.solve_velocities(mech, q, zi, rng.normal(size=len(zi)))
        Q = mech.gravity_forces + 0.1 * rng.normal(size=mech.n)
        a = D.forward_dynamics(mech, q, v, Q)
        np.testing.assert_allclose(D.independent_accelerations(mech, q, v, zi, Q), a[zi], atol=1e-9)


def test_dynamics_at_the_four_bar_dead_point(four_bar):
    """At the rocker's dead point (crank and coupler collinear) q̈ stays finite and consistent."""
    mech = four_bar
    # crank tip on the line A–B extended so that |P2 - A| = 3: crank and coupler aligned
    q = np.array(mech.q0)
    q[:2] = [np.cos(2.0), np.sin(2.0)]
    q[2:] = 3 * np.array([np.cos(2.0), np.sin(2.0)])
    # that pose violates the rocker length; solve with the crank tip fixed to find a nearby one
    sol = K.solve_positions(mech, q, fixed=[0, 1])
    a = D.forward_dynamics(mech, sol.q, np.zeros(4))
    assert np.all(np.isfinite(a))


@pytest.mark.parametrize("name", ["four_bar_crank", "pick_and_place_robot"])
def test_acceleration_derivatives_from_the_null_space_solver(name):
    """Where the augmented matrix is singular, `forward_dynamics_jacobians` takes the rows [A B] of its
    generalized inverse from the null-space solver; the derivative products over those give the
    same linearization as over the augmented solve."""
    mech = load_mechanism(f"mechanisms/{name}.yaml")
    rng = np.random.default_rng(4)
    q = K.solve_positions(mech, np.array(mech.q0) + 0.05 * rng.normal(size=mech.n)).q + 1e-3 * rng.normal(size=mech.n)
    v, Q = rng.normal(size=mech.n), mech.gravity_forces + rng.normal(size=mech.n)
    ref = D.forward_dynamics_jacobians(mech, q, v, Q)
    n, C, rows = mech.n, mech.constraints, mech.independent_rows
    solver = D.solver_at(mech, q)
    r = len(rows)
    A = solver.solve(np.eye(n), np.zeros((r, n)))
    B = solver.solve(np.zeros((n, r)), np.eye(r))
    low = (C.jacobian_dot_times_v_derivative(q, v) + C.hessian_vector(q, ref.a))[rows]
    # the products written from the differentiated equations of motion (the kernel's `derivatives` is their
    # package form): ∂q̈/∂q = −(A Σλᵢ∂²Φᵢ + B low), ∂q̈/∂q̇ = −2 B Φ̇q (no friction on these mechanisms)
    assert mech.friction is None
    da_dq = -(A @ C.weighted_hessian(q, ref.multipliers) + B @ low)
    da_dv = -2.0 * B @ C.jacobian_dot(q, v)[rows]
    scale = max(1.0, np.abs(ref.da_dq).max())
    np.testing.assert_allclose(da_dq, ref.da_dq, rtol=0, atol=1e-9 * scale)
    np.testing.assert_allclose(da_dv, ref.da_dv, rtol=0, atol=1e-9 * max(1.0, np.abs(ref.da_dv).max()))
    np.testing.assert_allclose(A, ref.da_dQ, rtol=0, atol=1e-9 * max(1.0, np.abs(ref.da_dQ).max()))


def test_third_derivatives_only_with_relative_angles(four_bar, crank):
    """Distances and sliders are quadratic in q (∂(Φ̇q q̇)/∂q = 0), relative-angle rows are not."""
    assert not D.has_third_derivatives(four_bar)
    assert D.has_third_derivatives(crank)
