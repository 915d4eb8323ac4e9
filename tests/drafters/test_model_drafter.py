"""ModelDrafter: tokens drawn from exactly the q it reports, with each position's real history."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_implements
from scipy import stats

from exactspec.checking.toy import TabularModel, random_tabular_model
from exactspec.drafters import Drafter, ModelDrafter
from exactspec.foundations.rows import RowStart
from exactspec.foundations.sampler import SeededSampler
from exactspec.foundations.settings import SamplingSettings
from exactspec.foundations.transforms import probabilities

VOCAB = 6
EOS = 0
HISTORIES = [[1, 2], [3], [4, 4, 5], [2]]


def _expected_q(
    model: TabularModel, history: list[int], settings: SamplingSettings, vocab: int, prompt_length: int = 0
) -> torch.Tensor:
    """q at one position, built independently: the draft's logits at that history, padded, transformed
    (the presence and frequency penalties counting what follows the first `prompt_length` tokens)."""
    logits = model.logits([history], 1)[:, 0]
    padded = torch.full((1, vocab), float("-inf"), dtype=logits.dtype)
    padded[:, : logits.shape[-1]] = logits
    return probabilities(padded, settings, [history], prompt_lengths=[prompt_length])[0]


@pytest.mark.parametrize(
    "settings",
    [
        SamplingSettings(),
        SamplingSettings(temperature=0.7, top_k=3),
        SamplingSettings(top_p=0.8, min_p=0.05),
        SamplingSettings(repetition_penalty=1.8, logit_bias={2: 0.5}),
        SamplingSettings(temperature=0),
    ],
    ids=lambda s: s.describe(),
)
def test_reported_q_is_the_distribution_at_each_real_history(settings: SamplingSettings) -> None:
    model = random_tabular_model(VOCAB, seed=7, eos_token_id=None)
    drafter = ModelDrafter(model, VOCAB)
    max_tokens = [4, 4, 2, 3]
    for seed in range(3):
        proposal = drafter.propose(HISTORIES, max_tokens, settings, SeededSampler(seed, 4), [0, 1, 2, 3])
        assert proposal.tokens.shape == (4, 4)
        assert proposal.q.shape == (4, 4, VOCAB)
        assert proposal.q.dtype == torch.float64
        assert proposal.lengths.tolist() == max_tokens  # no EOS: every row drafts its full length
        for b, history in enumerate(HISTORIES):
            for i in range(max_tokens[b]):
                position_history = [*history, *proposal.tokens[b, :i].tolist()]
                expected = _expected_q(model, position_history, settings, VOCAB)
                assert torch.equal(proposal.q[b, i], expected)
                assert proposal.q[b, i, proposal.tokens[b, i]] > 0  # drawn from that q
                if settings.greedy:
                    assert proposal.tokens[b, i] == expected.argmax()


def test_draft_stops_after_eos() -> None:
    model = random_tabular_model(4, seed=1, eos_token_id=EOS, sharpness=1.0)
    drafter = ModelDrafter(model, 4)
    stopped = 0
    for seed in range(40):
        proposal = drafter.propose([[1], [2]], [5, 5], SamplingSettings(), SeededSampler(seed, 2), [0, 1])
        for b in range(2):
            tokens = proposal.row_tokens(b)
            assert len(tokens) == int(proposal.lengths[b])
            assert EOS not in tokens[:-1]
            if EOS in tokens:
                stopped += 1
            else:
                assert len(tokens) == 5
    assert stopped > 0


def test_each_row_drafts_at_most_its_max_tokens() -> None:
    drafter = ModelDrafter(random_tabular_model(VOCAB, seed=2, eos_token_id=None), VOCAB)
    proposal = drafter.propose(HISTORIES, [3, 0, 1, 2], SamplingSettings(), SeededSampler(0, 4), [0, 1, 2, 3])
    assert proposal.lengths.tolist() == [3, 0, 1, 2]
    assert proposal.tokens.shape == (4, 3)
    assert proposal.row_tokens(1) == []


def test_no_tokens_requested_gives_an_empty_proposal() -> None:
    drafter = ModelDrafter(random_tabular_model(VOCAB, seed=2), VOCAB)
    proposal = drafter.propose(HISTORIES[:2], [0, 0], SamplingSettings(), SeededSampler(0, 2), [0, 1])
    assert proposal.tokens.shape == (2, 0)
    assert proposal.q.shape == (2, 0, VOCAB)
    assert proposal.lengths.tolist() == [0, 0]


def test_smaller_draft_vocabulary_is_padded_with_zero_q() -> None:
    draft = random_tabular_model(4, seed=3, eos_token_id=None)
    drafter = ModelDrafter(draft, target_vocab_size=7)
    settings = SamplingSettings(temperature=1.3, top_k=5)
    proposal = drafter.propose(HISTORIES, [3] * 4, settings, SeededSampler(1, 4), [0, 1, 2, 3])
    assert proposal.q.shape == (4, 3, 7)
    assert torch.equal(proposal.q[..., 4:], torch.zeros(4, 3, 3, dtype=proposal.q.dtype))
    torch.testing.assert_close(proposal.q.sum(-1), torch.ones(4, 3, dtype=proposal.q.dtype))
    assert (proposal.tokens < 4).all()
    for b, history in enumerate(HISTORIES):
        assert torch.equal(proposal.q[b, 0], _expected_q(draft, history, settings, 7))


def test_larger_draft_vocabulary_raises() -> None:
    with pytest.raises(ValueError, match="draft vocabulary \\(8\\) is larger than the target's \\(6\\)"):
        ModelDrafter(random_tabular_model(8, seed=0), target_vocab_size=6)


def test_is_a_drafter() -> None:
    assert_implements(ModelDrafter(random_tabular_model(3, seed=0), 3), Drafter)


def test_same_seeds_give_same_proposal() -> None:
    drafter = ModelDrafter(random_tabular_model(VOCAB, seed=5), VOCAB)
    first = drafter.propose(HISTORIES, [4] * 4, SamplingSettings(), SeededSampler(9, 4), [0, 1, 2, 3])
    second = drafter.propose(HISTORIES, [4] * 4, SamplingSettings(), SeededSampler(9, 4), [0, 1, 2, 3])
    assert torch.equal(first.tokens, second.tokens)
    assert torch.equal(first.lengths, second.lengths)


def test_each_row_uses_its_own_stream() -> None:
    drafter = ModelDrafter(random_tabular_model(VOCAB, seed=5, eos_token_id=None), VOCAB)
    settings = SamplingSettings()
    for seed in range(5):
        alone = drafter.propose([[4, 4, 5]], [4], settings, SeededSampler(seeds=[seed]), [0])
        # The same history as batch row 2, whose stream (rows[2] = 2) has the same seed.
        batch = drafter.propose(
            HISTORIES, [4, 1, 4, 2], settings, SeededSampler(seeds=[77, 88, seed, 99]), [0, 1, 2, 3]
        )
        assert batch.row_tokens(2) == alone.row_tokens(0)
        # Row ids, not batch positions, choose the stream.
        moved = drafter.propose([[4, 4, 5]], [4], settings, SeededSampler(seeds=[77, 88, seed]), [2])
        assert moved.row_tokens(0) == alone.row_tokens(0)


def test_first_draft_token_frequencies_match_q() -> None:
    model = random_tabular_model(5, seed=4, eos_token_id=None)
    drafter = ModelDrafter(model, 5)
    settings = SamplingSettings(temperature=0.8)
    num_rows = 20_000
    proposal = drafter.propose(
        [[1, 3]] * num_rows, [1] * num_rows, settings, SeededSampler(0, num_rows), range(num_rows)
    )
    q = _expected_q(model, [1, 3], settings, 5)
    counts = torch.bincount(proposal.tokens[:, 0], minlength=5).double()
    assert stats.chisquare(counts.numpy(), (q * num_rows).numpy()).pvalue > 1e-3


class StopAfter:
    """A DraftStop that lets row r draft `limits[r]` tokens and records every report."""

    def __init__(self, limits: dict[int, int]) -> None:
        self.limits = limits
        self.calls: list[tuple[int, int, float]] = []

    def keep_drafting(self, row: int, drafted: int, confidence: float) -> bool:
        self.calls.append((row, drafted, confidence))
        return drafted < self.limits[row]


def test_a_draft_stop_ends_each_row_on_its_own_and_hears_every_token() -> None:
    target, draft = random_tabular_model(6, seed=1), random_tabular_model(6, seed=2, eos_token_id=None)
    stop = StopAfter({4: 1, 7: 3})
    drafter = ModelDrafter(draft, target.vocab_size, stop=stop)
    histories = [[1, 2], [3]]
    sampler = SeededSampler(0)
    sampler.add_rows([RowStart(4, 4), RowStart(7, 7)])
    proposal = drafter.propose(histories, [3, 3], SamplingSettings(), sampler, [4, 7])
    assert proposal.lengths.tolist() == [1, 3]
    assert [(row, drafted) for row, drafted, _ in stop.calls] == [(4, 1), (7, 1), (7, 2), (7, 3)]
    for row, drafted, confidence in stop.calls:  # the draft's own top probability at that token
        b = [4, 7].index(row)
        context = histories[b] + proposal.row_tokens(b)[: drafted - 1]
        expected = torch.softmax(draft.logits([context], 1)[0, 0].double(), dim=-1).max().item()
        assert confidence == pytest.approx(expected, rel=1e-6)


def test_output_penalties_count_from_each_rows_prompt_as_add_rows_gave_it() -> None:
    """q's presence and frequency penalties count the row's tokens after its prompt (the length
    `add_rows` gave) plus the drafted ones before the position; a row added without its prompt is an
    error rather than a guess."""
    model = random_tabular_model(VOCAB, seed=7, eos_token_id=None)
    drafter = ModelDrafter(model, VOCAB)
    settings = SamplingSettings(temperature=0.8, presence_penalty=1.5, frequency_penalty=-0.7)
    # Row 10's prompt is [1, 2] (then 2, 2 generated); row 11's prompt is all of [4, 4, 5].
    histories, rows, prompt_lengths = [[1, 2, 2, 2], [4, 4, 5]], [10, 11], [2, 3]
    drafter.add_rows([RowStart(10, prompt=(1, 2)), RowStart(11, prompt=(4, 4, 5))])
    proposal = drafter.propose(histories, [3, 3], settings, SeededSampler(4, 12), rows)
    for b, history in enumerate(histories):
        for i in range(3):
            position_history = [*history, *proposal.tokens[b, :i].tolist()]
            expected = _expected_q(model, position_history, settings, VOCAB, prompt_lengths[b])
            assert torch.equal(proposal.q[b, i], expected)
    counted_from_zero = _expected_q(model, histories[1], settings, VOCAB, 0)
    assert not torch.equal(proposal.q[1, 0], counted_from_zero)  # the prompt really is left out
    drafter.release_rows([11])
    drafter.add_rows([RowStart(11)])  # no prompt given
    with pytest.raises(ValueError, match=r"rows \[11\] have a presence or frequency penalty"):
        drafter.propose(histories, [3, 3], settings, SeededSampler(4, 12), rows)
    # Without the penalties nothing is needed.
    drafter.propose(histories, [3, 3], SamplingSettings(), SeededSampler(4, 12), rows)
