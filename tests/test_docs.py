"""README and docs/ stay true to the tree: links resolve, the layout table (docs/architecture.md) is whole,
cli.md is current."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

import exactspec

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = Path(exactspec.__file__).parent
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def local_links(document: Path) -> list[str]:
    """Relative link targets of a Markdown file (web links and in-page anchors left out)."""
    targets = []
    for target in LINK.findall(document.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        targets.append(target.split("#", 1)[0])
    return targets


def broken_links(document: Path) -> list[str]:
    return [t for t in local_links(document) if not (document.parent / t).exists()]


def test_broken_link_check_finds_a_planted_broken_link(tmp_path: Path) -> None:
    (tmp_path / "there.md").write_text("x")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md) [web](https://example.org) [anchor](#a) [gone](missing/report.md#x)")
    assert broken_links(page) == ["missing/report.md"]


def test_every_linked_file_exists() -> None:
    assert len(documents()) > 5
    broken = {str(d.relative_to(ROOT)): broken_links(d) for d in documents() if broken_links(d)}
    assert not broken, broken


def layout_table() -> dict[str, set[str]]:
    """The layout table (docs/architecture.md): folder -> the module names its row lists."""
    section = (ROOT / "docs" / "architecture.md").read_text().split("## Layout", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and (folder := re.fullmatch(r"`(\w+(?:/\w+)*)/`", cells[0])):
            rows[folder.group(1)] = set(re.findall(r"`(\w+)`", cells[1]))
    return rows


def test_the_layout_table_names_every_module() -> None:
    table = layout_table()
    packages = [p.parent for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE]
    for folder in sorted(packages):
        name = folder.relative_to(PACKAGE).as_posix()
        modules = {p.stem for p in folder.glob("*.py")} - {"__init__"}
        assert name in table, f"docs/architecture.md's layout table has no row for {name}/"
        listed = table[name]
        assert modules == listed, f"{name}/: missing {modules - listed}, gone {listed - modules}"


def test_cli_reference_is_current(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/cli.md is what `scripts/cli_reference.py` writes from this tree's parsers.

    In-process (the script's own `reference()`, at its fixed width): a subprocess would import the
    `exactspec` that is installed, which in a second worktree is another tree's.
    """
    spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "scripts" / "cli_reference.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setenv("COLUMNS", script.WIDTH)  # reference() sets it too; monkeypatch puts it back
    assert script.DOC == ROOT / "docs" / "cli.md"
    current = script.reference()
    assert script.DOC.read_text() == current, "out of date: run python scripts/cli_reference.py"


def test_bench_index_lists_every_report_folder() -> None:
    bench = ROOT / "docs" / "bench"
    listed = {target.split("/", 1)[0] for target in local_links(bench / "README.md")}
    folders = {p.name for p in bench.iterdir() if p.is_dir()}
    assert folders == listed, f"unlisted: {sorted(folders - listed)}, gone: {sorted(listed - folders)}"
    assert not [p.name for p in bench.iterdir() if p.suffix == ".py"], "scripts belong in scripts/"
