"""`mbfg tune` (mbfg_ros.tuning): on recordings generated from the estimator's own stochastic model with known
densities — the crank four-bar at dt 5 ms, efforts (estimation) or a disturbance added to a known PD command
(fused; damped with the default time constant) that are integrated random walks of a known density, encoder noise of known σ — the maximum innovation
likelihood recovers the density (and the encoder σ when asked) within 30 %; the parameter file it writes is read
by `mbfg estimate --params` and by the node; bad inputs give one-line errors."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from mbfg_ros.cli.commands import main
from mbfg_ros.factors.noise import default_sigmas
from mbfg_ros.factors.processes import damped_walk_transition
from mbfg_ros.sim.plant import Actuator, SimulatedPlant
from mbfg_ros.tuning.likelihood import Recording, TuningError, encoder_layout, fit, initial_values
from mbfg_ros.tuning.params_file import ParamsFileError, format_params, read_params

REPO = Path(__file__).resolve().parents[1]
DT = 5e-3


def integrated_random_walk(density: float, n: int, rng, time_constant: float = math.inf, dt: float = DT) -> np.ndarray:
    """n samples at dt of x with ẍ white of `density` (exact discretization of (x, ẋ)), from rest; with a finite
    time constant T damped back to 0: ẍ = −(2/T) ẋ − x/T² + w (the fused mode's disturbance)."""
    F, C = damped_walk_transition(dt, time_constant)
    C = np.linalg.cholesky(density * C)
    x, out = np.zeros(2), np.empty(n)
    for k in range(n):
        out[k] = x[0]
        x = F @ x + C @ rng.standard_normal(2)
    return out


def synthetic(crank, mode: str, density: float, sigma: float, seconds: float, seed: int, dt: float = DT,
              time_constant: float = None):
    """(t, encoder readings, commands) at dt: estimation mode, the applied torque is the random walk; fused, a
    PD command (known, recorded) keeps the crank near 1 rad and the applied torque is command + the random
    walk."""
    rng = np.random.default_rng(seed)
    n = int(round(seconds / dt)) + 1
    # fused: the disturbance process of the estimator's model, the default time constant
    if time_constant is None:
        time_constant = default_sigmas()["disturbance_time_constant"] if mode == "fused" else math.inf
    walk = integrated_random_walk(density, n + 2, rng, time_constant, dt)
    c = int(crank.actuated[0])
    commands = np.zeros((n + 2, 1))

    def law(mech, t, q, v):
        k = int(round(t / dt))
        if mode == "fused":
            commands[k] = -400.0 * (q[c] - 1.0 - 0.5 * math.sin(2.0 * t)) - 40.0 * v[c]
        return commands[k] + walk[k]

    plant = SimulatedPlant(crank, dt=dt, seed=seed, profile=law, actuator=Actuator.ideal(crank), sensors=[])
    traj = plant.simulate(seconds)
    readings = traj.q[:, c] + rng.normal(0.0, sigma, len(traj.t))
    return traj.t, readings, commands[:len(traj.t)]


def write_csvs(tmp_path, t, readings, commands):
    obs, cmd = tmp_path / "obs.csv", tmp_path / "cmd.csv"
    np.savetxt(obs, np.column_stack([t, readings]), delimiter=",", header="t,crank", comments="")
    np.savetxt(cmd, np.column_stack([t, commands]), delimiter=",", header="t,crank", comments="")
    return obs, cmd


def fitted(text: str, key: str) -> float:
    import yaml
    doc = yaml.safe_load(text)["/**/mbfg_estimator"]["ros__parameters"]
    section, name = key.split(".")
    return float(doc[section][name])


def test_tune_recovers_the_disturbance_density_and_estimate_reads_the_file(crank, tmp_path, capsys):
    """Fused mode through the command line: the disturbance density within 30 %; the file's values are what
    `mbfg estimate --params` uses (the same output as the values given as options, unlike the defaults)."""
    true_density, sigma = 300.0, 1e-3
    t, y, u = synthetic(crank, "fused", true_density, sigma, 20.0, seed=4)
    obs, cmd = write_csvs(tmp_path, t, y, u)
    params = tmp_path / "tuned.yaml"
    # 4001 samples, decimated to 2000 steps at 10 ms; the acceleration density held ~0 (the data have none)
    assert main(["tune", "four_bar_crank", "--observations", str(obs), "--torques", str(cmd), "--mode", "fused",
                 "--sensor-sigma", f"crank={sigma}", "--acceleration-density", "1e-9", "--max-steps", "2000",
                 "-o", str(params)]) == 0
    printed = capsys.readouterr().out
    assert "disturbance_density" in printed and "1σ" in printed
    text = params.read_text()
    assert text.startswith("# Written by: mbfg tune four_bar_crank --mode fused")
    d = fitted(text, "sigmas.disturbance_density")
    assert abs(d / true_density - 1.0) < 0.3, d
    assert fitted(text, "sensor_sigmas.crank") == pytest.approx(sigma)
    # round trip: estimate --params on the first 0.3 s uses the file's values: the same output as those values
    # given as options, another one with the defaults, and an explicit option wins over the file
    (tmp_path / "short").mkdir()
    short_obs, short_cmd = write_csvs(tmp_path / "short", t[:61], y[:61], u[:61])
    a = fitted(text, "sigmas.acceleration_density")
    T = fitted(text, "sigmas.disturbance_time_constant")        # fitted with the density: 1 s in the data
    assert 0.4 < T < 2.5, T
    outs = {}
    for label, extra in (("file", ["--params", str(params)]),
                         ("options", ["--mode", "fused", f"--disturbance-density={d!r}",
                                      f"--acceleration-density={a!r}", f"--disturbance-time-constant={T!r}"]),
                         ("defaults", ["--mode", "fused"]),
                         ("file, option wins", ["--params", str(params), "--disturbance-density=3000"])):
        out = tmp_path / f"{label}.csv"
        assert main(["estimate", "four_bar_crank", "--observations", str(short_obs), "--torques", str(short_cmd),
                     "-o", str(out)] + extra) == 0
        outs[label] = np.loadtxt(out, delimiter=",", skiprows=1)
    assert np.array_equal(outs["file"], outs["options"])      # the crank σ in the file equals the default 1e-3
    assert not np.allclose(outs["file"], outs["defaults"])
    assert not np.allclose(outs["file"], outs["file, option wins"])


def test_tune_recovers_the_effort_density(crank):
    """Estimation mode (the library call `mbfg tune` makes): the effort density within 30 %."""
    true_density, sigma = 3.0, 1e-4      # small: the torque stays near gravity's, the crank swings (12 s)
    t, y, _ = synthetic(crank, "estimation", true_density, sigma, 12.0, seed=4)
    names, coords, _ = encoder_layout(crank)
    rec = Recording(t, y[:, None], names, coords, None, "synthetic")
    initial = initial_values(crank, {"acceleration_density": 1e-9}, sensor_sigmas={"crank": sigma})
    result = fit(crank, rec, "estimation", initial, ["effort_density"], max_steps=2000)
    (f,) = result.fitted
    assert abs(f.value / true_density - 1.0) < 0.3, f
    assert 0.0 < f.relative_std < 0.3 and not f.at_bound, f


def test_a_disturbance_time_constant_below_a_few_samples_is_not_fitted(crank):
    """A disturbance that decorrelates within a sample interval is white to the recording: its time constant
    trades against the density and the sensor σ, and a file with such a value gives the estimator a σ far below
    its errors.  The fit stops at MIN_TIME_CONSTANT_SAMPLES intervals and says the recording does not determine it."""
    from mbfg_ros.tuning.likelihood import MIN_TIME_CONSTANT_SAMPLES
    sigma = 1e-4
    t, y, u = synthetic(crank, "fused", 300.0, sigma, 6.0, seed=5, time_constant=0.2 * DT)
    names, coords, _ = encoder_layout(crank)
    rec = Recording(t, y[:, None], names, coords, u, "synthetic")
    initial = initial_values(crank, {"acceleration_density": 1e-9}, sensor_sigmas={"crank": sigma})
    result = fit(crank, rec, "fused", initial, ["disturbance_density", "disturbance_time_constant"], max_steps=2000)
    f = next(f for f in result.fitted if f.name == "disturbance_time_constant")
    assert f.value >= MIN_TIME_CONSTANT_SAMPLES * DT * (1 - 1e-9), f
    assert f.at_bound, f
    assert "does not determine" in f.describe()


def test_tune_uses_the_actual_intervals_and_the_readings_present(crank):
    """A recording with 30 % of its samples dropped (stamps 1–4 steps apart) and 10 % of the rest's readings
    missing (NaN): the fit steps by each actual interval and uses the readings there are; the effort density comes
    back within 40 %, and the likelihood of the real stamps beats that of the same readings put on a uniform grid
    (the old refusal's only alternative: resampling by hand)."""
    from mbfg_ros.tuning.likelihood import log_likelihood
    true_density, sigma = 3.0, 1e-4
    t, y, _ = synthetic(crank, "estimation", true_density, sigma, 6.0, seed=6)
    rng = np.random.default_rng(7)
    keep = rng.random(t.size) > 0.3
    keep[:2] = True
    t, y = t[keep], y[keep].copy()
    y[2:][rng.random(t.size - 2) < 0.1] = np.nan
    names, coords, _ = encoder_layout(crank)
    rec = Recording(t, y[:, None], names, coords, None, "jittered")
    initial = initial_values(crank, {"acceleration_density": 1e-9}, sensor_sigmas={"crank": sigma})
    result = fit(crank, rec, "estimation", initial, ["effort_density"], max_steps=2000)
    (f,) = result.fitted
    assert abs(f.value / true_density - 1.0) < 0.4, f
    values = dict(initial, effort_density=true_density)
    uniform = Recording(t[0] + rec.dt * np.arange(t.size), y[:, None], names, coords, None, "uniform")
    assert log_likelihood(crank, rec, "estimation", values) > log_likelihood(crank, uniform, "estimation", values)


def test_tune_recovers_the_encoder_sigma_when_asked(crank):
    """--fit-sensor-sigmas: started a factor 3 off, the encoder σ comes back within 30 % (with the density)."""
    true_density, sigma = 300.0, 3e-4
    t, y, u = synthetic(crank, "fused", true_density, sigma, 2.0, seed=5)
    names, coords, _ = encoder_layout(crank)
    rec = Recording(t, y[:, None], names, coords, u, "synthetic")
    initial = initial_values(crank, {"acceleration_density": 1e-9}, sensor_sigmas={"crank": 1e-3})
    result = fit(crank, rec, "fused", initial, ["disturbance_density", "sensor_sigmas.crank"])
    assert abs(result.sensor_sigmas["crank"] / sigma - 1.0) < 0.3, result.fitted
    assert result.fitted[1].relative_std < 0.1


def test_decimation_keeps_every_mth_reading_and_averages_the_commands():
    t = np.arange(10) * 0.1
    rec = Recording(t, t[:, None] * 2, ["e"], [0], np.arange(10.0)[:, None], "r")
    d = rec.decimated(4)            # ceil(10/4) = 3: samples 0, 3, 6
    assert d.t == pytest.approx([0.0, 0.3, 0.6]) and d.dt == pytest.approx(0.3)
    assert d.readings[:, 0] == pytest.approx([0.0, 0.6, 1.2])
    assert d.commands[:, 0] == pytest.approx([1.0, 4.0, 7.0])
    assert rec.decimated(100) is rec


# --- the parameter file --------------------------------------------------------------------------------------
def test_params_file_round_trip_and_errors_name_file_and_key(crank, tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text(format_params("fused", {"disturbance_density": 123.0, "acceleration_density": 0.002},
                               {"crank": 2e-4}, ["a header"]))
    assert p.read_text().startswith("# a header\n")
    assert read_params(p, crank) == {"mode": "fused", "sigmas": {"disturbance_density": 123.0,
                                                                   "acceleration_density": 0.002},
                                     "sensor_sigmas": {"crank": 2e-4}}
    # the shipped node file is accepted too (node-only keys are left out)
    assert read_params(REPO / "config" / "four_bar.yaml", crank)["mode"] == "fused"
    cases = {
        "/**/mbfg_estimator:\n  ros__parameters:\n    bogus: 1\n": "ros__parameters.bogus: unknown parameter",
        "/**/mbfg_estimator:\n  ros__parameters:\n    sigmas: {effort_densty: 1.0}\n": "sigmas.effort_densty",
        "/**/mbfg_estimator:\n  ros__parameters:\n    sensor_sigmas: {wheel: 1.0}\n": "sensor_sigmas.wheel",
        "/**/mbfg_estimator:\n  ros__parameters:\n    sigmas: {effort_density: -1}\n": "must be a number > 0",
        "/**/other_node:\n  ros__parameters: {}\n": "no 'mbfg_estimator' node",
        "- 1\n": "not a ROS 2 parameter file",
    }
    for text, expected in cases.items():
        p.write_text(text)
        with pytest.raises(ParamsFileError, match=expected) as exc:
            read_params(p, crank)
        assert str(p) in str(exc.value)


def test_the_node_reads_the_tuned_file(tmp_path):
    """`--ros-args --params-file config/four_bar.yaml --params-file PARAMS.yaml`: the node's parameter
    parsing (ros/parameters.py, in an EstimatorNode) takes the tuned sigmas and sensor sigmas."""
    pytest.importorskip("rclpy")
    import rclpy
    from rclpy.context import Context
    from mbfg_ros.ros import node as N
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from ros_helpers import fresh_domain_id
    p = tmp_path / "tuned.yaml"
    p.write_text(format_params("estimation", {"effort_density": 4321.0, "acceleration_density": 0.002},
                               {"crank": 2e-4}, ["test"]))
    ctx = Context()
    rclpy.init(args=["--ros-args", "--params-file", str(REPO / "config" / "four_bar.yaml"), "--params-file",
                     str(p), "-p", "publish_markers:=false"], context=ctx, domain_id=fresh_domain_id())
    try:
        node = N.EstimatorNode(context=ctx)
        try:
            assert node.config.mode == "estimation"
            assert node.config.sigmas["effort_density"] == 4321.0
            assert node.config.sigmas["acceleration_density"] == 0.002
            assert node.config.sensor_sigmas["crank"] == 2e-4
        finally:
            node.destroy_node()
    finally:
        rclpy.shutdown(context=ctx)


def test_every_node_parameter_is_applied_or_accepted_by_estimate_params(crank, tmp_path):
    """A node parameter file may hold any parameter the node declares: `mbfg estimate --params` applies its keys
    (`APPLIED_KEYS`) and accepts the node's own; smoothed_lag is applied, and checked."""
    pytest.importorskip("rclpy")
    import rclpy
    from rclpy.context import Context
    from mbfg_ros.ros import node as N
    from mbfg_ros.tuning.params_file import APPLIED_KEYS, NODE_ONLY_KEYS
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from ros_helpers import fresh_domain_id
    ctx = Context()
    rclpy.init(args=["--ros-args", "--params-file", str(REPO / "config" / "four_bar.yaml")], context=ctx,
               domain_id=fresh_domain_id())
    try:
        node = N.EstimatorNode(context=ctx)
        try:
            declared = {n.split(".")[0] for n in node._parameters if not n.startswith("qos_overrides.")}
        finally:
            node.destroy_node()
    finally:
        rclpy.shutdown(context=ctx)
    assert declared - set(APPLIED_KEYS) - set(NODE_ONLY_KEYS) == set()
    p = tmp_path / "p.yaml"
    p.write_text("/**/mbfg_estimator:\n  ros__parameters:\n    smoothed_lag: 4\n    publish_covariance: true\n"
                 "    identify: [crank.gain]\n")
    assert read_params(p, crank) == {"smoothed_lag": 4}
    p.write_text("/**/mbfg_estimator:\n  ros__parameters:\n    smoothed_lag: 1.5\n")
    with pytest.raises(ParamsFileError, match="smoothed_lag must be an integer ≥ 0"):
        read_params(p, crank)


# --- the command line --------------------------------------------------------------------------------------
def test_tune_from_a_bag(tmp_path, capsys):
    """A rosbag2 (MCAP) bag of bench/make_bags.py: the fit runs from its topics and writes the file; a missing
    topic is a one-line error naming the topics there are."""
    pytest.importorskip("rosbags")
    sys.path.insert(0, str(REPO / "bench"))
    from make_bags import write_bag
    bag = tmp_path / "bag"
    write_bag(bag, "four_bar_crank", duration=0.6)
    out = tmp_path / "p.yaml"
    assert main(["tune", "four_bar_crank", "--bag", str(bag), "--mode", "fused", "--max-steps", "120",
                 "-o", str(out)]) == 0
    assert "disturbance_density" in out.read_text() and "/joint_observations" in out.read_text()
    capsys.readouterr()
    assert main(["tune", "four_bar_crank", "--bag", str(bag), "--mode", "fused", "--torques-topic", "cmd",
                 "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no topic /cmd" in err and "/commanded_effort" in err


def test_tune_refuses_an_implausible_bag_message(tmp_path, capsys):
    """A command beyond the actuator's effort_limit in a bag is a one-line error naming the topic and the
    message, as an implausible CSV cell is (the node would refuse it too)."""
    pytest.importorskip("rosbags")
    from rosbags.rosbag2 import Writer
    from rosbags.typesys import Stores, get_typestore
    ts = get_typestore(Stores.ROS2_HUMBLE)
    T = ts.types
    Time, Header, JointState = T["builtin_interfaces/msg/Time"], T["std_msgs/msg/Header"], T["sensor_msgs/msg/JointState"]
    bag, empty = tmp_path / "bag", np.zeros(0)
    with Writer(bag, version=9) as w:
        c_obs = w.add_connection("/joint_observations", JointState.__msgtype__, typestore=ts)
        c_eff = w.add_connection("/commanded_effort", JointState.__msgtype__, typestore=ts)
        for k in range(20):
            t_ns = 10**9 + k * 10**6
            hdr = Header(stamp=Time(sec=t_ns // 10**9, nanosec=t_ns % 10**9), frame_id="")
            obs = JointState(header=hdr, name=["crank"], position=np.array([0.01 * k]), velocity=empty, effort=empty)
            eff = JointState(header=hdr, name=["crank"], position=empty, velocity=empty,
                             effort=np.array([1e300 if k == 7 else 1.0]))
            w.write(c_obs, t_ns, ts.serialize_cdr(obs, JointState.__msgtype__))
            w.write(c_eff, t_ns, ts.serialize_cdr(eff, JointState.__msgtype__))
    assert main(["tune", "four_bar_crank", "--bag", str(bag), "--mode", "fused", "-o", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "/commanded_effort message 8" in err and "implausible effort" in err, err


def write_observation_bag(path, stamps_ns, positions):
    """A bag with sensor_msgs/JointState crank readings on /joint_observations at the given stamps."""
    from rosbags.rosbag2 import Writer
    from rosbags.typesys import Stores, get_typestore
    ts = get_typestore(Stores.ROS2_HUMBLE)
    T = ts.types
    Time, Header, JointState = T["builtin_interfaces/msg/Time"], T["std_msgs/msg/Header"], T["sensor_msgs/msg/JointState"]
    empty = np.zeros(0)
    with Writer(path, version=9) as w:
        conn = w.add_connection("/joint_observations", JointState.__msgtype__, typestore=ts)
        for t_ns, position in zip(stamps_ns, positions):
            hdr = Header(stamp=Time(sec=int(t_ns) // 10**9, nanosec=int(t_ns) % 10**9), frame_id="")
            msg = JointState(header=hdr, name=["crank"], position=np.array([position]), velocity=empty, effort=empty)
            w.write(conn, int(t_ns), ts.serialize_cdr(msg, JointState.__msgtype__))


def test_tune_from_a_bag_with_jittered_stamps_and_missing_readings(tmp_path, capsys):
    """A bag's stamps are taken as they are (drift, a late message), a NaN position is a missing reading; two
    messages with one stamp are a one-line error naming both."""
    pytest.importorskip("rosbags")
    steps = np.full(40, 5_050_000)                        # 5 ms + 1 %
    steps[[9, 25]] = 13_000_000                           # two messages 2.6 steps late
    stamps = 10**9 + np.concatenate([[0], np.cumsum(steps)])
    positions = 0.3 * ((stamps - stamps[0]) * 1e-9) ** 2
    positions[[4, 30]] = np.nan
    write_observation_bag(tmp_path / "bag", stamps, positions)
    out = tmp_path / "p.yaml"
    assert main(["tune", "four_bar_crank", "--bag", str(tmp_path / "bag"), "--mode", "estimation",
                 "-o", str(out)]) == 0, capsys.readouterr().err
    assert "41 samples at dt 0.00505 s" in out.read_text()
    stamps[12] = stamps[11]
    write_observation_bag(tmp_path / "repeated", stamps, positions)
    assert main(["tune", "four_bar_crank", "--bag", str(tmp_path / "repeated"), "--mode", "estimation",
                 "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "/joint_observations messages 12 and 13 have the same stamp" in err, err


@pytest.mark.parametrize("case, expected", [
    ("no_encoder_column", "no column for encoder(s) crank"),
    ("fused_without_torques", "--mode fused needs --torques"),
    ("no_complete_reading", "no sample has a reading of every encoder (crank)"),
    ("no_encoder", "one encoder per degree of freedom"),
    ("bag_and_csv", "not allowed with argument"),
    ("missing_bag", "no such bag"),
    ("no_threads", "--threads"),
])
def test_tune_bad_inputs_are_one_line_errors(tmp_path, capsys, case, expected):
    t = np.arange(20) * DT
    obs = tmp_path / "obs.csv"
    np.savetxt(obs, np.column_stack([t, 0.1 * t]), delimiter=",", header="t,crank", comments="")
    mech = "four_bar_crank"
    args = ["--observations", str(obs), "--mode", "estimation"]
    if case == "no_encoder_column":
        np.savetxt(obs, np.column_stack([t, 0.1 * t]), delimiter=",", header="t,coupler_gyro", comments="")
    elif case == "fused_without_torques":
        args[-1] = "fused"
    elif case == "no_complete_reading":
        obs.write_text("t,crank\n" + "".join(f"{x:.3f},{'' if i % 2 else 'nan'}\n" for i, x in enumerate(t)))
    elif case == "no_encoder":
        text = (REPO / "mechanisms" / "four_bar_crank.yaml").read_text()
        mech_file = tmp_path / "gyro_only.yaml"
        mech_file.write_text(text.replace("  - {type: encoder, coordinate: crank, sigma: 0.001}\n", ""))
        mech = str(mech_file)
    elif case == "bag_and_csv":
        args += ["--bag", str(tmp_path)]
    elif case == "missing_bag":
        args = ["--bag", str(tmp_path / "nope"), "--mode", "estimation"]
    elif case == "no_threads":
        args += ["--threads", "0"]
    assert main(["tune", mech] + args + ["-o", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mbfg: error: ") and err.count("\n") == 1 and expected in err, err


def test_estimate_params_errors_name_the_file_and_key(tmp_path, capsys):
    t = np.arange(5) * DT
    obs = tmp_path / "obs.csv"
    np.savetxt(obs, np.column_stack([t, 0 * t]), delimiter=",", header="t,crank", comments="")
    p = tmp_path / "p.yaml"
    p.write_text("/**/mbfg_estimator:\n  ros__parameters:\n    sigmas:\n      effort_densty: 5.0\n")
    assert main(["estimate", "four_bar_crank", "--observations", str(obs), "--params", str(p),
                 "-o", str(tmp_path / "o.csv")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(p) in err and "sigmas.effort_densty" in err
    p.write_text("/**/mbfg_estimator:\n  ros__parameters:\n    mode: forward_dynamics\n")
    assert main(["estimate", "four_bar_crank", "--observations", str(obs), "--params", str(p),
                 "-o", str(tmp_path / "o.csv")]) == 2
    assert "mode must be one of estimation, fused" in capsys.readouterr().err


def test_tuning_error_is_raised_for_a_fused_fit_without_commands(crank):
    names, coords, _ = encoder_layout(crank)
    rec = Recording(np.arange(20) * DT, np.zeros((20, 1)), names, coords, None, "r")
    with pytest.raises(TuningError, match="needs the commanded efforts"):
        fit(crank, rec, "fused", initial_values(crank), ["disturbance_density"])


def test_doubles_are_written_as_doubles():
    import yaml
    from mbfg_ros.tuning.params_file import format_double
    for x in (4321.0, 1e-5, 2.5e7, 0.001, 123456789.0):
        text = format_double(x)
        assert isinstance(yaml.safe_load(text), float) and float(text) == pytest.approx(x, rel=1e-5), text


def test_fitted_value_description():
    from mbfg_ros.tuning.likelihood import FittedValue
    assert FittedValue("x", 100.0, 0.05).describe() == "100 ± 12 % (1σ)"
    assert FittedValue("x", 100.0, 0.5).describe() == "100 ×/÷ 3.16 (1σ)"
    assert "flat" in FittedValue("x", 100.0, 400.0).describe()            # no overflow on a flat likelihood
    assert "flat" in FittedValue("x", 100.0, math.nan).describe()
    assert "search bound" in FittedValue("x", 100.0, 0.1, at_bound=True).describe()
