"""Property tests: whatever the input, the loader returns a valid spec or raises MechanismError, never
anything else, and its messages are one line naming the file."""

import copy
import math
import os
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mbfg_ros.model.loader import coordinate_names, load_spec_from_string
from mbfg_ros.model.spec import MechanismError, MechanismSpec

MECHANISMS = Path(__file__).resolve().parent.parent / "mechanisms"
SHIPPED_TEXT = {p.name: p.read_text() for p in sorted(MECHANISMS.glob("*.yaml"))}
SHIPPED_DOCS = {name: yaml.safe_load(text) for name, text in SHIPPED_TEXT.items()}

SOURCE = "fuzz.yaml"
# About 2 s per property at the default; MBFG_FUZZ_EXAMPLES=20000 for a long bug hunt.
FUZZ = settings(max_examples=int(os.environ.get("MBFG_FUZZ_EXAMPLES", "200")), deadline=None,
                suppress_health_check=list(HealthCheck))

REAL_KEYS = ["name", "parameters", "points", "planar_bodies", "relative_coordinates", "gravity", "sliders",
             "actuators", "sensors", "assembly_modes", "x", "y", "fixed", "length", "mass", "I0", "cog", "type",
             "point", "line", "line_points", "coordinate", "joint", "sigma", "body", "joint_angles", "bodies", "value",
             "gear_ratio", "rotor_inertia"]
WORDS = ["auto", "L", "x1", "y1", "length", "mass", "length12", "pi", "sin(", "cos(0)", "sqrt(-1)", "1/0", "9^9^9",
         "RelativeAngleAbsoluteDOF", "fixed", "mobile", "encoder", "gyroscope", "crank", "theta0", "__import__",
         "(1/3)*mass*length^2", "0.5*length", "-", "^", "*", " ", "1e308", "nan", "inf", "\u2217"]


def check(text):
    """The contract: a consistent MechanismSpec, or a one-line MechanismError naming the file."""
    try:
        spec = load_spec_from_string(text, SOURCE)
    except MechanismError as exc:
        msg = str(exc)
        assert msg.startswith(SOURCE + ": "), msg
        assert "\n" not in msg and "\r" not in msg, msg
        assert "internal error" not in msg, msg
        return None
    assert isinstance(spec, MechanismSpec)
    assert spec.points and spec.bodies
    numbers = [v for p in spec.points for v in (p.x, p.y)] + list(spec.gravity)
    for b in spec.bodies:
        assert b.length > 0 and b.mass > 0 and b.I0 > 0
        numbers += [b.length, b.mass, b.I0, *b.cog]
        assert len(b.points) >= 2 and len(set(b.points)) == len(b.points)
        assert all(0 <= i < len(spec.points) for i in b.points)
        assert not all(spec.points[i].fixed for i in b.points)
    assert all(math.isfinite(v) for v in numbers)
    names = coordinate_names(spec)
    assert len(names) == len(set(names))
    assert all(a.coordinate in names for a in spec.actuators)
    assert all(j.child_angle in names and j.parent_angle in names + [None] and math.isfinite(j.offset)
               for j in spec.joint_angles)
    assert all(a.gear_ratio != 0 and a.rotor_inertia >= 0 and a.stator_angle in names + [None] for a in spec.actuators)
    assert all(e.coordinate in names and e.sigma > 0 for e in spec.encoders)
    assert all(0 <= g.body < len(spec.bodies) and g.sigma > 0 for g in spec.gyroscopes)
    return spec


# ------------------------------------------------------------------------------------------------
# (a) random text and random YAML-ish trees
# ------------------------------------------------------------------------------------------------

@FUZZ
@given(st.text(max_size=300))
def test_random_text(text):
    check(text)


@FUZZ
@given(st.lists(st.sampled_from(["{", "}", "[", "]", ":", "-", ",", " ", "\n", "  ", "#", "&a", "*a", "!!str",
                                 "!!python/object:os.system", "'", '"', "?", "|", ">", "%YAML 1.2", "---", "...",
                                 "2001-13-45", "0x1F", "~", "null", "true", "1.5", "-3", ".nan", ".inf"]
                                + REAL_KEYS + WORDS), max_size=60))
def test_random_token_soup(tokens):
    check("".join(tokens))


scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-20, 20), st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(WORDS), st.text(max_size=12),
)
keys = st.one_of(st.sampled_from(REAL_KEYS), st.text(max_size=6), st.integers(-2, 5), st.booleans())
trees = st.recursive(
    scalars,
    lambda children: st.one_of(st.lists(children, max_size=5), st.dictionaries(keys, children, max_size=6)),
    max_leaves=40,
)


@FUZZ
@given(trees)
def test_random_trees(tree):
    check(yaml.safe_dump(tree))


@st.composite
def plausible_documents(draw):
    """Random mechanisms that are mostly valid (points in range, positive masses, ...), so that the deep
    checks (geometry, names, sensors, sliders, assembly modes) are reached; mutated further below."""
    n = draw(st.integers(2, 6))
    points = []
    for i in range(n):
        p = {"x": draw(st.integers(-3, 6)), "y": draw(st.integers(-3, 6))}
        if i == 0 or draw(st.integers(0, 4)) == 0:
            p["fixed"] = True
        if draw(st.integers(0, 5)) == 0:
            p["name"] = draw(st.sampled_from(["A", "B", "tip"]))
        points.append(p)
    bodies = []
    for b in range(draw(st.integers(1, 4))):
        k = draw(st.integers(2, min(4, n)))
        idx = draw(st.permutations(range(n)))[:k]
        body = {"points": list(idx), "mass": draw(st.sampled_from([1, 2.5, "2*1"])),
                "I0": draw(st.sampled_from(["mass*length^2", "(1/3)*mass*length^2", 1])),
                "cog": draw(st.sampled_from([["0.5*length", 0], [0, 0], [1, -1]]))}
        if k == 2 or draw(st.booleans()):
            body["length"] = draw(st.sampled_from(["auto", "auto", 1, "sqrt(2)"]))
        if draw(st.integers(0, 3)) == 0:
            body["name"] = draw(st.sampled_from(["crank", "rod", "body1"]))
        bodies.append(body)
    doc = {"points": points, "planar_bodies": bodies}
    if draw(st.booleans()):
        doc["parameters"] = {"L": draw(st.sampled_from([1, "sqrt(2)", "pi/2"])), "M": "2*L"}
    coords = [f"{c}{i}" for i, p in enumerate(points) if not p.get("fixed") for c in "xy"]
    rel = []
    for k in range(draw(st.integers(0, 2))):
        body = draw(st.sampled_from(bodies))
        entry = {"type": "RelativeAngleAbsoluteDOF", "points": body["points"][:2]}
        if draw(st.booleans()):
            entry["name"] = draw(st.sampled_from(["crank", "motor", "theta0"]))
        rel.append(entry)
        coords.append(entry.get("name", f"theta{k}"))
    if rel:
        doc["relative_coordinates"] = rel
    joints = []
    for k in range(draw(st.integers(0, 2))):
        ends = [draw(st.sampled_from(["ground", 0, len(bodies) - 1, "crank", "rod", "nope"])) for _ in range(2)]
        entry = {"bodies": ends}
        if draw(st.booleans()):
            entry["name"] = draw(st.sampled_from(["elbow", "crank", "theta_crank", "x1"]))
        if draw(st.booleans()):
            entry["value"] = draw(st.sampled_from([0, "pi/2", "-1e308*10", "nope"]))
        joints.append(entry)
        coords.append(entry.get("name", f"joint{k}"))
    if joints:
        doc["joint_angles"] = joints
    coordinate = st.sampled_from(coords + ["x0", "nope"])
    if draw(st.booleans()):
        doc["gravity"] = [0, draw(st.sampled_from([-9.81, 0, "-g"]))]
    if draw(st.booleans()):
        doc["actuators"] = [{"coordinate": draw(coordinate)} for _ in range(draw(st.integers(1, 2)))]
        for actuator in doc["actuators"]:
            if draw(st.booleans()):
                actuator[draw(st.sampled_from(["gear_ratio", "rotor_inertia"]))] = draw(
                    st.sampled_from([6, -6, 0, 1e-4, -1, "nope"]))
    if draw(st.booleans()):
        sensors = []
        for _ in range(draw(st.integers(1, 3))):
            if draw(st.booleans()):
                sensors.append({"type": "encoder", "coordinate": draw(coordinate), "sigma": 0.01})
            else:
                sensors.append({"type": "gyroscope", "body": draw(st.integers(0, len(bodies))), "sigma": 0.01})
        doc["sensors"] = sensors
    if draw(st.booleans()):
        sliders = []
        for _ in range(draw(st.integers(1, 2))):
            p = draw(st.integers(0, n - 1))
            if draw(st.booleans()):
                y = points[p]["y"]
                sliders.append({"type": "fixed", "point": p, "line": [[-5, y], [draw(st.sampled_from([5, -5])), y]]})
            else:
                sliders.append({"type": "mobile", "point": p, "line_points": draw(st.permutations(range(n)))[:2]})
        doc["sliders"] = sliders
    if draw(st.booleans()):
        doc["assembly_modes"] = [{"points": draw(st.permutations(range(n)))[:3]}
                                 for _ in range(draw(st.integers(1, 2)))]
    if draw(st.booleans()):
        doc["name"] = "mech"
    return doc


# ------------------------------------------------------------------------------------------------
# (b) mutations of the shipped files
# ------------------------------------------------------------------------------------------------

def _paths(node, prefix=()):
    """Every (container path, key) in a document."""
    out = []
    if isinstance(node, dict):
        for k, v in node.items():
            out.append(prefix + (k,))
            out += _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.append(prefix + (i,))
            out += _paths(v, prefix + (i,))
    return out


def _junk():
    return st.one_of(scalars, st.lists(scalars, max_size=3), st.dictionaries(keys, scalars, max_size=3))


def mutate(doc, data, min_mutations=1):
    """Apply 1-3 random structural mutations to a YAML document in place."""
    for _ in range(data.draw(st.integers(min_mutations, 3), label="mutations")):
        paths = _paths(doc)
        if not paths:
            break
        path = data.draw(st.sampled_from(paths), label="path")
        parent = doc
        for k in path[:-1]:
            parent = parent[k]
        key = path[-1]
        action = data.draw(st.sampled_from(["delete", "junk", "wrap", "stringify", "mapify", "duplicate",
                                            "negate", "swap"]), label="action")
        value = parent[key]
        if action == "delete":
            del parent[key]
        elif action == "junk":
            parent[key] = data.draw(_junk(), label="junk")
        elif action == "wrap":
            parent[key] = [value]
        elif action == "stringify":
            parent[key] = str(value)
        elif action == "mapify":
            parent[key] = {"value": value}
        elif action == "duplicate" and isinstance(parent, list):
            parent.append(copy.deepcopy(value))
        elif action == "negate" and isinstance(value, (int, float)) and not isinstance(value, bool):
            parent[key] = -value
        elif action == "negate" and isinstance(value, str):
            parent[key] = f"-({value})"
        elif action == "swap" and isinstance(parent, list) and len(parent) > 1:
            other = data.draw(st.integers(0, len(parent) - 1), label="other")
            parent[key], parent[other] = parent[other], parent[key]


@FUZZ
@given(st.sampled_from(sorted(SHIPPED_DOCS)), st.data())
def test_mutated_shipped_documents(name, data):
    doc = copy.deepcopy(SHIPPED_DOCS[name])
    mutate(doc, data)
    check(yaml.safe_dump(doc, sort_keys=False))


@FUZZ
@given(plausible_documents(), st.data())
def test_plausible_documents(doc, data):
    mutate(doc, data, min_mutations=0)
    check(yaml.safe_dump(doc, sort_keys=False))


@FUZZ
@given(st.sampled_from(sorted(SHIPPED_TEXT)), st.data())
def test_mutated_shipped_text(name, data):
    text = SHIPPED_TEXT[name]
    for _ in range(data.draw(st.integers(1, 4), label="edits")):
        pos = data.draw(st.integers(0, len(text)), label="pos")
        kind = data.draw(st.sampled_from(["insert", "delete", "replace"]), label="kind")
        snippet = data.draw(st.one_of(st.sampled_from(["\n", " ", ":", "-", "[", "]", "{", "}", "*", "^", "0",
                                                       "#", "'", "\t"] + WORDS),
                                      st.text(max_size=4)), label="snippet")
        n = data.draw(st.integers(1, 8), label="n")
        if kind == "insert":
            text = text[:pos] + snippet + text[pos:]
        elif kind == "delete":
            text = text[:pos] + text[pos + n:]
        else:
            text = text[:pos] + snippet + text[pos + n:]
    check(text)


def test_unmutated_shipped_files_pass_the_contract():
    for name, text in SHIPPED_TEXT.items():
        assert check(text) is not None, name
