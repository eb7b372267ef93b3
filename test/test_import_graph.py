"""The package's import graph has no circle: every import of one of its modules (at the top of a module or inside
a function, a package's ``__init__`` included; not those under ``if TYPE_CHECKING:``, which never run) read with
`ast` from the sources."""

import ast
from pathlib import Path
from typing import Dict, List, Set

PACKAGE = Path(__file__).resolve().parents[1] / "mbfg_ros"


def _module_names(root: Path) -> Dict[str, Path]:
    out = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _run_nodes(tree: ast.AST):
    """The nodes of `tree` but those under ``if TYPE_CHECKING:``."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
        else:
            todo.extend(ast.iter_child_nodes(node))


def _imported(tree: ast.AST, name: str, is_package: bool, modules: Dict[str, Path]) -> Set[str]:
    """The package's modules that module `name` imports (a module inside a package imports the package's
    ``__init__`` first; the ancestors of `name` itself are not counted: they are loading already)."""
    here = name if is_package else name.rpartition(".")[0]
    targets = set()
    for node in _run_nodes(tree):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets.add(base)
            targets.update(f"{base}.{alias.name}" for alias in node.names)
    ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    out = set()
    for target in targets:
        parts = target.split(".")
        for i in range(1, len(parts) + 1):       # the target and the packages it is in
            prefix = ".".join(parts[:i])
            if prefix in modules and prefix not in ancestors and prefix != name:
                out.add(prefix)
    return out


def import_graph(root: Path = PACKAGE) -> Dict[str, Set[str]]:
    modules = _module_names(root)
    return {name: _imported(ast.parse(path.read_text(encoding="utf-8")), name, path.name == "__init__.py", modules)
            for name, path in modules.items()}


def circles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """One circle per strongly connected group of more than one module (Tarjan's algorithm), as a path."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def test_the_package_has_no_import_circle():
    graph = import_graph()
    assert len(graph) > 50 and graph["mbfg_ros.graph.step_model"] >= {"mbfg_ros.native", "mbfg_ros.factors.base"}
    assert circles(graph) == []


def test_a_circle_is_found(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub import b\n")
    (pkg / "a.py").write_text("def f():\n    from pkg.sub.b import g\n")
    (pkg / "sub" / "b.py").write_text("from .. import c\n")
    (pkg / "c.py").write_text("import pkg.a\n")
    (pkg / "d.py").write_text("from pkg import c\n")
    (pkg / "e.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.f\n")
    (pkg / "f.py").write_text("import pkg.e\n")
    assert circles(import_graph(pkg)) == [["pkg.a", "pkg.c", "pkg.sub", "pkg.sub.b"]]
