"""The efforts' boosts (`DensityAdaptation(boosts=True)`, `FixedLagEstimator._boost_fit`): a short-memory bank
raises one effort's density while the last half second's readings reject the long fit's."""
import math

import numpy as np
import pytest

from mbfg_ros.estimation import density_adaptation as DA
from mbfg_ros.estimation.config import EstimatorConfig
from mbfg_ros.estimation.estimator import FixedLagEstimator
from mbfg_ros.model.mechanism import load_mechanism
from mbfg_ros.sim.plant import Actuator, SimulatedPlant
from test_tuning import DT, integrated_random_walk

SIGMA = 1e-4
SECONDS = 10.0
JUMP = 7.0
BURST = 1e2


@pytest.fixture(scope="module")
def pendulum():
    return load_mechanism("double_pendulum_a0")


def _burst(pendulum, seed):
    """A double pendulum driven by one damped integrated random walk per actuator (density 0.1), the elbow's
    joined at `JUMP` s by one 1000× denser, and its readings."""
    rng = np.random.default_rng(seed)
    n = int(round(SECONDS / DT)) + 1
    shoulder = integrated_random_walk(1e-1, n + 2, rng, time_constant=1.0)
    elbow = integrated_random_walk(1e-1, n + 2, rng, time_constant=1.0)
    k0 = int(round(JUMP / DT))
    elbow[k0:] += integrated_random_walk(BURST, n + 2 - k0, rng, time_constant=1.0)

    def law(mech, t, q, v):
        k = int(round(t / DT))
        return np.array([shoulder[k], elbow[k]])
    traj = SimulatedPlant(pendulum, dt=DT, seed=seed, profile=law, actuator=Actuator.ideal(pendulum),
                          sensors=[]).simulate(SECONDS)
    cols = [int(c) for c in pendulum.actuated]
    return traj, traj.q[:, cols] + rng.normal(0.0, SIGMA, (len(traj.t), 2))


def test_the_boosts_bank_raises_the_density_of_the_effort_that_turns_faster(pendulum):
    """At the walks' density, around the true motion: no boost over 7 s of the walks it describes; once the
    elbow's walk turns 1000× denser, its density is raised by the grid's 2 decades within 0.2 s and the
    shoulder's is not."""
    traj, y = _burst(pendulum, seed=1)
    names = [s.name for s in pendulum.sensors]
    bank = DA.DensityAdaptation(pendulum, 1e-1, 1e-9, sensor_sigmas=dict.fromkeys(names, SIGMA), fit_effort=False,
                                fit_acceleration=False, hold_start=True, boosts=True)
    assert bank.shape[4] == 1 + 2 * len(DA.BOOST_GRID) and bank.boost_rejection == pytest.approx(11.97, abs=0.01)
    boosts = []
    for k, t in enumerate(traj.t):
        bank.observe(float(t), dict(zip(names, y[k].tolist())), traj.q[k], traj.v[k], traj.a[k], traj.applied[k])
        boosts.append(bank.boost.copy())
    boosts, t = np.array(boosts), traj.t
    assert np.all(boosts[t < JUMP] == 0.0)
    assert np.all(boosts[:, 0] == 0.0)
    assert np.all(boosts[t >= JUMP + 0.2, 1] == max(DA.BOOST_GRID)), boosts[t >= JUMP, 1][:60]


def test_the_boosts_table_raises_one_actuator_at_a_time(pendulum):
    """Each filter of the bank: the shares given, then per actuator its own raised by each grid point; no prior;
    the shares follow the shares' fit (`set_shares`); the bank fits nothing else."""
    bank = DA.DensityAdaptation(pendulum, 10.0, 0.1, fit_effort=False, fit_acceleration=False, boosts=True,
                                shares=[4.0, 0.25])
    G = len(DA.BOOST_GRID)
    table = bank._share_table()
    np.testing.assert_allclose(table[0], np.log10([4.0, 0.25]))
    np.testing.assert_allclose(table[1:1 + G, 0] - table[0, 0], DA.BOOST_GRID)
    np.testing.assert_allclose(table[1:1 + G, 1], table[0, 1])
    np.testing.assert_allclose(table[1 + G:, 1] - table[0, 1], DA.BOOST_GRID)
    assert np.all(bank.log_prior == bank.log_prior[0])
    bank.set_shares([1.0, 1.0])
    np.testing.assert_allclose(bank._share_table()[0], [0.0, 0.0])
    for other in (dict(fit_shares=True), dict(fit_effort=True), dict(fit_acceleration=True), dict(time_constant=0.1)):
        with pytest.raises(ValueError, match="holds every other axis at one point"):
            DA.DensityAdaptation(pendulum, 10.0, 0.1, **{"fit_effort": False, "fit_acceleration": False, "boosts": True,
                                                         **other})


def test_the_estimator_applies_the_boosts_once_its_density_fit_has_settled(pendulum):
    """Estimation mode on the burst: the efforts' units use density × share × 10^boost once the density fit's
    evidence spans `BOOST_SETTLED` s (before, the shares alone), and the elbow's is raised soon after the burst
    begins (its effect on the DFKI acrobot: test_real_hardware.py); fused mode has no boosts' bank."""
    traj, y = _burst(pendulum, seed=3)
    names = [s.name for s in pendulum.sensors]
    est = FixedLagEstimator(pendulum, EstimatorConfig(dt=DT, mode="estimation",
                                                      sensor_sigmas=dict.fromkeys(names, SIGMA)))
    applied = []
    for k, t in enumerate(traj.t):
        est.step(float(t), observations=dict(zip(names, y[k].tolist())))
        boost = 10.0 ** est.boost_fit.boost if est.density_adaptation.evidence >= DA.BOOST_SETTLED else 1.0
        if est.efforts.shares is not None:
            np.testing.assert_allclose(est.efforts.shares, est.shares_fit.shares * boost)
            applied.append((t, est.efforts.shares / est.shares_fit.shares))
    raised = [t for t, b in applied if b[1] > 1.0]
    assert raised and JUMP < raised[0] < JUMP + 0.5, raised[:3]
    assert all(b[0] == 1.0 for t, b in applied if t < JUMP)
    fused = FixedLagEstimator(pendulum, EstimatorConfig(dt=DT, mode="fused"))
    assert fused.density_adaptation is not None and fused.boost_fit is None
