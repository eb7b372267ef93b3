"""Per-actuator effort kinds (estimated | commanded | passive): the mechanism's `effort` key, the configuration's
override, and what each kind does in each mode, on the numpy and the compiled path (estimation/efforts.py)."""

import math

import numpy as np
import pytest

import mbfg_ros.factors as F
from mbfg_ros.estimation.actuator_delay import delayed_commands
from mbfg_ros.estimation.config import EstimatorConfig
from mbfg_ros.estimation.efforts import CommandedEfforts, FusedEfforts, UnknownEfforts, effort_kinds, effort_model
from mbfg_ros.estimation.estimator import FixedLagEstimator
from mbfg_ros.factors.noise import default_sigmas
from mbfg_ros.model.mechanism import load_mechanism, resolve_mechanism_path
from mbfg_ros.model.spec import MechanismError
from mbfg_ros.sim.plant import Actuator, SimulatedPlant

DT = 2e-3


@pytest.fixture(scope="module")
def pendulum():
    return load_mechanism("double_pendulum_a0")


def _pendubot_law(mech, t, q, v):
    """A pendubot's commands: the shoulder driven, the elbow's motor off."""
    return np.array([0.8 * math.sin(2 * math.pi * 0.7 * t) + 0.3 * math.sin(2 * math.pi * 2.3 * t), 0.0])


@pytest.fixture(scope="module")
def pendubot(pendulum):
    return SimulatedPlant(pendulum, dt=DT, profile=_pendubot_law, seed=3,
                          actuator=Actuator.ideal(pendulum)).simulate(1.5)


def _run(mech, traj, commands=None, **config):
    est = FixedLagEstimator(mech, EstimatorConfig(dt=DT, compute_covariance=True, **config))
    commands = traj.efforts if commands is None else commands
    out = [est.step(t, efforts=commands[k], observations={n: r[k] for n, r in traj.readings.items()})
           for k, t in enumerate(traj.t)]
    return est, out


def _effort_rmse(traj, out, settle=250):
    E = np.array([e.efforts for e in out])
    return np.sqrt(np.mean((E[settle:] - traj.applied[settle:]) ** 2, axis=0))


# -- the mechanism file and the configuration ---------------------------------------------------------------------

def _pendulum_with(tmp_path, line):
    text = resolve_mechanism_path("double_pendulum_a0").read_text()
    old = "  - {coordinate: q2, effort_limit: torque_limit,"
    assert old in text
    path = tmp_path / "pendubot.yaml"
    path.write_text(text.replace(old, f"  - {{coordinate: q2, {line} effort_limit: torque_limit,"))
    return path


def test_the_mechanism_declares_an_actuators_effort_kind(tmp_path, pendulum):
    assert pendulum.actuator_efforts == (None, None)
    mech = load_mechanism(_pendulum_with(tmp_path, "effort: passive,"))
    assert mech.actuator_efforts == (None, "passive")
    assert mech.describe()["actuator_efforts"] == [None, "passive"]
    # the declared kind holds in every mode; the others follow the mode
    assert effort_kinds("estimation", mech) == ("estimated", "passive")
    assert effort_kinds("fused", mech) == ("commanded", "passive")
    assert effort_kinds("forward_dynamics", mech) == ("commanded", "passive")
    # the configuration overrides the file, by joint name
    assert effort_kinds("estimation", mech, {"q2": "estimated", "q1": "commanded"}) == ("commanded", "estimated")


@pytest.mark.parametrize("value", ["motor", "[passive]", "1"])
def test_a_wrong_effort_kind_names_the_file_and_the_actuator(tmp_path, value):
    path = _pendulum_with(tmp_path, f"effort: {value},")
    with pytest.raises(MechanismError, match=r"pendubot\.yaml: actuators\[1\]\.effort: expected one of "
                                             r"estimated, commanded, passive"):
        load_mechanism(path)


def test_wrong_overrides_are_refused_with_the_actuators_named(pendulum):
    with pytest.raises(ValueError, match=r"no actuator named 'elbow' in mechanism 'double_pendulum_a0' "
                                         r"\(actuators: q1, q2\)"):
        effort_kinds("estimation", pendulum, {"elbow": "passive"})
    with pytest.raises(ValueError, match=r"actuator 'q2': kind must be one of estimated, commanded, passive"):
        effort_kinds("estimation", pendulum, {"q2": "off"})
    with pytest.raises(ValueError, match=r"actuator 'q2': effort kind must be one of"):
        EstimatorConfig(actuator_efforts={"q2": "off"}).validated()


def test_each_mode_and_kind_gets_its_effort_model(pendulum):
    s = default_sigmas(pendulum.spec)

    def model(mode, **kinds):
        return effort_model(mode, pendulum, s, False, kinds)
    m = model("estimation", q2="passive")
    assert type(m) is UnknownEfforts and m.n_state == 1 and m.state_coordinates.tolist() == [pendulum.actuated[0]]
    m = model("estimation", q1="commanded")
    assert type(m) is UnknownEfforts and m.state_actuators.tolist() == [1] and m.uses_commands
    assert type(model("estimation", q1="commanded", q2="passive")) is CommandedEfforts   # nothing to estimate
    m = model("fused", q2="passive")
    assert type(m) is FusedEfforts and m.state_actuators.tolist() == [0]
    assert type(model("fused", q1="passive", q2="passive")) is CommandedEfforts
    m = model("fused", q1="estimated")       # its command is ignored: the disturbance carries its whole effort
    assert type(m) is FusedEfforts and m.n_state == 2
    np.testing.assert_array_equal(m.known(np.array([3.0, 4.0])), [0.0, 4.0])
    m = model("forward_dynamics", q1="estimated", q2="passive")     # (estimated counts as commanded here)
    np.testing.assert_array_equal(m.known(np.array([3.0, 4.0])), [3.0, 0.0])
    np.testing.assert_array_equal(m.known(np.array([np.nan, 4.0])), [0.0, 0.0])


# -- the factors with a τ block over some actuators ---------------------------------------------------------------

@pytest.mark.parametrize("independent", [False, True])
def test_inverse_dynamics_over_some_actuators_matches_finite_differences(pendulum, independent):
    rng = np.random.default_rng(4)
    n = pendulum.n
    q = pendulum.q0 + 0.0
    for col in range(n):          # a pose off the drawn one (the angles; the constraints are not needed here)
        q[col] += 0.3 * rng.standard_normal()
    v, a = rng.standard_normal(n), rng.standard_normal(n)
    act = [int(pendulum.actuated[1])]
    z = [int(c) for c in pendulum.actuated] if independent else None
    unit = F.InverseDynamics(pendulum, actuated=act, z=z)
    values = (pendulum.gravity_forces + rng.standard_normal(n),)
    tau = rng.standard_normal(1)
    blocks = [q, v, a if z is None else a[z], tau]
    _, J = unit.evaluate(*blocks, params=values)
    for i, b in enumerate(blocks):
        fd = np.zeros((unit.dim, b.size))
        for k in range(b.size):
            bp = [x.copy() for x in blocks]
            bm = [x.copy() for x in blocks]
            bp[i][k] += 1e-6
            bm[i][k] -= 1e-6
            fd[:, k] = (unit.error(*bp, params=values) - unit.error(*bm, params=values)) / 2e-6
        np.testing.assert_allclose(J[i], fd, rtol=1e-5, atol=1e-6 * (1 + np.abs(fd).max()))
    # the τ column is the full unit's column of that actuator
    full = F.InverseDynamics(pendulum, z=z)
    _, Jf = full.evaluate(q, v, blocks[2], np.array([0.0, tau[0]]), params=values)
    np.testing.assert_allclose(J[3][:, 0], Jf[3][:, 1], rtol=1e-12, atol=1e-12)


# -- what each kind does -----------------------------------------------------------------------------------------

def test_a_passive_joint_in_estimation_mode_is_known_zero(pendulum, pendubot):
    est, out = _run(pendulum, pendubot, mode="estimation", actuator_efforts={"q2": "passive"})
    assert est.factors.layout.slices["tau"].stop - est.factors.layout.slices["tau"].start == 1
    assert all(e.status == "ok" for e in out[1:])
    assert all(e.efforts[1] == 0.0 for e in out) and out[-1].efforts_std[1] == 0.0 and out[-1].efforts_std[0] > 0
    _, both = _run(pendulum, pendubot, mode="estimation")
    # one unknown less: the shoulder's effort is better determined
    assert _effort_rmse(pendubot, out)[0] < 0.8 * _effort_rmse(pendubot, both)[0]


def test_commanded_and_passive_in_estimation_mode_are_the_known_efforts(pendulum, pendubot):
    commands = pendubot.efforts.copy()
    commands[100:110, 0] = np.nan                 # unknown commands count as 0
    est, out = _run(pendulum, pendubot, commands, mode="estimation",
                    actuator_efforts={"q1": "commanded", "q2": "estimated"})
    assert type(est.efforts) is UnknownEfforts and est.efforts.state_actuators.tolist() == [1]
    E = np.array([e.efforts for e in out])
    # (each applied after the motors' delay, as the mechanism file says: estimation/actuator_delay.py)
    applied = delayed_commands(pendubot.t[:len(out)], commands[:len(out)], pendulum.actuator_delays,
                               pendulum.actuator_time_constants)
    np.testing.assert_allclose(E[:, 0], np.where(np.isfinite(applied[:, 0]), applied[:, 0], 0.0), rtol=0, atol=1e-15)
    # (a commanded effort's σ is its motor's stated ripple about the command's response: the file's effort_sigma)
    assert out[-1].efforts_std[0] == pendulum.actuator_effort_sigmas[0] > 0 and out[-1].efforts_std[1] > 0
    # the elbow's effort (truly 0) is estimated near 0
    assert _effort_rmse(pendubot, out)[1] < 0.05


def test_a_passive_joint_in_fused_mode_has_no_disturbance(pendulum, pendubot):
    est, out = _run(pendulum, pendubot, mode="fused", actuator_efforts={"q2": "passive"})
    assert est.efforts.n_state == 1
    assert all(e.efforts[1] == 0.0 and e.disturbance[1] == 0.0 for e in out)
    assert out[-1].disturbance_std[1] == 0.0 and out[-1].disturbance_std[0] > 0
    assert _effort_rmse(pendubot, out)[0] < 0.05


# -- the compiled prediction is the numpy one ----------------------------------------------------------------------

@pytest.mark.parametrize("mode, kinds", [("estimation", {"q2": "passive"}),
                                         ("estimation", {"q1": "commanded"}),
                                         ("fused", {"q1": "passive"})])
def test_the_compiled_prediction_with_some_actuators_known(pendulum, pendubot, mode, kinds):
    est, out = _run(pendulum, pendubot.head(300), mode=mode, actuator_efforts=kinds)
    assert est.window.last.model.compiled and all(e.status in ("ok", "initialized") for e in out)
    x, factors = est.stepper.x, est.factors
    for prev in (est.stepper.a_prev, None):
        compiled, _ = factors.predict(x, DT, prev, DT)
        reference, _ = super(type(factors), factors).predict(x, DT, prev, DT)
        np.testing.assert_array_equal(compiled, reference)


# -- the online density fit with some actuators known -------------------------------------------------------------

def test_the_density_fit_models_only_the_estimated_efforts(pendulum):
    """The bank around the true motion of a double pendulum whose shoulder takes a known command (a sine) and
    whose elbow's effort is an integrated random walk of a known density: with τ covering the elbow alone and the
    shoulder's command in the drift (the model's q̈), the fit finds the walk's density within a factor 2 from 30×
    off (one 10-s walk); with τ over both actuators it reads the shoulder's sine as effort variation."""
    from mbfg_ros.estimation import density_adaptation as DA
    from test_tuning import DT as WALK_DT, integrated_random_walk
    true_density, sigma, seconds = 0.01, 1e-4, 10.0
    rng = np.random.default_rng(5)
    n = int(round(seconds / WALK_DT)) + 1
    walk = integrated_random_walk(true_density, n + 2, rng)

    def law(mech, t, q, v):
        return np.array([0.5 * math.sin(2 * math.pi * 0.6 * t), walk[int(round(t / WALK_DT))]])
    traj = SimulatedPlant(pendulum, dt=WALK_DT, seed=5, profile=law, actuator=Actuator.ideal(pendulum),
                          sensors=[]).simulate(seconds)
    cols = [int(c) for c in pendulum.actuated]
    names = [s.name for s in pendulum.sensors]
    y = traj.q[:, cols] + rng.normal(0.0, sigma, (len(traj.t), 2))
    for start in (true_density / 30.0, true_density * 30.0):
        a = DA.DensityAdaptation(pendulum, start, 1e-9, sensor_sigmas=dict.fromkeys(names, sigma),
                                 actuated=cols[1:])
        assert a.na == 1
        for k, t in enumerate(traj.t):
            a.observe(float(t), dict(zip(names, y[k].tolist())), traj.q[k], traj.v[k], traj.a[k], traj.applied[k, 1:])
        assert a.B.shape == (2, 1)
        assert abs(math.log10(a.density / true_density)) < math.log10(2.0), (start, a.density)
    both = DA.DensityAdaptation(pendulum, true_density, 1e-9, sensor_sigmas=dict.fromkeys(names, sigma))
    for k, t in enumerate(traj.t):
        both.observe(float(t), dict(zip(names, y[k].tolist())), traj.q[k], traj.v[k], traj.a[k], traj.applied[k])
    assert both.density > 10 * a.density, (both.density, a.density)


def test_the_estimators_density_fit_covers_its_estimated_actuators(pendulum, pendubot):
    est, _ = _run(pendulum, pendubot.head(200), mode="estimation", actuator_efforts={"q2": "passive"})
    fit = est.density_adaptation
    assert fit is not None and fit.na == 1 and fit.actuated.tolist() == [int(pendulum.actuated[0])]
    assert fit.counted > 0


def test_the_joint_covariance_has_no_effort_rows_for_known_actuators(pendulum, pendubot):
    """`joint_covariance` of both joints with the shoulder's effort estimated and the elbow's passive: the
    shoulder's effort variance is its τ state's, the elbow's row and column are 0."""
    est, out = _run(pendulum, pendubot.head(200), mode="estimation", actuator_efforts={"q2": "passive"})
    cols = [int(c) for c in pendulum.actuated]
    P = est.joint_covariance(cols)
    np.testing.assert_allclose(math.sqrt(P[4, 4]), out[-1].efforts_std[0], rtol=1e-6)
    assert not P[5].any() and not P[:, 5].any() and P[4, 4] > 0


# -- prescribed motion: a position-controlled joint -----------------------------------------------------------------

@pytest.fixture(scope="module")
def robot_run():
    robot = load_mechanism("pick_and_place_robot")
    return robot, SimulatedPlant(robot, dt=1e-3, seed=4, actuator=Actuator.ideal(robot)).simulate(1.5)


def _robot_estimates(robot, traj, prescribed: bool, kinds):
    """Estimation mode on the closed-loop robot: motor1 in torque mode (its command known), motor2 `kinds`;
    readings: motor1's encoder only, and with `prescribed` motor2's set-points as 'q:motor2' (the motion it is
    commanded to follow, here the plant's own to within 1 mrad)."""
    rng = np.random.default_rng(9)
    c2 = robot.coordinate_index("motor2")
    est = FixedLagEstimator(robot, EstimatorConfig(dt=1e-3, mode="estimation",
                                                   actuator_efforts={"motor1": "commanded", "motor2": kinds}))
    out = []
    for k, t in enumerate(traj.t):
        obs = {"motor1": traj.readings["motor1"][k]}
        if prescribed:
            obs["q:motor2"] = traj.q[k, c2] + rng.normal(0.0, 1e-3)
        out.append(est.step(t, efforts=traj.efforts[k], observations=obs))
    return est, out


def test_a_prescribed_joint_of_a_closed_loop_gets_its_effort_estimated(robot_run):
    """The pick-and-place robot with one motor in torque mode and one in position mode: the position-controlled
    motor's effort is estimated (a state), its set-points hold its coordinate (a soft prior), the other motor's
    effort is its command.  Its effort comes within 15 % of its RMS (4.5 %), its angle within 3 mrad; without the
    set-points (the same kinds, no reading of motor2) its effort is worse (6 %)."""
    robot, traj = robot_run
    est, out = _robot_estimates(robot, traj, True, "prescribed")
    assert isinstance(est.efforts, UnknownEfforts) and est.efforts.state_actuators.tolist() == [1]
    E = np.array([e.efforts for e in out])
    np.testing.assert_array_equal(E[:, 0], traj.efforts[:, 0])       # torque mode: the command
    settle = 300
    rms2 = np.sqrt(np.mean(traj.applied[settle:, 1] ** 2))
    err = np.sqrt(np.mean((E[settle:, 1] - traj.applied[settle:, 1]) ** 2))
    assert err < 0.15 * rms2, (err, rms2)
    c2 = robot.coordinate_index("motor2")
    angle_err = np.abs(np.array([e.q[c2] for e in out])[settle:] - traj.q[settle:, c2]).max()
    assert angle_err < 3e-3, angle_err
    # without the set-points motor2 follows from motor1's reading through the loop alone: worse on both
    _, blind = _robot_estimates(robot, traj, False, "prescribed")
    E_blind = np.array([e.efforts for e in blind])
    assert np.sqrt(np.mean((E_blind[settle:, 1] - traj.applied[settle:, 1]) ** 2)) > err
    # the kind is known everywhere kinds are: forward dynamics takes its command, fused estimates it
    assert effort_kinds("fused", robot, {"motor2": "prescribed"}) == ("commanded", "prescribed")
    assert FixedLagEstimator(robot, EstimatorConfig(mode="fused", actuator_efforts={"motor2": "prescribed"})
                             ).efforts.state_actuators.tolist() == [0, 1]


def test_mbfg_estimate_takes_prescribed_set_points(robot_run, tmp_path, capsys):
    from mbfg_ros.cli.commands import main
    robot, traj = robot_run
    n = 501
    t = traj.t[:n]
    c2 = robot.coordinate_index("motor2")
    files = {"obs": ("t,motor1", traj.readings["motor1"][:n]), "cmd": ("t,motor1,motor2", traj.efforts[:n]),
             "presc": ("t,motor2", traj.q[:n, c2])}
    for name, (header, data) in files.items():
        np.savetxt(tmp_path / f"{name}.csv", np.column_stack([t, data]), delimiter=",", header=header, comments="")
    base = ["estimate", "pick_and_place_robot", "--observations", str(tmp_path / "obs.csv"), "--torques",
            str(tmp_path / "cmd.csv"), "--actuator-effort", "motor1=commanded", "--actuator-effort",
            "motor2=prescribed", "-o", str(tmp_path / "out.csv")]
    assert main(base + ["--prescribed", str(tmp_path / "presc.csv"), "--prescribed-sigma", "0.002"]) == 0
    header = (tmp_path / "out.csv").read_text().splitlines()[0].split(",")
    out = np.loadtxt(tmp_path / "out.csv", delimiter=",", skiprows=1)
    tau2 = out[300:, header.index("tau_motor2")]
    assert np.sqrt(np.mean((tau2 - traj.applied[300:n, 1]) ** 2)) < 0.15 * np.sqrt(np.mean(traj.applied[300:n, 1] ** 2))
    capsys.readouterr()
    assert main(base) == 2
    assert "actuator(s) motor2 are 'prescribed': give their set-points with --prescribed" in capsys.readouterr().err
    np.savetxt(tmp_path / "bad.csv", np.column_stack([t, t, t]), delimiter=",", header="t,motor2,motor1", comments="")
    assert main(base + ["--prescribed", str(tmp_path / "bad.csv")]) == 2
    assert "unknown column(s) motor1 (the prescribed actuators: motor2)" in capsys.readouterr().err
