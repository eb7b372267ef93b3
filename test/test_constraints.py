"""Every constraint type's derivatives against central finite differences at random states, and the compiled
kernel's Φ and derivatives (`ConstraintSet`, their only implementation) against the tests' numpy reference."""

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import constraint_reference as R  # noqa: E402

from mbfg_ros.model.constraints import (DistanceConstraints, FixedSliderConstraints, JointAngleConstraints,
                                  MobileSliderConstraints, RelativeAngleConstraints)
from mbfg_ros.dynamics.kinematics import solve_positions
from mbfg_ros.model.mechanism import load_mechanism
from mbfg_ros.model.spec import BodySpec, MechanismSpec, MobileSliderSpec, PointSpec, RelativeAngleSpec

MECHANISMS = ["four_bar", "four_bar_crank", "slider_crank", "pick_and_place_robot", "pendulum", "pendulum_nary",
              "double_pendulum_a0"]


def fd_jacobian(f, x, h=1e-6):
    x = np.asarray(x, dtype=float)
    cols = []
    for k in range(x.size):
        e = np.zeros_like(x)
        e[k] = h
        cols.append((f(x + e) - f(x - e)) / (2 * h))
    return np.stack(cols, axis=-1)


def local_types():
    """One instance set of each type with random local coordinates (K instances)."""
    rng = np.random.default_rng(7)
    K = 3
    yield DistanceConstraints(np.arange(4 * K).reshape(K, 4), ["d"] * K, rng.uniform(0.5, 2, K)), 4
    yield FixedSliderConstraints(np.arange(2 * K).reshape(K, 2), ["f"] * K, rng.normal(size=(K, 2)),
                                 rng.normal(size=(K, 2))), 2
    yield MobileSliderConstraints(np.arange(6 * K).reshape(K, 6), ["m"] * K, rng.uniform(0.5, 2, K)), 6
    yield RelativeAngleConstraints(np.arange(5 * K).reshape(K, 5), ["r"] * K, rng.uniform(0.5, 2, K)), 5
    yield JointAngleConstraints(np.arange(3 * K).reshape(K, 3), ["j"] * K, rng.normal(size=K), grounded=False), 3
    yield JointAngleConstraints(np.arange(2 * K).reshape(K, 2), ["g"] * K, rng.normal(size=K), grounded=True), 2


@pytest.mark.parametrize("ctype,k", list(local_types()),
                         ids=lambda x: f"{x.kind}{x.index.shape[1]}" if hasattr(x, "kind") else str(x))
def test_local_derivatives_match_finite_differences(ctype, k):
    rng = np.random.default_rng(1)
    for trial in range(20):
        u = rng.normal(size=(ctype.size, k))
        if ctype.kind == "relative_angle":
            # stay away from the form switch, where the row (by design) changes form
            th = rng.uniform(-np.pi, np.pi, ctype.size)
            s = np.abs(np.sin(th))
            th = np.where(np.abs(s - 1 / np.sqrt(2)) < 0.05, th + 0.2, th)
            u[:, 4] = th
        w = rng.normal(size=(ctype.size, k))
        for i in range(ctype.size):
            def phi_i(x, i=i):
                uu = u.copy()
                uu[i] = x
                return R.phi(ctype, uu)[i]

            def grad_i(x, i=i):
                uu = u.copy()
                uu[i] = x
                return R.gradient(ctype, uu)[i]

            def curv_i(x, i=i):
                uu = u.copy()
                uu[i] = x
                return w[i] @ R.hessian(ctype, uu)[i] @ w[i]

            np.testing.assert_allclose(R.gradient(ctype, u)[i], fd_jacobian(phi_i, u[i]), atol=1e-7)
            np.testing.assert_allclose(R.hessian(ctype, u)[i], fd_jacobian(grad_i, u[i]), atol=1e-7)
            np.testing.assert_allclose(R.third(ctype, u, w)[i], fd_jacobian(curv_i, u[i]), atol=1e-6)


def random_state(mech, rng, perturb=0.05):
    """A consistent pose near the YAML drawing (or far along the motion), perturbed off the manifold."""
    q = np.array(mech.q0)
    q = q + perturb * rng.normal(size=mech.n)
    return q, rng.normal(size=mech.n), rng.normal(size=mech.n)


@pytest.mark.parametrize("name", MECHANISMS)
def test_assembled_derivatives_match_finite_differences(name):
    mech = load_mechanism(f"mechanisms/{name}.yaml")
    C = mech.constraints
    rng = np.random.default_rng(3)
    for _ in range(5):
        q, v, w = random_state(mech, rng)
        lam = rng.normal(size=mech.m)
        J = C.jacobian(q)
        np.testing.assert_allclose(J, fd_jacobian(C.phi, q), atol=1e-6)
        np.testing.assert_allclose(C.phi(q), C.phi_and_jacobian(q)[0], rtol=1e-14, atol=1e-15)   # Φ-only path
        # Φ̇q = d(Φq)/dt along v
        np.testing.assert_allclose(C.jacobian_dot(q, v), (C.jacobian(q + 1e-6 * v) - C.jacobian(q - 1e-6 * v)) / 2e-6,
                                   atol=1e-6)
        # ∂(Φq w)/∂q
        np.testing.assert_allclose(C.hessian_vector(q, w), fd_jacobian(lambda x: C.jacobian(x) @ w, q), atol=1e-6)
        # ∂(Φ̇q v)/∂q at fixed v
        np.testing.assert_allclose(C.jacobian_dot_times_v_derivative(q, v),
                                   fd_jacobian(lambda x: C.jacobian_dot(x, v) @ v, q), atol=1e-5)
        # Σ λᵢ ∂²Φᵢ/∂q² = ∂(Φqᵀ λ)/∂q
        np.testing.assert_allclose(C.weighted_hessian(q, lam), fd_jacobian(lambda x: C.jacobian(x).T @ lam, q),
                                   atol=1e-6)


def follower():
    """A mobile slider on a bar whose relative angle starts at a fixed point."""
    pts = (PointSpec(0, 0, True), PointSpec(1, 1), PointSpec(1, -4, True), PointSpec(1, 4), PointSpec(1, 0.5))
    bodies = (BodySpec((0, 1), np.sqrt(2), 1, 2 / 3, (np.sqrt(2) / 2, 0)),
              BodySpec((2, 3), 8.0, 3, 64.0, (4.0, 0)))
    spec = MechanismSpec("follower", pts, bodies, mobile_sliders=(MobileSliderSpec("s", 4, (2, 3)),),
                         relative_angles=(RelativeAngleSpec("a", (2, 3)),))
    from mbfg_ros.model.mechanism import Mechanism
    return Mechanism(spec)


@pytest.mark.parametrize("name", MECHANISMS + ["double_pendulum_c0", "follower"])
def test_kernel_matches_the_numpy_reference_for_one_state_and_many(name):
    """The kernel's Φ, Φq, ∂(Φq w)/∂q, ∂(Φ̇q v)/∂q and Σ λᵢ ∂²Φᵢ/∂q² against the reference's, one state at a time
    and all N states in one call (the batch's form), both relative-angle forms included."""
    mech = follower() if name == "follower" else load_mechanism(f"mechanisms/{name}.yaml")
    C, ref = mech.constraints, R.ReferenceConstraints(mech.constraints)
    rng = np.random.default_rng(11)
    N = 12
    q = np.array(mech.q0) + 0.05 * rng.normal(size=(N, mech.n))
    q[:, mech.n_point_coordinates:] = rng.uniform(-np.pi, np.pi, (N, mech.n - mech.n_point_coordinates))
    v, w, lam = rng.normal(size=(N, mech.n)), rng.normal(size=(N, mech.n)), rng.normal(size=(N, mech.m))
    phi_all, J_all = C.phi_and_jacobian(q)
    hv_all, third_all = C.hessian_vector(q, w), C.jacobian_dot_times_v_derivative(q, v)
    wh_all = C.weighted_hessian(q, lam)
    for k in range(N):
        p_ref, J_ref = ref.phi_and_jacobian(q[k])
        expected = [(p_ref, C.phi(q[k]), phi_all[k]), (J_ref, C.jacobian(q[k]), J_all[k]),
                    (ref.hessian_vector(q[k], w[k]), C.hessian_vector(q[k], w[k]), hv_all[k]),
                    (ref.hessian_vector(q[k], v[k]), C.jacobian_dot(q[k], v[k]), None),
                    (ref.jacobian_dot_times_v_derivative(q[k], v[k]), C.jacobian_dot_times_v_derivative(q[k], v[k]),
                     third_all[k]),
                    (ref.weighted_hessian(q[k], lam[k]), C.weighted_hessian(q[k], lam[k]), wh_all[k])]
        for want, one, many in expected:
            scale = max(1.0, np.abs(want).max(initial=0.0))
            np.testing.assert_allclose(one, want, rtol=0, atol=1e-13 * scale)
            if many is not None:
                np.testing.assert_array_equal(many, one)
    assert C.phi_and_jacobian(np.zeros((0, mech.n)))[1].shape == (0, mech.m, mech.n)


def test_every_shipped_pose_satisfies_its_constraints():
    for name in MECHANISMS:
        mech = load_mechanism(f"mechanisms/{name}.yaml")
        assert np.abs(mech.constraints.phi(np.array(mech.q0))).max() < 1e-12, name


def test_relative_angle_row_is_continuous_in_value_across_the_switch():
    """Both forms vanish on the manifold, so solving for θ across |sin θ| = 1/√2 gives a smooth angle."""
    mech = load_mechanism("mechanisms/four_bar_crank.yaml")
    col = mech.coordinate_index("crank")
    angles = np.linspace(np.pi / 4 - 0.01, np.pi / 4 + 0.01, 21)
    q = np.array(mech.q0)
    for th in angles:
        q[col] = th
        sol = solve_positions(mech, q, fixed=[col])
        xy = mech.point_positions(sol.q)
        np.testing.assert_allclose(np.arctan2(xy[1, 1], xy[1, 0]), th, atol=1e-12)
        q = sol.q


def test_mobile_slider_acceleration_terms_are_not_zero():
    """The reference implementation leaves the mobile-slider Hessian products at zero; they are not."""
    mech = follower()
    rng = np.random.default_rng(0)
    q = np.array(mech.q0) + 0.1 * rng.normal(size=mech.n)
    v = rng.normal(size=mech.n)
    Hv = mech.constraints.hessian_vector(q, v)
    slider_row = [i for i, nm in enumerate(mech.constraints.names) if "mobile_slider" in nm][0]
    assert np.abs(Hv[slider_row]).max() > 1e-3
    np.testing.assert_allclose(Hv, fd_jacobian(lambda x: mech.constraints.jacobian(x) @ v, q), atol=1e-6)
