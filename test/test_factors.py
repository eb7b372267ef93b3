"""Factor units: closed-form Jacobians against central finite differences on every shipped mechanism,
the lean dynamics linearization against the core, and the gtsam adapters (CustomFactor and the
pre-linearized stacked-state factor) against the units."""

import math

import gtsam
import numpy as np
import pytest

from mbfg_ros.dynamics import constrained as D
import mbfg_ros.factors as F
from mbfg_ros.dynamics.cache import EvalContext
from mbfg_ros.dynamics import kinematics as K
from mbfg_ros.factors.noise import default_sigmas, noise_descriptions
from mbfg_ros.graph.gtsam_adapters import custom_factor
from mbfg_ros.graph.layout import StateLayout
from mbfg_ros.graph.step_model import StepModel, linearize_step
from mbfg_ros.model.identified import IdentifiedParameters
from mbfg_ros.model.mechanism import load_mechanism
from mbfg_ros.model.spec import IDENTIFIABLE, IdentifySpec

MECHANISMS = ["four_bar", "four_bar_crank", "slider_crank", "pick_and_place_robot", "double_pendulum_c0"]
SWITCH = 1.0 / math.sqrt(2.0)


@pytest.fixture(scope="module", params=MECHANISMS)
def mech(request):
    return load_mechanism(f"mechanisms/{request.param}.yaml")


def random_state(mech, rng):
    """A consistent pose from the position problem (random start), perturbed off the manifold, and random
    q̇, q̈, j, τ, z-blocks.  Relative angles are kept away from the row-form switch |sin θ| = 1/√2."""
    for _ in range(50):
        guess = np.array(mech.q0) + 0.1 * rng.standard_normal(mech.n)
        try:
            q = K.solve_positions(mech, guess).q
        except K.AssemblyError:
            continue
        q = q + 1e-3 * rng.standard_normal(mech.n)
        th = q[mech.relative_angle_columns]
        if np.all(np.abs(np.abs(np.sin(th)) - SWITCH) > 1e-3):
            break
    d = mech.degrees_of_freedom(q)
    return dict(q=q, v=rng.standard_normal(mech.n), a=rng.standard_normal(mech.n), j=rng.standard_normal(mech.n),
                tau=rng.standard_normal(len(mech.actuated)), z=rng.standard_normal(d), zd=rng.standard_normal(d),
                zdd=rng.standard_normal(d), zj=rng.standard_normal(d), d=d,
                theta=rng.standard_normal(len(IDENTIFIABLE) * len(mech.actuated) + 1),
                deflection=1e-3 * rng.standard_normal(3))


def fd_jacobian(unit, blocks, i, h=1e-6, params=None):
    """Central differences of `unit`'s error in block i, with the per-step values `params` (None: the unit's
    defaults)."""
    params = unit.own_params() if params is None else params
    x = blocks[i]
    J = np.zeros((unit.dim, x.size))
    for k in range(x.size):
        bp = [b.copy() for b in blocks]
        bm = [b.copy() for b in blocks]
        bp[i][k] += h
        bm[i][k] -= h
        J[:, k] = (unit.error(*bp, params=params) - unit.error(*bm, params=params)) / (2 * h)
    return J


def blocks_for(unit, s):
    return [s[name.replace("_prev", "")].copy() + (0.01 if name.endswith("_prev") else 0.0) for name in unit.slots]


def all_units(mech, s, rng):
    n, d = mech.n, s["d"]
    z = list(range(mech.n - d, mech.n)) if mech.relative_angle_columns.size >= d else list(range(d))
    Q = mech.gravity_forces + rng.standard_normal(n)
    units = [
        F.PositionConstraints(mech), F.VelocityConstraints(mech), F.AccelerationConstraints(mech),
        F.ForwardDynamics(mech, Q), F.InverseDynamics(mech),
        F.PositionConstraintsIndep(mech, z), F.VelocityConstraintsIndep(mech, z),
        F.AccelerationConstraintsIndep(mech, z), F.ForwardDynamics(mech, Q, z=z), F.InverseDynamics(mech, z=z),
        F.Prior("q", s["q"] + 0.1, 1e-3), F.Prior("v", [0.5], 0.1, select=[1], size=n),
        F.EulerIntegrator("q", "v", n, 1e-3), F.TrapezoidalIntegrator("v", "a", n, 1e-3),
        F.HermiteIntegrator("q", "v", "a", n, 1e-3), F.HermiteIntegrator("v", "a", "j", n, 1e-3),
        F.SoftEquality("q", n), F.SoftEquality("q", n, offset=rng.standard_normal(n)),
        F.SecondDifference("v", n, 1e3),
        F.IntegratedRandomWalk("q", "v", n, 1e-3, 1e4), F.IntegratedRandomWalk("z", "zd", d, 4e-3, 2.0),
        F.IntegratedRandomWalk("z", "zd", d, 4e-3, 2.0, time_constant=0.05),
        F.ObservedCoordinate(mech, 0, 0, 0.3), F.ObservedCoordinate(mech, 1, 1, 0.3),
        F.ObservedCoordinate(mech, n - 1, 2, 0.3),
        F.CorrelatedPrior(("q", "v"), (n, n), rng.standard_normal(2 * n), rng.standard_normal((2 * n, 2 * n))),
    ]
    units += [F.Gyroscope(mech, b, 0.7) for b in range(len(mech.spec.bodies))]
    na = len(mech.actuated)
    if na:
        # every identifiable parameter of every actuator (gain, viscous, Coulomb), some rates near v_s
        # (and a payload on the last body, off its axis: its weight and inertia depend on q̈, slot a)
        P = IdentifiedParameters(mech, [IdentifySpec(joint=j, parameter=k) for j in mech.actuator_names
                                        for k in IDENTIFIABLE]
                                 + [IdentifySpec(joint="tip", parameter="payload_mass",
                                                 body=len(mech.spec.bodies) - 1, at=(0.3, 0.1))])
        units += [F.IdentifiedDynamics(mech, P, Q_known=Q, commands=rng.standard_normal(na)),
                  F.RandomWalk("tau", na, 2e-3, 0.3)]
    encoders = [sensor for sensor in mech.sensors if sensor.kind == "encoder"]
    units += [F.Encoder(mech, sensor.coordinate, 0.2, sensor.sigma) for sensor in encoders]
    # through a deflection (each reading one entry of the deflection block), and that block's process
    units += [F.Encoder(mech, sensor.coordinate, 0.2, sensor.sigma, deflection=j % 3) for j, sensor in enumerate(encoders)]
    units += [F.GaussMarkov("deflection", 3, 2e-3, [1e-3, 2e-3, 5e-4], 0.05)]
    return units


def test_jacobians_match_finite_differences(mech):
    rng = np.random.default_rng(7)
    for trial in range(2):
        s = random_state(mech, rng)
        for unit in all_units(mech, s, rng):
            blocks = blocks_for(unit, s)
            e, Js = unit.evaluate(*blocks, params=unit.own_params())
            assert e.shape == (unit.dim,) and unit.sigmas.shape == (unit.dim,)
            np.testing.assert_allclose(e, unit.error(*blocks, params=unit.own_params()), rtol=1e-12, atol=1e-12)
            assert len(Js) == len(unit.slots)
            for i, J in enumerate(Js):
                Jn = fd_jacobian(unit, blocks, i)
                scale = max(1.0, np.abs(Jn).max(initial=0.0))
                assert np.abs(J - Jn).max(initial=0.0) <= 1e-6 * scale, (mech.name, unit.name, unit.slots[i])


def test_gauss_markov_is_whitened_by_the_exact_transition_and_keeps_its_stationary_sigma():
    """e = (x − φ x_prev) / (σ √(1 − φ²)), φ = e^{−h/T}: a stationary x of σ propagated over h keeps σ, and the
    whitened residual of a simulated path has unit variance; bad arguments are refused."""
    h, T, sigma = 2e-3, 0.05, np.array([1e-3, 4e-3])
    u = F.GaussMarkov("deflection", 2, h, sigma, T)
    assert u.static and u.linear and np.all(u.sigmas == 1.0) and u.dim == 2
    phi = np.exp(-h / T)
    np.testing.assert_allclose(-np.diag(u.jacobians[0]) / np.diag(u.jacobians[1]), phi, rtol=1e-14)
    # transition noise variance σ²(1 − φ²) whitened to 1, so φ²σ² + that = σ²: stationary
    np.testing.assert_allclose((1.0 / np.diag(u.jacobians[1])) ** 2, sigma ** 2 * (1 - phi ** 2), rtol=1e-12)
    rng = np.random.default_rng(3)
    x = sigma * rng.standard_normal((20000, 2))
    x1 = phi * x + sigma * np.sqrt(1 - phi ** 2) * rng.standard_normal((20000, 2))
    e = np.array([u.error(a, b, params=()) for a, b in zip(x[:2000], x1[:2000])])
    assert abs(e.std() - 1.0) < 0.05 and abs(x1.std(axis=0) / sigma - 1.0).max() < 0.03
    for bad in (dict(sigma=0.0, time_constant=T), dict(sigma=1e-3, time_constant=0.0),
                dict(sigma=1e-3, time_constant=np.inf)):
        with pytest.raises(ValueError, match="GaussMarkov"):
            F.GaussMarkov("deflection", 1, h, **bad)


def test_integrated_random_walk_is_whitened_by_the_exact_transition_covariance():
    """e = W r with W Q Wᵀ = I, Q = S [[h³/3, h²/2], [h²/2, h]] per component (white noise on ẍ)."""
    h, S = 2e-3, np.array([3.0, 5e4])
    u = F.IntegratedRandomWalk("tau", "tau_rate", 2, h, S)
    assert u.static and u.linear and np.all(u.sigmas == 1.0) and u.dim == 4
    W = np.hstack((u.jacobians[1], u.jacobians[3]))          # ∂e/∂x = W [I; 0], ∂e/∂ẋ = W [0; I]
    for i in range(2):
        rows = [i, 2 + i]
        Wi = W[np.ix_(rows, rows)]
        Q = S[i] * np.array([[h ** 3 / 3, h * h / 2], [h * h / 2, h]])
        np.testing.assert_allclose(Wi @ Q @ Wi.T, np.eye(2), atol=1e-12)
    # the residual it whitens: r = [x − x_prev − h ẋ_prev; ẋ − ẋ_prev]
    rng = np.random.default_rng(2)
    x0, x1, v0, v1 = (rng.standard_normal(2) for _ in range(4))
    r = np.concatenate((x1 - x0 - h * v0, v1 - v0))
    np.testing.assert_allclose(u.error(x0, x1, v0, v1, params=()), W @ r, rtol=1e-12)
    with pytest.raises(ValueError, match="densities"):
        F.IntegratedRandomWalk("tau", "tau_rate", 1, h, 0.0)


@pytest.mark.parametrize("h, T", [(1e-3, 1.0), (5e-3, 0.01), (0.1, 0.02), (1e-3, 1e-4)])
def test_damped_random_walk_is_the_exact_transition_of_its_sde(h, T):
    """Damped walk ẍ = −(2/T) ẋ − x/T² + w: the factor's mean transition is e^{Ah} and it whitens the
    Van Loan covariance ∫ e^{As} G S Gᵀ e^{Aᵀs} ds (computed here independently with expm, including the
    small-ωh regime where the closed form switches to its series)."""
    from scipy.linalg import expm
    S = np.array([3.0, 5e4])
    u = F.IntegratedRandomWalk("tau", "tau_rate", 2, h, S, time_constant=T)
    w = 1.0 / T
    A = np.array([[0.0, 1.0], [-w * w, -2.0 * w]])
    M = np.zeros((4, 4))
    M[:2, :2] = -A
    M[1, 3] = 1.0
    M[2:, 2:] = A.T
    E = expm(M * h)
    Phi = E[2:, 2:].T
    C = Phi @ E[:2, 2:]
    np.testing.assert_allclose(u.transition, Phi, rtol=1e-12, atol=1e-14)
    W = np.hstack((u.jacobians[1], u.jacobians[3]))
    for i in range(2):
        rows = [i, 2 + i]
        Wi = W[np.ix_(rows, rows)]
        np.testing.assert_allclose(Wi @ (S[i] * C) @ Wi.T, np.eye(2), atol=1e-8)
    rng = np.random.default_rng(4)
    x0, x1, v0, v1 = (rng.standard_normal(2) for _ in range(4))
    r = np.concatenate((x1 - Phi[0, 0] * x0 - Phi[0, 1] * v0, v1 - Phi[1, 0] * x0 - Phi[1, 1] * v0))
    np.testing.assert_allclose(u.error(x0, x1, v0, v1, params=()), W @ r, rtol=1e-10)
    # without readings the prior's mean returns to 0 (the undamped walk keeps the rate: unbounded drift)
    m = np.array([1.0, 5.0])
    for _ in range(int(round(10 * T / h))):
        m = Phi @ m
    assert abs(m[0]) < 1e-2 * (1.0 + 5.0 * T)
    with pytest.raises(ValueError, match="time constant"):
        F.IntegratedRandomWalk("tau", "tau_rate", 1, h, 1.0, time_constant=0.0)


@pytest.mark.parametrize("h, Tv", [(1e-3, 0.1), (2e-3, 1e4), (0.02, 0.3), (0.05, 0.01), (0.5, 0.01)])
def test_rate_damped_walk_is_the_exact_transition_of_its_sde(h, Tv):
    """Rate-damped walk ẍ = −ẋ/T_v + w (the efforts' rate an Ornstein–Uhlenbeck process): the factor's mean
    transition is e^{Ah}, and it whitens the noise covariance ∫ φφᵀ ds, here by a fine quadrature of
    φ(s) = ((1 − e^{−s/T_v}) T_v, e^{−s/T_v}) (the factor's series and closed forms on either side of h/T_v = 1);
    T_v ≥ 1e15 is the undamped walk; the rate decorrelates over T_v without readings."""
    from scipy.linalg import expm
    S = np.array([3.0, 5e4])
    u = F.IntegratedRandomWalk("tau", "tau_rate", 2, h, S, rate_time_constant=Tv)
    A = np.array([[0.0, 1.0], [0.0, -1.0 / Tv]])
    np.testing.assert_allclose(u.transition, expm(A * h), rtol=1e-12, atol=1e-14)
    s = np.linspace(0.0, h, 400001)
    p1, p2 = -np.expm1(-s / Tv) * Tv, np.exp(-s / Tv)
    trapezoid = getattr(np, "trapezoid", None) or np.trapz   # numpy < 2.0 (ROS Jazzy's 1.26) has only trapz
    C = np.array([[trapezoid(p1 * p1, s), trapezoid(p1 * p2, s)], [trapezoid(p1 * p2, s), trapezoid(p2 * p2, s)]])
    W = np.hstack((u.jacobians[1], u.jacobians[3]))
    for i in range(2):
        rows = [i, 2 + i]
        Wi = W[np.ix_(rows, rows)]
        np.testing.assert_allclose(Wi @ (S[i] * C) @ Wi.T, np.eye(2), atol=1e-6)
    undamped = F.IntegratedRandomWalk("tau", "tau_rate", 2, h, S)
    forever = F.IntegratedRandomWalk("tau", "tau_rate", 2, h, S, rate_time_constant=1e15)
    for Ja, Jb in zip(undamped.jacobians, forever.jacobians):
        np.testing.assert_array_equal(Ja, Jb)
    with pytest.raises(ValueError, match="not both"):
        F.IntegratedRandomWalk("tau", "tau_rate", 1, h, 1.0, time_constant=1.0, rate_time_constant=1.0)
    with pytest.raises(ValueError, match="rate's time constant"):
        F.IntegratedRandomWalk("tau", "tau_rate", 1, h, 1.0, rate_time_constant=0.0)


def test_undamped_walk_is_the_infinite_time_constant():
    a = F.IntegratedRandomWalk("tau", "tau_rate", 1, 1e-3, 7.0)
    b = F.IntegratedRandomWalk("tau", "tau_rate", 1, 1e-3, 7.0, time_constant=1e300)
    for Ja, Jb in zip(a.jacobians, b.jacobians):
        np.testing.assert_allclose(Ja, Jb, rtol=1e-12)


def test_white_acceleration_sigmas_match_a_simulated_process():
    """The integrator rows' residuals when the acceleration is the model's plus white noise (simulated on
    a fine grid, 4000 runs): variances S h³/12 (position row of the trapezoidal rule), S h (velocity row)."""
    h, S, fine, runs = 1e-3, 2.0, 200, 4000
    rng = np.random.default_rng(3)
    dtf = h / fine
    w = rng.standard_normal((runs, fine)) * np.sqrt(S / dtf)    # white noise: variance S/dt on a grid dt
    v = np.concatenate((np.zeros((runs, 1)), np.cumsum(w, axis=1) * dtf), axis=1)
    q1 = np.sum(0.5 * (v[:, 1:] + v[:, :-1]), axis=1) * dtf
    eq = q1 - 0.5 * h * (v[:, 0] + v[:, -1])                    # the model's acceleration is 0 here
    ev = v[:, -1] - v[:, 0]
    sq, sv = F.white_acceleration_sigmas(S, h, "trapezoidal")
    assert np.std(eq) == pytest.approx(sq, rel=0.05) and np.std(ev) == pytest.approx(sv, rel=0.05)
    assert abs(np.corrcoef(eq, ev)[0, 1]) < 0.05
    assert F.white_acceleration_sigmas(S, h, "hermite") == (sq, sv)
    sq_e, _ = F.white_acceleration_sigmas(S, h, "euler")
    assert np.std(q1 - h * v[:, 0]) == pytest.approx(sq_e, rel=0.05)
    with pytest.raises(ValueError, match="acceleration density"):
        F.white_acceleration_sigmas(-1.0, h, "euler")


def test_correlated_prior_is_whitened_by_its_covariance():
    """CorrelatedPrior.from_covariance: e = R (x − mean) has unit covariance when x ~ N(mean, P) (R P Rᵀ = I),
    so its cost is the Mahalanobis distance; eigenvalues below floor² are raised to it (a nearly singular
    marginal never makes an infinitely tight prior); inconsistent shapes are refused."""
    rng = np.random.default_rng(3)
    A = rng.standard_normal((5, 5))
    P = A @ A.T + 0.1 * np.eye(5)
    mean = rng.standard_normal(5)
    u = F.CorrelatedPrior.from_covariance(("q", "v"), (3, 2), mean, P, floor=1e-6)
    R = np.hstack(u.evaluate(np.zeros(3), np.zeros(2), params=(mean,))[1])
    np.testing.assert_allclose(R @ P @ R.T, np.eye(5), atol=1e-9)
    x = rng.standard_normal(5)
    e, _ = u.evaluate(x[:3], x[3:], params=(mean,))
    assert e @ e == pytest.approx((x - mean) @ np.linalg.solve(P, x - mean), rel=1e-9)
    assert np.array_equal(u.sigmas, np.ones(5)) and u.linear and u.slots == ("q", "v")
    v = np.array([1.0, 1.0, 0.0]) / np.sqrt(2.0)              # a rank-2 covariance: singular along v
    w = F.CorrelatedPrior.from_covariance(("q",), (3,), np.zeros(3), np.eye(3) - np.outer(v, v), floor=1e-3)
    assert np.linalg.norm(w.evaluate(v, params=(np.zeros(3),))[0]) == pytest.approx(1e3, rel=1e-9)
    with pytest.raises(ValueError, match="do not match"):
        F.CorrelatedPrior(("q", "v"), (3, 3), np.zeros(5), np.eye(5))


def test_jerk_factor_exact_blocks_and_documented_approximation(mech):
    """j_pred = ∂q̈/∂q q̇ + ∂q̈/∂q̇ a + ∂q̈/∂Q Q̇: the j and a blocks are exact; the q, q̇ (and τ) blocks
    neglect second derivatives of q̈ (see `factors.Jerk` for why the fixed point stays exact)."""
    rng = np.random.default_rng(3)
    s = random_state(mech, rng)
    Qdot = rng.standard_normal(mech.n)
    unit = F.Jerk(mech)
    blocks = blocks_for(unit, s)
    values = (mech.gravity_forces, Qdot)
    e, (Jq, Jv, Ja, Jj) = unit.evaluate(*blocks, params=values)
    lin = D.forward_dynamics_jacobians(mech, s["q"], s["v"])
    np.testing.assert_allclose(e, s["j"] - (lin.da_dq @ s["v"] + lin.da_dv @ s["a"] + lin.da_dQ @ Qdot),
                               rtol=1e-9, atol=1e-9)
    for i, J in ((2, Ja), (3, Jj)):
        Jn = fd_jacobian(unit, blocks, i, params=values)
        assert np.abs(J - Jn).max() <= 1e-6 * max(1.0, np.abs(Jn).max())
    np.testing.assert_array_equal(Jq, 0.0)
    np.testing.assert_allclose(Jv, -lin.da_dq, rtol=1e-9, atol=1e-9)
    # selected rows (independent formulation) and the effort slot
    if len(mech.actuated):
        z = [mech.n - 1]
        u2 = F.Jerk(mech, select=z, efforts=True)
        tau = s["tau"]
        e2, J2 = u2.evaluate(s["q"], s["v"], s["a"], s["zj"][:1], tau, params=(mech.gravity_forces, np.zeros(mech.n)))
        Q = mech.gravity_forces.copy()
        Q[mech.actuated] += tau
        lin2 = D.forward_dynamics_jacobians(mech, s["q"], s["v"], Q)
        np.testing.assert_allclose(e2, s["zj"][:1] - (lin2.da_dq @ s["v"] + lin2.da_dv @ s["a"])[z], atol=1e-9)
        assert [J.shape for J in J2] == [(1, mech.n)] * 3 + [(1, 1), (1, len(mech.actuated))]


def test_hermite_velocity_integrator(mech):
    """The jerk-free hermite velocity integrator is `HermiteIntegrator` on (q̇, q̈, j) with j = `Jerk`'s
    j_pred at each end; exact q̈ blocks, documented approximation elsewhere; with ``lin_prev`` the previous
    end's matrices come from that point (the previous step's linear model of its jerk)."""
    rng = np.random.default_rng(12)
    s = random_state(mech, rng)
    n, h = mech.n, 1e-3
    x0 = {k: s[k] + 0.01 * rng.standard_normal(n) for k in ("q", "v", "a")}
    x1 = {k: s[k] for k in ("q", "v", "a")}
    Q0, Q1 = mech.gravity_forces + rng.standard_normal(n), mech.gravity_forces + rng.standard_normal(n)
    Qd0, Qd1 = rng.standard_normal(n), rng.standard_normal(n)
    unit = F.HermiteVelocityIntegrator(mech, h)
    values = (Q0, Q1, Qd0, Qd1, None)
    blocks = [x0["q"], x0["v"], x0["a"], x1["q"], x1["v"], x1["a"]]
    e, Js = unit.evaluate(*blocks, params=values)

    def j_pred(x, Q, Qd, at=None):
        lin = D.forward_dynamics_jacobians(mech, *(at or (x["q"], x["v"])), Q)
        return lin.da_dq @ x["v"] + lin.da_dv @ x["a"] + lin.da_dQ @ Qd, lin

    j0, l0 = j_pred(x0, Q0, Qd0)
    j1, l1 = j_pred(x1, Q1, Qd1)
    herm = F.HermiteIntegrator("v", "a", "j", n, h)
    np.testing.assert_allclose(e, herm.error(x0["v"], x1["v"], x0["a"], x1["a"], j0, j1, params=()), rtol=1e-9,
                               atol=1e-12)
    for i in (2, 5):                                   # exact in q̈
        Jn = fd_jacobian(unit, blocks, i, params=values)
        assert np.abs(Js[i] - Jn).max() <= 1e-6 * max(1.0, np.abs(Jn).max())
    c = h * h / 12.0
    np.testing.assert_array_equal(Js[0], 0.0)
    np.testing.assert_array_equal(Js[3], 0.0)
    np.testing.assert_allclose(Js[1], -np.eye(n) - c * l0.da_dq, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(Js[4], np.eye(n) + c * l1.da_dq, rtol=1e-9, atol=1e-12)
    # previous end on the linear model built at another point: matrices there, q̇ and q̈ of the state
    qb, vb = x0["q"] + 1e-3, x0["v"] - 1e-3
    values = (Q0, Q1, Qd0, Qd1, (qb, vb, None))
    e2, Js2 = unit.evaluate(*blocks, params=values)
    j0b, l0b = j_pred(x0, Q0, Qd0, at=(qb, vb))
    np.testing.assert_allclose(e2, herm.error(x0["v"], x1["v"], x0["a"], x1["a"], j0b, j1, params=()), rtol=1e-9,
                               atol=1e-12)
    np.testing.assert_allclose(Js2[2], -0.5 * h * np.eye(n) - c * l0b.da_dv, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(fd_jacobian(unit, blocks, 2, params=values), Js2[2], rtol=1e-6, atol=1e-9)
    # efforts as variables: Qᵢ = Q_known + E τᵢ, zero τ blocks
    if len(mech.actuated):
        ue = F.HermiteVelocityIntegrator(mech, h, efforts=True)
        tau0, tau1 = rng.standard_normal(len(mech.actuated)), s["tau"]
        g = mech.gravity_forces
        e3, J3 = ue.evaluate(*blocks, tau0, tau1, params=(g, g, None, None, None))
        Qa, Qb = g.copy(), g.copy()
        Qa[mech.actuated] += tau0
        Qb[mech.actuated] += tau1
        ref = unit.error(*blocks, params=(Qa, Qb, None, None, None))
        np.testing.assert_allclose(e3, ref, rtol=1e-12, atol=1e-12)
        assert [J.shape for J in J3[6:]] == [(n, len(mech.actuated))] * 2 and not np.any(J3[6]) and not np.any(J3[7])


def test_lean_dynamics_equals_core(mech):
    rng = np.random.default_rng(11)
    for _ in range(3):
        s = random_state(mech, rng)
        Q = mech.gravity_forces + rng.standard_normal(mech.n)
        ref = D.forward_dynamics_jacobians(mech, s["q"], s["v"], Q)
        ctx = EvalContext(mech)
        lin = ctx.dynamics(s["q"], s["v"], Q)
        for name in ("a", "da_dq", "da_dv", "da_dQ", "Phi_q", "Phi_q_dot"):
            A, B = getattr(lin, name), getattr(ref, name)
            assert np.abs(A - B).max() <= 1e-9 * max(1.0, np.abs(B).max()), name
        assert np.abs(EvalContext(mech).acceleration(s["q"], s["v"], Q) - ref.a).max() <= 1e-9 * max(1, np.abs(ref.a).max())


def test_context_sharing_gives_the_same_numbers():
    mech = load_mechanism("mechanisms/four_bar_crank.yaml")
    rng = np.random.default_rng(5)
    s = random_state(mech, rng)
    ctx = EvalContext(mech)
    for unit in (F.PositionConstraints(mech), F.VelocityConstraints(mech), F.ForwardDynamics(mech), F.Jerk(mech)):
        blocks = blocks_for(unit, s)
        e1, J1 = unit.evaluate(*blocks, params=unit.own_params(), ctx=ctx)
        e2, J2 = unit.evaluate(*blocks, params=unit.own_params())
        np.testing.assert_array_equal(e1, e2)
        for a, b in zip(J1, J2):
            np.testing.assert_array_equal(a, b)


def test_hermite_integrator_is_exact_for_quartics():
    h, t0 = 0.01, 0.3
    t1 = t0 + h
    c = np.array([0.3, -1.2, 0.7, 2.0, -1.5])     # x(t) = Σ c_k t^k, degree 4
    x = np.polynomial.Polynomial(c)
    unit = F.HermiteIntegrator("q", "v", "a", 1, h)
    vals = [np.array([p(tt)]) for tt, p in ((t0, x), (t1, x), (t0, x.deriv()), (t1, x.deriv()),
                                               (t0, x.deriv(2)), (t1, x.deriv(2)))]
    assert abs(unit.error(*vals, params=())[0]) < 1e-14
    trap = F.TrapezoidalIntegrator("q", "v", 1, h)
    assert abs(trap.error(*vals[:4], params=())[0]) > 1e-8       # the trapezoid is not


def test_sensor_values():
    mech = load_mechanism("mechanisms/four_bar_crank.yaml")
    rng = np.random.default_rng(2)
    s = random_state(mech, rng)
    for b in range(3):
        g = F.Gyroscope(mech, b)
        assert g.error(s["q"], s["v"], params=(0.0,))[0] == pytest.approx(mech.body_angular_rate(b, s["q"], s["v"]),
                                                                          rel=1e-12)
    c = mech.coordinate_index("crank")
    enc = F.Encoder(mech, c)
    q = s["q"].copy()
    q[c] = 0.25 + 4 * math.pi + 1e-3
    assert enc.error(q, params=(0.25,))[0] == pytest.approx(1e-3)
    q[c] = 0.25 - 2 * math.pi - 1e-3
    assert enc.error(q, params=(0.25,))[0] == pytest.approx(-1e-3)
    assert F.Encoder(mech, "crank", 0.25).coordinate == c
    obs = F.ObservedCoordinate(mech, "y2", "velocity")
    assert obs.slots == ("v",) and obs.error(s["q"], params=(0.5,))[0] == pytest.approx(s["q"][3] - 0.5)
    with pytest.raises(ValueError):
        F.ObservedCoordinate(mech, 99)


def every_unit(mech, s, rng):
    """`all_units` and the units it leaves out (the jerk, the hermite velocity integrator with a linearization point
    of j₀, an encoder where the mechanism declares none): every factor class of `mbfg_ros.factors` (those of the
    actuators where the mechanism has one)."""
    lin_prev = (s["q"] + 0.01, s["v"], None)
    units = all_units(mech, s, rng) + [F.Jerk(mech, Qdot=rng.standard_normal(mech.n)),
                                       F.HermiteVelocityIntegrator(mech, 1e-3, lin_prev=lin_prev),
                                       F.Encoder(mech, 0, 0.2)]
    classes = {c for c in vars(F).values() if isinstance(c, type) and issubclass(c, F.Factor) and c is not F.Factor}
    missing = classes - {type(u) for u in units} - ({F.IdentifiedDynamics, F.RandomWalk} if not mech.actuated.size
                                                    else set())
    assert not missing, f"factor classes not constructed here: {sorted(c.__name__ for c in missing)}"
    return units


def _mutable_parts(value, where):
    """Where `value` (an attribute of a unit, or an item of one) can be changed: writable arrays, mutable
    containers."""
    if isinstance(value, np.ndarray):
        return [] if not value.flags.writeable else [where]
    if isinstance(value, (list, dict, set, bytearray)):
        return [where]
    if isinstance(value, tuple):
        return [part for i, item in enumerate(value) for part in _mutable_parts(item, f"{where}[{i}]")]
    return []


def test_units_are_deeply_immutable(mech):
    """Every attribute of every unit is fixed at construction: assigning or deleting one raises, and no array it
    holds (parameters, sigmas, constant Jacobians, index arrays) can be written; the caller's arrays stay its own."""
    rng = np.random.default_rng(5)
    s = random_state(mech, rng)
    for unit in every_unit(mech, s, rng):
        names = [name for name in vars(unit) if name != "_frozen"]
        assert "sigmas" in names and not _mutable_parts(type(unit).sigmas, "class sigmas")
        for name in names:
            with pytest.raises(AttributeError, match="immutable"):
                setattr(unit, name, getattr(unit, name))
            assert not _mutable_parts(getattr(unit, name), name), (unit.name, name)
        with pytest.raises(AttributeError, match="immutable"):
            unit.something_new = 1.0
        with pytest.raises(AttributeError, match="immutable"):
            del unit.dim
        with pytest.raises(ValueError, match="read-only"):
            unit.sigmas[0] = 1.0
    mean, select = np.zeros(2), np.array([1, 0])
    F.Prior("q", mean, 0.1, select=select, size=mech.n)
    assert mean.flags.writeable and select.flags.writeable


def test_units_take_their_per_step_values_explicitly(mech):
    """Every evaluation is given its step's values (``params``, () for a unit without any): without them it fails,
    never falling back on the values given at construction (the unit's defaults, `own_params`); other values give
    other numbers, the unit unchanged."""
    rng = np.random.default_rng(5)
    s = random_state(mech, rng)
    for unit in every_unit(mech, s, rng):
        blocks = blocks_for(unit, s)
        for evaluation in (unit.evaluate, unit.error, unit.whitened):
            with pytest.raises(TypeError, match="params"):
                evaluation(*blocks)
        if not unit.params:
            continue
        own = unit.own_params()
        e0 = unit.error(*blocks, params=own)
        other = tuple(None if name == "lin_prev" or v is None else v + 0.25 for name, v in zip(unit.params, own))
        assert not np.array_equal(unit.error(*blocks, params=other), e0), unit.name
        np.testing.assert_array_equal(unit.error(*blocks, params=unit.own_params()), e0)
        assert unit.checked_params(list(other)) == other
        with pytest.raises(ValueError, match="per-step values given for the parameters"):
            unit.checked_params(other[:-1])


def test_default_sigmas_come_from_table_2():
    mech = load_mechanism("mechanisms/four_bar.yaml")
    s = default_sigmas()
    assert np.all(F.PositionConstraints(mech).sigmas == s["position_constraints"])
    assert np.all(F.TrapezoidalIntegrator("q", "v", 4, 1e-3).sigmas == s["integrator"])
    assert np.all(F.ForwardDynamics(mech).sigmas == s["dynamics"])
    assert np.all(F.SoftEquality("q", 4).sigmas == s["soft_equality"])
    assert np.all(F.VelocityConstraints(mech, sigma=0.5).sigmas == 0.5)
    with pytest.raises(ValueError):
        F.PositionConstraints(mech, sigma=0.0)
    # every noise parameter is described, with its units (the node's parameter descriptions)
    assert set(noise_descriptions()) == set(s)


# -- adapters ---------------------------------------------------------------------------------
def _keys(unit):
    names = sorted(set(unit.slots))
    return [gtsam.symbol("k", names.index(s)) for s in unit.slots]


def test_custom_factor_adapter_matches_unit():
    mech = load_mechanism("mechanisms/four_bar_crank.yaml")
    rng = np.random.default_rng(4)
    s = random_state(mech, rng)
    for unit in all_units(mech, s, rng) + [F.Jerk(mech, Qdot=np.ones(mech.n))]:
        blocks = blocks_for(unit, s)
        keys = _keys(unit)
        values = gtsam.Values()
        for k, b in zip(keys, blocks):
            if not values.exists(k):
                values.insert(k, b)
        cf = custom_factor(unit, keys, unit.own_params())
        ew, Jw = unit.whitened(*blocks, params=unit.own_params())
        np.testing.assert_allclose(cf.whitenedError(values), ew, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(cf.unwhitenedError(values), unit.error(*blocks, params=unit.own_params()),
                                   rtol=1e-12, atol=1e-12)
        A, b = gtsam.JacobianFactor(cf.linearize(values)).jacobian()
        np.testing.assert_allclose(A, np.hstack(Jw), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(b, -ew, rtol=1e-12, atol=1e-12)
        assert cf.error(values) == pytest.approx(0.5 * ew @ ew, rel=1e-12, abs=1e-300)
    # the adapter holds the unit, which cannot change afterwards, and its own copy of the step's values (the
    # unit's defaults play no part)
    unit = F.Encoder(mech, mech.coordinate_index("crank"), 0.7, 1e-3)
    key = gtsam.symbol("q", 0)
    reading = [0.1]
    cf = custom_factor(unit, [key], reading)
    reading[0] = 0.5
    with pytest.raises(AttributeError, match="immutable"):
        unit.value = 0.5
    with pytest.raises(ValueError, match="per-step values"):
        custom_factor(unit, [key], ())
    values = gtsam.Values()
    values.insert(key, s["q"])
    d = s["q"][mech.coordinate_index("crank")] - 0.1
    d -= 2 * math.pi * math.floor((d + math.pi) / (2 * math.pi))
    assert cf.whitenedError(values)[0] == pytest.approx(d / 1e-3)


def test_stacked_linear_adapter_matches_units():
    mech = load_mechanism("mechanisms/four_bar_crank.yaml")
    n = mech.n
    rng = np.random.default_rng(8)
    s = random_state(mech, rng)
    layout = StateLayout([("q", n), ("v", n), ("a", n), ("j", n), ("tau", 1)])
    units = [F.TrapezoidalIntegrator("q", "v", n, 1e-3), F.HermiteIntegrator("v", "a", "j", n, 1e-3),
             F.SoftEquality("tau", 1, 2.0), F.SoftEquality("q", n, offset=np.full(n, 0.01)),
             F.PositionConstraints(mech), F.VelocityConstraints(mech), F.InverseDynamics(mech),
             F.Jerk(mech, efforts=True), F.Encoder(mech, n - 1, 0.3, 1e-3), F.Gyroscope(mech, 1, 0.2, 0.01),
             F.Prior("tau", [1.0], 0.5)]
    x_cur = layout.pack(q=s["q"], v=s["v"], a=s["a"], j=s["j"], tau=s["tau"])
    x_prev = x_cur - 0.01 * rng.standard_normal(layout.dim)
    A0, A1, r = linearize_step(units, layout, x_prev, x_cur, params=[u.own_params() for u in units])
    # the same rows, unit by unit
    row = 0
    vp, vc = layout.views(x_prev), layout.views(x_cur)
    for u in units:
        blocks = [vp[nm[:-5]] if nm.endswith("_prev") else vc[nm] for nm in u.slots]
        ew, Jw = u.whitened(*blocks, params=u.own_params())
        np.testing.assert_allclose(r[row:row + u.dim], ew, rtol=1e-12, atol=1e-12)
        for nm, J in zip(u.slots, Jw):
            which, name, cols = layout.slot_map[nm]
            np.testing.assert_allclose((A1 if which else A0)[row:row + u.dim, cols], J, rtol=1e-12, atol=1e-12)
        row += u.dim
    # StepModel (static units stacked once, the others evaluated) gives the same linearization
    model = StepModel(layout, units)
    params = model.params_of({})
    B0, B1, r2 = model.linearize(x_prev, x_cur, params=params)
    order = [units.index(u) for u in model.static_units + model.dynamic_units]
    offsets = np.cumsum([0] + [u.dim for u in units])
    perm = np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in order])
    np.testing.assert_allclose(B0, A0[perm], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(B1, A1[perm], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(r2, r[perm], rtol=1e-12, atol=1e-12)
    # the relinearization check only looks at the nonlinear rows
    assert {u.name for u in model.check_units} == {"position_constraints", "velocity_constraints",
                                                     "inverse_dynamics", "encoder(crank)",
                                                     "gyroscope(body 1)"}
    np.testing.assert_allclose(model.check_residual(x_prev, x_cur, params=params), r2[model.check_rows], rtol=1e-12,
                               atol=1e-12)


def test_default_densities_follow_the_mechanisms_scale(crank, robot):
    """The densities and start-up priors that depend on the mechanism's size are the crank four-bar's measured
    values there, and scale with τ_c = M·g·R and T = √(R/g) elsewhere (a 4× heavier mechanism of the same size:
    16× the effort densities, 4× the effort priors, the same acceleration density)."""
    import dataclasses
    from mbfg_ros.factors.noise import SCALED
    from mbfg_ros.model.plausibility import mechanism_scale
    plain = default_sigmas()
    at_crank = default_sigmas(crank.spec)
    assert all(at_crank[k] == pytest.approx(plain[k], rel=1e-12) for k in plain)
    spec = crank.spec
    heavy = dataclasses.replace(spec, bodies=tuple(dataclasses.replace(b, mass=4 * b.mass) for b in spec.bodies))
    scaled = default_sigmas(heavy)
    for k, (pe, pt) in SCALED.items():
        assert scaled[k] == pytest.approx(plain[k] * 4.0 ** pe, rel=1e-12), k
    assert {k: v for k, v in scaled.items() if k not in SCALED} == {k: v for k, v in plain.items() if k not in SCALED}
    effort, time = mechanism_scale(robot.spec)
    ref_effort, ref_time = mechanism_scale(spec)
    assert default_sigmas(robot.spec)["effort_density"] == pytest.approx(
        plain["effort_density"] * (effort / ref_effort) ** 2 * (ref_time / time) ** 3)
