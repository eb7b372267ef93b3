"""The tuner's fast path (mbfg_ros.tuning.filter_bank, likelihood.newton_search): the bank of K filters gives each
candidate the likelihood one `ReducedEKF` gives it (four-bar and double pendulum, both modes, missing readings,
jittered stamps), its closed-form model Jacobian equals the single filter's central differences, the series
discretization equals the Van Loan exponential, a failing candidate fails alone, and the batched Newton search
finds the maximum Nelder–Mead finds on the same likelihood (the old search), within a small part of its 1σ."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.linalg import expm
from scipy.optimize import minimize

from mbfg_ros.estimation.reduced_ekf import DISCRETIZATION_ORDER, ReducedEKF, discretize, encoded_acceleration_noise
from mbfg_ros import native
from mbfg_ros.tuning.filter_bank import ReducedEKFBank
from mbfg_ros.tuning.likelihood import (FAILED, STEP_TOLERANCE, Recording, encoder_layout, fit, initial_values, log_likelihoods,
                                        SENSOR_SIGMA_DECADES_BELOW, newton_search, settling_steps,
                                        single_log_likelihood, std_from_hessian)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO / "bench"))

from test_tuning import synthetic  # noqa: E402


def dfki_recording(seconds: float, decimate: int = 5):
    """Every `decimate`-th row of the A.0 system-identification run's first seconds as the tuner reads it (the
    mechanism's coordinates, actuators and encoders are DFKI's joints: positions and commands as recorded)."""
    import real_hardware as rh
    r = rh.load_recording("design_A.0__20220815__sys_id__trajectory_00").cut(seconds)
    mech = rh.design_mechanism("A.0")
    names, coords, _ = encoder_layout(mech)
    rows = slice(None, None, decimate)
    return mech, Recording(r.t[rows], r.q[rows], names, coords, r.tau_con[rows], "A0")


def candidates(mech, mode):
    """Three parameter sets a decade apart in each value (the mode's densities, acceleration density, σ)."""
    base = initial_values(mech)
    out = []
    for k, f in enumerate((0.1, 1.0, 10.0)):
        v = dict(base)
        v["effort_density" if mode == "estimation" else "disturbance_density"] *= f
        v["acceleration_density"] *= 1.0 / f
        v["disturbance_time_constant"] = (0.3, 1.0, 3.0)[k]
        for key in v:
            if key.startswith("sensor_sigmas."):
                v[key] *= (1.0, 3.0, 0.5)[k]
        out.append(v)
    return out


@pytest.mark.parametrize("mode", ["estimation", "fused"])
def test_the_bank_gives_each_candidate_the_single_filters_likelihood_four_bar(crank, mode):
    t, y, u = synthetic(crank, mode, 300.0 if mode == "fused" else 3.0, 3e-4, 1.0, seed=3)
    names, coords, _ = encoder_layout(crank)
    keep = np.ones(t.size, bool)
    keep[7::5] = False                                       # jittered stamps: every 5th sample dropped
    y = y.copy()
    y[11::9] = np.nan                                        # and missing readings
    rec = Recording(t[keep], y[keep, None], names, coords, u[keep], "four-bar")
    values = candidates(crank, mode)
    bank = log_likelihoods(crank, rec, mode, values)
    single = np.array([single_log_likelihood(crank, rec, mode, v) for v in values])
    assert np.all(np.isfinite(single))
    assert bank == pytest.approx(single, rel=1e-9, abs=1e-6)


@pytest.mark.parametrize("mode", ["estimation", "fused"])
def test_the_bank_gives_each_candidate_the_single_filters_likelihood_double_pendulum(mode):
    """With the joints' friction (a Coulomb term steep near rest) the single filter's central differences
    differ from the closed-form Jacobian by more than rounding: ~1e-6 of log-likelihood, far below the search's
    0.005."""
    mech, rec = dfki_recording(1.0)
    rec.readings[5, 1] = np.nan
    values = candidates(mech, mode)
    bank = log_likelihoods(mech, rec, mode, values)
    single = np.array([single_log_likelihood(mech, rec, mode, v) for v in values])
    assert np.all(np.isfinite(single))
    assert bank == pytest.approx(single, rel=1e-9, abs=1e-4)


@pytest.mark.parametrize("fused", [False, True])
def test_the_closed_form_jacobian_equals_the_single_filters_central_differences(fused):
    """At a moving state of the double pendulum (rates, efforts, efforts' rates nonzero), the bank's ∂f/∂x
    (chain rule through the pose) against ReducedEKF._jacobian (central differences of the model)."""
    mech, rec = dfki_recording(0.5)
    ekf = ReducedEKF(mech, rec.coordinates, rec.dt, 1e-4, 10.0, fused=fused, time_constant=0.5 if fused else math.inf)
    bank = ReducedEKFBank(mech, rec.coordinates, [[1e-4, 1e-4]], [10.0], fused=fused,
                          time_constant=0.5 if fused else math.inf)
    for k in range(20):
        ekf.step(rec.readings[k], rec.commands[k], rec.t[k] - rec.t[max(k - 1, 0)])
        bank.step(rec.readings[k], rec.commands[k], rec.t[k] - rec.t[max(k - 1, 0)])
    x = ekf.x + np.r_[0.0, 0.0, 1.5, -2.0, 0.3, -0.2, 4.0, -3.0]
    command = np.array([0.4, -0.1])
    ekf._command = command
    bank.x, bank._command = x[None].copy(), command[None]
    bank.pose, bank.pose_jacobian, bank.basis, _ = bank.model.positions(x[None, :2], bank.pose, bank.basis)
    ekf.model.q_guess = bank.pose[0].copy()
    closed, rates = bank._jacobian(bank.x, bank._command)
    differences = ekf._jacobian(x, command)
    assert closed[0] == pytest.approx(differences, rel=1e-6, abs=1e-6 * np.abs(differences).max())
    # the linearization's ẋ is the Runge–Kutta step's first stage: the model's ẋ at x, its pose solved anew
    assert rates[0] == pytest.approx(ekf._f(x, command, bank.pose[0]), rel=1e-12, abs=1e-12)
    assert rates == pytest.approx(bank._f_solving(bank.x, bank._command), rel=1e-12, abs=1e-12)


def _reference_noise(bank):
    """The bank's noise densities with the z̈ block each filter's pose gives (encoded_acceleration_noise, in
    numpy), as the compiled step sets it."""
    W, d = bank.noise.copy(), bank.d
    for k in range(bank.K):
        W[k, d:2 * d, d:2 * d] = encoded_acceleration_noise(bank.mech, bank.pose[k], bank.model.z,
                                                            bank.acceleration_density[k])
    return W


def _reference_kalman_step(bank, A, y, dt, P, x, log_likelihood, W=None):
    """The covariance prediction and the readings' update of every filter of `bank` in numpy (what the kernel's
    kalman_step does per filter): (P, x, log-likelihood) after it."""
    K, nx = P.shape[0], P.shape[1]
    F, Qd = discretize(A, bank.noise if W is None else W, dt)
    P = F @ P @ np.swapaxes(F, 1, 2) + Qd
    read = np.nonzero(np.isfinite(y))[0]
    P_rx = P[:, read, :]
    R = bank.R[:, read[:, None], read]
    S = P_rx[:, :, read] + R
    innovation = y[read] - x[:, read]
    _, logdet = np.linalg.slogdet(S)
    white = np.linalg.solve(S, innovation[:, :, None])[:, :, 0]
    log_likelihood = log_likelihood - 0.5 * (np.einsum("ki,ki->k", innovation, white) + logdet
                                             + read.size * math.log(2.0 * math.pi))
    gain = np.swapaxes(np.linalg.solve(S, P_rx), 1, 2)
    x = x + np.einsum("kir,kr->ki", gain, innovation)
    I_KH = np.broadcast_to(np.eye(nx), (K, nx, nx)).copy()
    I_KH[:, :, read] -= gain
    return I_KH @ P @ np.swapaxes(I_KH, 1, 2) + gain @ R @ np.swapaxes(gain, 1, 2), x, log_likelihood


@pytest.mark.parametrize("mode", ["estimation", "fused"])
def test_the_compiled_kalman_step_is_the_reference_update(mode):
    """The kernel's covariance half of a bank step against the numpy form above, with a reading missing."""
    mech, rec = dfki_recording(1.0)
    values = candidates(mech, mode)
    bank = ReducedEKFBank(mech, rec.coordinates, encoder_sigma=[[1e-3, 2e-3]] * len(values),
                          effort_density=[1.0 + k for k in range(len(values))], fused=mode == "fused",
                          acceleration_density=0.5)
    for k in range(20):
        bank.step(rec.readings[k], rec.commands[k] if rec.commands is not None else None, 1e-3)
    A, _ = bank._jacobian(bank.x, bank._command)
    for y in (rec.readings[20], np.array([rec.readings[20][0], np.nan])):
        P, x, ll = bank.P.copy(), bank.x.copy(), bank.log_likelihood.copy()
        want = _reference_kalman_step(bank, A, y, 1e-3, P, x, ll)
        native.module().kalman_step(A, bank.noise, 1e-3, DISCRETIZATION_ORDER, P, x, np.ascontiguousarray(y),
                                    bank.R, ll)
        for got, ref in zip((P, x, ll), want):
            assert got == pytest.approx(ref, rel=1e-9, abs=1e-12 * np.abs(ref).max())
        # the acceleration noise at each filter's pose, set by the kernel from the pose's tangents
        P, x, ll = bank.P.copy(), bank.x.copy(), bank.log_likelihood.copy()
        want = _reference_kalman_step(bank, A, y, 1e-3, P, x, ll, W=_reference_noise(bank))
        native.module().kalman_step(A, bank.noise, 1e-3, DISCRETIZATION_ORDER, P, x, np.ascontiguousarray(y),
                                    bank.R, ll, bank.acceleration_density, bank.basis)
        for got, ref in zip((P, x, ll), want):
            assert got == pytest.approx(ref, rel=1e-9, abs=1e-12 * np.abs(ref).max())
    assert not np.allclose(_reference_noise(bank), bank.noise)      # the block is not W's own


def _reference_deflected_kalman_step(bank, A, y, dt, P, x, b, log_likelihood):
    """The Kalman step over x' = (z + b, ż, e, ė, b) in numpy: the motion's A and noise extended by the
    deflection's −1/T_b and its noise and moved to x' by T: (z, …, b) ↦ (z + b, …, b); (P, x, b, log-likelihood)
    after it."""
    K, d, nx = bank.K, bank.d, bank.nx
    n1, tb = nx + d, bank.deflection_time_constant
    T, T_inv = np.eye(n1), np.eye(n1)
    T[:d, nx:], T_inv[:d, nx:] = np.eye(d), -np.eye(d)
    A1, W1 = np.zeros((K, n1, n1)), np.zeros((K, n1, n1))
    A1[:, :nx, :nx], W1[:, :nx, :nx] = A, _reference_noise(bank)
    A1[:, np.arange(nx, n1), np.arange(nx, n1)] = -1.0 / tb
    W1[:, np.arange(nx, n1), np.arange(nx, n1)] = bank.deflection_noise
    b = b * math.exp(-dt / tb)
    x1 = np.concatenate((x, b), axis=1)
    x1[:, :d] += b
    P, x1, log_likelihood = _reference_kalman_step(bank, T @ A1 @ T_inv, y, dt, P, x1, log_likelihood,
                                                   W=T @ W1 @ T.T)
    x = x1[:, :nx].copy()
    x[:, :d] -= x1[:, nx:]
    return P, x, x1[:, nx:], log_likelihood


def test_the_compiled_deflected_kalman_step_is_the_reference_update():
    """The kernel's Kalman step with the encoders' deflection against its numpy form, with a reading missing."""
    mech, rec = dfki_recording(1.0)
    bank = ReducedEKFBank(mech, rec.coordinates, encoder_sigma=[[1e-3, 2e-3]] * 3, effort_density=[1.0, 2.0, 3.0],
                          acceleration_density=[0.5, 0.05, 5.0], deflection_sigma=[1e-3, 3e-4, 3e-3])
    for k in range(20):
        bank.step(rec.readings[k], None, 1e-3)
    assert np.abs(bank.b).max() > 0
    A, _ = bank._jacobian(bank.x, bank._command)
    for y in (rec.readings[20], np.array([np.nan, rec.readings[20][1]])):
        P, x, b, ll = bank.P.copy(), bank.x.copy(), bank.b.copy(), bank.log_likelihood.copy()
        want = _reference_deflected_kalman_step(bank, A, y, 1e-3, P, x, b, ll)
        native.module().deflected_kalman_step(A, bank.noise, 1e-3, DISCRETIZATION_ORDER, P, x,
                                              np.ascontiguousarray(y), bank.R, ll, b, bank.deflection_time_constant,
                                              bank.deflection_noise, bank.acceleration_density, bank.basis)
        for got, ref in zip((P, x, b, ll), want):
            assert got == pytest.approx(ref, rel=1e-9, abs=1e-12 * np.abs(ref).max())


def test_a_singular_pose_tangent_fails_only_its_filter():
    """Tangents of no rank (a lost pose) give that filter NaN noise, hence a NaN log-likelihood; the others are
    untouched."""
    mech, rec = dfki_recording(1.0)
    bank = ReducedEKFBank(mech, rec.coordinates, encoder_sigma=[[1e-3, 2e-3]] * 2, effort_density=[1.0, 1.0],
                          acceleration_density=0.5)
    for k in range(5):
        bank.step(rec.readings[k], None, 1e-3)
    A, _ = bank._jacobian(bank.x, bank._command)
    basis = bank.basis.copy()
    basis[1] = 0.0
    P, x, ll = bank.P.copy(), bank.x.copy(), bank.log_likelihood.copy()
    native.module().kalman_step(A, bank.noise, 1e-3, DISCRETIZATION_ORDER, P, x, np.ascontiguousarray(rec.readings[5]),
                                bank.R, ll, bank.acceleration_density, basis)
    assert math.isfinite(ll[0]) and math.isnan(ll[1])
    with pytest.raises(TypeError, match="9 or 11 arguments"):      # the density and the tangents come together
        native.module().kalman_step(A, bank.noise, 1e-3, DISCRETIZATION_ORDER, P, x,
                                    np.ascontiguousarray(rec.readings[5]), bank.R, ll, bank.acceleration_density)


def test_the_series_discretization_equals_the_van_loan_exponential():
    rng = np.random.default_rng(0)
    n, h = 8, 6e-3
    for scale in (0.1, 30.0, 300.0):              # no scaling, a few and many doublings
        A = scale * rng.standard_normal((3, n, n))
        B = rng.standard_normal((3, n, n))
        W = 1e4 * B @ np.swapaxes(B, 1, 2)
        M = np.zeros((3, 2 * n, 2 * n))
        M[:, :n, :n], M[:, :n, n:], M[:, n:, n:] = -A, W, np.swapaxes(A, 1, 2)
        E = expm(M * h)
        F_ref = np.swapaxes(E[:, n:, n:], 1, 2)
        Q_ref = F_ref @ E[:, :n, n:]
        F, Q = discretize(A, W, h)
        assert np.abs(F - F_ref).max() <= 1e-11 * np.abs(F_ref).max()
        assert np.abs(Q - Q_ref).max() <= 1e-11 * np.abs(Q_ref).max()
        F1, Q1 = discretize(A[1], W[1], h)         # one matrix as the single filter calls it
        assert np.abs(F1 - F_ref[1]).max() <= 1e-11 * np.abs(F_ref[1]).max()
        F2, Q2 = discretize(A[1], W, h)            # one A over a stack of noises: one F
        assert F2.shape == (n, n) and np.abs(Q2[1] - Q_ref[1]).max() <= 1e-11 * np.abs(Q_ref[1]).max()


def test_a_failing_candidate_fails_alone(crank):
    """An encoder σ of 1e200 (its variance overflows) fails that filter (−inf) and leaves the others'
    likelihoods as they are alone."""
    t, y, u = synthetic(crank, "estimation", 3.0, 3e-4, 0.5, seed=3)
    names, coords, _ = encoder_layout(crank)
    rec = Recording(t, y[:, None], names, coords, None, "four-bar")
    good = candidates(crank, "estimation")
    bad = dict(good[0], **{"sensor_sigmas.crank": 1e200})
    together = log_likelihoods(crank, rec, "estimation", [good[0], bad, good[2]])
    alone = log_likelihoods(crank, rec, "estimation", [good[0], good[2]])
    assert together[1] == -math.inf
    assert together[[0, 2]] == pytest.approx(alone, rel=1e-12)


def test_newton_search_finds_the_minimum_of_a_curved_valley_in_few_batches():
    """A curved, non-quadratic valley (a Rosenbrock-like ridge plus an exponential wall, as the likelihood has
    for an encoder σ far too small), minimum at (1, −2, 0.5), scaled as a log-likelihood of a few thousand
    readings: found to the search tolerance from 2 decades off, the Hessian the analytic one, in batches of at most
    2n² + 1 + 8n points; a minimum outside the box ends on its bound."""
    target = np.array([1.0, -2.0, 0.5])
    batches = []

    def cost(p):
        u = p - target
        return 1e3 * (10.0 * (u[:, 1] - 0.5 * u[:, 0] ** 2) ** 2 + u[:, 0] ** 2 + np.exp(-2 * u[:, 2])
                      + 2 * u[:, 2] - 1.0)

    def costs(points):
        batches.append(len(points))
        return cost(points)

    x, H = newton_search(costs, target + np.array([-2.0, 2.0, 2.0]), target - 6, target + 6)
    assert x == pytest.approx(target, abs=STEP_TOLERANCE)
    u = x - target
    exact = 1e3 * np.array([[20.0 * (1.5 * u[0] ** 2 - u[1]) + 2.0, -20.0 * u[0], 0.0], [-20.0 * u[0], 20.0, 0.0],
                            [0.0, 0.0, 4.0 * math.exp(-2.0 * u[2])]])
    assert H == pytest.approx(exact, rel=1e-2, abs=1.0)
    assert len(batches) <= 25 and max(batches) <= 2 * 9 + 1 + 8 * 3
    lo = target - np.array([6.0, 6.0, 0.0])
    lo[2] = target[2] + 0.5
    x, _ = newton_search(lambda p: cost(p), target + 1.0, lo, target + 6)
    assert x[2] == pytest.approx(lo[2]) and x[:2] == pytest.approx(target[:2], abs=STEP_TOLERANCE)


def test_the_readings_before_the_filter_settles_are_not_scored(crank):
    """The likelihood sums the innovations from the filter's `settling_steps`-th step: a 30σ outlier among the
    first readings moves it by about 1 (the filter's diffuse start absorbs it), the same outlier later costs its
    ~450 of log-likelihood; the bank and the single filter agree either way."""
    t, y, _ = synthetic(crank, "estimation", 3.0, 3e-4, 2.0, seed=5)
    names, coords, _ = encoder_layout(crank)
    assert settling_steps(t.size) == 100 and settling_steps(40) == 10
    values = initial_values(crank, {"effort_density": 3.0}, {"crank": 3e-4})

    def likelihood(k):
        readings = y[:, None].copy()
        if k is not None:
            readings[k] += 30 * 3e-4
        rec = Recording(t, readings, names, coords, None, "four-bar")
        bank = log_likelihoods(crank, rec, "estimation", [values])[0]
        assert bank == pytest.approx(single_log_likelihood(crank, rec, "estimation", values), rel=1e-9)
        return bank

    clean = likelihood(None)
    assert abs(likelihood(3) - clean) < 2.0
    assert clean - likelihood(300) > 300.0


def test_newton_search_ends_near_the_maximum_of_a_rugged_likelihood():
    """A quadratic with the curvatures of the acrobot's fit (1σ 0.007–0.045 decades) plus a ruggedness of ±0.3
    at every point (the filter nearly losing track): the search still ends within half a 1σ of the quadratic's
    minimum in each value, with the curvature's 1σ to within 25 %."""
    target = np.array([1.6, 0.4, -3.1, -3.2])
    H = np.diag([500.0, 3000.0, 12000.0, 22000.0])
    w = np.random.default_rng(1).normal(size=4) * 1e3

    def costs(p):
        u = p - target
        rugged = 2.0 * np.modf(np.abs(np.sin(p @ w)) * 43758.5453)[0] - 1.0
        return 0.5 * np.einsum("ki,ij,kj->k", u, H, u) + 0.3 * rugged

    x, H_fit = newton_search(costs, target + np.array([1.0, -1.0, 0.5, 0.5]), target - 6, target + 6)
    std = 1.0 / np.sqrt(np.diag(H))
    assert np.all(np.abs(x - target) < 0.5 * std), (x - target) / std
    assert std_from_hessian(H_fit) == pytest.approx(std, rel=0.25)


def test_an_encoder_sigma_is_searched_down_to_a_decade_below_its_given_value(crank):
    """Readings of σ 3e-4 and a given σ of 0.3 rad: the fit stops at a decade below the given value and says
    the bound held it (the readings ask for less)."""
    t, y, _ = synthetic(crank, "estimation", 3.0, 3e-4, 3.0, seed=8)
    names, coords, _ = encoder_layout(crank)
    rec = Recording(t, y[:, None], names, coords, None, "four-bar")
    initial = initial_values(crank, {"effort_density": 3.0}, {"crank": 0.3})
    result = fit(crank, rec, "estimation", initial, ["sensor_sigmas.crank"], max_steps=300)
    (sigma,) = result.fitted
    assert sigma.value == pytest.approx(0.3 * 10.0 ** -SENSOR_SIGMA_DECADES_BELOW, rel=0.03) and sigma.at_bound


def test_a_start_where_every_filter_fails_returns_no_curvature():
    x, H = newton_search(lambda p: np.full(len(p), FAILED), np.zeros(2), -np.ones(2), np.ones(2))
    assert np.all(np.isnan(H)) and x == pytest.approx(np.zeros(2))


def test_a_value_at_its_bound_or_flat_leaves_the_others_determined():
    """The 1σ from the curvature: a value the search's bound holds, or one flat or concave in its own direction,
    gets none, and the others get theirs given it (the DFKI acrobot's estimation fit: one encoder σ at its bound made
    every value "unknown" and its file's acceleration density the default, 8× under the fitted); the rest not
    positive definite: none at all."""
    H = np.array([[-1.0, 0.2, 0.0], [0.2, 4.0, 1.0], [0.0, 1.0, 1.0]])
    std = std_from_hessian(H)
    sub_std = np.sqrt(np.diag(np.linalg.inv(H[1:, 1:])))
    assert math.isnan(std[0]) and std[1:] == pytest.approx(sub_std)
    H[0, 0] = 9.0
    held = std_from_hessian(H, [True, False, False])
    assert math.isnan(held[0]) and held[1:] == pytest.approx(sub_std)
    assert np.all(np.isfinite(std_from_hessian(H)))
    assert np.all(np.isnan(std_from_hessian(np.array([[1.0, 2.0], [2.0, 1.0]]))))
    assert np.all(np.isnan(std_from_hessian(np.full((2, 2), math.nan))))


def test_the_curvature_is_kept_when_a_trial_ties_the_centre_its_stencil_came_after():
    """After a move to a trial point, the next batch is that point's stencil: where a trial further along the line
    ties it (a plateau) and the centre came back a rounding above its cost of the batch before (the same point in
    another batch may differ in the last digits), the centre's stencil gives its derivatives — not "every filter
    failed" (which took every value of the DFKI A0 sysid 01 fused fit for undetermined, its file's acceleration
    density for the default: 45× too small)."""
    calls = []

    def costs(points):
        f = np.where(points[:, 0] < 1.0, (points[:, 0] - 1.0) ** 2, 0.0) + (points[:, 1] - 0.5) ** 2
        if calls:
            f[0] += 1e-12                       # (the batch's own rounding of its first point)
        calls.append(len(points))
        return f

    x, H = newton_search(costs, np.zeros(2), -3.0 * np.ones(2), 3.0 * np.ones(2))
    assert np.all(np.isfinite(H)) and len(calls) >= 2, (H, calls)
    assert x[1] == pytest.approx(0.5, abs=0.05) and x[0] >= 1.0 - 0.05


@pytest.mark.parametrize("mode", ["estimation", "fused"])
def test_the_fit_is_the_maximum_nelder_mead_finds_on_the_same_likelihood(crank, mode):
    """The search `mbfg tune` used before (Nelder–Mead over log10 of the values, its options) on the same
    likelihood, one candidate at a time, and the batched Newton search reach the same maximum: within 0.2 of
    the fit's own 1σ in each value and 0.05 in log-likelihood (the crank four-bar, 3 s; the density and the
    encoder σ: its data have no acceleration noise, that density is undetermined).  The double pendulum's
    fit of every density and σ: bench/tune_speed.py --reference."""
    t, y, u = synthetic(crank, mode, 300.0 if mode == "fused" else 3.0, 3e-4, 3.0, seed=8)
    names, coords, _ = encoder_layout(crank)
    rec = Recording(t, y[:, None], names, coords, u if mode == "fused" else None, "four-bar")
    density = "effort_density" if mode == "estimation" else "disturbance_density"
    fitted_names = [density, "sensor_sigmas.crank"]
    initial = initial_values(crank)
    result = fit(crank, rec, mode, initial, fitted_names, max_steps=300)
    x_fit = np.log10([f.value for f in result.fitted])
    std = np.array([f.log10_std for f in result.fitted])
    assert np.all(np.isfinite(std)), result.fitted
    short = rec.decimated(300)

    def cost(x):
        v = dict(initial, **{n: 10.0 ** e for n, e in zip(fitted_names, x)})
        ll = log_likelihoods(crank, short, mode, [v])[0]
        return -ll if math.isfinite(ll) else FAILED

    x0 = np.log10([initial[n] for n in fitted_names])
    simplex = np.vstack([x0] + [x0 + e for e in np.eye(len(x0))])
    nm = minimize(cost, x0, method="Nelder-Mead",
                  options={"initial_simplex": simplex, "xatol": 0.005, "fatol": 0.01, "maxfev": 400})
    assert -nm.fun <= result.log_likelihood + 0.05
    assert np.all(np.abs(nm.x - x_fit) <= 0.2 * std), (nm.x, x_fit, std)
    assert std_from_hessian(np.diag(1.0 / std ** 2)) == pytest.approx(std)


def test_the_candidates_are_split_into_banks_of_consecutive_candidates():
    from mbfg_ros.tuning.likelihood import MAX_BANK_THREADS, MIN_BANK_SIZE, bank_groups
    assert bank_groups(31, threads=1) == [range(0, 31)]
    assert bank_groups(31, threads=2) == [range(0, 16), range(16, 31)]
    assert bank_groups(2 * MIN_BANK_SIZE - 1, threads=2) == [range(0, 2 * MIN_BANK_SIZE - 1)]   # too few for two
    many = bank_groups(1000, threads=64)
    assert len(many) == MAX_BANK_THREADS and many[0].start == 0 and many[-1].stop == 1000
    assert all(a.stop == b.start for a, b in zip(many[:-1], many[1:]))


@pytest.mark.parametrize("mode", ["estimation", "fused"])
def test_banks_in_threads_give_the_one_banks_likelihoods_exactly(mode):
    """The candidates of a batch split over banks in threads (their compiled loops without the GIL, side by
    side) get the same numbers, to the last digit, as in one bank: each filter's arithmetic is its own."""
    import mbfg_ros.tuning.likelihood as tl
    mech, rec = dfki_recording(1.0)
    rec.readings[5, 1] = np.nan
    base = candidates(mech, mode)
    values = [dict(v, deflection_sigma=s) for s in (1e-3, 3e-3) for v in base for _ in range(3)]  # 18 candidates
    one = log_likelihoods(mech, rec, mode, values)
    assert len(tl.bank_groups(len(values), 3)) == 2
    threaded = log_likelihoods(mech, rec, mode, values, threads=3)
    assert np.all(np.isfinite(one))
    np.testing.assert_array_equal(threaded, one)


def test_one_kernel_called_from_two_threads_at_once_gives_each_its_own_numbers(crank):
    """A kernel's methods that run their rows without the GIL hold its lock: threads calling one kernel at once
    (its work buffers shared) get what each gets alone (the four-bar: its poses solved by Gauss–Newton)."""
    import threading
    from mbfg_ros.tuning.filter_bank import ReducedModelBank
    _, coords, _ = encoder_layout(crank)
    model = ReducedModelBank(crank, coords)
    rng = np.random.default_rng(5)
    K, n, m, d = 64, crank.n, crank.constraints.m, len(coords)
    z = rng.uniform(-3, 3, (K, d))
    guess = rng.uniform(-1, 1, (K, n))

    def positions():
        q, J, R, ok = np.empty((K, n)), np.empty((K, m, n)), np.empty((K, n, d)), np.empty(K)
        model.kernel.reduced_positions(z, guess, None, model.z_index, model.free_index, 1e-12, 30, q, J, R, ok)
        return q, ok

    alone = positions()
    assert alone[1].sum() > K / 2                      # most poses solved: the rows do work
    results = [[] for _ in range(4)]

    def run(i):
        for _ in range(30):
            results[i].append(positions())
    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for q, ok in (r for each in results for r in each):
        np.testing.assert_array_equal(ok, alone[1])
        np.testing.assert_array_equal(q[ok == 1.0], alone[0][ok == 1.0])


def test_a_fit_in_threads_is_the_fit_in_one_bank():
    """However many threads `fit` is offered, it ends at the same values."""
    from mbfg_ros.tuning.likelihood import bank_threads, parameter_names
    mech, rec = dfki_recording(2.0, decimate=4)
    initial = initial_values(mech)
    names = parameter_names(mech, "fused", True, True, False)
    one = fit(mech, rec, "fused", initial, names, threads=1)
    offered = fit(mech, rec, "fused", initial, names, threads=2)
    assert one.threads == 1 and offered.threads == 2
    assert [f.value for f in offered.fitted] == [f.value for f in one.fitted]
    assert offered.log_likelihood == one.log_likelihood and offered.evaluations == one.evaluations
    few = candidates(mech, "fused")            # too few candidates for two banks
    assert bank_threads(mech, rec, len(few), 2) == 1


def test_a_one_degree_of_freedom_mechanism_is_fitted_in_one_bank(crank):
    """The four-bar's filters (4 states) cost less than a bank's Python: two threads would be slower."""
    from mbfg_ros.tuning.likelihood import bank_threads
    t, y, u = synthetic(crank, "fused", 300.0, 3e-4, 1.0, seed=3)
    names, coords, _ = encoder_layout(crank)
    rec = Recording(t, y[:, None], names, coords, u, "four-bar")
    assert bank_threads(crank, rec, 30, 4) == 1
    assert fit(crank, rec, "fused", initial_values(crank), ["disturbance_density"], threads=4).threads == 1
