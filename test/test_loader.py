"""Tests of the mechanism YAML loader: shipped files, the paper's Listing 1, and every error kind."""

import copy
import math
import re
from pathlib import Path

import pytest
import yaml

from mbfg_ros.model.loader import coordinate_names, load_spec, load_spec_from_string
from mbfg_ros.model.spec import MechanismError, MechanismSpec

MECHANISMS = Path(__file__).resolve().parent.parent / "mechanisms"
SHIPPED = sorted(MECHANISMS.glob("*.yaml"))


# ------------------------------------------------------------------------------------------------
# Shipped files
# ------------------------------------------------------------------------------------------------

def test_shipped_files_exist():
    names = {p.name for p in SHIPPED}
    assert {"four_bar.yaml", "four_bar_crank.yaml", "slider_crank.yaml", "pick_and_place_robot.yaml",
            "pendulum.yaml", "pendulum_nary.yaml"} <= names


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_mechanism_loads(path):
    spec = load_spec(path)
    assert isinstance(spec, MechanismSpec)
    assert spec.source == str(path)
    assert spec.name
    assert len(spec.bodies) >= 1
    assert path.read_text().lstrip().startswith(("%YAML", "#")), "each file starts with a header comment"


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_mechanisms_are_consistent_at_the_file_pose(path):
    """Every declared length equals the drawn one, sliders lie on their lines, relative angles start defined."""
    spec = load_spec(path)
    P = [(p.x, p.y) for p in spec.points]
    for b in spec.bodies:
        (x0, y0), (x1, y1) = P[b.points[0]], P[b.points[1]]
        assert math.hypot(x1 - x0, y1 - y0) == pytest.approx(b.length, abs=1e-9)
    for s in spec.fixed_sliders:
        (ax, ay), (bx, by) = s.line
        px, py = P[s.point]
        assert abs((bx - ax) * (py - ay) - (by - ay) * (px - ax)) < 1e-9


def test_listing1_values():
    spec = load_spec(MECHANISMS / "four_bar.yaml")
    assert spec.name == "four_bar"
    assert [(p.x, p.y, p.fixed) for p in spec.points] == [
        (0.0, 0.0, True), (1.0, 0.0, False), (1.0, 2.0, False), (4.0, 0.0, True)]
    assert [b.points for b in spec.bodies] == [(0, 1), (1, 2), (2, 3)]
    lengths = [b.length for b in spec.bodies]
    assert lengths == pytest.approx([1.0, 2.0, math.sqrt(13.0)])
    assert [b.mass for b in spec.bodies] == [1.0, 2.0, 4.0]
    for b in spec.bodies:
        assert b.I0 == pytest.approx(b.mass * b.length ** 2 / 3.0)
        assert b.cog == pytest.approx((0.5 * b.length, 0.0))
    assert dict(spec.parameters) == {"L": 1.0, "xb": 4.0}
    assert spec.gravity == (0.0, -9.81)
    assert spec.relative_angles == () and spec.actuators == () and spec.encoders == ()
    assert coordinate_names(spec) == ["x1", "y1", "x2", "y2"]


def test_listing1_file_is_the_paper_listing():
    """The file is the paper's Listing 1 with ASCII '*': no extension keys added."""
    text = (MECHANISMS / "four_bar.yaml").read_text()
    assert "\u2217" not in text
    assert text.startswith("%YAML 1.2\n---\n# A four bars mecahnism\n")
    assert set(yaml.safe_load(text)) == {"parameters", "points", "planar_bodies"}
    assert "I0: (1/3)*mass*length^2" in text and "length: auto" in text


def test_listing1_with_unicode_asterisks_is_rejected_clearly():
    """The copy of Listing 1 pasted from the PDF (mbse PR #7) has U+2217; the message says what to do."""
    text = (MECHANISMS / "four_bar.yaml").read_text().replace("*", "\u2217")
    with pytest.raises(MechanismError) as info:
        load_spec_from_string(text, "FourBar.YAML")
    msg = str(info.value)
    assert msg.startswith("FourBar.YAML: points[2].y: ")
    assert "U+2217" in msg and "ASCII '*'" in msg


def test_four_bar_crank():
    spec = load_spec(MECHANISMS / "four_bar_crank.yaml")
    assert coordinate_names(spec) == ["x1", "y1", "x2", "y2", "crank"]
    assert spec.relative_angles[0].points == (0, 1)
    assert [(a.coordinate, a.joint) for a in spec.actuators] == [("crank", "crank")]
    assert [(e.name, e.coordinate, e.sigma) for e in spec.encoders] == [("crank", "crank", 0.001)]
    assert [(g.name, g.body, g.sigma) for g in spec.gyroscopes] == [("coupler_gyro", 1, 0.01)]
    assert [(m.name, m.points) for m in spec.assembly_modes] == [("elbow", (1, 2, 3))]
    assert [b.name for b in spec.bodies] == ["crank_link", "coupler", "rocker"]
    assert spec.points[0].name == "A" and spec.points[1].name is None


def test_slider_crank():
    spec = load_spec(MECHANISMS / "slider_crank.yaml")
    assert (spec.points[2].x, spec.points[2].y) == pytest.approx((5.0, 0.0))
    assert spec.bodies[0].length == pytest.approx(math.sqrt(2))
    assert spec.bodies[1].length == pytest.approx(math.sqrt(17))
    assert spec.fixed_sliders[0].point == 2
    assert spec.fixed_sliders[0].line == ((-5.0, 0.0), (10.0, 0.0))
    assert coordinate_names(spec) == ["x1", "y1", "x2", "y2", "crank"]
    assert spec.assembly_modes == ()


def test_pick_and_place_robot():
    spec = load_spec(MECHANISMS / "pick_and_place_robot.yaml")
    assert len(spec.points) == 14
    assert [i for i, p in enumerate(spec.points) if p.fixed] == [0, 1, 12, 13]
    assert len(spec.bodies) == 11
    names = coordinate_names(spec)
    assert len(names) == 22
    assert names.index("motor1") == 20 and names.index("motor2") == 21
    assert [r.points for r in spec.relative_angles] == [(1, 3), (12, 10)]
    assert [a.coordinate for a in spec.actuators] == ["motor1", "motor2"]
    assert [e.coordinate for e in spec.encoders] == ["motor1", "motor2"]
    ternary = spec.bodies[2]
    assert ternary.points == (2, 3, 4)
    assert ternary.length == pytest.approx(math.sqrt(0.5))
    assert ternary.I0 == pytest.approx(2 / 3)
    assert ternary.cog == pytest.approx((0.5 * math.sqrt(0.5), 0.0))
    platform = spec.bodies[5]
    assert platform.points == (5, 7, 6, 8)
    assert (platform.mass, platform.I0, platform.length) == pytest.approx((6.0, 11.375, 1.5))
    assert platform.cog == pytest.approx((0.75, -0.25))
    for k in (3, 4, 6, 7):
        assert spec.bodies[k].length == pytest.approx(math.sqrt(9.25))


def test_pendulums():
    p1 = load_spec(MECHANISMS / "pendulum.yaml")
    assert (p1.points[1].x, p1.points[1].y) == pytest.approx((math.sqrt(2), math.sqrt(2)))
    assert (p1.bodies[0].length, p1.bodies[0].mass) == (2.0, 5.0)
    p2 = load_spec(MECHANISMS / "pendulum_nary.yaml")
    assert len(p2.points) == 6 and len(p2.bodies) == 4
    disc = p2.bodies[1]
    assert disc.points == (1, 2, 3)
    assert disc.length == pytest.approx(5.0)
    assert disc.I0 == pytest.approx(37.5)
    assert disc.cog == (0.0, 0.0)
    assert [b.length for b in p2.bodies] == pytest.approx([7.0, 5.0, 2.0, 3.0])
    assert len(coordinate_names(p2)) == 10


# ------------------------------------------------------------------------------------------------
# Features
# ------------------------------------------------------------------------------------------------

def base():
    """A four-bar with every extension, as a plain dict (deep-copied per test)."""
    return copy.deepcopy({
        "name": "fb",
        "parameters": {"L": 1.0, "xb": "4*L"},
        "points": [
            {"x": 0, "y": 0, "fixed": True},
            {"x": "L", "y": 0},
            {"x": "L", "y": "2*L"},
            {"x": "xb", "y": 0, "fixed": True},
        ],
        "planar_bodies": [
            {"points": [0, 1], "length": "L", "mass": 1.0, "I0": "(1/3)*mass*length^2", "cog": ["0.5*length", 0]},
            {"points": [1, 2], "length": "2*L", "mass": 2.0, "I0": "(1/3)*mass*length^2", "cog": ["0.5*length", 0]},
            {"points": [2, 3], "length": "auto", "mass": 4.0, "I0": "(1/3)*mass*length^2",
             "cog": ["0.5*length", 0]},
        ],
        "relative_coordinates": [{"type": "RelativeAngleAbsoluteDOF", "points": [0, 1], "name": "crank"}],
        "gravity": [0, -9.81],
        "actuators": [{"coordinate": "crank"}],
        "sensors": [{"type": "encoder", "coordinate": "crank", "sigma": 0.001},
                    {"type": "gyroscope", "body": 1, "sigma": 0.01}],
        "assembly_modes": [{"name": "elbow", "points": [1, 2, 3]}],
    })


def load(doc, source="m.yaml"):
    return load_spec_from_string(yaml.safe_dump(doc, sort_keys=False), source)


def error(doc, source="m.yaml"):
    with pytest.raises(MechanismError) as info:
        if isinstance(doc, str):
            load_spec_from_string(doc, source)
        else:
            load(doc, source)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(source + ": ")
    assert "internal error" not in msg
    return msg


def test_base_document_loads():
    spec = load(base())
    assert spec.name == "fb"
    assert spec.points[3].x == 4.0
    assert coordinate_names(spec) == ["x1", "y1", "x2", "y2", "crank"]
    assert spec.gyroscopes[0].name == "gyro1"
    assert spec.encoders[0].name == "crank"
    assert [b.name for b in spec.bodies] == ["body0", "body1", "body2"]


def test_parameters_reference_earlier_parameters():
    doc = base()
    doc["parameters"] = {"a": 2, "b": "a*3", "c": "b^2 - a", "L": "c/34", "xb": "4*L"}
    spec = load(doc)
    assert dict(spec.parameters) == pytest.approx({"a": 2.0, "b": 6.0, "c": 34.0, "L": 1.0, "xb": 4.0})
    assert [name for name, _ in spec.parameters] == ["a", "b", "c", "L", "xb"]


def test_parameters_cannot_reference_later_parameters():
    doc = base()
    doc["parameters"] = {"a": "b", "b": 1}
    msg = error(doc)
    assert msg.startswith("m.yaml: parameters.a: ")
    assert "undefined name 'b'" in msg


def test_point_variables_available_to_later_points():
    doc = base()
    doc["points"][2] = {"x": "x1", "y": "y1 + 2"}
    spec = load(doc)
    assert (spec.points[2].x, spec.points[2].y) == (1.0, 2.0)
    doc = base()
    doc["points"][1] = {"x": "x2", "y": 0}
    assert "undefined name 'x2'" in error(doc)


def test_defaults_when_optional_sections_missing():
    doc = base()
    for key in ("name", "parameters", "relative_coordinates", "gravity", "actuators", "sensors", "assembly_modes"):
        doc.pop(key)
    doc["parameters"] = {"L": 1.0, "xb": 4.0}
    spec = load(doc, "some/dir/my_mech.yaml")
    assert spec.name == "my_mech"
    assert spec.gravity == (0.0, -9.81)
    assert load(doc, "<string>").name == "mechanism"


def test_gravity_expressions():
    doc = base()
    doc["gravity"] = ["-9.81*sin(deg2rad(30))", "-9.81*cos(deg2rad(30))"]
    spec = load(doc)
    assert spec.gravity == pytest.approx((-9.81 * 0.5, -9.81 * math.sqrt(3) / 2))


def test_nary_body_length_variables():
    doc = {
        "points": [{"x": 0, "y": 0, "fixed": True}, {"x": 2, "y": 0}, {"x": 2, "y": -1}, {"x": 0, "y": -1},
                   {"x": 3, "y": 0}],
        "planar_bodies": [
            {"points": [0, 1, 2, 3], "mass": 2, "I0": "(1/3)*mass*length12^2",
             "cog": ["0.5*length12", "-0.5*length14"]},
            # lengthIJ stay defined for later bodies, as in the reference implementation
            {"points": [1, 4], "length": "length12 - 1", "mass": 1, "I0": "length13", "cog": [0.5, 0]},
        ],
    }
    spec = load(doc)
    plate = spec.bodies[0]
    assert plate.length == 2.0
    assert plate.I0 == pytest.approx(8 / 3)
    assert plate.cog == pytest.approx((1.0, -0.5))
    assert spec.bodies[1].I0 == pytest.approx(math.sqrt(5))
    # an N-ary body may declare its length; it must match the drawn |p1 - p0|
    doc["planar_bodies"][0]["length"] = "auto"
    assert load(doc).bodies[0].length == 2.0
    doc["planar_bodies"][0]["length"] = 2.5
    msg = error(doc)
    assert msg.startswith("m.yaml: planar_bodies[0].length: ")
    assert "2.5" in msg and "drawn distance 2" in msg


def test_auto_inside_length_expression():
    doc = base()
    doc["planar_bodies"][2]["length"] = "auto*1"
    assert load(doc).bodies[2].length == pytest.approx(math.sqrt(13))


def test_point_index_expressions():
    doc = base()
    doc["planar_bodies"][0]["points"] = ["0", "2-1"]
    assert load(doc).bodies[0].points == (0, 1)
    doc["planar_bodies"][0]["points"] = [0, 1.0]
    assert load(doc).bodies[0].points == (0, 1)


def test_sliders():
    doc = {
        "points": [{"x": 0, "y": 0, "fixed": True}, {"x": 1, "y": 1}, {"x": 5, "y": 0},
                   {"x": 1, "y": -4, "fixed": True}, {"x": 1, "y": 4}],
        "planar_bodies": [
            {"points": [0, 1], "length": "auto", "mass": 1, "I0": 1, "cog": [0.5, 0]},
            {"points": [1, 2], "length": "auto", "mass": 1, "I0": 6, "cog": [1, 0]},
            {"points": [3, 4], "length": 8, "mass": 3, "I0": 64, "cog": [4, 0]},
        ],
        "sliders": [
            {"type": "fixed", "point": 2, "line": [[-5, 0], [10, 0]]},
            {"type": "mobile", "point": 1, "line_points": [3, 4], "name": "guide"},
        ],
    }
    spec = load(doc)
    assert spec.fixed_sliders[0].name == "slider0" and spec.fixed_sliders[0].point == 2
    assert spec.mobile_sliders[0].name == "guide" and spec.mobile_sliders[0].line_points == (3, 4)


def test_load_spec_from_path_and_string_agree(tmp_path):
    p = tmp_path / "fb.yaml"
    p.write_text(yaml.safe_dump(base()))
    a = load_spec(p)
    b = load_spec_from_string(p.read_text(), str(p))
    assert a == b


# ------------------------------------------------------------------------------------------------
# Errors: every message is "<file>: <key path>: <what is wrong>", on one line
# ------------------------------------------------------------------------------------------------

def test_error_mass_not_positive_example_from_the_docs():
    text = (MECHANISMS / "four_bar.yaml").read_text().replace("mass: 4.0", "mass: -4")
    msg = error(text, "four_bar.yaml")
    assert msg == "four_bar.yaml: planar_bodies[2].mass: must be > 0 (got -4)"


@pytest.mark.parametrize("key, value, path, fragment", [
    ("length", 0, "planar_bodies[0].length", "must be > 0 (got 0)"),
    ("length", -1, "planar_bodies[0].length", "must be > 0 (got -1)"),
    ("mass", 0, "planar_bodies[0].mass", "must be > 0 (got 0)"),
    ("I0", 0, "planar_bodies[0].I0", "must be > 0 (got 0)"),
    ("I0", "-mass", "planar_bodies[0].I0", "must be > 0 (got -1)"),
])
def test_error_non_positive_body_values(key, value, path, fragment):
    doc = base()
    doc["planar_bodies"][0][key] = value
    msg = error(doc)
    assert msg.startswith(f"m.yaml: {path}: ")
    assert fragment in msg


def test_error_parallel_axis():
    doc = base()
    doc["planar_bodies"][1]["I0"] = "0.2*mass*length^2"   # < mass*(length/2)^2
    msg = error(doc)
    assert msg.startswith("m.yaml: planar_bodies[1].I0: ")
    assert "parallel-axis" in msg and "I0 = 1.6" in msg and "mass*|cog|^2 = 2" in msg


def test_error_declared_length_differs_from_drawing():
    doc = base()
    doc["planar_bodies"][1]["length"] = 2.5
    msg = error(doc)
    assert msg.startswith("m.yaml: planar_bodies[1].length: ")
    assert "2.5" in msg and "drawn distance 2 " in msg


def test_length_tolerance():
    doc = base()
    doc["planar_bodies"][1]["length"] = 2.0 + 1e-7
    load(doc)


def test_error_missing_length_on_bar():
    doc = base()
    del doc["planar_bodies"][0]["length"]
    msg = error(doc)
    assert msg.startswith("m.yaml: planar_bodies[0]: ") and "missing required key 'length'" in msg


@pytest.mark.parametrize("key", ["mass", "I0", "cog", "points"])
def test_error_missing_body_keys(key):
    doc = base()
    del doc["planar_bodies"][2][key]
    msg = error(doc)
    assert msg.startswith("m.yaml: planar_bodies[2]: ") and f"missing required key '{key}'" in msg


def test_error_all_points_fixed():
    doc = base()
    doc["points"][1]["fixed"] = True
    msg = error(doc)
    assert msg.startswith("m.yaml: planar_bodies[0].points: ") and "all points of the body (0, 1) are fixed" in msg


def test_error_distance_between_two_fixed_points():
    doc = base()
    doc["planar_bodies"].append({"points": [0, 3, 1], "mass": 1, "I0": 1, "cog": [0, 0]})
    msg = error(doc)
    assert msg.startswith("m.yaml: planar_bodies[3].points: ")
    assert "points 0 and 3 are both fixed" in msg


def test_error_coincident_points():
    doc = base()
    doc["points"][2] = {"x": "L", "y": 0}
    msg = error(doc)
    assert msg.startswith("m.yaml: planar_bodies[1].points: ") and "points 1 and 2 coincide at (1, 0)" in msg


@pytest.mark.parametrize("points, fragment", [
    ([0], "at least 2 point indices"),
    ([], "at least 2 point indices"),
    ([1, 1], "point 1 is listed twice"),
    ([0, 7], "point index 7 out of range"),
    ([0, -1], "point index -1 out of range"),
    ([0, 1.5], "must be an integer (got 1.5)"),
    ([0, "1/2"], "must be an integer (got 0.5)"),
    ([0, True], "expected a point index; got boolean"),
    ([0, None], "got null"),
    ([0, [1]], "got list"),
    ("0, 1", "expected a list of point indices; got string"),
])
def test_error_body_point_lists(points, fragment):
    doc = base()
    doc["planar_bodies"][1]["points"] = points
    msg = error(doc)
    assert msg.startswith("m.yaml: planar_bodies[1].points")
    assert fragment in msg


def test_error_unknown_keys():
    doc = base()
    doc["planar_bodies"][1]["visual"] = {"type": "circle"}
    msg = error(doc)
    assert msg.startswith("m.yaml: planar_bodies[1].visual: unknown key 'visual' (allowed keys: points, length,")
    doc = base()
    doc["joints"] = []
    msg = error(doc)
    assert msg.startswith("m.yaml: joints: unknown key 'joints' (allowed keys: name, parameters, points,")
    doc = base()
    doc["points"][0]["z"] = 0
    assert error(doc).startswith("m.yaml: points[0].z: unknown key 'z'")
    doc = base()
    doc["sensors"][1]["coordinate"] = "crank"
    assert error(doc).startswith("m.yaml: sensors[1].coordinate: unknown key 'coordinate' (allowed keys: type, body,")


def test_error_non_string_key():
    msg = error("points: []\nplanar_bodies: []\n1: 2\n")
    assert msg.startswith("m.yaml: (document): key 1 is not a string")


def test_error_document_shape():
    assert "file is empty" in error("")
    assert "file is empty" in error("# only a comment\n")
    assert error("- 1\n- 2\n").startswith("m.yaml: (document): expected a map with keys name, parameters")
    assert "got string" in error("hello")
    assert error("points: []\n").startswith("m.yaml: (document): missing required key 'planar_bodies'")


def test_error_yaml_syntax():
    msg = error("points: [1, 2\nplanar_bodies: {")
    assert msg.startswith("m.yaml: YAML syntax error at line ")
    msg = error("a: 1\n---\nb: 2\n")
    assert "YAML syntax error" in msg and "single document" in msg
    msg = error("points: 2001-13-45\n")
    assert msg.startswith("m.yaml: YAML error: ") and "month" in msg


def test_error_duplicate_yaml_key():
    text = (MECHANISMS / "four_bar.yaml").read_text().replace("    mass: 2.0\n", "    mass: 2.0\n    mass: 3.0\n")
    msg = error(text, "four_bar.yaml")
    assert msg.startswith("four_bar.yaml: YAML error at line 41, column 5: found duplicate key 'mass'")


@pytest.mark.parametrize("where, value, path, fragment", [
    (("points",), {"x": 0}, "points", "expected a list of points; got map"),
    (("points",), [], "points", "at least 1 points"),
    (("points", 1), [1, 0], "points[1]", "expected a map with keys x, y, fixed, name; got list"),
    (("points", 1, "x"), None, "points[1].x", "got null"),
    (("points", 1, "x"), [1], "points[1].x", "got list"),
    (("points", 1, "x"), True, "points[1].x", "got boolean"),
    (("points", 0, "fixed"), "yes please", "points[0].fixed", "expected true or false; got string"),
    (("points", 0, "fixed"), 1, "points[0].fixed", "expected true or false; got number"),
    (("planar_bodies",), None, "planar_bodies", "expected a list of bodies; got null"),
    (("planar_bodies",), [], "planar_bodies", "at least 1 bodies"),
    (("planar_bodies", 0), "bar", "planar_bodies[0]", "expected a map"),
    (("planar_bodies", 0, "cog"), [0.5], "planar_bodies[0].cog", "expected exactly 2 coordinates"),
    (("planar_bodies", 0, "cog"), 0.5, "planar_bodies[0].cog", "expected a list of coordinates"),
    (("planar_bodies", 0, "cog", 1), "oops", "planar_bodies[0].cog[1]", "undefined name 'oops'"),
    (("planar_bodies", 0, "mass"), "1 +", "planar_bodies[0].mass", "bad syntax"),
    (("planar_bodies", 0, "mass"), "1/0", "planar_bodies[0].mass", "division by zero"),
    (("planar_bodies", 0, "mass"), "auto", "planar_bodies[0].mass", "undefined name 'auto'"),
    (("parameters",), [1, 2], "parameters", "expected a map of name: expression; got list"),
    (("gravity",), [0, -9.81, 0], "gravity", "expected exactly 2 components"),
    (("gravity",), "down", "gravity", "expected a list of components"),
    (("gravity", 1), "g", "gravity[1]", "undefined name 'g'"),
    (("name",), 42, "name", "expected a one-line, non-empty string"),
    (("name",), "", "name", "expected a one-line, non-empty string"),
    (("relative_coordinates",), {"type": "x"}, "relative_coordinates", "expected a list of relative coordinates"),
    (("sensors", 0, "sigma"), 0, "sensors[0].sigma", "must be > 0 (got 0)"),
    (("sensors", 1, "sigma"), -0.1, "sensors[1].sigma", "must be > 0 (got -0.1)"),
])
def test_error_wrong_types_and_values(where, value, path, fragment):
    doc = base()
    target = doc
    for key in where[:-1]:
        target = target[key]
    target[where[-1]] = value
    msg = error(doc)
    assert msg.startswith(f"m.yaml: {path}: "), msg
    assert fragment in msg, msg


@pytest.mark.parametrize("name", ["index", "auto", "length", "mass", "I0", "pi", "sin", "cos", "tan", "sqrt",
                                  "atan2", "deg2rad", "x1", "y12", "length12"])
def test_error_reserved_parameter_names(name):
    doc = base()
    doc["parameters"] = {"L": 1.0, "xb": 4.0, name: 1.0}
    msg = error(doc)
    assert msg.startswith(f"m.yaml: parameters.{name}: '{name}' is a reserved name")


def test_error_invalid_parameter_names():
    doc = base()
    doc["parameters"] = {"L": 1.0, "xb": 4.0, "2a": 1.0}
    assert error(doc).startswith("m.yaml: parameters.'2a': invalid parameter name")
    doc["parameters"] = {"L": 1.0, "xb": 4.0, 3: 1.0}
    assert "parameter name 3 is not a string" in error(doc)


def test_error_relative_coordinates():
    doc = base()
    doc["relative_coordinates"][0]["type"] = "RelativeAngleDOF"
    msg = error(doc)
    assert msg.startswith("m.yaml: relative_coordinates[0].type: unsupported type 'RelativeAngleDOF'")
    assert "RelativeAngleAbsoluteDOF" in msg

    doc = base()
    doc["relative_coordinates"][0]["points"] = [0, 2]
    msg = error(doc)
    assert msg.startswith("m.yaml: relative_coordinates[0].points: ")
    assert "do not belong to a common body" in msg

    doc = base()
    doc["relative_coordinates"][0]["points"] = [0, 3]
    assert "both fixed" in error(doc)

    doc = base()
    doc["relative_coordinates"][0]["points"] = [0, 1, 2]
    assert "expected exactly 2 point indices" in error(doc)

    doc = base()
    del doc["relative_coordinates"][0]["type"]
    assert error(doc).startswith("m.yaml: relative_coordinates[0]: missing required key 'type'")

    doc = base()
    doc["relative_coordinates"][0]["name"] = "x3"
    assert "looks like a point coordinate name" in error(doc)


def test_relative_coordinate_default_names():
    doc = base()
    doc["relative_coordinates"] = [{"type": "RelativeAngleAbsoluteDOF", "points": [0, 1]},
                                   {"type": "RelativeAngleAbsoluteDOF", "points": [2, 3]}]
    doc.pop("actuators"), doc.pop("sensors")
    assert coordinate_names(load(doc))[-2:] == ["theta0", "theta1"]


def test_error_duplicate_names():
    doc = base()
    doc["relative_coordinates"].append({"type": "RelativeAngleAbsoluteDOF", "points": [2, 3], "name": "crank"})
    msg = error(doc)
    assert msg.startswith("m.yaml: relative_coordinates[1].name: duplicate coordinate name 'crank'")
    assert "relative_coordinates[0].name" in msg

    doc = base()
    doc["planar_bodies"][0]["name"] = "bar"
    doc["planar_bodies"][2]["name"] = "bar"
    assert error(doc).startswith("m.yaml: planar_bodies[2].name: duplicate body name 'bar'")

    doc = base()
    doc["planar_bodies"][0]["name"] = "body1"   # collides with the default name of body 1
    assert "duplicate body name 'body1'" in error(doc)

    doc = base()
    doc["points"][1]["name"] = "P"
    doc["points"][2]["name"] = "P"
    assert error(doc).startswith("m.yaml: points[2].name: duplicate point name 'P'")

    doc = base()
    doc["sensors"][1]["name"] = "crank"   # the encoder's default name
    assert error(doc).startswith("m.yaml: sensors[1].name: duplicate sensor name 'crank'")

    doc = base()
    doc["assembly_modes"].append({"name": "elbow", "points": [0, 1, 2]})
    assert error(doc).startswith("m.yaml: assembly_modes[1].name: duplicate assembly mode name 'elbow'")

    doc = base()
    doc["actuators"].append({"coordinate": "x1", "joint": "crank"})
    assert error(doc).startswith("m.yaml: actuators[1].joint: duplicate joint name 'crank'")

    doc = base()
    doc["actuators"].append({"coordinate": "crank", "joint": "other"})
    assert error(doc).startswith("m.yaml: actuators[1].coordinate: duplicate actuated coordinate name 'crank'")


def test_error_invalid_names():
    doc = base()
    doc["sensors"][0]["name"] = "my sensor"
    assert error(doc).startswith("m.yaml: sensors[0].name: invalid name 'my sensor'")
    doc = base()
    doc["planar_bodies"][0]["name"] = 7
    assert error(doc).startswith("m.yaml: planar_bodies[0].name: expected a name (string); got number")


def test_error_actuators():
    doc = base()
    doc["actuators"][0]["coordinate"] = "theta"
    msg = error(doc)
    assert msg.startswith("m.yaml: actuators[0].coordinate: unknown coordinate 'theta'")
    assert "known: x1, y1, x2, y2, crank" in msg
    doc["actuators"][0]["coordinate"] = "x3"
    assert "point 3 is fixed" in error(doc)
    doc["actuators"][0] = {"coordinate": "x1", "joint": "push"}
    spec = load(doc)
    assert (spec.actuators[0].coordinate, spec.actuators[0].joint) == ("x1", "push")


def test_actuator_friction_keys():
    doc = base()
    spec = load(doc)
    assert (spec.actuators[0].viscous_friction, spec.actuators[0].coulomb_friction) == (0.0, 0.0)
    doc["actuators"][0].update({"viscous_friction": "2*L/1000", "coulomb_friction": 0.093 * math.pi / 2})
    a = load(doc).actuators[0]
    assert (a.viscous_friction, a.coulomb_friction, a.coulomb_velocity) == (0.002, 0.093 * math.pi / 2, 0.01)
    doc["actuators"][0]["coulomb_velocity"] = 0.5
    assert load(doc).actuators[0].coulomb_velocity == 0.5


@pytest.mark.parametrize("key, value, fragment", [
    ("viscous_friction", -0.1, "actuators[0].viscous_friction: must be >= 0 (got -0.1): friction opposes the motion"),
    ("coulomb_friction", "-L", "actuators[0].coulomb_friction: must be >= 0 (got -1)"),
    ("coulomb_friction", "1/0", "actuators[0].coulomb_friction: "),
    ("viscous_friction", [1], "actuators[0].viscous_friction: expected a number or an expression; got list"),
    ("coulomb_velocity", 0, "actuators[0].coulomb_velocity: must be > 0 (got 0)"),
    ("coulomb_velocity", None, "actuators[0].coulomb_velocity: expected a number or an expression; got null"),
    ("coulomb_frictions", 1, "actuators[0].coulomb_frictions: unknown key 'coulomb_frictions'"),
])
def test_error_actuator_friction(key, value, fragment):
    doc = base()
    doc["actuators"][0].update({"coulomb_friction": 0.2, key: value})
    assert fragment in error(doc)


def test_error_coulomb_velocity_without_coulomb_friction():
    doc = base()
    doc["actuators"][0].update({"viscous_friction": 0.1, "coulomb_velocity": 0.1})
    assert error(doc) == ("m.yaml: actuators[0].coulomb_velocity: smooths the Coulomb friction, but the actuator "
                          "has no 'coulomb_friction'")


def test_error_sensors():
    doc = base()
    doc["sensors"][0]["type"] = "camera"
    assert error(doc).startswith("m.yaml: sensors[0].type: unsupported sensor type 'camera' (allowed: encoder, "
                                 "gyroscope)")
    doc = base()
    del doc["sensors"][0]["type"]
    assert error(doc).startswith("m.yaml: sensors[0]: missing required key 'type'")
    doc = base()
    doc["sensors"][0]["coordinate"] = "nope"
    assert error(doc).startswith("m.yaml: sensors[0].coordinate: unknown coordinate 'nope'")
    doc = base()
    doc["sensors"][1]["body"] = 3
    assert error(doc).startswith("m.yaml: sensors[1].body: body index 3 out of range")
    doc = base()
    del doc["sensors"][1]["sigma"]
    assert error(doc).startswith("m.yaml: sensors[1]: missing required key 'sigma'")
    doc = base()
    del doc["sensors"][0]["sigma"]
    assert error(doc).startswith("m.yaml: sensors[0]: missing required key 'sigma' (the reading's standard "
                                 "deviation), or 'counts_per_turn'")
    for key, value, message in (("turns", "several", "sensors[0].turns: expected 'multi'"),
                                ("counts_per_turn", 1, "sensors[0].counts_per_turn: expected a whole number"),
                                ("counts_per_turn", 4096.5, "sensors[0].counts_per_turn: expected a whole number"),
                                ("counts_per_turn", True, "sensors[0].counts_per_turn: expected a whole number")):
        doc = base()
        doc["sensors"][0][key] = value
        assert error(doc).startswith("m.yaml: " + message), (key, value, error(doc))


def test_encoder_turns_and_resolution():
    """`turns` (default multi) and `counts_per_turn` (σ = one count / √12 when no sigma is given) of an angle
    encoder; a length cannot be single-turn nor have counts per turn."""
    doc = base()
    spec = load(doc, "m.yaml")
    assert [(e.turns, e.counts_per_turn) for e in spec.encoders] == [("multi", None)]
    doc["sensors"][0].update(turns="single", counts_per_turn=4096)
    del doc["sensors"][0]["sigma"]
    enc = load(doc, "m.yaml").encoders[0]
    assert (enc.turns, enc.counts_per_turn) == ("single", 4096)
    assert enc.sigma == pytest.approx(2 * math.pi / 4096 / math.sqrt(12))
    doc["sensors"][0]["sigma"] = 0.01                       # a given sigma wins
    assert load(doc, "m.yaml").encoders[0].sigma == 0.01
    for key, value in (("turns", "single"), ("counts_per_turn", 1000)):
        doc = base()
        doc["sensors"][0].update(coordinate="x1", **{key: value})
        assert f"sensors[0].{key}: coordinate 'x1' is a length" in error(doc)


def test_error_sliders():
    def slider_doc(slider):
        doc = base()
        doc["sliders"] = [slider]
        return doc

    msg = error(slider_doc({"type": "fixed", "point": 0, "line": [[0, 0], [1, 0]]}))
    assert msg.startswith("m.yaml: sliders[0].point: point 0 is fixed")
    msg = error(slider_doc({"type": "fixed", "point": 1, "line": [[1, 0], [1, 0]]}))
    assert msg.startswith("m.yaml: sliders[0].line: the two line points coincide")
    msg = error(slider_doc({"type": "fixed", "point": 1, "line": [[0, 1], [5, 1]]}))
    assert msg.startswith("m.yaml: sliders[0].point: point 1 at (1, 0) is 1 away from its line")
    msg = error(slider_doc({"type": "fixed", "point": 1, "line": [[0, 0], [5]]}))
    assert msg.startswith("m.yaml: sliders[0].line[1]: expected exactly 2 coordinates")
    msg = error(slider_doc({"type": "mobile", "point": 1, "line_points": [1, 2]}))
    assert msg.startswith("m.yaml: sliders[0].line_points: the slider point 1 cannot also define its own line")
    msg = error(slider_doc({"type": "mobile", "point": 1, "line_points": [2, 2]}))
    assert "point 2 is listed twice" in msg
    msg = error(slider_doc({"type": "mobile", "point": 2, "line_points": [0, 3]}))
    assert msg.startswith("m.yaml: sliders[0].point: point 2 at (1, 2) is 2 away from its line")
    msg = error(slider_doc({"type": "rail", "point": 1}))
    assert msg.startswith("m.yaml: sliders[0].type: unsupported slider type 'rail' (allowed: fixed, mobile)")
    msg = error(slider_doc({"point": 1}))
    assert msg.startswith("m.yaml: sliders[0]: missing required key 'type'")
    msg = error(slider_doc({"type": "fixed", "point": 1, "line_points": [0, 3]}))
    assert msg.startswith("m.yaml: sliders[0].line_points: unknown key 'line_points' (allowed keys: type, point, "
                          "line, name)")
    # a valid one: P1 on the X axis
    spec = load(slider_doc({"type": "mobile", "point": 1, "line_points": [0, 3]}))
    assert spec.mobile_sliders[0].line_points == (0, 3)


def test_error_assembly_modes():
    doc = base()
    doc["points"].append({"x": 2, "y": 0})
    doc["planar_bodies"].append({"points": [1, 4], "length": "auto", "mass": 1, "I0": 1, "cog": [0.5, 0]})
    doc["assembly_modes"] = [{"name": "flat", "points": [0, 1, 4]}]
    msg = error(doc)
    assert msg.startswith("m.yaml: assembly_modes[0].points: points 0, 1 and 4 are collinear")
    doc["assembly_modes"] = [{"name": "m", "points": [0, 1]}]
    assert "expected exactly 3 point indices" in error(doc)
    doc["assembly_modes"] = [{"name": "m", "points": [1, 2, 1]}]
    assert "point 1 is listed twice" in error(doc)
    doc["assembly_modes"] = [{"name": "m", "points": [1, 2, 9]}]
    assert "point index 9 out of range" in error(doc)
    doc["assembly_modes"] = [{"points": [1, 2, 3]}]
    assert load(doc).assembly_modes[0].name == "mode0"


def test_error_unreadable_files(tmp_path):
    with pytest.raises(MechanismError, match=r"nope\.yaml: cannot read file: No such file"):
        load_spec(tmp_path / "nope.yaml")
    with pytest.raises(MechanismError, match="cannot read file"):
        load_spec(tmp_path)
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"points: [\xff\xfe]\n")
    with pytest.raises(MechanismError, match=r"bad\.yaml: file is not valid UTF-8"):
        load_spec(bad)


def test_error_non_text_input():
    with pytest.raises(MechanismError, match="expected YAML text"):
        load_spec_from_string(None)
    with pytest.raises(MechanismError, match="expected YAML text"):
        load_spec_from_string(12)


def test_messages_are_single_line_for_multiline_values():
    doc = base()
    doc["planar_bodies"][0]["mass"] = "1 +\n\n 2 +"
    msg = error(doc)
    assert re.match(r"m\.yaml: planar_bodies\[0\]\.mass: bad syntax", msg)


def test_huge_center_of_mass_is_a_clear_error():
    """A cog far beyond floating-point squares (found by the fuzzer: cog x = 1.34e154) is reported by
    the parallel-axis check, not as an internal OverflowError."""
    doc = yaml.safe_load((Path(__file__).resolve().parent.parent / "mechanisms" / "pendulum.yaml").read_text())
    doc["planar_bodies"][0]["cog"][0] = 1.3407807929942597e+154
    with pytest.raises(MechanismError) as exc:
        load_spec_from_string(yaml.safe_dump(doc), "huge.yaml")
    assert "internal error" not in str(exc.value) and "parallel-axis" in str(exc.value)
