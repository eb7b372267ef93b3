"""The encoders' deflection (`sigmas.deflection_sigma`, estimation/deflection.py): where it is in the state and the
units, the bank's model of it, and what it buys on readings that carry one (a motor encoder behind a gear)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import mbfg_ros.factors as F
from mbfg_ros.estimation import density_adaptation as DA
from mbfg_ros.estimation.config import EstimatorConfig
from mbfg_ros.estimation.estimator import FixedLagEstimator
from mbfg_ros.model.mechanism import load_mechanism
from test_tuning import DT
from test_tuning_adaptation import SIGMA, crank_mech, motion  # noqa: F401  (fixtures)

DEFLECTION_SIGMA = 3e-3     # [rad] the simulated encoder's deflection (15× ... 30× its noise, as on the DFKI motors)
DEFLECTION_T = 0.05         # [s]


def gauss_markov(n: int, sigma: float, T: float, rng, dt: float = DT) -> np.ndarray:
    phi = math.exp(-dt / T)
    out = np.empty(n)
    x = sigma * rng.standard_normal()
    for k in range(n):
        out[k] = x
        x = phi * x + sigma * math.sqrt(1.0 - phi * phi) * rng.standard_normal()
    return out


def _config(mode="estimation", deflection=0.0, **kw):
    sigmas = {"effort_density": 3.0, "acceleration_density": 1e-3, "deflection_sigma": deflection,
              "deflection_time_constant": DEFLECTION_T}
    return EstimatorConfig(dt=DT, mode=mode, sigmas=sigmas, sensor_sigmas={"crank": SIGMA}, adapt_densities=False,
                           adapt_sensor_sigmas=False, **kw)


def _run(mech, config, t, y):
    est = FixedLagEstimator(mech, config)
    c = int(mech.actuated[0])
    q, tau = np.full(len(t), np.nan), np.full(len(t), np.nan)
    for k in range(len(t)):
        e = est.step(float(t[k]), None, {"crank": float(y[k])})
        q[k], tau[k] = e.q[c], e.efforts[0]
    return est, q, tau


def test_the_state_and_the_encoders_carry_the_deflection_where_one_is_configured(crank_mech):
    est = FixedLagEstimator(crank_mech, _config(deflection=1e-3))
    est.step(0.0, None, {"crank": 0.3})
    assert "deflection" in est.layout and est.layout.slices["deflection"].stop - est.layout.slices["deflection"].start == 1
    unit = est.sensors.units["crank"]
    assert unit.slots == ("q", "deflection") and unit.kernel_kind == "wrapped_offset_selection"
    transitions = [u for u in est.factors.integrators(DT) if isinstance(u, F.GaussMarkov)]
    assert len(transitions) == 1 and transitions[0].time_constant == DEFLECTION_T
    # none where σ is 0 (the default) or the mode reads no encoders
    for config in (_config(), _config(mode="forward_dynamics", deflection=1e-3)):
        est = FixedLagEstimator(crank_mech, config)
        assert "deflection" not in est.layout and est.sensors.units["crank"].slots == ("q",)
    with pytest.raises(ValueError, match="deflection_sigma"):
        _config(deflection=-1e-3).validated()


def test_the_bank_models_the_deflection_exactly():
    """A filter's transition and noise of the deflection block over a step: e^{−H/T} and σ²(1 − e^{−2H/T}),
    uncoupled from the motion's; the readings are z + b."""
    mech = load_mechanism("double_pendulum_a0")
    sigma, T, H = 2e-3, 0.05, 0.02
    a = DA.DensityAdaptation(mech, 10.0, 0.1, deflection=(sigma, T))
    plain = DA.DensityAdaptation(mech, 10.0, 0.1)
    for bank in (a, plain):
        bank.B = np.array([[0.7, -0.2], [0.1, 0.4]])
        bank.Sa = np.array([[2.0, 0.3], [0.3, 0.5]])
        bank._H = None
    F_, _, Q = a._matrices(H)
    F0, _, Q0 = plain._matrices(H)
    b = slice(8, 10)
    assert Q.shape == (a.K, 10, 10) and F_.shape == (10, 10)
    phi = math.exp(-H / T)
    np.testing.assert_allclose(F_[b, b], phi * np.eye(2), rtol=1e-12)
    np.testing.assert_allclose(Q[:, b, b], np.broadcast_to(sigma ** 2 * (1 - phi ** 2) * np.eye(2), (a.K, 2, 2)),
                               rtol=1e-9, atol=1e-20)
    assert np.all(F_[b, :8] == 0) and np.all(F_[:8, b] == 0) and np.all(Q[:, b, :8] == 0)
    np.testing.assert_allclose(F_[:8, :8], F0, rtol=1e-14)          # the motion's model is the plain bank's
    np.testing.assert_allclose(Q[:, :8, :8], Q0, rtol=1e-14)
    np.testing.assert_array_equal(a.Hm, np.hstack((np.eye(2), np.zeros((2, 6)), np.eye(2))))


def test_a_deflection_in_the_readings_is_not_read_as_effort(crank_mech, motion):
    """The crank four-bar's encoder reads its angle through a deflection (Gauss–Markov, 3 mrad, 50 ms): with the
    deflection in the model the effort error falls by more than a third and the angle follows the motion, not the
    deflection.  On readings without one, a deflection in the model is freedom the efforts pay for, the more the
    larger its σ (why it is a parameter to fit, not a constant): a tenth of it costs under a fifth."""
    traj, y = motion
    rng = np.random.default_rng(21)
    deflected = y + gauss_markov(len(y), DEFLECTION_SIGMA, DEFLECTION_T, rng)
    c = int(crank_mech.actuated[0])
    scored = traj.t >= 1.0
    truth_tau = traj.efforts[:, 0]

    def errors(config, readings):
        _, q, tau = _run(crank_mech, config, traj.t, readings)
        return (float(np.sqrt(np.mean((tau - truth_tau)[scored] ** 2))),
                float(np.sqrt(np.mean((q - traj.q[:, c])[scored] ** 2))))

    plain_tau, plain_q = errors(_config(), deflected)
    with_tau, with_q = errors(_config(deflection=DEFLECTION_SIGMA), deflected)
    assert with_tau < 0.65 * plain_tau, (with_tau, plain_tau)
    assert with_q < plain_q, (with_q, plain_q)
    clean_plain, _ = errors(_config(), y)
    clean_small, _ = errors(_config(deflection=0.1 * DEFLECTION_SIGMA), y)
    clean_with, _ = errors(_config(deflection=DEFLECTION_SIGMA), y)
    assert clean_plain <= clean_small < 1.2 * clean_plain < clean_with, (clean_plain, clean_small, clean_with)


def _bank_fit(crank_mech, traj, y, start):
    """The deflection bank (`fit_deflection`) on the crank's readings y, the drift as an estimator that knew the
    walk would see it (test_tuning_adaptation's protocol)."""
    from mbfg_ros.dynamics.constrained import forward_dynamics
    from test_tuning_adaptation import TRUE_DENSITY
    a = DA.DensityAdaptation(crank_mech, TRUE_DENSITY, 1e-3, sensor_sigmas={"crank": SIGMA}, fit_acceleration=False,
                             fit_effort=False, hold_start=True, deflection=(start, DEFLECTION_T),
                             fit_deflection=True)
    for k, t in enumerate(traj.t):
        tau = traj.efforts[k]
        qdd = forward_dynamics(crank_mech, traj.q[k], traj.v[k], crank_mech.generalized_forces(tau))
        a.observe(float(t), {"crank": float(y[k])}, traj.q[k], traj.v[k], qdd, tau)
    return a


def test_the_fit_finds_a_deflection_where_there_is_one_and_none_where_there_is_none(crank_mech, motion):
    """The deflection bank over none and 0.1–10 mrad: on readings through a 3-mrad deflection it chooses σ_b
    within a half decade of it; on the plain readings it keeps none."""
    traj, y = motion
    rng = np.random.default_rng(22)
    deflected = y + gauss_markov(len(y), DEFLECTION_SIGMA, DEFLECTION_T, rng)
    found = _bank_fit(crank_mech, traj, deflected, 0.0)
    assert found.released and abs(math.log10(found.deflection_sigma / DEFLECTION_SIGMA)) < 0.5, found.deflection_sigma
    assert _bank_fit(crank_mech, traj, y, 0.0).deflection_sigma == 0.0
    assert list(DA.DEFLECTION_GRID)[0] == 0.0 and len(DA.DEFLECTION_GRID) == found.K


def test_an_encoder_behind_a_gear_gets_a_deflection_the_fit_sets(tmp_path):
    """The double pendulum's encoders read geared motors (gear ratio −6): with the densities fitted online (the
    default) the estimation mode's state has the deflection, its fit starting at none (the window at the grid's
    middle until the fit's estimates are used), and the fit hands its σ_b to the factors; without the fit, in forward dynamics or fused mode there is none; a gearless mechanism
    has none either."""
    from mbfg_ros.estimation.deflection import deflection_floor, geared_encoders
    mech = load_mechanism("double_pendulum_a0")
    assert geared_encoders(mech) == [s.name for s in mech.sensors if s.kind == "encoder"]
    est = FixedLagEstimator(mech, EstimatorConfig(dt=2e-3, mode="estimation"))
    assert est.deflection is not None and est.deflection_fit is not None
    # (the fit starts at none; the window, until the fit's estimates are used, at the grid's middle)
    assert est.deflection_fit.deflection_sigma == 0.0 and est.sigmas["deflection_sigma"] == DA.DEFLECTION_REFERENCE
    assert "deflection_sigma" in est.fitted_densities()
    for config in (EstimatorConfig(dt=2e-3, mode="estimation", adapt_densities=False),
                   EstimatorConfig(dt=2e-3, mode="forward_dynamics"), EstimatorConfig(dt=2e-3, mode="fused")):
        assert FixedLagEstimator(mech, config).deflection is None
    crank = load_mechanism("four_bar_crank")
    assert not geared_encoders(crank) and FixedLagEstimator(crank, EstimatorConfig(mode="estimation")).deflection is None
    # adapt_deflection false: none on the geared encoders, unless a σ is set, then held; true with a σ set (any
    # mechanism): fitted from there
    assert FixedLagEstimator(mech, EstimatorConfig(dt=2e-3, mode="estimation", adapt_deflection=False)).deflection is None
    held = FixedLagEstimator(mech, EstimatorConfig(dt=2e-3, mode="estimation", adapt_deflection=False,
                                                   sigmas={"deflection_sigma": 2e-3}))
    assert held.deflection is not None and held.deflection_fit is None and held.deflection.sigma == 2e-3
    fitted = FixedLagEstimator(crank, EstimatorConfig(mode="estimation", sigmas={"deflection_sigma": 2e-3}))
    assert fitted.deflection_fit is not None and fitted.deflection_fit.deflection_sigma == 2e-3
    # the parameter file and `mbfg estimate` take it
    from mbfg_ros.tuning.params_file import ParamsFileError, read_params
    path = tmp_path / "p.yaml"
    path.write_text("/**/mbfg_estimator:\n  ros__parameters:\n    adapt_deflection: false\n")
    assert read_params(path, mech)["adapt_deflection"] is False
    path.write_text("/**/mbfg_estimator:\n  ros__parameters:\n    adapt_deflection: 0\n")
    with pytest.raises(ParamsFileError, match="adapt_deflection must be true or false"):
        read_params(path, mech)


def test_the_tuners_bank_models_the_deflection(crank_mech, motion):
    """`mbfg tune`'s filter bank with the deflection: a vanishing σ_b gives the likelihood without it; on readings
    through a 3-mrad deflection the likelihood peaks at it among 1, 3 and 10 mrad, on the plain readings it falls
    as σ_b grows; the fit recovers σ_b within 30 % (1σ consistent), the file keeps it with its time constant."""
    from mbfg_ros.tuning import likelihood as tl
    from mbfg_ros.tuning.filter_bank import ReducedEKFBank
    from test_tuning_adaptation import TRUE_DENSITY
    traj, y = motion
    rng = np.random.default_rng(23)
    deflected = y + gauss_markov(len(y), DEFLECTION_SIGMA, DEFLECTION_T, rng)
    c = int(crank_mech.actuated[0])
    steps = np.diff(traj.t, prepend=traj.t[0])

    def likelihoods(readings, deflection):
        K = 1 if deflection is None else len(deflection)
        bank = ReducedEKFBank(crank_mech, [c], [[SIGMA]] * K, [TRUE_DENSITY] * K, acceleration_density=[1e-3] * K,
                              deflection_sigma=deflection, deflection_time_constant=DEFLECTION_T)
        for k in range(len(traj.t)):
            bank.step(np.array([readings[k]]), None, steps[k])
        return bank.log_likelihood

    grid = [1e-9, 1e-3, 3e-3, 1e-2]
    plain, with_grid = likelihoods(y, None)[0], likelihoods(y, grid)
    assert with_grid[0] == pytest.approx(plain, rel=1e-9, abs=1e-6)
    assert np.all(np.diff(with_grid) < 0)
    assert int(np.argmax(likelihoods(deflected, grid))) == 2

    rec = tl.Recording(traj.t, deflected[:, None], ["crank"], [c])
    initial = {**tl.initial_values(crank_mech, {"effort_density": TRUE_DENSITY}, {"crank": SIGMA}),
               "deflection_sigma": 1e-3, "deflection_time_constant": DEFLECTION_T}
    result = tl.fit(crank_mech, rec, "estimation", initial, ["deflection_sigma"], max_steps=800)
    fitted = result.fitted[0]
    assert abs(result.sigmas["deflection_sigma"] / DEFLECTION_SIGMA - 1.0) < 0.3, fitted.describe()
    assert abs(math.log10(result.sigmas["deflection_sigma"] / DEFLECTION_SIGMA)) < 3 * fitted.log10_std + 0.05
    kept = tl.file_values(result, initial["acceleration_density"])
    assert kept["deflection_sigma"] == result.sigmas["deflection_sigma"]
    assert kept["deflection_time_constant"] == DEFLECTION_T
    with pytest.raises(tl.TuningError, match="deflection needs the filter bank"):
        tl.single_log_likelihood(crank_mech, rec, "estimation", initial)


def test_mbfg_tune_fits_the_deflection_where_the_estimator_would(tmp_path):
    """`mbfg tune` in estimation mode on a geared mechanism (the DFKI double pendulum, 4 s of a real recording)
    fits the encoders' deflection by default and writes it; `--no-fit-deflection` and fused mode leave it out."""
    import subprocess
    import sys
    from conftest import PACKAGE_PATH, SOURCE_ROOT, dfki_rows, write_dfki_csvs
    obs, cmd = write_dfki_csvs(tmp_path, dfki_rows("design_A.0__20220815__sys_id__trajectory_01", seconds=4.0))
    mech = SOURCE_ROOT / "mechanisms" / "double_pendulum_a0.yaml"

    def tune(*extra):
        out = tmp_path / f"params{len(list(tmp_path.iterdir()))}.yaml"
        p = subprocess.run([sys.executable, "-m", "mbfg_ros.cli", "tune", str(mech), "--observations", str(obs),
                            "--max-steps", "700", "-o", str(out), *extra], capture_output=True, text=True,
                           timeout=600, env={**__import__("os").environ, "PYTHONPATH": str(PACKAGE_PATH)})
        assert p.returncode == 0, p.stderr
        return out.read_text(), p.stdout

    text, stdout = tune("--mode", "estimation")
    assert "deflection_sigma" in stdout and "deflection_sigma:" in text and "deflection_time_constant:" in text
    text, _ = tune("--mode", "estimation", "--no-fit-deflection")
    assert "deflection" not in text
    text, stdout = tune("--mode", "fused", "--torques", str(cmd))
    assert "deflection" not in text + stdout


def test_a_tuned_file_keeps_the_given_encoder_sigma_where_the_fit_below_it_is_undetermined():
    """With the deflection fitted beside it an encoder's white σ can be barely determined: the file then keeps the
    given σ (the resolution's) rather than one below it; a determined fit, or one above the given σ, is kept."""
    from mbfg_ros.tuning import likelihood as tl
    fitted = [tl.FittedValue("sensor_sigmas.a", 8e-6, 0.82), tl.FittedValue("sensor_sigmas.b", 1e-5, 0.03),
              tl.FittedValue("sensor_sigmas.c", 2e-4, 0.9), tl.FittedValue("sensor_sigmas.d", 1e-6, 0.1, True)]
    result = tl.TuningResult("estimation", fitted, {}, {"a": 8e-6, "b": 1e-5, "c": 2e-4, "d": 1e-6}, 0.0, 0, 0,
                             0.0, 1)
    given = {"a": 5.5e-5, "b": 5.5e-5, "c": 5.5e-5, "d": 5.5e-5}
    assert tl.file_sensor_sigmas(result, given) == {"a": 5.5e-5, "b": 1e-5, "c": 2e-4, "d": 5.5e-5}


def test_the_gate_scales_an_encoder_read_through_the_deflection():
    """The outlier gate measures a geared encoder's residual at the prediction against √(σ² + σ_b²): with σ alone
    (5.5e-5 rad on the DFKI motors) 100σ was 5.5 mrad, and a start through a 1-mrad deflection re-initialized the
    acrobot 11 times; an encoder without a deflection keeps its σ."""
    mech = load_mechanism("double_pendulum_a0")
    est = FixedLagEstimator(mech, EstimatorConfig(dt=2e-3, mode="estimation"))
    units = [u for u in est.sensors.units.values() if isinstance(u, F.Encoder)]
    assert units and all(u.deflection is not None for u in units)
    sigma_b = est.deflection.sigma
    for u in units:
        s = float(u.sigmas[0])
        assert est.gate._through_deflection(u) == pytest.approx(s / math.sqrt(s * s + sigma_b ** 2), rel=1e-12)
    crank = load_mechanism("four_bar_crank")
    plain = FixedLagEstimator(crank, EstimatorConfig(mode="estimation"))
    assert all(plain.gate._through_deflection(u) == 1.0 for u in plain.sensors.units.values())
