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


LAYERS = {
    "foundations": 0,  # settings, transforms, sampler, rows, costs, metrics, errors
    "kernels": 0,  # our own C kernels: int4 matmul, attention
    "artefacts": 1,  # files: the built-in pair, conversion cache, locks, staging, cleanup
    "verifiers": 1,  # pure verification rules
    "models": 2,  # backends behind LanguageModel, ModelPair
    "drafters": 3,  # proposers of draft tokens (over models)
    "peers": 3,  # other engines run as their users run them
    "decoding": 4,  # engine, scheduler, gamma policies, the builder
    "checking": 5,  # exact enumeration and the verify grid, over the decoding layer
    "api": 5,  # SpeculativeDecoder
    "bench": 6,
    "audit": 6,
    "server": 6,
    "batch": 7,
    "cli": 8,  # reaches every other folder
}
"""Each folder's layer: a module may import its own folder and folders of a lower layer only."""


def layer_violations(graph: dict[str, set[str]], layers: dict[str, int]) -> list[str]:
    """Every import from one folder into a folder of the same or a higher layer (or an unlisted one)."""

    def folder(module: str) -> str | None:
        parts = module.split(".")
        return parts[1] if len(parts) >= 2 else None  # None: the package's own top-level modules

    found = []
    for module, targets in sorted(graph.items()):
        source = folder(module)
        if source is None or source.startswith("__"):
            continue  # exactspec/__init__.py and __main__.py are the entry points: they may import anything
        for target in sorted(targets):
            into = folder(target)
            if into is None or into == source:
                continue
            if source not in layers or into not in layers or layers[into] >= layers[source]:
                found.append(f"{module} -> {target}")
    return found


def test_layer_check_finds_planted_violations() -> None:
    layers = {"low": 0, "high": 1, "side": 1}
    graph = {
        "exactspec.low.a": {"exactspec.high.b"},  # upwards
        "exactspec.high.b": {"exactspec.low.a", "exactspec.side.c"},  # down: fine; sideways: not
        "exactspec.side.c": {"exactspec.side.d"},  # own folder: fine
        "exactspec.side.d": set(),
        "exactspec.new.e": set(),  # an unlisted folder importing nothing: fine
        "exactspec.new.f": {"exactspec.low.a"},  # an unlisted folder importing: must be placed
    }
    assert layer_violations(graph, layers) == [
        "exactspec.high.b -> exactspec.side.c",
        "exactspec.low.a -> exactspec.high.b",
        "exactspec.new.f -> exactspec.low.a",
    ]


def test_folders_import_only_lower_layers() -> None:
    graph = import_graph()
    folders = {name.split(".")[1] for name in graph if name.count(".") >= 1} - {"__main__"}
    assert folders <= set(LAYERS), f"place the new folders in LAYERS: {sorted(folders - set(LAYERS))}"
    assert layer_violations(graph, LAYERS) == []
