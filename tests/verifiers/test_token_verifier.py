"""The verifier: hand-built rounds with known answers, input validation, and a statistical check."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
from scipy import stats

import exactspec.verifiers.token as verifier_module
from exactspec.foundations.sampler import Sampler, SeededSampler
from exactspec.verifiers.token import NO_TOKEN, VerifyResult, verify

EOS = 0


class ScriptedSampler:
    """A Sampler whose coins follow a script and whose categorical draws take the most likely id.

    Every call is recorded, so a test can check the exact acceptance probabilities
    and residual distributions the verifier asked for. A scripted coin must be
    possible: True needs probability > 0, False needs probability < 1.
    With no script left, a coin comes up True exactly when its probability is 1.
    """

    def __init__(self, coins: Sequence[bool] = ()) -> None:
        self.coins = list(coins)
        self.coin_calls: list[tuple[torch.Tensor, list[int]]] = []
        self.categorical_calls: list[tuple[torch.Tensor, list[int]]] = []

    def bernoulli(self, probs: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
        assert torch.isfinite(probs).all() and ((probs >= 0) & (probs <= 1)).all(), probs
        self.coin_calls.append((probs.clone(), list(rows)))
        out = []
        for prob in probs.tolist():
            coin = self.coins.pop(0) if self.coins else prob >= 1.0
            assert (prob > 0) if coin else (prob < 1), f"scripted coin {coin} is impossible at {prob}"
            out.append(coin)
        return torch.tensor(out, dtype=torch.bool)

    def categorical(self, probs: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
        assert torch.isfinite(probs).all() and (probs >= 0).all(), probs
        self.categorical_calls.append((probs.clone(), list(rows)))
        return probs.argmax(dim=-1)


def _one_hot(token: int, vocab_size: int = 5) -> list[float]:
    return [1.0 if t == token else 0.0 for t in range(vocab_size)]


def _run(
    draft: list[list[int]],
    q: list[list[list[float]]],
    p: list[list[list[float]]],
    lengths: list[int] | None = None,
    sampler: Sampler | None = None,
    eos: set[int] | None = None,
    rows: list[int] | None = None,
) -> VerifyResult:
    draft_tokens = torch.tensor(draft, dtype=torch.long)
    return verify(
        draft_tokens,
        torch.tensor(q, dtype=torch.float64),
        torch.tensor(p, dtype=torch.float64),
        torch.tensor(lengths if lengths is not None else [draft_tokens.shape[1]] * draft_tokens.shape[0]),
        {EOS} if eos is None else eos,
        sampler if sampler is not None else ScriptedSampler(),
        rows,
    )


# ---------------------------------------------------------------- known answers

P = [0.1, 0.2, 0.3, 0.4, 0.0]


def test_p_equal_q_accepts_every_draft_token_and_draws_the_bonus_from_the_last_p() -> None:
    sampler = ScriptedSampler()
    result = _run([[1, 2, 3]], [[P, P, P]], [[P, P, P, _one_hot(4)]], sampler=sampler)
    assert result.tokens.tolist() == [[1, 2, 3, 4]]
    assert result.num_accepted.tolist() == [3]
    assert result.num_emitted.tolist() == [4]
    assert result.hit_eos.tolist() == [False]
    assert [probs.tolist() for probs, _ in sampler.coin_calls] == [[1.0], [1.0], [1.0]]
    ((bonus_probs, _),) = sampler.categorical_calls
    assert bonus_probs.tolist() == [_one_hot(4)]


def test_p_equal_q_accepts_everything_with_a_real_sampler() -> None:
    generator = torch.Generator().manual_seed(0)
    batch, gamma, vocab = 256, 4, 7
    probs = torch.rand(batch, gamma + 1, vocab, generator=generator, dtype=torch.float64)
    probs[..., 0] = 0.0  # no EOS: every round must go all the way to the bonus
    probs /= probs.sum(-1, keepdim=True)
    draft = torch.multinomial(probs[:, :gamma].reshape(-1, vocab), 1, generator=generator).view(batch, gamma)
    result = verify(
        draft, probs[:, :gamma], probs, torch.full((batch,), gamma), {EOS}, SeededSampler(1, batch)
    )
    assert result.num_accepted.tolist() == [gamma] * batch
    assert result.num_emitted.tolist() == [gamma + 1] * batch
    assert torch.equal(result.tokens[:, :gamma], draft)
    assert (result.tokens[:, gamma] != EOS).all()


def test_q_zero_at_the_draft_token_accepts_without_nan() -> None:
    # q(x) = 0 cannot happen for a drawn x; the convention is a(x) = 1, and 0 / 0 must not appear.
    q = [0.5, 0.5, 0.0, 0.0, 0.0]
    sampler = ScriptedSampler()
    result = _run([[2, 4]], [[q, q]], [[P, P, _one_hot(1)]], sampler=sampler)
    assert [probs.tolist() for probs, _ in sampler.coin_calls] == [[1.0], [1.0]]  # p(2) = 0.3 > 0, p(4) = 0
    assert result.tokens.tolist() == [[2, 4, 1]]
    assert result.num_accepted.tolist() == [2]


def test_acceptance_probability_is_min_one_p_over_q() -> None:
    q = [0.1, 0.4, 0.1, 0.2, 0.2]
    p = [0.1, 0.1, 0.3, 0.2, 0.3]
    sampler = ScriptedSampler(coins=[True, True, True])
    _run([[1, 2, 4]], [[q, q, q]], [[p, p, p, p]], sampler=sampler)
    coins = [probs.item() for probs, _ in sampler.coin_calls]
    assert coins == pytest.approx([0.25, 1.0, 1.0], abs=1e-15)


def test_rejection_draws_from_the_positive_part_of_p_minus_q() -> None:
    # At position 1: q = [0.6, 0.4, 0, 0, 0], p = [0.2, 0.4, 0, 0.4, 0]; X = 0 is accepted with 1/3.
    # The forced rejection must draw from [p - q]+ / beta = one-hot on 3.
    q_1 = [0.6, 0.4, 0.0, 0.0, 0.0]
    p_1 = [0.2, 0.4, 0.0, 0.4, 0.0]
    sampler = ScriptedSampler(coins=[True, False])
    result = _run([[2, 0, 1]], [[P, q_1, P]], [[P, p_1, P, P]], sampler=sampler, eos=set())
    assert result.tokens.tolist() == [[2, 3, NO_TOKEN, NO_TOKEN]]
    assert result.num_accepted.tolist() == [1]
    assert result.num_emitted.tolist() == [2]
    assert result.hit_eos.tolist() == [False]
    assert sampler.coin_calls[1][0].item() == pytest.approx(1 / 3, abs=1e-15)
    assert len(sampler.coin_calls) == 2  # nothing after the first rejection is looked at
    ((residual, _),) = sampler.categorical_calls
    torch.testing.assert_close(residual, torch.tensor([_one_hot(3)], dtype=torch.float64), atol=1e-15, rtol=0)


def test_certain_rejection_and_residual_with_a_real_sampler() -> None:
    # p(x) = 0 for the draft token: rejection is certain; [p - q]+ is one-hot on 1: the answer is certain.
    q = [0.0, 0.2, 0.8, 0.0, 0.0]
    p = [0.0, 1.0, 0.0, 0.0, 0.0]
    for seed in range(20):
        result = _run([[2]], [[q]], [[p, P]], sampler=SeededSampler(seed))
        assert result.tokens.tolist() == [[1, NO_TOKEN]]
        assert result.num_accepted.tolist() == [0]


def test_residual_is_normalised_positive_part() -> None:
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.25, 0.25, 0.25, 0.25]], dtype=torch.float64)
    q = torch.tensor([[0.1, 0.5, 0.2, 0.2], [0.25, 0.25, 0.25, 0.25]], dtype=torch.float64)
    residual = verifier_module._residual(p, q)
    # Row 0: [0.4, 0, 0, 0] / 0.4. Row 1: p == q, beta = 0: falls back to p, never NaN.
    torch.testing.assert_close(residual, torch.tensor([[1.0, 0, 0, 0], [0.25] * 4], dtype=torch.float64))
    assert torch.isfinite(residual).all()


def test_accepted_eos_ends_the_round_without_bonus() -> None:
    sampler = ScriptedSampler()
    result = _run([[4, EOS, 2]], [[P, _one_hot(EOS), P]], [[P, _one_hot(EOS), P, P]], sampler=sampler)
    assert result.tokens.tolist() == [[4, EOS, NO_TOKEN, NO_TOKEN]]
    assert result.num_accepted.tolist() == [2]
    assert result.num_emitted.tolist() == [2]  # = accepted: no bonus after EOS
    assert result.hit_eos.tolist() == [True]
    assert sampler.categorical_calls == []
    assert len(sampler.coin_calls) == 2


def test_eos_from_the_residual_sets_hit_eos() -> None:
    q = [0.0, 0.0, 1.0, 0.0, 0.0]
    p = [0.5, 0.0, 0.5, 0.0, 0.0]  # residual [0.5, 0, 0, 0, 0] -> EOS
    result = _run([[2, 3]], [[q, P]], [[p, P, P]], sampler=ScriptedSampler(coins=[False]))
    assert result.tokens.tolist() == [[EOS, NO_TOKEN, NO_TOKEN]]
    assert result.hit_eos.tolist() == [True]
    assert result.num_emitted.tolist() == [1]
    assert result.num_accepted.tolist() == [0]


def test_eos_from_the_bonus_sets_hit_eos() -> None:
    result = _run([[1, 2]], [[P, P]], [[P, P, _one_hot(EOS)]])
    assert result.tokens.tolist() == [[1, 2, EOS]]
    assert result.hit_eos.tolist() == [True]
    assert result.num_emitted.tolist() == [3]
    assert result.num_accepted.tolist() == [2]


def test_several_eos_ids() -> None:
    result = _run([[3]], [[P]], [[P, _one_hot(2)]], eos={0, 2})
    assert result.hit_eos.tolist() == [True]
    result = _run([[3]], [[P]], [[P, _one_hot(2)]], eos={0, 4})
    assert result.hit_eos.tolist() == [False]
    result = _run([[3]], [[P]], [[P, _one_hot(EOS)]], eos=set())
    assert result.hit_eos.tolist() == [False]


def test_short_draft_takes_the_bonus_from_p_at_its_length() -> None:
    # gamma = 3, but row 0 proposes 1 token and row 1 none: bonus from p[0, 1] and p[1, 0].
    p_row0 = [P, _one_hot(3), _one_hot(1), _one_hot(2)]
    p_row1 = [_one_hot(4), _one_hot(3), _one_hot(1), _one_hot(2)]
    # Padding past the length may hold anything, even invalid ids and non-distributions.
    draft = [[1, -7, 99], [123, 0, 0]]
    garbage = [float("nan")] * 5
    q = [[P, garbage, garbage], [garbage, garbage, garbage]]
    p = [p_row0, p_row1]
    p[0][2] = garbage
    p[0][3] = garbage
    result = _run(draft, q, p, lengths=[1, 0])
    assert result.tokens.tolist() == [[1, 3, NO_TOKEN, NO_TOKEN], [4, NO_TOKEN, NO_TOKEN, NO_TOKEN]]
    assert result.num_accepted.tolist() == [1, 0]
    assert result.num_emitted.tolist() == [2, 1]
    assert result.emitted(0) == [1, 3]
    assert result.emitted(1) == [4]


def test_gamma_zero_is_one_plain_draw_from_p() -> None:
    tokens = torch.zeros(2, 0, dtype=torch.long)
    q = torch.zeros(2, 0, 5, dtype=torch.float64)
    p = torch.tensor([[_one_hot(3)], [_one_hot(EOS)]], dtype=torch.float64)
    result = verify(tokens, q, p, torch.zeros(2, dtype=torch.long), {EOS}, ScriptedSampler())
    assert result.tokens.tolist() == [[3], [EOS]]
    assert result.hit_eos.tolist() == [False, True]
    assert result.num_emitted.tolist() == [1, 1]


def test_padding_after_the_emitted_tokens_is_no_token() -> None:
    q_reject = [0.0, 0.0, 0.0, 1.0, 0.0]
    p_reject = [0.0, 1.0, 0.0, 0.0, 0.0]
    result = _run(
        [[3, 1, 2], [1, 2, 3], [EOS, 1, 2]],
        [[q_reject, P, P], [P, P, P], [_one_hot(EOS), P, P]],
        [[p_reject, P, P, P], [P, P, P, _one_hot(4)], [_one_hot(EOS), P, P, P]],
    )
    assert result.tokens.tolist() == [
        [1, NO_TOKEN, NO_TOKEN, NO_TOKEN],
        [1, 2, 3, 4],
        [EOS, NO_TOKEN, NO_TOKEN, NO_TOKEN],
    ]
    assert result.num_emitted.tolist() == [1, 4, 1]
    for row in range(3):
        count = int(result.num_emitted[row])
        assert (result.tokens[row, count:] == NO_TOKEN).all()
        assert (result.tokens[row, :count] != NO_TOKEN).all()


def test_each_row_draws_from_its_own_stream() -> None:
    sampler = ScriptedSampler()
    _run([[1], [2]], [[P], [P]], [[P, P], [P, P]], sampler=sampler, rows=[7, 3])
    assert [rows for _, rows in sampler.coin_calls] == [[7, 3]]
    assert [rows for _, rows in sampler.categorical_calls] == [[7, 3]]


def test_rows_are_independent_of_each_other_in_a_batch() -> None:
    # The same row alone (stream 5) or inside a batch (stream 5 at index 1) gives the same result.
    generator = torch.Generator().manual_seed(4)
    q = torch.rand(3, 3, 6, generator=generator, dtype=torch.float64)
    p = torch.rand(3, 4, 6, generator=generator, dtype=torch.float64)
    q, p = q / q.sum(-1, keepdim=True), p / p.sum(-1, keepdim=True)
    draft = torch.randint(1, 6, (3, 3), generator=generator)
    lengths = torch.tensor([3, 2, 3])
    for seed in range(10):
        batch = verify(draft, q, p, lengths, {EOS}, SeededSampler(seeds=[seed + 100, seed, seed + 200]))
        alone = verify(draft[1:2], q[1:2], p[1:2], lengths[1:2], {EOS}, SeededSampler(seeds=[seed]))
        assert batch.emitted(1) == alone.emitted(0)
        assert batch.num_accepted[1] == alone.num_accepted[0]


def test_fuzz_never_emits_invalid_tokens_or_asks_for_nan() -> None:
    # Random p and q with many zeros, ties (p == q rows) and one-hots; the recording sampler asserts
    # every probability it receives is finite, and the result must be consistent.
    generator = torch.Generator().manual_seed(0)
    batch, gamma, vocab = 300, 4, 6

    class CheckingSampler(SeededSampler):
        def bernoulli(self, probs: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
            assert torch.isfinite(probs).all() and (probs >= 0).all() and (probs <= 1).all()
            return super().bernoulli(probs, rows)

        def categorical(self, probs: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
            assert torch.isfinite(probs).all() and (probs >= 0).all()
            torch.testing.assert_close(probs.sum(-1), torch.ones(len(rows), dtype=probs.dtype))
            drawn = super().categorical(probs, rows)
            assert (probs.gather(1, drawn.unsqueeze(-1)) > 0).all()
            return drawn

    def random_probs(*shape: int) -> torch.Tensor:
        raw = torch.rand(*shape, generator=generator, dtype=torch.float64)
        raw = raw * (torch.rand(*shape, generator=generator) < 0.5)
        raw[..., 1] += 1e-3  # at least one id with mass
        return raw / raw.sum(-1, keepdim=True)

    q = random_probs(batch, gamma, vocab)
    p = random_probs(batch, gamma + 1, vocab)
    p[::3, :gamma] = q[::3]  # p == q rows: beta = 0
    draft = torch.multinomial(q.reshape(-1, vocab), 1, generator=generator).view(batch, gamma)
    lengths = torch.randint(0, gamma + 1, (batch,), generator=generator)
    result = verify(draft, q, p, lengths, {EOS}, CheckingSampler(0, batch))
    assert ((result.num_accepted >= 0) & (result.num_accepted <= lengths)).all()
    assert ((result.num_emitted >= 1) & (result.num_emitted <= lengths + 1)).all()
    for row in range(batch):
        emitted = result.emitted(row)
        accepted = int(result.num_accepted[row])
        assert emitted[:accepted] == draft[row, :accepted].tolist()
        assert all(0 <= t < vocab for t in emitted)
        assert EOS not in emitted[:-1]
        assert bool(result.hit_eos[row]) == (emitted[-1] == EOS)
        if not result.hit_eos[row] or emitted[-1] != draft[row, len(emitted) - 1]:
            assert len(emitted) == accepted + 1
        # every emitted token is possible under its p
        for i, token in enumerate(emitted):
            assert p[row, i, token] > 0


# ---------------------------------------------------------------- validation


def _valid_inputs() -> dict:
    return {
        "draft_tokens": torch.tensor([[1, 2]]),
        "q": torch.tensor([[P, P]], dtype=torch.float64),
        "p": torch.tensor([[P, P, P]], dtype=torch.float64),
        "draft_lengths": torch.tensor([2]),
        "eos_token_ids": {EOS},
        "sampler": ScriptedSampler(),
    }


def test_valid_inputs_pass() -> None:
    assert verify(**_valid_inputs()).num_emitted.tolist() == [3]


def _with(name: str, index: tuple, value: float) -> dict:
    inputs = _valid_inputs()
    inputs[name] = inputs[name].clone()
    inputs[name][index] = value
    return inputs


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        (_with("p", (0, 1, 2), float("nan")), "p contains NaN or infinite"),
        (_with("q", (0, 0, 2), float("inf")), "q contains NaN or infinite"),
        (_with("p", (0, 2, 1), float("-inf")), "p contains NaN or infinite"),
        (_with("q", (0, 1, 0), 0.5), "q rows must sum to 1"),
        (_with("p", (0, 0, 0), 0.0), "p rows must sum to 1"),
        (_with("q", (0, 0, 4), -0.1), "q contains negative probabilities"),
    ],
)
def test_invalid_probabilities_raise(inputs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        verify(**inputs)


def test_negative_probability_raises_even_when_the_row_sums_to_one() -> None:
    inputs = _valid_inputs()
    inputs["p"] = torch.tensor([[P, P, [0.6, 0.2, 0.3, 0.0, -0.1]]], dtype=torch.float64)
    with pytest.raises(ValueError, match="p contains negative probabilities"):
        verify(**inputs)


def test_logits_instead_of_probabilities_raise() -> None:
    inputs = _valid_inputs()
    inputs["p"] = torch.randn(1, 3, 5, dtype=torch.float64)
    with pytest.raises(ValueError, match="p "):
        verify(**inputs)


def test_float32_rows_within_tolerance_pass() -> None:
    inputs = _valid_inputs()
    inputs["q"] = inputs["q"].float() * (1 + 1e-5)
    inputs["p"] = inputs["p"].float()
    verify(**inputs)
    inputs["q"] = inputs["q"] * 1.01
    with pytest.raises(ValueError, match="q rows must sum to 1"):
        verify(**inputs)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"q": torch.full((1, 2, 4), 0.25, dtype=torch.float64)}, "q must be"),
        ({"q": torch.full((1, 3, 5), 0.2, dtype=torch.float64)}, "q must be"),
        ({"p": torch.full((1, 2, 5), 0.2, dtype=torch.float64)}, "p must be"),
        ({"p": torch.full((1, 4, 5), 0.2, dtype=torch.float64)}, "p must be"),
        ({"p": torch.full((2, 3, 5), 0.2, dtype=torch.float64)}, "p must be"),
        ({"p": torch.full((3, 5), 0.2, dtype=torch.float64)}, "p must be"),
        ({"draft_tokens": torch.tensor([1, 2])}, "draft_tokens must be"),
        ({"draft_tokens": torch.tensor([[1.0, 2.0]])}, "draft_tokens must be int64"),
        ({"draft_lengths": torch.tensor([2, 2])}, "draft_lengths must be"),
        ({"draft_lengths": torch.tensor([2.0])}, "draft_lengths must be"),
        ({"draft_lengths": torch.tensor([3])}, "draft_lengths must be in 0..gamma=2"),
        ({"draft_lengths": torch.tensor([-1])}, "draft_lengths must be in 0..gamma=2"),
        ({"draft_tokens": torch.tensor([[1, 5]])}, r"draft token ids must be in 0..4"),
        ({"draft_tokens": torch.tensor([[-1, 2]])}, r"draft token ids must be in 0..4"),
        ({"rows": [0, 1]}, "rows must name one random stream per batch row"),
        ({"p": torch.full((1, 3, 5), 1, dtype=torch.long)}, "p must be float32 or float64"),
    ],
)
def test_invalid_shapes_and_ids_raise(change: dict, message: str) -> None:
    inputs = _valid_inputs()
    inputs.update(change)
    with pytest.raises(ValueError, match=message):
        verify(**inputs)


# ---------------------------------------------------------------- statistics


class VectorisedSampler:
    """A test-only Sampler with one generator for all rows.

    SeededSampler keeps one torch.Generator per row and loops over them in
    Python, which costs seconds per call at 2e5 rows. The property under test
    here is the verifier's (the output distribution), not the per-row streams,
    and i.i.d. draws from one generator serve it equally well.
    """

    def __init__(self, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(seed)

    def categorical(self, probs: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
        assert probs.shape[0] == len(rows)
        return torch.multinomial(probs.to(torch.float64), 1, generator=self.generator).squeeze(-1)

    def bernoulli(self, probs: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
        assert probs.shape[0] == len(rows)
        return torch.rand(len(rows), generator=self.generator, dtype=torch.float64) < probs.to(torch.float64)


def _first_token_chi_square(seed: int) -> float:
    """p-value of "the first emitted token is distributed as p_1" on 2e5 rows of one verify call."""
    batch, gamma, vocab = 200_000, 3, 50
    generator = torch.Generator().manual_seed(seed)

    def random_probs(count: int) -> torch.Tensor:
        raw = -torch.rand(count, vocab, generator=generator, dtype=torch.float64).log()  # Dirichlet(1)
        raw[torch.rand(count, vocab, generator=generator) < 0.2] = 0.0  # some zeros in each row
        return raw / raw.sum(-1, keepdim=True)

    # One (q_i, p_i) chain shared by every row (expanded, not copied), so each row's first token has
    # the same target distribution p_1. q and p differ a lot, so rejections and residuals are common.
    q = random_probs(gamma).float()  # [gamma, V]
    p = random_probs(gamma + 1).float()  # [gamma + 1, V]
    draft = torch.stack(
        [
            torch.multinomial(q[i].double(), batch, replacement=True, generator=generator)
            for i in range(gamma)
        ],
        dim=1,
    )  # [B, gamma], X_i ~ q_i
    result = verify(
        draft,
        q.unsqueeze(0).expand(batch, gamma, vocab),
        p.unsqueeze(0).expand(batch, gamma + 1, vocab),
        torch.full((batch,), gamma),
        {EOS},
        VectorisedSampler(seed + 1),
    )
    first = result.tokens[:, 0]
    counts = torch.bincount(first, minlength=vocab).double()
    p_1 = p[0].double()
    support = p_1 > 0
    assert counts[~support].sum() == 0  # an accepted token has p > 0, a residual draw too
    expected = p_1[support] / p_1[support].sum() * batch
    return float(stats.chisquare(counts[support].numpy(), expected.numpy()).pvalue)


def test_first_emitted_token_is_distributed_as_p1() -> None:
    assert _first_token_chi_square(seed=2024) > 1e-3


def test_first_token_test_detects_a_wrong_residual(monkeypatch: pytest.MonkeyPatch) -> None:
    # Drawing rejections from p instead of [p - q]+ gives min(p, q) + beta * p, not p.
    monkeypatch.setattr(verifier_module, "_residual", lambda p_rows, q_rows: p_rows)
    assert _first_token_chi_square(seed=2024) < 1e-6
