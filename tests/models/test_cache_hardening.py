"""Loading through the caches: a GGUF conversion cache that cannot serve the wrong model, concurrent
first runs that both succeed, and cache failures that are one clear `ModelLoadError`.

GGUF files are real tiny ones (`test_loading._write_gguf`); the default pair is faked with parts
installed into a temporary site folder (`conftest.install_parts`), so nothing is downloaded. The
artefact pieces on their own (stamps, locks, staging, the cleaner, the default pair's fetching) are
tested in `tests/artefacts/`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("gguf")

from conftest import dead_pid, install_parted_file  # noqa: E402
from test_loading import PROBE, _tiny_model, _write_gguf  # noqa: E402

import exactspec.models.loading as loading  # noqa: E402
from exactspec.artefacts.conversion import CONVERSION_CACHE, conversion_entry  # noqa: E402
from exactspec.artefacts.default_pair import PartedModel  # noqa: E402
from exactspec.models.loading import ModelLoadError, load_hf_model  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.inference_mode():
        return model(PROBE, use_cache=False).logits


def _other_model() -> torch.nn.Module:
    """Same architecture and shapes as `_tiny_model()` (so the same GGUF size), other weights."""
    model = _tiny_model()
    torch.manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape))
    return model


# --- the conversion cache is keyed by content -------------------------------------------------


def test_swapped_file_with_same_name_size_and_mtime_is_detected(tmp_path: Path) -> None:
    """Before: keyed by name, size and mtime, the second file got the first file's conversion."""
    path = tmp_path / "m.gguf"
    _write_gguf(path, _tiny_model())
    first, _ = load_hf_model(path, dtype="float32", cache_dir=tmp_path / "cache", progress=False)
    stat = path.stat()
    _write_gguf(path, _other_model())
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # what cp -p, rsync -a and tar -x do
    assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns
    second, _ = load_hf_model(path, dtype="float32", cache_dir=tmp_path / "cache", progress=False)
    assert not torch.allclose(_logits(second), _logits(first))
    fresh, _ = load_hf_model(path, dtype="float32", cache_dir=tmp_path / "fresh", progress=False)
    assert torch.equal(_logits(second), _logits(fresh))


def test_a_copy_with_a_new_mtime_reuses_the_conversion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "m.gguf"
    _write_gguf(path, _tiny_model())
    load_hf_model(path, dtype="float32", cache_dir=tmp_path / "cache", progress=False)
    os.utime(path, ns=(0, 12345))
    monkeypatch.setattr(loading, "_convert_gguf_model", lambda *a: pytest.fail("converted again"))
    load_hf_model(path, dtype="float32", cache_dir=tmp_path / "cache", progress=False)


def test_provenance_is_checked_on_load(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    _write_gguf(path, _tiny_model())
    load_hf_model(path, dtype="float32", cache_dir=tmp_path, progress=False)
    (record_path,) = (tmp_path / CONVERSION_CACHE).glob("*/float32/exactspec-conversion.json")
    record = json.loads(record_path.read_text())
    record["fingerprint"] = "0" * 64
    record_path.write_text(json.dumps(record))
    with pytest.raises(ModelLoadError, match="was not made from") as info:
        load_hf_model(path, dtype="float32", cache_dir=tmp_path, progress=False)
    assert "Delete" in str(info.value)
    record_path.unlink()
    with pytest.raises(ModelLoadError, match="no readable provenance record"):
        load_hf_model(path, dtype="float32", cache_dir=tmp_path, progress=False)


# --- staging folders and filesystem errors -----------------------------------------------------


def test_stale_staging_folders_of_dead_processes_are_removed(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    _write_gguf(path, _tiny_model())
    entry = conversion_entry(path, tmp_path / "cache").folder
    entry.mkdir(parents=True)
    dead = entry / f".float32.tmp-{dead_pid()}-abc"
    alive = entry / f".float32.tmp-{os.getppid()}-def"
    for folder in (dead, alive):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"half written")
    load_hf_model(path, dtype="float32", cache_dir=tmp_path / "cache", progress=False)
    assert not dead.exists()
    assert alive.exists()  # another running process may still be writing it
    assert not [p for p in entry.iterdir() if ".tmp-" in p.name and p != alive]


def test_cache_below_a_regular_file_is_one_clear_error(tmp_path: Path) -> None:
    """Before: a raw NotADirectoryError from mkdir."""
    path = tmp_path / "m.gguf"
    _write_gguf(path, _tiny_model())
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    with pytest.raises(ModelLoadError, match="regular file") as info:
        load_hf_model(path, dtype="float32", cache_dir=blocker / "cache", progress=False)
    assert str(blocker) in str(info.value) and "--cache-dir" in str(info.value)


def test_disk_full_during_conversion_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "m.gguf"
    _write_gguf(path, _tiny_model())

    def full(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(loading, "_save_dense", full)
    with pytest.raises(ModelLoadError, match="disk is full"):
        load_hf_model(path, dtype="float32", cache_dir=tmp_path / "cache", progress=False)
    assert not list((tmp_path / "cache").rglob("*.tmp-*"))


# --- two processes on one cold cache ----------------------------------------------------------


_FIRST_RUN = """
import json, sys
import torch
from exactspec.artefacts.default_pair import PartedModel, ensure_parted_model
from exactspec.models.loading import load_hf_model
model = PartedModel(**json.loads(sys.argv[1]))
path = ensure_parted_model(model, sys.argv[2], progress=False)
loaded, tokenizer = load_hf_model(path, dtype="float32", cache_dir=sys.argv[2], progress=False)
with torch.inference_mode():
    logits = loaded(torch.tensor([[3, 70, 104, 259]]), use_cache=False).logits
print(json.dumps({"sum": float(logits.double().sum()), "ids": tokenizer("hello world").input_ids}))
"""


def test_two_first_runs_at_once_both_succeed(tmp_path: Path) -> None:
    """Two processes fetch (join + stamp) and convert the same 'default' GGUF into one empty cache."""
    gguf_path = tmp_path / "source.gguf"
    _write_gguf(gguf_path, _tiny_model())
    site = tmp_path / "site"
    model = install_parted_file(gguf_path.read_bytes(), site, parts=3)
    spec = json.dumps({field: getattr(model, field) for field in PartedModel.__dataclass_fields__})
    cache = tmp_path / "cache"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(site)]), "OMP_NUM_THREADS": "1"}
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", _FIRST_RUN, spec, str(cache)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = [run.communicate(timeout=300) for run in runs]
    for run, (_, err) in zip(runs, results, strict=True):
        assert run.returncode == 0, err
        assert "Traceback" not in err
    first, second = (json.loads(out) for out, _ in results)
    assert first == second
    names = sorted(p.name for p in cache.iterdir())
    assert names == sorted(
        [
            CONVERSION_CACHE,
            model.file_name,
            f"{model.file_name}.lock",
            f"{model.file_name}.verified.json",
        ]
    ), names
    assert not [p for p in cache.rglob("*") if ".tmp" in p.name]
