"""The documents against the code: every parameter the estimator node and the plant declare is in
docs/ros2_interfaces.md's tables with its run-time column right (and the tables name no parameter the nodes do
not have); every diagnostics key the node reports is in its diagnostics table; every relative link of the README
and docs/ resolves (file and heading), and every repository file and `bench/` option they name exists."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List

import pytest

from ros_helpers import CONFIG, fresh_domain_id, joint_state, rclpy_available

REPO = Path(__file__).resolve().parents[1]
INTERFACES = REPO / "docs" / "ros2_interfaces.md"
DOCUMENTS = [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md"))

needs_rclpy = pytest.mark.skipif(not rclpy_available(), reason="rclpy and the ROS 2 messages are not installed")


# -- reading the markdown ---------------------------------------------------------------------------------
def section(path: Path, heading: str) -> str:
    """The text under the heading `heading` (a line '#... heading'), up to the next heading of its level or above."""
    lines = path.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"(#+) (.*)", line)
        if m and m.group(2).strip() == heading:
            level = len(m.group(1))
            body = []
            for rest in lines[i + 1:]:
                h = re.match(r"(#+) ", rest)
                if h and len(h.group(1)) <= level:
                    break
                body.append(rest)
            return "\n".join(body)
    raise AssertionError(f"{path.name}: no heading '{heading}'")


def table_rows(text: str, first_column: str) -> List[Dict[str, str]]:
    """The rows of the markdown table whose header's first cell is `first_column`, as {header: cell}."""
    rows, header = [], None
    for line in text.splitlines():
        if not line.startswith("|"):
            if header is not None and rows:
                break
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if header is None:
            if cells and cells[0] == first_column:
                header = cells
            continue
        if set("".join(cells)) <= set("-: "):
            continue
        rows.append(dict(zip(header, cells)))
    assert rows, f"no table headed '{first_column}'"
    return rows


def code_spans(cell: str) -> List[str]:
    return [s.replace("\\|", "|") for s in re.findall(r"`([^`]+)`", cell)]


def documented_parameters(heading: str) -> Dict[str, str]:
    """{parameter name as written: its 'run time' cell} of the parameter table under `heading`."""
    return {code_spans(r["parameter"])[0]: r["run time"]
            for r in table_rows(section(INTERFACES, heading), "parameter")}


def declared_parameters(make_node, ros_args: List[str], keep=("use_sim_time",)) -> Dict[str, bool]:
    """{name: read_only} of the parameters of the node `make_node(context=...)` builds in this process with
    `ros_args`, without those every rclpy node declares by itself (use_sim_time, and more in newer
    distributions) except `keep`."""
    import rclpy
    from rclpy.context import Context
    from rclpy.node import Node
    ctx = Context()
    rclpy.init(args=["--ros-args", *ros_args], context=ctx, domain_id=fresh_domain_id())
    try:
        bare = Node("mbfg_docs_bare", context=ctx, start_parameter_services=False)
        own = set(bare._parameters) - set(keep)
        bare.destroy_node()
        node = make_node(context=ctx)
        try:
            return {name: bool(node.describe_parameter(name).read_only)
                    for name in node._parameters if name not in own}
        finally:
            node.destroy_node()
    finally:
        rclpy.shutdown(context=ctx)


# -- parameters ------------------------------------------------------------------------------------------
@needs_rclpy
def test_every_estimator_parameter_is_documented_with_its_run_time_column():
    """The node built from config/four_bar.yaml in this process: each parameter it declares (sensor_sigmas.*
    through the `sensor_sigmas.<sensor>` row, effort_shares.* through `effort_shares.<joint>`, qos_overrides.* through theirs) is a row of the parameter table,
    'no' exactly for the read-only ones; each row is a parameter the node has."""
    from mbfg_ros.ros.node import EstimatorNode
    params = declared_parameters(EstimatorNode, ["--params-file", str(CONFIG), "-p", "publish_markers:=false"])
    docs = documented_parameters("Parameters")
    assert "use_sim_time" in params and "sensor_sigmas.crank" in params and "sigmas.effort_density" in params

    def row_of(name: str) -> str:
        if name in docs:
            return name
        if name.startswith("sensor_sigmas."):
            return "sensor_sigmas.<sensor>"
        if name.startswith("effort_shares."):
            return "effort_shares.<joint>"
        if name.startswith("actuator_delays."):
            return "actuator_delays.<joint>"
        if name.startswith("actuator_time_constants."):
            return "actuator_time_constants.<joint>"
        if name.startswith("actuator_effort_sigmas."):
            return "actuator_effort_sigmas.<joint>"
        if name.startswith("qos_overrides."):
            return "qos_overrides.<topic>.<publisher|subscription>.<policy>"
        raise AssertionError(f"parameter '{name}' of the estimator node is not in docs/ros2_interfaces.md's "
                             f"parameter table")
    used = set()
    for name, read_only in params.items():
        row = row_of(name)
        used.add(row)
        if name == "use_sim_time" or name.startswith("qos_overrides."):
            continue          # rclpy's own: documented, their descriptors are rclpy's
        run_time = docs[row].rstrip("*")
        assert run_time in ("yes", "no"), (row, docs[row])
        assert (run_time == "no") == read_only, (
            f"'{name}' is {'read-only' if read_only else 'changeable at run time'}, the table says {docs[row]}")
    assert not set(docs) - used - {"qos_overrides.<topic>.<publisher|subscription>.<policy>"}, (
        f"documented but not declared by the node: {sorted(set(docs) - used)}")


@needs_rclpy
def test_every_plant_parameter_is_documented_with_its_run_time_column():
    """four_bar_sim built in this process: its parameters are the plant's table's rows; 'no' for the
    read-only ones, 'no†' (read once at start) for the others that the plant does not apply at run time."""
    from mbfg_ros.ros.sim_node import SimNode
    params = declared_parameters(SimNode, ["-p", "lookahead:=0.0"], keep=())
    docs = documented_parameters("The simulated plant (`four_bar_sim`)")
    assert set(params) == set(docs), (f"declared, not documented: {sorted(set(params) - set(docs))}; "
                                      f"documented, not declared: {sorted(set(docs) - set(params))}")
    for name, read_only in params.items():
        assert docs[name] in ("no", "no†") and (docs[name] == "no") == read_only, (name, docs[name], read_only)


# -- diagnostics -----------------------------------------------------------------------------------------
@needs_rclpy
def test_every_diagnostics_key_is_documented():
    """The key/values of the node's /diagnostics status after a first estimate (estimation mode, so the online
    effort density is reported too, and an identified parameter) are all in the diagnostics table (input.*,
    rejected.* and parameter.* by their rows)."""
    import rclpy
    from rclpy.context import Context
    from rclpy.serialization import serialize_message
    from mbfg_ros.ros import node as N
    ctx = Context()
    rclpy.init(args=["--ros-args", "--params-file", str(CONFIG), "-p", "publish_markers:=false",
                     "-p", "mode:=estimation", "-p", "identify:=[crank.viscous_friction]"], context=ctx,
               domain_id=fresh_domain_id())
    node = N.EstimatorNode(context=ctx)
    try:
        node.on_observations(serialize_message(joint_state(node.now_ns(), ["crank"], [0.1])))
        node.after_batch()
        assert node.state == "running"
        keys = set(node.diagnostic_status()[1][4])
    finally:
        node.destroy_node()
        rclpy.shutdown(context=ctx)
    rows = table_rows(section(INTERFACES, "Diagnostics"), "key")
    documented = {s for r in rows for cell in r.values() for s in code_spans(cell)}
    stream_row = next(r for r in rows if any(s.startswith("input.") for s in code_spans(r["key"])))
    stream_suffixes = {s.lstrip(".").split(".")[-1] for s in code_spans(stream_row["key"])}
    kinds = {k for r in table_rows(section(INTERFACES, "Bad-input handling"), "kind") for k in code_spans(r["kind"])}
    assert "kernel" in keys and "effort_density" in keys and "parameter.crank.viscous_friction" in keys
    for key in keys:
        if key.startswith("input."):
            stream, suffix = key.split(".")[1], key.split(".")[-1]
            assert stream in ("observations", "efforts") and suffix in stream_suffixes, key
        elif key.startswith("rejected."):
            assert key[len("rejected."):] in kinds, key
        elif key.startswith("sensor_sigma."):
            assert "sensor_sigma.<encoder>" in documented, key
        elif key.startswith("parameter."):
            assert "parameter.<name>" in documented, key
        else:
            assert key in documented, f"diagnostics key '{key}' is not in docs/ros2_interfaces.md"


# -- links and named files -------------------------------------------------------------------------------
def github_anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return {github_anchor(m.group(1)) for m in re.finditer(r"^#+ (.*)$", text, flags=re.M)}


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda p: p.name)
def test_relative_links_resolve(doc):
    """Every [text](target) that is not a URL points at an existing file, and its #anchor at a heading there."""
    text = doc.read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    if doc.name == "README.md":
        assert links, "the README links to the docs"
    for target in links:
        if re.match(r"[a-z]+://|mailto:", target):
            continue
        file_part, _, anchor = target.partition("#")
        path = (doc.parent / file_part).resolve() if file_part else doc
        assert path.exists(), f"{doc.name}: link to {target}: no such file"
        if anchor:
            assert anchor in anchors(path), f"{doc.name}: link to {target}: no such heading in {path.name}"


REPO_PATH = re.compile(r"(?<![\w./-])((?:bench|docs|test|config|launch|mechanisms|mbfg_ros)/[\w./-]*[\w/])")


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda p: p.name)
def test_named_repository_files_exist(doc):
    """Every bench/, docs/, test/, config/, launch/, mechanisms/ and mbfg_ros/ path the document names exists
    (paths inside an installed share/mbfg_ros/ folder are the same files; placeholders such as `DIR` aside)."""
    text = doc.read_text(encoding="utf-8")
    missing = []
    for m in REPO_PATH.finditer(text):
        name = m.group(1).rstrip(".")
        if "<" in name or "*" in name:
            continue
        if not (REPO / name).exists():
            missing.append(name)
    assert not missing, f"{doc.name} names files that do not exist: {sorted(set(missing))}"


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda p: p.name)
def test_bench_options_exist(doc):
    """Each `--option` written after a bench script's name (up to the end of its code span) is one the script
    defines: a documented command line still runs."""
    text = doc.read_text(encoding="utf-8")
    for m in re.finditer(r"bench/(\w+)\.py([^`)\n;]*)", text):
        script = REPO / "bench" / f"{m.group(1)}.py"
        if not script.exists():
            continue      # test_named_repository_files_exist says so
        source = script.read_text(encoding="utf-8")
        for option in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", m.group(2)):
            assert f'"{option}"' in source, f"{doc.name}: {m.group(0).strip()}: bench/{script.name} has no {option}"


# -- the README's length ---------------------------------------------------------------------------------
README_MAX_BYTES = 25_000


def test_readme_stays_short():
    """The README is read in ten minutes: at most 25 KB; what does not fit goes to docs/ with a link."""
    size = len((REPO / "README.md").read_bytes())
    assert size <= README_MAX_BYTES, (
        f"README.md is {size} bytes, over {README_MAX_BYTES}: move detail to docs/ and link it")
