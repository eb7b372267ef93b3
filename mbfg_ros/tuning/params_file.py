"""The estimator node's parameter-file format (`/**/mbfg_estimator: ros__parameters: {...}`, as
config/four_bar.yaml): written by `mbfg tune`, read by `mbfg estimate --params` and by the node
(`--ros-args --params-file`)."""

from __future__ import annotations

import math
from typing import Dict, Iterable, Optional, Tuple

from mbfg_ros.excerpt import excerpt
from mbfg_ros.factors.noise import default_sigmas
from mbfg_ros.model.mechanism import Mechanism
from mbfg_ros.model.spec import MAX_ACTUATOR_DELAY, is_actuator_delay, is_effort_sigma

NODE_NAME = "mbfg_estimator"
#: the node's own parameters (ros/parameters.py): valid in the file, no meaning to `mbfg estimate`
NODE_ONLY_KEYS = frozenset((
    "mechanism", "dt", "formulation", "independent", "assembly_mode", "sensor_timeout", "max_input_delay",
    "adaptive_input_delay", "startup_wait", "max_input_age", "future_tolerance", "publish_markers",
    "marker_period", "frame_id", "diagnostics_period", "reset_on_time_jump", "max_backlog", "fast_loop",
    "thread_priority", "publish_stddev", "outlier_gate", "max_rejections", "lost_track_sigmas", "use_sim_time",
    "max_prediction", "parameters_period", "prescribed_sigma", "publish_covariance", "actuator_efforts", "identify",
    "start_type_description_service"))
#: the keys `mbfg estimate --params` applies (`actuator_efforts` and `identify` it takes as options)
APPLIED_KEYS = ("mode", "window", "integrator", "sigmas", "sensor_sigmas", "effort_shares", "actuator_delays",
                "actuator_time_constants", "actuator_effort_sigmas", "adapt_densities", "adapt_sensor_sigmas",
                "adapt_deflection", "effort_bandwidth", "smoothed_lag")


class ParamsFileError(ValueError):
    """A parameter file that cannot be used; the message names the file and the key."""


def format_double(x: float) -> str:
    """6 significant digits that YAML and ROS read as a double: always a '.', a signed exponent ('4321' would
    be an INTEGER to the node, which declares these parameters DOUBLE, and '1e-05' a string to YAML 1.1)."""
    text = f"{float(x):.6g}"
    mantissa, _, exponent = text.partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    return mantissa + ("e" + exponent if exponent else "")


def format_params(mode: str, sigmas: Dict[str, float], sensor_sigmas: Dict[str, float],
                  header: Iterable[str] = (), mechanism: Optional[str] = None,
                  adapt_densities: Optional[bool] = None) -> str:
    """The file's text: `header` lines as comments, then the `mbfg_estimator` section (with
    `adapt_densities` when given: fitted densities are used as fitted, not adapted further)."""
    descriptions = {"acceleration_density": "unmodelled accelerations [rad²/s³ on angles, m²/s³ on points]",
                    "effort_density": "estimation: unknown efforts' second derivative [(N·m)²/s³ or N²/s³]",
                    "disturbance_density": "fused: disturbance's second derivative [(N·m)²/s³ or N²/s³]",
                    "disturbance_time_constant": "fused: the disturbance's prior returns to 0 over this [s]",
                    "deflection_sigma": "the encoders' deflection behind a gear, stationary σ [rad, m]",
                    "deflection_time_constant": "the encoders' deflection's time constant [s]"}
    lines = [f"# {h}".rstrip() for h in header]
    lines += [f"/**/{NODE_NAME}:", "  ros__parameters:"]
    if mechanism:
        lines.append(f"    mechanism: {mechanism}")
    lines.append(f"    mode: {mode}")
    if adapt_densities is not None:
        lines.append(f"    adapt_densities: {'true' if adapt_densities else 'false'}")
    lines.append("    sigmas:")
    for k, v in sigmas.items():
        lines.append(f"      {k}: {format_double(v):<14} # {descriptions.get(k, '')}".rstrip())
    if sensor_sigmas:
        lines.append("    sensor_sigmas:")
        for k, v in sensor_sigmas.items():
            lines.append(f"      {k}: {format_double(v)}")
    return "\n".join(lines) + "\n"


def _yaml_problem(exc) -> str:
    """A YAML error without the snippet of the file PyYAML quotes: what is wrong and where."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or type(exc).__name__
    return excerpt(problem, 80) + (f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "")


def node_parameters(path) -> Tuple[str, Dict[str, object]]:
    """(the node key, its `ros__parameters` mapping) of the estimator node in a parameter file; a
    ParamsFileError naming the file when it has none."""
    import yaml
    try:
        with open(path) as f:
            doc = yaml.safe_load(f)
    except OSError as exc:
        raise ParamsFileError(f"{path}: cannot read ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise ParamsFileError(f"{path}: not YAML ({_yaml_problem(exc)})") from None
    if not isinstance(doc, dict):
        raise ParamsFileError(f"{path}: not a ROS 2 parameter file (expected a mapping of node names)")
    sections = [(k, v) for k, v in doc.items() if str(k).split("/")[-1] == NODE_NAME]
    if not sections:
        raise ParamsFileError(f"{path}: no '{NODE_NAME}' node (no '{NODE_NAME}: ros__parameters:' section, "
                              f"e.g. '/**/{NODE_NAME}: ros__parameters: ...')")
    key, node = sections[0]
    params = node.get("ros__parameters") if isinstance(node, dict) else None
    if not isinstance(params, dict):
        raise ParamsFileError(f"{path}: '{excerpt(key)}' has no 'ros__parameters' mapping")
    return key, params


def _per_actuator(value, where: str, mech: Mechanism, unit: str, valid, must: str) -> Dict[str, float]:
    """A mapping of actuator joints to numbers, each `valid`; ParamsFileError naming the key."""
    if not isinstance(value, dict):
        raise ParamsFileError(f"{where} must be a mapping of actuator joints to {unit}")
    table = {}
    for k, v in value.items():
        if k not in mech.actuator_names:
            raise ParamsFileError(f"{where}.{excerpt(k)}: unknown actuator of {mech.name} (known: "
                                  f"{', '.join(sorted(mech.actuator_names))})")
        if not valid(v):
            raise ParamsFileError(f"{where}.{excerpt(k)} must be {must} (got {excerpt(repr(v))})")
        table[k] = float(v)
    return table


def read_params(path, mech: Mechanism) -> Dict[str, object]:
    """The estimator settings of a parameter file: {key: value} for the keys in APPLIED_KEYS it has (sigmas,
    sensor_sigmas, effort_shares, actuator_delays, actuator_time_constants and actuator_effort_sigmas as dicts,
    checked against the noise
    parameters and the mechanism's sensors and actuators).  Keys the node knows but `mbfg estimate` does not use are
    accepted and left out; anything else is a ParamsFileError."""
    key, params = node_parameters(path)
    out: Dict[str, object] = {}
    known_sigmas = set(default_sigmas())
    sensors = {s.name for s in mech.sensors}
    actuators = set(mech.actuator_names)
    for name, value in params.items():
        where = f"{path}: {excerpt(key)}.ros__parameters.{excerpt(name)}"
        if name in ("sigmas", "sensor_sigmas", "effort_shares"):
            if not isinstance(value, dict):
                raise ParamsFileError(f"{where} must be a mapping of names to numbers")
            allowed = {"sigmas": known_sigmas, "sensor_sigmas": sensors, "effort_shares": actuators}[name]
            what = {"sigmas": "noise parameter", "sensor_sigmas": "sensor of " + mech.name,
                    "effort_shares": "actuator of " + mech.name}[name]
            table = {}
            for k, v in value.items():
                if k not in allowed:
                    raise ParamsFileError(f"{where}.{excerpt(k)}: unknown {what} (known: {', '.join(sorted(allowed))})")
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                    raise ParamsFileError(f"{where}.{excerpt(k)} must be a number > 0 (got {excerpt(repr(v))})")
                table[k] = float(v)
            out[name] = table
        elif name in ("actuator_delays", "actuator_time_constants"):
            out[name] = _per_actuator(value, where, mech, "seconds", is_actuator_delay,
                                      f"a time in seconds, >= 0 and under {MAX_ACTUATOR_DELAY:g}")
        elif name == "actuator_effort_sigmas":
            out[name] = _per_actuator(value, where, mech, "efforts (1σ, N·m or N)", is_effort_sigma,
                                      "a finite number >= 0")
        elif name in ("adapt_densities", "adapt_sensor_sigmas", "adapt_deflection"):
            if not isinstance(value, bool):
                raise ParamsFileError(f"{where} must be true or false (got {excerpt(repr(value))})")
            out[name] = value
        elif name == "effort_bandwidth":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 <= value < math.inf):
                raise ParamsFileError(f"{where} must be a finite number of Hz ≥ 0 (got {excerpt(repr(value))})")
            out[name] = float(value)
        elif name == "smoothed_lag":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ParamsFileError(f"{where} must be an integer ≥ 0 (got {excerpt(repr(value))})")
            out[name] = value
        elif name in APPLIED_KEYS:
            out[name] = value
        elif name not in NODE_ONLY_KEYS:
            raise ParamsFileError(f"{where}: unknown parameter of the {NODE_NAME} node")
    return out

