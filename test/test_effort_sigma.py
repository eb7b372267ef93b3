"""An actuator's stated ripple about its command's response (`actuators: effort_sigma:`): part of the published
σ of every effort but a passive one, nothing else changed; `response_sigma` measures it from a recording with a
measured effort (`mbfg identify --measured`); the format, the configuration, a parameter file, `mbfg estimate` and
the node refuse what is not one."""

import dataclasses
import math

import numpy as np
import pytest

from mbfg_ros.estimation.actuator_delay import configured_effort_sigmas, response_sigma
from mbfg_ros.estimation.config import EstimatorConfig
from mbfg_ros.estimation.estimator import FixedLagEstimator
from mbfg_ros.model.loader import load_spec_from_string
from mbfg_ros.model.mechanism import Mechanism, load_mechanism
from mbfg_ros.model.spec import MechanismError

from test_actuator_delay import CRANK          # (a one-link crank whose actuator takes the keys given)
from test_late_commands import STEPS, commands, motion  # noqa: F401  (fixture)

RIPPLE = 0.7            # [N·m] the crank's stated ripple in these tests



def run(mech, motion, config, handed):
    """Per step (estimates, efforts σ, disturbance σ or None, the joint covariance's effort variance)."""
    est = FixedLagEstimator(mech, dataclasses.replace(config, compute_covariance=True))
    col = [mech.actuated[0]]
    values, stds, dstds, jvar = [], [], [], []
    for k in range(STEPS):
        obs = {name: float(v[k]) for name, v in motion.readings.items()}
        e = est.step(float(motion.t[k]), efforts=handed[k], observations=obs)
        values.append(np.concatenate([e.q, e.v, e.efforts]))
        stds.append(e.efforts_std.copy())
        dstds.append(None if e.disturbance_std is None else e.disturbance_std.copy())
        jvar.append(est.joint_covariance(col)[2, 2])
    return np.array(values), np.array(stds), dstds, np.array(jvar)


@pytest.mark.parametrize("mode", ["fused", "forward_dynamics", "estimation"])
def test_the_stated_ripple_adds_to_the_published_effort_sigma_and_changes_nothing_else(crank, motion, mode):
    """The crank with `effort_sigma` 0.7 N·m (the configuration's over the mechanism's none): the estimates are
    the same to the bit; the efforts' σ² is the state's plus 0.49 (fused: the disturbance's marginal, which
    `disturbance_std` keeps; estimation: the estimated effort's; forward dynamics: 0.7 exactly, the command being
    the effort), in the joint covariance too, also at steps without a command."""
    config = EstimatorConfig(window=10, mode=mode)
    cmd = commands(motion)
    plain, plain_std, plain_d, plain_j = run(crank, motion, config, cmd)
    stated = dataclasses.replace(config, actuator_effort_sigmas={"crank": RIPPLE})
    values, std, dstd, jvar = run(crank, motion, stated, cmd)
    np.testing.assert_array_equal(values, plain)
    np.testing.assert_allclose(std ** 2, plain_std ** 2 + RIPPLE ** 2, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(jvar, plain_j + RIPPLE ** 2, rtol=1e-12, atol=1e-12)
    if mode == "forward_dynamics":
        np.testing.assert_allclose(std, RIPPLE, rtol=1e-12)
        np.testing.assert_array_equal(plain_std, 0.0)
    else:
        assert plain_std.min() > 0
        for a, b in zip(dstd, plain_d):
            np.testing.assert_array_equal(a, b)
    if mode == "fused":
        gaps = cmd.copy()
        gaps[100:103] = np.nan
        _, gap_std, _, _ = run(crank, motion, stated, gaps)
        _, gap_plain, _, _ = run(crank, motion, config, gaps)
        np.testing.assert_allclose(gap_std ** 2, gap_plain ** 2 + RIPPLE ** 2, rtol=1e-12, atol=1e-12)


def test_a_passive_effort_keeps_its_sigma(crank, motion):
    """A passive actuator (its effort known: 0) adds nothing, whatever its stated ripple."""
    config = EstimatorConfig(window=10, mode="fused", actuator_efforts={"crank": "passive"})
    cmd = commands(motion)
    _, plain_std, _, plain_j = run(crank, motion, config, cmd)
    _, std, _, jvar = run(crank, motion, dataclasses.replace(config, actuator_effort_sigmas={"crank": RIPPLE}), cmd)
    np.testing.assert_array_equal(std, plain_std)
    np.testing.assert_array_equal(jvar, plain_j)
    np.testing.assert_array_equal(std, 0.0)


def test_response_sigma_is_the_departure_no_reading_resolves():
    """A measured effort = the applied command + a slow offset (0.5 Hz, 0.3 N·m: what a fused disturbance takes in)
    + white ripple of σ 0.05 on jittering 2-ms stamps: `response_sigma` finds 0.05 within 5 %; the whole departure's
    RMS is 4× that; a column with no measured row is NaN; rows outside the mask do not count."""
    rng = np.random.default_rng(3)
    n = 5000
    t = np.cumsum(np.r_[0.0, 0.002 * (1 + rng.uniform(-0.2, 0.2, n - 1))])
    applied = np.column_stack([np.sin(7 * t), np.zeros(n)])
    measured = applied + 0.3 * np.sin(np.pi * t)[:, None] + 0.05 * rng.standard_normal((n, 2))
    measured[:, 1] = np.nan
    sigma, missing = response_sigma(t, applied, measured)
    assert abs(sigma / 0.05 - 1) < 0.05 and math.isnan(missing)
    assert np.sqrt(np.mean((measured[:, 0] - applied[:, 0]) ** 2)) > 4 * sigma
    loud = measured.copy()
    loud[: n // 2, 0] += 2.0 * rng.standard_normal(n // 2)
    quiet, _ = response_sigma(t, applied, loud, rows=np.arange(n) >= n // 2 + 100)
    assert abs(quiet / 0.05 - 1) < 0.07


def test_the_format_and_the_configuration_take_a_precision_and_refuse_what_is_not_one(crank):
    mech = Mechanism(load_spec_from_string(CRANK % "effort_sigma: 0.05"))
    assert mech.actuator_effort_sigmas == (0.05,) and mech.describe()["actuator_effort_sigmas"] == [0.05]
    assert Mechanism(load_spec_from_string(CRANK % "effort_limit: 10")).actuator_effort_sigmas == (0.0,)
    for bad in ("-0.1", "'rough'", ".inf"):
        with pytest.raises(MechanismError, match=r"actuators\[0\]\.effort_sigma"):
            load_spec_from_string(CRANK % f"effort_sigma: {bad}")
    dp = load_mechanism("double_pendulum_a0")
    assert configured_effort_sigmas(dp) == [0.048, 0.054]
    assert configured_effort_sigmas(dp, {"q2": 0.0}) == [0.048, 0.0]
    with pytest.raises(ValueError, match=r"actuator_effort_sigmas: unknown actuator joint\(s\) 'elbow'"):
        configured_effort_sigmas(dp, {"elbow": 0.1})
    with pytest.raises(ValueError, match=r"actuator_effort_sigmas.crank must be a finite number >= 0"):
        EstimatorConfig(actuator_effort_sigmas={"crank": -1.0}).validated()
    with pytest.raises(ValueError, match="unknown actuator joint"):
        FixedLagEstimator(crank, EstimatorConfig(mode="fused", actuator_effort_sigmas={"elbow": 0.1}))


def test_a_parameter_file_and_mbfg_estimate_set_the_precision(tmp_path, capsys):
    """`actuator_effort_sigmas` of a parameter file and `mbfg estimate --effort-sigma NAME=SIGMA` (which wins)
    reach the published σ columns; the estimates stay; bad values and unknown actuators are errors naming them."""
    from conftest import DFKI_COLUMNS, dfki_rows
    from mbfg_ros.cli import commands as cli
    from mbfg_ros.tuning.params_file import ParamsFileError, read_params
    dp = load_mechanism("double_pendulum_a0")
    p = tmp_path / "p.yaml"
    p.write_text("/**/mbfg_estimator:\n  ros__parameters:\n    actuator_effort_sigmas:\n      q2: 0.5\n")
    assert read_params(p, dp) == {"actuator_effort_sigmas": {"q2": 0.5}}
    for body, match in (("elbow: 0.1", r"actuator_effort_sigmas.elbow: unknown actuator of double_pendulum_a0"),
                        ("q1: -1", r"actuator_effort_sigmas.q1 must be a finite number >= 0 \(got -1\)")):
        bad = tmp_path / "bad.yaml"
        bad.write_text(f"/**/mbfg_estimator:\n  ros__parameters:\n    actuator_effort_sigmas:\n      {body}\n")
        with pytest.raises(ParamsFileError, match=match):
            read_params(bad, dp)
    data = tmp_path / "run.csv"
    np.savetxt(data, dfki_rows("design_A.0__20220815__sys_id__trajectory_00")[:300], delimiter=",",
               header=",".join(DFKI_COLUMNS), comments="")
    columns = ["--observations", data, "--reading", "q1=pos_meas1,q2=pos_meas2", "--torques", data,
               "--command", "q1=tau_con1,q2=tau_con2", "--mode", "fused", "--std"]

    def estimate(*extra):
        out = tmp_path / "e.csv"
        rc = cli.main([str(a) for a in ["estimate", "double_pendulum_a0", *columns, *extra, "-o", out]])
        err = capsys.readouterr().err
        if rc:
            return rc, None, None, err
        with open(out) as f:
            names = f.readline().strip().split(",")
        table = np.loadtxt(out, delimiter=",", skiprows=1)
        std = table[:, [names.index("tau_q1_std"), names.index("tau_q2_std")]]
        rest = table[:, [i for i, n in enumerate(names) if not n.endswith("_std")]]
        return rc, rest, std, err

    rc, none_rest, none_std, _ = estimate("--effort-sigma", "q1=0,q2=0")
    assert rc == 0
    rc, file_rest, file_std, _ = estimate("--params", p, "--effort-sigma", "q1=0")
    np.testing.assert_array_equal(file_rest, none_rest)
    ok = np.isfinite(none_std).all(axis=1)
    np.testing.assert_allclose(file_std[ok, 0], none_std[ok, 0], rtol=1e-12)
    np.testing.assert_allclose(file_std[ok, 1] ** 2, none_std[ok, 1] ** 2 + 0.25, rtol=1e-9)
    rc, shipped_rest, shipped_std, _ = estimate()
    np.testing.assert_array_equal(shipped_rest, none_rest)
    np.testing.assert_allclose(shipped_std[ok] ** 2, none_std[ok] ** 2 + np.array([0.048, 0.054]) ** 2, rtol=1e-9)
    for bad, message in (("q1=-1", "--effort-sigma takes NAME=SIGMA, SIGMA a finite effort >= 0"),
                         ("q1", "--effort-sigma takes NAME=SIGMA"),
                         ("elbow=0.1", "'elbow' is not an actuator of the mechanism (q1, q2)")):
        rc, _, _, err = estimate("--effort-sigma", bad)
        assert rc == 2 and message in err, err


def test_mbfg_identify_writes_the_measured_precision(tmp_path, capsys):
    """`mbfg identify --measured JOINT=COLUMN` on a synthetic recording whose measured effort is the command 4.5 ms
    later through a 3-ms lag, plus a slow offset and white ripple of σ 0.08: the written mechanism states the
    response and an `effort_sigma` within 10 % of 0.08, which the written file loads with."""
    import yaml
    from mbfg_ros.cli import commands as cli
    from mbfg_ros.estimation.actuator_delay import delayed_commands
    rng = np.random.default_rng(5)
    dp = load_mechanism("double_pendulum_a0")
    n = 3000
    t = 0.002 * np.arange(n)
    cmd = np.column_stack([np.sign(np.sin(9 * t)) * 0.8 + 0.3 * np.sin(23 * t), 0.2 * np.sin(5 * t)])
    measured = delayed_commands(t, cmd, [0.0045, 0.0045], [0.003, 0.003])[:, 0]
    measured = measured + 0.2 * np.sin(2 * t) + 0.08 * rng.standard_normal(n)
    obs = tmp_path / "obs.csv"
    np.savetxt(obs, np.column_stack([t, 0.1 * np.sin(t), 0.1 * np.cos(t)]), delimiter=",", header="t,q1,q2",
               comments="")
    torques = tmp_path / "tau.csv"
    np.savetxt(torques, np.column_stack([t, cmd, measured]), delimiter=",", header="t,c1,c2,meas1", comments="")
    out = tmp_path / "a0.yaml"
    rc = cli.main(["identify", "double_pendulum_a0", "--observations", str(obs), "--torques", str(torques),
                   "--command", "q1=c1,q2=c2", "--measured", "q1=meas1", "-o", str(out)])
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    assert "q1.effort_sigma = " in printed.out and "q1.delay = 0.0045 s" in printed.out, printed
    doc = yaml.safe_load(out.read_text())
    first = doc["actuators"][0]
    assert first["delay"] == pytest.approx(0.0045) and first["time_constant"] == pytest.approx(0.003)
    assert abs(first["effort_sigma"] / 0.08 - 1) < 0.1, first
    assert doc["actuators"][1]["effort_sigma"] == "ripple2"          # (unmeasured: as the source states it)
    assert load_mechanism(str(out)).actuator_effort_sigmas[0] == first["effort_sigma"]
    assert dp.actuator_effort_sigmas == (0.048, 0.054)


def test_the_node_takes_the_precision_as_a_parameter(tmp_path):
    """`actuator_effort_sigmas.<joint>` (default: the mechanism file's) reaches the core and the diagnostics;
    changed at run time it rebuilds it; a negative one is refused with the reason."""
    pytest.importorskip("rclpy")
    from rclpy.parameter import Parameter
    from ros_helpers import estimator_node_here
    with estimator_node_here("mechanism:=double_pendulum_c0", "mode:=fused", "dt:=0.002",
                             "publish_markers:=false") as node:
        assert node.config.actuator_effort_sigmas == {}
        assert node.get_parameter("actuator_effort_sigmas.q2").value == 0.062
        np.testing.assert_allclose(node.core.estimates.ripple_variances, [0.053 ** 2, 0.062 ** 2])
        assert node.diagnostic_status()[1][4]["actuator_effort_sigmas"] == "q1=0.053, q2=0.062"
        assert node.set_parameters([Parameter("actuator_effort_sigmas.q1", value=0.0)])[0].successful
        assert node.config.actuator_effort_sigmas == {"q1": 0.0}
        np.testing.assert_allclose(node.core.estimates.ripple_variances, [0.0, 0.062 ** 2])
        refused = node.set_parameters([Parameter("actuator_effort_sigmas.q2", value=-0.1)])[0]
        assert not refused.successful and "actuator_effort_sigmas.q2" in refused.reason, refused.reason
        assert node.config.actuator_effort_sigmas == {"q1": 0.0}


def test_mbfg_identify_says_why_a_latency_is_not_timed(tmp_path, capsys):
    """A measured effort 25 ms after its command (past the grids' 15 ms) is reported at the grids' end; a command too
    smooth to time (a slow sine, no delay, white ripple) as moving too slowly; both keep the file's delay and time
    constant."""
    from mbfg_ros.cli import commands as cli
    from mbfg_ros.estimation.actuator_delay import delayed_commands
    t = 0.002 * np.arange(2000)
    cmd = np.column_stack([np.sign(np.sin(9 * t)) * 0.8, 0.2 * np.sin(0.5 * t)])
    late = delayed_commands(t, cmd, [0.025, 0.0]) + np.column_stack([np.zeros(len(t)),
                                                                    0.05 * np.random.default_rng(1).standard_normal(len(t))])
    obs, torques = tmp_path / "obs.csv", tmp_path / "tau.csv"
    np.savetxt(obs, np.column_stack([t, 0.1 * np.sin(t), 0.1 * np.cos(t)]), delimiter=",", header="t,q1,q2",
               comments="")
    np.savetxt(torques, np.column_stack([t, cmd, late]), delimiter=",", header="t,c1,c2,m1,m2", comments="")
    rc = cli.main(["identify", "double_pendulum_a0", "--observations", str(obs), "--torques", str(torques),
                   "--command", "q1=c1,q2=c2", "--measured", "q1=m1,q2=m2", "-o", str(tmp_path / "o.yaml")])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "q1: latency not timed" in err and "at the longest the grids try (15 ms, 8 ms)" in err, err
    assert "q2: latency not timed" in err and "its commands move too slowly to time it" in err, err
    assert load_mechanism(str(tmp_path / "o.yaml")).actuator_delays == (0.0045, 0.0045)


def test_a_plant_with_ripple_is_covered_by_the_stated_ripple(crank):
    """The crank four-bar whose actuator states a 2-N·m ripple: the simulated plant asked to (`ripple`) adds it
    (white, held over each step; none without noise, nor by default), and the fused estimate's effort σ covers the applied effort (NEES 0.85–0.94, 2σ
    coverage 96–97 % on two seeds, measured) — the same estimates scored with the ripple unstated are 4–9× too
    confident (coverage 57–74 %)."""
    from mbfg_ros.sim.plant import SimulatedPlant
    rippled = Mechanism(dataclasses.replace(crank.spec, actuators=tuple(
        dataclasses.replace(a, effort_sigma=2.0) for a in crank.spec.actuators)))
    motion = SimulatedPlant(rippled, dt=1e-3, seed=1, ripple=True).simulate(4.0)
    smooth = SimulatedPlant(rippled, dt=1e-3, seed=1).simulate(4.0)
    # (the two motions part slowly; step to step the difference of their applied efforts is the ripple's, × √2)
    step = np.diff(np.asarray(motion.applied)[:, 0] - np.asarray(smooth.applied)[:, 0])
    assert 1.8 < np.std(step) / np.sqrt(2) < 2.2
    quiet = SimulatedPlant(rippled, dt=1e-3, seed=1, noise=False, ripple=True).simulate(0.5)
    exact = SimulatedPlant(crank, dt=1e-3, seed=1, noise=False).simulate(0.5)
    np.testing.assert_array_equal(np.asarray(quiet.applied), np.asarray(exact.applied))
    scores = {}
    for name, stated in (("stated", rippled), ("unstated", crank)):
        est = FixedLagEstimator(stated, EstimatorConfig(mode="fused", compute_covariance=True))
        errs, sds = [], []
        for k in range(len(motion.t)):
            obs = {n: float(v[k]) for n, v in motion.readings.items()}
            e = est.step(float(motion.t[k]), efforts=motion.efforts[k], observations=obs)
            if motion.t[k] > 1.0:
                errs.append(e.efforts[0] - motion.applied[k][0])
                sds.append(e.efforts_std[0])
        errs, sds = np.array(errs), np.array(sds)
        scores[name] = (np.mean(errs ** 2 / sds ** 2), np.mean(np.abs(errs) <= 2 * sds))
    assert 0.6 < scores["stated"][0] < 1.5 and 0.9 < scores["stated"][1] < 0.99, scores
    assert scores["unstated"][0] > 2.5 and scores["unstated"][1] < 0.85, scores
