"""The estimator node's parameters: declarations and descriptors, validation, the `EstimatorConfig` they
make, and the settings the node applies as they change (see docs/ros2_interfaces.md for the list)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Dict, Optional, Tuple

import numpy as np

from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor
from rclpy.parameter import Parameter

from mbfg_ros.estimation.config import FORMULATIONS, INTEGRATORS, MODES, EstimatorConfig
from mbfg_ros.estimation.efforts import configured_shares, effort_model, parse_actuator_efforts
from mbfg_ros.estimation.identification import identification
from mbfg_ros.model.identified import parse_identify
from mbfg_ros.model.spec import (BODY_IDENTIFIABLE, EFFORT_KINDS, IDENTIFIABLE, MAX_ACTUATOR_DELAY, is_actuator_delay,
                                 is_effort_sigma)
from mbfg_ros.factors.noise import default_sigmas, noise_descriptions
from mbfg_ros.model.mechanism import Mechanism, load_mechanism, resolve_mechanism_path
from mbfg_ros.ros.scheduler import DELAY_FACTOR, DELAY_MEMORY_NS, NS, InputScheduler
from mbfg_ros.shown import MAX_LINE, shown

# Dynamic parameters held in `Settings` and applied as they are set (float ones are durations in seconds,
# checked >= 0); the others (mode, sigmas, assembly_mode) have their own handling.
DYNAMIC_SETTINGS = {"sensor_timeout": float, "max_input_delay": float, "startup_wait": float, "max_input_age": float,
                    "future_tolerance": float, "marker_period": float, "max_backlog": float,
                    "publish_markers": bool, "frame_id": str, "reset_on_time_jump": bool,
                    "adaptive_input_delay": bool, "max_prediction": float}


# Longest string parameter values (characters): anyone on the domain can set the dynamic ones, and every
# value may be quoted in a log line or an error.  Frame and joint names are a few dozen characters; the
# mechanism is a path (PATH_MAX).
MAX_NAME = 256
MAX_PATH = 4096
STRING_LIMITS = {"mechanism": MAX_PATH, "frame_id": MAX_NAME, "mode": MAX_NAME, "formulation": MAX_NAME,
                 "integrator": MAX_NAME, "independent": MAX_NAME, "actuator_efforts": MAX_NAME,
                 "identify": MAX_NAME}
MIN_INPUT_AGE = 0.01     # [s] a loaded machine delivers inputs several ms after their stamps
IDENTIFY_NONE = "none"   # the `identify` entry that turns off the mechanism file's identify: section


class ConfigError(ValueError):
    """A bad parameter value at start-up; the message names the parameter."""


#: the noise parameters whose 0 means "none" (their range starts at 0)
ZERO_IS_NONE = ("deflection_sigma",)


def string_problem(name: str, value) -> Optional[str]:
    """Why a string (or string array) parameter value is refused: too long (None: fine)."""
    limit = STRING_LIMITS.get(name)
    if limit is None or value is None:
        return None
    for text in ([value] if isinstance(value, str) else list(value)):
        if len(text) > limit:
            return (f"parameter '{name}' is {len(text)} characters long ('{shown(text, 40)}'); "
                    f"at most {limit}")
    return None


def parse_identify_parameter(value, mech: Mechanism):
    """The core's `EstimatorConfig.identify` from the `identify` parameter: unset or empty → None (the mechanism
    file's identify: section), ['none'] → () (nothing), else the entries.  ValueError naming what is wrong."""
    entries = [str(e).strip() for e in (value or ())]
    if not entries:
        return None
    if IDENTIFY_NONE in entries:
        if len(entries) > 1:
            raise ValueError(f"parameter 'identify': '{IDENTIFY_NONE}' must be its only entry (got {len(entries)} "
                             "entries)")
        return ()
    try:
        parse_identify(entries, mech)
    except ValueError as e:
        text = str(e)
        text = text[len("identify: "):] if text.startswith("identify: ") else text
        raise ValueError(shown(f"parameter 'identify': {text}", MAX_LINE)) from None
    return tuple(entries)


def core_problem(mech: Mechanism, config: EstimatorConfig) -> Optional[str]:
    """Why the core of `config` could not identify what it is asked to, or take the efforts' shares it is given
    (None: it can, or nothing is asked): the core would refuse to be built, so the node refuses the parameters
    instead and keeps running."""
    try:
        sigmas = {**default_sigmas(mech.spec), **dict(config.sigmas)}
        efforts = effort_model(config.mode, mech, sigmas, rates=config.integrator == "hermite",
                               overrides=config.actuator_efforts)
        configured_shares(mech, efforts, config.effort_shares, config.mode)
    except ValueError as e:
        return shown(f"parameters effort_shares.*: {e}", MAX_LINE)
    try:
        identification(mech, config.identify, config.mode, config.formulation, config.integrator, efforts)
    except ValueError as e:
        source = ("the mechanism file's identify: section (parameter 'identify' unset)" if config.identify is None
                  else "parameter 'identify'")
        return shown(f"{source}: {e}; set identify to ['{IDENTIFY_NONE}'] to estimate without identification",
                     MAX_LINE)
    return None


def min_input_age(dt: float, window: int) -> float:
    """The smallest max_input_age that does not stop estimation [s]: inputs within the window can still be
    fused, and on a loaded machine inputs arrive some ms after their stamps (0 would refuse every input)."""
    return max(MIN_INPUT_AGE, float(dt) * int(window))


def stopping_problem(name: str, value: float, dt: float, window: int) -> Optional[str]:
    """Why a duration setting would make the node estimate nothing (None: fine)."""
    if name == "max_input_age" and value < min_input_age(dt, window):
        return (f"parameter 'max_input_age' ({value:g} s) must be at least {min_input_age(dt, window):g} s "
                f"(max({MIN_INPUT_AGE:g} s, window × dt)): inputs arrive after their stamps, and a shorter age "
                f"would reject them all as stale")
    if name == "sensor_timeout" and value < dt:
        return (f"parameter 'sensor_timeout' ({value:g} s) must be at least dt ({dt:g} s): a command would "
                f"not be held to its own step, and no input stream would be waited for")
    return None


@dataclass
class Settings:
    """The node's own parameters (not the estimator's): the dynamic ones (DYNAMIC_SETTINGS) and two read-only."""
    sensor_timeout: float
    max_input_delay: float
    adaptive_input_delay: bool
    startup_wait: float
    max_input_age: float
    future_tolerance: float
    publish_markers: bool
    marker_period: float
    frame_id: str
    diagnostics_period: float
    reset_on_time_jump: bool
    max_backlog: float
    max_prediction: float
    fast_loop: bool
    thread_priority: int = 0              # read-only: SCHED_FIFO priority of the fast loop's thread (0: normal)
    publish_stddev: bool = False          # read-only: ~/joint_states_stddev (the core computes the marginal)
    publish_covariance: bool = False      # read-only: ~/joint_states_covariance (the core's joint_covariance)
    parameters_period: float = 0.1        # read-only: period of ~/parameters [s] (wall clock)
    smoothed_lag: int = 0                 # read-only: ~/smoothed/ topics, each estimate again this many steps later


@dataclass
class StartupParameters:
    mechanism_path: str
    mech: Mechanism
    config: EstimatorConfig                  # assembly_mode included
    assembly_mode: Optional[Tuple[int, ...]]  # the requested branch (None: automatic)
    settings: Settings


def _float_range(lo, hi):
    return [FloatingPointRange(from_value=float(lo), to_value=float(hi), step=0.0)]


def declare_parameters(node) -> StartupParameters:
    """Declare every parameter of the node and read their start-up values; ConfigError for a bad one."""
    d = node.declare_parameter
    PD = ParameterDescriptor

    def seconds(name, default, longest, description):
        """A duration parameter in [0, longest] seconds."""
        return d(name, default, PD(description=description,
                                   floating_point_range=_float_range(0.0, longest))).value
    mech_name = d("mechanism", "", PD(
        description="Mechanism YAML: a path, or the name of a file in the installed mechanisms/ folder "
                    "(e.g. four_bar_crank)", read_only=True,
        additional_constraints=f"at most {MAX_PATH} characters")).value
    if not mech_name:
        raise ConfigError("parameter 'mechanism' is required (a YAML path or a name such as four_bar_crank)")
    problem = string_problem("mechanism", mech_name)
    if problem:
        raise ConfigError(problem)
    try:
        mechanism_path = str(resolve_mechanism_path(mech_name))
        mech = load_mechanism(mechanism_path)
    except Exception as e:  # MechanismError, YAML errors
        raise ConfigError(shown(f"parameter 'mechanism' ('{shown(mech_name)}'): {e}", MAX_LINE)) from None

    dt = d("dt", 1e-3, PD(description="Timestep [s]: estimate and output period", read_only=True,
                           floating_point_range=_float_range(1e-5, 1.0))).value
    window = d("window", 10, PD(description="Steps kept in the fixed-lag window (Nw)", read_only=True,
                                integer_range=[IntegerRange(from_value=1, to_value=10000, step=1)])).value
    mode = d("mode", "forward_dynamics", PD(
        description="forward_dynamics (commanded efforts drive the model) | estimation (sensors only, "
                    "efforts estimated) | fused (both); changing it restarts the estimator",
        additional_constraints="one of: " + ", ".join(MODES))).value
    actuator_efforts = d("actuator_efforts", Parameter.Type.STRING_ARRAY, PD(
        description="Per actuator NAME=KIND, KIND estimated | commanded | passive (an underactuated joint: effort "
                    "known zero) | prescribed (a position-controlled joint: effort estimated, its set-points on "
                    "prescribed_motion), over the mechanism file's 'effort' keys; actuators not listed: the file's kind, "
                    "else as the mode says. Changing it restarts the estimator",
        additional_constraints=f"entries NAME=KIND, NAME an actuator joint ({', '.join(mech.actuator_names) or 'none'})"
                               f", KIND one of {', '.join(EFFORT_KINDS)}")).value or []
    payloads = [f"{s.joint}.{s.parameter}" for s in mech.spec.identify if s.parameter in BODY_IDENTIFIABLE]
    identify = d("identify", Parameter.Type.STRING_ARRAY, PD(
        description="Actuator and payload parameters identified online (estimation and fused modes), published on "
                    "~/parameters: entries JOINT.PARAMETER[=SIGMA]; empty/unset = the mechanism file's identify: "
                    f"section; ['{IDENTIFY_NONE}'] = none. Changing it restarts the estimator",
        additional_constraints=f"entries JOINT.PARAMETER[=SIGMA], JOINT an actuator joint "
                               f"({', '.join(mech.actuator_names) or 'none'}), PARAMETER one of "
                               f"{', '.join(IDENTIFIABLE)}; or BODY.PARAMETER, PARAMETER one of "
                               f"{', '.join(BODY_IDENTIFIABLE)}, where the mechanism file's identify: section "
                               f"declares it ({', '.join(payloads) or 'none'}); SIGMA > 0 (the prior's 1σ); or the "
                               f"single entry '{IDENTIFY_NONE}'; at most {MAX_NAME} characters each")).value or []
    formulation = d("formulation", "dependent", PD(
        description="dependent | independent coordinates", read_only=True,
        additional_constraints="one of: " + ", ".join(FORMULATIONS))).value
    integrator = d("integrator", "trapezoidal", PD(
        description="Time integrator in the graph", read_only=True,
        additional_constraints="one of: " + ", ".join(INTEGRATORS))).value
    independent = d("independent", Parameter.Type.STRING_ARRAY, PD(
        description="Independent coordinate names (independent formulation); empty/unset = automatic",
        read_only=True)).value or []
    sigmas = {}
    descriptions = noise_descriptions()
    for k, v in default_sigmas(mech.spec).items():
        low = 0.0 if k in ZERO_IS_NONE else 1e-15       # (a deflection σ of 0: none)
        sigmas[k] = d(f"sigmas.{k}", float(v), PD(
            description=f"{descriptions[k]}; {'≥ 0' if low == 0.0 else '> 0'}; changing it restarts the estimator",
            floating_point_range=_float_range(low, 1e15))).value
    sensor_sigmas = {}
    for s in mech.sensors:
        sensor_sigmas[s.name] = d(f"sensor_sigmas.{s.name}", float(s.sigma), PD(
            description=f"Noise sigma of {s.kind} '{s.name}' (default from the mechanism file)",
            floating_point_range=_float_range(1e-15, 1e15))).value
    effort_shares = {}
    for joint in mech.actuator_names:
        share = d(f"effort_shares.{joint}", 1.0, PD(
            description=f"The share of the effort (or disturbance) density of actuator '{joint}', where its effort "
                        f"is a state: its walk's density is the density × the share (the shares normalized to "
                        f"geometric mean 1; the start of the online fit in estimation mode); > 0; changing one "
                        f"restarts the estimator",
            floating_point_range=_float_range(1e-15, 1e15))).value
        if share != 1.0:           # (1: no information, whatever the effort's kind)
            effort_shares[joint] = float(share)
    def actuator_times(key: str, declared_times, describe) -> Dict[str, float]:
        """`<key>.<joint>` per actuator, a time in seconds defaulting to the mechanism file's (`declared_times`);
        {joint: value} of those set otherwise (the configuration's overrides)."""
        out = {}
        for joint, declared in zip(mech.actuator_names, declared_times):
            value = d(f"{key}.{joint}", float(declared), PD(
                description=f"{describe(joint)}; ≥ 0 and under {MAX_ACTUATOR_DELAY:g}; changing it restarts the "
                            f"estimator",
                floating_point_range=_float_range(0.0, MAX_ACTUATOR_DELAY))).value
            if value != declared:
                out[joint] = float(value)
        return out
    actuator_delays = actuator_times("actuator_delays", mech.actuator_delays, lambda joint: (
        f"The time [s] after which actuator '{joint}' applies a command (its driver's latency; default from the "
        f"mechanism file's 'delay'): each step applies the command that long before it, interpolated between the "
        f"two given around then"))
    actuator_time_constants = actuator_times("actuator_time_constants", mech.actuator_time_constants, lambda joint: (
        f"The time constant [s] of the first-order lag through which actuator '{joint}' follows a command after its "
        f"delay (its current loop's rise; default from the mechanism file's 'time_constant'; 0: none)"))
    actuator_effort_sigmas = {}
    for joint, declared in zip(mech.actuator_names, mech.actuator_effort_sigmas):
        value = d(f"actuator_effort_sigmas.{joint}", float(declared), PD(
            description=f"The 1σ [N·m or N] of the effort actuator '{joint}' applies about its response to the "
                        f"command that no reading resolves (its torque ripple; default from the mechanism file's "
                        f"'effort_sigma'; 0: the command is exact): part of the published σ of its effort (in every "
                        f"mode; not of a passive one); >= 0; changing it restarts the estimator",
            floating_point_range=_float_range(0.0, 1e15))).value
        if value != declared:
            actuator_effort_sigmas[joint] = float(value)
    prescribed_sigma = d("prescribed_sigma", 1e-3, PD(
        description="How closely the prescribed actuators (effort kind 'prescribed') follow their set-points on "
                    "prescribed_motion: the σ of each set-point as a reading of its coordinate, in the "
                    "coordinate's unit (rad, m); > 0; changing it restarts the estimator",
        floating_point_range=_float_range(1e-15, 1e15))).value
    sensor_sigmas.update(prescribed_sigmas(mech, prescribed_sigma))
    defaults = EstimatorConfig()
    outlier_gate = d("outlier_gate", float(defaults.outlier_gate), PD(
        description="Reject a sensor reading whose residual at the prediction exceeds this many sigmas "
                    "(0 = off)", read_only=True, floating_point_range=_float_range(0.0, 1e12))).value
    max_rejections = d("max_rejections", int(defaults.max_rejections), PD(
        description="...unless rejected this many consecutive steps: then re-initialize from the readings (the "
                    "estimate lost track)",
        read_only=True, integer_range=[IntegerRange(from_value=1, to_value=1000000, step=1)])).value
    lost_track_sigmas = d("lost_track_sigmas", float(defaults.lost_track_sigmas), PD(
        description="An encoder reading farther than this many of its sigmas (and than 1e-3 of the mechanism's "
                    "scale) from the new estimate for more than max_rejections steps in a row: the estimate lost "
                    "track and is re-initialized from the readings (0 = off)",
        read_only=True, floating_point_range=_float_range(0.0, 1e12))).value
    n_ind = len(mech.assembly_mode_names)
    am_default = [int(x) for x in mech.assembly_mode(np.array(mech.q0))] if n_ind else Parameter.Type.INTEGER_ARRAY
    am = d("assembly_mode", am_default, PD(
        description="Requested branch: one +1/-1 per assembly-mode indicator "
                    f"({', '.join(mech.assembly_mode_names) or 'none in this mechanism'}); "
                    "setting it re-initializes on that branch",
        additional_constraints="values in {-1, +1}, one per indicator")).value
    sensor_timeout = seconds("sensor_timeout", 0.1, 3600.0,
                             "An input silent for longer raises a WARN; efforts older than this count as unknown [s] "
                             "(at least dt)")
    max_input_delay = seconds("max_input_delay", 0.003, 10.0,
                              "Wait for late inputs before a step is estimated without them (longer with "
                              "adaptive_input_delay while the inputs arrive later) [s]")
    adaptive_input_delay = d("adaptive_input_delay", True, PD(
        description="While inputs arrive later than the window can absorb (max_input_delay + (window - 2) "
                    "steps; a loaded machine, a slow link), wait "
                    f"{DELAY_FACTOR:g} x their largest recent delay (memory ~{DELAY_MEMORY_NS / NS:g} s, at most "
                    "max_input_age) instead of predicting the steps and dropping the inputs as too old")).value
    startup_wait = seconds("startup_wait", 1.0, 3600.0,
                           "After a (re)start, longest wait for the commands (their topic may still be being "
                           "discovered) before estimating without them [s]; readings, in the modes that use them, "
                           "are waited for as long as it takes")
    max_prediction = seconds("max_prediction", 0.5, 3600.0,
                             "Longest stretch of steps predicted past the newest readings (modes that use readings): "
                             "beyond it estimation stops and starts again from the next readings [s] (0: never "
                             "stop; never less than window x dt)")
    max_input_age = seconds("max_input_age", 1.0, 1e6,
                            "Inputs stamped more than this before the node clock are rejected [s] (at least "
                            f"max({MIN_INPUT_AGE:g} s, window x dt))")
    future_tolerance = seconds("future_tolerance", 0.5, 1e6,
                               "Inputs stamped more than this after the node clock are rejected [s]")
    publish_markers = d("publish_markers", True, PD(description="Publish ~/markers for RViz")).value
    marker_period = seconds("marker_period", 0.05, 3600.0,
                            "Minimum period of ~/markers [s] (0 = every step)")
    frame_id = d("frame_id", "world", PD(description="frame_id of ~/state and ~/markers",
                                         additional_constraints=f"at most {MAX_NAME} characters")).value
    diagnostics_period = d("diagnostics_period", 1.0, PD(
        description="Period of /diagnostics [s] (wall clock)", read_only=True,
        floating_point_range=_float_range(0.01, 60.0))).value
    reset_on_time_jump = d("reset_on_time_jump", True, PD(
        description="Reset when the node clock jumps backwards (looping bag)")).value
    max_backlog = seconds("max_backlog", 0.1, 3600.0,
                          "If estimation falls further behind the node clock (solves slower than dt), skip to "
                          "the newest inputs and re-seed from the last estimate [s] (0 = never)")
    fast_loop = d("fast_loop", True, PD(
        description="Serve the inputs and the step timer from a lean wait loop in its own thread "
                    "(about 10x less overhead than rclpy's executor); false = plain rclpy executor",
        read_only=True)).value
    thread_priority = d("thread_priority", 0, PD(
        description="Real-time priority of the fast loop's thread (inputs, steps, publishing, services): "
                    "1..99 = SCHED_FIFO at that priority, so the hot path preempts the machine's ordinary "
                    "processes (a controller, a recorder, the plant) instead of waiting for their time slice; "
                    "0 = normal scheduling.  Needs CAP_SYS_NICE or an rtprio limit (e.g. in "
                    "/etc/security/limits.conf: '@realtime - rtprio 99'); without it the node warns once and "
                    "runs normally.  Applies to the fast loop only (ignored, with a warning, under the stock executor)",
        read_only=True, integer_range=[IntegerRange(from_value=0, to_value=99, step=1)])).value

    adapt_densities = d("adapt_densities", bool(defaults.adapt_densities), PD(
        description="estimation and fused modes: fit the process densities online (sigmas.effort_density in "
                    "estimation, sigmas.disturbance_density in fused, and sigmas.acceleration_density, each "
                    "starting from its value) by maximum likelihood of the encoder readings' innovations (needs "
                    "one encoder per degree of freedom, else the densities stay fixed); false: they are used as "
                    "given",
        read_only=True)).value
    adapt_deflection = d("adapt_deflection", bool(defaults.adapt_deflection), PD(
        description="estimation mode with adapt_densities: give each encoder on a geared actuator (gear_ratio not "
                    "±1) a deflection state, the gear's play between the motor's encoder and the link, and fit its "
                    "sigma online (from sigmas.deflection_sigma where set > 0, else from none); false: a deflection "
                    "only where sigmas.deflection_sigma > 0, held",
        read_only=True)).value
    effort_bandwidth = d("effort_bandwidth", float(defaults.effort_bandwidth), PD(
        description="estimation mode with adapt_densities [Hz]: the online fit keeps the unmodelled accelerations "
                    "below the unknown efforts' spectrum up to this frequency, so that slower unexplained motion is "
                    "read as effort (0: the likelihood alone)",
        read_only=True, floating_point_range=_float_range(0.0, 1e6))).value
    adapt_sensor_sigmas = d("adapt_sensor_sigmas", bool(defaults.adapt_sensor_sigmas), PD(
        description="estimation and fused modes: fit each encoder's sigma online from its readings' scatter about "
                    "a local cubic in time, never below sensor_sigmas.<encoder> (the floor); false: "
                    "sensor_sigmas are used as given",
        read_only=True)).value
    publish_stddev = d("publish_stddev", False, PD(
        description="Publish ~/joint_states_stddev (1σ of the angle, rate and effort of ~/joint_states, from the "
                    "newest state's marginal covariance; costs ~0.06 ms a step on the crank four-bar)",
        read_only=True)).value
    publish_covariance = d("publish_covariance", False, PD(
        description="Publish ~/joint_states_covariance (std_msgs/Float64MultiArray: the full covariance of the "
                    "angle, rate and effort of ~/joint_states' joints, row-major, labelled in its layout; costs "
                    "a marginal of the newest state a step, ~0.06 ms on the crank four-bar)",
        read_only=True)).value
    smoothed_lag = d("smoothed_lag", 0, PD(
        description="Also publish each estimate again on ~/smoothed/joint_states and ~/smoothed/state once the "
                    "window holds this many steps after it, smoothed by their readings (stamped with its own "
                    "step's time, this many steps late; on the real double pendulum 9 steps halve the rates' "
                    "error); 0 = off; less than window",
        read_only=True, integer_range=[IntegerRange(from_value=0, to_value=9999, step=1)])).value
    parameters_period = d("parameters_period", 0.1, PD(
        description="Period of ~/parameters [s] (wall clock; each costs the hot path a marginal of the window)",
        read_only=True, floating_point_range=_float_range(1e-3, 3600.0))).value

    for name, value in (("frame_id", frame_id), ("mode", mode), ("formulation", formulation),
                        ("integrator", integrator), ("independent", independent),
                        ("actuator_efforts", actuator_efforts), ("identify", identify)):
        problem = string_problem(name, value)
        if problem:
            raise ConfigError(problem)
    try:
        efforts = parse_actuator_efforts(actuator_efforts, mech)
    except ValueError as e:
        raise ConfigError(shown(f"parameter 'actuator_efforts': {e}", MAX_LINE)) from None
    try:
        identify = parse_identify_parameter(identify, mech)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    for name, value in (("max_input_age", max_input_age), ("sensor_timeout", sensor_timeout)):
        problem = stopping_problem(name, value, dt, window)
        if problem:
            raise ConfigError(problem)
    try:
        # The node calls step() on every grid step (gaps only when it skips ahead on overload, where the
        # core must re-seed from its last estimate rather than integrate every skipped step).
        base = EstimatorConfig(dt=float(dt), window=int(window), mode=str(mode), formulation=str(formulation),
                               integrator=str(integrator), independent=tuple(independent),
                               sigmas=dict(sigmas), sensor_sigmas=dict(sensor_sigmas), max_substeps=1,
                               effort_shares=effort_shares, actuator_delays=actuator_delays,
                               actuator_time_constants=actuator_time_constants,
                               actuator_effort_sigmas=actuator_effort_sigmas,
                               outlier_gate=float(outlier_gate), max_rejections=int(max_rejections),
                               lost_track_sigmas=float(lost_track_sigmas),
                               adapt_sensor_sigmas=bool(adapt_sensor_sigmas),
                               adapt_deflection=bool(adapt_deflection),
                               effort_bandwidth=float(effort_bandwidth),
                               compute_covariance=bool(publish_stddev),
                               smoothed_lag=int(smoothed_lag),
                               adapt_densities=bool(adapt_densities), actuator_efforts=efforts,
                               identify=identify)
        config = base.validated()
    except ValueError as e:
        raise ConfigError(shown(f"bad estimator parameters: {name_params(str(e))}", MAX_LINE)) from None
    problem = core_problem(mech, config)
    if problem:
        raise ConfigError(problem)
    problem = check_assembly_mode(mech, am)
    if problem:
        raise ConfigError(f"parameter 'assembly_mode': {problem}")
    assembly_mode = tuple(int(x) for x in am) if am else None
    if assembly_mode:
        config = replace(config, assembly_mode=assembly_mode)
    settings = Settings(sensor_timeout=sensor_timeout, max_input_delay=max_input_delay,
                        adaptive_input_delay=adaptive_input_delay, startup_wait=startup_wait,
                        max_input_age=max_input_age, future_tolerance=future_tolerance,
                        publish_markers=publish_markers, marker_period=marker_period, frame_id=frame_id,
                        diagnostics_period=diagnostics_period, reset_on_time_jump=reset_on_time_jump,
                        max_backlog=max_backlog, max_prediction=max_prediction, fast_loop=fast_loop,
                        thread_priority=int(thread_priority),
                        publish_stddev=bool(publish_stddev),
                        publish_covariance=bool(publish_covariance),
                        parameters_period=float(parameters_period),
                        smoothed_lag=int(smoothed_lag))
    return StartupParameters(mechanism_path, mech, config, assembly_mode, settings)


def prescribed_sigmas(mech: Mechanism, sigma: float) -> Dict[str, float]:
    """The core's sensor_sigmas of the set-points ('q:<coordinate>' readings) of every actuator's coordinate:
    whichever actuators `actuator_efforts` makes prescribed later, theirs are set already."""
    return {f"q:{a.coordinate}": float(sigma) for a in mech.spec.actuators}


def name_params(msg: str) -> str:
    """Config errors say 'noise parameter 'x''; say which ROS parameter that is."""
    return (msg.replace("noise parameter '", "parameter sigmas.*/sensor_sigmas.* '")
            .replace("dt must", "parameter 'dt' must").replace("window must", "parameter 'window' must")
            .replace("mode must", "parameter 'mode' must")
            .replace("smoothed_lag must", "parameter 'smoothed_lag' must")
            .replace("formulation must", "parameter 'formulation' must")
            .replace("integrator must", "parameter 'integrator' must"))


def check_assembly_mode(mech: Mechanism, am) -> Optional[str]:
    """What is wrong with a requested branch (None: fine; empty: automatic)."""
    n_ind = len(mech.assembly_mode_names)
    am = list(am or [])
    if not am:
        return None
    if len(am) != n_ind:
        return (f"needs {n_ind} values (one per indicator: {', '.join(mech.assembly_mode_names)})"
                if n_ind else "this mechanism has no assembly-mode indicators; leave it unset")
    if any(int(x) not in (-1, 1) for x in am):
        return f"values must be -1 or +1 (got {am})"
    return None


def no_single_indicator(mech: Mechanism) -> Optional[str]:
    """Why ~/set_assembly_mode (a SetBool) cannot choose this mechanism's branch (None: one indicator)."""
    names = mech.assembly_mode_names
    if len(names) == 1:
        return None
    if not names:
        return f"{mech.name} has no assembly-mode indicators: there is no branch to choose"
    return (f"{mech.name} has {len(names)} assembly-mode indicators ({', '.join(names)}); "
            "set the 'assembly_mode' parameter (an integer array of +1/-1) instead")


@dataclass
class ParameterChange:
    """A validated set of parameter changes, not applied yet."""
    config: EstimatorConfig       # the estimator configuration with the new mode and sigmas
    rebuild: Tuple[str, ...]      # the changed parameters that need a new core (mode, sigmas, actuator_efforts,
                                  # identify), sorted


def validate_change(new: Dict[str, object], mech: Mechanism, config: EstimatorConfig):
    """Check every changed parameter ({name: value}) before any is applied (all or nothing): the reason
    (a str) of the first refused one, else a ParameterChange."""
    rebuild = {}
    for name, value in new.items():
        if DYNAMIC_SETTINGS.get(name) is float:
            if value is None or not math.isfinite(float(value)) or float(value) < 0:
                return f"parameter '{name}' must be >= 0 seconds"
            problem = stopping_problem(name, float(value), config.dt, config.window)
            if problem:
                return problem
        elif name in STRING_LIMITS and string_problem(name, value):
            return string_problem(name, value)
        elif name == "mode":
            if value not in MODES:
                return f"parameter 'mode' must be one of {', '.join(MODES)}"
            rebuild["mode"] = value
        elif name == "actuator_efforts":
            try:
                rebuild[name] = parse_actuator_efforts(value, mech)
            except ValueError as e:
                return shown(f"parameter 'actuator_efforts': {e}", MAX_LINE)
        elif name == "identify":
            try:
                rebuild[name] = parse_identify_parameter(value, mech)
            except ValueError as e:
                return str(e)
        elif name.startswith(("actuator_delays.", "actuator_time_constants.")):
            if not is_actuator_delay(value):
                return f"parameter '{name}' must be a time in seconds, >= 0 and under {MAX_ACTUATOR_DELAY:g}"
            rebuild[name] = float(value)
        elif name.startswith("actuator_effort_sigmas."):
            if not is_effort_sigma(value):
                return f"parameter '{name}' must be a finite number >= 0"
            rebuild[name] = float(value)
        elif name.startswith(("sigmas.", "sensor_sigmas.", "effort_shares.")) or name == "prescribed_sigma":
            if value is None or not (float(value) > 0 and math.isfinite(float(value))):
                return f"parameter '{name}' must be > 0"
            rebuild[name] = float(value)
        elif name == "assembly_mode":
            problem = check_assembly_mode(mech, value)
            if problem:
                return f"parameter 'assembly_mode': {problem}"
    if rebuild:
        sig, ssig, shares = dict(config.sigmas), dict(config.sensor_sigmas), dict(config.effort_shares)
        delays, lags = dict(config.actuator_delays), dict(config.actuator_time_constants)
        ripples = dict(config.actuator_effort_sigmas)
        for name, value in rebuild.items():
            if name.startswith("actuator_delays."):
                delays[name[len("actuator_delays."):]] = value
            elif name.startswith("actuator_time_constants."):
                lags[name[len("actuator_time_constants."):]] = value
            elif name.startswith("actuator_effort_sigmas."):
                ripples[name[len("actuator_effort_sigmas."):]] = value
            elif name.startswith("sigmas."):
                sig[name[len("sigmas."):]] = value
            elif name.startswith("effort_shares."):
                shares[name[len("effort_shares."):]] = value
                if value == 1.0:
                    del shares[name[len("effort_shares."):]]
            elif name.startswith("sensor_sigmas."):
                ssig[name[len("sensor_sigmas."):]] = value
            elif name == "prescribed_sigma":
                ssig.update(prescribed_sigmas(mech, value))
        try:
            config = replace(config, mode=rebuild.get("mode", config.mode), sigmas=sig, sensor_sigmas=ssig,
                             effort_shares=shares, actuator_delays=delays, actuator_time_constants=lags,
                             actuator_effort_sigmas=ripples,
                             actuator_efforts=rebuild.get("actuator_efforts", config.actuator_efforts),
                             identify=rebuild["identify"] if "identify" in rebuild else config.identify).validated()
        except ValueError as e:
            return name_params(str(e))
        # a mode or effort kind under which the identified parameters cannot be estimated, or the shares given
        # have no estimated effort, is refused here: the core would not be built
        problem = core_problem(mech, config)
        if problem:
            return problem
    return ParameterChange(config, tuple(sorted(rebuild)))


def update_settings(settings: Settings, new: Dict[str, object]) -> None:
    """Apply the changed dynamic settings among `new` (validated)."""
    for name, value in new.items():
        kind = DYNAMIC_SETTINGS.get(name)
        if kind is not None:
            setattr(settings, name, kind(value))


def configure_scheduler(sched: InputScheduler, settings: Settings) -> None:
    """The scheduler's acceptance and waiting policy from the settings (seconds → ns)."""
    sched.future_tolerance_ns = int(settings.future_tolerance * NS)
    sched.max_input_age_ns = int(settings.max_input_age * NS)
    sched.sensor_timeout_ns = int(settings.sensor_timeout * NS)
    sched.input_delay_ns = int(settings.max_input_delay * NS)
    sched.adaptive_input_delay = bool(settings.adaptive_input_delay)
    sched.startup_wait_ns = int(settings.startup_wait * NS)
    sched.max_backlog_ns = int(settings.max_backlog * NS)
    sched.max_prediction_ns = int(settings.max_prediction * NS)
