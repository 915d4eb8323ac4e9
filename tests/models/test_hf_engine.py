"""The decoding engine on real (tiny, random) Hugging Face models: the acceptance criteria.

Target and draft are 2-layer random `transformers` models wrapped in
`HFLanguageModel` (KV cache per row, rollback by bookkeeping). The checks:
greedy output equals plain greedy decoding and `model.generate`; a batch row
equals the same row run alone; sampled output passes a G-test against the
target's exact probabilities (and two broken variants fail it); EOS, length
and stop cuts inside a round; and the cache after rollback equals a cache
built from the kept tokens alone.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import pytest
import torch

transformers = pytest.importorskip("transformers")

from conftest import add_weight_noise, tiny_causal_lm  # noqa: E402

from exactspec.audit.broken import BrokenArgmaxDrafter  # noqa: E402
from exactspec.checking.statistical import goodness_of_fit, likely_sequences  # noqa: E402
from exactspec.checking.toy import TabularModel  # noqa: E402
from exactspec.decoding.engine import DecodeConfig, RowState, SpeculativeEngine  # noqa: E402
from exactspec.decoding.scheduler import Request, Scheduler  # noqa: E402
from exactspec.drafters.model import ModelDrafter  # noqa: E402
from exactspec.foundations.sampler import SeededSampler  # noqa: E402
from exactspec.foundations.settings import SamplingSettings  # noqa: E402
from exactspec.models.base import ModelWrapper  # noqa: E402
from exactspec.models.hf.model import HFLanguageModel  # noqa: E402

VOCAB = 64
EOS = 3
# Weights ~ N(0, 0.2^2) instead of HF's 0.02: logits spread by ~1, so greedy argmaxes are far
# apart compared with the ~1e-7 difference between a k-token and a 1-token forward pass.
INIT_STD = 0.2
# A draft that is the target plus this much weight noise accepts about half of its greedy tokens.
DRAFT_NOISE = 0.015
GREEDY = SamplingSettings(temperature=0.0)
SAMPLED = SamplingSettings(temperature=1.0)
PROMPTS = [[5, 9, 11, 2], [7, 8], [40, 41, 42, 43, 44, 45, 46]]
# fp32: the same row computed in a batch (left-padded, with holes) and alone agrees to ~1e-7.
ATOL = 1e-5


@functools.cache
def tiny_model(
    family: str = "qwen2",
    seed: int = 0,
    *,
    vocab: int = VOCAB,
    eos: int = EOS,
    noise: float = 0.0,
    lm_head_scale: float = 1.0,
) -> transformers.PreTrainedModel:
    """A random 2-layer fp32 model (4 query heads, 2 KV heads); `noise` perturbs a copy of it."""
    model = tiny_causal_lm(
        family,
        vocab_size=vocab,
        seed=seed,
        initializer_range=INIT_STD,
        eos_token_id=eos,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    if noise:
        add_weight_noise(model, noise, seed)
    with torch.no_grad():
        model.lm_head.weight.mul_(lm_head_scale)
    return model


def target_model() -> transformers.PreTrainedModel:
    return tiny_model("qwen2", 0)


DRAFTS = {
    "noisy copy": lambda: tiny_model("qwen2", 0, noise=DRAFT_NOISE),  # high acceptance
    "other family": lambda: tiny_model("llama", 1),  # an unrelated Llama: rejects almost everything
}


def hf_engine(draft: str | None = "noisy copy", **target_kwargs: object) -> SpeculativeEngine:
    """A fresh engine (fresh, empty caches) over the shared tiny models."""
    target = HFLanguageModel(target_model(), **target_kwargs)
    drafter = None if draft is None else ModelDrafter(HFLanguageModel(DRAFTS[draft]()), VOCAB)
    return SpeculativeEngine(target, drafter)


def generated(states: list[RowState]) -> list[list[int]]:
    return [state.generated for state in states]


@functools.cache
def hf_generate_greedy(prompt: tuple[int, ...], max_new_tokens: int) -> list[int]:
    """Hugging Face's own greedy decoding of the target (its own cache and stopping)."""
    model = target_model()
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


# --- (1) greedy: speculative == plain == transformers' generate ---------------------------------


@pytest.mark.parametrize("draft", sorted(DRAFTS))
@pytest.mark.parametrize("gamma", [1, 3, 5, 14])  # 14 > max_new_tokens
def test_greedy_equals_plain_greedy_and_hf_generate(draft: str, gamma: int) -> None:
    max_new = 12
    config = DecodeConfig(gamma=gamma, max_new_tokens=max_new, settings=GREEDY)
    engine = hf_engine(draft)
    speculative = generated(engine.generate(PROMPTS, config, SeededSampler(0, len(PROMPTS))))
    plain_config = DecodeConfig(gamma=0, max_new_tokens=max_new, settings=GREEDY)
    plain = generated(hf_engine(None).generate(PROMPTS, plain_config, SeededSampler(0, len(PROMPTS))))
    reference = [hf_generate_greedy(tuple(prompt), max_new) for prompt in PROMPTS]
    assert plain == reference
    assert speculative == reference
    if draft == "noisy copy":
        assert engine.metrics.accepted_tokens > 0  # the accepted-block path really ran


def test_greedy_reference_is_not_trivial() -> None:
    """The greedy references are long and varied, so the comparison above has teeth."""
    for prompt in PROMPTS:
        tokens = hf_generate_greedy(tuple(prompt), 12)
        assert len(tokens) == 12 and len(set(tokens)) >= 3


# --- (2) batching: a row's output does not depend on the other rows -----------------------------


@pytest.mark.parametrize(
    "settings",
    [SAMPLED, SamplingSettings(temperature=0.8, top_k=20, repetition_penalty=1.3)],
    ids=["T=1", "T=0.8 top_k rep"],
)
@pytest.mark.parametrize("gamma", [0, 3])
def test_batch_rows_equal_the_same_rows_run_alone(settings: SamplingSettings, gamma: int) -> None:
    seeds = [101, 202, 303]
    config = DecodeConfig(gamma=gamma, max_new_tokens=16, settings=settings)
    batch = generated(hf_engine().generate(PROMPTS, config, SeededSampler(seeds=seeds)))
    alone = [
        generated(hf_engine().generate([prompt], config, SeededSampler(seeds=[seed])))[0]
        for prompt, seed in zip(PROMPTS, seeds, strict=True)
    ]
    assert batch == alone
    assert len({tuple(row) for row in batch}) == len(PROMPTS)


def test_one_engine_reused_across_generations_matches_fresh_engines() -> None:
    """The target's cache carried over from an earlier generation never leaks into the next one."""
    config = DecodeConfig(gamma=3, max_new_tokens=12, settings=SAMPLED)
    engine = hf_engine()
    first = generated(engine.generate(PROMPTS, config, SeededSampler(seeds=[1, 2, 3])))
    second = generated(engine.generate(PROMPTS[::-1], config, SeededSampler(seeds=[4, 5, 6])))
    assert first == generated(hf_engine().generate(PROMPTS, config, SeededSampler(seeds=[1, 2, 3])))
    assert second == generated(hf_engine().generate(PROMPTS[::-1], config, SeededSampler(seeds=[4, 5, 6])))


# --- (3) sampling: exact target distribution, statistically -------------------------------------

STAT_VOCAB = 16
STAT_EOS = 15
# 1000 rows: the exact engine fails (p < 1e-3) with probability 1e-3 under the G-test's chi-square law,
# whatever N. Each mutant's G is about 0.27 N (residual = p) and 1.2 N (argmax draft) over 27 buckets
# (measured at N = 1000, five seeds): against the p < 1e-4 bar (G > 61.7) that is a noncentral
# chi-square miss probability of about 3e-19 and below 1e-300 (N = 3000 took 30 s a test, nearly all
# of it the adapter releasing finished rows one at a time, since fixed in HFLanguageModel.release_rows).
STAT_SAMPLES = 1000
STAT_PROMPT = [1, 2, 3]


@functools.cache
def stat_pair() -> tuple[HFLanguageModel, HFLanguageModel]:
    """Unrelated target and draft over 16 tokens, peaked enough that d_TV(p, q) is about 0.6."""
    target = tiny_model("qwen2", 0, vocab=STAT_VOCAB, eos=STAT_EOS, lm_head_scale=2.0)
    draft = tiny_model("llama", 1, vocab=STAT_VOCAB, eos=STAT_EOS, lm_head_scale=2.0)
    return HFLanguageModel(target), HFLanguageModel(draft)


def _first_two_tokens_fit(drafter_kind: str = "model") -> float:
    """G-test p-value of the first 2 tokens of STAT_SAMPLES rows (gamma 2, 3 new tokens, one batch)."""
    target, draft = stat_pair()
    # The audit's deliberately broken drafter (argmax proposed, softmax q reported: docs/algorithm.md 2.7).
    drafter_class = BrokenArgmaxDrafter if drafter_kind == "argmax" else ModelDrafter
    engine = SpeculativeEngine(target, drafter_class(draft, STAT_VOCAB))
    # 3 new tokens with gamma 2: the first two come from accepted drafts, residuals and bonuses.
    config = DecodeConfig(gamma=2, max_new_tokens=3, settings=SAMPLED)
    sampler = SeededSampler(seed=12345, num_rows=STAT_SAMPLES)
    states = engine.generate([STAT_PROMPT] * STAT_SAMPLES, config, sampler)
    assert 0.05 < engine.metrics.acceptance_rate < 0.95  # both accepts and rejections were exercised
    samples = [tuple(state.generated[:2]) for state in states]
    buckets = likely_sequences(target, STAT_PROMPT, SAMPLED, 2, 5.0 / STAT_SAMPLES)
    fit = goodness_of_fit(samples, buckets)
    assert not fit.impossible
    return fit.p_value


def test_sampled_hf_output_follows_the_target_distribution() -> None:
    assert _first_two_tokens_fit() > 1e-3


def test_statistical_check_detects_a_residual_that_is_just_p(monkeypatch: pytest.MonkeyPatch) -> None:
    """Drawing rejections from p instead of [p - q]+ gives min(p, q) + beta p: visibly not p."""
    monkeypatch.setattr("exactspec.verifiers.token._residual", lambda p_rows, q_rows: p_rows)
    assert _first_two_tokens_fit() < 1e-4


def test_statistical_check_detects_an_argmax_draft_reporting_softmax_q() -> None:
    assert _first_two_tokens_fit("argmax") < 1e-4


# --- (4) EOS, length and stop cuts inside a round ----------------------------------------------

EOS_PROMPT = [5, 9, 11, 2]


def _greedy_path() -> tuple[list[int], int]:
    """The target's greedy continuation of EOS_PROMPT, and a position k whose token is new there.

    Declaring path[k] the (only) EOS id makes the greedy output path[: k + 1] exactly.
    """
    path = hf_generate_greedy(tuple(EOS_PROMPT), 12)
    k = next(i for i in range(2, len(path)) if path[i] not in path[:i])
    return path, k


def _path_drafter(path: list[int], overrides: dict[int, int] | None = None) -> ModelDrafter:
    """A deterministic toy draft (one-hot q) that proposes `path` after EOS_PROMPT.

    `overrides` replaces the proposal at some positions (a wrong draft token). The
    draft knows no EOS, so it happily drafts past the target's EOS.
    """
    overrides = overrides or {}

    def distribution(history: tuple[int, ...]) -> torch.Tensor:
        position = len(history) - len(EOS_PROMPT)
        token = overrides.get(position, path[position] if position < len(path) else 0)
        probs = torch.zeros(VOCAB, dtype=torch.float64)
        probs[token] = 1.0
        return probs

    return ModelDrafter(TabularModel(distribution, VOCAB, eos_token_ids=()), VOCAB)


def _eos_engine(drafter: ModelDrafter, eos: int) -> SpeculativeEngine:
    return SpeculativeEngine(HFLanguageModel(target_model(), eos_token_ids={eos}), drafter)


def test_eos_inside_an_accepted_block_stops_there() -> None:
    path, k = _greedy_path()
    engine = _eos_engine(_path_drafter(path), eos=path[k])
    config = DecodeConfig(gamma=k + 3, max_new_tokens=12, settings=GREEDY)
    (state,) = engine.generate([EOS_PROMPT], config, SeededSampler(0))
    assert state.generated == path[: k + 1]
    assert state.finish_reason == "eos"
    # One round: the draft proposed past the EOS, the target accepted up to and including it.
    assert engine.metrics.rounds == 1
    assert engine.metrics.proposed_tokens == k + 3
    assert engine.metrics.accepted_tokens == k + 1


def test_eos_as_the_bonus_token() -> None:
    path, k = _greedy_path()
    engine = _eos_engine(_path_drafter(path), eos=path[k])
    config = DecodeConfig(gamma=k, max_new_tokens=12, settings=GREEDY)  # the EOS is the bonus token
    (state,) = engine.generate([EOS_PROMPT], config, SeededSampler(0))
    assert state.generated == path[: k + 1]
    assert state.finish_reason == "eos"
    assert (engine.metrics.rounds, engine.metrics.accepted_tokens) == (1, k)


def test_eos_as_the_residual_token() -> None:
    path, k = _greedy_path()
    wrong = next(t for t in range(VOCAB) if t != path[k])
    engine = _eos_engine(_path_drafter(path, overrides={k: wrong}), eos=path[k])
    config = DecodeConfig(gamma=k + 3, max_new_tokens=12, settings=GREEDY)
    (state,) = engine.generate([EOS_PROMPT], config, SeededSampler(0))
    assert state.generated == path[: k + 1]
    assert state.finish_reason == "eos"
    assert (engine.metrics.rounds, engine.metrics.accepted_tokens) == (1, k)


@pytest.mark.parametrize("max_new_tokens", [1, 2, 3])
def test_max_new_tokens_smaller_than_gamma(max_new_tokens: int) -> None:
    path, _ = _greedy_path()
    engine = SpeculativeEngine(HFLanguageModel(target_model()), _path_drafter(path))
    config = DecodeConfig(gamma=8, max_new_tokens=max_new_tokens, settings=GREEDY)
    (state,) = engine.generate([EOS_PROMPT], config, SeededSampler(0))
    assert state.generated == path[:max_new_tokens]
    assert state.finish_reason == "length"
    # One round that drafts max_new_tokens - 1 tokens and adds the bonus: nothing drafted in vain.
    assert engine.metrics.rounds == 1
    assert engine.metrics.proposed_tokens == max_new_tokens - 1


def test_max_new_tokens_smaller_than_gamma_when_sampling() -> None:
    engine = hf_engine()
    config = DecodeConfig(gamma=8, max_new_tokens=3, settings=SAMPLED)
    states = engine.generate(PROMPTS, config, SeededSampler(7, len(PROMPTS)))
    for state in states:
        assert 1 <= len(state.generated) <= 3
        assert state.finish_reason == ("eos" if state.generated[-1] == EOS else "length")
    # No row ever drafted more than max_new_tokens - 1 tokens in a round.
    assert len(engine.metrics.proposed_by_position) <= 2


def test_stop_condition_cuts_inside_an_accepted_block() -> None:
    path, k = _greedy_path()
    engine = SpeculativeEngine(HFLanguageModel(target_model()), _path_drafter(path))
    config = DecodeConfig(gamma=10, max_new_tokens=12, settings=GREEDY)
    calls: list[list[int]] = []

    def stop_at_new_token(row: int, tokens: list[int]) -> int | None:
        calls.append(list(tokens))
        return tokens.index(path[k]) + 1 if path[k] in tokens else None

    (state,) = engine.generate([EOS_PROMPT], config, SeededSampler(0), stop=stop_at_new_token)
    assert state.generated == path[: k + 1]
    assert state.finish_reason == "stop"
    assert calls == [path[:11]]  # one round emitted 10 accepted tokens and the bonus, then the cut


def test_eos_is_last_and_only_last_when_sampling() -> None:
    """With EOS made likely, every row ends at its first EOS and never emits past it."""
    settings = SamplingSettings(temperature=1.0, logit_bias={EOS: 3.0})
    engine = hf_engine()
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(12)]
    states = engine.generate(
        prompts, DecodeConfig(gamma=4, max_new_tokens=20, settings=settings), SeededSampler(3, len(prompts))
    )
    reasons = [state.finish_reason for state in states]
    assert "eos" in reasons
    for state in states:
        assert EOS not in state.generated[:-1]
        assert (state.finish_reason == "eos") == (state.generated[-1] == EOS)


# --- (5) rollback: the cache after rejections equals a cache built from the kept tokens ---------


def _fresh_kv(
    model: transformers.PreTrainedModel, tokens: list[int]
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    fresh = HFLanguageModel(model)
    fresh.logits([tokens], 1)
    return fresh.cached_kv(0)


def _assert_same_kv(
    got: list[tuple[torch.Tensor, torch.Tensor]], expected: list[tuple[torch.Tensor, torch.Tensor]]
) -> None:
    assert len(got) == len(expected)
    for (keys, values), (ref_keys, ref_values) in zip(got, expected, strict=True):
        assert keys.shape == ref_keys.shape and values.shape == ref_values.shape
        torch.testing.assert_close(keys, ref_keys, atol=ATOL, rtol=0)
        torch.testing.assert_close(values, ref_values, atol=ATOL, rtol=0)


class CheckedModel(ModelWrapper):
    """An HFLanguageModel that, after every call, checks each row's cache against a fresh one.

    After a call with history h for row r, the cache of r must hold exactly the
    K/V that a brand-new adapter computes for h alone: every rolled-back draft
    token of earlier rounds has left no trace (holes masked, positions right).
    """

    def __init__(self, model: transformers.PreTrainedModel, **kwargs: object) -> None:
        super().__init__(HFLanguageModel(model, **kwargs))
        self.module = model
        self.checked = 0

    def logits(
        self, histories: Sequence[Sequence[int]], num_positions: int = 1, rows: Sequence[int] | None = None
    ) -> torch.Tensor:
        out = self.model.logits(histories, num_positions, rows)
        row_ids = list(range(len(histories))) if rows is None else list(rows)
        for row, history in zip(row_ids, histories, strict=True):
            _assert_same_kv(self.model.cached_kv(row), _fresh_kv(self.module, list(history)))
            self.checked += 1
        return out


@pytest.mark.parametrize("max_hole_fraction", [0.0, 0.5, 1.0])  # always / sometimes / never compact
def test_every_call_leaves_each_rows_cache_equal_to_a_fresh_one(max_hole_fraction: float) -> None:
    target = CheckedModel(target_model(), max_hole_fraction=max_hole_fraction)
    draft = CheckedModel(DRAFTS["noisy copy"](), max_hole_fraction=max_hole_fraction)
    engine = SpeculativeEngine(target, ModelDrafter(draft, VOCAB))
    config = DecodeConfig(gamma=3, max_new_tokens=10, settings=SAMPLED)
    states = engine.generate(PROMPTS, config, SeededSampler(seeds=[5, 6, 7]))
    assert engine.metrics.proposed_tokens > engine.metrics.accepted_tokens > 0  # there were rejections
    assert target.checked >= len(PROMPTS) and draft.checked >= len(PROMPTS)
    assert all(state.finish_reason is not None for state in states)


def test_after_each_round_the_cache_rolls_back_to_the_kept_tokens_without_recomputing() -> None:
    """After a round, each row's next call keeps exactly its accepted tokens and feeds only the newest."""
    target = HFLanguageModel(target_model())
    engine = SpeculativeEngine(target, ModelDrafter(HFLanguageModel(DRAFTS["noisy copy"]()), VOCAB))
    scheduler = Scheduler(engine, gamma=4, max_batch=len(PROMPTS), sampler=SeededSampler(seeds=[21, 22, 23]))
    handles = [scheduler.submit(Request(prompt, SAMPLED, max_new_tokens=15)) for prompt in PROMPTS]
    fed: list[tuple[int, ...]] = []
    handle = target.module.register_forward_pre_hook(
        lambda module, args, kwargs: fed.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    rolled_back = 0
    try:
        while True:
            if not scheduler.step():
                break
            # The rows that go on (a row that finished has left, its cache freed at once)
            rows = [handle.row for handle in handles if not handle.done.is_set()]
            if not rows:
                break
            histories = [handles[row].state.history for row in rows]
            # The cache still holds this round's draft block; any rejected draft token is in it
            # (private bookkeeping, read only, to show there was something to roll back).
            held = dict(zip(target._row_ids, target._tokens, strict=True))
            rolled_back += sum(
                held[row] != h[: len(held[row])] for row, h in zip(rows, histories, strict=True)
            )
            fed.clear()
            target.logits(histories, 1, rows=rows)
            assert fed == [(len(rows), 1)]  # one new token per row: every kept token came from the cache
            for row, history in zip(rows, histories, strict=True):
                _assert_same_kv(target.cached_kv(row), _fresh_kv(target_model(), history))
    finally:
        handle.remove()
    assert rolled_back > 0
    assert all(handle.finish_reason is not None for handle in handles)
