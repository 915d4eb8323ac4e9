"""The ONNX Runtime adapter on tiny float32 models exported by the model builder in this test session.

Reference: the float64 Hugging Face module the export was made from, one no-cache forward per history
(`FullForwardModel`); the adapter computes in float32, so logits agree to about 1e-5.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxruntime_genai")

from exactspec.checking.tiny_hf import FullForwardModel, TinyHFSpec, tiny_hf_pair  # noqa: E402
from exactspec.foundations.rows import RowStart  # noqa: E402
from exactspec.models.onnx import export  # noqa: E402
from exactspec.models.onnx.model import OnnxModel  # noqa: E402
from exactspec.models.onnx.rows import RowSlots, contiguous_moves  # noqa: E402
from exactspec.models.onnx.tiny import HIDDEN_SIZE, exported_module  # noqa: E402

FLOAT32_TOLERANCE = 2e-5
"""Largest |logit difference| allowed between the float32 ONNX model and the float64 module (measured:
about 5e-6 on these models)."""

SPEC = TinyHFSpec(family="qwen2", vocab_size=5, seed=2, hidden_size=HIDDEN_SIZE)


@pytest.fixture(scope="session")
def tiny_onnx(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(target folder, draft folder) exported once per session, in the session's temporary folder."""
    root = tmp_path_factory.mktemp("tiny-onnx")
    target, draft = tiny_hf_pair(SPEC)
    return exported_module(target, SPEC.eos_token_id, root), exported_module(draft, SPEC.eos_token_id, root)


@pytest.fixture
def model(tiny_onnx: tuple[Path, Path]) -> OnnxModel:
    return OnnxModel(tiny_onnx[0], eos_token_ids={0}, threads=1, max_rows=4)


@pytest.fixture(scope="module")
def reference() -> FullForwardModel:
    target, _ = tiny_hf_pair(SPEC)
    return FullForwardModel(target, frozenset({0}), SPEC.vocab_size)


def test_a_k_token_pass_matches_one_token_steps_and_the_float64_module(
    model: OnnxModel, reference: FullForwardModel
) -> None:
    history = [1, 4, 2, 2, 3, 1, 4, 3]
    block = model.logits([history], 4)[0]  # [4, V]: one pass over the last 4 tokens
    model.clear_cache()
    steps = torch.stack([model.logits([history[:n]], 1)[0, 0] for n in range(5, 9)])  # one token each
    assert (block - steps).abs().max() < FLOAT32_TOLERANCE
    assert (block.double() - reference.logits([history], 4)[0]).abs().max() < FLOAT32_TOLERANCE


def test_rollback_keeps_the_common_prefix_and_scores_the_new_tokens(
    model: OnnxModel, reference: FullForwardModel
) -> None:
    model.logits([[1, 2, 3, 4, 1, 2]], 3, rows=[7])
    assert model.cached_tokens(7) == [1, 2, 3, 4, 1, 2]
    rolled = [1, 2, 3, 2, 2]  # differs from position 3 on: cells 3.. are overwritten
    out = model.logits([rolled], 2, rows=[7])
    assert model.cached_tokens(7) == rolled
    assert (out.double() - reference.logits([rolled], 2)).abs().max() < FLOAT32_TOLERANCE


def test_rows_join_and_leave_between_calls_and_keep_their_own_cells(
    model: OnnxModel, reference: FullForwardModel
) -> None:
    """Random calls over 6 row ids (at most 4 alive): subsets in any order, k = 1..3, rollbacks, rows
    released and rejoining; every call's logits are the reference's."""
    rng = random.Random(0)
    histories: dict[int, list[int]] = {}
    worst = 0.0
    for _ in range(40):
        if len(histories) > 3 or (histories and rng.random() < 0.15):
            gone = rng.choice(sorted(histories))
            model.release_rows([gone])
            del histories[gone]
            assert gone not in model.cached_rows
        while len(histories) < 2 or (len(histories) < 4 and rng.random() < 0.3):
            row = rng.choice([r for r in range(6) if r not in histories])
            model.add_rows([RowStart(row)])
            histories[row] = [rng.randrange(1, 5)]
        rows = rng.sample(sorted(histories), rng.randint(1, len(histories)))
        k = rng.choice([1, 1, 2, 3])
        for row in rows:
            if len(histories[row]) > 3 and rng.random() < 0.3:
                histories[row] = histories[row][:-2]  # a rejected draft: rolled back
            histories[row] += [rng.randrange(1, 5) for _ in range(rng.randint(k, k + 2))]
        out = model.logits([histories[r] for r in rows], k, rows=rows)
        want = reference.logits([histories[r] for r in rows], k)
        worst = max(worst, float((out.double() - want).abs().max()))
        assert all(model.cached_tokens(r) == histories[r] for r in rows)
    assert worst < FLOAT32_TOLERANCE


def test_more_rows_than_max_rows_is_refused_until_one_leaves(model: OnnxModel) -> None:
    model.add_rows([RowStart(r) for r in range(4)])
    with pytest.raises(RuntimeError, match="at most 4 rows"):
        model.logits([[1]], 1, rows=[9])
    model.release_rows([2])
    assert model.logits([[1, 2]], 1, rows=[9]).shape == (1, 1, SPEC.vocab_size)


def test_float64_logits_are_the_float32_values_widened(
    tiny_onnx: tuple[Path, Path], model: OnnxModel
) -> None:
    wide = OnnxModel(tiny_onnx[0], eos_token_ids={0}, threads=1, dtype=torch.float64)
    history = [3, 1, 4, 1]
    assert wide.logits([history], 2).dtype == torch.float64
    assert torch.equal(wide.logits([history], 2), model.logits([history], 2).double())


def test_contiguous_moves_give_the_named_rows_a_run_of_slots() -> None:
    rng = random.Random(1)
    for _ in range(200):
        slots = RowSlots(8)
        for row in rng.sample(range(20), rng.randint(1, 8)):
            slots.assign(row)
        for row in rng.sample(sorted(slots.slot_of), rng.randint(0, len(slots.slot_of) - 1)):
            slots.release(row)
            if rng.random() < 0.5:
                slots.assign(row + 100)
        named = rng.sample(sorted(slots.slot_of), rng.randint(1, len(slots.slot_of)))
        for a, b in contiguous_moves(slots.slot_of, named, 8):
            owner_a, owner_b = slots.owner(a), slots.owner(b)
            if owner_a is not None:
                slots.slot_of[owner_a] = b
            if owner_b is not None:
                slots.slot_of[owner_b] = a
        held = sorted(slots.slot_of[r] for r in named)
        assert held == list(range(held[0], held[0] + len(named)))
        assert len(set(slots.slot_of.values())) == len(slots.slot_of)  # still one row per slot


def test_an_export_is_reused_while_its_weights_match_their_stamp(
    tiny_onnx: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tiny_onnx[0]
    record = json.loads((folder / export.PROVENANCE_FILE).read_text())
    source = Path(record["source_path"])
    assert record["recipe"]["precision"] == "fp32" and record["versions"]["onnxruntime-genai"]
    assert record["key"]["source"] == export.source_content(source)

    def no_builder(*args: object) -> None:
        raise AssertionError("the builder ran although the export is cached")

    monkeypatch.setattr(export, "_run_child", no_builder)
    assert export.exported_model(source, export.FP32_RECIPE, cache_dir=folder.parent.parent) == folder
    assert export.cached_export(source, export.FP32_RECIPE, folder.parent.parent) == folder
    weights = folder / record["weights_file"]
    stat = weights.stat()
    try:
        weights.touch()  # a changed mtime: the stamp no longer vouches for the file
        assert not export.entry_matches(folder, record["key"])
        assert export.cached_export(source, export.FP32_RECIPE, folder.parent.parent) is None
    finally:
        import os

        os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert export.entry_matches(folder, record["key"])


def test_buffers_grow_and_keep_what_rows_hold(
    tiny_onnx: tuple[Path, Path], reference: FullForwardModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Capacity doubles from 8 positions and slots from 1 while two rows grow token by token; every
    call's logits stay the reference's, so the cells copied into the grown buffers are the rows' own."""
    from exactspec.models.onnx import model as onnx_model

    monkeypatch.setattr(onnx_model, "MIN_CAPACITY", 8)
    small = OnnxModel(tiny_onnx[0], eos_token_ids={0}, threads=1, max_rows=4)
    assert small._keys[0].shape[:3] == (1, 2, 8)  # [slots, kv_heads, capacity]
    rng = random.Random(3)
    histories = {0: [1, 2], 1: [3]}
    for _ in range(30):
        for row in histories:
            histories[row].append(rng.randrange(1, 5))
        rows = list(histories)
        out = small.logits([histories[r] for r in rows], 1, rows=rows)
        want = reference.logits([histories[r] for r in rows], 1)
        assert (out.double() - want).abs().max() < FLOAT32_TOLERANCE
    assert small._keys[0].shape[0] == 2 and small._keys[0].shape[2] == 32  # grew 8 -> 16 -> 32
    # Every buffer starts on a cache line (numpy's own start 16 bytes into a page).
    assert all(buffer.ctypes.data % 64 == 0 for buffer in [*small._keys, *small._values])


def test_the_cache_binding_is_kept_while_the_slots_stay_and_made_again_when_they_change(
    tiny_onnx: tuple[Path, Path], reference: FullForwardModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One-row decode steps reuse one IO binding; another batch or grown buffers bind afresh, and every
    call's logits stay the reference's (a stale binding would read or write the wrong cells)."""
    from exactspec.models.onnx import model as onnx_model

    monkeypatch.setattr(onnx_model, "MIN_CAPACITY", 8)
    small = OnnxModel(tiny_onnx[0], eos_token_ids={0}, threads=1, max_rows=4)
    made = 0
    original = small._session.io_binding

    def counting():  # type: ignore[no-untyped-def]
        nonlocal made
        made += 1
        return original()

    monkeypatch.setattr(small._session, "io_binding", counting)
    history = [1, 2, 3]
    for step in range(4):  # 3 + 4 tokens: within the first 8 positions
        history.append(1 + step % 4)
        out = small.logits([history], 1, rows=[0])
        assert (out.double() - reference.logits([history], 1)).abs().max() < FLOAT32_TOLERANCE
    assert made == 1  # the prefill and every step: slot 0, one row, the same buffers
    histories = [history + [2], [4, 3, 2]]
    out = small.logits(histories, 1, rows=[0, 1])  # two rows: the buffers grow to 2 slots, bound afresh
    assert (out.double() - reference.logits(histories, 1)).abs().max() < FLOAT32_TOLERANCE
    assert made > 1
    for step in range(6):  # row 0 passes 8 positions: capacity doubles, bound afresh again
        histories[0].append(1 + step % 4)
        out = small.logits(histories[:1], 1, rows=[0])
        assert (out.double() - reference.logits(histories[:1], 1)).abs().max() < FLOAT32_TOLERANCE
    assert small._keys[0].shape[2] == 16


def test_prefill_runs_the_logits_from_variant_and_leaves_the_builders_graph_alone(
    tiny_onnx: tuple[Path, Path], reference: FullForwardModel
) -> None:
    """The variant is written beside model.onnx (which onnxruntime-genai reads, unchanged) and computes
    the logits of the positions asked for: the last `wanted` of what the builder's graph gives."""
    import hashlib

    from exactspec.models.onnx.logits_from import VARIANT_FILE

    folder = tiny_onnx[0]
    builders = hashlib.sha256((folder / "model.onnx").read_bytes()).hexdigest()
    small = OnnxModel(folder, eos_token_ids={0}, threads=1, max_rows=2)
    assert small._logits_from and (folder / VARIANT_FILE).is_file()
    assert hashlib.sha256((folder / "model.onnx").read_bytes()).hexdigest() == builders
    history = [1, 2, 3, 4, 1, 2]
    want = reference.logits([history], 6)  # [1, 6, V]: every position
    for wanted in (6, 3, 1):
        small.clear_cache()
        small._reserve(1, len(history))
        small._rows.assign(0)
        got = small._pass(0, [history], [len(history)], wanted=wanted)  # [1, wanted, V]
        assert got.shape[1] == wanted
        assert (torch.from_numpy(got).double() - want[:, 6 - wanted :]).abs().max() < FLOAT32_TOLERANCE
    # A long prompt is prefilled through it and the next positions are still the reference's.
    long = [1 + (i * 7) % 4 for i in range(40)]
    out = small.logits([long], 3, rows=[0])
    assert (out.double() - reference.logits([long], 3)).abs().max() < FLOAT32_TOLERANCE


def test_a_graph_the_variant_cannot_be_made_for_or_loaded_is_run_as_the_builder_wrote_it(
    tiny_onnx: tuple[Path, Path], reference: FullForwardModel, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from exactspec.models.onnx import session as onnx_model

    history = [1 + (i * 3) % 4 for i in range(20)]
    monkeypatch.setattr(onnx_model, "variant_path", lambda folder, name: None)
    plain = OnnxModel(tiny_onnx[0], eos_token_ids={0}, threads=1, max_rows=1)
    assert not plain._logits_from
    assert (plain.logits([history], 2, rows=[0]).double() - reference.logits([history], 2)).abs().max() < (
        FLOAT32_TOLERANCE
    )
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    monkeypatch.setattr(onnx_model, "variant_path", lambda folder, name: broken)
    refused = OnnxModel(tiny_onnx[0], eos_token_ids={0}, threads=1, max_rows=1)
    assert not refused._logits_from
    assert (refused.logits([history], 2, rows=[0]).double() - reference.logits([history], 2)).abs().max() < (
        FLOAT32_TOLERANCE
    )
    with pytest.raises(ValueError, match="logits_from graph variant"):
        refused._pass(0, [history[:4]], [4], wanted=1)


def test_weights_move_to_huge_pages_only_for_a_model_big_enough_and_when_asked(
    tiny_onnx: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tiny export is below HUGE_PAGES_FROM: no collapse; with the threshold at 0 the collapse runs
    once the session has loaded (its bytes are `huge_page_bytes`), unless huge_pages=False."""
    from exactspec.models.onnx import model as onnx_model

    calls: list[int] = []

    def collapse() -> int:
        calls.append(1)
        return 6 << 20

    monkeypatch.setattr(onnx_model, "collapse_resident", collapse)
    assert OnnxModel(tiny_onnx[0], eos_token_ids={0}, threads=1).huge_page_bytes == 0
    assert calls == []
    monkeypatch.setattr(onnx_model, "HUGE_PAGES_FROM", 0)
    assert OnnxModel(tiny_onnx[0], eos_token_ids={0}, threads=1).huge_page_bytes == 6 << 20
    assert calls == [1]
    assert OnnxModel(tiny_onnx[0], eos_token_ids={0}, threads=1, huge_pages=False).huge_page_bytes == 0
    assert calls == [1]
