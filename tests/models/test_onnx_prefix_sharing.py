"""Shared prefixes in the ONNX Runtime adapter: prompt cells another slot holds are copied, not computed; and
prompt chunks fed without a pass of their own for the last token (`OnnxModel.prefill`).

Each test counts the tokens the adapter feeds ONNX Runtime (the widths of its passes) and checks the
logits against the float64 module (`FullForwardModel`), so a cell copied from the wrong slot or the
wrong positions shows as a wrong logit, and a copy that did not happen as tokens fed.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from conftest import shared_prefix_schedule

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxruntime_genai")

from exactspec.checking.tiny_hf import FullForwardModel, TinyHFSpec, tiny_hf_pair  # noqa: E402
from exactspec.foundations.rows import RowStart  # noqa: E402
from exactspec.models.onnx.model import OnnxModel  # noqa: E402
from exactspec.models.onnx.rows import RowSlots  # noqa: E402
from exactspec.models.onnx.tiny import HIDDEN_SIZE, exported_module  # noqa: E402

FLOAT32_TOLERANCE = 2e-5
"""As in test_onnx.py: the float32 adapter against the float64 module (measured about 5e-6)."""

SPEC = TinyHFSpec(family="qwen2", vocab_size=5, seed=2, hidden_size=HIDDEN_SIZE)
PROMPT = [1, 4, 2, 2, 3, 1, 4, 3, 2, 1]  # a "system prompt" every row below starts with


@pytest.fixture(scope="module")
def folder() -> Path:
    """The tiny target's export in the grid's folder, named by its weights (made once per machine)."""
    target, _ = tiny_hf_pair(SPEC)
    return exported_module(target, SPEC.eos_token_id)


@pytest.fixture(scope="module")
def reference() -> FullForwardModel:
    target, _ = tiny_hf_pair(SPEC)
    return FullForwardModel(target, frozenset({0}), SPEC.vocab_size)


class Fed:
    """Counts the tokens an adapter feeds ONNX Runtime (every pass's rows x width)."""

    def __init__(self, model: OnnxModel, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tokens = 0
        original = model._pass

        def counting(first_slot, ids, lengths, out=None, wanted=None):  # type: ignore[no-untyped-def]
            self.tokens += len(ids) * len(ids[0])
            return original(first_slot, ids, lengths, out, wanted)

        monkeypatch.setattr(model, "_pass", counting)

    def take(self) -> int:
        tokens, self.tokens = self.tokens, 0
        return tokens


def close(out: torch.Tensor, reference: FullForwardModel, histories: list[list[int]], k: int) -> bool:
    return float((out.double() - reference.logits(histories, k)).abs().max()) < FLOAT32_TOLERANCE


def test_a_row_copies_the_prefix_a_live_row_holds_and_feeds_only_the_rest(
    folder: Path, reference: FullForwardModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = OnnxModel(folder, eos_token_ids={0}, threads=1, max_rows=4)
    fed = Fed(model, monkeypatch)
    first, second = PROMPT + [1, 2], PROMPT + [3, 3, 4]
    model.add_rows([RowStart(0, prompt=tuple(first)), RowStart(1, prompt=tuple(second))])
    assert close(model.logits([first], 1, rows=[0]), reference, [first], 1)
    assert fed.take() == len(first)
    assert close(model.logits([second], 2, rows=[1]), reference, [second], 2)
    assert fed.take() == len(second) - len(PROMPT)  # the prompt's cells came from row 0's slot
    assert model.shared_tokens == len(PROMPT)
    # Both rows go on decoding from their own cells.
    histories = [first + [4], second + [2]]
    assert close(model.logits(histories, 1, rows=[0, 1]), reference, histories, 1)


def test_a_joining_row_takes_the_free_slot_that_still_holds_its_prompt(
    folder: Path, reference: FullForwardModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A conversation's next turn: the row that left held the whole first turn, the new row keeps it."""
    model = OnnxModel(folder, eos_token_ids={0}, threads=1, max_rows=4)
    fed = Fed(model, monkeypatch)
    model.add_rows([RowStart(0), RowStart(1)])
    turn = PROMPT + [2, 2, 1]
    model.logits([[3, 3, 1]], 1, rows=[0])
    model.logits([turn], 1, rows=[1])
    model.release_rows([1])
    fed.take()
    following = turn + [4, 1, 3]
    model.add_rows([RowStart(7, prompt=tuple(following))])
    assert model.cached_tokens(7) == turn
    assert close(model.logits([following], 1, rows=[7]), reference, [following], 1)
    assert fed.take() == 3


def test_held_cells_move_with_their_slot_when_rows_are_swapped(
    folder: Path, reference: FullForwardModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows 0 and 2 are named together, so the free slot between them is swapped out of the way; the
    prompt it held is still found (in its new slot) and copied right."""
    model = OnnxModel(folder, eos_token_ids={0}, threads=1, max_rows=4)
    fed = Fed(model, monkeypatch)
    model.add_rows([RowStart(r) for r in range(3)])
    held = PROMPT + [4, 4]
    model.logits([[2, 1], held, [3, 2, 4]], 1, rows=[0, 1, 2])
    model.release_rows([1])  # slot 1 is free and holds `held`
    model.logits([[2, 1, 1], [3, 2, 4, 4]], 1, rows=[0, 2])  # slots 0 and 2 made contiguous
    assert model._rows.slot_of[2] == 1 and model._rows.held[2] == held
    fed.take()
    joining = PROMPT + [2, 3, 3]
    model.add_rows([RowStart(5)])  # no prompt given: the lowest free slot, 2, whose leftovers it keeps
    assert close(model.logits([joining], 1, rows=[5]), reference, [joining], 1)
    assert fed.take() == len(joining) - len(PROMPT)


def test_without_sharing_every_prompt_token_is_computed(
    folder: Path, reference: FullForwardModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = OnnxModel(folder, eos_token_ids={0}, threads=1, max_rows=4, share_prefixes=False)
    fed = Fed(model, monkeypatch)
    first, second = PROMPT + [1], PROMPT + [2]
    model.add_rows([RowStart(0, prompt=tuple(first)), RowStart(1, prompt=tuple(second))])
    model.logits([first], 1, rows=[0])
    fed.take()
    assert close(model.logits([second], 1, rows=[1]), reference, [second], 1)
    assert fed.take() == len(second) and model.shared_tokens == 0


def test_random_rows_sharing_prompts_get_the_references_logits(
    folder: Path, reference: FullForwardModel
) -> None:
    """Rows join (with or without their prompt), leave, roll back and decode at random over prompts
    drawn from three shared prefixes (`shared_prefix_schedule`): every call's logits are the
    reference's, and some cells were shared."""
    model = OnnxModel(folder, eos_token_ids={0}, threads=1, max_rows=4)
    rng = random.Random(3)
    prefixes = [PROMPT, PROMPT[:6] + [4, 4], [2, 1, 1, 3, 4, 2, 2]]
    worst = 0.0
    for event, value in shared_prefix_schedule(rng, prefixes, SPEC.vocab_size, 50):
        if event == "leave":
            model.release_rows([value])
        elif event == "join":
            row, prompt = value
            model.add_rows([RowStart(row, prompt=tuple(prompt) if rng.random() < 0.5 else ())])
        else:
            rows, k, histories = value
            out = model.logits([histories[r] for r in rows], k, rows=rows)
            want = reference.logits([histories[r] for r in rows], k)
            worst = max(worst, float((out.double() - want).abs().max()))
            assert all(model.cached_tokens(r) == histories[r] for r in rows)
    assert worst < FLOAT32_TOLERANCE
    assert model.shared_tokens > 0


def test_the_donor_is_the_slot_holding_the_longest_prefix_never_the_row_itself() -> None:
    slots = RowSlots(4)
    for row in range(3):
        slots.assign(row)
    slots.tokens.update({0: [1, 2, 3], 1: [1, 2, 3, 4, 5], 2: [1, 2]})
    assert slots.donor(9, [1, 2, 3, 4, 7]) == (1, 4)
    assert slots.donor(1, [1, 2, 3, 4, 7]) == (0, 3)  # its own slot is not a donor
    slots.release(1)  # free, but slot 1 still holds [1, 2, 3, 4, 5]
    assert slots.donor(9, [1, 2, 3, 4, 7]) == (1, 4)
    assert slots.donor(9, [5, 5]) == (-1, 0)
    slots.clear()
    assert slots.held == {} and slots.donor(9, [1, 2]) == (-1, 0)


def test_a_row_takes_the_free_slot_with_most_of_its_prompt_else_the_lowest() -> None:
    slots = RowSlots(4)
    for row in range(4):
        slots.assign(row)
    slots.tokens.update({0: [7, 7], 1: [1, 2, 3], 2: [1, 2], 3: [4]})
    for row in range(4):
        slots.release(row)
    assert slots.assign(10, prompt=[1, 2, 9]) == 1 and slots.tokens[10] == [1, 2, 3]
    assert slots.assign(11, prompt=[5]) == 0 and slots.tokens[11] == [7, 7]  # none shared: the lowest
    assert 0 not in slots.held and 1 not in slots.held  # taken slots hold rows, not leftovers
    slots.swap(2, 0)  # slot 2's leftovers [1, 2] move to slot 0, row 11 to slot 2
    assert slots.held[0] == [1, 2] and slots.slot_of[11] == 2


def test_prefill_feeds_a_whole_chunk_in_one_pass_and_the_round_scores_from_its_cells(
    folder: Path, reference: FullForwardModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = OnnxModel(folder, eos_token_ids={0}, threads=1, max_rows=4)
    widths: list[tuple[int, int]] = []  # (rows, tokens) of every pass
    original = model._pass

    def recording(first_slot, ids, lengths, out=None, wanted=None):  # type: ignore[no-untyped-def]
        widths.append((len(ids), len(ids[0])))
        return original(first_slot, ids, lengths, out, wanted)

    monkeypatch.setattr(model, "_pass", recording)
    prompt = PROMPT + [2, 4, 3]
    model.add_rows([RowStart(0, prompt=tuple(prompt))])
    model.prefill(0, prompt[:6])
    model.prefill(0, prompt[:-1])  # the next chunk: only the tokens after the first one's
    # One pass a chunk, its last token included (through `logits` a second, one-token pass fed that).
    assert widths == [(1, 6), (1, len(prompt) - 1 - 6)]
    assert model.cached_tokens(0) == prompt[:-1]
    widths.clear()
    assert close(model.logits([prompt], 1, rows=[0]), reference, [prompt], 1)
    assert widths == [(1, 1)]  # the first round feeds the prompt's last token alone
