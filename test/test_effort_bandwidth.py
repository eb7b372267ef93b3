"""The efforts' bandwidth (`EstimatorConfig.effort_bandwidth`): the online density fit keeps the unmodelled
accelerations below the unknown efforts' spectrum up to that frequency, the other banks fit at the likelihood's own
densities (mbfg_ros/estimation/density_adaptation.py `_within_bandwidth`)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mbfg_ros.dynamics.constrained import forward_dynamics
from mbfg_ros.estimation import density_adaptation as DA
from mbfg_ros.estimation.config import EstimatorConfig
from mbfg_ros.estimation.estimator import FixedLagEstimator
from mbfg_ros.estimation.reduced_ekf import encoded_acceleration_noise
from mbfg_ros.sim.plant import Actuator, SimulatedPlant
from mbfg_ros.tuning.params_file import ParamsFileError, read_params
from test_tuning import DT, integrated_random_walk
from test_tuning_adaptation import SIGMA, TRUE_DENSITY as WALK_DENSITY, crank_mech  # noqa: F401 (a fixture)


START_ACCELERATION = 1e-6   # [rad²/s³] the bank's configured acceleration density (the model said nearly exact)


@pytest.fixture(scope="module")
def noisy_motion(crank_mech):
    """8 s at 5 ms of the crank four-bar driven by an integrated random walk plus white noise held over each
    step: to the readings the noise is unmodelled acceleration, and the likelihood puts it there (and with it
    the walk's slower part, test_tuning_adaptation)."""
    rng = np.random.default_rng(11)
    n = int(round(8.0 / DT)) + 1
    walk = integrated_random_walk(WALK_DENSITY, n + 2, rng)
    white = rng.normal(0.0, 1.0, n + 2)
    plant = SimulatedPlant(crank_mech, dt=DT, seed=4,
                           profile=lambda mech, t, q, v: (walk + white)[int(round(t / DT))][None],
                           actuator=Actuator.ideal(crank_mech), sensors=[])
    traj = plant.simulate(8.0)
    c = int(crank_mech.actuated[0])
    return traj, walk, traj.q[:, c] + rng.normal(0.0, SIGMA, len(traj.t))


def fitted_bank(mech, data, bandwidth: float) -> DA.DensityAdaptation:
    traj, walk, y = data
    bank = DA.DensityAdaptation(mech, WALK_DENSITY, START_ACCELERATION, sensor_sigmas={"crank": SIGMA},
                                effort_bandwidth=bandwidth)
    for k, t in enumerate(traj.t):
        qdd = forward_dynamics(mech, traj.q[k], traj.v[k], mech.generalized_forces(walk[k:k + 1]))
        bank.observe(float(t), {"crank": float(y[k])}, traj.q[k], traj.v[k], qdd, walk[k:k + 1])
    return bank


def crossover_hz(density: float, acceleration_density: float, gain: float) -> float:
    return (density * gain / acceleration_density) ** 0.25 / (2.0 * math.pi)


def test_the_gain_is_the_effort_direction_of_the_encoded_accelerations(crank_mech):
    """Along b = ∂z̈/∂τ an effort of density S moves z̈ with S‖b‖²/ω⁴ and the accelerations of density Sₐ with
    Sₐ bᵀ Sₐ b/‖b‖²: one encoder, b and Sₐ scalars, the gain is b² / Sₐ at the bank's pose."""
    bank = DA.DensityAdaptation(crank_mech, 1.0, 1.0, sensor_sigmas={"crank": SIGMA})
    q = np.array(crank_mech.q0, dtype=float)
    bank.observe(0.0, {"crank": float(q[bank.z[0]])}, q, np.zeros(crank_mech.n), np.zeros(crank_mech.n),
                 np.zeros(1))
    Q = np.zeros(crank_mech.n)
    Q[crank_mech.actuated[0]] = 1.0
    b = forward_dynamics(crank_mech, q, np.zeros(crank_mech.n), Q)[bank.z[0]]
    Sa = encoded_acceleration_noise(crank_mech, q, bank.z, 1.0)[0, 0]
    assert b != 0 and Sa > 0
    assert bank.bandwidth_gain() == pytest.approx(b * b / Sa, rel=1e-9)


def test_the_fit_keeps_the_accelerations_below_the_efforts_up_to_the_bandwidth(crank_mech, noisy_motion):
    """The likelihood alone puts the white noise and slow motion on accelerations, far above the configured
    density: its crossover sits low.  Asked for a bandwidth twice that, the fit's densities cross at it or above
    (or the acceleration density is back at the configured one); its free densities are the likelihood's own (a
    bank without the bandwidth on the same readings), its grid point the best of those within."""
    free = fitted_bank(crank_mech, noisy_motion, 0.0)
    gain = free.bandwidth_gain()
    f_free = crossover_hz(free.density, free.acceleration_density, gain)
    assert free.free_density == free.density and free.free_acceleration_density == free.acceleration_density
    assert free.acceleration_density > 100 * START_ACCELERATION
    bandwidth = 2.0 * f_free
    bank = fitted_bank(crank_mech, noisy_motion, bandwidth)
    assert (bank.free_density, bank.free_acceleration_density) == (free.density, free.acceleration_density)
    assert crossover_hz(bank.density, bank.acceleration_density, bank.bandwidth_gain()) >= bandwidth * (1 - 1e-9) \
        or bank.acceleration_density <= START_ACCELERATION * (1 + 1e-9)
    assert bank.density > free.density or bank.acceleration_density < free.acceleration_density
    w4 = (2 * math.pi * bandwidth) ** 4
    within = (bank.grid[:, None] * bank.bandwidth_gain() / bank.acceleration_grid[None, :] >= w4) \
        | (bank.acceleration_grid[None, :] <= START_ACCELERATION * (1 + 1e-9))
    scores = (bank.log_likelihood + bank.log_prior).reshape(bank.shape)[:, :, 0, 0, 0]
    best = np.unravel_index(int(np.argmax(np.where(within, scores, -np.inf))), scores.shape)
    # (the estimate lies within half a grid step of the best point within, along each axis)
    assert abs(math.log10(bank.density) - bank.log10_grid[best[0]]) <= 0.5 * DA.GRID_STEP + 1e-12
    assert math.log10(bank.acceleration_density) <= bank.log10_acceleration_grid[best[1]] \
        + 0.5 * DA.ACCELERATION_STEP + 1e-12
    # a bandwidth the likelihood already honours changes nothing
    low = fitted_bank(crank_mech, noisy_motion, 0.5 * f_free)
    assert (low.density, low.acceleration_density) == (free.density, free.acceleration_density)


def test_the_estimator_holds_its_graph_to_the_bandwidth_and_its_other_banks_to_the_likelihood(crank_mech,
                                                                                          noisy_motion):
    traj, _, y = noisy_motion
    c = int(crank_mech.actuated[0])
    runs = {}
    for bandwidth in (0.0, 20.0):
        est = FixedLagEstimator(crank_mech, EstimatorConfig(dt=DT, mode="estimation", sensor_sigmas={"crank": SIGMA},
                                                           effort_bandwidth=bandwidth))
        for k, t in enumerate(traj.t[:1200]):
            est.step(float(t), None, {"crank": float(y[k])})
        runs[bandwidth] = est
    main = runs[20.0].density_adaptation
    fitted = runs[20.0].fitted_densities()
    start = 10.0 ** main.log10_acceleration_start
    assert crossover_hz(fitted["effort_density"], fitted["acceleration_density"], main.bandwidth_gain()) \
        >= 20.0 * (1 - 1e-9) or fitted["acceleration_density"] <= start * (1 + 1e-9)
    assert fitted["acceleration_density"] < main.free_acceleration_density
    assert fitted["acceleration_density.likelihood"] == main.free_acceleration_density    # (said)
    # (the other banks follow the main fit's changes of CHANGE decades or more)
    boost = runs[20.0].boost_fit
    assert abs(math.log10(boost.density / main.free_density)) < DA.CHANGE
    assert abs(math.log10(boost.acceleration_density / main.free_acceleration_density)) < DA.CHANGE
    assert abs(math.log10(boost.acceleration_density / fitted["acceleration_density"])) > DA.CHANGE
    plain = runs[0.0].density_adaptation
    assert (plain.density, plain.acceleration_density) == (plain.free_density, plain.free_acceleration_density)
    assert "acceleration_density.likelihood" not in runs[0.0].fitted_densities()
    assert np.all(np.isfinite([e for e in runs[20.0].last.efforts])) and abs(runs[20.0].last.q[c] - y[1199]) < 0.01


def test_where_it_applies_and_what_it_refuses(crank_mech, tmp_path):
    with pytest.raises(ValueError, match="effort_bandwidth must be a finite number of Hz ≥ 0"):
        EstimatorConfig(effort_bandwidth=-1.0).validated()
    with pytest.raises(ValueError, match="effort_bandwidth must be a finite number of Hz ≥ 0"):
        EstimatorConfig(effort_bandwidth=math.nan).validated()
    with pytest.raises(ValueError, match="bandwidth must be a finite number of Hz"):
        DA.DensityAdaptation(crank_mech, 1.0, 1.0, effort_bandwidth=math.inf)
    # a damped disturbance (fused mode), or a bank that fits another axis: no bandwidth
    with pytest.raises(ValueError, match="undamped efforts, and no other axis"):
        DA.DensityAdaptation(crank_mech, 1.0, 1.0, time_constant=0.2, effort_bandwidth=3.0)
    with pytest.raises(ValueError, match="undamped efforts, and no other axis"):
        DA.DensityAdaptation(crank_mech, 1.0, 1.0, fit_acceleration=False, effort_bandwidth=3.0)
    fused = FixedLagEstimator(crank_mech, EstimatorConfig(dt=DT, mode="fused", effort_bandwidth=3.0))
    assert fused.density_adaptation.effort_bandwidth == 0.0
    est = FixedLagEstimator(crank_mech, EstimatorConfig(dt=DT, mode="estimation"))
    assert est.density_adaptation.effort_bandwidth == EstimatorConfig().effort_bandwidth > 0
    path = tmp_path / "p.yaml"
    path.write_text("/**/mbfg_estimator:\n  ros__parameters:\n    effort_bandwidth: 2\n")
    assert read_params(path, crank_mech)["effort_bandwidth"] == 2.0
    for bad in ("-1.0", "true", ".inf", "fast"):
        path.write_text(f"/**/mbfg_estimator:\n  ros__parameters:\n    effort_bandwidth: {bad}\n")
        with pytest.raises(ParamsFileError, match="effort_bandwidth must be a finite number of Hz"):
            read_params(path, crank_mech)


def test_mbfg_tune_says_where_its_fit_leaves_the_efforts_below_the_bandwidth(crank_mech, noisy_motion, tmp_path,
                                                                            capsys):
    """`mbfg tune` fits by the likelihood alone and its file turns the online fit off: where the fitted densities
    cross below the bandwidth with accelerations above the configured density (white noise on the plant's effort,
    read as accelerations) it says so, with the crossing; on the walk alone it does not."""
    from test_cli import run, write_csv
    traj, walk, y = noisy_motion
    noisy = tmp_path / "noisy.csv"
    write_csv(noisy, ["t", "crank"], np.column_stack([traj.t, y]))
    rc, out, err = run(["tune", "four_bar_crank", "--observations", noisy, "--mode", "estimation",
                        "--fit-acceleration-density", "-o", tmp_path / "noisy.yaml"], capsys)
    assert rc == 0, err
    assert "note: the fitted densities hand the unexplained motion above" in err, err
    crossing = float(err.split("motion above ")[1].split(" Hz")[0])
    assert 0 < crossing < EstimatorConfig().effort_bandwidth
    # the walk alone: slow efforts on an exact model cross low too, but the fit asks for no accelerations beyond
    # the configured ones
    plant = SimulatedPlant(crank_mech, dt=DT, seed=4, profile=lambda mech, t, q, v: walk[int(round(t / DT))][None],
                           actuator=Actuator.ideal(crank_mech), sensors=[])
    exact = plant.simulate(4.0)
    c = int(crank_mech.actuated[0])
    clean = tmp_path / "clean.csv"
    write_csv(clean, ["t", "crank"], np.column_stack([exact.t, exact.q[:, c]
                                                      + np.random.default_rng(3).normal(0.0, SIGMA, len(exact.t))]))
    rc, out, err = run(["tune", "four_bar_crank", "--observations", clean, "--mode", "estimation",
                        "--fit-acceleration-density", "-o", tmp_path / "clean.yaml"], capsys)
    assert rc == 0 and "note: the fitted densities" not in err, err
