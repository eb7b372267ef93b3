"""The reference filters of bench/estimation_quality.py (bench/ekf.py): the EKF on the exact reduced model must
track a simulated crank four-bar far better than its encoder, with a consistent covariance, and as a
disturbance observer must find the applied effort behind a mismatched command; the causal Savitzky–Golay
weights must differentiate a cubic exactly."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from ekf import CausalSavitzkyGolay  # noqa: E402
from mbfg_ros.estimation.reduced_ekf import ReducedEKF  # noqa: E402
from mbfg_ros.sim.plant import Actuator, SimulatedPlant  # noqa: E402

DT = 1e-3


def _torque(mech, t, q, v):
    return np.array([20.0 * math.sin(3.0 * t) + 5.0 * math.cos(7.0 * t) - 5.0])


def _run(crank, actuator, fused):
    traj = SimulatedPlant(crank, dt=DT, seed=4, profile=_torque, actuator=actuator, sensors=["crank"]).simulate(1.2)
    c = int(crank.actuated[0])
    f = ReducedEKF(crank, [c], DT, 1e-3, 1e4, fused=fused)
    out = [f.step([traj.readings["crank"][k]], traj.efforts[k] if fused else None) for k in range(len(traj))]
    sel = traj.t >= 0.5
    err = {"angle": np.array([o.angle[0] for o in out]) - traj.q[:, c],
           "rate": np.array([o.rate[0] for o in out]) - traj.v[:, c],
           "effort": np.array([o.effort[0] for o in out]) - traj.applied[:, 0]}
    std = {"angle": np.array([o.angle_std[0] for o in out]), "rate": np.array([o.rate_std[0] for o in out]),
           "effort": np.array([o.effort_std[0] for o in out])}
    rmse = {k: float(np.sqrt(np.mean(e[sel] ** 2))) for k, e in err.items()}
    nees = {k: float(np.mean((err[k][sel] / std[k][sel]) ** 2)) for k in err}
    return traj, rmse, nees


def test_ekf_tracks_the_four_bar_with_unknown_torque(crank):
    traj, rmse, nees = _run(crank, Actuator.ideal(crank), fused=False)
    raw = float(np.sqrt(np.mean((traj.readings["crank"] - traj.q[:, crank.actuated[0]]) ** 2)))
    # the encoder alone: ~1 mrad; the rate and the torque (20 N·m amplitude) are not measured at all
    assert rmse["angle"] < 0.5 * raw, (rmse, raw)
    assert rmse["rate"] < 0.03 and rmse["effort"] < 1.5, rmse
    assert all(0.2 < x < 5.0 for x in nees.values()), nees


def test_ekf_as_disturbance_observer_finds_the_applied_effort(crank):
    traj, rmse, nees = _run(crank, Actuator.default_mismatch(crank), fused=True)
    mismatch = float(np.sqrt(np.mean((traj.applied - traj.efforts)[traj.t >= 0.5] ** 2)))
    assert mismatch > 2.0                       # the command is several N·m off the applied effort ...
    assert rmse["effort"] < 0.5 * mismatch and rmse["effort"] < 1.5, (rmse, mismatch)   # ... the estimate is not
    assert rmse["angle"] < 0.6e-3 and rmse["rate"] < 0.03, rmse


def test_savitzky_golay_differentiates_a_cubic_exactly(crank):
    sg = CausalSavitzkyGolay(crank, [int(crank.actuated[0])], DT, window=21)
    t = np.arange(40) * DT
    y = 0.3 + 2.0 * t - 5.0 * t ** 2 + 7.0 * t ** 3
    for n in (4, 21):
        W = sg.weights(n)
        tn, yn = t[-n:], y[-n:]
        T = tn[-1]
        assert W[0] @ yn == pytest.approx(y[-1], abs=1e-12)
        assert W[1] @ yn / DT == pytest.approx(2.0 - 10.0 * T + 21.0 * T ** 2, abs=1e-7)
        assert W[2] @ yn / DT ** 2 == pytest.approx(-10.0 + 42.0 * T, abs=1e-4)


def test_params_file_in_the_node_format_makes_the_estimator_config(tmp_path):
    """bench/estimation_quality.py --params FILE: the `mbfg_estimator` section's estimator settings (sigmas
    given, the rest the estimator's defaults), the scenario's dt and mode kept; a file without the section is refused."""
    import estimation_quality as B
    f = tmp_path / "p.yaml"
    f.write_text("/**/mbfg_estimator:\n  ros__parameters:\n    dt: 0.5\n    mode: fused\n    window: 7\n"
                 "    sigmas:\n      dynamics: 0.01\n    sensor_sigmas:\n      crank: 0.002\n"
                 "    assembly_mode: [-1]\n    publish_markers: true\n")
    cfg = B.estimator_config_from_file(str(f), 1e-3, "estimation")
    assert (cfg.dt, cfg.mode, cfg.window, cfg.compute_covariance) == (1e-3, "estimation", 7, True)
    assert cfg.sigmas == {"dynamics": 0.01}        # (the rest: the defaults, scaled to the mechanism)
    assert cfg.sensor_sigmas == {"crank": 0.002} and cfg.assembly_mode == (-1,)
    bad = tmp_path / "bad.yaml"
    bad.write_text("/**/four_bar_sim:\n  ros__parameters:\n    dt: 0.001\n")
    with pytest.raises(SystemExit, match="no 'mbfg_estimator: ros__parameters:' section"):
        B.estimator_config_from_file(str(bad), 1e-3, "estimation")


def test_the_identified_row_scores_what_the_actuator_applies():
    """bench/estimation_quality.py's identified row: command + disturbance + the identified parameters' forces is
    the effort the plant's mismatched actuator applies (its friction included), nearer it than the reported motor
    effort (which leaves the friction out) and than the command."""
    import estimation_quality as B
    sc = B.SCENARIOS["four_bar_fused"]
    mech = B.load_mechanism(sc.mechanism)
    traj = B.simulate(sc, mech, seed=4, seconds=1.5)
    config = B.EstimatorConfig(dt=sc.dt, mode="fused", identify=B.identified_parameters(mech))
    assert config.identify == ("crank.gain", "crank.viscous_friction", "crank.coulomb_friction")
    applied = B.run_mbfg(sc, mech, traj, config)
    est = B.FixedLagEstimator(mech, config)
    names, _ = B.encoded(mech)
    reported = np.array([est.step(float(t), traj.efforts[k], {n: float(traj.readings[n][k]) for n in names}).efforts
                         for k, t in enumerate(traj.t)])
    late = traj.t >= 1.0
    rms = lambda x: float(np.sqrt(np.mean(np.square(x[late]))))  # noqa: E731
    truth = traj.applied
    assert np.all(np.isnan(applied.std["effort"]))
    assert rms(applied.est["effort"] - truth) < 0.5 * rms(reported - truth)
    assert rms(applied.est["effort"] - truth) < 0.5 * rms(traj.efforts - truth)
