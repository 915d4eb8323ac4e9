"""The cache's inventory: every entry once, with its size and reader; companions go with their entry;
leftovers of killed processes and things that are not exactspec's are listed; names and globs pick
entries, and removing one leaves the rest (a fake cache of small files)."""

from __future__ import annotations

from pathlib import Path

from exactspec.artefacts.inventory import (
    KINDS,
    LEFTOVER,
    UNKNOWN,
    Kind,
    inventory,
    matching,
    remove,
    size_text,
)

EXPORTS = Kind("onnx-exported-v1/*", "onnx", "model exported to ONNX")
DEAD_PID = 2**22 + 7  # above Linux's pid_max: no process has it


def write(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    return path


def fake_cache(root: Path) -> None:
    write(root / "m.gguf", 1000)
    write(root / "m.gguf.lock", 0)
    write(root / "m.gguf.verified.json", 10)
    write(root / "gguf-converted-v1/m-sha256-ab/tokenizer/tokenizer.json", 30)
    write(root / "gguf-converted-v1/m-sha256-ab/float32/model.safetensors", 4000)
    write(root / "gguf-converted-v1/m-sha256-ab/float32/config.json", 5)
    write(root / "onnx-exported-v1/m-int4-b128-a4-cd/model.onnx.data", 700)
    write(root / "onnx-exported-v1/m-int4-b128-a4-cd.lock", 0)
    write(root / f"onnx-exported-v1/.m-int4-b32-a4-ef.tmp-{DEAD_PID}-xy/model.onnx", 300)
    write(root / "measurements/auto-1.json", 20)
    write(root / "notes.txt", 3)


def test_each_entry_is_listed_once_with_its_size_and_reader(tmp_path: Path) -> None:
    fake_cache(tmp_path)
    entries = {e.name: e for e in inventory(tmp_path, (*KINDS, EXPORTS))}
    assert entries["m.gguf"].size == 1010 and "llamacpp" in entries["m.gguf"].used_by
    assert entries["gguf-converted-v1/m-sha256-ab/tokenizer"].size == 30
    assert entries["gguf-converted-v1/m-sha256-ab/float32"].size == 4005
    assert entries["gguf-converted-v1/m-sha256-ab/float32"].used_by.startswith("hf")
    assert entries["onnx-exported-v1/m-int4-b128-a4-cd"].used_by == "onnx"
    assert entries["measurements"].size == 20
    assert entries[f"onnx-exported-v1/.m-int4-b32-a4-ef.tmp-{DEAD_PID}-xy"].what == LEFTOVER
    assert entries["notes.txt"].what == UNKNOWN
    assert not any(name.endswith((".lock", ".verified.json")) for name in entries)  # with their entry
    listed = sum(e.size for e in entries.values())
    assert listed == sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file())  # nothing missed


def test_names_and_globs_choose_entries_and_unknown_names_are_reported(tmp_path: Path) -> None:
    fake_cache(tmp_path)
    entries = inventory(tmp_path, (*KINDS, EXPORTS))
    chosen, unmatched = matching(entries, ["m.gguf", "gguf-converted-v1/*/float32/", "nothing-*"])
    assert [e.name for e in chosen] == ["m.gguf", "gguf-converted-v1/m-sha256-ab/float32"]
    assert unmatched == ["nothing-*"]


def test_removing_an_entry_takes_its_companions_and_leaves_the_rest(tmp_path: Path) -> None:
    fake_cache(tmp_path)
    entries = {e.name: e for e in inventory(tmp_path, (*KINDS, EXPORTS))}
    remove(entries["m.gguf"])
    remove(entries["onnx-exported-v1/m-int4-b128-a4-cd"])
    assert not (tmp_path / "m.gguf.lock").exists() and not (tmp_path / "m.gguf.verified.json").exists()
    assert not (tmp_path / "onnx-exported-v1/m-int4-b128-a4-cd.lock").exists()
    remove(entries["gguf-converted-v1/m-sha256-ab/float32"])
    remove(entries["gguf-converted-v1/m-sha256-ab/tokenizer"])
    assert not (tmp_path / "gguf-converted-v1/m-sha256-ab").exists()  # emptied, so gone
    assert (tmp_path / "gguf-converted-v1").is_dir()
    left = {e.name for e in inventory(tmp_path, (*KINDS, EXPORTS))}
    assert left == {"measurements", "notes.txt", f"onnx-exported-v1/.m-int4-b32-a4-ef.tmp-{DEAD_PID}-xy"}


def test_sizes_read_as_du_si_prints_them() -> None:
    assert [size_text(n) for n in (0, 999, 1000, 11_430_709, 1_770_872_832, 12 * 10**9)] == [
        "0 B",
        "999 B",
        "1.0 kB",
        "11 MB",
        "1.8 GB",
        "12 GB",
    ]
