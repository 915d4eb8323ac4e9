"""The conversion cache's bookkeeping: content keys, where entries live, provenance records, staging.

No model is converted here (`tests/models/test_loading.py` and `test_cache_hardening.py` convert
real tiny GGUF files through this cache); the "GGUF files" are plain bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from exactspec.artefacts import conversion
from exactspec.artefacts.conversion import (
    CONVERSION_CACHE,
    PROVENANCE_FILE,
    ConversionCacheError,
    check_provenance,
    content_fingerprint,
    content_key,
    conversion_entry,
    staged_entry,
    write_provenance,
)
from exactspec.artefacts.stamps import write_stamp

LIBRARIES = {"transformers": "5.0.0", "torch": "2.9.0"}


def _file(tmp_path: Path, data: bytes = b"GGUF" + bytes(range(256)), name: str = "m.gguf") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_fingerprint_sees_every_sampled_block(tmp_path: Path) -> None:
    size = 9 << 20  # larger than what is hashed whole
    data = bytearray(hashlib.sha256(b"x").digest() * (size // 32))
    path = tmp_path / "big.gguf"
    path.write_bytes(bytes(data))
    base = content_fingerprint(path)
    head, block, blocks = (
        conversion._FINGERPRINT_HEAD,
        conversion._FINGERPRINT_BLOCK,
        conversion._FINGERPRINT_BLOCKS,
    )
    span = size - head - block
    block_10 = head + span * 10 // (blocks - 1)
    for offset in (0, 1000, block_10, block_10 + block - 1, size - 1):
        changed = bytearray(data)
        changed[offset] ^= 0xFF
        path.write_bytes(bytes(changed))
        assert content_fingerprint(path) != base, offset


def test_small_files_are_fingerprinted_whole(tmp_path: Path) -> None:
    data = bytearray(b"GGUF" * (1 << 18))  # 1 MiB
    path = _file(tmp_path, bytes(data))
    base = content_fingerprint(path)
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    assert content_fingerprint(path) != base


def test_the_content_key_is_a_verified_sha256_when_there_is_one(tmp_path: Path) -> None:
    path = _file(tmp_path)
    assert content_key(path) == {"size": 260, "fingerprint": content_fingerprint(path)}
    write_stamp(path, "cd" * 32)
    assert content_key(path) == {"size": 260, "sha256": "cd" * 32}


def test_a_missing_file_has_no_content_key(tmp_path: Path) -> None:
    with pytest.raises(ConversionCacheError, match="Could not read the GGUF file"):
        content_key(tmp_path / "missing.gguf")


def test_entries_are_named_by_stem_and_content(tmp_path: Path) -> None:
    """The layout on disk is what existing caches hold: keep it, or bump CONVERSION_CACHE."""
    path = _file(tmp_path, name="Qwen 2.5 (q4).gguf")
    entry = conversion_entry(path, tmp_path / "cache")
    key = content_fingerprint(path)[:16]
    assert entry.folder == tmp_path / "cache" / "gguf-converted-v1" / f"Qwen_2.5_q4_-fp-{key}"
    assert entry.tokenizer_folder == entry.folder / "tokenizer"
    assert entry.model_folder("bfloat16") == entry.folder / "bfloat16"
    write_stamp(path, "cd" * 32)
    assert conversion_entry(path, tmp_path).folder.name == f"Qwen_2.5_q4_-sha256-{'cd' * 8}"
    assert CONVERSION_CACHE == "gguf-converted-v1"


def test_a_provenance_record_vouches_for_its_source(tmp_path: Path) -> None:
    path = _file(tmp_path)
    folder = tmp_path / "float32"
    folder.mkdir()
    write_provenance(folder, path, "float32", LIBRARIES)
    record = json.loads((folder / PROVENANCE_FILE).read_text())
    stat = path.stat()
    assert record == {
        "source": str(path.resolve()),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "sha256": None,
        "fingerprint": content_fingerprint(path),
        "dtype": "float32",
        **LIBRARIES,
    }
    check_provenance(folder, path)
    os.utime(path, ns=(0, 12345))  # a copy with a new mtime is the same content
    check_provenance(folder, path)


def test_a_record_of_other_content_is_refused(tmp_path: Path) -> None:
    path = _file(tmp_path)
    folder = tmp_path / "float32"
    folder.mkdir()
    write_provenance(folder, path, "float32", LIBRARIES)
    path.write_bytes(b"GGUF" + bytes(range(255, -1, -1)))  # same size, other content
    with pytest.raises(ConversionCacheError, match="was not made from") as info:
        check_provenance(folder, path)
    assert f"Delete {tmp_path}" in str(info.value)


@pytest.mark.parametrize("text", ["{}", "[]", '{"size": 260}', "not json"])
def test_a_record_that_says_too_little_is_refused(tmp_path: Path, text: str) -> None:
    path = _file(tmp_path)
    folder = tmp_path / "float32"
    folder.mkdir()
    (folder / PROVENANCE_FILE).write_text(text)
    with pytest.raises(ConversionCacheError, match="was not made from|no readable provenance record"):
        check_provenance(folder, path)


def test_a_missing_record_is_refused(tmp_path: Path) -> None:
    path = _file(tmp_path)
    (tmp_path / "float32").mkdir()
    with pytest.raises(ConversionCacheError, match="no readable provenance record"):
        check_provenance(tmp_path / "float32", path)


# --- staged entries ----------------------------------------------------------------------------


def test_a_staged_entry_is_published_when_the_block_succeeds(tmp_path: Path) -> None:
    final = tmp_path / "entry" / "tokenizer"
    with staged_entry(final) as tmp:
        (tmp / "tokenizer.json").write_text("{}")
        assert not final.exists()
    assert (final / "tokenizer.json").read_text() == "{}"
    assert sorted(p.name for p in final.parent.iterdir()) == ["tokenizer"]


def test_a_failed_block_leaves_nothing(tmp_path: Path) -> None:
    final = tmp_path / "entry" / "float32"
    with pytest.raises(ValueError, match="logits differ"), staged_entry(final) as tmp:
        (tmp / "model.safetensors").write_bytes(b"half written")
        raise ValueError("logits differ")
    assert list(final.parent.iterdir()) == []


def test_a_full_disk_is_one_clear_error(tmp_path: Path) -> None:
    final = tmp_path / "entry" / "float32"
    with pytest.raises(ConversionCacheError, match="disk is full") as info, staged_entry(final):
        raise OSError(28, "No space left on device")
    assert "--cache-dir" in str(info.value) and "EXACTSPEC_CACHE" in str(info.value)
    assert list(final.parent.iterdir()) == []


def test_a_cache_below_a_regular_file_is_one_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    with (
        pytest.raises(ConversionCacheError, match="regular file") as info,
        staged_entry(blocker / "cache" / "float32"),
    ):
        pytest.fail("the block must not run")
    assert str(blocker) in str(info.value)


def test_another_process_publishing_first_wins(tmp_path: Path) -> None:
    final = tmp_path / "entry" / "float32"
    with staged_entry(final) as tmp:
        (tmp / "config.json").write_text("mine")
        final.mkdir()
        (final / "config.json").write_text("theirs")
    assert (final / "config.json").read_text() == "theirs"
    assert sorted(p.name for p in final.parent.iterdir()) == ["float32"]
