"""`FixedLagEstimator.joint_covariance`: the full covariance of the named joints' [angles, rates, efforts] at the
newest step, computed on request; its diagonal is the published 1σ, its effort rows are the actuator's (zero on
unactuated coordinates and for commanded efforts), and on a simulated run it is consistent with the errors."""

import math

import numpy as np
import pytest

from mbfg_ros.estimation.config import EstimatorConfig
from mbfg_ros.estimation.estimator import FixedLagEstimator
from mbfg_ros.sim.plant import Actuator, SimulatedPlant


def torque(mech, t, q, v):
    return np.array([20.0 * math.sin(3.0 * t) + 5.0 * math.cos(7.0 * t) - 5.0])


def run(mech, mode, steps, profile=None, dt=1e-3, sigmas=None):
    traj = SimulatedPlant(mech, dt=dt, seed=5, profile=profile, actuator=Actuator.ideal(mech)).simulate(steps * dt)
    est = FixedLagEstimator(mech, EstimatorConfig(dt=dt, window=10, mode=mode, compute_covariance=True,
                                                  sigmas=sigmas or {}))
    return traj, est


def test_joint_covariance_matches_the_published_sigmas_and_is_consistent(crank):
    traj, est = run(crank, "estimation", 1500, torque, sigmas={"effort_density": 1e4})
    assert est.joint_covariance([4]) is None                   # before the first estimate
    c = int(crank.actuated[0])
    other = 0                                                  # a point coordinate: no actuator
    n = crank.n
    z2 = []
    for k, t in enumerate(traj.t):
        e = est.step(float(t), observations={s: float(traj.readings[s][k]) for s in traj.readings})
        if k < 500 or k % 10:
            continue
        P = est.joint_covariance([c, other])
        assert P.shape == (6, 6) and np.allclose(P, P.T)
        assert np.min(np.linalg.eigvalsh(P[:5, :5])) > 0
        sd = np.sqrt(np.diag(P))
        np.testing.assert_allclose(sd[[0, 1, 2, 3]], e.std[[c, other, n + c, n + other]], rtol=1e-6)
        np.testing.assert_allclose(sd[4], e.efforts_std[0], rtol=1e-6)
        assert np.all(P[5] == 0.0) and np.all(P[:, 5] == 0.0)   # no actuator on the point coordinate
        # the joint NEES of (angle, rate, effort) of the crank: 3 on average when consistent
        err = np.array([e.q[c] - traj.q[k, c], e.v[c] - traj.v[k, c], e.efforts[0] - traj.applied[k, 0]])
        S = P[np.ix_([0, 2, 4], [0, 2, 4])]
        z2.append(err @ np.linalg.solve(S, err))
    nees = float(np.mean(z2)) / 3.0
    assert 0.3 < nees < 3.0, nees
    with pytest.raises(ValueError, match="out of range"):
        est.joint_covariance([n])


def test_joint_covariance_of_two_actuators_and_of_commanded_efforts(robot):
    cols = [int(a) for a in robot.actuated]
    traj, est = run(robot, "fused", 60, dt=5e-3)
    for k, t in enumerate(traj.t):
        e = est.step(float(t), traj.efforts[k], {s: float(traj.readings[s][k]) for s in traj.readings})
    P = est.joint_covariance(cols)
    assert P.shape == (6, 6)
    # fused: the efforts' uncertainty is the disturbance's (the commands are known), correlated across motors
    np.testing.assert_allclose(np.sqrt(np.diag(P))[4:], e.disturbance_std, rtol=1e-6)
    assert P[4, 5] != 0.0
    traj, est = run(robot, "forward_dynamics", 20, dt=5e-3)
    for k, t in enumerate(traj.t):
        est.step(float(t), traj.efforts[k])
    P = est.joint_covariance(cols)
    assert np.all(P[4:] == 0.0) and np.all(P[:, 4:] == 0.0)   # commanded efforts: known
