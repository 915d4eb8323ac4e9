"""Block verification: hand-built cases with known answers, exact engine checks, teeth, and its gain.

The gain: expected tokens per round, computed exactly by enumeration, is never
below token verification's from the same drafts (docs/algorithm.md 5).
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import pytest
import torch
from conftest import grid_cases

import exactspec.verifiers.block as block_module
from exactspec.checking.exact import EnumeratingSampler, check_speculative, enumerate_outputs
from exactspec.checking.grid import EXACT_TOLERANCE, ExactCase, run_exact_case
from exactspec.checking.toy import random_tabular_model
from exactspec.decoding.engine import DecodeConfig, SpeculativeEngine
from exactspec.decoding.strategy import Strategy
from exactspec.drafters import ModelDrafter
from exactspec.verifiers.block import verify_block
from exactspec.verifiers.residual import residual_distribution
from exactspec.verifiers.token import NO_TOKEN, verify

A, B = 0, 1
P_PAPER = [1 / 3, 2 / 3]  # the paper's motivating example: context-free target over {a, b}
Q_PAPER = [2 / 3, 1 / 3]  # and draft


def _paper_round(draft: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """draft_tokens [1, gamma], q [1, gamma, 2], p [1, gamma + 1, 2] for the context-free example."""
    gamma = len(draft)
    tokens = torch.tensor([list(draft)], dtype=torch.long)
    q = torch.tensor([Q_PAPER] * gamma, dtype=torch.float64).unsqueeze(0)
    p = torch.tensor([P_PAPER] * (gamma + 1), dtype=torch.float64).unsqueeze(0)
    return tokens, q, p


def _outcomes(verifier, tokens, q, p, lengths, eos=()) -> dict[tuple, float]:
    """Exact distribution of (emitted tokens per row, accepted per row) of one verifier call."""

    def run(sampler: EnumeratingSampler):
        result = verifier(tokens, q, p, lengths, eos, sampler)
        emitted = tuple(tuple(result.emitted(b)) for b in range(tokens.shape[0]))
        return emitted, tuple(result.num_accepted.tolist())

    distribution, _ = enumerate_outputs(run)
    return distribution


@pytest.mark.parametrize(
    ("verifier", "expected"), [(verify, Fraction(10, 9)), (verify_block, Fraction(11, 9))]
)
def test_paper_example_expected_accepted_tokens(verifier, expected: Fraction) -> None:
    # Sun et al. section 1: gamma = 2 gives 10/9 accepted tokens per round token by token, 11/9 by block.
    mean = 0.0
    for draft in itertools.product((A, B), repeat=2):
        draft_probability = Q_PAPER[draft[0]] * Q_PAPER[draft[1]]
        tokens, q, p = _paper_round(draft)
        for (_, accepted), prob in _outcomes(verifier, tokens, q, p, torch.tensor([2])).items():
            mean += draft_probability * prob * accepted[0]
    assert mean == pytest.approx(float(expected), abs=1e-12)


def test_worked_example_draft_a_b_is_always_kept() -> None:
    # w_1 = 1/2, w_2 = min(1, 1/2 * 2) = 1 = h_2: both kept, then a bonus from p.
    tokens, q, p = _paper_round((A, B))
    outcomes = _outcomes(verify_block, tokens, q, p, torch.tensor([2]))
    assert outcomes == pytest.approx({(((A, B, A),), (2,)): 1 / 3, (((A, B, B),), (2,)): 2 / 3})
    token_outcomes = _outcomes(verify, tokens, q, p, torch.tensor([2]))
    assert sum(prob for (_, accepted), prob in token_outcomes.items() if accepted == (2,)) == pytest.approx(
        0.5
    )


def test_worked_example_draft_a_a_keeps_both_or_nothing() -> None:
    # w = (1/2, 1/4), S_1 = 0 so h_1 = 0: tau is 2 (prob 1/4) or 0, and the residual [p_1 - q_1]+ is b.
    tokens, q, p = _paper_round((A, A))
    outcomes = _outcomes(verify_block, tokens, q, p, torch.tensor([2]))
    assert outcomes == pytest.approx(
        {(((A, A, A),), (2,)): 1 / 4 * 1 / 3, (((A, A, B),), (2,)): 1 / 4 * 2 / 3, (((B,),), (0,)): 3 / 4}
    )


def test_gamma_one_is_token_verification() -> None:
    tokens, q, p = _paper_round((A,))
    lengths = torch.tensor([1])
    assert _outcomes(verify_block, tokens, q, p, lengths) == pytest.approx(
        _outcomes(verify, tokens, q, p, lengths)
    )


def test_block_is_cut_after_the_first_eos() -> None:
    eos = {0}
    tokens = torch.tensor([[1, 0, 2]])
    p = torch.full((1, 4, 3), 1 / 3, dtype=torch.float64)
    q = p[:, :3].clone()  # q = p: every coin is certain, nothing after the EOS may be emitted
    result = verify_block(tokens, q, p, torch.tensor([3]), eos, EnumeratingSampler())
    assert result.tokens.tolist() == [[1, 0, NO_TOKEN, NO_TOKEN]]
    assert result.num_emitted.tolist() == [2]
    assert result.num_accepted.tolist() == [2]
    assert result.hit_eos.tolist() == [True]


def test_rows_of_different_lengths_in_one_call() -> None:
    generator = torch.Generator().manual_seed(3)
    p = torch.rand(3, 4, 4, generator=generator, dtype=torch.float64)
    p = p / p.sum(-1, keepdim=True)  # [3, gamma + 1, V]
    q = torch.rand(3, 3, 4, generator=generator, dtype=torch.float64)
    q = q / q.sum(-1, keepdim=True)  # [3, gamma, V]
    tokens = torch.tensor([[1, 2, 3], [2, 2, 2], [3, 1, 2]])
    lengths = torch.tensor([0, 1, 3])
    joint = _outcomes(verify_block, tokens, q, p, lengths)
    # Each row alone gives its marginal: rows do not leak into each other (docs/algorithm.md 4).
    for b in range(3):
        alone = _outcomes(verify_block, tokens[b : b + 1], q[b : b + 1], p[b : b + 1], lengths[b : b + 1])
        marginal: dict = {}
        for (emitted, accepted), prob in joint.items():
            key = ((emitted[b],), (accepted[b],))
            marginal[key] = marginal.get(key, 0.0) + prob
        assert marginal == pytest.approx(alone)
    assert all(len(emitted[0]) == 1 for emitted, _ in joint)  # length 0: one bonus token from p[0, 0]


def test_zero_draft_probability_and_the_zero_over_zero_stop_are_defined() -> None:
    # q_1(X_1) = 0 gives w_1 = 1 (docs/algorithm.md 1.2 "use 1"); then p_2 = q_2 makes S_1 = 0 and
    # 1 - w_1 = 0: h_1 = 0,
    # and h_2 = w_2 = 1 decides the round.
    tokens = torch.tensor([[0, 2]])
    lengths = torch.tensor([2])
    p = torch.tensor([[[0.5, 0.5, 0.0], [0.2, 0.3, 0.5], [1.0, 0.0, 0.0]]], dtype=torch.float64)
    q = torch.tensor([[[0.0, 1.0, 0.0], [0.2, 0.3, 0.5]]], dtype=torch.float64)
    weights = block_module.block_weights(tokens, q, p, lengths)
    assert weights.tolist() == [[1.0, 1.0, 1.0]]
    assert block_module.stop_probabilities(tokens, q, p, lengths, weights).tolist() == [[0.0, 1.0]]
    assert _outcomes(verify_block, tokens, q, p, lengths) == {(((0, 2, 0),), (2,)): 1.0}


def test_zero_residual_mass_falls_back_to_p() -> None:
    p = torch.tensor([[0.25, 0.75]], dtype=torch.float64)
    assert torch.equal(residual_distribution(p, p.clone(), torch.tensor([1])), p)
    one_hot_p = torch.tensor([[0.0, 1.0]], dtype=torch.float64)
    assert torch.equal(residual_distribution(one_hot_p, None, torch.tensor([1])), one_hot_p)


@pytest.mark.parametrize("verifier", [verify, verify_block], ids=["token", "block"])
def test_deterministic_q_none_matches_dense_one_hot(verifier) -> None:
    generator = torch.Generator().manual_seed(5)
    p = torch.rand(2, 4, 4, generator=generator, dtype=torch.float64)
    p = p / p.sum(-1, keepdim=True)  # [2, gamma + 1, V]
    tokens = torch.tensor([[1, 3, 0], [2, 2, 1]])
    lengths = torch.tensor([3, 2])
    dense = torch.nn.functional.one_hot(tokens, 4).to(torch.float64)  # [2, gamma, V]
    with_q = _outcomes(verifier, tokens, dense, p, lengths, eos={0})
    without_q = _outcomes(verifier, tokens, None, p, lengths, eos={0})
    assert without_q == pytest.approx(with_q, abs=1e-15)
    assert set(without_q) == set(with_q)


def test_validation_still_checks_shapes() -> None:
    tokens, q, p = _paper_round((A, B))
    with pytest.raises(ValueError, match="q must be"):
        verify_block(tokens, q[:, :1], p, torch.tensor([2]), (), EnumeratingSampler())
    with pytest.raises(ValueError, match="draft_lengths"):
        verify_block(tokens, q, p, torch.tensor([3]), (), EnumeratingSampler())


# The grid's block cases with a draft model; with adaptive gamma they are tests/decoding/test_gamma.py's,
# through llama.cpp tests/checking/test_llamacpp_grid.py's.
BLOCK_CASES = grid_cases("block")


@pytest.mark.parametrize("case", BLOCK_CASES, ids=lambda case: case.name)
def test_block_verification_is_exact(case: ExactCase) -> None:
    result = run_exact_case(case)
    assert result.total_variation <= case.tolerance, result.total_variation


def test_grid_covers_gamma_one_to_five_transforms_batches_and_eos_in_the_block() -> None:
    names = {case.name for case in BLOCK_CASES}
    assert {case.gamma for case in BLOCK_CASES} >= {1, 2, 3, 4, 5}
    assert "block all transforms, T=0.8" in names
    assert any(len(case.prompts) == 2 for case in BLOCK_CASES)
    assert any(case.max_new_tokens < case.gamma for case in BLOCK_CASES)
    assert any(case.draft == "no-eos" for case in BLOCK_CASES)


# ---------------------------------------------------------------- teeth


def _check_block(case: ExactCase) -> float:
    target, draft = case.models()
    config = DecodeConfig(gamma=case.gamma, max_new_tokens=case.max_new_tokens, settings=case.settings)
    drafter = ModelDrafter(draft, target.vocab_size)
    return check_speculative(
        lambda: SpeculativeEngine(target, drafter, verify_block), case.prompts, config
    ).total_variation


# V = 4, gamma = 2, n = 3, seed 2: enough paths with 0 < w_i < 1 that a wrong weight shows.
TEETH_CASE = ExactCase(
    "teeth", 4, 2, 3, seed=2, strategy=Strategy("model", verifier="block", adaptive_gamma=False)
)


def test_teeth_stop_probability_from_the_previous_weight(monkeypatch: pytest.MonkeyPatch) -> None:
    original = block_module.stop_probabilities

    def shifted(draft_tokens, q, p, lengths, weights):
        previous = torch.cat([weights[:, :1], weights[:, :-1]], dim=1)  # w_{i-1} where w_i belongs
        return original(draft_tokens, q, p, lengths, previous)

    assert _check_block(TEETH_CASE) <= EXACT_TOLERANCE
    monkeypatch.setattr(block_module, "stop_probabilities", shifted)
    assert _check_block(TEETH_CASE) > 1e-6


def test_teeth_residual_mass_without_the_weight(monkeypatch: pytest.MonkeyPatch) -> None:
    original = block_module.residual_mass
    monkeypatch.setattr(
        block_module, "residual_mass", lambda p, q, x, w: original(p, q, x, torch.ones_like(w))
    )
    assert _check_block(TEETH_CASE) > 1e-6


def test_teeth_residual_from_p_minus_q(monkeypatch: pytest.MonkeyPatch) -> None:
    original = block_module.residual_distribution
    monkeypatch.setattr(block_module, "residual_distribution", lambda p, q, x, w: original(p, q, x, None))
    assert _check_block(TEETH_CASE) > 1e-6


# ---------------------------------------------------------------- the gain


def _expected_tokens_per_round(verifier, seed: int, vocab: int, gamma: int) -> float:
    """E[tokens emitted in one round], exactly, over draft draws and verifier coins (no EOS: tau + 1)."""
    target = random_tabular_model(vocab, seed=seed, eos_token_id=None)
    draft = random_tabular_model(vocab, seed=seed + 100, eos_token_id=None)
    engine = SpeculativeEngine(target, ModelDrafter(draft, vocab), verifier=verifier)
    config = DecodeConfig(gamma=gamma, max_new_tokens=gamma + 1)

    def run(sampler: EnumeratingSampler) -> int:
        states = [engine.new_row([1])]  # toy models and no policy: no row state to set up
        return len(engine.round(states, [0], config, sampler).new_tokens[0])

    distribution, _ = enumerate_outputs(run)
    return sum(count * prob for count, prob in distribution.items())


# (seed, V, gamma): three random pairs for each vocabulary and gamma but V=4 with gamma=3, whose 64 draft
# blocks per pair made two thirds of the test's time; it keeps one pair. (The smallest gain of the 12
# was 0.016, at V=3, gamma=2; at V=4, gamma=3 the three pairs gained 0.08 to 0.12.)
GAIN_CASES = [
    *itertools.product((1, 2, 3), (3, 4), (2,)),
    *itertools.product((1, 2, 3), (3,), (3,)),
    (1, 4, 3),
]


def test_block_never_gives_fewer_tokens_per_round_than_token_verification() -> None:
    gains = []
    for seed, vocab, gamma in GAIN_CASES:
        token = _expected_tokens_per_round(verify, seed, vocab, gamma)
        block = _expected_tokens_per_round(verify_block, seed, vocab, gamma)
        assert block >= token - 1e-12, (seed, vocab, gamma, token, block)
        gains.append(block - token)
    assert max(gains) > 1e-3  # and it does gain somewhere
