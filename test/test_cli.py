"""The `mbfg` command line: every sub-command in-process and as a subprocess, outputs and error handling."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mbfg_ros.cli import commands as cli
from mbfg_ros.dynamics import constrained as dynamics
from mbfg_ros.model.mechanism import load_mechanism
from conftest import DFKI_DATA, dfki_rows, write_dfki_csvs

ROOT = Path(__file__).resolve().parents[1]


def run(argv, capsys):
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def run_subprocess(argv, cwd):
    env = dict(os.environ)
    from conftest import PACKAGE_PATH
    env["PYTHONPATH"] = str(PACKAGE_PATH) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "mbfg_ros.cli", *map(str, argv)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def read_csv(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return rows[0], np.array(rows[1:], dtype=float)


def write_csv(path, header, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        for r in rows:
            w.writerow(["" if (isinstance(x, float) and np.isnan(x)) else repr(float(x)) for x in r])


def crank_trajectory(path, N=200, dt=0.005):
    t = np.arange(N) * dt
    write_csv(path, ["t", "crank"], np.column_stack([t, 1.2 * (1 - np.cos(2 * t))]))


# ----------------------------------------------------------------------------------------------
def test_info_four_bar(capsys):
    rc, out, err = run(["info", ROOT / "mechanisms" / "four_bar.yaml"], capsys)
    assert rc == 0 and not err
    lines = dict(line.split(None, 1) if "  " not in line else [p.strip() for p in line.split("  ", 1)]
                 for line in out.splitlines())
    assert lines["coordinates n"] == "4"
    assert lines["constraints m"] == "3"
    assert lines["degrees of freedom"] == "1"
    assert lines["q order"] == "x1 y1 x2 y2"
    rc, out, _ = run(["info", "four_bar", "--json"], capsys)
    info = json.loads(out)
    assert (info["n"], info["m"], info["rank"], info["dof"]) == (4, 3, 3, 1)
    assert info["pose_consistent"] is True


def test_info_robot_json_by_name(capsys):
    rc, out, _ = run(["info", "pick_and_place_robot", "--json"], capsys)
    info = json.loads(out)
    assert rc == 0
    assert (info["n"], info["m"], info["rank"], info["dof"]) == (22, 21, 20, 2)
    assert info["actuated"] == ["motor1", "motor2"]
    assert [s["name"] for s in info["sensors"]] == ["motor1", "motor2"]


def test_info_names_each_actuators_gear_rotor_and_friction(capsys):
    rc, out, _ = run(["info", "double_pendulum_a0", "--json"], capsys)
    info = json.loads(out)
    assert rc == 0 and info["actuated"] == ["q1", "q2"]
    assert [m["gear_ratio"] for m in info["actuator_motor"]] == [-6.0, -6.0]
    assert all(m["rotor_inertia"] > 0 for m in info["actuator_motor"])
    rc, out, _ = run(["info", "double_pendulum_a0"], capsys)
    actuated = next(line for line in out.splitlines() if line.startswith("actuated"))
    assert actuated.count("gear ratio -6, rotor inertia") == 2 and actuated.count("friction") == 2
    rc, out, _ = run(["info", "four_bar_crank", "--json"], capsys)
    assert json.loads(out)["actuator_motor"] == [None]
    assert actuated.count("applies a command 4.5 ms after it is given, through a 3-ms first-order lag") == 2


def test_simulate_free_fall_matches_closed_form_start(tmp_path, capsys):
    out = tmp_path / "sim.csv"
    rc, _, err = run(["simulate", "four_bar_crank", "--duration", "0.05", "--dt", "0.005", "--window", "5",
                      "--output", out, "--plot", tmp_path / "sim.png"], capsys)
    assert rc == 0, err
    header, data = read_csv(out)
    mech = load_mechanism("four_bar_crank")
    names = list(mech.coordinate_names)
    assert header == (["t"] + names + [c + "_dot" for c in names] + [c + "_ddot" for c in names] + ["tau_crank"])
    assert data.shape == (11, len(header))
    np.testing.assert_allclose(data[:, 0], np.arange(11) * 0.005, atol=1e-12)
    a0 = dynamics.forward_dynamics(mech, np.array(mech.q0), np.zeros(mech.n))
    np.testing.assert_allclose(data[0, 1 + 2 * mech.n:1 + 3 * mech.n], a0, atol=1e-3)
    np.testing.assert_allclose(a0[:4], [0, -9.69037, -6.46024, -9.69037], atol=1e-4)
    assert np.all(data[:, -1] == 0.0)
    assert data[-1, 5] < 0                     # the crank falls
    assert (tmp_path / "sim.png").stat().st_size > 1000


def test_inverse_dynamics_then_simulate_round_trip(tmp_path, capsys):
    traj, out = tmp_path / "traj.csv", tmp_path / "id.csv"
    crank_trajectory(traj, N=200)
    rc, _, err = run(["inverse-dynamics", "four_bar_crank", "--trajectory", traj, "--output", out,
                      "--plot", tmp_path / "id.png", "-v"], capsys)
    assert rc == 0, err
    assert "stage 4" in err
    header, data = read_csv(out)
    assert header[-1] == "tau_crank" and data.shape == (200, 17)
    assert data[0, -1] == pytest.approx(66.01, abs=0.03)
    # the torques drive the forward simulation along the prescribed trajectory
    sim = tmp_path / "sim.csv"
    rc, _, err = run(["simulate", "four_bar_crank", "--duration", "0.5", "--dt", "0.005", "--torques", out,
                      "--output", sim], capsys)
    assert rc == 0, err
    _, s = read_csv(sim)
    t = s[:, 0]
    np.testing.assert_allclose(s[:, 5], 1.2 * (1 - np.cos(2 * t)), atol=2e-3)


def test_estimate_with_missing_readings(tmp_path, capsys):
    mech = load_mechanism("four_bar_crank")
    t = np.arange(60) * 0.005
    crank = 1.2 * (1 - np.cos(2 * t))
    crank[3::5] = np.nan                           # missing readings
    obs = tmp_path / "obs.csv"
    write_csv(obs, ["t", "crank"], np.column_stack([t, crank]))
    out = tmp_path / "est.csv"
    rc, _, err = run(["estimate", "four_bar_crank", "--observations", obs, "--output", out, "--window", "5"], capsys)
    assert rc == 0, err
    header, data = read_csv(out)
    assert header[0] == "t" and header[-1] == "tau_crank" and data.shape == (60, 1 + 3 * mech.n + 1)
    assert np.all(np.isfinite(data))
    assert np.abs(data[:, 5] - 1.2 * (1 - np.cos(2 * t))).max() < 0.01


def test_estimate_fused_writes_the_applied_effort_and_the_disturbance(tmp_path, capsys):
    """Fused mode: tau_<joint> is command + disturbance, disturbance_<joint> the disturbance; the density
    options reach the estimator (a smaller disturbance density, a smoother disturbance)."""
    t = np.arange(200) * 0.002
    crank = 1.2 * (1 - np.cos(2 * t)) + 1e-3 * np.random.default_rng(0).standard_normal(t.size)
    obs, cmd = tmp_path / "obs.csv", tmp_path / "cmd.csv"
    write_csv(obs, ["t", "crank"], np.column_stack([t, crank]))
    write_csv(cmd, ["t", "crank"], np.column_stack([t, 3.0 + 0 * t]))
    rough = {}
    for density in ("1e4", "1e-2"):
        out = tmp_path / f"est_{density}.csv"
        rc, _, err = run(["estimate", "four_bar_crank", "--observations", obs, "--torques", cmd, "--mode", "fused",
                          "--disturbance-density", density, "--output", out], capsys)
        assert rc == 0, err
        header, data = read_csv(out)
        assert header[-2:] == ["tau_crank", "disturbance_crank"] and np.all(np.isfinite(data))
        np.testing.assert_allclose(data[:, -2] - data[:, -1], 3.0, atol=1e-9)
        rough[density] = np.std(np.diff(data[100:, -1]))
    assert rough["1e-2"] < 0.6 * rough["1e4"], rough          # measured 0.20 vs 0.45 N·m per step
    # --std: the 1σ columns (the commands are known: the effort's σ is the disturbance's)
    out = tmp_path / "std.csv"
    rc, _, err = run(["estimate", "four_bar_crank", "--observations", obs, "--torques", cmd, "--mode", "fused",
                      "--std", "--output", out], capsys)
    assert rc == 0, err
    header, data = read_csv(out)
    col = {h: i for i, h in enumerate(header)}
    for name in ("crank_std", "crank_dot_std", "crank_ddot_std", "tau_crank_std", "disturbance_crank_std"):
        assert name in col and np.all(data[1:, col[name]] > 0), name
    np.testing.assert_array_equal(data[:, col["tau_crank_std"]], data[:, col["disturbance_crank_std"]])
    assert np.median(data[100:, col["crank_std"]]) < 1e-3          # below the encoder's σ: smoothed
    rc, _, err = run(["estimate", "four_bar_crank", "--observations", obs, "--effort-density", "0",
                      "--output", tmp_path / "x.csv"], capsys)
    assert rc == 2 and "--effort-density must be > 0" in err


@pytest.mark.parametrize("argv, message", [
    (["info", "no_such_mechanism.yaml"], "mechanism file not found"),
    (["info", "{bad}"], "bad.yaml"),
    (["inverse-dynamics", "four_bar_crank", "--trajectory", "{missing}", "--output", "{out}"], "cannot read file"),
    (["inverse-dynamics", "four_bar_crank", "--trajectory", "{unknown}", "--output", "{out}"], "unknown column"),
    (["inverse-dynamics", "four_bar_crank", "--trajectory", "{notnum}", "--output", "{out}"], "not a number"),
    (["inverse-dynamics", "four_bar_crank", "--trajectory", "{uneven}", "--output", "{out}"], "uniform"),
    (["estimate", "four_bar_crank", "--observations", "{unknown}", "--output", "{out}"], "unknown sensor"),
    (["simulate", "four_bar_crank", "--duration", "-1", "--output", "{out}"], "--duration must be > 0"),
    (["simulate", "four_bar_crank", "--duration", "0.01", "--torques", "{unknown}", "--output", "{out}"],
     "no column for actuator"),
    (["simulate", "four_bar_crank", "--duration", "0.01", "--output", "{nodir}"], "cannot write"),
    (["frobnicate"], "invalid choice"),
])
def test_user_errors_are_one_line_and_exit_2(tmp_path, capsys, argv, message):
    (tmp_path / "bad.yaml").write_text("name: x\npoints: [\n")
    (tmp_path / "unknown.csv").write_text("t,motor1\n0,1\n0.1,2\n0.2,3\n")
    (tmp_path / "notnum.csv").write_text("t,crank\n0,1\n0.1,x\n0.2,3\n")
    (tmp_path / "uneven.csv").write_text("t,crank\n0,1\n0.1,2\n0.3,3\n")
    subst = {"{bad}": tmp_path / "bad.yaml", "{missing}": tmp_path / "missing.csv",
             "{unknown}": tmp_path / "unknown.csv", "{notnum}": tmp_path / "notnum.csv",
             "{uneven}": tmp_path / "uneven.csv", "{out}": tmp_path / "out.csv",
             "{nodir}": tmp_path / "no" / "dir" / "out.csv"}
    rc, out, err = run([subst.get(a, a) for a in argv], capsys)
    assert rc == 2
    assert err.startswith("mbfg: error: ") and err.count("\n") == 1
    assert message in err
    assert "Traceback" not in err


@pytest.mark.parametrize("command", ["info", "simulate", "inverse-dynamics", "estimate", "tune"])
def test_help_of_every_subcommand(capsys, command):
    rc, out, _ = run([command, "--help"], capsys)
    assert rc == 0 and out.startswith(f"usage: mbfg {command}")


def test_subprocess_each_command(tmp_path):
    """The real process: exit codes, outputs, and no progress bar when stderr is not a terminal."""
    p = run_subprocess(["info", "four_bar"], tmp_path)
    assert p.returncode == 0 and "degrees of freedom  1" in p.stdout
    p = run_subprocess(["simulate", "four_bar_crank", "--duration", "0.02", "--dt", "0.005", "-o", "s.csv"], tmp_path)
    assert p.returncode == 0 and p.stderr == "" and (tmp_path / "s.csv").exists()
    crank_trajectory(tmp_path / "traj.csv", N=40)
    p = run_subprocess(["inverse-dynamics", "four_bar_crank", "--trajectory", "traj.csv", "-o", "id.csv"], tmp_path)
    assert p.returncode == 0 and p.stderr == ""
    assert read_csv(tmp_path / "id.csv")[1][0, -1] == pytest.approx(66.0, abs=0.3)
    # tune: a parameter file, the fitted value on stdout, no progress bar (stderr is not a terminal)
    (tmp_path / "obs.csv").write_text("t,crank\n" + "".join(f"{0.005 * k:.3f},{0.3 * (0.005 * k) ** 2:.6f}\n"
                                                            for k in range(40)))
    p = run_subprocess(["tune", "four_bar_crank", "--observations", "obs.csv", "--mode", "estimation",
                        "-o", "tuned.yaml"], tmp_path)
    assert p.returncode == 0 and p.stderr == "" and "effort_density" in p.stdout
    assert "mbfg_estimator:" in (tmp_path / "tuned.yaml").read_text()
    p = run_subprocess(["estimate", "four_bar_crank", "--observations", "traj.csv", "-o", "e.csv"], tmp_path)
    assert p.returncode == 0 and (tmp_path / "e.csv").exists()
    p = run_subprocess(["info", "missing.yaml"], tmp_path)
    assert p.returncode == 2 and p.stderr.startswith("mbfg: error:") and "Traceback" not in p.stderr


def test_progress_bar_only_on_a_terminal():
    import io

    class Tty(io.StringIO):
        def isatty(self):
            return True

    s = io.StringIO()
    bar = cli.Progress(10, "x", stream=s)
    bar.update(5)
    bar.close()
    assert s.getvalue() == ""
    t = Tty()
    bar = cli.Progress(10, "x", stream=t)
    bar.update(10)
    bar.close()
    assert "100.0%" in t.getvalue() and t.getvalue().endswith("\n")


@pytest.mark.parametrize("options", [["--coords", "independent"], ["--integrator", "hermite"], ["--integrator", "euler"]])
def test_simulate_options(tmp_path, capsys, options):
    out = tmp_path / "sim.csv"
    rc, _, err = run(["simulate", "four_bar_crank", "--duration", "0.05", "--dt", "0.005", *options, "-o", out], capsys)
    assert rc == 0, err
    _, data = read_csv(out)
    mech = load_mechanism("four_bar_crank")
    a0 = dynamics.forward_dynamics(mech, np.array(mech.q0), np.zeros(mech.n))
    np.testing.assert_allclose(data[0, 1 + 2 * mech.n:1 + 3 * mech.n], a0, atol=1e-3)
    # 50 ms of free fall from rest: θ ≈ ½ θ̈(0) t² (Euler, first order: within one step's share, 1/10)
    rel = 0.12 if "euler" in options else 0.05
    assert data[-1, 5] == pytest.approx(0.5 * a0[4] * 0.05 ** 2, rel=rel)



@pytest.mark.parametrize("command", ["simulate", "estimate"])
def test_integrator_choices_are_the_estimators(capsys, command):
    from mbfg_ros.estimation.config import INTEGRATORS
    rc, _, err = run([command, "four_bar_crank", "--integrator", "bogus", "-o", "x.csv"], capsys)
    assert rc == 2
    assert all(f"'{name}'" in err for name in INTEGRATORS), err


# ---------------------------------------------------------------------------------- quoting users' files
SECRET_LINES = [f"user{i}:x:{1000 + i}:{1000 + i}:{'k3y' * 12}{i}:/home/user{i}:/bin/bash" for i in range(5)]
LONG = "S3CR3T" * 200


def _shows_secret(text: str, width: int = 25) -> bool:
    """Whether `text` quotes `width` or more consecutive characters of a SECRET_LINES line or of LONG."""
    return any(line[j:j + width] in text for line in SECRET_LINES + [LONG[:60]]
               for j in range(len(line) - width + 1))


def test_errors_quote_a_users_file_only_in_short_excerpts(tmp_path, capsys):
    """Every command's error about a file it reads (mechanism, CSV, parameter file) is one line and quotes
    at most a short excerpt of the file: the wrong file (a password file), a megabyte-long name or cell."""
    f = {"passwd": "\n".join(SECRET_LINES) + "\n", "long_col.csv": f"t,{LONG}\n0,1\n0.1,2\n",
         "long_cell.csv": f"t,crank\n0,{LONG}\n0.1,2\n", "long_first.csv": f"{LONG}\n1\n",
         "mech_key.yaml": f"name: x\n{LONG}: 1\n",
         "params_key.yaml": f"mbfg_estimator:\n  ros__parameters:\n    {LONG}: 1\n",
         "params_value.yaml": f"mbfg_estimator:\n  ros__parameters:\n    window: {LONG}\n",
         "params_sigma.yaml": f"mbfg_estimator:\n  ros__parameters:\n    sigmas:\n      {LONG}: 1.0\n",
         "params_node.yaml": f"{LONG}:\n  ros__parameters:\n    window: 1\n"}
    for name, text in f.items():
        (tmp_path / name).write_text(text)
    good = tmp_path / "obs.csv"
    write_csv(good, ["t", "crank"], [[0.001 * i, 0.0] for i in range(20)])
    out = tmp_path / "out.csv"
    runs = [["info", tmp_path / n] for n in ("passwd", "mech_key.yaml")]
    for n in ("passwd", "long_col.csv", "long_cell.csv", "long_first.csv"):
        p = tmp_path / n
        runs += [["simulate", "four_bar_crank", "--duration", "0.01", "--torques", p, "--output", out],
                 ["inverse-dynamics", "four_bar_crank", "--trajectory", p, "--output", out],
                 ["estimate", "four_bar_crank", "--observations", p, "--output", out],
                 ["tune", "four_bar_crank", "--observations", p, "--mode", "estimation", "--output", out]]
    for n in ("passwd", "params_key.yaml", "params_value.yaml", "params_sigma.yaml", "params_node.yaml"):
        runs.append(["estimate", "four_bar_crank", "--observations", good, "--params", tmp_path / n, "--output", out])
    for argv in runs:
        rc, _, err = run(argv, capsys)
        what = " ".join(map(str, argv))
        assert rc == 2, (what, err)
        assert len(err.strip().splitlines()) == 1 and err.startswith("mbfg: error:"), (what, err)
        assert not _shows_secret(err), (what, err)


# --- real recordings: jittered stamps, missing cells, sensor sigmas, the summary ------------------------------
def jittered_times(n, dt=0.005, seed=0):
    """n stamps: every interval 1 % long (a slow logger), 5 % of them up to 2.7× late."""
    rng = np.random.default_rng(seed)
    steps = np.full(n - 1, dt * 1.01)
    late = rng.random(n - 1) < 0.05
    late[[20, 45]] = True                        # at least two late samples
    steps[late] *= rng.uniform(1.2, 2.7, late.sum())
    return np.concatenate([[0.0], np.cumsum(steps)])


def summary_of(err):
    """The counts of the summary line `mbfg estimate` prints last on stderr."""
    import re
    line = err.strip().splitlines()[-1]
    m = re.fullmatch(r"mbfg estimate: (\d+) steps, lost track (\d+) times \([\d.]+ % of the steps; re-initialized "
                     r"from the readings\), (\d+) other recoveries, (\d+) steps waiting, (\d+) re-initializations, "
                     r"CPU [\d.e+-]+ ms per step(, encoder σ fitted (?:(?!, densities).)*)?"
                     r"(, densities fitted .*)?", line)
    assert m, line
    out = dict(zip(("steps", "lost", "recovered", "waiting", "reinitializations"), map(int, m.groups()[:5])))
    out["sigmas"] = {} if m.group(6) is None else {
        name: float(v) for name, v in (x.split() for x in m.group(6)[len(", encoder σ fitted "):].split(", "))}
    out["densities"] = {} if m.group(7) is None else {
        name: float(v) for name, v in (x.split() for x in m.group(7)[len(", densities fitted "):].split(", "))}
    return out


def test_estimate_takes_jittered_stamps_and_nan_cells_as_they_are(tmp_path, capsys):
    """Stamps with drift and late samples and 'nan' / empty cells: one output row per input row at its own
    time, the crank followed, a summary line with no lost track."""
    t = jittered_times(120)
    truth = 1.2 * (1 - np.cos(2 * t))
    crank = truth + 1e-3 * np.random.default_rng(1).standard_normal(t.size)
    cells = [f"{x:.6f}" for x in crank]
    cells[7], cells[30], cells[31], cells[77] = "nan", "NaN", "", "nan"
    obs = tmp_path / "obs.csv"
    obs.write_text("t,crank\n" + "".join(f"{float(a)!r},{c}\n" for a, c in zip(t, cells)))
    out = tmp_path / "est.csv"
    rc, stdout, err = run(["estimate", "four_bar_crank", "--observations", obs, "-o", out], capsys)
    assert rc == 0, err
    assert stdout == ""                                       # the summary goes to stderr
    _, data = read_csv(out)
    np.testing.assert_allclose(data[:, 0], t, rtol=0, atol=1e-12)
    assert np.all(np.isfinite(data))
    assert np.abs(data[20:, 5] - truth[20:]).max() < 5e-3
    s = summary_of(err)
    sigmas, densities = s.pop("sigmas"), s.pop("densities")
    assert s == dict(steps=120, lost=0, recovered=0, waiting=0, reinitializations=0), err
    assert list(sigmas) == ["crank"] and sigmas["crank"] >= 1e-3 - 1e-9    # the stated σ is the floor
    # the process densities the online fit ended at (estimation mode: the effort's and the accelerations')
    assert set(densities) == {"effort_density", "acceleration_density"} and min(densities.values()) > 0


def test_estimate_dt_is_the_median_interval_unless_given(tmp_path, capsys, monkeypatch):
    t = jittered_times(60)
    obs = tmp_path / "obs.csv"
    write_csv(obs, ["t", "crank"], np.column_stack([t, 0.0 * t]))
    seen = []
    monkeypatch.setattr(cli, "_run_estimator", lambda args, mech, config, *rest, **kw: seen.append(config.dt) or 0)
    assert run(["estimate", "four_bar_crank", "--observations", obs, "-o", tmp_path / "e.csv"], capsys)[0] == 0
    assert seen[-1] == pytest.approx(np.median(np.diff(t))) and seen[-1] == pytest.approx(0.00505)
    assert run(["estimate", "four_bar_crank", "--observations", obs, "--dt", "0.002", "-o", tmp_path / "e.csv"],
               capsys)[0] == 0
    assert seen[-1] == 0.002
    _, out, _ = run(["estimate", "--help"], capsys)
    assert "median interval" in " ".join(out.split())


def test_estimate_summary_counts_lost_track_and_reinitializations(tmp_path, capsys):
    """An encoder that slips by 0.3 rad (300 σ) from row 60 on: the estimate stops following, re-initializes
    from the readings (lost track), and the summary counts both."""
    t = np.arange(120) * 0.005
    crank = 1.2 * (1 - np.cos(2 * t)) + 1e-3 * np.random.default_rng(2).standard_normal(t.size)
    crank[60:] += 0.3
    obs = tmp_path / "obs.csv"
    write_csv(obs, ["t", "crank"], np.column_stack([t, crank]))
    rc, _, err = run(["estimate", "four_bar_crank", "--observations", obs, "-o", tmp_path / "e.csv"], capsys)
    assert rc == 0, err
    s = summary_of(err)
    assert s["steps"] == 120 and s["reinitializations"] >= 1 and s["lost"] >= 1 and s["waiting"] == 0
    _, data = read_csv(tmp_path / "e.csv")
    assert abs(data[-1, 5] - crank[-1]) < 0.01                # following the readings again


def test_estimate_sensor_sigma_reaches_the_estimator_and_names_a_bad_sensor(tmp_path, capsys):
    t = np.arange(80) * 0.005
    crank = 1.2 * (1 - np.cos(2 * t)) + 1e-3 * np.random.default_rng(3).standard_normal(t.size)
    obs = tmp_path / "obs.csv"
    write_csv(obs, ["t", "crank"], np.column_stack([t, crank]))
    std = {}
    for sigma in ("1e-3", "1e-2"):
        out = tmp_path / f"e{sigma}.csv"
        rc, _, err = run(["estimate", "four_bar_crank", "--observations", obs, "--sensor-sigma", f"crank={sigma}",
                          "--no-adapt-sensor-sigmas", "--std", "-o", out], capsys)
        assert rc == 0, err
        assert summary_of(err)["sigmas"] == {}
        header, data = read_csv(out)
        std[sigma] = np.median(data[20:, header.index("crank_std")])
    assert std["1e-2"] > 2.5 * std["1e-3"], std
    # fitted online (the default): a stated σ ten times too small is the floor, the readings' 1e-3 the fit
    t = np.arange(300) * 0.005
    crank = 1.2 * (1 - np.cos(2 * t)) + 1e-3 * np.random.default_rng(3).standard_normal(t.size)
    write_csv(obs, ["t", "crank"], np.column_stack([t, crank]))
    rc, _, err = run(["estimate", "four_bar_crank", "--observations", obs, "--sensor-sigma", "crank=1e-4",
                      "-o", tmp_path / "fit.csv"], capsys)
    assert rc == 0, err
    assert 0.7e-3 < summary_of(err)["sigmas"]["crank"] < 1.4e-3, err
    for bad, message in (("wheel=1e-3", "'wheel' is not a sensor of the mechanism (crank, coupler_gyro)"),
                         ("crank=-1", "SIGMA > 0 (got 'crank=-1')"), ("crank", "NAME=SIGMA")):
        rc, _, err = run(["estimate", "four_bar_crank", "--observations", obs, "--sensor-sigma", bad,
                          "-o", tmp_path / "x.csv"], capsys)
        assert rc == 2 and err.count("\n") == 1 and message in err, err


def test_missing_torques_are_interpolated_from_their_neighbours(tmp_path, capsys):
    """Fused mode: a missing command cell is unknown at its row; the command there comes from the rows around
    it (tau − disturbance is the command at every step)."""
    t = np.arange(60) * 0.005
    obs, cmd = tmp_path / "obs.csv", tmp_path / "cmd.csv"
    write_csv(obs, ["t", "crank"], np.column_stack([t, 1.2 * (1 - np.cos(2 * t))]))
    command = 2.0 + 10.0 * t
    cells = [repr(float(c)) for c in command]
    cells[10], cells[11], cells[40] = "nan", "", "NaN"
    cmd.write_text("t,crank\n" + "".join(f"{float(a)!r},{c}\n" for a, c in zip(t, cells)))
    out = tmp_path / "e.csv"
    rc, _, err = run(["estimate", "four_bar_crank", "--observations", obs, "--torques", cmd, "--mode", "fused",
                      "-o", out], capsys)
    assert rc == 0, err
    header, data = read_csv(out)
    applied, disturbance = data[:, header.index("tau_crank")], data[:, header.index("disturbance_crank")]
    np.testing.assert_allclose(applied - disturbance, command, atol=1e-9)


@pytest.mark.parametrize("text, message", [
    ("t,crank\n0,0\n0.005,0.1\n0.004,0.2\n", "row 4: time goes backwards"),
    ("t,crank\n0,0\n0.005,0.1\n0.005,0.2\n", "row 4: time t = 0.005 s repeats row 3's"),
    ("t,crank\n0,0\n0.005,inf\n0.01,0.2\n", "row 3, column 'crank': not a finite number: 'inf'"),
])
@pytest.mark.parametrize("command", ["estimate", "tune"])
def test_bad_stamps_and_infinite_cells_name_the_row(tmp_path, capsys, text, message, command):
    obs = tmp_path / "obs.csv"
    obs.write_text(text)
    extra = ["--mode", "estimation"] if command == "tune" else []
    rc, _, err = run([command, "four_bar_crank", "--observations", obs, *extra, "-o", tmp_path / "o"], capsys)
    assert rc == 2 and err.count("\n") == 1 and message in err and str(obs) in err, err


def test_inverse_dynamics_names_a_missing_trajectory_sample(tmp_path, capsys):
    (tmp_path / "traj.csv").write_text("t,crank\n0,0\n0.005,nan\n0.01,0.2\n")
    rc, _, err = run(["inverse-dynamics", "four_bar_crank", "--trajectory", tmp_path / "traj.csv",
                      "-o", tmp_path / "o.csv"], capsys)
    assert rc == 2 and "row 3, column 'crank': missing value" in err, err


def test_tune_takes_jittered_stamps_and_missing_readings(tmp_path, capsys):
    """The fit runs on stamps that jitter and drift, with nan and empty readings, and writes the file."""
    t = jittered_times(60)
    cells = [f"{0.3 * x ** 2:.6f}" for x in t]
    cells[5], cells[17], cells[40] = "nan", "", "NaN"
    obs = tmp_path / "obs.csv"
    obs.write_text("t,crank\n" + "".join(f"{float(a)!r},{c}\n" for a, c in zip(t, cells)))
    rc, out, err = run(["tune", "four_bar_crank", "--observations", obs, "--mode", "estimation",
                        "-o", tmp_path / "p.yaml"], capsys)
    assert rc == 0, err
    assert "60 samples" in out and "effort_density" in (tmp_path / "p.yaml").read_text()
    assert "at dt 0.00505 s" in (tmp_path / "p.yaml").read_text()          # the median interval


def test_estimate_actuator_effort_declares_a_passive_or_commanded_joint(tmp_path, capsys):
    """--actuator-effort NAME=KIND reaches the estimator: a passive crank's effort column is 0 (σ 0), a
    commanded one's is its --torques column; wrong entries and a commanded kind without torques are refused."""
    t = np.arange(100) * 0.005
    crank = 1.2 * (1 - np.cos(2 * t)) + 1e-3 * np.random.default_rng(5).standard_normal(t.size)
    obs, cmd = tmp_path / "obs.csv", tmp_path / "cmd.csv"
    write_csv(obs, ["t", "crank"], np.column_stack([t, crank]))
    write_csv(cmd, ["t", "crank"], np.column_stack([t, 2.5 + 0 * t]))
    for kind, torques, expected in (("passive", [], 0.0), ("commanded", ["--torques", cmd], 2.5)):
        out = tmp_path / f"{kind}.csv"
        rc, _, err = run(["estimate", "four_bar_crank", "--observations", obs, *torques, "--actuator-effort",
                          f"crank={kind}", "--std", "-o", out], capsys)
        assert rc == 0, err
        header, data = read_csv(out)
        np.testing.assert_allclose(data[:, header.index("tau_crank")], expected, atol=1e-12)
        assert np.all(data[:, header.index("tau_crank_std")] == 0.0)
    for bad, message in (("crank=off", "kind must be one of estimated, commanded, passive"),
                         ("wheel=passive", "no actuator named 'wheel'"), ("crank", "is not NAME=KIND"),
                         ("crank=commanded", "needs --torques")):
        rc, _, err = run(["estimate", "four_bar_crank", "--observations", obs, "--actuator-effort", bad,
                          "-o", tmp_path / "x.csv"], capsys)
        assert rc == 2 and "--actuator-effort" in err and message in err, err


def test_estimate_smoothed_lag_writes_every_row_smoothed(tmp_path, capsys):
    """--smoothed-lag N: one row per input row at its own (jittered) time, each the estimate smoothed by the N
    steps after it (the crank's rate closer to the truth than the causal rows'); the summary still counts the
    causal estimates; a lag the window cannot hold is refused naming the option."""
    t = jittered_times(400)
    truth = 1.2 * (1 - np.cos(2 * t))
    crank = truth + 1e-3 * np.random.default_rng(2).standard_normal(t.size)
    obs = tmp_path / "obs.csv"
    write_csv(obs, ["t", "crank"], np.column_stack([t, crank]))
    rates = {}
    for lag in (0, 9):
        out = tmp_path / f"est{lag}.csv"
        rc, _, err = run(["estimate", "four_bar_crank", "--observations", obs, "-o", out, "--smoothed-lag", lag],
                         capsys)
        assert rc == 0, err
        header, data = read_csv(out)
        np.testing.assert_allclose(data[:, 0], read_csv(obs)[1][:, 0], rtol=0, atol=1e-7)
        assert np.all(np.isfinite(data)) and summary_of(err)["steps"] == 400
        rates[lag] = data[:, header.index("crank_dot")]
    true_rate = 2.4 * np.sin(2 * t)
    error = {lag: np.sqrt(np.mean((r[100:] - true_rate[100:]) ** 2)) for lag, r in rates.items()}
    assert error[9] < 0.9 * error[0], error
    rc, _, err = run(["estimate", "four_bar_crank", "--observations", obs, "-o", tmp_path / "x.csv",
                      "--smoothed-lag", 10], capsys)
    assert rc != 0 and "--smoothed-lag 10: must be from 0 to the window's steps − 1 = 9" in err
    # from a node parameter file, unless the option is given
    params = tmp_path / "p.yaml"
    params.write_text("/**/mbfg_estimator:\n  ros__parameters:\n    window: 6\n    smoothed_lag: 6\n")
    rc, _, err = run(["estimate", "four_bar_crank", "--observations", obs, "-o", tmp_path / "x.csv",
                      "--params", params], capsys)
    assert rc != 0 and f"{params}: smoothed_lag 6: must be from 0 to the window's steps − 1 = 5" in err
    rc, _, err = run(["estimate", "four_bar_crank", "--observations", obs, "-o", tmp_path / "x.csv",
                      "--params", params, "--smoothed-lag", 5], capsys)
    assert rc == 0, err


def test_estimate_effort_bandwidth_from_the_option_or_the_params_file(tmp_path, capsys, monkeypatch):
    """--effort-bandwidth HZ (else a --params file's effort_bandwidth, else the default) reaches the estimator's
    config; a negative or infinite one is refused naming the option or the file's key."""
    from mbfg_ros.estimation.config import EstimatorConfig
    from mbfg_ros.estimation.estimator import FixedLagEstimator
    seen = []
    build = FixedLagEstimator.__init__

    def spy(self, mech, config, *args, **kwargs):
        seen.append(config.effort_bandwidth)
        build(self, mech, config, *args, **kwargs)
    monkeypatch.setattr(FixedLagEstimator, "__init__", spy)
    t = np.arange(0.0, 0.1, 1e-3)
    obs = tmp_path / "obs.csv"
    write_csv(obs, ["t", "crank"], np.column_stack([t, 0.1 * t]))
    params = tmp_path / "p.yaml"
    params.write_text("/**/mbfg_estimator:\n  ros__parameters:\n    effort_bandwidth: 2.0\n")
    for extra, expected in (([], EstimatorConfig().effort_bandwidth), (["--effort-bandwidth", 7], 7.0),
                            (["--params", params], 2.0), (["--params", params, "--effort-bandwidth", 0], 0.0)):
        seen.clear()
        rc, _, err = run(["estimate", "four_bar_crank", "--mode", "estimation", "--observations", obs,
                          "-o", tmp_path / "x.csv", *extra], capsys)
        assert rc == 0 and seen and set(seen) == {expected}, (extra, seen, err)
    for bad in ("-1", "inf"):
        rc, _, err = run(["estimate", "four_bar_crank", "--observations", obs, "-o", tmp_path / "x.csv",
                          "--effort-bandwidth", bad], capsys)
        assert rc == 2 and f"--effort-bandwidth {bad}: must be a finite number of Hz ≥ 0" in err, err
    params.write_text("/**/mbfg_estimator:\n  ros__parameters:\n    effort_bandwidth: -3.0\n")
    rc, _, err = run(["estimate", "four_bar_crank", "--observations", obs, "-o", tmp_path / "x.csv",
                      "--params", params], capsys)
    assert rc == 2 and "effort_bandwidth must be a finite number of Hz ≥ 0" in err, err


def test_estimate_takes_the_efforts_shares_from_the_params_file(tmp_path, capsys):
    """`effort_shares:` of a `--params` file reaches the estimator (each effort's density × its share); on an
    actuator whose effort is not estimated it is an error naming the file."""
    t = np.arange(0.0, 0.2, 1e-3)
    obs = tmp_path / "obs.csv"
    obs.write_text("t,crank\n" + "".join(f"{float(a)!r},{0.1 * float(np.sin(a))!r}\n" for a in t))
    params = tmp_path / "p.yaml"
    params.write_text("/**/mbfg_estimator:\n  ros__parameters:\n    mode: estimation\n"
                      "    effort_shares: {crank: 2.0}\n")
    rc, _, err = run(["estimate", "four_bar_crank", "--observations", obs, "-o", tmp_path / "x.csv",
                      "--params", params], capsys)
    assert rc == 0, err
    rc, _, err = run(["estimate", "four_bar_crank", "--observations", obs, "-o", tmp_path / "x.csv",
                      "--params", params, "--actuator-effort", "crank=passive"], capsys)
    assert rc == 2 and f"{params}: effort_shares: crank is not an actuator whose effort is estimated" in err, err


# -- a logger's own files: --time-column, --reading, --command, gzip ------------------------------------------------
def _logger_file(tmp_path, rows=300):
    """The first `rows` of a DFKI recording as its logger wrote them (one gzip file: time, positions, commands and
    measured torques under the logger's names, the time not first), and the same data as `mbfg` names them."""
    import gzip
    data = dfki_rows("design_A.0__20220815__sys_id__trajectory_00")[:rows]
    logger = tmp_path / "logger.csv.gz"
    with gzip.open(logger, "wt", newline="") as f:
        w = csv.writer(f)
        w.writerow(["pos_meas1", "pos_meas2", "time", "tau_con1", "tau_con2", "tau_meas1"])
        for r in data:
            w.writerow([repr(float(x)) for x in (r[1], r[2], r[0], r[3], r[4], r[5])])
    write_dfki_csvs(tmp_path, data)
    return logger


@pytest.mark.parametrize("command", ["estimate", "identify", "tune"])
def test_a_loggers_columns_are_read_by_name_without_renaming(tmp_path, capsys, command):
    """One gzip file with the logger's column names, the time column not first: --time-column, --reading and
    --command read exactly what the renamed files hold (the outputs are identical), the other columns ignored."""
    logger = _logger_file(tmp_path)
    named = ["--time-column", "time", "--reading", "q1=pos_meas1", "--reading", "q2=pos_meas2",
             "--command", "q1=tau_con1,q2=tau_con2"]
    out = {"estimate": "est.csv", "identify": "mech.yaml", "tune": "tuned.yaml"}[command]
    extra = {"estimate": ["--mode", "fused"], "identify": ["--identify", "q1.viscous_friction"],
             "tune": ["--mode", "fused", "--max-steps", "100"]}[command]
    results = []
    for label, files in (("logger", ["--observations", logger, "--torques", logger] + named),
                         ("renamed", ["--observations", tmp_path / "obs.csv", "--torques", tmp_path / "cmd.csv"])):
        target = tmp_path / f"{label}_{out}"
        rc, stdout, err = run([command, "double_pendulum_a0", *files, *extra, "--output", target], capsys)
        assert rc == 0, err
        # (the outputs name the files they were made from and written to)
        named_files = lambda text: (text.replace(str(logger), "IN").replace(str(tmp_path / "obs.csv"), "IN")
                                    .replace(str(target), "OUT"))
        results.append((named_files(target.read_text()), named_files(stdout)))
    assert results[0] == results[1]


T = ["--time-column", "time"]


@pytest.mark.parametrize("options, message", [
    (T + ["--reading", "q3=pos_meas1"], "--reading q3=pos_meas1: 'q3' is not a sensor of the mechanism (q1, q2)"),
    (T + ["--reading", "q1"], "--reading takes NAME=COLUMN"),
    (T + ["--reading", "q1=pos_meas1,q1=pos_meas2"], "sensor 'q1' is given twice"),
    (T + ["--reading", "q1=nope"], "no column 'nope' (for sensor q1; columns: pos_meas1, pos_meas2, tau_con1"),
    (T + ["--reading", "q1=pos_meas1,q2=pos_meas2", "--torques", "{logger}", "--command", "q1=tau_con1"],
     "--command: no column given for actuator(s) q2"),
    (T + ["--reading", "q1=pos_meas1,q2=pos_meas2", "--torques", "{logger}"], "name it: --command q1=COLUMN"),
    (T + ["--reading", "q1=pos_meas1", "--command", "q1=tau_con1"], "names columns of the --torques file"),
    (["--time-column", "stamp"], "no time column 'stamp' in the header (columns: pos_meas1"),
    ([], "the first column of the header must be 't' (got 'pos_meas1'; another time column: --time-column"),
    (T, "unknown sensor column(s) pos_meas1, pos_meas2, tau_con1, tau_con2, tau_meas1 (sensors: q1, q2; a "
        "logger's own names: --reading SENSOR=COLUMN)"),
])
def test_column_options_name_what_is_wrong(tmp_path, capsys, options, message):
    logger = _logger_file(tmp_path, rows=20)
    options = [str(logger) if o == "{logger}" else o for o in options]
    rc, _, err = run(["estimate", "double_pendulum_a0", "--observations", logger, *options,
                      "--output", tmp_path / "x.csv"], capsys)
    assert rc == 2 and message in err and err.count("\n") == 1, err


def test_tune_from_a_bag_refuses_csv_column_options(tmp_path, capsys):
    rc, _, err = run(["tune", "double_pendulum_a0", "--bag", tmp_path, "--mode", "fused", "--reading", "q1=a",
                      "--output", tmp_path / "x.yaml"], capsys)
    assert rc == 2 and "--reading name CSV columns: they go with --observations, not --bag" in err


def test_a_gzip_file_that_is_not_gzip_is_named(tmp_path, capsys):
    (tmp_path / "obs.csv.gz").write_text("t,q1,q2\n0,0,0\n")
    rc, _, err = run(["estimate", "double_pendulum_a0", "--observations", tmp_path / "obs.csv.gz",
                      "--output", tmp_path / "x.csv"], capsys)
    assert rc == 2 and "obs.csv.gz: not a gzip-compressed file (its name ends in .gz)" in err, err


@pytest.mark.parametrize("scale, unit", [(1e9, "nanoseconds"), (1e3, "milliseconds")])
def test_a_time_column_not_in_seconds_is_named(tmp_path, capsys, scale, unit):
    """Rows farther apart than the mechanism's time scale √(reach/g) (0.23 s for the double pendulum) follow
    nothing of its motion: a time column in ns or ms is named as such, not estimated through."""
    t = (np.arange(50) * 0.002 + 1.7e9) * scale
    write_csv(tmp_path / "obs.csv", ["stamp", "q1", "q2"], np.column_stack([t, np.zeros(50), np.zeros(50)]))
    for command, extra in (("estimate", []), ("identify", ["--identify", "q1.viscous_friction"]),
                           ("tune", ["--mode", "estimation"])):
        rc, _, err = run([command, "double_pendulum_a0", "--observations", tmp_path / "obs.csv", "--time-column",
                          "stamp", *extra, "--output", tmp_path / "x"], capsys)
        assert rc == 2 and "is the time column in seconds?" in err and unit in err, (command, err)
        assert f"apart (the median), longer than the mechanism's time scale √(reach/g) = 0.226 s" in err


# -- an actuator's latency from its measured effort: mbfg identify --measured ----------------------------------------
PENDUBOT = DFKI_DATA / "design_A.0__20220819__174435-pendubot_tvlqr_lqr__trajectory.csv.gz"
PENDUBOT_COLUMNS = ["--reading", "q1=pos_meas1,q2=pos_meas2", "--command", "q1=tau_con1,q2=tau_con2"]


def test_identify_times_an_actuators_latency_from_its_measured_effort(tmp_path, capsys):
    """On the DFKI pendubot run (its shoulder's command moves fast, its elbow's motor is off) with the latency
    and lag left out of the mechanism: the shoulder's measured torque follows its command after 4.5 ms through a
    3-ms lag (the shipped A.0 file's values, timed there), written as its delay and time_constant; the elbow's are
    not timed and stay; with nothing else to identify only the response is written, and the file loads."""
    import yaml
    doc = yaml.safe_load((ROOT / "mechanisms" / "double_pendulum_a0.yaml").read_text())
    for a in doc["actuators"]:
        a.pop("delay")
        a.pop("time_constant")
    mech = tmp_path / "a0.yaml"
    mech.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    out = tmp_path / "timed.yaml"
    rc, stdout, err = run(["identify", mech, "--observations", PENDUBOT, "--torques", PENDUBOT, *PENDUBOT_COLUMNS,
                           "--measured", "q1=tau_meas1,q2=tau_meas2", "-o", out], capsys)
    assert rc == 0, err
    assert "q1.delay = 0.0045 s, q1.time_constant = 0.003 s" in stdout and "RMS 0.13×" in stdout
    assert "q2: latency not timed" in err and "delay and time_constant left as they are" in err
    timed = load_mechanism(out)
    assert timed.actuator_delays == (0.0045, 0.0) and timed.actuator_time_constants == (0.003, 0.0)
    assert "identify" not in yaml.safe_load(out.read_text())


def test_identify_measured_errors_name_what_is_wrong(tmp_path, capsys):
    base = ["identify", "double_pendulum_a0", "--observations", PENDUBOT, *PENDUBOT_COLUMNS[:2], "-o",
            tmp_path / "o.yaml", "--mode", "estimation"]
    for extra, message in (
            (["--measured", "q1=tau_meas1"], "--measured JOINT=COLUMN names measured efforts of the --torques file"),
            (["--torques", PENDUBOT, *PENDUBOT_COLUMNS[2:], "--measured", "elbow=tau_meas2"],
             "--measured elbow=tau_meas2: 'elbow' is not an actuator of the mechanism (q1, q2)"),
            (["--torques", PENDUBOT, *PENDUBOT_COLUMNS[2:], "--measured", "q1=current1"],
             "no column 'current1' (for measured effort q1")):
        rc, _, err = run(base + extra, capsys)
        assert rc == 2 and message in err, err
