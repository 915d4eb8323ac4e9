"""The package's layout: no import cycles between its modules, and every role in its own folder."""

from __future__ import annotations

import ast
from pathlib import Path

import exactspec

PACKAGE = Path(exactspec.__file__).parent


def module_name(path: Path) -> str:
    parts = ["exactspec", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports (any import statement at any depth counts)."""
    paths = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                found = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            else:
                continue
            for target in found:
                while target and target not in paths:  # `from a.b import name`: the module is a.b
                    target = target.rpartition(".")[0]
                if target and target != name:
                    targets.add(target)
        graph[name] = targets
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules, or None (depth-first search with colours)."""
    colour = dict.fromkeys(graph, 0)  # 0 unvisited, 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        colour[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if colour[nxt] == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if colour[nxt] == 0 and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        colour[node] = 2
        return None

    for node in sorted(graph):
        if colour[node] == 0 and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_finds_a_planted_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_package_has_no_import_cycle() -> None:
    graph = import_graph()
    assert len(graph) > 40  # the walk really saw the package
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_top_level_holds_only_the_package_entry_points() -> None:
    """Every role lives in a folder; the top level is the public API and `python -m exactspec`."""
    assert sorted(p.name for p in PACKAGE.glob("*.py")) == ["__init__.py", "__main__.py"]


def test_artefacts_import_only_the_foundations() -> None:
    """Files on disk sit below the models: `models` asks `artefacts` for files, never the reverse."""
    allowed = ("exactspec.artefacts", "exactspec.foundations")
    graph = import_graph()
    artefacts = [name for name in graph if name.startswith("exactspec.artefacts")]
    assert "exactspec.artefacts.default_pair" in artefacts  # the walk really saw the folder
    outside = {name: sorted(t for t in graph[name] if not t.startswith(allowed)) for name in artefacts}
    assert not any(outside.values()), outside
