"""The online fit of the effort density (`adapt_densities`, estimation/density_adaptation.py): it recovers
a known density, outliers do not move it, it does not drift without readings, a re-initialization keeps what
it learnt, and where it applies."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mbfg_ros.dynamics.constrained import forward_dynamics
from mbfg_ros.estimation import density_adaptation as DA
from mbfg_ros.estimation.config import EstimatorConfig
from mbfg_ros.estimation.estimator import FixedLagEstimator
from mbfg_ros.model.mechanism import load_mechanism
from mbfg_ros.sim.plant import Actuator, SimulatedPlant
from mbfg_ros.tuning.params_file import ParamsFileError, format_params, read_params
from test_tuning import DT, integrated_random_walk

TRUE_DENSITY = 3.0    # (N·m)²/s³ of the data's effort process: small, the torque stays near gravity's, the crank swings
SIGMA = 1e-4          # encoder σ [rad]


@pytest.fixture(scope="module")
def crank_mech():
    return load_mechanism("four_bar_crank")


@pytest.fixture(scope="module")
def motion(crank_mech):
    """12 s at 5 ms of the crank four-bar driven by an integrated random walk of TRUE_DENSITY (the estimator's
    effort model): it swings through about 4 rad.  The plant's trajectory and its encoder readings."""
    rng = np.random.default_rng(4)
    n = int(round(12.0 / DT)) + 1
    walk = integrated_random_walk(TRUE_DENSITY, n + 2, rng)
    plant = SimulatedPlant(crank_mech, dt=DT, seed=4, profile=lambda mech, t, q, v: walk[int(round(t / DT))][None],
                           actuator=Actuator.ideal(crank_mech), sensors=[])
    traj = plant.simulate(12.0)
    c = int(crank_mech.actuated[0])
    return traj, traj.q[:, c] + rng.normal(0.0, SIGMA, len(traj.t))


@pytest.fixture(scope="module")
def recording(motion):
    traj, y = motion
    return traj.t, y


def estimator(mech, start: float, **config) -> FixedLagEstimator:
    sigmas = {**EstimatorConfig().sigmas, "effort_density": start, "acceleration_density": 1e-9}
    return FixedLagEstimator(mech, EstimatorConfig(dt=DT, mode="estimation", sigmas=sigmas,
                                                   sensor_sigmas={"crank": SIGMA}, **config))


def run(est, t, y, start=0, stop=None, readings=lambda k, value: value):
    for k in range(start, len(t) if stop is None else stop):
        value = readings(k, y[k])
        est.step(float(t[k]), None, {} if value is None else {"crank": float(value)})


def test_the_likelihood_of_the_true_motion_peaks_at_the_true_density(crank_mech, motion):
    """The bank alone, around the plant's true motion (q, q̇, q̈, τ), from 30× off on either side: within 20 %."""
    traj, y = motion
    for start in (TRUE_DENSITY / 30.0, TRUE_DENSITY * 30.0):
        a = DA.DensityAdaptation(crank_mech, start, 1e-9, sensor_sigmas={"crank": SIGMA})
        for k, t in enumerate(traj.t):
            a.observe(float(t), {"crank": float(y[k])}, traj.q[k], traj.v[k], traj.a[k], traj.applied[k])
        assert abs(a.density / TRUE_DENSITY - 1.0) < 0.2, (start, a.density)
        assert a.rejected == 0 and a.counted > 0.9 * 12.0 / DA.BANK_INTERVAL


def test_recovers_a_known_density_from_either_side(crank_mech, recording):
    """In the estimator (the drift from its estimates), started 30× too low or too high, the density comes back
    within 30 % of the data's; the estimator uses it (its walk's density is the adapted one)."""
    t, y = recording
    for start in (TRUE_DENSITY / 30.0, TRUE_DENSITY * 30.0):
        est = estimator(crank_mech, start)
        run(est, t, y)
        adapted = est.density_adaptation.density
        assert abs(adapted / TRUE_DENSITY - 1.0) < 0.3, (start, adapted)
        assert abs(math.log10(est.sigmas["effort_density"] / adapted)) <= DA.CHANGE + 1e-9
        assert est.density_adaptation.rejected == 0
        assert est.fitted_densities() == {name: est.sigmas[name]
                                          for name in ("effort_density", "acceleration_density")}


def test_converges_within_a_few_seconds(crank_mech, recording):
    """After 3 s (a tenth of a second burn-in and a minimum of evidence included) the density is within a
    factor 3 of the data's, from 30× off (3 s of this slow swing say little: `mbfg tune` fits ± 30 % from 12 s)."""
    t, y = recording
    est = estimator(crank_mech, TRUE_DENSITY * 30.0)
    run(est, t, y, stop=int(round(3.0 / DT)) + 1)
    assert abs(math.log10(est.density_adaptation.density / TRUE_DENSITY)) < math.log10(3.0)


def test_outliers_do_not_move_it(crank_mech, recording):
    """The reading of every other bank step off by 0.5 rad (the estimator's own gate rejects it): the bank's gate
    refuses them and the density stays within 30 % of the clean data's.  (The encoder's σ is held: with a glitch
    in every block of 8 readings, the σ fit, `sigma_adaptation`, reads them as the sensor's scatter.)"""
    t, y = recording
    clean = estimator(crank_mech, 30.0, adapt_sensor_sigmas=False)
    run(clean, t, y)
    dirty = estimator(crank_mech, 30.0, adapt_sensor_sigmas=False)
    period = int(round(DA.BANK_INTERVAL / DT))          # estimator steps per bank step
    run(dirty, t, y, readings=lambda k, value: value + (0.5 if k % (2 * period) == period else 0.0))
    a = dirty.density_adaptation
    assert a.rejected >= 0.4 * len(t) / (2 * period)
    assert abs(a.density / clean.density_adaptation.density - 1.0) < 0.3
    assert a.grid[0] <= a.density <= a.grid[-1]


def test_does_not_drift_without_readings(crank_mech, recording):
    """Steps without readings change nothing of the fit: the same density and evidence after 2 s without."""
    t, y = recording
    est = estimator(crank_mech, 30.0)
    half = len(t) // 2
    run(est, t, y, stop=half)
    a = est.density_adaptation
    before = (a.density, a.evidence, a.counted, est.sigmas["effort_density"])
    run(est, t, y, start=half, stop=half + int(round(2.0 / DT)), readings=lambda k, value: None)
    assert (a.density, a.evidence, a.counted, est.sigmas["effort_density"]) == before


def test_keeps_what_it_learnt_over_a_reinitialization(crank_mech, recording):
    """A re-initialization and a reset restart the bank's filters (a burn-in) but keep the evidence: the
    density just after is the one before, and the fit goes on."""
    t, y = recording
    est = estimator(crank_mech, 30.0)
    third = len(t) // 3
    run(est, t, y, stop=third)
    a = est.density_adaptation
    before = a.density
    est.reinitialize()
    run(est, t, y, start=third, stop=third + 20)
    assert a.density == before
    est.reset()
    run(est, t, y, start=third + 20)
    assert abs(a.density / TRUE_DENSITY - 1.0) < 0.3


def test_where_it_applies(crank_mech):
    """Estimation and fused modes with adapt_densities and one encoder per degree of freedom; fixed otherwise."""
    assert estimator(crank_mech, 1e4).density_adaptation is not None
    assert estimator(crank_mech, 1e4, adapt_densities=False).density_adaptation is None
    fused = FixedLagEstimator(crank_mech, EstimatorConfig(dt=DT, mode="fused"))
    assert fused.density_adaptation is not None and fused.density_adaptation.time_constant == 1.0
    assert set(fused.fitted_densities()) == {"disturbance_density", "acceleration_density",
                                             "disturbance_time_constant"}
    # an undamped disturbance (T = ∞, configured) keeps it: only the densities are fitted
    undamped = FixedLagEstimator(crank_mech, EstimatorConfig(dt=DT, mode="fused", sigmas={
        **EstimatorConfig().sigmas, "disturbance_time_constant": math.inf}))
    assert set(undamped.fitted_densities()) == {"disturbance_density", "acceleration_density"}
    assert len(undamped.density_adaptation.time_constant_grid) == 1
    assert FixedLagEstimator(crank_mech, EstimatorConfig(dt=DT, mode="fused", adapt_densities=False)
                             ).fitted_densities() is None
    assert FixedLagEstimator(crank_mech, EstimatorConfig(dt=DT)).fitted_densities() is None   # forward dynamics
    # no encoders (and no actuators): nothing to fit, nothing to fit it with
    plain = load_mechanism("four_bar")
    assert DA.encoded_coordinates(plain) is None
    assert FixedLagEstimator(plain, EstimatorConfig(dt=DT, mode="estimation")).density_adaptation is None
    assert DA.encoded_coordinates(crank_mech)[0] == ["crank"]


def test_the_params_file_says_whether_to_adapt(crank_mech, tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(format_params("estimation", {"effort_density": 1234.0}, {}, adapt_densities=False))
    assert read_params(path, crank_mech)["adapt_densities"] is False
    path.write_text(format_params("estimation", {"effort_density": 1234.0}, {}))
    assert "adapt_densities" not in read_params(path, crank_mech)
    path.write_text("/**/mbfg_estimator:\n  ros__parameters:\n    adapt_densities: 3\n")
    with pytest.raises(ParamsFileError, match=r"p.yaml: .*adapt_densities must be true or false \(got 3\)"):
        read_params(path, crank_mech)


def bank_noise_by_quadrature(H, B, Sa, T=math.inf, n=20001, Tv=math.inf, shares=None):
    """∫₀ᴴ e^{A s} W e^{Aᵀ s} ds of the bank's state (z, ż, τ, τ̇) by the trapezoid rule on e^{A s} from scipy:
    W the efforts' noise on τ̇ (unit, or each actuator's share; and the damping −τ/T², −2τ̇/T), or the
    acceleration noise Sa on ż."""
    from scipy.linalg import expm
    d, na = B.shape
    nx = 2 * d + 2 * na
    A = np.zeros((nx, nx))
    A[:d, d:2 * d] = np.eye(d)
    A[d:2 * d, 2 * d:2 * d + na] = B
    A[2 * d:2 * d + na, 2 * d + na:] = np.eye(na)
    if math.isfinite(T):
        A[2 * d + na:, 2 * d:2 * d + na] = -np.eye(na) / T ** 2
        A[2 * d + na:, 2 * d + na:] = -2.0 * np.eye(na) / T
    elif math.isfinite(Tv):
        A[2 * d + na:, 2 * d + na:] = -np.eye(na) / Tv
    We = np.zeros((nx, nx))
    We[2 * d + na:, 2 * d + na:] = np.diag(np.ones(na) if shares is None else shares)
    Wa = np.zeros((nx, nx))
    Wa[d:2 * d, d:2 * d] = Sa
    s = np.linspace(0.0, H, n)
    E = np.stack([expm(A * u) for u in s])
    trapezoid = getattr(np, "trapezoid", None) or np.trapz   # numpy < 2.0 (ROS Jazzy's 1.26) has only trapz
    quad = [trapezoid(E @ W @ np.swapaxes(E, 1, 2), s, axis=0) for W in (We, Wa)]
    return expm(A * H), quad[0], quad[1]


@pytest.mark.parametrize("T, Tv, shares", [(math.inf, math.inf, None), (5.0, math.inf, None), (math.inf, 0.1, None),
                                           (math.inf, math.inf, (4.0, 0.25)), (5.0, math.inf, (0.1, 10.0))])
def test_the_bank_model_is_exact(T, Tv, shares):
    """The bank's transition and process noise over a step (each filter's effort density × the efforts' noise,
    each actuator's at its share, + its acceleration density × the acceleration noise), estimation (T = ∞; with
    a configured damping of the efforts' rate, T_v) and fused (damped disturbance), against the matrix
    exponential and a fine quadrature."""
    mech = load_mechanism("double_pendulum_a0")
    a = DA.DensityAdaptation(mech, 10.0, 0.1, time_constant=T, rate_time_constant=Tv, shares=shares)
    a.B = np.array([[0.7, -0.2], [0.1, 0.4]])
    a.Sa = np.array([[2.0, 0.3], [0.3, 0.5]])
    a._H = None
    H = 0.02
    F, _, Q = a._matrices(H)
    assert Q.shape == (a.K, 8, 8)
    assert a.K == len(a.grid) * len(a.acceleration_grid) * len(a.time_constant_grid)
    # fused: a time constant per filter along the grid's last axis (none shorter than the bound), estimation: ∞
    assert len(a.time_constant_grid) == (1 if math.isinf(T) else 1 + int(round(DA.TIME_CONSTANT_DECADES[0]
                                                                             / DA.TIME_CONSTANT_STEP)))
    references = {}
    for k in (0, a.K // 2, a.K - 1, a.K - 2):
        i, j, l, _, _ = np.unravel_index(k, a.shape)
        Tk = a.time_constant_grid[l]
        if Tk not in references:
            references[Tk] = bank_noise_by_quadrature(H, a.B, a.Sa, Tk, n=2001, Tv=Tv, shares=shares)
        F_ref, Qe, Qa = references[Tk]
        assert np.allclose(F if F.ndim == 2 else F[k], F_ref, rtol=1e-12, atol=1e-14)
        ref = a.grid[i] * Qe + a.acceleration_grid[j] * Qa
        assert np.allclose(Q[k], ref, rtol=1e-6, atol=1e-6 * np.abs(ref).max())


def test_unmodelled_accelerations_are_read_as_such(crank_mech):
    """The plant's effort carries, besides the integrated random walk, white noise (held over each 5 ms step):
    to the readings that is unmodelled acceleration.  The joint fit raises the acceleration density by decades
    over the fit on the clean motion and keeps the effort density near the walk's, where holding the
    acceleration density reads the noise as a faster-varying effort (a density 1000× the walk's)."""
    rng = np.random.default_rng(11)
    n = int(round(12.0 / DT)) + 1
    walk = integrated_random_walk(TRUE_DENSITY, n + 2, rng)
    white = rng.normal(0.0, 1.0, n + 2)        # N·m held per step: density 1² · 5 ms = 5e-3 (N·m)²/s
    plant = SimulatedPlant(crank_mech, dt=DT, seed=4,
                           profile=lambda mech, t, q, v: (walk + white)[int(round(t / DT))][None],
                           actuator=Actuator.ideal(crank_mech), sensors=[])
    traj = plant.simulate(12.0)
    c = int(crank_mech.actuated[0])
    y = traj.q[:, c] + rng.normal(0.0, SIGMA, len(traj.t))
    fits = {}
    for label, fit_acceleration in (("joint", True), ("held", False)):
        a = DA.DensityAdaptation(crank_mech, TRUE_DENSITY, 1e-6, sensor_sigmas={"crank": SIGMA},
                                 fit_acceleration=fit_acceleration)
        for k, t in enumerate(traj.t):
            # the drift as an estimator that knew the walk would see it: the model's acceleration under the walk
            qdd = forward_dynamics(crank_mech, traj.q[k], traj.v[k], crank_mech.generalized_forces(walk[k:k + 1]))
            a.observe(float(t), {"crank": float(y[k])}, traj.q[k], traj.v[k], qdd, walk[k:k + 1])
        fits[label] = a
    joint, held = fits["joint"], fits["held"]
    assert joint.acceleration_density > 100 * 1e-6
    assert abs(math.log10(joint.density / TRUE_DENSITY)) < math.log10(3.0), joint.density
    assert held.acceleration_density == 1e-6 and held.density > 100 * joint.density, held.density


def test_the_drift_integrals_are_exact_for_a_quadratic():
    """drift_weights: ∫ p and ∫ p (H − s) of a quadratic sampled at 4 of the 5 points of the step (the last,
    at H, left out), exactly; with one sample, a constant."""
    times, H = np.array([0.0, 0.005, 0.01, 0.015]), 0.02
    p = np.array([[1.5], [-2.0], [30.0]])                 # 1.5 − 2 s + 30 s²
    U = np.vander(times, 3, increasing=True) @ p
    W = DA.drift_weights(times, H)
    exact_1 = 1.5 * H - H ** 2 + 10.0 * H ** 3
    exact_2 = 1.5 * H ** 2 / 2 - 2.0 * H ** 3 / 6 + 30.0 * H ** 4 / 12
    assert np.allclose((W @ U).ravel(), [exact_2, exact_1], rtol=1e-12)
    assert np.allclose(DA.drift_weights(np.array([0.0]), H) @ np.array([[2.0]]), [[H * H], [2.0 * H]])


def test_sample_times_round_to_ns_as_python_does():
    """round_to_ns, the drift's sample times to 1 ns, is Python's round(x, 9): ties and near ties, the times of
    a 1-kHz run relative to a bank step, large, tiny and non-finite values."""
    rng = np.random.default_rng(0)
    values = list(rng.uniform(-1.0, 1.0, 20000)) + list(rng.uniform(-1e4, 1e4, 20000))
    values += [k * 1e-3 - j * 1e-3 for k in range(1000, 1100) for j in range(1000, 1025)]
    ties = [(k + 0.5) * 1e-9 for k in range(-3000, 3000)]
    values += ties + [math.nextafter(v, math.inf) for v in ties] + [math.nextafter(v, -math.inf) for v in ties]
    values += [0.0, 1e-300, 1e300, 8.7e3, 9e3, math.inf, -math.inf]
    assert [DA.round_to_ns(v) for v in values] == [round(v, 9) for v in values]
    assert math.isnan(DA.round_to_ns(math.nan))


def test_mbfg_estimate_adapts_unless_told_not_to(recording, tmp_path):
    """`mbfg estimate` fits the density by default; --no-adapt-densities and a file's
    `adapt_densities: false` keep it fixed (the same output as each other), an explicit option wins."""
    from mbfg_ros.cli.commands import main
    t, y = recording
    n = int(round(2.0 / DT)) + 1
    obs = tmp_path / "obs.csv"
    np.savetxt(obs, np.column_stack([t[:n], y[:n]]), delimiter=",", header="t,crank", comments="")
    params = tmp_path / "fixed.yaml"
    params.write_text(format_params("estimation", {"effort_density": 30.0}, {"crank": SIGMA},
                                    adapt_densities=False))
    adapting = tmp_path / "adapting.yaml"           # the same without the key: the default, adapt
    adapting.write_text(format_params("estimation", {"effort_density": 30.0}, {"crank": SIGMA}))
    outs = {}
    for label, extra in (("default", ["--params", str(adapting)]),
                         ("option", ["--params", str(adapting), "--no-adapt-densities"]),
                         ("file", ["--params", str(params)]),
                         ("file, option wins", ["--params", str(params), "--adapt-densities"])):
        out = tmp_path / f"{label}.csv"
        assert main(["estimate", "four_bar_crank", "--observations", str(obs), "-o", str(out)] + extra) == 0
        outs[label] = np.loadtxt(out, delimiter=",", skiprows=1)
    assert np.array_equal(outs["option"], outs["file"])
    assert np.array_equal(outs["default"], outs["file, option wins"])
    assert not np.allclose(outs["default"], outs["file"])


def test_a_jump_of_the_readings_restarts_the_filters(crank_mech, recording):
    """The readings jump by 0.5 rad for good (an encoder re-seated): the bank refuses them a few times, restarts
    its filters and goes on counting once the estimator follows the new readings; the density stays within its
    grid."""
    t, y = recording
    est = estimator(crank_mech, 30.0)
    half = len(t) // 2
    run(est, t, y, stop=half)
    a = est.density_adaptation
    counted = a.counted
    run(est, t, y, start=half, readings=lambda k, value: value + 0.5)
    # until the estimator itself re-initializes from the readings (max_rejections steps), the bank, restarted
    # at its estimate, refuses them again: a few bank steps (at most two restarts)
    assert 0 < a.rejected <= 2 * DA.MAX_REJECTED + EstimatorConfig().max_rejections * DT / DA.BANK_INTERVAL + 1
    assert a.counted > counted + 0.5 * (len(t) - half) * DT / DA.BANK_INTERVAL
    assert a.grid[0] <= a.density <= a.grid[-1]


def test_chi_square_quantile_matches_scipy():
    from scipy.stats import chi2
    from mbfg_ros.estimation.density_adaptation import chi_square_quantile, chi_square_survival
    for d in range(1, 9):
        for tail in (0.5, 0.05, 1e-3, 1e-6, 1e-9):
            x = chi_square_quantile(tail, d)
            assert abs(x - chi2.isf(tail, d)) <= 1e-9 * max(1.0, x), (d, tail)
            assert abs(chi_square_survival(x, d) - tail) <= 1e-9 * tail


def test_a_held_start_is_kept_until_the_readings_reject_it(crank_mech, motion):
    """With `hold_start` (fused mode's bank) a start at the data's density is not moved by 3 s of readings (the
    best pair's log-likelihood does not beat the start's by `RELEASE` nats: the grid's best is chance), where the
    bank that fits from the first evidence (estimation mode's) moves; started 30× off, the held bank is released
    and fits."""
    traj, y = motion
    stop = int(round(3.0 / DT)) + 1

    def bank(start, hold):
        a = DA.DensityAdaptation(crank_mech, start, 1e-9, sensor_sigmas={"crank": SIGMA}, hold_start=hold)
        for k in range(stop):
            a.observe(float(traj.t[k]), {"crank": float(y[k])}, traj.q[k], traj.v[k], traj.a[k], traj.applied[k])
        return a

    held, free = bank(TRUE_DENSITY, True), bank(TRUE_DENSITY, False)
    assert held.counted > 0 and not held.released
    assert (held.density, held.acceleration_density) == (TRUE_DENSITY, 1e-9)
    assert free.released and (free.density, free.acceleration_density) != (TRUE_DENSITY, 1e-9)
    wrong = bank(TRUE_DENSITY * 30.0, True)
    assert wrong.released and abs(math.log10(wrong.density / TRUE_DENSITY)) < 1.0
    assert FixedLagEstimator(crank_mech, EstimatorConfig(dt=DT, mode="fused")).density_adaptation.released is False
    assert estimator(crank_mech, TRUE_DENSITY).density_adaptation.released is True


def test_a_wrong_command_burst_does_not_move_the_fit(driven):
    """Fused mode, the command 300 N·m off for 0.2 s (test_tracking's burst): probable only under the grid's
    largest densities, it would take both fits to the grid's top for the memory's 10 s; each reading's
    normalized innovation enters the likelihood at most at the gate's quantile (`GATE_PROBABILITY`), so no
    density rises above where the readings before it put it (the commands here are right: the fit, released
    from its start before the burst, goes down as the readings show no disturbance), during the burst or
    0.3 s after it."""
    crank = load_mechanism("four_bar_crank")
    rng = np.random.default_rng(5)
    est = FixedLagEstimator(crank, EstimatorConfig(dt=float(driven.t[1] - driven.t[0]), mode="fused"))
    before, fits = None, []
    for k, t in enumerate(driven.t):
        command = driven.tau[k] + (300.0 if 800 <= k < 1000 else 0.0)
        est.step(float(t), efforts=[float(command)],
                 observations={"crank": float(driven.theta[k] + 1e-3 * rng.standard_normal())})
        if k == 799:
            before = est.fitted_densities()
        elif 800 <= k < 1300:
            fits.append(est.fitted_densities())
    risen = [f for f in fits if any(f[n] > before[n] * (1 + 1e-12) for n in ("disturbance_density",
                                                                              "acceleration_density"))]
    assert not risen, (before, risen[:3])
    assert est.density_adaptation.rejected > 0


def test_steps_without_readings_do_not_pile_up(crank_mech, motion):
    """Estimates without the encoders' readings for 2 s (a gyroscope alone, commands alone): the bank keeps no
    more than its longest step's samples (it restarts after `MAX_GAP`), then counts again."""
    traj, y = motion
    a = DA.DensityAdaptation(crank_mech, TRUE_DENSITY, 1e-9, sensor_sigmas={"crank": SIGMA})
    most = 0
    for k, t in enumerate(traj.t[:1000]):
        readings = {"crank": float(y[k])} if k < 200 or k >= 600 else {}
        a.observe(float(t), readings, traj.q[k], traj.v[k], traj.a[k], traj.applied[k])
        most = max(most, len(a.held))
    assert most <= (DA.MAX_GAP + DA.BANK_INTERVAL) / DT + 2, most
    assert a.counted > 0 and a.x is not None


@pytest.mark.parametrize("true_T, density", [(0.2, 3e4), (1.0, 3e3)])
def test_the_fused_fit_finds_the_disturbances_time_constant(crank_mech, true_T, density):
    """Fused mode, the applied torque a PD command plus a damped disturbance of time constant `true_T`: from the
    default start (1 s, 3e3 (N·m)²/s³) the online fit finds a disturbance that decorrelates in 0.2 s (within
    a quarter decade) and keeps the start where it is the truth; the estimator's disturbance uses it; no time
    constant below the bound of 4 bank samples."""
    from test_tuning import synthetic
    t, y, commands = synthetic(crank_mech, "fused", density, SIGMA, 12.0, seed=3, time_constant=true_T)
    est = FixedLagEstimator(crank_mech, EstimatorConfig(dt=DT, mode="fused", sensor_sigmas={"crank": SIGMA}))
    a = est.density_adaptation
    assert a.time_constant_grid.min() >= DA.MIN_TIME_CONSTANT_SAMPLES * DA.BANK_INTERVAL
    for k in range(len(t)):
        est.step(float(t[k]), efforts=[float(commands[k, 0])], observations={"crank": float(y[k])})
    fitted = est.fitted_densities()
    assert abs(math.log10(fitted["disturbance_time_constant"] / true_T)) < 0.25, fitted
    assert abs(math.log10(fitted["disturbance_density"] / density)) < 1.0, fitted
    assert est.sigmas["disturbance_time_constant"] == fitted["disturbance_time_constant"]
    assert a.rejected == 0


def test_the_vertex_of_unevenly_spaced_scores():
    """`_vertex` (the time constants' axis, in 1/T): a parabola's vertex exactly, clipped to the neighbours'
    span, the point itself at an edge or without curvature."""
    x = np.array([1.0, 1 / 0.316, 10.0, 31.6])
    for top in (2.5, 5.0, 9.0):
        scores = -3.0 * (x - top) ** 2
        i = int(np.argmax(scores))
        assert DA._vertex(x, scores, i) == pytest.approx(top, rel=1e-12)
    assert DA._vertex(x, -(x - 40.0) ** 2, 2) == 31.6          # beyond the span: clipped
    assert DA._vertex(x, -x, 0) == 1.0                          # an edge
    assert DA._vertex(x, 2.0 * x, 1) == x[1]                     # no curvature (straight in x)
