"""The decoding engine on toy models: reproducibility, batching, limits, stops, greedy and plain decoding."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest
from conftest import tiny_causal_lm

from exactspec.checking.toy import TabularModel, random_tabular_model
from exactspec.decoding.engine import MAX_GAMMA, DecodeConfig, RowState, SpeculativeEngine
from exactspec.drafters import ModelDrafter, Proposal
from exactspec.foundations.rows import RowStart
from exactspec.foundations.sampler import Sampler, SeededSampler
from exactspec.foundations.settings import SamplingSettings
from exactspec.foundations.transforms import probabilities
from exactspec.models.base import LanguageModel
from exactspec.models.hf.model import HFLanguageModel
from exactspec.verifiers.block import verify_block
from exactspec.verifiers.token import verify

VOCAB = 6
EOS = 0
PROMPTS = [[1, 2], [3], [4, 5, 1], [2, 2, 2, 2]]


def _target() -> TabularModel:
    return random_tabular_model(VOCAB, seed=11, sharpness=1.5)


def _draft() -> TabularModel:
    return random_tabular_model(VOCAB, seed=12, sharpness=1.5)


def _engine(draft: LanguageModel | None = None) -> SpeculativeEngine:
    target = _target()
    return SpeculativeEngine(
        target, ModelDrafter(draft if draft is not None else _draft(), target.vocab_size)
    )


def _outputs(states: list[RowState]) -> list[tuple[list[int], str | None]]:
    return [(state.generated, state.finish_reason) for state in states]


class SpyDrafter:
    """Wraps a drafter and records what each propose call was asked for."""

    def __init__(self, inner: ModelDrafter) -> None:
        self.inner = inner
        self.calls: list[tuple[list[list[int]], list[int], list[int]]] = []
        self.seen: dict[int, list[int]] = {}  # row -> its prompt (add_rows) and every token observed since

    def propose(
        self,
        histories: Sequence[Sequence[int]],
        max_tokens: Sequence[int],
        settings: SamplingSettings,
        sampler: Sampler,
        rows: Sequence[int],
    ) -> Proposal:
        self.calls.append(([list(h) for h in histories], list(max_tokens), list(rows)))
        return self.inner.propose(histories, max_tokens, settings, sampler, rows)

    def add_rows(self, rows: Sequence[RowStart]) -> None:
        for start in rows:
            self.seen[start.row] = list(start.prompt)
        self.inner.add_rows(rows)

    def release_rows(self, rows: Sequence[int]) -> None:
        self.inner.release_rows(rows)

    def observe(self, appended: Mapping[int, Sequence[int]]) -> None:
        for row, tokens in appended.items():
            self.seen[row].extend(tokens)


# ---------------------------------------------------------------- reproducibility and batching


def test_seeded_runs_are_reproducible() -> None:
    config = DecodeConfig(gamma=3, max_new_tokens=20)
    first = _engine().generate(PROMPTS, config, SeededSampler(seed=5, num_rows=4))
    second = _engine().generate(PROMPTS, config, SeededSampler(seed=5, num_rows=4))
    other = _engine().generate(PROMPTS, config, SeededSampler(seed=6, num_rows=4))
    assert _outputs(first) == _outputs(second)
    assert _outputs(first) != _outputs(other)


@pytest.mark.parametrize("gamma", [0, 1, 4])
def test_a_rows_output_does_not_change_when_rows_are_added(gamma: int) -> None:
    config = DecodeConfig(gamma=gamma, max_new_tokens=25, settings=SamplingSettings(temperature=1.2))
    for seed in range(5):
        alone = _engine().generate([[4, 5, 1]], config, SeededSampler(seeds=[seed]))
        batch = _engine().generate(
            [[1, 2], [4, 5, 1], [3], [4, 5, 1]],
            config,
            SeededSampler(seeds=[seed + 50, seed, seed + 70, seed]),
        )
        assert _outputs(batch)[1] == _outputs(alone)[0]
        assert _outputs(batch)[3] == _outputs(alone)[0]


def test_rows_of_one_batch_differ() -> None:
    # A sanity check for the test above: different seeds do give different rows.
    config = DecodeConfig(gamma=2, max_new_tokens=25)
    states = _engine().generate([[4, 5, 1]] * 4, config, SeededSampler(seed=0, num_rows=4))
    assert len({tuple(state.generated) for state in states}) > 1


# ---------------------------------------------------------------- limits and stops


@pytest.mark.parametrize("max_new_tokens", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_max_new_tokens_is_respected_and_no_round_drafts_past_it(max_new_tokens: int, gamma: int) -> None:
    target = random_tabular_model(VOCAB, seed=3, eos_token_id=None)  # no EOS: every row runs to the limit
    drafter = SpyDrafter(ModelDrafter(random_tabular_model(VOCAB, seed=4, eos_token_id=None), VOCAB))
    engine = SpeculativeEngine(target, drafter)
    config = DecodeConfig(gamma=gamma, max_new_tokens=max_new_tokens)
    generated: dict[int, list[int]] = {row: [] for row in range(len(PROMPTS))}
    reasons = {}
    for event in engine.stream(PROMPTS, config, SeededSampler(seed=1, num_rows=len(PROMPTS))):
        assert 1 <= len(event.tokens) <= gamma + 1
        generated[event.row].extend(event.tokens)
        assert len(generated[event.row]) <= max_new_tokens
        if event.finish_reason is not None:
            reasons[event.row] = event.finish_reason
    assert all(len(tokens) == max_new_tokens for tokens in generated.values())
    assert reasons == dict.fromkeys(range(len(PROMPTS)), "length")
    for histories, max_tokens, rows in drafter.calls:
        for history, asked, row in zip(histories, max_tokens, rows, strict=True):
            generated = len(history) - len(PROMPTS[row])
            # A row one token short of the limit is asked for 0 draft tokens: its round is one plain draw.
            assert 0 <= asked <= min(gamma, max_new_tokens - generated - 1)
    if max_new_tokens == 1:
        assert drafter.calls == []  # a single token is one plain draw: nothing to draft
    else:
        assert max(max(max_tokens) for _, max_tokens, _ in drafter.calls) == min(gamma, max_new_tokens - 1)


def test_the_drafter_hears_each_prompt_at_join_and_every_rounds_tokens_after_stop_cuts() -> None:
    # RowStart.prompt followed by every observed token must be the row's history, round after round,
    # also when a stop rule cuts a round's tokens (the drafter must never index tokens that were cut).
    drafter = SpyDrafter(ModelDrafter(random_tabular_model(VOCAB, seed=4, eos_token_id=None), VOCAB))
    engine = SpeculativeEngine(random_tabular_model(VOCAB, seed=3, eos_token_id=None), drafter)

    def stop_at_second_3(row: int, generated: list[int]) -> int | None:
        threes = [i for i, token in enumerate(generated) if token == 3]
        return threes[1] + 1 if len(threes) >= 2 else None

    config = DecodeConfig(gamma=4, max_new_tokens=30)
    states = engine.generate(PROMPTS, config, SeededSampler(seed=2, num_rows=len(PROMPTS)), stop_at_second_3)
    for history, _, rows in drafter.calls:  # what each round was asked to extend ...
        for seen_then, row in zip(history, rows, strict=True):
            generated_then = states[row].generated[: len(seen_then) - len(PROMPTS[row])]
            assert seen_then == list(PROMPTS[row]) + generated_then
    assert "stop" in {state.finish_reason for state in states}
    for row, state in enumerate(states):  # ... and what the drafter was told, in the end
        assert drafter.seen[row] == state.history == list(PROMPTS[row]) + state.generated


def test_eos_stops_a_row() -> None:
    engine = _engine()
    config = DecodeConfig(gamma=3, max_new_tokens=12)
    reasons = set()
    for seed in range(20):
        for state in engine.generate(PROMPTS, config, SeededSampler(seed=seed, num_rows=len(PROMPTS))):
            reasons.add(state.finish_reason)
            assert EOS not in state.generated[:-1]
            if state.finish_reason == "eos":
                assert state.generated[-1] == EOS
            else:
                assert state.finish_reason == "length"
                assert len(state.generated) == 12
                assert EOS not in state.generated
    assert reasons == {"eos", "length"}


def test_stop_condition_cuts_the_row_and_finishes_it_with_stop() -> None:
    # Stop at the first token 3 (kept), even in the middle of a round's accepted tokens.
    engine = _engine(_target())  # draft = target: long rounds, so cuts fall inside rounds
    seen_calls: list[tuple[int, list[int]]] = []

    def stop(row: int, generated: list[int]) -> int | None:
        seen_calls.append((row, list(generated)))
        return generated.index(3) + 1 if 3 in generated else None

    config = DecodeConfig(gamma=4, max_new_tokens=15)
    reasons = set()
    cut_inside_a_round = False
    for seed in range(15):
        finished = {}
        for event in engine.stream(PROMPTS, config, SeededSampler(seed=seed, num_rows=4), stop):
            if event.finish_reason is not None:
                finished[event.row] = event.finish_reason
        states = engine.generate(PROMPTS, config, SeededSampler(seed=seed, num_rows=4), stop)
        assert finished == {row: state.finish_reason for row, state in enumerate(states)}
        for state in states:
            reasons.add(state.finish_reason)
            assert 3 not in state.generated[:-1]
            if state.finish_reason == "stop":
                assert state.generated[-1] == 3
            else:
                assert 3 not in state.generated
        cut_inside_a_round |= any(3 in g[:-1] for _, g in seen_calls)
    assert "stop" in reasons
    assert cut_inside_a_round  # some round emitted tokens after the 3 that the stop removed
    assert {row for row, _ in seen_calls} == {0, 1, 2, 3}


def test_stop_condition_on_length_cuts_a_round_short() -> None:
    engine = _engine(_target())
    config = DecodeConfig(gamma=5, max_new_tokens=10)
    states = engine.generate(
        PROMPTS, config, SeededSampler(seed=2, num_rows=4), stop=lambda row, gen: 2 if len(gen) >= 2 else None
    )
    for state in states:
        if state.finish_reason == "stop":
            assert len(state.generated) == 2
        else:
            assert state.finish_reason == "eos"
            assert len(state.generated) <= 2
    assert any(state.finish_reason == "stop" for state in states)


def test_stream_reports_new_tokens_and_finished_rows_as_generate_returns_them() -> None:
    engine = _engine()
    config = DecodeConfig(gamma=3, max_new_tokens=9)
    collected: dict[int, list[int]] = {row: [] for row in range(len(PROMPTS))}
    finished = {}
    for event in engine.stream(PROMPTS, config, SeededSampler(seed=8, num_rows=4)):
        assert event.row not in finished
        collected[event.row].extend(event.tokens)
        if event.finish_reason is not None:
            finished[event.row] = event.finish_reason
    states = engine.generate(PROMPTS, config, SeededSampler(seed=8, num_rows=4))
    assert collected == {row: state.generated for row, state in enumerate(states)}
    assert finished == {row: state.finish_reason for row, state in enumerate(states)}


def test_a_stream_closed_early_frees_every_rows_state() -> None:
    target = HFLanguageModel(tiny_causal_lm(vocab_size=64, seed=0, eos_token_id=3))
    engine = SpeculativeEngine(target)
    stream = engine.stream([[5, 6], [7]], DecodeConfig(gamma=0, max_new_tokens=20), SeededSampler(0))
    next(stream)
    assert sorted(target.cached_rows) == [0, 1]
    stream.close()
    assert target.cached_rows == []


# ---------------------------------------------------------------- against plain decoding


def _plain_sampling(
    target: LanguageModel,
    prompts: list[list[int]],
    settings: SamplingSettings,
    max_new: int,
    seeds: list[int],
) -> list[list[int]]:
    """Autoregressive sampling written out by hand: the token at position t of row r is the row's positioned
    draw for t (`Sampler.categorical_at`), as the engine draws it."""
    sampler = SeededSampler(seeds=seeds)
    outputs = []
    for row, prompt in enumerate(prompts):
        generated: list[int] = []
        while len(generated) < max_new:
            history = [*prompt, *generated]
            logits = target.logits([history], 1)[:, 0]  # [1, V]
            p = probabilities(logits, settings, [history], prompt_lengths=[len(prompt)])  # [1, V]
            token = int(sampler.categorical_at(p, [row], [len(generated)])[0])
            generated.append(token)
            if token in target.eos_token_ids:
                break
        outputs.append(generated)
    return outputs


@pytest.mark.parametrize(
    "settings",
    [
        SamplingSettings(),
        SamplingSettings(temperature=0.6, top_k=4),
        SamplingSettings(repetition_penalty=1.5),
        SamplingSettings(presence_penalty=1.2, frequency_penalty=0.6),
    ],
    ids=lambda s: s.describe(),
)
@pytest.mark.parametrize("with_drafter", [False, True])
def test_gamma_zero_equals_plain_sampling(settings: SamplingSettings, with_drafter: bool) -> None:
    target = _target()
    engine = SpeculativeEngine(target, ModelDrafter(_draft(), VOCAB) if with_drafter else None)
    seeds = [3, 14, 15, 92]
    states = engine.generate(
        PROMPTS, DecodeConfig(gamma=0, max_new_tokens=15, settings=settings), SeededSampler(seeds=seeds)
    )
    expected = _plain_sampling(target, PROMPTS, settings, 15, seeds)
    assert [state.generated for state in states] == expected
    assert engine.metrics.proposed_tokens == 0


@pytest.mark.parametrize("drafter", ["ngram", "suffix"])
@pytest.mark.parametrize("adaptive", [False, True])
@pytest.mark.parametrize("gamma", [1, 4])
def test_sampled_speculation_with_free_drafts_emits_plain_samplings_tokens(
    drafter: str, adaptive: bool, gamma: int
) -> None:
    """Coupled verification (docs/algorithm.md 5): with a deterministic draft every emitted token is the row's
    positioned draw from p, so sampled (T > 0) speculative output equals plain sampling token for token,
    whatever the draft lengths (fixed, or planned from measured round times) and the batch."""
    from exactspec.decoding.builder import build_engine
    from exactspec.decoding.strategy import Strategy
    from exactspec.foundations.costs import BatchCosts

    target = _target()
    settings = SamplingSettings(temperature=0.9, top_k=5)
    prompts = [[1, 2, 3, 1, 2], [4, 4, 4], [2, 3]]
    seeds = [5, 6, 7]
    costs = BatchCosts(rows=(1, 4), widths=(1, 2, 5), target=((1.0, 1.05, 1.2), (1.2, 1.5, 2.5)))
    engine = build_engine(target, None, Strategy(drafter, adaptive_gamma=adaptive), gamma, batch_costs=costs)
    config = DecodeConfig(gamma=gamma, max_new_tokens=20, settings=settings)
    states = engine.generate(prompts, config, SeededSampler(seeds=seeds))
    assert [state.generated for state in states] == _plain_sampling(target, prompts, settings, 20, seeds)
    assert engine.metrics.accepted_tokens > 0  # drafts were kept: the equality is not plain vs plain


@pytest.mark.parametrize("drafter", ["model", "hybrid"])
@pytest.mark.parametrize("adaptive", [False, True])
@pytest.mark.parametrize("gamma", [1, 4])
def test_sampled_speculation_with_coupled_model_drafts_emits_plain_samplings_tokens(
    drafter: str, adaptive: bool, gamma: int
) -> None:
    """Coupled model drafts (docs/algorithm.md 5): the draft model's token at output position t is q's
    inverse CDF at t's uniform and is verified as a deterministic draft, so sampled output with the draft
    model equals plain sampling token for token, as with lookup drafts; block verification, which needs
    the q a token was drawn from, keeps drawing from the rows' streams."""
    from exactspec.decoding.builder import build_engine
    from exactspec.decoding.strategy import Strategy
    from exactspec.foundations.costs import BatchCosts

    target = _target()
    settings = SamplingSettings(temperature=0.9, top_k=5)
    prompts = [[1, 2, 3, 1, 2], [4, 4, 4], [2, 3]]
    seeds = [5, 6, 7]
    costs = BatchCosts(
        rows=(1, 4),
        widths=(1, 2, 5),
        target=((1.0, 1.05, 1.2), (1.2, 1.5, 2.5)),
        draft=((0.1, 0.1, 0.1), (0.12, 0.12, 0.12)),
    )
    strategy = Strategy(drafter, adaptive_gamma=adaptive)
    engine = build_engine(target, _draft(), strategy, gamma, batch_costs=costs)
    config = DecodeConfig(gamma=gamma, max_new_tokens=20, settings=settings)
    states = engine.generate(prompts, config, SeededSampler(seeds=seeds))
    assert [state.generated for state in states] == _plain_sampling(target, prompts, settings, 20, seeds)
    assert engine.metrics.accepted_tokens > 0  # drafts were kept: the equality is not plain vs plain
    block = build_engine(target, _draft(), Strategy("model", verifier="block", adaptive_gamma=False), gamma)
    block_states = block.generate(prompts, config, SeededSampler(seeds=seeds))
    assert [state.generated for state in block_states] != [state.generated for state in states]


@pytest.mark.parametrize("drafter", ["ngram", "suffix"])
def test_output_penalties_inside_draft_blocks_keep_plain_samplings_tokens(drafter: str) -> None:
    """The presence and frequency penalties at position i of a draft block count the row's output plus the
    drafted tokens before i: with deterministic drafts the seeded output is plain sampling's, token for
    token, where plain sampling counts only what it generated (never the prompt)."""
    from exactspec.decoding.builder import build_engine
    from exactspec.decoding.strategy import Strategy

    target = _target()
    settings = SamplingSettings(temperature=0.9, presence_penalty=-1.5, frequency_penalty=-0.5)
    prompts = [[1, 2, 3, 1, 2], [4, 4, 4], [2, 3]]
    seeds = [5, 6, 7]
    engine = build_engine(target, None, Strategy(drafter, adaptive_gamma=False), 4)
    config = DecodeConfig(gamma=4, max_new_tokens=20, settings=settings)
    states = engine.generate(prompts, config, SeededSampler(seeds=seeds))
    expected = _plain_sampling(target, prompts, settings, 20, seeds)
    assert [state.generated for state in states] == expected
    assert engine.metrics.accepted_tokens > 0  # drafts were kept: the equality is not plain vs plain
    unpenalised = _plain_sampling(target, prompts, SamplingSettings(temperature=0.9), 20, seeds)
    assert expected != unpenalised  # the penalties did change the output


@pytest.mark.parametrize("drafter", [None, "ngram", "suffix"])
def test_greedy_rounds_take_the_path_without_p_and_emit_what_p_would(drafter: str | None) -> None:
    """Rows at temperature 0 with a deterministic draft (or none) are verified from the target's argmax ids
    alone (`verify_greedy`): the tokens are those of the general path over one-hot p, and plain greedy
    decoding's, with a logit bias and the repetition, presence and frequency penalties in the transforms."""
    from exactspec.decoding.builder import build_engine
    from exactspec.decoding.strategy import Strategy

    target = _target()
    settings = SamplingSettings(
        temperature=0.0,
        repetition_penalty=1.3,
        logit_bias={2: 0.5},
        presence_penalty=0.8,
        frequency_penalty=0.5,
    )
    prompts = [[1, 2, 3, 1, 2], [4, 4, 4], [2, 3]]
    config = DecodeConfig(gamma=0 if drafter is None else 3, max_new_tokens=20, settings=settings)
    outputs = []
    for fast in (True, False):
        strategy = Strategy() if drafter is None else Strategy(drafter)
        engine = build_engine(target, None, strategy, config.gamma)
        calls = []
        if fast:
            greedy = engine.greedy_verifier
            assert greedy is not None

            def spy(*args, greedy=greedy, calls=calls):  # noqa: ANN001, ANN002, ANN202
                calls.append(args[0].shape[1])
                return greedy(*args)

            engine.greedy_verifier = spy
        else:
            engine.greedy_verifier = None  # every round builds p and runs `verify`
        states = engine.generate(prompts, config, SeededSampler(seeds=[5, 6, 7]))
        outputs.append([state.generated for state in states])
        if fast:
            assert calls and (drafter is None or max(calls) > 0)  # the greedy path ran, drafted rounds too
    assert outputs[0] == outputs[1]
    assert outputs[0] == [_plain_greedy(target, prompt, settings, 20) for prompt in prompts]


def test_the_greedy_path_is_only_for_token_verification_of_greedy_rows() -> None:
    target = _target()
    assert SpeculativeEngine(target, None, verify_block).greedy_verifier is None
    engine = SpeculativeEngine(target, None)
    calls = []
    engine.greedy_verifier = lambda *args: calls.append(args)  # would fail the round if reached
    config = DecodeConfig(gamma=0, max_new_tokens=3, settings=SamplingSettings(temperature=0.7))
    engine.generate([[1, 2]], config, SeededSampler(0))
    assert calls == []  # sampled rows build p


def _plain_greedy(
    target: LanguageModel, prompt: list[int], settings: SamplingSettings, max_new: int
) -> list[int]:
    generated: list[int] = []
    while len(generated) < max_new:
        history = [*prompt, *generated]
        logits = target.logits([history], 1)[:, 0]  # [1, V]
        token = int(probabilities(logits, settings, [history], prompt_lengths=[len(prompt)]).argmax())
        generated.append(token)
        if token in target.eos_token_ids:
            break
    return generated


GREEDY_DRAFTS = {
    "random": lambda: random_tabular_model(VOCAB, seed=12),
    "peaked": lambda: random_tabular_model(VOCAB, seed=13, sharpness=4.0),
    "one_hot": lambda: random_tabular_model(VOCAB, seed=14, one_hot=True),
    "misses_tokens": lambda: random_tabular_model(VOCAB, seed=15, zero_ids=(1, 2)),
    "target": lambda: random_tabular_model(VOCAB, seed=30, eos_token_id=None, sharpness=2.0),
}


@pytest.mark.parametrize("draft_name", sorted(GREEDY_DRAFTS))
@pytest.mark.parametrize("gamma", [1, 3, 6])
@pytest.mark.parametrize("repetition_penalty", [1.0, 1.4])
def test_greedy_equals_plain_greedy_decoding_for_any_draft(
    draft_name: str, gamma: int, repetition_penalty: float
) -> None:
    # No EOS in the target, so every row runs the full 12 tokens through many rounds.
    target = random_tabular_model(VOCAB, seed=30, eos_token_id=None, sharpness=2.0)
    settings = SamplingSettings(temperature=0, repetition_penalty=repetition_penalty)
    engine = SpeculativeEngine(target, ModelDrafter(GREEDY_DRAFTS[draft_name](), VOCAB))
    states = engine.generate(
        PROMPTS, DecodeConfig(gamma=gamma, max_new_tokens=12, settings=settings), SeededSampler(0, 4)
    )
    assert [state.generated for state in states] == [
        _plain_greedy(target, prompt, settings, 12) for prompt in PROMPTS
    ]
    if draft_name == "target":
        assert engine.metrics.accepted_tokens == engine.metrics.proposed_tokens > 0


def test_draft_equal_to_target_accepts_every_token() -> None:
    target = _target()
    engine = SpeculativeEngine(target, ModelDrafter(target, VOCAB))
    engine.generate(PROMPTS, DecodeConfig(gamma=4, max_new_tokens=20), SeededSampler(0, 4))
    assert engine.metrics.proposed_tokens > 0
    assert engine.metrics.accepted_tokens == engine.metrics.proposed_tokens
    assert engine.metrics.acceptance_rate == 1.0


# ---------------------------------------------------------------- configuration and input errors


@pytest.mark.parametrize("gamma", [-1, MAX_GAMMA + 1, 2.0, 1.5, "3", True, None])
def test_decode_config_rejects_bad_gamma(gamma: object) -> None:
    with pytest.raises(ValueError, match="gamma must be an integer"):
        DecodeConfig(gamma=gamma)  # type: ignore[arg-type]


@pytest.mark.parametrize("max_new_tokens", [0, -3, 2.0, "8", True, None])
def test_decode_config_rejects_bad_max_new_tokens(max_new_tokens: object) -> None:
    with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 1"):
        DecodeConfig(max_new_tokens=max_new_tokens)  # type: ignore[arg-type]


def test_decode_config_accepts_the_limits() -> None:
    assert DecodeConfig(gamma=0).gamma == 0
    assert DecodeConfig(gamma=MAX_GAMMA).gamma == MAX_GAMMA
    assert DecodeConfig(max_new_tokens=1).max_new_tokens == 1


def test_empty_prompt_raises() -> None:
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        _engine().generate([[1], []], DecodeConfig(gamma=2), SeededSampler(0, 2))


def test_no_prompts_raise() -> None:
    with pytest.raises(ValueError, match="no prompts"):
        _engine().generate([], DecodeConfig(gamma=2), SeededSampler(0))


@pytest.mark.parametrize("bad_id", [-1, VOCAB, 1000])
def test_out_of_range_prompt_ids_raise(bad_id: int) -> None:
    with pytest.raises(ValueError, match=f"prompt 0 has token ids outside 0..{VOCAB - 1}"):
        _engine().generate([[1, bad_id]], DecodeConfig(gamma=2), SeededSampler(0))


def test_gamma_without_drafter_raises() -> None:
    engine = SpeculativeEngine(_target())
    with pytest.raises(ValueError, match="gamma > 0 needs a drafter"):
        engine.generate([[1]], DecodeConfig(gamma=1), SeededSampler(0))
    assert engine.generate([[1]], DecodeConfig(gamma=0, max_new_tokens=3), SeededSampler(0))[0].generated


def test_logit_bias_outside_the_target_vocabulary_raises_at_start() -> None:
    config = DecodeConfig(gamma=2, settings=SamplingSettings(logit_bias={VOCAB: 1.0}))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        _engine().generate([[1]], config, SeededSampler(0))


# ---------------------------------------------------------------- metrics


@pytest.mark.parametrize("gamma", [0, 1, 3, 6])
def test_metrics_counts_are_consistent(gamma: int) -> None:
    engine = _engine()
    config = DecodeConfig(gamma=gamma, max_new_tokens=10)
    events = list(engine.stream(PROMPTS, config, SeededSampler(seed=4, num_rows=4)))
    row_rounds = len(events)  # one event per row per round
    # a round is over when a row that took part in it speaks again, so count the rows' first events
    num_rounds = max(sum(1 for event in events if event.row == row) for row in range(len(PROMPTS)))
    metrics = engine.metrics
    assert metrics.emitted_tokens == sum(len(event.tokens) for event in events)
    assert metrics.rounds == num_rounds == metrics.target_calls
    assert metrics.row_rounds == row_rounds
    assert 0 <= metrics.accepted_tokens <= metrics.proposed_tokens
    assert metrics.proposed_tokens <= gamma * row_rounds
    assert metrics.emitted_tokens <= metrics.accepted_tokens + row_rounds
    assert sum(metrics.proposed_by_position) <= metrics.proposed_tokens
    assert sum(metrics.accepted_by_position) == metrics.accepted_tokens
    assert metrics.tokens_per_round == metrics.emitted_tokens / row_rounds
    assert metrics.total_seconds > 0
    if gamma == 0:
        assert metrics.proposed_tokens == 0 and metrics.draft_calls == 0
        assert metrics.emitted_tokens == row_rounds
    else:
        assert metrics.proposed_tokens > 0
        assert len(metrics.proposed_by_position) <= gamma


@pytest.mark.parametrize("verifier_name", ["token", "block"])
def test_validate_off_skips_the_verifiers_checks_and_changes_no_token(verifier_name: str) -> None:
    chosen = {"token": verify, "block": verify_block}[verifier_name]
    flags: list[bool] = []

    def recording(*args: object, validate: bool = True, **options: object) -> object:
        flags.append(validate)
        return chosen(*args, validate=validate, **options)

    config = DecodeConfig(gamma=3, max_new_tokens=12, settings=SamplingSettings(temperature=0.9))
    outputs = []
    for validate in (True, False):
        target = _target()
        engine = SpeculativeEngine(
            target, ModelDrafter(_draft(), target.vocab_size), verifier=recording, validate=validate
        )
        outputs.append(_outputs(engine.generate(PROMPTS, config, SeededSampler(3, num_rows=len(PROMPTS)))))
        assert set(flags) == {validate}
        flags.clear()
    assert outputs[0] == outputs[1]
