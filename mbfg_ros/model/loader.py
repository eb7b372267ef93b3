"""Load a mechanism YAML file into a validated `mbfg_ros.model.spec.MechanismSpec`.

The format is the one of the reference implementation (mbse, Blanco-Claraco et al. 2021): it loads
the paper's Listing 1 unchanged.  It adds optional sections: ``name``, ``gravity``, ``joint_angles``,
``sliders``, ``actuators``, ``sensors`` and ``assembly_modes``, and optional ``name`` keys on points, bodies and
relative coordinates.  docs/mechanism_format.md documents every key.

Every problem raises `MechanismError` (and nothing else) with a one-line message
``"<file>: <key path>: <what is wrong>"``, e.g.
``four_bar.yaml: planar_bodies[2].mass: must be > 0 (got -4)``.
"""

from __future__ import annotations

import math
import re
import reprlib
from pathlib import Path
from typing import Any, Dict, List, Mapping, NoReturn, Optional, Sequence, Tuple, Union

import yaml

from mbfg_ros.excerpt import excerpt
from mbfg_ros.model.expressions import CONSTANTS, FUNCTIONS, ExpressionError, evaluate
from mbfg_ros.model.spec import (BODY_IDENTIFIABLE, EFFORT_KINDS, IDENTIFIABLE, MAX_ACTUATOR_DELAY, ActuatorSpec,
                                 AssemblyModeSpec, BodySpec, EncoderSpec, FixedSliderSpec, GyroscopeSpec, IdentifySpec,
                                 JointAngleSpec, MechanismError, MechanismSpec, MobileSliderSpec, PointSpec,
                                 RelativeAngleSpec, is_actuator_delay, is_effort_sigma)

__all__ = ["load_spec", "load_spec_from_string", "coordinate_names", "MechanismError",
           "DEFAULT_GRAVITY", "RESERVED_NAMES"]

DEFAULT_GRAVITY = (0.0, -9.81)

#: Names that may not be used as parameters (besides the patterns x<i>, y<i>, length<ij>).
RESERVED_NAMES = frozenset({"index", "auto", "length", "mass", "I0"} | set(CONSTANTS) | set(FUNCTIONS))

_RESERVED_PATTERN = re.compile(r"(x|y|length)[0-9]+\Z")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_POINT_COORDINATE = re.compile(r"[xy][0-9]+\Z")

_TOP_KEYS = ("name", "parameters", "points", "planar_bodies", "relative_coordinates", "joint_angles", "gravity",
             "sliders", "actuators", "sensors", "assembly_modes", "identify")
_POINT_KEYS = ("x", "y", "fixed", "name")
_BODY_KEYS = ("points", "length", "mass", "I0", "cog", "name")
_RELCOORD_KEYS = ("type", "points", "name")
_RELCOORD_TYPES = ("RelativeAngleAbsoluteDOF",)
_JOINT_KEYS = ("name", "bodies", "value")
GROUND = "ground"           # the parent of a joint angle measured from the ground (the frame of the drawing)
# per type: (allowed keys, required keys)
_SLIDER_SCHEMAS = {"fixed": (("type", "point", "line", "name"), ("type", "point", "line")),
                   "mobile": (("type", "point", "line_points", "name"), ("type", "point", "line_points"))}
_ACTUATOR_KEYS = ("coordinate", "joint", "effort_limit", "delay", "time_constant", "effort_sigma", "gear_ratio",
                  "rotor_inertia", "viscous_friction", "coulomb_friction", "coulomb_velocity", "effort")
_SENSOR_SCHEMAS = {"encoder": (("type", "coordinate", "sigma", "name", "turns", "counts_per_turn"),
                               ("type", "coordinate")),
                   "gyroscope": (("type", "body", "sigma", "name", "max_rate"), ("type", "body", "sigma"))}
_ASSEMBLY_KEYS = ("name", "points")
_IDENTIFY_KEYS = ("joint", "body", "at", "parameter", "sigma", "value", "density")

# Geometric tolerances.
_LENGTH_ABS_TOL = 1e-6
_LENGTH_REL_TOL = 1e-6
_COINCIDENT_TOL = 1e-9
_CROSS_TOL = 1e-9
_ON_LINE_TOL = 1e-6

_repr = reprlib.Repr()
_repr.maxlevel = 2
_repr.maxdict = 3
_repr.maxlist = 4
_repr.maxtuple = 4
_repr.maxset = 3
_repr.maxstring = 40
_repr.maxother = 40
_repr.maxlong = 30


def _show(value: Any) -> str:
    """Short one-line rendering of a YAML value for messages."""
    try:
        text = _repr.repr(value)
    except Exception:  # pragma: no cover - reprlib is robust, but never let a message fail
        text = f"<{type(value).__name__}>"
    return " ".join(text.split())


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict):
        return "map"
    if isinstance(value, list):
        return "list"
    return type(value).__name__


def _fmt(x: float) -> str:
    return f"{x:.10g}"


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys in a mapping (PyYAML silently keeps the last one)."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False):
    loader.flatten_mapping(node)
    mapping: Dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark,
                f"found an unhashable key ({_type_name(key)})", key_node.start_mark) from None
        if key in mapping:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark,
                f"found duplicate key {_show(key)}", key_node.start_mark)
        mapping[key] = loader.construct_object(value_node, deep=deep)
    return mapping


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _yaml_error_message(exc: BaseException) -> str:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "invalid YAML"
        if exc.problem and exc.context:
            problem = f"{exc.problem} ({exc.context})"
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        kind = "YAML error" if isinstance(exc, yaml.constructor.ConstructorError) else "YAML syntax error"
        return f"{kind}{where}: {_one_line(problem)}"
    if isinstance(exc, yaml.YAMLError):
        return f"YAML error: {_one_line(str(exc))}"
    if isinstance(exc, RecursionError):
        return "YAML error: document nested too deeply"
    return f"YAML error: {_one_line(str(exc)) or type(exc).__name__}"


# ------------------------------------------------------------------------------------------------
# Public API
# ------------------------------------------------------------------------------------------------

def load_spec(path: Union[str, Path]) -> MechanismSpec:
    """Read and validate the mechanism YAML file at `path`.  Raises `MechanismError` on any problem."""
    source = str(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise MechanismError(f"{source}: cannot read file: {_one_line(exc.strerror or str(exc))}") from None
    except (TypeError, ValueError) as exc:
        raise MechanismError(f"{source}: cannot read file: {_one_line(str(exc))}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise MechanismError(f"{source}: file is not valid UTF-8 (byte {exc.start})") from None
    return load_spec_from_string(text, source=source)


def load_spec_from_string(text: str, source: str = "<string>") -> MechanismSpec:
    """Parse and validate mechanism YAML `text`; `source` names it in messages and is kept in the spec."""
    source = _one_line(str(source)) or "<string>"
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise MechanismError(f"{source}: text is not valid UTF-8 (byte {exc.start})") from None
    if not isinstance(text, str):
        raise MechanismError(f"{source}: expected YAML text, got {type(text).__name__}")
    try:
        document = yaml.load(text, Loader=_UniqueKeyLoader)
    except Exception as exc:  # any PyYAML failure, incl. ValueError from e.g. date scalars
        raise MechanismError(f"{source}: {_yaml_error_message(exc)}") from None
    try:
        return _Builder(source).build(document)
    except MechanismError:
        raise
    except Exception as exc:  # defensive: a bug in this module must still surface as MechanismError
        raise MechanismError(f"{source}: internal error while loading "
                             f"({type(exc).__name__}: {_one_line(str(exc))})") from None


def coordinate_names(spec: MechanismSpec) -> List[str]:
    """Names of the generalized coordinates, in q order.

    ``x<i>``, ``y<i>`` for every non-fixed point i (point order), then the relative angles' names (those the
    loader added for joint angles last), then the joint angles' names.
    """
    names: List[str] = []
    for i, p in enumerate(spec.points):
        if not p.fixed:
            names.extend((f"x{i}", f"y{i}"))
    names.extend(spec.angle_names)
    return names


# ------------------------------------------------------------------------------------------------
# Implementation
# ------------------------------------------------------------------------------------------------

def _default_name(source: str) -> str:
    if source.startswith("<"):
        return "mechanism"
    stem = Path(source).stem
    return stem or "mechanism"


class _Builder:
    def __init__(self, source: str):
        self.source = source
        self.variables: Dict[str, float] = {}
        self.points: List[PointSpec] = []
        self.body_specs: List[BodySpec] = []

    # -- helpers ---------------------------------------------------------------------------------

    def fail(self, path: str, message: str) -> NoReturn:
        raise MechanismError(f"{self.source}: {path}: {_one_line(message)}")

    def map_(self, value: Any, path: str, allowed: Sequence[str], required: Sequence[str] = ()) -> Dict[str, Any]:
        if not isinstance(value, dict):
            # the whole file is not a map (the wrong file, e.g. a password file): never quote it
            got = (f"{_type_name(value)} {_show(value)}" if path != "(document)" else
                   f"{_type_name(value)} ({len(str(value))} characters): is this a mechanism file?")
            self.fail(path, f"expected a map with keys {', '.join(allowed)}; got {got}")
        for key in value:
            if not isinstance(key, str):
                self.fail(path, f"key {_show(key)} is not a string (allowed keys: {', '.join(allowed)})")
            if key not in allowed:
                self.fail(self.sub(path, key), f"unknown key '{excerpt(key)}' (allowed keys: {', '.join(allowed)})")
        for key in required:
            if key not in value:
                self.fail(path, f"missing required key '{key}'")
        return value

    @staticmethod
    def sub(path: str, key: str) -> str:
        if not _IDENTIFIER.match(key):
            key = repr(key)
        key = excerpt(key)      # a key from the file: its start is enough to find it (never a whole line)
        return key if path in ("", "(document)") else f"{path}.{key}"

    def list_(self, value: Any, path: str, what: str, min_len: int = 0, exact: Optional[int] = None) -> list:
        if not isinstance(value, list):
            self.fail(path, f"expected a list of {what}; got {_type_name(value)} {_show(value)}")
        if exact is not None and len(value) != exact:
            self.fail(path, f"expected exactly {exact} {what}; got {len(value)}")
        if len(value) < min_len:
            self.fail(path, f"expected at least {min_len} {what}; got {len(value)}")
        return value

    def optional_list(self, doc: Dict[str, Any], key: str, what: str) -> list:
        value = doc.get(key)
        if value is None:
            return []
        return self.list_(value, key, what)

    def mappings(self, doc: Dict[str, Any], key: str, what: str, keys: Sequence[str], required: Sequence[str]):
        """(index, path, entry) of each mapping of the optional list doc[key], its keys checked."""
        for k, entry in enumerate(self.optional_list(doc, key, what)):
            path = f"{key}[{k}]"
            yield k, path, self.map_(entry, path, keys, required=required)

    def expr(self, value: Any, path: str, extra: Optional[Mapping[str, float]] = None) -> float:
        if value is None:
            self.fail(path, "expected a number or an expression; got null")
        if isinstance(value, (dict, list)):
            self.fail(path, f"expected a number or an expression; got {_type_name(value)} {_show(value)}")
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            self.fail(path, f"expected a number or an expression; got {_type_name(value)} {_show(value)}")
        variables = self.variables if not extra else {**self.variables, **extra}
        try:
            return evaluate(value, variables)
        except ExpressionError as exc:
            self.fail(path, str(exc))

    def positive(self, value: Any, path: str, extra: Optional[Mapping[str, float]] = None) -> float:
        x = self.expr(value, path, extra)
        if not x > 0.0:
            self.fail(path, f"must be > 0 (got {_fmt(x)})")
        return x

    def index(self, value: Any, path: str, count: int, what: str = "point") -> int:
        if isinstance(value, bool):
            self.fail(path, f"expected a {what} index; got boolean {value}")
        x = self.expr(value, path)
        if x != math.floor(x):
            self.fail(path, f"{what} index must be an integer (got {_fmt(x)})")
        i = int(x)
        if not 0 <= i < count:
            self.fail(path, f"{what} index {i} out of range (the file has {count} {what}s, 0..{count - 1})")
        return i

    def name(self, value: Any, path: str) -> str:
        if not isinstance(value, str):
            self.fail(path, f"expected a name (string); got {_type_name(value)} {_show(value)}")
        if not _IDENTIFIER.match(value):
            self.fail(path, f"invalid name {_show(value)}: use letters, digits and '_', not starting with a digit")
        return value

    def pt(self, i: int) -> Tuple[float, float]:
        p = self.points[i]
        return (p.x, p.y)

    def dist(self, i: int, j: int) -> float:
        (xi, yi), (xj, yj) = self.pt(i), self.pt(j)
        return math.hypot(xj - xi, yj - yi)

    def unique_name(self, entry: Dict[str, Any], path: str, seen: Dict[str, str], default: str, what: str,
                    key: str = "name") -> str:
        """entry[key] (a valid name) or `default`, checked unique among `seen`."""
        if key in entry:
            name = self.name(entry[key], f"{path}.{key}")
            self.check_unique(seen, name, f"{path}.{key}", what)
        else:
            name = default
            self.check_unique(seen, name, path, what)
        return name

    def check_unique(self, seen: Dict[str, str], name: str, path: str, what: str) -> None:
        if name in seen:
            self.fail(path, f"duplicate {what} name '{name}' (already used by {seen[name]})")
        seen[name] = path

    # -- sections --------------------------------------------------------------------------------

    def build(self, doc: Any) -> MechanismSpec:
        if doc is None:
            self.fail("(document)", "file is empty; expected a map with keys points, planar_bodies, ...")
        doc = self.map_(doc, "(document)", _TOP_KEYS, required=("points", "planar_bodies"))

        name = _default_name(self.source)
        if "name" in doc:
            raw = doc["name"]
            if not isinstance(raw, str) or not raw.strip() or "\n" in raw.strip() or "\r" in raw:
                self.fail("name", f"expected a one-line, non-empty string; got {_type_name(raw)} {_show(raw)}")
            name = raw.strip()

        parameters = self.parameters(doc.get("parameters"))
        self.read_points(doc["points"])
        bodies = self.bodies(doc["planar_bodies"])
        relative = self.relative_coordinates(doc)
        joints = self.joint_angles(doc, relative)
        gravity = self.gravity(doc)
        coords: List[str] = []
        for i, p in enumerate(self.points):
            if not p.fixed:
                coords.extend((f"x{i}", f"y{i}"))
        coords.extend(r.name for r in relative)
        coords.extend(j.name for j in joints)
        fixed_sliders, mobile_sliders = self.sliders(doc)
        actuators = self.actuators(doc, coords, {r.name for r in relative}, {j.name: j for j in joints})
        encoders, gyros = self.sensors(doc, coords, len(bodies))
        modes = self.assembly_modes(doc)
        identify = self.identify(doc, actuators, bodies)
        return MechanismSpec(
            name=name, points=tuple(self.points), bodies=tuple(bodies), gravity=gravity,
            relative_angles=tuple(relative), joint_angles=tuple(joints), fixed_sliders=tuple(fixed_sliders),
            mobile_sliders=tuple(mobile_sliders), actuators=tuple(actuators), encoders=tuple(encoders),
            gyroscopes=tuple(gyros), assembly_modes=tuple(modes), identify=tuple(identify), source=self.source,
            parameters=tuple(parameters))

    def parameters(self, raw: Any) -> List[Tuple[str, float]]:
        if raw is None:
            return []
        if not isinstance(raw, dict):
            self.fail("parameters", f"expected a map of name: expression; got {_type_name(raw)} {_show(raw)}")
        out: List[Tuple[str, float]] = []
        for key, value in raw.items():
            if not isinstance(key, str):
                self.fail("parameters", f"parameter name {_show(key)} is not a string")
            path = self.sub("parameters", key)
            if not _IDENTIFIER.match(key):
                self.fail(path, f"invalid parameter name {_show(key)}: use letters, digits and '_', "
                                "not starting with a digit")
            if key in RESERVED_NAMES or _RESERVED_PATTERN.match(key):
                self.fail(path, f"'{key}' is a reserved name (reserved: {', '.join(sorted(RESERVED_NAMES))}, "
                                "x<i>, y<i>, length<ij>)")
            x = self.expr(value, path)
            self.variables[key] = x
            out.append((key, x))
        return out

    def read_points(self, raw: Any) -> None:
        raw = self.list_(raw, "points", "points", min_len=1)
        names: Dict[str, str] = {}
        for i, entry in enumerate(raw):
            path = f"points[{i}]"
            entry = self.map_(entry, path, _POINT_KEYS, required=("x", "y"))
            x = self.expr(entry["x"], f"{path}.x")
            y = self.expr(entry["y"], f"{path}.y")
            fixed = entry.get("fixed", False)
            if not isinstance(fixed, bool):
                self.fail(f"{path}.fixed", f"expected true or false; got {_type_name(fixed)} {_show(fixed)}")
            pname = None
            if "name" in entry:
                pname = self.name(entry["name"], f"{path}.name")
                self.check_unique(names, pname, f"{path}.name", "point")
            self.points.append(PointSpec(x=x, y=y, fixed=fixed, name=pname))
            self.variables[f"x{i}"] = x
            self.variables[f"y{i}"] = y

    def point_list(self, raw: Any, path: str, min_len: int, exact: Optional[int] = None) -> Tuple[int, ...]:
        what = "point indices"
        raw = self.list_(raw, path, what, min_len=min_len, exact=exact)
        indices: List[int] = []
        for k, v in enumerate(raw):
            i = self.index(v, f"{path}[{k}]", len(self.points))
            if i in indices:
                self.fail(path, f"point {i} is listed twice")
            indices.append(i)
        return tuple(indices)

    def bodies(self, raw: Any) -> List[BodySpec]:
        raw = self.list_(raw, "planar_bodies", "bodies", min_len=1)
        out: List[BodySpec] = []
        names: Dict[str, str] = {}
        for b, entry in enumerate(raw):
            path = f"planar_bodies[{b}]"
            entry = self.map_(entry, path, _BODY_KEYS, required=("points", "mass", "I0", "cog"))
            pts = self.point_list(entry["points"], f"{path}.points", min_len=2)
            # Geometry checks.
            for a in range(len(pts)):
                for c in range(a + 1, len(pts)):
                    if self.dist(pts[a], pts[c]) <= _COINCIDENT_TOL:
                        x, y = self.pt(pts[a])
                        self.fail(f"{path}.points", f"points {pts[a]} and {pts[c]} coincide at "
                                                    f"({_fmt(x)}, {_fmt(y)}); a body needs distinct points")
            fixed = [i for i in pts if self.points[i].fixed]
            if len(fixed) == len(pts):
                self.fail(f"{path}.points", f"all points of the body ({', '.join(map(str, pts))}) are fixed; "
                                            "a body needs at least one moving point")
            if len(fixed) >= 2:
                self.fail(f"{path}.points", f"points {fixed[0]} and {fixed[1]} are both fixed: a constant distance "
                                            "between two fixed points makes the body immobile; declare its other "
                                            "points fixed and remove the body")
            drawn = self.dist(pts[0], pts[1])
            local: Dict[str, float] = {"auto": drawn}
            if len(pts) >= 3:
                # 1-based, symmetric pair lengths; they stay defined for later bodies (as in mbse).
                for a in range(len(pts)):
                    for c in range(len(pts)):
                        if a != c:
                            self.variables[f"length{a + 1}{c + 1}"] = self.dist(pts[a], pts[c])
            if "length" in entry:
                declared = self.positive(entry["length"], f"{path}.length", local)
                if abs(declared - drawn) > _LENGTH_ABS_TOL + _LENGTH_REL_TOL * declared:
                    self.fail(f"{path}.length",
                              f"declared length {_fmt(declared)} differs from the drawn distance {_fmt(drawn)} "
                              f"between points {pts[0]} and {pts[1]}; fix the point coordinates or use 'auto'")
                length = declared if len(pts) == 2 else drawn
            elif len(pts) == 2:
                self.fail(path, "missing required key 'length' (a number, an expression or 'auto')")
            else:
                length = drawn
            local = {"length": length}
            mass = self.positive(entry["mass"], f"{path}.mass", local)
            local["mass"] = mass
            inertia = self.positive(entry["I0"], f"{path}.I0", local)
            local["I0"] = inertia
            cog_raw = self.list_(entry["cog"], f"{path}.cog", "coordinates [x, y]", exact=2)
            cog = (self.expr(cog_raw[0], f"{path}.cog[0]", local), self.expr(cog_raw[1], f"{path}.cog[1]", local))
            # (products, not **: a huge cog must overflow to inf, which the check below reports, not raise)
            parallel = mass * (cog[0] * cog[0] + cog[1] * cog[1])
            if not math.isfinite(parallel) or inertia < parallel - 1e-9 * (1.0 + parallel):
                self.fail(f"{path}.I0", f"I0 = {_fmt(inertia)} (about points[0]) is less than "
                                        f"mass*|cog|^2 = {_fmt(parallel)}, which the parallel-axis theorem forbids")
            bname = self.unique_name(entry, path, names, f"body{b}", "body")
            out.append(BodySpec(points=pts, length=length, mass=mass, I0=inertia, cog=cog, name=bname))
        self.body_specs = out
        return out

    def relative_coordinates(self, doc: Dict[str, Any]) -> List[RelativeAngleSpec]:
        out: List[RelativeAngleSpec] = []
        names: Dict[str, str] = {}
        for k, path, entry in self.mappings(doc, "relative_coordinates", "relative coordinates", _RELCOORD_KEYS,
                                         required=("type", "points")):
            kind = entry["type"]
            if kind not in _RELCOORD_TYPES:
                self.fail(f"{path}.type", f"unsupported type {_show(kind)} (allowed: {', '.join(_RELCOORD_TYPES)})")
            pts = self.point_list(entry["points"], f"{path}.points", min_len=2, exact=2)
            if self.points[pts[0]].fixed and self.points[pts[1]].fixed:
                self.fail(f"{path}.points", f"points {pts[0]} and {pts[1]} are both fixed; the angle could never change")
            if self.dist(pts[0], pts[1]) <= _COINCIDENT_TOL:
                self.fail(f"{path}.points", f"points {pts[0]} and {pts[1]} coincide; the angle is undefined")
            if not any(pts[0] in body.points and pts[1] in body.points for body in self.body_specs):
                self.fail(f"{path}.points", f"points {pts[0]} and {pts[1]} do not belong to a common body, so "
                                            "their distance is not constant")
            cname = self.coordinate_name(entry, path, names, f"theta{k}")
            out.append(RelativeAngleSpec(name=cname, points=(pts[0], pts[1])))
        return out

    def coordinate_name(self, entry: Dict[str, Any], path: str, names: Dict[str, str], default: str) -> str:
        """entry's `name` (or `default`): a valid coordinate name, not of a point coordinate's form, unique."""
        cname = default
        if "name" in entry:
            cname = self.name(entry["name"], f"{path}.name")
            if _POINT_COORDINATE.match(cname):
                self.fail(f"{path}.name", f"'{cname}' looks like a point coordinate name (x<i>/y<i>); "
                                          "choose another name")
        self.check_unique(names, cname, f"{path}.name" if "name" in entry else path, "coordinate")
        return cname

    def joint_angles(self, doc: Dict[str, Any], relative: List[RelativeAngleSpec]) -> List[JointAngleSpec]:
        """The joint angles; appends to `relative` the absolute angle ``theta_<body>`` (points[0] → points[1]) of
        every body they name that has no absolute angle coordinate yet."""
        out: List[JointAngleSpec] = []
        names: Dict[str, str] = {r.name: "relative_coordinates" for r in relative}
        for k, path, entry in self.mappings(doc, "joint_angles", "joint angles", _JOINT_KEYS, required=("bodies",)):
            ends = self.list_(entry["bodies"], f"{path}.bodies", "bodies [parent, child]", exact=2)
            parent = self.body_ref(ends[0], f"{path}.bodies[0]", ground=True)
            child = self.body_ref(ends[1], f"{path}.bodies[1]", ground=False)
            if parent == child:
                self.fail(f"{path}.bodies", f"parent and child are the same body ({self.body_specs[child].name}); "
                                            "a joint angle is between two bodies")
            value = self.expr(entry["value"], f"{path}.value") if "value" in entry else 0.0
            jname = self.coordinate_name(entry, path, names, f"joint{k}")
            child_angle, child_drawn = self.body_angle(child, relative, names, path)
            parent_angle, parent_drawn = (None, 0.0) if parent is None else self.body_angle(parent, relative,
                                                                                             names, path)
            out.append(JointAngleSpec(name=jname, parent=parent, child=child, parent_angle=parent_angle,
                                      child_angle=child_angle, offset=value - (child_drawn - parent_drawn)))
        return out

    def body_ref(self, value: Any, path: str, ground: bool) -> Optional[int]:
        """A body named by its name or index (`ground`: 'ground' is allowed and gives None)."""
        if isinstance(value, str) and _IDENTIFIER.match(value):
            if value == GROUND:
                if not ground:
                    self.fail(path, "the child of a joint angle is a body, not the ground (write the joint as "
                                    "[ground, <body>])")
                if any(b.name == GROUND for b in self.body_specs):
                    self.fail(path, "'ground' is ambiguous: a body is named 'ground'; rename that body")
                return None
            for b, body in enumerate(self.body_specs):
                if body.name == value:
                    return b
            known = ", ".join(b.name for b in self.body_specs)
            self.fail(path, f"unknown body {_show(value)} (known: {known}{', ground' if ground else ''})")
        return self.index(value, path, len(self.body_specs), what="body")

    def body_angle(self, b: int, relative: List[RelativeAngleSpec], names: Dict[str, str], path: str
                   ) -> Tuple[str, float]:
        """(coordinate, drawn value) of body b's absolute angle: its first relative angle on two of its points,
        else a new one ``theta_<body>`` on points[0] → points[1]."""
        body = self.body_specs[b]
        for r in relative:
            if r.points[0] in body.points and r.points[1] in body.points:
                return r.name, self.drawn_angle(*r.points)
        name = f"theta_{body.name}"
        if name in names:
            self.fail(path, f"body '{body.name}' needs an absolute angle coordinate for this joint angle and its "
                            f"default name '{name}' is taken (by {names[name]}); name the joint angle otherwise or "
                            f"add a RelativeAngleAbsoluteDOF of the body to relative_coordinates")
        names[name] = f"{path} (the absolute angle of body '{body.name}')"
        relative.append(RelativeAngleSpec(name=name, points=(body.points[0], body.points[1])))
        return name, self.drawn_angle(body.points[0], body.points[1])

    def drawn_angle(self, i: int, j: int) -> float:
        (xi, yi), (xj, yj) = self.pt(i), self.pt(j)
        return math.atan2(yj - yi, xj - xi)

    def gravity(self, doc: Dict[str, Any]) -> Tuple[float, float]:
        if doc.get("gravity") is None:
            return DEFAULT_GRAVITY
        raw = self.list_(doc["gravity"], "gravity", "components [gx, gy]", exact=2)
        return (self.expr(raw[0], "gravity[0]"), self.expr(raw[1], "gravity[1]"))

    def moving_point(self, value: Any, path: str) -> int:
        i = self.index(value, path, len(self.points))
        if self.points[i].fixed:
            self.fail(path, f"point {i} is fixed; a slider needs a moving point")
        return i

    def typed_entries(self, doc: Dict[str, Any], key: str, what: str,
                      schemas: Dict[str, Tuple[Sequence[str], Sequence[str]]]):
        """(index, path, type, entry) for each entry of the optional list `key`: a mapping whose 'type' is one of
        `schemas`, checked against that type's (allowed keys, required keys)."""
        types = list(schemas)
        for k, entry in enumerate(self.optional_list(doc, key, key)):
            path = f"{key}[{k}]"
            if not isinstance(entry, dict):
                self.map_(entry, path, schemas[types[0]][0])
            kind = entry.get("type")
            if kind not in types:
                if "type" not in entry:
                    self.fail(path, f"missing required key 'type' ({' or '.join(types)})")
                self.fail(f"{path}.type", f"unsupported {what} type {_show(kind)} (allowed: {', '.join(types)})")
            keys, required = schemas[kind]
            yield k, path, kind, self.map_(entry, path, keys, required=required)

    def sliders(self, doc: Dict[str, Any]) -> Tuple[List[FixedSliderSpec], List[MobileSliderSpec]]:
        fixed_out: List[FixedSliderSpec] = []
        mobile_out: List[MobileSliderSpec] = []
        names: Dict[str, str] = {}
        for k, path, kind, entry in self.typed_entries(doc, "sliders", "slider", _SLIDER_SCHEMAS):
            if kind == "fixed":
                p = self.moving_point(entry["point"], f"{path}.point")
                line_raw = self.list_(entry["line"], f"{path}.line", "points [[x, y], [x, y]]", exact=2)
                ends = []
                for e, end in enumerate(line_raw):
                    end = self.list_(end, f"{path}.line[{e}]", "coordinates [x, y]", exact=2)
                    ends.append((self.expr(end[0], f"{path}.line[{e}][0]"), self.expr(end[1], f"{path}.line[{e}][1]")))
                (ax, ay), (bx, by) = ends
                span = math.hypot(bx - ax, by - ay)
                if span <= _COINCIDENT_TOL:
                    self.fail(f"{path}.line", "the two line points coincide; the line is undefined")
                self.check_on_line(path, p, (ax, ay), (bx, by))
                sname = self.unique_name(entry, path, names, f"slider{k}", "slider")
                fixed_out.append(FixedSliderSpec(name=sname, point=p, line=((ax, ay), (bx, by))))
            else:
                p = self.moving_point(entry["point"], f"{path}.point")
                lp = self.point_list(entry["line_points"], f"{path}.line_points", min_len=2, exact=2)
                if p in lp:
                    self.fail(f"{path}.line_points", f"the slider point {p} cannot also define its own line")
                if self.dist(lp[0], lp[1]) <= _COINCIDENT_TOL:
                    self.fail(f"{path}.line_points", f"points {lp[0]} and {lp[1]} coincide; the line is undefined")
                self.check_on_line(path, p, self.pt(lp[0]), self.pt(lp[1]))
                sname = self.unique_name(entry, path, names, f"slider{k}", "slider")
                mobile_out.append(MobileSliderSpec(name=sname, point=p, line_points=(lp[0], lp[1])))
        return fixed_out, mobile_out

    def check_on_line(self, path: str, p: int, a: Tuple[float, float], b: Tuple[float, float]) -> None:
        px, py = self.pt(p)
        dx, dy = b[0] - a[0], b[1] - a[1]
        span = math.hypot(dx, dy)
        off = abs(dx * (py - a[1]) - dy * (px - a[0])) / span
        scale = max(span, math.hypot(px - a[0], py - a[1]))
        if off > _ON_LINE_TOL * (1.0 + scale):
            self.fail(f"{path}.point", f"point {p} at ({_fmt(px)}, {_fmt(py)}) is {_fmt(off)} away from its "
                                       "line; place it on the line")

    def actuators(self, doc: Dict[str, Any], coords: List[str], relative: set,
                  joints_by_name: Dict[str, JointAngleSpec]) -> List[ActuatorSpec]:
        out: List[ActuatorSpec] = []
        joints: Dict[str, str] = {}
        actuated: Dict[str, str] = {}
        for k, path, entry in self.mappings(doc, "actuators", "actuators", _ACTUATOR_KEYS, required=("coordinate",)):
            coord = self.coordinate(entry["coordinate"], f"{path}.coordinate", coords)
            self.check_unique(actuated, coord, f"{path}.coordinate", "actuated coordinate")
            joint = self.unique_name(entry, path, joints, coord, "joint", key="joint")
            # None: the default from the mechanism's scale (model.plausibility.default_effort_limit)
            limit = self.positive(entry["effort_limit"], f"{path}.effort_limit") if "effort_limit" in entry else None
            gear, rotor, stator = self.motor(entry, path, coord, relative, joints_by_name)
            out.append(ActuatorSpec(coordinate=coord, joint=joint, effort_limit=limit, gear_ratio=gear,
                                    rotor_inertia=rotor, stator_angle=stator, effort=self.effort_kind(entry, path),
                                    delay=self.actuator_delay(entry, path, "delay"),
                                    time_constant=self.actuator_delay(entry, path, "time_constant"),
                                    effort_sigma=self.effort_sigma(entry, path),
                                    **self.actuator_friction(entry, path)))
        return out

    def identify(self, doc: Dict[str, Any], actuators: List[ActuatorSpec], bodies: List[BodySpec]
                 ) -> List[IdentifySpec]:
        """The parameters to identify online (`identify:`): an actuator's joint and one of IDENTIFIABLE, or a body
        (name or index), BODY_IDENTIFIABLE and the point `at` in its frame; optional prior value, σ > 0 and
        random-walk density > 0."""
        out: List[IdentifySpec] = []
        seen: Dict[str, str] = {}
        joints = [a.joint for a in actuators]
        body_names = [b.name or f"body{k}" for k, b in enumerate(bodies)]
        for k, path, entry in self.mappings(doc, "identify", "parameters to identify", _IDENTIFY_KEYS,
                                            required=("parameter",)):
            parameter = entry["parameter"]
            if parameter not in IDENTIFIABLE + BODY_IDENTIFIABLE:
                self.fail(f"{path}.parameter", f"expected one of {', '.join(IDENTIFIABLE + BODY_IDENTIFIABLE)}; got "
                                               f"{_type_name(parameter)} {_show(parameter)}")
            extra = {}
            if parameter in BODY_IDENTIFIABLE:
                for key in ("joint",):
                    if key in entry:
                        self.fail(f"{path}.{key}", f"a {parameter} belongs to a body: give 'body' (and 'at'), not "
                                                   "'joint'")
                if "body" not in entry:
                    self.fail(path, f"a {parameter} needs 'body' (a body's name or index) and 'at' (the point in "
                                    "its frame [m])")
                raw = entry["body"]
                if isinstance(raw, str) and raw in body_names:
                    b = body_names.index(raw)
                else:
                    b = self.index(raw, f"{path}.body", len(bodies), "body")
                at = self.list_(entry.get("at", [0, 0]), f"{path}.at", "numbers [x, y]", exact=2)
                extra = {"body": b, "at": (self.expr(at[0], f"{path}.at[0]"), self.expr(at[1], f"{path}.at[1]"))}
                joint = body_names[b]
            else:
                if "body" in entry or "at" in entry:
                    self.fail(f"{path}.{'body' if 'body' in entry else 'at'}",
                              f"a {parameter} belongs to an actuator: give 'joint', not 'body'/'at'")
                if "joint" not in entry:
                    self.fail(path, "missing required key 'joint'")
                joint = entry["joint"]
                if not isinstance(joint, str) or joint not in joints:
                    self.fail(f"{path}.joint", f"expected the joint name of an actuator ({', '.join(joints) or 'none'}); "
                                               f"got {_type_name(joint)} {_show(joint)}")
            self.check_unique(seen, f"{joint}.{parameter}", path, "identified parameter")
            numbers = {key: self.positive(entry[key], f"{path}.{key}") for key in ("sigma", "density") if key in entry}
            value = self.expr(entry["value"], f"{path}.value") if "value" in entry else None
            out.append(IdentifySpec(joint=joint, parameter=parameter, value=value, **numbers, **extra))
        return out

    def effort_kind(self, entry: Dict[str, Any], path: str) -> Optional[str]:
        """An actuator's `effort` (one of EFFORT_KINDS), or None: as the estimator's mode says."""
        if "effort" not in entry:
            return None
        kind = entry["effort"]
        if kind not in EFFORT_KINDS:
            self.fail(f"{path}.effort", f"expected one of {', '.join(EFFORT_KINDS)}; got {_type_name(kind)} "
                                        f"{_show(kind)}")
        return kind

    def actuator_delay(self, entry: Dict[str, Any], path: str, key: str) -> float:
        """An actuator's `delay` [s] from a command to its application or `time_constant` [s] of its lag after
        it: 0 ≤ x < MAX_ACTUATOR_DELAY."""
        if key not in entry:
            return 0.0
        x = self.expr(entry[key], f"{path}.{key}")
        if not is_actuator_delay(x):
            example = "a driver's latency of 5 ms" if key == "delay" else "a current loop's 3-ms rise"
            self.fail(f"{path}.{key}", f"must be a time in seconds, >= 0 and under {_fmt(MAX_ACTUATOR_DELAY)} "
                                       f"(got {_fmt(x)}; {example} is {0.005 if key == 'delay' else 0.003})")
        return x

    def effort_sigma(self, entry: Dict[str, Any], path: str) -> float:
        """An actuator's `effort_sigma` (≥ 0, finite; 0 without)."""
        if "effort_sigma" not in entry:
            return 0.0
        x = self.expr(entry["effort_sigma"], f"{path}.effort_sigma")
        if not is_effort_sigma(x):
            self.fail(f"{path}.effort_sigma", f"must be a finite number >= 0 (got {_fmt(x)}): the 1σ of the effort "
                                              "the actuator applies about its response to the command")
        return x

    def actuator_friction(self, entry: Dict[str, Any], path: str) -> Dict[str, float]:
        """The friction keys of an actuator (`model.friction`): b, c ≥ 0; v_s > 0, only with a Coulomb friction."""
        out: Dict[str, float] = {}
        for key in ("viscous_friction", "coulomb_friction"):
            if key in entry:
                x = self.expr(entry[key], f"{path}.{key}")
                if not x >= 0.0:
                    self.fail(f"{path}.{key}", f"must be >= 0 (got {_fmt(x)}): friction opposes the motion")
                out[key] = x
        if "coulomb_velocity" in entry:
            if "coulomb_friction" not in entry:
                self.fail(f"{path}.coulomb_velocity", "smooths the Coulomb friction, but the actuator has no "
                                                      "'coulomb_friction'")
            out["coulomb_velocity"] = self.positive(entry["coulomb_velocity"], f"{path}.coulomb_velocity")
        return out

    def motor(self, entry: Dict[str, Any], path: str, coord: str, relative: set,
              joints_by_name: Dict[str, JointAngleSpec]) -> Tuple[float, float, Optional[str]]:
        """(gear_ratio, rotor_inertia, stator angle coordinate) of an actuator: a rotor turns with an angle, on
        the joint's parent body (the ground for an absolute body angle)."""
        if "gear_ratio" not in entry and "rotor_inertia" not in entry:
            return 1.0, 0.0, None
        if coord not in relative and coord not in joints_by_name:
            key = "gear_ratio" if "gear_ratio" in entry else "rotor_inertia"
            self.fail(f"{path}.{key}", f"coordinate '{coord}' is a point coordinate (a length): a rotor's gear "
                                       "ratio and inertia are only expressible for an angle (a joint angle or a "
                                       "body's absolute angle)")
        gear = 1.0
        if "gear_ratio" in entry:
            gear = self.expr(entry["gear_ratio"], f"{path}.gear_ratio")
            if gear == 0.0 or not math.isfinite(gear):
                self.fail(f"{path}.gear_ratio", f"must be a non-zero number (rotor turns per joint turn, negative "
                                                f"when the rotor turns against the joint); got {_fmt(gear)}")
        rotor = 0.0
        if "rotor_inertia" in entry:
            rotor = self.expr(entry["rotor_inertia"], f"{path}.rotor_inertia")
            if not 0.0 <= rotor < math.inf:
                self.fail(f"{path}.rotor_inertia", f"must be >= 0 [kg·m²] (got {_fmt(rotor)})")
        joint = joints_by_name.get(coord)
        return gear, rotor, (joint.parent_angle if joint is not None else None)

    def coordinate(self, value: Any, path: str, coords: List[str]) -> str:
        if not isinstance(value, str):
            self.fail(path, f"expected a coordinate name; got {_type_name(value)} {_show(value)}")
        if value not in coords:
            hint = ""
            m = _POINT_COORDINATE.match(value)
            if m and int(value[1:]) < len(self.points) and self.points[int(value[1:])].fixed:
                hint = f" (point {int(value[1:])} is fixed, so it has no coordinates)"
            self.fail(path, f"unknown coordinate {_show(value)}{hint}; known: {', '.join(coords)}")
        return value

    def sensors(self, doc: Dict[str, Any], coords: List[str], nbodies: int
                ) -> Tuple[List[EncoderSpec], List[GyroscopeSpec]]:
        encoders: List[EncoderSpec] = []
        gyros: List[GyroscopeSpec] = []
        names: Dict[str, str] = {}
        for _, path, kind, entry in self.typed_entries(doc, "sensors", "sensor", _SENSOR_SCHEMAS):
            if kind == "encoder":
                encoders.append(self.encoder(entry, path, coords, names))
            else:
                body = self.index(entry["body"], f"{path}.body", nbodies, what="body")
                sigma = self.positive(entry["sigma"], f"{path}.sigma")
                sname = self.unique_name(entry, path, names, f"gyro{body}", "sensor")
                max_rate = self.positive(entry["max_rate"], f"{path}.max_rate") if "max_rate" in entry else None
                gyros.append(GyroscopeSpec(name=sname, body=body, sigma=sigma, max_rate=max_rate))
        return encoders, gyros

    def encoder(self, entry: Dict[str, Any], path: str, coords: List[str], names: Dict[str, str]) -> EncoderSpec:
        coord = self.coordinate(entry["coordinate"], f"{path}.coordinate", coords)
        angle = not _POINT_COORDINATE.match(coord)
        turns = entry.get("turns", "multi")
        if turns not in ("multi", "single"):
            self.fail(f"{path}.turns", f"expected 'multi' (the reading is the angle, whole turns included) or "
                                       f"'single' (the angle modulo one turn); got {_show(turns)}")
        counts = None
        if "counts_per_turn" in entry:
            if not angle:
                self.fail(f"{path}.counts_per_turn", f"coordinate {_show(coord)} is a length, not an angle: "
                                                     "state its resolution through 'sigma'")
            value = entry["counts_per_turn"]
            x = None if isinstance(value, bool) else self.expr(value, f"{path}.counts_per_turn")
            if x is None or x != math.floor(x) or not 2 <= x <= 2.0 ** 62:
                self.fail(f"{path}.counts_per_turn", f"expected a whole number of counts per turn, at least 2; "
                                                     f"got {_show(value)}")
            counts = int(x)
        if turns == "single" and not angle:
            self.fail(f"{path}.turns", f"coordinate {_show(coord)} is a length: only an angle can be read "
                                       "modulo a turn")
        if "sigma" in entry:
            sigma = self.positive(entry["sigma"], f"{path}.sigma")
        elif counts is not None:
            sigma = 2.0 * math.pi / counts / math.sqrt(12.0)     # the quantization error's σ: one count / √12
        else:
            self.fail(path, "missing required key 'sigma' (the reading's standard deviation), or "
                            "'counts_per_turn' for an angle encoder whose σ is its quantization")
        sname = self.unique_name(entry, path, names, coord, "sensor")
        return EncoderSpec(name=sname, coordinate=coord, sigma=sigma, turns=turns, counts_per_turn=counts)

    def assembly_modes(self, doc: Dict[str, Any]) -> List[AssemblyModeSpec]:
        out: List[AssemblyModeSpec] = []
        names: Dict[str, str] = {}
        for k, path, entry in self.mappings(doc, "assembly_modes", "assembly modes", _ASSEMBLY_KEYS,
                                         required=("points",)):
            pts = self.point_list(entry["points"], f"{path}.points", min_len=3, exact=3)
            if all(self.points[i].fixed for i in pts):
                self.fail(f"{path}.points", f"points {pts[0]}, {pts[1]} and {pts[2]} are all fixed; "
                                            "the indicator could never change")
            (xi, yi), (xj, yj), (xk, yk) = (self.pt(i) for i in pts)
            cross = (xj - xi) * (yk - yi) - (yj - yi) * (xk - xi)
            if abs(cross) < _CROSS_TOL:
                self.fail(f"{path}.points", f"points {pts[0]}, {pts[1]} and {pts[2]} are collinear in the file's pose "
                                            f"(cross product {_fmt(cross)}), so the branch sign is undefined")
            mname = self.unique_name(entry, path, names, f"mode{k}", "assembly mode")
            out.append(AssemblyModeSpec(name=mname, points=(pts[0], pts[1], pts[2])))
        return out
