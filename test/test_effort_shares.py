"""Each actuated effort's share of the effort density, fitted online in estimation mode
(`FixedLagEstimator._shares_fit`, `DensityAdaptation(fit_shares=True)`): one density for every actuator reads
the larger efforts' variation into the smaller."""
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


@pytest.fixture(scope="module")
def pendulum():
    return load_mechanism("double_pendulum_a0")


def _walks(pendulum, densities, seed):
    """A double pendulum driven by one integrated random walk per actuator (densities), damped back to 0 over 1 s
    (a bounded swing), and its readings."""
    rng = np.random.default_rng(seed)
    n = int(round(SECONDS / DT)) + 1
    walks = [integrated_random_walk(S, n + 2, rng, time_constant=1.0) for S in densities]

    def law(mech, t, q, v):
        k = int(round(t / DT))
        return np.array([w[k] for w in walks])
    traj = SimulatedPlant(pendulum, dt=DT, seed=seed, profile=law, actuator=Actuator.ideal(pendulum),
                          sensors=[]).simulate(SECONDS)
    cols = [int(c) for c in pendulum.actuated]
    y = traj.q[:, cols] + rng.normal(0.0, SIGMA, (len(traj.t), 2))
    return traj, y


def _fit(pendulum, traj, y, density):
    names = [s.name for s in pendulum.sensors]
    a = DA.DensityAdaptation(pendulum, density, 1e-9, sensor_sigmas=dict.fromkeys(names, SIGMA),
                             fit_effort=False, fit_acceleration=False, hold_start=True, fit_shares=True)
    for k, t in enumerate(traj.t):
        a.observe(float(t), dict(zip(names, y[k].tolist())), traj.q[k], traj.v[k], traj.a[k], traj.applied[k])
    return a


def test_the_shares_bank_finds_the_ratio_of_the_actuators_densities(pendulum):
    """Around the true motion, at the densities' geometric mean: a shoulder walk 100× less dense than the
    elbow's gives shares whose ratio is within half a decade of 1/100; equal walks keep equal shares (the
    bank holds them until the readings reject them)."""
    traj, y = _walks(pendulum, (1e-2, 1.0), seed=3)
    a = _fit(pendulum, traj, y, 1e-1)
    assert a.shape[4] == len(DA.SHARE_STEP * np.arange(-6, 7)) and a.released
    ratio = math.log10(a.shares[0] / a.shares[1])
    assert abs(ratio + 2.0) < 0.5, a.shares
    assert abs(np.sum(np.log10(a.shares))) < 1e-12       # (their geometric mean is 1)
    traj, y = _walks(pendulum, (1e-1, 1e-1), seed=4)
    even = _fit(pendulum, traj, y, 1e-1)
    assert abs(math.log10(even.shares[0] / even.shares[1])) < 0.5, even.shares


def test_the_main_bank_uses_the_shares_it_is_given(pendulum):
    """A bank given shares puts each actuator's density × its share on that actuator (the noise of `_matrices`
    is checked against quadrature in test_tuning_adaptation.py); a bank that fits them keeps its own."""
    a = DA.DensityAdaptation(pendulum, 10.0, 0.1)
    a.set_shares([10.0, 0.4])
    np.testing.assert_allclose(a.shares, [5.0, 0.2])          # (normalized: geometric mean 1)
    np.testing.assert_allclose(a._share_of_filter, np.tile([5.0, 0.2], (a.K, 1)))
    fitting = DA.DensityAdaptation(pendulum, 10.0, 0.1, fit_effort=False, fit_acceleration=False, fit_shares=True)
    fitting.set_shares([10.0, 0.4])
    np.testing.assert_allclose(fitting.shares, [1.0, 1.0])
    with pytest.raises(ValueError, match="two or more"):
        DA.DensityAdaptation(pendulum, 10.0, 0.1, actuated=[int(pendulum.actuated[0])], fit_shares=True)
    with pytest.raises(ValueError, match="positive finite"):
        DA.DensityAdaptation(pendulum, 10.0, 0.1, shares=[1.0, -1.0])


def test_the_estimator_gives_each_effort_its_own_density_in_estimation_mode(pendulum):
    """Estimation mode on the walks 100× apart: the estimator's shares fit moves the shoulder's density below
    the elbow's by more than a decade, the efforts' units use density × share, `fitted_densities` reports each
    actuator's, and the shoulder's effort error is below what one density for both gives.  Fused mode (a
    disturbance: a correction of commands, its shares poorly determined) keeps one density."""
    traj, y = _walks(pendulum, (1e-2, 1.0), seed=3)
    names = [s.name for s in pendulum.sensors]
    cols = [int(c) for c in pendulum.actuated]

    def run(shares: bool):
        est = FixedLagEstimator(pendulum, EstimatorConfig(dt=DT, mode="estimation",
                                                          sensor_sigmas=dict.fromkeys(names, SIGMA)))
        if not shares:
            est.shares_fit = None
        errors = []
        for k, t in enumerate(traj.t):
            e = est.step(float(t), observations=dict(zip(names, y[k].tolist())))
            if t >= 2.0 and e.status == "ok":
                errors.append(e.efforts - traj.applied[k])
        return est, np.sqrt(np.mean(np.square(errors), axis=0))

    est, shared = run(True)
    assert est.shares_fit is not None
    ratio = est.shares_fit.shares[0] / est.shares_fit.shares[1]
    assert ratio < 0.1, est.shares_fit.shares
    np.testing.assert_allclose(est.efforts.shares, est.shares_fit.shares)
    density = est.factors.sigmas["effort_density"]
    np.testing.assert_allclose(est.efforts.densities(), density * est.shares_fit.shares)
    fitted = est.fitted_densities()
    for j, name in enumerate(pendulum.actuator_names):
        assert fitted[f"effort_density.{name}"] == pytest.approx(density * est.shares_fit.shares[j])
    _, one = run(False)
    assert shared[0] < 0.9 * one[0], (shared, one)
    fused = FixedLagEstimator(pendulum, EstimatorConfig(dt=DT, mode="fused"))
    assert fused.density_adaptation is not None and fused.shares_fit is None
    assert cols == [int(c) for c in fused.efforts.state_coordinates]


def test_with_three_actuators_each_family_moves_one_share_and_the_geometric_mean_stays_one(pendulum):
    """The shares' grid beyond two actuators (its structure only: three of the pendulum's coordinates as the
    actuated ones): per actuator but the last a family along the grid, the others moved by the opposite; a fit
    at the families' vertices raises the score and keeps the geometric mean at 1."""
    a = DA.DensityAdaptation(pendulum, 10.0, 0.1, fit_effort=False, fit_acceleration=False, fit_shares=True,
                             actuated=[5, 6, 7], shares=[4.0, 1.0, 0.25])
    G = len(a.share_grid)
    table = a._share_table()
    assert table.shape == (2 * G, 3) and a.shape[4] == 2 * G
    np.testing.assert_allclose(table.sum(axis=1), 0.0, atol=1e-12)
    np.testing.assert_allclose(table[:G, 0], a.share_grid)
    np.testing.assert_allclose(table[G:, 1], a.share_grid)
    np.testing.assert_allclose(table[:G, 1] - table[:G, 2], math.log10(4.0))    # (the others keep their ratio)
    target = np.array([-0.5, 0.75, -0.25])

    def score(log10_shares):
        return -np.sum((log10_shares - target) ** 2, axis=-1)
    before = score(a.log10_shares)
    assert a._fit_shares(score(table))
    assert score(a.log10_shares) > before
    assert abs(np.sum(a.log10_shares)) < 1e-12
    np.testing.assert_allclose(a._share_of_filter[:, :], np.tile(10.0 ** a._share_table(), (a.K // (2 * G), 1)))


# --- shares given (EstimatorConfig.effort_shares, the parameter file, the node) -----------------------------------

def test_shares_given_are_used_as_given_or_as_the_online_fit_s_start(pendulum):
    """`effort_shares` (joint → share, normalized to geometric mean 1, 1 where not given): with the densities
    held the units' walks use density × share; with the online fit every bank starts there.  A joint whose
    effort is not a state, or a share that is not a positive finite number, is refused with its name."""
    held = FixedLagEstimator(pendulum, EstimatorConfig(dt=DT, mode="estimation", adapt_densities=False,
                                                       effort_shares={"q1": 0.01}))
    np.testing.assert_allclose(held.efforts.shares, [0.1, 10.0])
    np.testing.assert_allclose(held.efforts.densities(), held.factors.sigmas["effort_density"] * np.array([0.1, 10.0]))
    fitted = FixedLagEstimator(pendulum, EstimatorConfig(dt=DT, mode="estimation", effort_shares={"q2": 4.0}))
    for bank in (fitted.density_adaptation, fitted.deflection_fit, fitted.shares_fit):
        np.testing.assert_allclose(bank.shares, [0.5, 2.0])
    assert fitted.fitted_densities()["effort_density.q2"] == pytest.approx(
        2.0 * fitted.fitted_densities()["effort_density"])
    # fused mode: the disturbances' densities take the shares (the online fit keeps them: it fits none there)
    fused = FixedLagEstimator(pendulum, EstimatorConfig(dt=DT, mode="fused", effort_shares={"q1": 0.25}))
    np.testing.assert_allclose(fused.density_adaptation.shares, [0.5, 2.0])
    with pytest.raises(ValueError, match=r"effort_shares: q1 is not an actuator whose effort is estimated .*q2"):
        FixedLagEstimator(pendulum, EstimatorConfig(dt=DT, mode="estimation", effort_shares={"q1": 2.0},
                                                    actuator_efforts={"q1": "passive"}))
    with pytest.raises(ValueError, match="elbow.*not an actuator"):
        FixedLagEstimator(pendulum, EstimatorConfig(dt=DT, mode="estimation", effort_shares={"elbow": 2.0}))
    with pytest.raises(ValueError, match=r"effort_shares.q1 must be a positive finite number \(got 0"):
        EstimatorConfig(dt=DT, mode="estimation", effort_shares={"q1": 0.0}).validated()


def test_the_parameter_file_carries_the_shares(pendulum, tmp_path):
    """`read_params` gives the `effort_shares:` mapping (`mbfg estimate --params` applies it) and names an unknown
    actuator or a share that is not a number > 0 with the file and key."""
    from mbfg_ros.tuning.params_file import ParamsFileError, read_params
    p = tmp_path / "p.yaml"
    p.write_text("/**/mbfg_estimator:\n  ros__parameters:\n    mode: estimation\n"
                 "    effort_shares: {q1: 0.1, q2: 10.0}\n")
    assert read_params(p, pendulum) == {"mode": "estimation", "effort_shares": {"q1": 0.1, "q2": 10.0}}
    p.write_text("/**/mbfg_estimator:\n  ros__parameters:\n    effort_shares: {elbow: 2.0}\n")
    with pytest.raises(ParamsFileError, match=r"p.yaml: .*effort_shares.elbow: unknown actuator of .*q1, q2"):
        read_params(p, pendulum)
    p.write_text("/**/mbfg_estimator:\n  ros__parameters:\n    effort_shares: {q1: -1.0}\n")
    with pytest.raises(ParamsFileError, match=r"effort_shares.q1 must be a number > 0"):
        read_params(p, pendulum)


def test_the_node_takes_the_shares_and_refuses_them_where_no_effort_is_estimated(tmp_path):
    """The node's `effort_shares.<joint>` parameters (default 1: none given) from a parameter file reach the
    core's config; changed at run time they rebuild it; in a mode without estimated efforts a share ≠ 1 is
    refused with the reason and the node keeps its parameters."""
    pytest.importorskip("rclpy")
    import sys
    from pathlib import Path
    import rclpy
    from rclpy.context import Context
    from rclpy.parameter import Parameter
    from mbfg_ros.ros import node as N
    from mbfg_ros.tuning.params_file import format_params
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from ros_helpers import fresh_domain_id
    p = tmp_path / "tuned.yaml"
    p.write_text(format_params("estimation", {"effort_density": 10.0}, {}, mechanism="double_pendulum_a0")
                 + "    effort_shares:\n      q1: 0.1\n")
    ctx = Context()
    rclpy.init(args=["--ros-args", "--params-file", str(p), "-p", "publish_markers:=false", "-p", "dt:=0.002"],
               context=ctx, domain_id=fresh_domain_id())
    try:
        node = N.EstimatorNode(context=ctx)
        try:
            assert node.config.effort_shares == {"q1": 0.1}
            assert node.set_parameters([Parameter("effort_shares.q2", value=2.0)])[0].successful
            assert node.config.effort_shares == {"q1": 0.1, "q2": 2.0}
            refused = node.set_parameters([Parameter("mode", value="forward_dynamics")])[0]
            assert not refused.successful and "effort_shares" in refused.reason, refused.reason
            assert node.config.mode == "estimation"
        finally:
            node.destroy_node()
    finally:
        rclpy.shutdown(context=ctx)
