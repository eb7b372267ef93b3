#!/usr/bin/env python3
"""Estimation quality: mbfg_ros against the filters an engineer would otherwise write (one table per scenario).

    PYTHONPATH=. python bench/estimation_quality.py [--seeds 3] [--seconds 3] [--scenario NAME ...]
                                                    [--params PARAMS.yaml | --tune] [--json OUT.json]

Scenarios (the simulated plant `mbfg_ros.sim.plant.SimulatedPlant`, encoders only, σ from the mechanism file):
* four_bar_estimation: crank four-bar at 1 kHz, unknown smooth torque τ(t) = 20 sin 3t + 5 cos 7t − 5 N·m
  (open loop), estimation mode;
* four_bar_fused: the same command through the plant's default actuator mismatch (0.9 × command − 1.5 N·m ·
  tanh(θ̇/0.05) − 0.3 N·m·s · θ̇), fused mode (the estimators are given the command); the effort is scored
  against the applied effort, and also against the command;
* robot: the pick-and-place robot at 200 Hz (two motor encoders), the plant's PD controller's efforts
  unknown, estimation mode;
* slider_crank: the slider-crank at 1 kHz, the plant's PD controller's efforts unknown, estimation mode.

Rows:
* "mbfg_ros, defaults": `FixedLagEstimator` with `EstimatorConfig(dt, mode, compute_covariance=True)` and
  every other setting at its shipped default (window 10; estimation mode: the effort density fitted online from
  the readings, `adapt_densities`, starting from `effort_density`);
* "mbfg_ros, --params FILE": the same with the estimator parameters of FILE (the node's parameter-file format,
  the `mbfg_estimator` section: e.g. written by `mbfg tune`); skipped with the reason when no file is given;
  with `--tune` instead, per scenario the file `mbfg tune` writes from a separate run of the scenario (seed
  2000, never scored, no truth used): the effort and acceleration densities (`--fit-acceleration-density`; the
  latter kept at its default where the recording does not determine it) or, fused, the disturbance's density
  and time constant, by maximum innovation likelihood, the encoder σ held at the mechanism file's; the file
  sets `adapt_densities: false` (the fitted density is used as fitted);
* fused scenarios, "mbfg_ros, defaults, ... identified": the defaults with each actuator's gain, viscous and
  Coulomb friction identified online from their priors (1, 0, 0: `EstimatorConfig.identify`), the actuator
  mismatch learnt while estimating; its effort is what the actuator applies (command + disturbance + the
  parameters' forces), its NEES effort not reported (the parameters' share is not in the efforts' marginal);
* "EKF (truth-tuned)": `mbfg_ros.estimation.reduced_ekf.ReducedEKF` on the same exact model, state (z, ż, τ, τ̇) (fused:
  τ = command + d, state (z, ż, d, ḋ): a disturbance observer), the density of τ̈ (or d̈) chosen by a line
  search on a separate run of the scenario scored against its truth (seed 1000): the best this filter can do;
* "Savitzky–Golay + ID": causal Savitzky–Golay (order 3, 0.1 s of samples: 101 at 1 kHz, 21 at 200 Hz)
  on each encoder, the effort by closed-form inverse dynamics.

Columns: RMSE of the encoded coordinates' angle [mrad], rate [rad/s], acceleration [rad/s²] and the actuator
effort [N·m] (pooled over the robot's two motors); NEES (mean of e²/σ²: 1 for a consistent estimator) of angle,
rate and effort from each estimator's own covariance ("–": none reported; mbfg_ros reports the [q, q̇]
marginal, no effort covariance yet); cost per step: CPU µs of the calling thread (mbfg_ros with its
covariance computed).  Scored after 0.5 s of settling; means over the seeds.  Never used in tests.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))

from ekf import CausalSavitzkyGolay  # noqa: E402
from mbfg_ros.estimation.config import EstimatorConfig  # noqa: E402
from mbfg_ros.estimation.estimator import FixedLagEstimator  # noqa: E402
from mbfg_ros.estimation.reduced_ekf import FilterOutput, ReducedEKF  # noqa: E402
from mbfg_ros.model.mechanism import Mechanism, load_mechanism  # noqa: E402
from mbfg_ros.sim.plant import Actuator, SimulatedPlant, Trajectory  # noqa: E402

SETTLE = 0.5            # [s] scored from here on
TUNING_SEED = 1000      # the EKF's tuning run (never a scored seed)
MBFG_TUNE_SEED = 2000   # --tune: the recording `mbfg tune` fits (never a scored seed)
SG_SPAN = 0.1           # [s] of samples in the Savitzky–Golay window
QUANTITIES = ("angle", "rate", "acceleration", "effort")


def four_bar_torque(mech, t, q, v):
    """The open-loop torque of issue 12's measurements (N·m)."""
    return np.array([20.0 * math.sin(3.0 * t) + 5.0 * math.cos(7.0 * t) - 5.0])


@dataclass
class Scenario:
    mechanism: str
    dt: float
    mode: str                                  # estimation | fused
    law: Optional[Callable] = None             # the plant's effort law (None: its PD controller)
    mismatch: bool = False                     # the default actuator mismatch (else the ideal actuator)
    description: str = ""


SCENARIOS: Dict[str, Scenario] = {
    "four_bar_estimation": Scenario("four_bar_crank", 1e-3, "estimation", four_bar_torque, False,
                                    "crank four-bar, 1 kHz, unknown torque 20 sin 3t + 5 cos 7t − 5 N·m"),
    "four_bar_fused": Scenario("four_bar_crank", 1e-3, "fused", four_bar_torque, True,
                               "crank four-bar, 1 kHz, fused: command 20 sin 3t + 5 cos 7t − 5 N·m through the "
                               "actuator mismatch 0.9·u − 1.5·tanh(θ̇/0.05) − 0.3·θ̇"),
    "robot": Scenario("pick_and_place_robot", 5e-3, "estimation", None, False,
                      "pick-and-place robot, 200 Hz, two motor encoders, unknown PD-controller efforts"),
    "slider_crank": Scenario("slider_crank", 1e-3, "estimation", None, False,
                             "slider-crank, 1 kHz, unknown PD-controller torque"),
}


@dataclass
class Run:
    """One estimator on one seed: per step the estimates and 1σ (NaN where none) of the encoded quantities."""
    est: Dict[str, np.ndarray] = field(default_factory=dict)
    std: Dict[str, np.ndarray] = field(default_factory=dict)
    cpu_us: float = float("nan")


def simulate(sc: Scenario, mech: Mechanism, seed: int, seconds: float) -> Trajectory:
    encoders = [s.name for s in mech.sensors if s.kind == "encoder"]
    actuator = Actuator.default_mismatch(mech) if sc.mismatch else Actuator.ideal(mech)
    return SimulatedPlant(mech, dt=sc.dt, seed=seed, profile=sc.law, actuator=actuator,
                          sensors=encoders).simulate(seconds)


def encoded(mech: Mechanism):
    """(sensor names, coordinate columns) of the encoders."""
    enc = [s for s in mech.sensors if s.kind == "encoder"]
    return [s.name for s in enc], [int(s.coordinate) for s in enc]


def _collect(outputs: List[FilterOutput]) -> Run:
    r = Run()
    for q in QUANTITIES:
        r.est[q] = np.array([getattr(o, q) for o in outputs])
    for q in ("angle", "rate", "effort"):
        s = [getattr(o, q + "_std") for o in outputs]
        r.std[q] = np.array(s, dtype=float) if s[0] is not None else np.full_like(r.est[q], np.nan)
    return r


def estimator_effort_std(e) -> Optional[np.ndarray]:
    """1σ of the estimator's (applied) efforts, when it computes its marginal covariance (None otherwise)."""
    return e.efforts_std


def applied_effort(est: FixedLagEstimator, e, commands) -> np.ndarray:
    """The effort an estimate with identified parameters says the actuators apply: the known commands plus the
    disturbance plus the parameters' forces on their coordinates (gain and friction: what the plant's actuator
    mismatch applies; the reported `efforts` leave the friction out, a force of its own)."""
    known = est.efforts.known(commands)
    forces = est.identification.forces(e.parameters, e.v, known, e.a)
    return known + est.efforts.scattered(e.disturbance) + forces[est.efforts.state_coordinates]


def run_mbfg(sc: Scenario, mech: Mechanism, traj: Trajectory, config: EstimatorConfig) -> Run:
    """`config`'s estimator on `traj`; with identified parameters the effort scored is `applied_effort` (its σ not
    reported: the parameters' share is not in the efforts' marginal)."""
    names, z = encoded(mech)
    n = mech.n
    est = FixedLagEstimator(mech, config)
    identified = est.identification is not None
    rows, cpu = [], []
    for k, t in enumerate(traj.t):
        obs = {nm: float(traj.readings[nm][k]) for nm in names}
        c0 = time.thread_time()
        e = est.step(float(t), traj.efforts[k] if config.mode == "fused" else None, obs)
        cpu.append(time.thread_time() - c0)
        P = e.covariance
        if P is not None and P.shape == (2 * n, 2 * n):
            sa, sr = np.sqrt(np.diag(P)[z]), np.sqrt(np.diag(P)[[n + i for i in z]])
        else:
            sa = sr = None
        if identified:
            effort, effort_std = applied_effort(est, e, traj.efforts[k]), None
        else:
            effort, effort_std = np.array(e.efforts, float), estimator_effort_std(e)
        rows.append(FilterOutput(e.q[z], e.v[z], e.a[z], effort, sa, sr, effort_std))
    r = _collect(rows)
    r.cpu_us = 1e6 * float(np.mean(cpu[1:]))
    return r


def run_filter(make, sc: Scenario, mech: Mechanism, traj: Trajectory) -> Run:
    names, _ = encoded(mech)
    f = make()
    rows, cpu = [], []
    Y = np.column_stack([traj.readings[nm] for nm in names])
    for k in range(len(traj)):
        c0 = time.thread_time()
        if isinstance(f, ReducedEKF):
            o = f.step(Y[k], traj.efforts[k] if sc.mode == "fused" else None)
        else:
            o = f.step(Y[k])
        cpu.append(time.thread_time() - c0)
        rows.append(o)
    r = _collect(rows)
    r.cpu_us = 1e6 * float(np.mean(cpu[1:]))
    return r


def truth_of(mech: Mechanism, traj: Trajectory) -> Dict[str, np.ndarray]:
    _, z = encoded(mech)
    return {"angle": traj.q[:, z], "rate": traj.v[:, z], "acceleration": traj.a[:, z], "effort": traj.applied,
            "command": traj.efforts}


def errors(mech: Mechanism, run: Run, truth: Dict[str, np.ndarray], sel) -> Dict[str, float]:
    """RMSE per quantity, NEES of angle, rate, effort (NaN where no σ), effort vs command."""
    out = {}
    for q in QUANTITIES:
        e = run.est[q][sel] - truth[q][sel]
        if q == "angle":
            e = (e + math.pi) % (2 * math.pi) - math.pi        # angles modulo 2π: the same pose
        out[q] = float(np.sqrt(np.mean(e ** 2)))
        if q in run.std:
            s = run.std[q][sel]
            out["nees_" + q] = float(np.mean((e / s) ** 2)) if np.all(np.isfinite(s)) and np.all(s > 0) else math.nan
    out["effort_vs_command"] = float(np.sqrt(np.mean((run.est["effort"][sel] - truth["command"][sel]) ** 2)))
    return out


def tune_ekf(sc: Scenario, mech: Mechanism, seconds: float, sigma, verbose: bool):
    """The density of ë by a line search on the tuning run: decades 1e0…1e8, then half-decades around the
    best; the criterion is the geometric mean of the angle, rate and effort RMSE (each scored against the
    truth, so no quantity's units dominate).  No acceleration noise: searching its density too on this one
    2.5-s run picked 0.1 on the robot and 0.01 on the fused four-bar, worse on the scored seeds (robot angle
    0.442 vs 0.433 mrad): the tuning run is too short to choose two densities against the truth."""
    traj = simulate(sc, mech, TUNING_SEED, min(seconds, 2.5))
    truth = truth_of(mech, traj)
    sel = traj.t >= SETTLE
    _, z = encoded(mech)
    cache = {}

    def score(density):
        if density not in cache:
            try:
                r = run_filter(lambda: make_ekf(sc, mech, z, sigma, density), sc, mech, traj)
                e = errors(mech, r, truth, sel)
                cache[density] = float(np.mean(np.log([e["angle"], e["rate"], e["effort"]])))
            except Exception:                            # a density so wrong that the filter diverges
                cache[density] = math.inf
            if not math.isfinite(cache[density]):
                cache[density] = math.inf
        return cache[density]
    grid = [10.0 ** p for p in range(0, 9)]
    best = min(grid, key=score)
    best = min([best / math.sqrt(10), best, best * math.sqrt(10)], key=score)
    if verbose:
        print(f"  EKF tuning ({len(cache)} runs): density {best:.3g}", file=sys.stderr)
    return best


#: --ekf-acceleration-density: the EKF's z̈ noise (the estimator's acceleration density as the EKF sees it)
EKF_ACCELERATION_DENSITY = 0.0


def make_ekf(sc: Scenario, mech: Mechanism, z, sigma, density: float) -> ReducedEKF:
    return ReducedEKF(mech, z, sc.dt, sigma, density, fused=sc.mode == "fused",
                      acceleration_density=EKF_ACCELERATION_DENSITY)


def estimator_config_from_file(path: str, dt: float, mode: str) -> EstimatorConfig:
    """EstimatorConfig(dt, mode, compute_covariance=True) with the estimator parameters of a parameter file
    in the node's format (`/**/mbfg_estimator: ros__parameters: ...`): every key that is an EstimatorConfig
    field (dict fields such as `sigmas` update the defaults); dt and mode stay the scenario's."""
    from mbfg_ros.tuning.params_file import ParamsFileError, node_parameters
    try:
        section = node_parameters(path)[1]
    except ParamsFileError as e:
        raise SystemExit(f"--params {e}") from None
    fields = {f.name: f for f in dataclasses.fields(EstimatorConfig)}
    base = EstimatorConfig(dt=dt, mode=mode, compute_covariance=True)
    kwargs, ignored = {}, []
    for key, value in section.items():
        if key in ("dt", "mode") or key not in fields:
            ignored.append(key)
            continue
        default = getattr(base, key)
        if isinstance(default, dict):
            value = {**default, **dict(value)}
        elif isinstance(default, tuple) or (default is None and isinstance(value, list)):
            value = tuple(value)
        kwargs[key] = value
    if ignored:
        print(f"--params: not estimator settings here (ignored): {', '.join(sorted(map(str, ignored)))}",
              file=sys.stderr)
    try:
        return dataclasses.replace(base, **kwargs).validated()
    except (ValueError, TypeError) as e:
        raise SystemExit(f"--params {path}: {e}")


def tune_params_file(name: str, sc: Scenario, mech: Mechanism, seconds: float, out_dir: Path, verbose: bool):
    """--tune: what `mbfg tune MECH --mode MODE` writes from the scenario's seed-2000 run (readings and, fused,
    the commands only); returns (path, fitted density, its relative 1σ)."""
    from mbfg_ros.tuning import likelihood as tl
    from mbfg_ros.tuning.params_file import format_params
    traj = simulate(sc, mech, MBFG_TUNE_SEED, seconds)
    names, z = encoded(mech)
    rec = tl.Recording(traj.t, np.column_stack([traj.readings[nm] for nm in names]), names, z,
                       traj.efforts if sc.mode == "fused" else None, f"{name} seed {MBFG_TUNE_SEED}")
    t0 = time.monotonic()
    # estimation mode: the acceleration density too (`mbfg tune --fit-acceleration-density`): the robot's
    # likelihood peaks at 1e-2, where the estimator beats the EKF; the one-DOF mechanisms' is flat (kept)
    initial = tl.initial_values(mech)
    result = tl.fit(mech, rec, sc.mode, initial, tl.parameter_names(mech, sc.mode, False, sc.mode == "estimation"))
    described = ", ".join(f"{f.name} {f.describe()}" for f in result.fitted)
    if verbose:
        print(f"  mbfg tune on seed {MBFG_TUNE_SEED}: {described} ({result.evaluations} evaluations, "
              f"{time.monotonic() - t0:.0f} s)", file=sys.stderr)
    path = out_dir / f"tuned_{name}.yaml"
    kept = tl.file_values(result, initial["acceleration_density"])
    path.write_text(format_params(sc.mode, kept, result.sensor_sigmas, [f"bench --tune: {name}, {described}"],
                                  adapt_densities=False if sc.mode == "estimation" else None))
    return path, [dataclasses.replace(f, value=kept.get(f.name, f.value)) for f in result.fitted]


def identified_parameters(mech: Mechanism) -> tuple:
    """Each actuator's gain, viscous and Coulomb friction (the fused scenarios' "identified" row)."""
    return tuple(f"{j}.{k}" for j in mech.actuator_names for k in ("gain", "viscous_friction", "coulomb_friction"))


def fmt(x, scale=1.0, digits=3):
    return "–" if x is None or not math.isfinite(x) else f"{x * scale:.{digits}g}"


def run_scenario(name: str, sc: Scenario, seeds: List[int], seconds: float, params: Optional[str],
                 verbose: bool = True, tune_dir: Optional[Path] = None):
    mech = load_mechanism(sc.mechanism)
    tuned = None
    if tune_dir is not None:
        path, tuned = tune_params_file(name, sc, mech, seconds, tune_dir, verbose)
        params = str(path)
    names, z = encoded(mech)
    sigma = np.array([s.sigma for s in mech.sensors if s.kind == "encoder"])
    density = tune_ekf(sc, mech, seconds, sigma, verbose)
    window = int(round(SG_SPAN / sc.dt)) + 1
    rows: Dict[str, List[Dict[str, float]]] = {}
    costs: Dict[str, List[float]] = {}
    labels = {"mbfg": "mbfg_ros, defaults",
              "tuned": (f"mbfg_ros, mbfg tune on seed {MBFG_TUNE_SEED} ("
                        + ", ".join(f"{f.name} {f.value:.3g}" for f in tuned) + ")" if tuned
                        else f"mbfg_ros, --params {Path(params).name}" if params else "mbfg_ros, --params FILE"),
              "ekf": f"EKF (truth-tuned, ë density {density:.3g}"
                     + (f", acceleration density {EKF_ACCELERATION_DENSITY:.3g}" if EKF_ACCELERATION_DENSITY else "")
                     + ")",
              "sg": f"Savitzky–Golay ({window} samples) + ID",
              "ignore": "mbfg_ros, estimation mode (commands ignored), defaults",
              "identified": "mbfg_ros, defaults, " + ", ".join(identified_parameters(mech)) + " identified"}
    tuned_cfg = estimator_config_from_file(params, sc.dt, sc.mode) if params else None
    for seed in seeds:
        traj = simulate(sc, mech, seed, seconds)
        truth = truth_of(mech, traj)
        sel = traj.t >= SETTLE
        runs = {"mbfg": run_mbfg(sc, mech, traj, EstimatorConfig(dt=sc.dt, mode=sc.mode, compute_covariance=True))}
        if tuned_cfg is not None:
            runs["tuned"] = run_mbfg(sc, mech, traj, tuned_cfg)
        if sc.mode == "fused":
            # what the commands are worth: the same readings without them (fused must not be worse)
            runs["ignore"] = run_mbfg(sc, mech, traj, EstimatorConfig(dt=sc.dt, mode="estimation",
                                                                      compute_covariance=True))
        if sc.mode == "fused":
            # the actuator mismatch learnt online (from the priors: gain 1, no friction)
            runs["identified"] = run_mbfg(sc, mech, traj, EstimatorConfig(
                dt=sc.dt, mode=sc.mode, compute_covariance=True, identify=identified_parameters(mech)))
        runs["ekf"] = run_filter(lambda: make_ekf(sc, mech, z, sigma, density), sc, mech, traj)
        runs["sg"] = run_filter(lambda: CausalSavitzkyGolay(mech, z, sc.dt, window=window), sc, mech, traj)
        for key, r in runs.items():
            rows.setdefault(key, []).append(errors(mech, r, truth, sel))
            costs.setdefault(key, []).append(r.cpu_us)
        if verbose:
            print(f"  {name} seed {seed} done", file=sys.stderr)
    fused = sc.mode == "fused"
    print(f"### {name}: {sc.description}")
    print(f"({len(seeds)} seeds, {seconds:g} s each, scored after {SETTLE} s; encoder σ "
          f"{', '.join(f'{s * 1e3:g} mrad' for s in sigma)} on {', '.join(names)})\n")
    head = "| estimator | angle RMSE [mrad] | rate RMSE [rad/s] | accel. RMSE [rad/s²] | effort RMSE [N·m] |"
    if fused:
        head += " effort vs command [N·m] |"
    head += " NEES angle | NEES rate | NEES effort | CPU µs/step |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for key in ("mbfg", "tuned", "identified", "ignore", "ekf", "sg"):
        if key in ("ignore", "identified") and not fused:
            continue
        if key not in rows:
            cells = ["skipped: no --params FILE (e.g. from `mbfg tune`) or --tune"] + [""] * (head.count("|") - 3)
            print(f"| {labels[key]} | " + " | ".join(cells) + " |")
            continue
        m = {k: float(np.mean([r[k] for r in rows[key]])) for k in rows[key][0]}
        cells = [fmt(m["angle"], 1e3), fmt(m["rate"]), fmt(m["acceleration"]), fmt(m["effort"])]
        if fused:
            cells.append(fmt(m["effort_vs_command"]))
        cells += [fmt(m.get("nees_angle"), digits=2), fmt(m.get("nees_rate"), digits=2),
                  fmt(m.get("nees_effort"), digits=2), f"{np.mean(costs[key]):.0f}"]
        print(f"| {labels[key]} | " + " | ".join(cells) + " |")
    print()
    return {"description": sc.description, "seeds": seeds, "seconds": seconds, "ekf_effort_density": density,
            "savitzky_golay_window": window,
            "rows": {labels[k]: {"mean": {q: float(np.mean([r[q] for r in v])) for q in v[0]},
                                 "per_seed": v, "cpu_us_per_step": float(np.mean(costs[k]))}
                     for k, v in rows.items()}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=3, help="seeds per scenario (default 3: seeds 1, 2, 3)")
    ap.add_argument("--seconds", type=float, default=3.0, help="simulated seconds per run (default 3)")
    ap.add_argument("--scenario", action="append", choices=sorted(SCENARIOS),
                    help="scenario(s) to run (repeatable; default: all)")
    ap.add_argument("--params", metavar="FILE", help="estimator parameters (node parameter-file format) for the "
                                                     "'mbfg_ros, --params' row")
    ap.add_argument("--tune", action="store_true", help="the 'mbfg_ros, --params' row with the file `mbfg tune` "
                                                       "writes per scenario from a separate run (seed 2000)")
    ap.add_argument("--ekf-acceleration-density", type=float, default=0.0, metavar="S",
                    help="give the EKF white z̈ noise of the estimator's acceleration density S (as the estimator "
                         "has it: S (JᵀJ)⁻¹ on the encoded coordinates; default 0: none), tuning and scoring")
    ap.add_argument("--json", metavar="FILE", help="also write every number (per seed too) to this file")
    ap.add_argument("--quiet", action="store_true", help="no progress on stderr")
    a = ap.parse_args(argv)
    if a.seeds < 1:
        ap.error("--seeds must be >= 1")
    if not a.seconds > SETTLE:
        ap.error(f"--seconds must be longer than the {SETTLE}-s settling time")
    if a.params and not Path(a.params).is_file():
        ap.error(f"--params: no such file: {a.params}")
    if not a.ekf_acceleration_density >= 0:
        ap.error("--ekf-acceleration-density must be >= 0")
    global EKF_ACCELERATION_DENSITY
    EKF_ACCELERATION_DENSITY = a.ekf_acceleration_density
    if a.params and a.tune:
        ap.error("--params and --tune are exclusive (--tune writes a file per scenario)")
    import tempfile
    tune_dir = Path(tempfile.mkdtemp(prefix="mbfg_tune_")) if a.tune else None
    from mbfg_ros.blas import limit_blas_threads
    limit_blas_threads(1)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load average "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}; Python {platform.python_version()}\n")
    results = {}
    for name in a.scenario or list(SCENARIOS):
        t0 = time.monotonic()
        results[name] = run_scenario(name, SCENARIOS[name], list(range(1, a.seeds + 1)), a.seconds, a.params,
                                     not a.quiet, tune_dir)
        if not a.quiet:
            print(f"  {name}: {time.monotonic() - t0:.0f} s", file=sys.stderr)
    if a.json:
        import json
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(results, indent=1, allow_nan=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
