"""Prompt lookup and the hybrid drafter: what they propose, that the engine takes it, and exactness."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
import torch
from conftest import grid_cases

from exactspec.checking.exact import check_speculative
from exactspec.checking.grid import EXACT_TOLERANCE, ExactCase, run_exact_case
from exactspec.checking.toy import random_tabular_model
from exactspec.decoding.engine import DecodeConfig, SpeculativeEngine
from exactspec.drafters import ModelDrafter, Proposal
from exactspec.drafters.hybrid import HybridDrafter
from exactspec.drafters.ngram import LookupMatch, NgramDrafter, lookup_continuation, lookup_match
from exactspec.foundations.rows import RowStart, Stateless
from exactspec.foundations.sampler import Sampler, SeededSampler
from exactspec.foundations.settings import SamplingSettings
from exactspec.verifiers.block import verify_block
from exactspec.verifiers.token import verify

SETTINGS = SamplingSettings()
EOS = {0}


@pytest.mark.parametrize(
    ("history", "max_tokens", "expected"),
    [
        ([5, 6, 7, 8, 5, 6], 3, [7, 8, 5]),  # bigram match, continuation capped at 3
        ([5, 6, 7, 8, 5, 6], 10, [7, 8, 5, 6]),  # ... or at the end of the history
        ([4, 6, 9, 5, 6, 8, 3, 6], 2, [8, 3]),  # unigram: the most recent earlier 6 (index 4), not index 1
        ([5, 6, 1, 9, 6, 2, 5, 6], 2, [1, 9]),  # the longest suffix (5, 6) wins over the more recent 6
        ([5, 6, 7, 0, 9, 6], 3, [7, 0]),  # stops after an EOS
        ([7, 7, 7], 3, [7]),  # overlapping occurrence (7, 7) at 0: one token follows it
        ([1, 2, 3], 3, []),  # no match
        ([4], 3, []),  # nothing earlier to match
        ([5, 6, 5], 0, []),  # no room
    ],
)
def test_lookup_continuation(history: list[int], max_tokens: int, expected: list[int]) -> None:
    assert lookup_continuation(history, max_tokens, EOS) == expected


def test_min_and_max_ngram_bound_the_suffix_length() -> None:
    history = [1, 2, 3, 9, 2, 3, 8, 1, 2, 3]
    assert lookup_continuation(history, 1, EOS, max_ngram=3) == [9]  # (1, 2, 3) at 0
    assert lookup_continuation(history, 1, EOS, max_ngram=2) == [8]  # (2, 3) most recently at 4
    assert lookup_continuation([4, 6, 9, 6], 2, EOS, min_ngram=2) == []  # only a unigram matches
    with pytest.raises(ValueError):
        NgramDrafter(EOS, min_ngram=3, max_ngram=2)


def test_lookup_match_says_which_suffix_length_matched() -> None:
    history = [1, 2, 3, 9, 2, 3, 8, 1, 2, 3]
    assert lookup_match(history, 2, EOS) == LookupMatch(3, [9, 2])
    assert lookup_match(history, 2, EOS, max_ngram=2) == LookupMatch(2, [8, 1])
    assert lookup_match([4, 6, 9, 6], 2, EOS) == LookupMatch(1, [9, 6])
    assert lookup_match([1, 2, 3], 2, EOS) == LookupMatch(0, [])
    assert lookup_match([5, 6, 5], 0, EOS) == LookupMatch(0, [])


@pytest.mark.parametrize(("min_ngram", "max_ngram", "vocab"), [(1, 4, 3), (2, 3, 2), (1, 1, 5), (1, 6, 4)])
def test_the_incremental_index_proposes_what_lookup_match_does(min_ngram, max_ngram, vocab) -> None:
    # Rows join with a prompt and grow by observed chunks, as the engine drives them; every proposal
    # must be lookup_match's on the whole history (the reference), EOS cut and lengths included.
    rng = random.Random(vocab * 10 + max_ngram)
    drafter = NgramDrafter(EOS, min_ngram=min_ngram, max_ngram=max_ngram)
    histories = {row: [rng.randrange(vocab) for _ in range(rng.randint(1, 6))] for row in range(3)}
    drafter.add_rows([RowStart(row, prompt=tuple(history)) for row, history in histories.items()])
    for _ in range(40):
        rows = sorted(histories)
        limits = [rng.randint(0, 5) for _ in rows]
        proposal = drafter.propose([histories[r] for r in rows], limits, SETTINGS, SeededSampler(0), rows)
        for b, row in enumerate(rows):
            expected = lookup_match(histories[row], limits[b], EOS, min_ngram, max_ngram).tokens
            assert proposal.row_tokens(b) == expected, (histories[row], limits[b])
        appended = {row: [rng.randrange(vocab) for _ in range(rng.randint(0, 4))] for row in rows}
        for row, tokens in appended.items():
            histories[row].extend(tokens)
        drafter.observe(appended)


def test_the_index_follows_histories_it_was_not_told_about() -> None:
    # No add_rows, no observe, a row id reused for another text: each proposal is still lookup_match's.
    drafter = NgramDrafter(EOS)
    for history in ([5, 6, 7, 5, 6], [5, 6, 7, 5, 6, 8, 5, 6], [1, 5, 6, 2, 5, 6], [1, 5, 6, 2, 5, 6, 9, 9]):
        proposal = drafter.propose([history], [4], SETTINGS, SeededSampler(0), [0])
        assert proposal.row_tokens(0) == lookup_match(history, 4, EOS).tokens


def test_a_released_row_is_forgotten() -> None:
    drafter = NgramDrafter(EOS)
    drafter.add_rows([RowStart(3, prompt=(4, 5, 4))])
    drafter.release_rows([3])
    assert list(drafter._rows) == []


class FixedLengths:
    """Match length n proposes at most lengths[n] tokens; records each (row, n) asked about."""

    def __init__(self, lengths: dict[int, int]) -> None:
        self.lengths = lengths
        self.asked: list[tuple[int, int]] = []

    def length_for(self, row: int, order: int) -> int:
        self.asked.append((row, order))
        return self.lengths[order]


def test_each_match_proposes_at_most_its_match_lengths_tokens() -> None:
    lengths = FixedLengths({1: 1, 2: 3})
    drafter = NgramDrafter(EOS, lengths=lengths)
    histories = [[4, 6, 9, 8, 7, 6], [5, 6, 7, 8, 9, 5, 6], [1, 2], [3, 4, 3]]
    proposal = drafter.propose(histories, [4, 4, 4, 0], SETTINGS, SeededSampler(0), [7, 2, 5, 9])
    assert proposal.lengths.tolist() == [1, 3, 0, 0]
    assert proposal.row_tokens(0) == [9] and proposal.row_tokens(1) == [7, 8, 9]
    # asked with the engine's row ids, only for rows that found a match with room to draft
    assert lengths.asked == [(7, 1), (2, 2)]


def test_proposal_is_deterministic_without_dense_q() -> None:
    drafter = NgramDrafter(EOS)
    proposal = drafter.propose(
        [[3, 4, 5, 3, 4], [1, 2], [6, 6]], [2, 2, 0], SETTINGS, SeededSampler(0), [0, 1, 2]
    )
    assert proposal.deterministic and proposal.q is None
    assert proposal.tokens.shape == (3, 2)
    assert proposal.lengths.tolist() == [2, 0, 0]
    assert proposal.row_tokens(0) == [5, 3]


def test_no_match_anywhere_gives_an_empty_block() -> None:
    proposal = NgramDrafter(EOS).propose([[1, 2], [3]], [4, 4], SETTINGS, SeededSampler(0), [0, 1])
    assert proposal.tokens.shape == (2, 0)
    assert proposal.lengths.tolist() == [0, 0]


def test_a_proposal_without_q_must_say_deterministic() -> None:
    with pytest.raises(ValueError, match="deterministic"):
        Proposal(tokens=torch.zeros(1, 1, dtype=torch.long), q=None, lengths=torch.ones(1, dtype=torch.long))


class CountingDrafter:
    """Wraps a drafter (passing the row lifecycle and each round's tokens on) and keeps each round's
    proposed lengths."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.lengths: list[list[int]] = []

    def add_rows(self, rows) -> None:
        self.inner.add_rows(rows)

    def release_rows(self, rows) -> None:
        self.inner.release_rows(rows)

    def observe(self, appended) -> None:
        self.inner.observe(appended)

    def propose(self, histories, max_tokens, settings, sampler, rows) -> Proposal:
        proposal = self.inner.propose(histories, max_tokens, settings, sampler, rows)
        self.lengths.append(proposal.lengths.tolist())
        return proposal

    @property
    def empty_rounds(self) -> int:
        """Rounds in which no row proposed anything."""
        return sum(max(lengths) == 0 for lengths in self.lengths)


@pytest.mark.parametrize("verifier", [verify, verify_block], ids=["token", "block"])
def test_engine_runs_rounds_where_no_row_matches(verifier) -> None:
    target = random_tabular_model(50, seed=1, eos_token_id=None)
    drafter = CountingDrafter(NgramDrafter(EOS))
    engine = SpeculativeEngine(target, drafter, verifier=verifier)
    config = DecodeConfig(gamma=4, max_new_tokens=6)
    states = engine.generate([[1, 2, 3], [4, 5, 6]], config, SeededSampler(0, num_rows=2))
    assert drafter.lengths[0] == [0, 0]  # no repeats in either prompt: a round of one target token each
    assert all(len(state.generated) == 6 for state in states)
    assert engine.metrics.proposed_tokens == sum(sum(lengths) for lengths in drafter.lengths)
    assert engine.metrics.draft_calls == 0  # no draft model ran


# The grid's lookup and hybrid cases; with adaptive gamma they are tests/decoding/test_gamma.py's, through
# llama.cpp tests/checking/test_llamacpp_grid.py's.
NGRAM_CASES = grid_cases("lookup")


@pytest.mark.parametrize("case", NGRAM_CASES, ids=lambda case: case.name)
def test_lookup_and_hybrid_are_exact(case: ExactCase) -> None:
    result = run_exact_case(case)
    assert result.total_variation <= case.tolerance, result.total_variation


def test_the_no_match_case_really_has_rounds_without_a_match() -> None:
    case = next(case for case in NGRAM_CASES if "no match" in case.name)
    target, _ = case.models()
    drafter = CountingDrafter(NgramDrafter(target.eos_token_ids))
    config = DecodeConfig(gamma=case.gamma, max_new_tokens=case.max_new_tokens)
    result = check_speculative(lambda: SpeculativeEngine(target, drafter), case.prompts, config)
    assert result.total_variation <= EXACT_TOLERANCE
    assert 0 < drafter.empty_rounds < len(drafter.lengths)


# ---------------------------------------------------------------- hybrid


def test_hybrid_uses_the_lookup_where_it_matches_and_the_model_elsewhere() -> None:
    draft = random_tabular_model(7, seed=2)
    model = ModelDrafter(draft, 7)
    hybrid = HybridDrafter(NgramDrafter(EOS), model, 7)
    histories = [[3, 4, 5, 3, 4], [1, 2]]
    proposal = hybrid.propose(histories, [2, 3], SETTINGS, SeededSampler(0, 2), [0, 1])
    assert not proposal.deterministic and proposal.q is not None
    assert proposal.q.shape == (2, 3, 7)
    assert proposal.row_tokens(0) == [5, 3]
    assert torch.equal(
        proposal.q[0, :2], torch.nn.functional.one_hot(torch.tensor([5, 3]), 7).to(proposal.q.dtype)
    )
    alone = model.propose([[1, 2]], [3], SETTINGS, SeededSampler(0, 2), [1])  # row 1's own stream
    length = int(alone.lengths[0])
    assert proposal.lengths[1] == length
    assert torch.equal(proposal.tokens[1, :length], alone.tokens[0, :length])
    assert torch.equal(proposal.q[1, :length], alone.q[0, :length])


def test_hybrid_passes_a_single_source_through() -> None:
    model = ModelDrafter(random_tabular_model(7, seed=2), 7)
    hybrid = HybridDrafter(NgramDrafter(EOS), model, 7)
    all_lookup = hybrid.propose([[3, 4, 3]], [2], SETTINGS, SeededSampler(0), [0])
    assert all_lookup.deterministic and all_lookup.q is None
    all_model = hybrid.propose([[1, 2]], [2], SETTINGS, SeededSampler(0), [0])
    assert not all_model.deterministic and all_model.q is not None


# ---------------------------------------------------------------- teeth: drafters that lie


class OneHotOnTheWrongToken(Stateless):
    """Proposes the lookup's tokens but reports q one-hot on the next id: q(X) = 0 for what it drew."""

    def __init__(self, vocab_size: int) -> None:
        self.lookup = NgramDrafter(EOS)
        self.vocab_size = vocab_size

    def propose(self, histories, max_tokens, settings, sampler, rows) -> Proposal:
        proposal = self.lookup.propose(histories, max_tokens, settings, sampler, rows)
        claimed = (proposal.tokens + 1) % self.vocab_size
        q = torch.nn.functional.one_hot(claimed, self.vocab_size).to(torch.float64)
        return Proposal(tokens=proposal.tokens, q=q, lengths=proposal.lengths, deterministic=True)


class LookupTokensUniformQ(Stateless):
    """Proposes the lookup's tokens but reports a uniform q, as if it had drawn them at random."""

    def __init__(self, vocab_size: int) -> None:
        self.lookup = NgramDrafter(EOS)
        self.vocab_size = vocab_size

    def propose(self, histories, max_tokens, settings, sampler, rows) -> Proposal:
        proposal = self.lookup.propose(histories, max_tokens, settings, sampler, rows)
        batch_size, width = proposal.tokens.shape
        q = torch.full((batch_size, width, self.vocab_size), 1.0 / self.vocab_size, dtype=torch.float64)
        return Proposal(tokens=proposal.tokens, q=q, lengths=proposal.lengths)


class SamplesButClaimsDeterministic(Stateless):
    """Draws from the draft model but reports a deterministic proposal (q = None)."""

    def __init__(self, model: ModelDrafter) -> None:
        self.model = model

    def propose(
        self,
        histories: Sequence[Sequence[int]],
        max_tokens: Sequence[int],
        settings: SamplingSettings,
        sampler: Sampler,
        rows: Sequence[int],
    ) -> Proposal:
        proposal = self.model.propose(histories, max_tokens, settings, sampler, rows)
        return Proposal(tokens=proposal.tokens, q=None, lengths=proposal.lengths, deterministic=True)


TEETH_CASE = ExactCase("teeth", 4, 3, 3, prompts=((1, 2, 1),))
# TEETH_CASE with V = 3: 217 random paths instead of 1573 (the draft's draws are enumerated too), the
# same gamma 3 and 3 new tokens. A one-hot residual that keeps X (p instead of p without X) is still
# caught here (TV 0.046; 0.036 on TEETH_CASE).
SAMPLED_ONE_HOT_CASE = ExactCase("sampled, verified as one-hot", 3, 3, 3, prompts=((1, 2, 1),))


@pytest.mark.parametrize("verifier", [verify, verify_block], ids=["token", "block"])
def test_teeth_lying_lookup_drafters_are_caught(verifier) -> None:
    target, _ = TEETH_CASE.models()
    config = DecodeConfig(gamma=TEETH_CASE.gamma, max_new_tokens=TEETH_CASE.max_new_tokens)
    honest = check_speculative(
        lambda: SpeculativeEngine(target, NgramDrafter(EOS), verifier), TEETH_CASE.prompts, config
    )
    assert honest.total_variation <= EXACT_TOLERANCE
    for liar in (OneHotOnTheWrongToken(4), LookupTokensUniformQ(4)):
        caught = check_speculative(
            lambda liar=liar: SpeculativeEngine(target, liar, verifier), TEETH_CASE.prompts, config
        )
        assert caught.total_variation > 1e-6, type(liar).__name__


@pytest.mark.parametrize("verifier", [verify, verify_block], ids=["token", "block"])
def test_sampled_tokens_verified_as_one_hot_stay_exact(verifier) -> None:
    # Not a lie that can be caught: given the proposed X, "accept with p(X), else draw from p without X"
    # outputs y with probability p(X) [y = X] + (1 - p(X)) p(y) [y != X] / (1 - p(X)) = p(y), whatever
    # produced X. A deterministic proposal may therefore come from any source; it only accepts less.
    case = SAMPLED_ONE_HOT_CASE
    target, draft = case.models()
    config = DecodeConfig(gamma=case.gamma, max_new_tokens=case.max_new_tokens)
    drafter = SamplesButClaimsDeterministic(ModelDrafter(draft, case.vocab_size))
    result = check_speculative(lambda: SpeculativeEngine(target, drafter, verifier), case.prompts, config)
    assert result.total_variation <= EXACT_TOLERANCE
