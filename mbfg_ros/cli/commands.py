"""The `mbfg` command: inspect mechanisms, simulate, solve inverse dynamics and estimate from files.

    mbfg info MECH.yaml [--json]
    mbfg simulate MECH.yaml --duration T --dt DT --output OUT.csv [...]
    mbfg inverse-dynamics MECH.yaml --trajectory TRAJ.csv --output OUT.csv [--plot PNG]
    mbfg estimate MECH.yaml --observations OBS.csv --output OUT.csv [--params PARAMS.yaml] [...]
    mbfg tune MECH.yaml (--observations OBS.csv [--torques CMD.csv] | --bag DIR) --mode M -o PARAMS.yaml

User mistakes (missing or bad files, unknown names, bad options) print one line
``mbfg: error: ...`` on stderr and exit with status 2; no traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from mbfg_ros.cli import csvio
from mbfg_ros.excerpt import excerpt, excerpts
from mbfg_ros.cli.csvio import CsvError
from mbfg_ros.dynamics.kinematics import AssemblyError
from mbfg_ros.estimation.config import FORMULATIONS, INTEGRATORS, MODES, EstimatorConfig
from mbfg_ros.factors.noise import SCALED, default_sigmas
from mbfg_ros.model.plausibility import InputLimits
from mbfg_ros.model.spec import EFFORT_KINDS, MechanismError
from mbfg_ros.tuning.likelihood import TuningError

PROG = "mbfg"


class UserError(Exception):
    """A mistake in the command line or its inputs: reported as one line, exit status 2."""


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------
class Progress:
    """A one-line progress bar on stderr, drawn only when stderr is a terminal."""

    def __init__(self, total: int, label: str, stream=None, enabled: Optional[bool] = None):
        self.total = max(int(total), 1)
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            try:
                enabled = self.stream.isatty()
            except (AttributeError, ValueError):
                enabled = False
        self.enabled = bool(enabled)
        self._last = -1.0
        self._t0 = time.perf_counter()

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if done < self.total and now - self._last < 0.1:
            return
        self._last = now
        frac = min(max(done / self.total, 0.0), 1.0)
        width = 30
        bar = "#" * int(round(frac * width))
        self.stream.write(f"\r{self.label} [{bar:<{width}}] {100 * frac:5.1f}% {now - self._t0:6.1f} s")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.update(self.total)
            self.stream.write("\n")
            self.stream.flush()


class TrackingSummary:
    """What `mbfg estimate` prints on stderr at the end, one line: the steps, how many times the estimate lost
    track (the estimator re-initialized from the readings because its estimate stopped following them:
    `Estimate.recovery` "lost_track", see `estimation.sensors.TrackMonitor`), the other recoveries (numerical
    failures, an encoder read whole turns away), the steps without an estimate yet, the re-initializations,
    the CPU time per step and, where the estimator fits them online, the encoders' σ and the densities at the
    end, each density at the edge of its range marked; `warning` says how long a fit sat at the top of its range
    (`density_adaptation.limits_warning`).  A re-initialization is a step after the first whose estimate started a
    new window (status ``initialized`` or ``recovered``)."""

    def __init__(self):
        self.steps = self.lost = self.recovered = self.waiting = self.reinitializations = 0
        self.cpu_seconds = math.nan
        self.sensor_sigmas: Optional[Dict[str, float]] = None
        self.densities: Optional[Dict[str, float]] = None
        self.limits: Dict[str, str] = {}             # the densities at the edge of their range at the end
        self.top_steps = 0                           # steps with a density at the top of its range ...
        self.top: Dict[str, str] = {}                # ... and which

    def add(self, k: int, estimate, limits: Optional[Dict[str, str]] = None) -> None:
        """Count step `k`'s estimate; `limits`: the estimator's `density_fit_limits` after it."""
        self.limits = dict(limits or {})
        top = {n: e for n, e in self.limits.items() if e == "top"}
        if top:
            self.top_steps += 1
            self.top.update(top)
        self.steps += 1
        status = estimate.status
        if estimate.recovery == "lost_track":
            self.lost += 1
        elif status == "recovered":
            self.recovered += 1
        self.waiting += status == "waiting"
        self.reinitializations += self.steps > 1 and status in ("initialized", "recovered")

    def line(self) -> str:
        share = 100.0 * self.lost / max(self.steps, 1)
        cpu = 1e3 * self.cpu_seconds / max(self.steps, 1)
        sigmas = ("" if not self.sensor_sigmas else
                  ", encoder σ fitted " + ", ".join(f"{n} {s:.3g}" for n, s in self.sensor_sigmas.items()))
        densities = ("" if not self.densities else
                     ", densities fitted " + ", ".join(
                         f"{n} {v:.3g}" + (f" ({self.limits[n]} of its range)" if n in self.limits else "")
                         for n, v in self.densities.items()))
        return (f"{PROG} estimate: {self.steps} steps, lost track {self.lost} times ({share:.1f} % of the steps; "
                f"re-initialized from the readings), {self.recovered} other recoveries, {self.waiting} steps "
                f"waiting, {self.reinitializations} re-initializations, CPU {cpu:.3g} ms per step{sigmas}{densities}")

    def warning(self, command: str = "estimate") -> str:
        """"" unless a fitted density sat at the top of its range on some step: then the warning (from `mbfg
        COMMAND`) and for how long."""
        from mbfg_ros.estimation.density_adaptation import limits_warning
        if not self.top_steps:
            return ""
        share = 100.0 * self.top_steps / max(self.steps, 1)
        return f"{PROG} {command}: warning: {limits_warning(self.top)} (on {share:.0f} % of the steps)"


def _load(path, gravity: Optional[Sequence[float]] = None):
    from mbfg_ros.model.mechanism import Mechanism, resolve_mechanism_path
    from mbfg_ros.model.loader import load_spec
    spec = load_spec(resolve_mechanism_path(path))
    if gravity is not None:
        g = [float(x) for x in gravity]
        if len(g) == 1:
            g = [0.0, g[0]]
        if len(g) != 2 or not all(math.isfinite(x) for x in g):
            raise UserError(f"--gravity takes GY or GX GY (finite numbers), got {' '.join(map(str, gravity))}")
        spec = dataclasses.replace(spec, gravity=(g[0], g[1]))
    return Mechanism(spec)


def _positive(name, kind=float):
    """argparse type: a number > 0 (kind float), or an integer ≥ 1 (kind int), named in its error."""
    what = "a number" if kind is float else "an integer"
    def parse(text):
        try:
            x = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be {what} (got '{text}')") from None
        if not (x > 0 and math.isfinite(x)):
            raise argparse.ArgumentTypeError(f"{name} must be {'> 0' if kind is float else '≥ 1'} (got {text})")
        return x
    return parse


def _write_state_csv(path, mech, t, q, v, a, tau, extra=None) -> None:
    """The state CSV; `extra`: {column name: values} appended (e.g. the fused mode's disturbance)."""
    header = csvio.state_header(mech.coordinate_names, mech.actuator_names)
    rows = csvio.state_rows(t, q, v, a, tau)
    if extra:
        header = header + list(extra)
        rows = np.hstack([rows] + [np.asarray(col, dtype=float).reshape(len(t), 1) for col in extra.values()])
    csvio.write_table(path, header, rows)


def _plot(path, mech, t, q, v, tau, title: str, reference=None) -> None:
    """Actuated coordinates (or all, if none) and efforts over time."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:  # pragma: no cover - matplotlib missing
        raise UserError(f"--plot needs matplotlib ({exc})") from None
    idx = list(mech.actuated) or list(range(mech.n))
    rows = 3 if len(mech.actuated) else 2
    fig, axes = plt.subplots(rows, 1, sharex=True, figsize=(8, 2.6 * rows))
    for i in idx:
        axes[0].plot(t, q[:, i], label=mech.coordinate_names[i])
        axes[1].plot(t, v[:, i], label=mech.coordinate_names[i] + "_dot")
    axes[0].set_ylabel("q")
    axes[1].set_ylabel("q̇")
    if rows == 3:
        for j, name in enumerate(mech.actuator_names):
            axes[2].plot(t, tau[:, j], label=f"tau_{name}")
            if reference is not None:
                axes[2].plot(t, reference[:, j], "--", label=f"tau_{name} (closed form)")
        axes[2].set_ylabel("effort")
    axes[-1].set_xlabel("t [s]")
    for ax in axes:
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize="small")
    axes[0].set_title(title)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=100)
    except OSError as exc:
        raise UserError(f"{path}: cannot write plot: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)


def _efforts_from_csv(mech, path, t: np.ndarray, time_column: Optional[str] = None,
                      columns: Optional[Dict[str, str]] = None) -> np.ndarray:
    """(len(t), n_actuators) efforts from a CSV with `t` and one column per actuator joint
    (`<joint>` or `tau_<joint>`), linearly interpolated; or, with `columns` (joint → column, every actuator's:
    `--command`), from those columns, the file's others ignored.  A missing cell (empty or nan) leaves that
    actuator's effort unknown at its row: the rows of the actuator that have one are interpolated over it."""
    table = csvio.read_table(path, time_column)
    if columns:
        missing = [j for j in mech.actuator_names if j not in columns]
        if missing:
            raise UserError(f"--command: no column given for actuator(s) {', '.join(missing)} (give JOINT=COLUMN "
                            f"for each of {', '.join(mech.actuator_names)})")
        table = table.select({j: columns[j] for j in mech.actuator_names}, "actuator")
    names = []
    for joint in mech.actuator_names:
        if table.has(f"tau_{joint}"):      # first: a joint may share its name with a coordinate column
            names.append(f"tau_{joint}")
        elif table.has(joint):
            names.append(joint)
        else:
            raise CsvError(f"{path}: no column for actuator '{joint}' (expected '{joint}' or 'tau_{joint}', or "
                           f"name it: --command {joint}=COLUMN; columns: {excerpts(table.columns)})")
    known = set(csvio.state_header(mech.coordinate_names, mech.actuator_names)) | set(mech.actuator_names)
    unknown = [c for c in table.columns if c not in known]
    if unknown:
        raise CsvError(f"{path}: unknown column(s) {excerpts(unknown)} "
                       f"(actuators: {', '.join(mech.actuator_names) or 'none'})")
    limits = InputLimits(mech)
    for k, name in enumerate(names):        # the actuators' effort_limit, as the node's
        csvio.check_cells(table, name, lambda value, k=k: limits.effort_problem(k, value))
    return csvio.interpolate(table, names, t)


# ----------------------------------------------------------------------------------------------
# sub-commands
# ----------------------------------------------------------------------------------------------
def _scale_unit(effort_units) -> str:
    """The unit of the effort scale: N where every actuator is prismatic (`mechanism_scale`), else N·m."""
    return "N" if effort_units and set(effort_units) == {"N"} else "N·m"


def cmd_info(args) -> int:
    mech = _load(args.mechanism)
    info = mech.describe()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    sensors = ", ".join(f"{s['name']} ({s['type']}, σ={s['sigma']:g}, "
                        + (f"on {s['coordinate']}" if s["type"] == "encoder" else f"body {s['body']}") + ")"
                        for s in info["sensors"]) or "none"
    modes = ", ".join(f"{k}={v:+d}" for k, v in info["assembly_modes"].items()) or "none"
    acts = ", ".join(f"{c} (" + (f"joint {j}, " if j != c else "") + f"|effort| ≤ {limit:.5g} {unit}"
                     + ("" if mo is None else f", gear ratio {mo['gear_ratio']:g}, rotor inertia "
                                              f"{mo['rotor_inertia']:g} kg·m²")
                     + ("" if fr is None else f", friction {fr['viscous']:g}·q̇ + {fr['coulomb']:g}·(2/π)·atan(q̇ / "
                                              f"{fr['coulomb_velocity']:g})")
                     + ("" if kind is None else f", effort {kind}")
                     + ("" if not delay else f", applies a command {1e3 * delay:g} ms after it is given")
                     + ("" if not lag else f", through a {1e3 * lag:g}-ms first-order lag")
                     + ("" if not ripple else f", ±{ripple:g} {unit} about its command (1σ)") + ")"
                     for c, j, limit, unit, fr, mo, kind, delay, lag, ripple in zip(
                         info["actuated"], info["actuator_joints"], info["effort_limits"], info["effort_units"],
                         info["actuator_friction"], info["actuator_motor"], info["actuator_efforts"],
                         info["actuator_delays"], info["actuator_time_constants"],
                         info["actuator_effort_sigmas"])) or "none"
    rows = [
        ("mechanism", f"{info['name']}  ({info['source']})"),
        ("coordinates n", str(info["n"])),
        ("constraints m", str(info["m"])),
        ("rank of Φq", str(info["rank"]) + ("  (redundant constraints)" if info["rank"] < info["m"] else "")),
        ("degrees of freedom", str(info["dof"])),
        ("q order", " ".join(info["coordinates"])),
        ("actuated", acts),
        ("sensors", sensors),
        ("total mass", f"{info['mass']:g} kg"),
        ("scale", f"effort τ_c = {info['scale']['effort']:.4g} {_scale_unit(info['effort_units'])}, "
                  f"time T = {info['scale']['time']:.4g} s (the noise densities' defaults follow them)"),
        ("gravity", f"({info['gravity'][0]:g}, {info['gravity'][1]:g}) m/s²"),
        ("assembly modes", modes),
        ("YAML pose", ("satisfies the constraints" if info["pose_consistent"] else "does NOT satisfy the constraints")
         + f"  (max |Φ| = {info['constraint_residual']:.3g})"),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    return 0


def _run_estimator(args, mech, config, t, efforts, observations, label: str, title: str,
                   tracking: Optional["TrackingSummary"] = None) -> int:
    """Step the fixed-lag estimator over the times t (efforts: (N, n_actuated) or None; observations:
    k -> readings or None), write the state CSV and the optional plot; `tracking` sees every estimate."""
    from mbfg_ros.estimation.estimator import FixedLagEstimator
    try:
        config = config.validated()
    except ValueError as exc:
        raise UserError(str(exc)) from None
    est = FixedLagEstimator(mech, config)
    _note_confounded(est)
    N = len(t)
    q, v, a = (np.empty((N, mech.n)) for _ in range(3))
    tau = np.empty((N, len(mech.actuated)))
    disturbance = np.full_like(tau, np.nan) if config.mode == "fused" and tau.shape[1] else None
    std = np.full((N, 3 * mech.n + 2 * tau.shape[1]), np.nan) if config.compute_covariance else None
    parameters = np.full((N, len(est.parameter_names)), np.nan)
    parameters_std = np.full_like(parameters, np.nan) if config.compute_covariance else None
    bar = Progress(N, label)
    cpu_start = time.process_time()
    row_of = {float(t[k]): k for k in range(N)} if config.smoothed_lag else None

    def smoothed(estimates):
        # (each row's smoothed estimate replaces its causal one; a row without one keeps the causal)
        for s in estimates:
            row = row_of.get(float(s.t))
            if row is not None:
                fill(row, s)

    def fill(k, e):
        q[k], v[k], a[k] = e.q, e.v, e.a
        tau[k] = e.efforts if len(e.efforts) == tau.shape[1] else np.nan
        if disturbance is not None and e.disturbance is not None:
            disturbance[k] = e.disturbance
        if e.parameters is not None:
            parameters[k] = e.parameters
            if parameters_std is not None:
                parameters_std[k] = est.parameters()["std"]
        if std is not None and e.std is not None:
            std[k, :3 * mech.n + tau.shape[1]] = np.concatenate((e.std, e.efforts_std))
            if e.disturbance_std is not None:
                std[k, 3 * mech.n + tau.shape[1]:] = e.disturbance_std

    for k in range(N):
        e = est.step(float(t[k]), efforts=None if efforts is None else efforts[k],
                     observations=None if observations is None else observations(k))
        if tracking is not None:
            tracking.add(k, e, est.density_fit_limits())
        fill(k, e)
        if row_of is not None:
            smoothed(est.smoothed_estimates())
        bar.update(k + 1)
    if row_of is not None:
        smoothed(est.flush_smoothed())
    bar.close()
    if tracking is not None:
        tracking.cpu_seconds = time.process_time() - cpu_start
        tracking.sensor_sigmas = est.fitted_sensor_sigmas()
        tracking.densities = est.fitted_densities()
    extra = {}
    if disturbance is not None:
        extra.update({f"disturbance_{name}": disturbance[:, j] for j, name in enumerate(mech.actuator_names)})
    if std is not None:
        names = list(mech.coordinate_names)
        cols = ([f"{c}_std" for c in names] + [f"{c}_dot_std" for c in names] + [f"{c}_ddot_std" for c in names]
                + [f"tau_{j}_std" for j in mech.actuator_names])
        if disturbance is not None:
            cols += [f"disturbance_{j}_std" for j in mech.actuator_names]
        extra.update({c: std[:, i] for i, c in enumerate(cols)})
    for j, name in enumerate(est.parameter_names):
        extra[name] = parameters[:, j]
        if parameters_std is not None:
            extra[f"{name}_std"] = parameters_std[:, j]
    if est.parameter_names:
        p = est.parameters()
        print("identified: " + ", ".join(f"{n} = {v:.6g} ± {s:.3g} (prior σ {s0:.3g})" for n, v, s, s0 in
                                         zip(p["names"], p["values"], p["std"], p["prior_std"])), file=sys.stderr)
    _write_state_csv(args.output, mech, t, q, v, a, tau, extra)
    if args.plot:
        _plot(args.plot, mech, t, q, v, tau, title)
    return 0


def cmd_simulate(args) -> int:
    from mbfg_ros.estimation.config import EstimatorConfig
    mech = _load(args.mechanism, args.gravity)
    steps = int(round(args.duration / args.dt))
    if steps < 1:
        raise UserError(f"--duration {args.duration:g} is shorter than one step of --dt {args.dt:g}")
    t = np.arange(steps + 1) * args.dt
    efforts = (_efforts_from_csv(mech, args.torques, t) if args.torques
               else np.zeros((steps + 1, len(mech.actuated))))
    config = EstimatorConfig(dt=args.dt, window=args.window, mode="forward_dynamics",
                             formulation=args.coords, integrator=args.integrator)
    return _run_estimator(args, mech, config, t, efforts, None, "simulate", f"{mech.name}: forward dynamics")


def trajectory_from_csv(mech, path):
    """(t, dt, values (N, n_actuated)) of a trajectory CSV: `t` and one column per actuated coordinate."""
    table = csvio.read_table(path)
    act = [mech.coordinate_names[i] for i in mech.actuated]
    if not act:
        raise UserError(f"{mech.spec.source}: the mechanism has no actuators, so there is nothing to solve for")
    missing = [c for c in act if not table.has(c)]
    known = set(csvio.state_header(mech.coordinate_names, mech.actuator_names))
    unknown = [c for c in table.columns if c not in known]
    if unknown:
        raise CsvError(f"{path}: unknown column(s) {excerpts(unknown)} "
                       f"(expected the actuated coordinates: {', '.join(act)})")
    if missing:
        raise CsvError(f"{path}: missing column(s) for the actuated coordinate(s) {', '.join(missing)}")
    if len(table.t) < 3:
        raise CsvError(f"{path}: need at least 3 rows")
    dt = csvio.require_uniform_time(table)
    missing = csvio.missing_cell(table, act)
    if missing:
        raise CsvError(f"{path}: {missing}: missing value (the inverse dynamics needs every sample of the "
                       f"trajectory)")
    limits = InputLimits(mech)
    for c in act:                           # the limits of an encoder on the coordinate
        index = mech.coordinate_index(c)
        csvio.check_cells(table, c, lambda value, index=index: limits.coordinate_problem(index, value))
    return table.t, dt, np.column_stack([table.column(c) for c in act])


def cmd_inverse_dynamics(args) -> int:
    from mbfg_ros.batch.inverse_dynamics import staged_inverse_dynamics
    from mbfg_ros.batch.trajectories import closed_form_efforts
    mech = _load(args.mechanism, args.gravity)
    t, dt, traj = trajectory_from_csv(mech, args.trajectory)
    bar = Progress(4, "inverse dynamics")
    res = staged_inverse_dynamics(mech, traj, dt, t0=float(t[0]), progress=bar.update)
    bar.close()
    _write_state_csv(args.output, mech, res.t, res.q, res.v, res.a, res.tau)
    if args.plot:
        ref = closed_form_efforts(mech, res.q, res.v, res.a)
        _plot(args.plot, mech, res.t, res.q, res.v, res.tau, f"{mech.name}: staged inverse dynamics", ref)
    if args.verbose:
        for s in res.stages:
            print(f"stage {s.stage}: {s.iterations} LM iterations, error {s.initial_error:.3g} -> "
                  f"{s.final_error:.3g}, {s.seconds:.3f} s", file=sys.stderr)
    return 0


#: the estimate command's density options (the noise parameters of the estimation and fused modes)
DENSITY_OPTIONS = ("acceleration_density", "effort_density", "disturbance_density", "disturbance_time_constant")


def _params_from_file(args, mech) -> dict:
    """The estimator settings of --params FILE (empty without it), the mode, window and integrator checked."""
    if not args.params:
        return {}
    from mbfg_ros.tuning.params_file import ParamsFileError, read_params
    try:
        values = read_params(args.params, mech)
    except ParamsFileError as exc:
        raise UserError(str(exc)) from None
    where = f"{args.params}: mbfg_estimator.ros__parameters"
    estimate_modes = tuple(m for m in MODES if m != "forward_dynamics")
    if "mode" in values and values["mode"] not in estimate_modes:
        raise UserError(f"{where}.mode must be one of {', '.join(estimate_modes)} for mbfg estimate "
                        f"(got {excerpt(repr(values['mode']))})")
    if "integrator" in values and values["integrator"] not in INTEGRATORS:
        raise UserError(f"{where}.integrator must be one of {', '.join(INTEGRATORS)} (got {excerpt(repr(values['integrator']))})")
    if "window" in values and (isinstance(values["window"], bool) or not isinstance(values["window"], int)
                               or values["window"] < 1):
        raise UserError(f"{where}.window must be an integer ≥ 1 (got {excerpt(repr(values['window']))})")
    return values


def cmd_estimate(args) -> int:
    from mbfg_ros.estimation.config import EstimatorConfig
    mech = _load(args.mechanism, args.gravity)
    from_file = _params_from_file(args, mech)
    # an option given on the command line wins over the file, the file over the defaults
    mode = args.mode or from_file.get("mode", "estimation")
    window = args.window or from_file.get("window", 10)
    integrator = args.integrator or from_file.get("integrator", "trapezoidal")
    sensor_sigmas = dict(from_file.get("sensor_sigmas", {}))
    sensor_sigmas.update(_sensor_sigma_options(args.sensor_sigma, [s.name for s in mech.sensors], "a sensor"))
    table = _observations_table(args, mech)
    names = [s.name for s in mech.sensors]
    cols = csvio.sensor_columns(table, InputLimits(mech))
    if not cols and mode == "estimation":
        raise CsvError(f"{args.observations}: no sensor columns (sensors: {', '.join(names) or 'none'})")
    t = table.t
    if len(t) < 2:
        raise CsvError(f"{args.observations}: need at least 2 rows")
    # the rows' own times are the steps' times (a longer interval is bridged by sub-steps of about dt)
    dt = args.dt if args.dt is not None else csvio.median_step(table)
    efforts = None
    if args.torques:
        efforts = _commands_from_csv(args, mech, t)
    elif mode == "fused" and len(mech.actuated):
        raise UserError("--mode fused needs --torques (the commanded efforts)")
    sigmas = dict(from_file.get("sigmas", {}))     # (the rest: the defaults scaled to the mechanism)
    for name in DENSITY_OPTIONS:        # the options given explicitly win over the file
        value = getattr(args, name)
        if value is not None:
            sigmas[name] = value
    adapt = args.adapt_densities
    if adapt is None:
        adapt = from_file.get("adapt_densities", EstimatorConfig.adapt_densities)
    adapt_sigmas = args.adapt_sensor_sigmas
    if adapt_sigmas is None:
        adapt_sigmas = from_file.get("adapt_sensor_sigmas", EstimatorConfig.adapt_sensor_sigmas)
    adapt_deflection = args.adapt_deflection
    if adapt_deflection is None:
        adapt_deflection = from_file.get("adapt_deflection", EstimatorConfig.adapt_deflection)
    effort_bandwidth = args.effort_bandwidth
    if effort_bandwidth is None:
        effort_bandwidth = from_file.get("effort_bandwidth", EstimatorConfig.effort_bandwidth)
    elif not 0 <= effort_bandwidth < math.inf:
        raise UserError(f"--effort-bandwidth {effort_bandwidth:g}: must be a finite number of Hz ≥ 0 (0: the "
                        "densities' likelihood alone)")
    kinds = _actuator_effort_options(args.actuator_effort, mech)
    if "commanded" in kinds.values() and not args.torques:
        raise UserError(f"--actuator-effort {', '.join(n for n, k in kinds.items() if k == 'commanded')}=commanded "
                        "needs --torques (the commanded efforts)")
    smoothed_lag = args.smoothed_lag if args.smoothed_lag is not None else from_file.get("smoothed_lag", 0)
    if not 0 <= smoothed_lag < window:
        what = "--smoothed-lag" if args.smoothed_lag is not None else f"{args.params}: smoothed_lag"
        raise UserError(f"{what} {smoothed_lag}: must be from 0 to the window's steps − 1 = {window - 1} "
                        f"(the window holds the steps it smooths; a longer lag needs a longer --window)")
    prescribed = _prescribed_motion(args, mech, mode, kinds, t, sensor_sigmas)
    identify = None
    if args.identify is not None:
        identify = tuple(e for item in args.identify for e in item.split(",") if e.strip())
        if identify == ("none",):
            identify = ()
        from mbfg_ros.model.identified import parse_identify
        try:
            parse_identify(identify, mech)
        except ValueError as exc:
            raise UserError(f"--identify: {exc}") from None
    config = EstimatorConfig(dt=dt, window=window, mode=mode, integrator=integrator, sigmas=sigmas,
                             sensor_sigmas=sensor_sigmas, compute_covariance=args.std,
                             smoothed_lag=smoothed_lag, effort_shares=dict(from_file.get("effort_shares", {})),
                             actuator_delays={**from_file.get("actuator_delays", {}),
                                              **_actuator_delay_options(args.actuator_delay, mech)},
                             actuator_time_constants={
                                 **from_file.get("actuator_time_constants", {}),
                                 **_actuator_delay_options(args.actuator_time_constant, mech,
                                                           "--actuator-time-constant")},
                             actuator_effort_sigmas={**from_file.get("actuator_effort_sigmas", {}),
                                                     **_effort_sigma_options(args.effort_sigma, mech)},
                             adapt_densities=bool(adapt), adapt_sensor_sigmas=bool(adapt_sigmas),
                             adapt_deflection=bool(adapt_deflection), effort_bandwidth=float(effort_bandwidth),
                             actuator_efforts=kinds, identify=identify)
    try:
        from mbfg_ros.estimation.estimator import FixedLagEstimator
        FixedLagEstimator(mech, config)
    except ValueError as exc:
        # (the shares come only from a parameter file: name it)
        where = f"{args.params}: " if str(exc).startswith("effort_shares") else ""
        raise UserError(where + str(exc)) from None

    def readings(k):
        out = {name: float(col[k]) for name, col in cols.items() if math.isfinite(col[k])}
        for name, col in prescribed.items():
            if math.isfinite(col[k]):
                out[name] = float(col[k])
        return out

    tracking = TrackingSummary()
    _run_estimator(args, mech, config, t, efforts, readings, "estimate", f"{mech.name}: {mode}", tracking)
    print(tracking.line(), file=sys.stderr)
    warning = tracking.warning()
    if warning:
        print(warning, file=sys.stderr)
    return 0


def cmd_identify(args) -> int:
    """Offline identification: the estimator over the whole recording with the parameters held constant, its final
    estimate and 1σ written into the mechanism's `identify:` section (the priors the node starts from); with
    --measured, first each named actuator's latency from its commanded to its measured effort, written as its
    `delay` (and used by the identification), and the measured effort's precision about that response as its
    `effort_sigma`."""
    from pathlib import Path

    import yaml
    from mbfg_ros.model.identified import parse_identify
    from mbfg_ros.model.mechanism import Mechanism, resolve_mechanism_path
    mech = _load(args.mechanism)
    entries = None
    if args.identify:
        entries = tuple(e for item in args.identify for e in item.split(",") if e.strip())
        try:
            parse_identify(entries, mech)
        except ValueError as exc:
            raise UserError(f"--identify: {exc}") from None
    elif not mech.spec.identify and not args.measured_columns:
        raise UserError(f"nothing to identify: mechanism '{mech.name}' has no identify: section; give --identify "
                        "JOINT.PARAMETER (PARAMETER: gain, viscous_friction, coulomb_friction), or --measured "
                        "JOINT=COLUMN for an actuator's latency")
    table = _observations_table(args, mech)
    cols = csvio.sensor_columns(table, InputLimits(mech))
    if not cols:
        raise CsvError(f"{args.observations}: no sensor columns (sensors: "
                       f"{', '.join(s.name for s in mech.sensors) or 'none'})")
    t = table.t
    if len(t) < 2:
        raise CsvError(f"{args.observations}: need at least 2 rows")
    efforts = _commands_from_csv(args, mech, t) if args.torques else None
    if args.mode == "fused" and efforts is None and len(mech.actuated):
        raise UserError("--mode fused needs --torques (the commanded efforts)")
    measured = _measured_efforts(args, mech, t, efforts)
    responses = _latencies(mech, t, efforts, measured)
    source = resolve_mechanism_path(args.mechanism)
    doc = yaml.safe_load(Path(source).read_text())
    for joint, (delay, time_constant) in responses.items():
        entry = doc["actuators"][mech.actuator_names.index(joint)]
        entry["delay"] = delay
        if time_constant > 0.0 or "time_constant" in entry:
            entry["time_constant"] = time_constant
    delays = list(responses)
    if responses:       # (the identification applies the commands as the actuators timed now do)
        mech = Mechanism(dataclasses.replace(mech.spec, actuators=tuple(
            dataclasses.replace(a, delay=responses[a.joint][0], time_constant=responses[a.joint][1])
            if a.joint in responses else a for a in mech.spec.actuators)))
    ripples = _effort_sigmas(mech, t, efforts, measured)
    for joint, sigma in ripples.items():
        doc["actuators"][mech.actuator_names.index(joint)]["effort_sigma"] = sigma
    identifying = entries is not None or bool(mech.spec.identify)
    if identifying:
        doc["identify"] = _identified(args, mech, entries, table, cols, efforts)
    what = ", ".join(filter(None, ["its identify: section set to the parameters identified offline (value, 1σ): "
                                   "the priors the estimator starts from" if identifying else "",
                                   f"the latency of {', '.join(delays)} (delay, time_constant)" if delays else "",
                                   f"the precision of {', '.join(ripples)} about its command (effort_sigma)"
                                   if ripples else ""]))
    header = (f"# Written by: mbfg identify {' '.join(sys.argv[2:]) if sys.argv[1:2] == ['identify'] else ''}\n"
              f"# {source} with {what or 'nothing changed'}, from {args.observations}.  (YAML comments of the source "
              "are not kept.)\n")
    Path(args.output).write_text(header + yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


def _measured_efforts(args, mech, t: np.ndarray, commands: Optional[np.ndarray]) -> Tuple[Dict[str, str], np.ndarray]:
    """--measured JOINT=COLUMN: {joint: column} and those columns of the --torques file at the times t (read once for
    `_latencies` and `_effort_sigmas`); ({}, None) without --measured; UserError without the commands."""
    if not args.measured_columns:
        return {}, None
    if commands is None:
        raise UserError("--measured JOINT=COLUMN names measured efforts of the --torques file, beside the "
                        "commands: give --torques")
    columns = _column_options(args.measured_columns, "--measured", mech.actuator_names, "an actuator")
    table = csvio.read_table(args.torques, args.time_column).select(columns, "measured effort")
    return columns, csvio.interpolate(table, list(columns), t)


def _latencies(mech, t: np.ndarray, commands: Optional[np.ndarray], measured) -> Dict[str, Tuple[float, float]]:
    """Each actuator of `measured` (`_measured_efforts`)'s latency and lag (`command_response` of its command
    against its measured effort), printed; {joint: (delay, time constant)} of those it times."""
    from mbfg_ros.estimation.actuator_delay import (LAG_LONGEST, LATENCY_LONGEST, LATENCY_TIMED, command_response,
                                                    latency_timed)
    columns, measured = measured
    out = {}
    for k, joint in enumerate(columns):
        j = mech.actuator_names.index(joint)
        (delay,), (time_constant,), (ratio,) = command_response(t, commands[:, [j]], measured[:, [k]])
        if not math.isfinite(delay):
            print(f"{joint}: no row with both its command and its measured effort", file=sys.stderr)
        elif latency_timed(delay, time_constant, ratio):
            out[joint] = (delay, time_constant)
            print(f"{joint}.delay = {delay:.6g} s, {joint}.time_constant = {time_constant:.6g} s (its measured "
                  f"effort follows the command so: RMS {ratio:.2f}× the undelayed command's)")
        else:
            why = (f"at least {LATENCY_TIMED:g}× needed: its commands move too slowly to time it"
                   if ratio >= LATENCY_TIMED else
                   f"at the longest the grids try ({1e3 * LATENCY_LONGEST:g} ms, {1e3 * LAG_LONGEST:g} ms): a slow "
                   f"mismatch, or a response longer than the grids'")
            print(f"{joint}: latency not timed (the command {1e3 * delay:g} ms later through a {1e3 * time_constant:g}"
                  f"-ms lag comes {ratio:.2f}× as close to the measured effort as the undelayed command, {why}): "
                  f"delay and time_constant left as they are", file=sys.stderr)
    return out


def _effort_sigmas(mech, t: np.ndarray, commands: Optional[np.ndarray], measured) -> Dict[str, float]:
    """Each actuator of `measured` (`_measured_efforts`)'s `effort_sigma` (`response_sigma` of its measured effort
    about its command as the actuator, timed or as declared, applies it), printed; {joint: σ}."""
    from mbfg_ros.estimation.actuator_delay import RESPONSE_SMOOTHING, delayed_commands, response_sigma
    columns, measured = measured
    if not columns:
        return {}
    applied = delayed_commands(t, commands, mech.actuator_delays, mech.actuator_time_constants)
    out = {}
    for k, joint in enumerate(columns):
        j = mech.actuator_names.index(joint)
        (sigma,) = response_sigma(t, applied[:, [j]], measured[:, [k]])
        if math.isfinite(sigma):
            out[joint] = float(f"{sigma:.4g}")
            print(f"{joint}.effort_sigma = {out[joint]:g} (its measured effort about the command's response, less "
                  f"the departure's {RESPONSE_SMOOTHING:g}-s running mean: what no reading resolves)")
    return out


def _identified(args, mech, entries, table, cols, efforts) -> list:
    """The identify: section: the estimator over the recording with the parameters held constant, their final
    values and 1σ, printed."""
    from mbfg_ros.estimation.config import EstimatorConfig
    from mbfg_ros.estimation.estimator import FixedLagEstimator
    t = table.t
    sensor_sigmas = _sensor_sigma_options(args.sensor_sigma, [s.name for s in mech.sensors], "a sensor")
    config = EstimatorConfig(dt=csvio.median_step(table), window=args.window, mode=args.mode,
                             sensor_sigmas=sensor_sigmas, identify=entries)
    try:
        est = FixedLagEstimator(mech, config.validated())
    except ValueError as exc:
        raise UserError(str(exc)) from None
    _note_confounded(est)
    est.identification.hold_constant()
    bar = Progress(len(t), "identify")
    tracking = TrackingSummary()
    for k in range(len(t)):
        e = est.step(float(t[k]), efforts=None if efforts is None else efforts[k],
                     observations={name: float(col[k]) for name, col in cols.items() if math.isfinite(col[k])})
        tracking.add(k, e, est.density_fit_limits())
        bar.update(k + 1)
    bar.close()
    warning = tracking.warning("identify")
    if warning:
        # (parameters learnt where the noise model is at its limit explain what the model cannot: said)
        print(warning, file=sys.stderr)
    p = est.parameters()
    for name, value, std, prior in zip(p["names"], p["values"], p["std"], p["prior_std"]):
        print(f"{name} = {value:.6g} ± {std:.3g} (prior σ {prior:.3g})")
    P = est.identification.parameters
    out = []
    for spec, v, s, density in zip(P.specs, p["values"], p["std"], P.density.tolist()):
        where = ({"joint": spec.joint} if spec.body is None else
                 {"body": mech.spec.bodies[spec.body].name or spec.body, "at": [float(x) for x in spec.at]})
        out.append({**where, "parameter": spec.parameter, "value": float(v), "sigma": float(s), "density": density})
    return out


def _tuning_recording(args, mech):
    """The recording of `mbfg tune` from CSV files or a bag."""
    from mbfg_ros.tuning.bag import recording_from_bag
    from mbfg_ros.tuning.likelihood import Recording, encoder_layout
    fused = args.mode == "fused"
    if args.bag:
        if args.torques:
            raise UserError("--torques goes with --observations; with --bag use --torques-topic")
        given = [opt for opt, value in (("--time-column", args.time_column), ("--reading", args.reading_columns),
                                        ("--command", args.command_columns)) if value]
        if given:
            raise UserError(f"{', '.join(given)} name CSV columns: they go with --observations, not --bag")
        return recording_from_bag(mech, args.bag, args.observations_topic, args.torques_topic if fused else None)
    names, coords, _ = encoder_layout(mech)
    table = _observations_table(args, mech)
    cols = csvio.sensor_columns(table, InputLimits(mech))
    missing = [n for n in names if n not in cols]
    if missing:
        raise CsvError(f"{args.observations}: no column for encoder(s) {', '.join(missing)}")
    if len(table.t) < 10:
        raise CsvError(f"{args.observations}: need at least 10 rows to fit")
    y = np.column_stack([cols[n] for n in names])      # NaN: a missing reading (the fit uses the others)
    commands = None
    if fused:
        if not args.torques:
            raise UserError("--mode fused needs --torques (the commanded efforts)")
        commands = _commands_from_csv(args, mech, table.t)
    return Recording(table.t, y, names, coords, commands, str(args.observations))


def _sensor_sigma_options(items, names: Sequence[str], what: str) -> dict:
    """--sensor-sigma NAME=SIGMA (repeatable) as {sensor name: σ}; NAME must be one of `names` (`what`
    says which kind of sensor, for the error)."""
    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        name = name.strip()
        try:
            sigma = float(value) if eq else math.nan
        except ValueError:
            sigma = math.nan
        if not (sigma > 0 and math.isfinite(sigma)):
            raise UserError(f"--sensor-sigma takes NAME=SIGMA with SIGMA > 0 (got '{item}')")
        if name not in names:
            raise UserError(f"--sensor-sigma {item}: '{name}' is not {what} of the mechanism "
                            f"({', '.join(names) or 'none'})")
        out[name] = sigma
    return out


def _note_confounded(est):
    """Tell the user (stderr) where friction is identified of an actuator whose effort is estimated."""
    note = est.identification.confounded_note() if est.identification is not None else ""
    if note:
        print(f"{PROG}: note: {note}", file=sys.stderr)


def _column_options(items, option: str, names: Sequence[str], what: str) -> Dict[str, str]:
    """`option` NAME=COLUMN (repeatable or comma-separated) as {name: column}; NAME must be one of `names` (`what`
    says which kind, for the error), each once."""
    out: Dict[str, str] = {}
    for item in (e for entry in items for e in entry.split(",") if e.strip()):
        name, eq, column = (x.strip() for x in item.partition("="))
        if not (eq and name and column):
            raise UserError(f"{option} takes NAME=COLUMN: {what} NAME read from the CSV column COLUMN (got "
                            f"'{excerpt(item)}')")
        if name not in names:
            raise UserError(f"{option} {excerpt(item)}: '{excerpt(name)}' is not {what} of the mechanism "
                            f"({', '.join(names) or 'none'})")
        if name in out:
            raise UserError(f"{option}: {what} '{name}' is given twice ('{out[name]}' and '{excerpt(column)}')")
        out[name] = column
    return out


def _observations_table(args, mech) -> "csvio.Table":
    """The --observations file, its time column --time-column's; with --reading SENSOR=COLUMN only those columns,
    each as its sensor (and --command only with a --torques file to name columns of)."""
    if args.command_columns and not args.torques:
        raise UserError("--command JOINT=COLUMN names columns of the --torques file: give --torques")
    table = csvio.read_table(args.observations, args.time_column)
    if len(table.t) >= 2:
        from mbfg_ros.model.plausibility import mechanism_scale
        step, scale = csvio.median_step(table), mechanism_scale(mech.spec)[1]
        if step > scale:       # (a step longer than the motion's own time scale follows nothing: a unit)
            raise CsvError(f"{args.observations}: its rows are {step:.6g} s apart (the median), longer than the "
                           f"mechanism's time scale √(reach/g) = {scale:.3g} s: is the time column in seconds? "
                           "(nanoseconds: divide by 1e9; milliseconds: by 1e3)")
    readings = _column_options(args.reading_columns, "--reading", [s.name for s in mech.sensors], "a sensor")
    return table.select(readings, "sensor") if readings else table


def _commands_from_csv(args, mech, t: np.ndarray) -> np.ndarray:
    """The --torques file's commands at the rows' times `t` (`_efforts_from_csv`, with --time-column and
    --command)."""
    return _efforts_from_csv(mech, args.torques, t, args.time_column,
                             _column_options(args.command_columns, "--command", mech.actuator_names, "an actuator"))


def _prescribed_motion(args, mech, mode, kinds, t, sensor_sigmas) -> Dict[str, np.ndarray]:
    """The set-points of the `prescribed` actuators (--prescribed PRESC.csv: t and one column per such actuator's
    joint, interpolated to the rows' times) as generic readings {'q:<coordinate>': values}; their σ
    (--prescribed-sigma) into `sensor_sigmas`.  UserError/CsvError naming what is missing or extra."""
    from mbfg_ros.estimation.efforts import effort_kinds
    joints = [j for j, kind in zip(mech.actuator_names, effort_kinds(mode, mech, kinds)) if kind == "prescribed"]
    if not joints:
        if args.prescribed:
            raise UserError("--prescribed: no actuator's effort is 'prescribed' (declare it in the mechanism's "
                            "actuators, effort: prescribed, or give --actuator-effort NAME=prescribed)")
        return {}
    if not args.prescribed:
        raise UserError(f"actuator(s) {', '.join(joints)} are 'prescribed': give their set-points with --prescribed "
                        "PRESC.csv (t and a column per joint)")
    table = csvio.read_table(args.prescribed)
    extra = [c for c in table.columns if c not in joints]
    if extra:
        raise CsvError(f"{args.prescribed}: unknown column(s) {excerpts(extra)} (the prescribed actuators: "
                       f"{', '.join(joints)})")
    missing = [j for j in joints if not table.has(j)]
    if missing:
        raise CsvError(f"{args.prescribed}: no column for the prescribed actuator(s) {', '.join(missing)}")
    values = csvio.interpolate(table, joints, t)
    out = {}
    for i, joint in enumerate(joints):
        name = "q:" + mech.spec.actuators[mech.actuator_names.index(joint)].coordinate
        out[name] = values[:, i]
        if args.prescribed_sigma is not None:
            sensor_sigmas[name] = args.prescribed_sigma
    return out


def _actuator_delay_options(items, mech, option: str = "--actuator-delay") -> Dict[str, float]:
    """--actuator-delay (or --actuator-time-constant) NAME=SECONDS (repeatable or comma-separated) as {actuator
    joint: s}; UserError naming what is wrong."""
    from mbfg_ros.model.spec import MAX_ACTUATOR_DELAY, is_actuator_delay
    return _actuator_number_options(items, mech, option, is_actuator_delay,
                                    f"NAME=SECONDS, 0 <= SECONDS < {MAX_ACTUATOR_DELAY:g} (5 ms is 0.005; ")


def _effort_sigma_options(items, mech) -> Dict[str, float]:
    """--effort-sigma NAME=SIGMA (repeatable or comma-separated) as {actuator joint: σ}; UserError naming what is
    wrong."""
    from mbfg_ros.model.spec import is_effort_sigma
    return _actuator_number_options(items, mech, "--effort-sigma", is_effort_sigma,
                                    "NAME=SIGMA, SIGMA a finite effort >= 0 in N·m (or N) (")


def _actuator_number_options(items, mech, option: str, valid, takes: str) -> Dict[str, float]:
    """NAME=NUMBER entries of `option` (repeatable or comma-separated) as {actuator joint: number}, each `valid`;
    UserError "`option` takes `takes`got '<entry>')" or naming an unknown actuator."""
    out: Dict[str, float] = {}
    for item in (e for entry in items for e in entry.split(",") if e.strip()):
        name, eq, value = (x.strip() for x in item.partition("="))
        try:
            number = float(value) if eq else math.nan
        except ValueError:
            number = math.nan
        if not valid(number):
            raise UserError(f"{option} takes {takes}got '{excerpt(item)}')")
        if name not in mech.actuator_names:
            raise UserError(f"{option} {excerpt(item)}: '{excerpt(name)}' is not an actuator of the mechanism "
                            f"({', '.join(mech.actuator_names) or 'none'})")
        out[name] = number
    return out


def _actuator_effort_options(items, mech) -> Dict[str, str]:
    """--actuator-effort NAME=KIND (repeatable) as {actuator joint name: kind}; UserError naming what is wrong."""
    from mbfg_ros.estimation.efforts import parse_actuator_efforts
    try:
        return parse_actuator_efforts(items, mech)
    except ValueError as e:
        raise UserError(f"--actuator-effort: {e}") from None

def cmd_tune(args) -> int:
    from mbfg_ros.tuning import likelihood as tl
    from mbfg_ros.tuning.params_file import format_params
    mech = _load(args.mechanism)
    try:
        rec = _tuning_recording(args, mech)
        given = {n: getattr(args, n) for n in DENSITY_OPTIONS if getattr(args, n) is not None}
        encoders = tl.encoder_layout(mech)[0]
        initial = tl.initial_values(mech, given, _sensor_sigma_options(args.sensor_sigma, encoders, "an encoder"))
        fit_deflection = args.fit_deflection
        if fit_deflection is None:        # as the estimator's online fit: estimation mode, geared encoders
            from mbfg_ros.estimation.deflection import geared_encoders
            fit_deflection = args.mode == "estimation" and bool(geared_encoders(mech))
        if fit_deflection and not initial["deflection_sigma"] > 0:
            from mbfg_ros.estimation.density_adaptation import DEFLECTION_REFERENCE
            initial["deflection_sigma"] = DEFLECTION_REFERENCE
        names = tl.parameter_names(mech, args.mode, args.fit_sensor_sigmas, args.fit_acceleration_density,
                                   fit_deflection)
        bar = Progress(tl.evaluations_budget(len(names)), "tune")
        result = tl.fit(mech, rec, args.mode, initial, names, max_steps=args.max_steps, progress=bar.update,
                        threads=args.threads)
        bar.close()
    except tl.TuningError as exc:
        raise UserError(str(exc)) from None
    # fused: the disturbance's time constant, fitted with its density
    kept = tl.file_values(result, initial["acceleration_density"])
    header = [f"Written by: mbfg tune {mech.name} --mode {args.mode}",
              f"Fitted from {rec.source}: {len(rec.t)} samples at dt {rec.dt:g} s"
              + (f", decimated by {result.decimation} to {result.steps} steps at {result.dt:g} s"
                 if result.decimation > 1 else ""),
              "by maximum innovation likelihood of an EKF on the exact reduced model (mbfg_ros.tuning.likelihood),",
              f"log-likelihood {result.log_likelihood:.6g} after {result.evaluations} evaluations; fitted (1σ):"]
    header += [f"  {f.name} = {f.describe()}" for f in result.fitted]
    held = [k for k in list(kept) + [f"sensor_sigmas.{n}" for n in result.sensor_sigmas] if k not in names]
    if held:
        header.append(f"held at their given/default values: {', '.join(held)}")
    given = {n: initial[f"sensor_sigmas.{n}"] for n in result.sensor_sigmas}
    sensor_sigmas = tl.file_sensor_sigmas(result, given)
    kept_given = [n for n in sensor_sigmas if sensor_sigmas[n] != result.sensor_sigmas[n]]
    if kept_given:
        header.append(f"written at their given value, the fit below it undetermined: "
                      f"{', '.join(f'sensor_sigmas.{n}' for n in kept_given)}")
    # fitted densities are used as fitted (the estimator's online fit would start from them and move)
    text = format_params(args.mode, kept, sensor_sigmas, header, adapt_densities=False)
    try:
        with open(args.output, "w") as f:
            f.write(text)
    except OSError as exc:
        raise UserError(f"{args.output}: cannot write ({exc.strerror})") from None
    print(f"{mech.name}, {args.mode} mode, {rec.source}: {len(rec.t)} samples"
          + (f" (decimated to {result.steps} at dt {result.dt:g} s)" if result.decimation > 1 else ""))
    width = max(len(f.name) for f in result.fitted)
    for f in result.fitted:
        print(f"  {f.name:<{width}}  {f.describe()}")
    print("  (1σ from the curvature of the log-likelihood)")
    threads = f" ({result.threads} threads)" if result.threads > 1 else ""
    print(f"  log-likelihood {result.log_likelihood:.6g}, {result.evaluations} evaluations{threads} -> {args.output}")
    crossing = _fitted_crossover(mech, rec, args.mode, kept, names)
    # (as the online fit: accelerations up to the configured density are the model's stated inexactness)
    if crossing is not None and crossing < EstimatorConfig.effort_bandwidth \
            and kept["acceleration_density"] > initial["acceleration_density"]:
        print(f"{PROG}: note: the fitted densities hand the unexplained motion above {crossing:.2g} Hz (the median "
              f"over the recording's poses) to unmodelled accelerations, not to the estimated efforts; the "
              f"estimator's online fit keeps that crossing at or above effort_bandwidth "
              f"({EstimatorConfig.effort_bandwidth:g} Hz), which this file (adapt_densities: false) leaves off: to "
              f"have both, set adapt_densities: true in it (its values are then the online fit's start)",
              file=sys.stderr)
    return 0


def _fitted_crossover(mech, rec, mode: str, values: Dict[str, float], names) -> Optional[float]:
    """[Hz] where the fitted effort density and the fitted acceleration density move the encoded coordinates alike
    (`density_adaptation.crossover_frequency`; B and Sₐ at each of up to 200 of the recording's poses, solved from its
    complete readings, the median), in estimation mode where the acceleration density was fitted; else None."""
    if mode != "estimation" or "acceleration_density" not in names:
        return None
    from mbfg_ros.estimation import density_adaptation as da
    from mbfg_ros.estimation.reduced_ekf import encoded_acceleration_noise
    from mbfg_ros.tuning.filter_bank import ReducedModelBank
    if not ReducedModelBank.supports(mech):
        return None
    rows = rec.readings[np.all(np.isfinite(rec.readings), axis=1)]
    rows = rows[::max(1, len(rows) // 200)]
    z = list(rec.coordinates)
    guess = np.repeat(np.asarray(mech.q0, dtype=float)[None, :], len(rows), axis=0)
    poses, _, _, solved = ReducedModelBank(mech, z).positions(rows, guess)
    gains = [da.bandwidth_gain(da.effort_directions(mech, q, z, mech.actuated),
                               encoded_acceleration_noise(mech, q, z, 1.0)) for q in poses[solved]]
    if not gains:
        return None
    return da.crossover_frequency(values["effort_density"], values["acceleration_density"], float(np.median(gains)))


# ----------------------------------------------------------------------------------------------
# parser
# ----------------------------------------------------------------------------------------------
# help, description and epilog of each sub-command
_COMMAND_TEXTS = {
    "info": dict(
        help="summary of a mechanism (coordinates, DOF, sensors, ...)",
        description="Print n, m, rank of Φq, degrees of freedom, coordinate names in q order, "
        "actuators, sensors, mass, assembly modes and whether the YAML pose is consistent."),
    "simulate": dict(
        help="forward dynamics with the fixed-lag factor-graph estimator",
        description="Forward dynamics from the YAML pose at rest, driven by optional actuator "
        "efforts, with the fixed-lag factor-graph smoother (FixedLagEstimator).",
        epilog="Output CSV columns: t, each coordinate, <name>_dot, <name>_ddot, tau_<joint> (fused: the estimated "
               "applied effort, command + disturbance), in fused mode disturbance_<joint>, and with --std the 1σ "
               "columns <name>_std, <name>_dot_std, <name>_ddot_std, tau_<joint>_std (disturbance_<joint>_std)."),
    "inverse-dynamics": dict(
        help="staged batch inverse dynamics of a prescribed trajectory",
        description="Efforts that make the actuated coordinates follow a trajectory: the "
        "paper's staged batch Levenberg–Marquardt (q; q̇, q̈; velocity constraints; efforts).",
        epilog="TRAJ.csv: column t (uniform step) and one column per actuated coordinate, by "
        "name.  Output CSV columns: t, each coordinate, <name>_dot, <name>_ddot, tau_<joint>."),
    "estimate": dict(
        help="run the online estimator over recorded sensor readings",
        description="State (and effort) estimation from a CSV of sensor readings with the "
        "fixed-lag factor-graph estimator.",
        epilog="OBS.csv: column t (strictly increasing; jitter and drift are taken as they are) and one column "
        "per sensor name (see 'mbfg info'); an empty or nan cell is a missing reading.  Each row is a step of the "
        "estimator at its own time; an interval longer than 1.5 dt is bridged by sub-steps of about dt.  At the "
        "end a summary goes to stderr: steps, times the estimate lost track (re-initialized from the readings), "
        "other recoveries, steps waiting, re-initializations, CPU per step, the encoders' fitted σ, the fitted "
        "process densities."),
    "identify": dict(
        help="identify actuator parameters (gain, joint friction) offline from a recording",
        description="The estimator over a whole recording with the actuator parameters to identify held constant "
        "(a recursive maximum a posteriori estimate with the same factors as online): their final values and 1σ.  "
        "Writes the mechanism file with its identify: section set to them, the priors the node (and mbfg "
        "estimate) start from."),
    "tune": dict(
        help="fit the noise densities (and encoder sigmas) to a recording: writes a parameter file",
        description="Maximum-likelihood fit of the estimator's process densities -- the effort density "
        "(estimation) or the disturbance density (fused), optionally the acceleration density and the encoders' "
        "σ -- from one recording of the real system, by the innovation likelihood of an EKF on the exact "
        "reduced model that carries the estimator's stochastic model.  Needs one encoder per degree of freedom; "
        "the rows' times may jitter (the filter steps by each actual interval), missing readings are skipped.",
        epilog="Writes PARAMS.yaml in the node's parameter-file format (mbfg_estimator: ros__parameters: mode, "
               "sigmas, sensor_sigmas), read by 'mbfg estimate --params PARAMS.yaml' and by the node "
               "(--ros-args --params-file PARAMS.yaml, with the other parameter file).  Prints each fitted value "
               "with its 1σ from the curvature of the log-likelihood."),
}


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UserError(f"{self.prog}: {message}")


def _default_text(defaults: dict, name: str) -> str:
    """A noise parameter's default in --help: a number, or the crank four-bar's for those scaled to the
    mechanism (`factors.noise`)."""
    if name in SCALED:
        return f"scaled to the mechanism's mass, reach and time scale; {defaults[name]:g} for the crank four-bar"
    return f"{defaults[name]:g}"


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Multibody factor-graph tools: mechanism info, forward dynamics, "
                "staged inverse dynamics and state estimation from CSV files.",
                epilog="MECH is a mechanism YAML file, or the name of one shipped with mbfg_ros "
                "(e.g. four_bar_crank).  Run 'mbfg COMMAND --help' for the options of a command.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def command(name):
        """A sub-command; its first argument is the mechanism."""
        sp = sub.add_parser(name, **_COMMAND_TEXTS[name])
        sp.add_argument("mechanism", metavar="MECH", help="mechanism YAML file or shipped name")
        return sp

    def add_column_options(sp):
        """Which columns of a logger's CSV files hold what (its own names: no renaming by the user)."""
        sp.add_argument("--time-column", metavar="NAME", default=None,
                        help="the time column [s] of the CSV files, anywhere in the header (default: the first, "
                             "named t)")
        sp.add_argument("--reading", action="append", default=[], metavar="SENSOR=COLUMN", dest="reading_columns",
                        help="read sensor SENSOR from column COLUMN of OBS.csv (repeatable or comma-separated); "
                             "given, only these columns are read and the file's others are ignored (default: "
                             "every column but the time is a sensor's, by name)")
        sp.add_argument("--command", action="append", default=[], metavar="JOINT=COLUMN", dest="command_columns",
                        help="read actuator JOINT's command from column COLUMN of the --torques file, one for "
                             "every actuator (repeatable or comma-separated; the same file as OBS.csv may hold "
                             "them); given, the file's other columns are ignored (default: by name, JOINT or "
                             "tau_JOINT)")

    def add_gravity_and_outputs(sp, func, plot_help="also save a plot"):
        """The options every computing sub-command shares, after its own."""
        sp.add_argument("--gravity", nargs="+", type=float, metavar="G",
                        help="override the YAML gravity: GY, or GX GY [m/s²] (e.g. --gravity 0 to switch it off)")
        sp.add_argument("--output", "-o", required=True, metavar="OUT.csv")
        sp.add_argument("--plot", metavar="PNG", help=plot_help)
        sp.set_defaults(func=func)

    s = command("info")
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    s.set_defaults(func=cmd_info)

    s = command("simulate")
    s.add_argument("--duration", type=_positive("--duration"), required=True, metavar="T", help="seconds")
    s.add_argument("--dt", type=_positive("--dt"), default=1e-3, metavar="DT", help="time step [s] (default 0.001)")
    s.add_argument("--window", type=_positive("--window", int), default=10, metavar="N",
                   help="fixed-lag window in steps (default 10)")
    s.add_argument("--coords", choices=FORMULATIONS, default="dependent",
                   help="formulation (default dependent)")
    s.add_argument("--integrator", choices=INTEGRATORS, default="trapezoidal")
    s.add_argument("--torques", metavar="CSV",
                   help="efforts: column t and one column per actuator joint (or tau_<joint>), "
                   "linearly interpolated; default zero")
    add_gravity_and_outputs(s, cmd_simulate)

    s = command("inverse-dynamics")
    s.add_argument("--trajectory", required=True, metavar="TRAJ.csv")
    s.add_argument("--verbose", "-v", action="store_true", help="print per-stage statistics on stderr")
    add_gravity_and_outputs(s, cmd_inverse_dynamics, "also save a plot (with the closed-form efforts for comparison)")

    s = command("estimate")
    s.add_argument("--observations", required=True, metavar="OBS.csv")
    s.add_argument("--torques", metavar="CSV", help="commanded efforts (required by --mode fused)")
    add_column_options(s)
    s.add_argument("--params", metavar="PARAMS.yaml",
                   help="estimator parameters from a node parameter file (e.g. written by 'mbfg tune'): its mode, "
                        "window, integrator, sigmas and sensor_sigmas; options given here win")
    s.add_argument("--window", type=_positive("--window", int), default=None, metavar="N", help="(default 10)")
    s.add_argument("--dt", type=_positive("--dt"), default=None, metavar="DT",
                   help="the estimator's nominal step [s]: each row is a step of its own length (the interval "
                        "since the previous row), and an interval longer than about 1.5 DT is bridged by "
                        "sub-steps of about DT, the readings at the last (default: the median interval between "
                        "the rows of OBS.csv, so jittery or drifting time stamps need no resampling)")
    s.add_argument("--sensor-sigma", action="append", default=[], metavar="NAME=SIGMA",
                   help="a sensor's σ in its units (repeatable; wins over --params; default: the mechanism file's)")
    s.add_argument("--mode", choices=tuple(m for m in MODES if m != "forward_dynamics"), default=None,
                   help="estimation: efforts unknown; fused: applied efforts = commanded + an estimated "
                        "disturbance (default estimation)")
    s.add_argument("--integrator", choices=INTEGRATORS, default=None, help="(default trapezoidal)")
    s.add_argument("--actuator-effort", action="append", default=[], metavar="NAME=KIND",
                   help=f"what actuator NAME's effort is: KIND one of {', '.join(EFFORT_KINDS)} (passive: known "
                        "zero, an underactuated joint; commanded: its --torques column is a known force); "
                        "repeatable; wins over the mechanism file's 'effort' keys (default: the file's, else as "
                        "the mode says)")
    s.add_argument("--actuator-delay", action="append", default=[], metavar="NAME=SECONDS",
                   help="actuator NAME applies a command SECONDS after it is given (its driver's latency: each row "
                        "applies the command that long before it, interpolated between rows); repeatable or "
                        "comma-separated; wins over the --params file's actuator_delays and the mechanism file's "
                        "'delay' keys")
    s.add_argument("--actuator-time-constant", action="append", default=[], metavar="NAME=SECONDS",
                   help="actuator NAME follows a command, after its delay, through a first-order lag of time "
                        "constant SECONDS (0: none); repeatable or comma-separated; wins over the --params file's "
                        "actuator_time_constants and the mechanism file's 'time_constant' keys")
    s.add_argument("--effort-sigma", action="append", default=[], metavar="NAME=SIGMA",
                   help="the 1σ [N·m or N] of the effort actuator NAME applies about its response to the command "
                        "that no reading resolves (torque ripple): part of its effort's published σ (not of a passive "
                        "one); repeatable or comma-separated; wins over the --params file's "
                        "actuator_effort_sigmas and the mechanism file's 'effort_sigma' keys")
    s.add_argument("--prescribed", metavar="PRESC.csv",
                   help="the set-points of the actuators whose effort is 'prescribed' (position-controlled joints): t "
                        "and one column per such joint, in the coordinate's unit; their efforts are estimated")
    s.add_argument("--prescribed-sigma", type=_positive("--prescribed-sigma"), default=None, metavar="SIGMA",
                   help="how closely the prescribed joints follow their set-points, in the coordinate's unit "
                        "(default: the generic observations' σ, 1e-3)")
    s.add_argument("--identify", action="append", default=None, metavar="JOINT.PARAMETER[=SIGMA]",
                   help="identify an actuator parameter online (PARAMETER: gain, viscous_friction, "
                        "coulomb_friction; SIGMA: its prior 1σ); repeatable or comma-separated; 'none' identifies "
                        "nothing (default: the mechanism file's identify: section).  Adds a column per parameter "
                        "(JOINT.PARAMETER, with --std JOINT.PARAMETER_std) and prints the final values")
    defaults = default_sigmas()
    for name, text in zip(DENSITY_OPTIONS, (
            "spectral density of the unmodelled accelerations [m²/s³ on point coordinates, rad²/s³ on angles]",
            "estimation: spectral density of the efforts' second derivative [(N·m)²/s³ or N²/s³ per actuator]",
            "fused: spectral density of the disturbance's second derivative [(N·m)²/s³ or N²/s³ per actuator]",
            "fused: time constant over which the disturbance's prior returns to 0 [s]")):
        opt = "--" + name.replace("_", "-")
        s.add_argument(opt, type=_positive(opt), metavar="T" if name.endswith("time_constant") else "S",
                       help=f"{text} (default: {_default_text(defaults, name)})")
    s.add_argument("--adapt-densities", action=argparse.BooleanOptionalAction, default=None,
                   help="estimation and fused: fit the process densities online from the readings (the effort "
                        "or disturbance density and the acceleration density, starting from their values) "
                        "(default: on, unless the --params file says adapt_densities: false; needs one "
                        "encoder per degree of freedom, else the densities stay fixed)")
    s.add_argument("--adapt-sensor-sigmas", action=argparse.BooleanOptionalAction, default=None,
                   help="fit each encoder's σ online from its readings' scatter, never below its stated σ "
                        "(--sensor-sigma, the --params file's or the mechanism file's) (default: on, unless the "
                        "--params file says adapt_sensor_sigmas: false)")
    s.add_argument("--adapt-deflection", action=argparse.BooleanOptionalAction, default=None,
                   help="estimation with --adapt-densities: a deflection state for each encoder on a geared actuator, "
                        "its σ fitted online (default: on, unless the --params file says adapt_deflection: false)")
    s.add_argument("--effort-bandwidth", type=float, default=None, metavar="HZ",
                   help="estimation with --adapt-densities: keep the fitted acceleration density below the unknown "
                        "efforts' spectrum up to HZ, so that slower unexplained motion is read as effort (default: "
                        f"the --params file's effort_bandwidth, else {EstimatorConfig.effort_bandwidth:g}; 0: the "
                        "likelihood alone)")
    s.add_argument("--smoothed-lag", type=int, default=None, metavar="N",
                   help="write each row's estimate smoothed by the readings of the N steps after it (the "
                        "fixed-lag smoother's, 0 < N < --window: later rows sharpen earlier ones; on the real "
                        "double pendulum N = 9 halves the rates' error) instead of the causal one, which the node "
                        "publishes at once (default: the --params file's smoothed_lag, else 0: causal)")
    s.add_argument("--std", action="store_true",
                   help="also write the 1σ of each estimate (its marginal in the window when it is written): <name>_std, "
                        "<name>_dot_std, <name>_ddot_std, tau_<joint>_std (and disturbance_<joint>_std)")
    add_gravity_and_outputs(s, cmd_estimate)

    s = command("identify")
    s.add_argument("--observations", required=True, metavar="OBS.csv", help="the recording's readings (as for estimate)")
    s.add_argument("--torques", metavar="CMD.csv", help="the commanded efforts (needed in fused mode)")
    add_column_options(s)
    s.add_argument("--mode", choices=("estimation", "fused"), default="fused",
                   help="fused (default): applied effort = command (× gain) + disturbance; estimation: efforts "
                        "unknown (only a passive joint's friction is then determined)")
    s.add_argument("--identify", action="append", default=None, metavar="JOINT.PARAMETER[=SIGMA]",
                   help="the parameters (as estimate --identify; default: the mechanism file's identify: section)")
    s.add_argument("--measured", action="append", default=[], metavar="JOINT=COLUMN", dest="measured_columns",
                   help="actuator JOINT's measured effort (a torque sensor's, or the driver's current × its torque "
                        "constant) in column COLUMN of the --torques file (repeatable or comma-separated): its "
                        "response, the delay and the first-order lag after which its command comes closest to it, "
                        "is written as the actuator's delay and time_constant (where its commands move fast enough "
                        "to time it) and used by the identification, and its departure from that response beyond "
                        "what the readings resolve as the actuator's effort_sigma")
    s.add_argument("--sensor-sigma", action="append", default=[], metavar="NAME=SIGMA",
                   help="a sensor's σ in its units (repeatable; default: the mechanism file's)")
    s.add_argument("--window", type=_positive("--window", int), default=10, metavar="N", help="(default 10)")
    s.add_argument("--output", "-o", required=True, metavar="MECH_OUT.yaml",
                   help="the mechanism file with its identify: section set to the identified values and 1σ")
    s.set_defaults(func=cmd_identify)

    s = command("tune")
    src = s.add_mutually_exclusive_group(required=True)
    src.add_argument("--observations", metavar="OBS.csv", help="the recording's encoder readings (as for estimate)")
    src.add_argument("--bag", metavar="DIR", help="a rosbag2 bag (MCAP or SQLite) instead of CSV files")
    s.add_argument("--torques", metavar="CMD.csv", help="the commanded efforts (fused mode, with --observations)")
    add_column_options(s)
    s.add_argument("--observations-topic", default="joint_observations", metavar="TOPIC",
                   help="with --bag: sensor_msgs/JointState readings (default joint_observations)")
    s.add_argument("--torques-topic", default="commanded_effort", metavar="TOPIC",
                   help="with --bag in fused mode: sensor_msgs/JointState commands (default commanded_effort)")
    s.add_argument("--mode", choices=("estimation", "fused"), required=True,
                   help="fit the effort density (estimation) or the disturbance density and time constant (fused)")
    s.add_argument("--fit-sensor-sigmas", action="store_true", help="also fit the encoders' σ")
    s.add_argument("--fit-acceleration-density", action="store_true",
                   help="also fit the acceleration density (else held at its default or the given value)")
    s.add_argument("--fit-deflection", action=argparse.BooleanOptionalAction, default=None,
                   help="also fit the encoders' deflection σ (its time constant held; default: in estimation mode "
                        "where an encoder reads a geared actuator, as the estimator's online fit)")
    for name in DENSITY_OPTIONS:
        opt = "--" + name.replace("_", "-")
        s.add_argument(opt, type=_positive(opt), metavar="S",
                       help=f"starting (or held) value (default: {_default_text(defaults, name)})")
    s.add_argument("--sensor-sigma", action="append", default=[], metavar="NAME=SIGMA",
                   help="an encoder's starting (or held) σ in its units (repeatable; default: the mechanism file's)")
    s.add_argument("--max-steps", type=_positive("--max-steps", int), default=2000, metavar="N",
                   help="decimate a longer recording to at most N filter steps per likelihood evaluation "
                        "(default 2000; a batch of candidates costs ~1 ms a step)")
    s.add_argument("--threads", type=_positive("--threads", int), default=None, metavar="N",
                   help="run the likelihood's filter banks in at most N threads (default: the processors this "
                        "process may run on; more than one only for two or more degrees of freedom; the same "
                        "fit either way)")
    s.add_argument("--output", "-o", required=True, metavar="PARAMS.yaml")
    s.set_defaults(func=cmd_tune)
    return p


# the longest error line: each piece of a user's file in a message is an `excerpt` already, this bounds the rest
MESSAGE_CHARS = 600


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if not getattr(args, "command", None):
            parser.print_help(sys.stderr)
            return 2
        return int(args.func(args) or 0)
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    except (UserError, MechanismError, CsvError, AssemblyError, TuningError) as exc:
        print(f"{PROG}: error: {excerpt(exc, MESSAGE_CHARS)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


def _one_line(exc) -> str:
    return " ".join(str(exc).split())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
