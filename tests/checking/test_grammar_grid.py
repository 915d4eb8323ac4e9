"""The exact grid's constrained rounds (`checking.toy_grammar.grammar_cases`): a toy grammar with forced
and free positions, forced drafts at q = 1 ahead of every drafter's, lookup drafts that leave the grammar,
EOS only where it ends; and checks that the cases exercise what they claim."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import grid_cases

import exactspec.drafters.forced as forced_module
from exactspec.checking.exact import check_speculative, target_distribution
from exactspec.checking.grid import ExactCase, run_exact_case
from exactspec.checking.toy_grammar import KEY_VALUE_GRAMMAR, LONG_KEY_GRAMMAR, TOY_EOS
from exactspec.decoding.engine import DecodeConfig
from exactspec.foundations.sampler import SeededSampler

GRAMMAR_CASES = grid_cases("grammar")


@pytest.mark.parametrize("case", GRAMMAR_CASES, ids=lambda case: case.name)
def test_constrained_rounds_are_exact(case: ExactCase) -> None:
    result = run_exact_case(case)
    assert result.total_variation <= case.tolerance, result.total_variation


def test_the_constrained_target_law_stays_in_the_grammar_and_ends_only_where_it_may() -> None:
    case = GRAMMAR_CASES[0]
    target, _ = case.models()
    law = target_distribution(target, case.prompts[0], case.settings, case.max_new_tokens)
    assert sum(law.values()) == pytest.approx(1.0)
    assert all(KEY_VALUE_GRAMMAR.accepts(sequence) for sequence in law)
    # Both ways to finish happen: EOS at the grammar's end, and the length limit inside the grammar.
    assert any(sequence[-1] == TOY_EOS for sequence in law)
    assert any(TOY_EOS not in sequence for sequence in law)
    # The free value positions really are free: both values occur.
    assert {sequence[2] for sequence in law if len(sequence) > 2} == {3, 4}


def engine_metrics(case: ExactCase, seed: int = 0):
    target, draft = case.models()
    engine = case.engine_factory(target, draft)()
    config = DecodeConfig(gamma=case.gamma, max_new_tokens=case.max_new_tokens, settings=case.settings)
    states = engine.generate(list(case.prompts), config, SeededSampler(seed))
    return engine.metrics, states


def test_forced_tokens_are_drafted_and_accepted_and_lookup_drafts_leave_the_grammar(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    by_name = {case.name: case for case in GRAMMAR_CASES}
    metrics, states = engine_metrics(by_name["grammar, draft model, forced and free positions"])
    assert metrics.forced_tokens >= 2 and metrics.forced_accepted == metrics.forced_tokens
    assert states[0].generated[:2] == [1, 2]
    # The lookup drafter, after the forced key 1 2, proposes the prompt's next token 2: outside.
    leaving = by_name["grammar, lookup drafts that leave the grammar"]
    proposals = []
    original = forced_module._prepend

    def spy(forced, inner):
        proposal = original(forced, inner)
        proposals.extend(proposal.row_tokens(b) for b in range(proposal.tokens.shape[0]))
        return proposal

    monkeypatch.setattr(forced_module, "_prepend", spy)
    metrics, states = engine_metrics(leaving)
    assert [1, 2, 2] in [draft[:3] for draft in proposals]
    assert KEY_VALUE_GRAMMAR.accepts(states[0].generated)


def test_a_mask_built_from_the_rounds_first_history_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mask must follow each position's own history (drafted tokens included): a target pass that masks
    every position of a block as its first is not exact, and the grid says so."""
    import exactspec.decoding.target_pass as target_pass

    original = target_pass.probabilities_per_row

    def stale(logits, settings, histories=None, prompt_lengths=None):
        if histories is not None:
            first, previous, stale_histories = None, None, []
            for history in histories:  # a row's positions extend each other by one token
                if previous is None or list(history[:-1]) != list(previous):
                    first = history
                stale_histories.append(first)
                previous = history
            histories = stale_histories
        return original(logits, settings, histories, prompt_lengths)

    case = next(
        case for case in GRAMMAR_CASES if case.name == "grammar, draft model, forced and free positions"
    )
    assert run_exact_case(case).paths > 20  # the enumeration branches: free positions, rejections
    monkeypatch.setattr(target_pass, "probabilities_per_row", stale)
    # Shorter outputs: wrong masks let far more paths through than the grammar allows.
    assert run_exact_case(dataclasses.replace(case, max_new_tokens=4)).total_variation > 1e-3


class PlansNothing:
    """A gamma policy that plans no draft of the drafter's for any row (a full batch's plan)."""

    def plan(self, rows) -> list[int]:
        return [0] * len(rows)

    def record(self, row: int, proposed: int, accepted: int) -> None:
        assert proposed == 0  # the policy hears of the drafter's own tokens only, never the forced ones

    def timed(self, shape, seconds: float) -> None:
        return None

    def joining(self, rows: int) -> None:
        pass

    def add_rows(self, rows) -> None:
        pass

    def release_rows(self, rows) -> None:
        pass


def test_forced_tokens_are_drafted_where_the_policy_plans_no_draft_and_stay_exact() -> None:
    """Forced tokens cost no draft work: a row planned at gamma 0 still drafts them at q = 1 (the whole
    key in one round), and the law is the target's, enumerated exactly."""
    case = {c.name: c for c in GRAMMAR_CASES}["grammar, draft model, forced and free positions"]
    target, draft = case.models()
    build = case.engine_factory(target, draft)

    def planned_at_zero():
        engine = build()
        engine.gamma_policy = PlansNothing()
        return engine

    config = DecodeConfig(gamma=case.gamma, max_new_tokens=case.max_new_tokens, settings=case.settings)
    engine = planned_at_zero()
    states = engine.generate(list(case.prompts), config, SeededSampler(0))
    assert (
        engine.metrics.forced_tokens >= 2 and engine.metrics.forced_accepted == engine.metrics.forced_tokens
    )
    assert engine.metrics.proposed_tokens == engine.metrics.forced_tokens  # nothing of the drafter's own
    assert states[0].generated[:2] == [1, 2]
    check = check_speculative(planned_at_zero, case.prompts, config, reference=target)
    assert check.total_variation <= case.tolerance, check.total_variation


LONG_RUN = "grammar, a forced run longer than gamma, draft model"


def drafted_blocks(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """Every row's draft of every round from here on (the engine's proposals, forced tokens first)."""
    blocks: list[list[int]] = []
    original = forced_module._prepend

    def spy(forced, inner):
        proposal = original(forced, inner)
        blocks.extend(proposal.row_tokens(b) for b in range(proposal.tokens.shape[0]))
        return proposal

    monkeypatch.setattr(forced_module, "_prepend", spy)
    return blocks


def test_a_forced_run_longer_than_gamma_is_drafted_whole_in_one_round(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Jump-forward: at gamma 1 the first round drafts the grammar's whole forced key (4 tokens), the
    metrics count them as forced, and the close after the value goes whole too."""
    case = {c.name: c for c in GRAMMAR_CASES}[LONG_RUN]
    assert case.gamma == 1 and LONG_KEY_GRAMMAR.forced([], 9) == [1, 2, 1, 2]
    blocks = drafted_blocks(monkeypatch)
    later_runs = []
    for seed in range(8):
        blocks.clear()
        metrics, states = engine_metrics(case, seed)
        assert blocks[0] == [1, 2, 1, 2]
        later_runs.extend(block for block in blocks[1:] if len(block) > case.gamma)
        # Rounds that drafted forced tokens drafted nothing else (the cap leaves the drafter no room).
        assert metrics.forced_tokens == sum(len(block) for block in blocks)
        assert 0 < metrics.forced_accepted <= metrics.forced_tokens
        assert LONG_KEY_GRAMMAR.accepts(states[0].generated)
    assert [1, 2] in later_runs  # the close, when a round starts after the value


def test_a_forced_run_stops_at_the_length_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """With 3 tokens left the round may draft 2 (its bonus must fit): the key's run is cut there."""
    case = dataclasses.replace({c.name: c for c in GRAMMAR_CASES}[LONG_RUN], max_new_tokens=3)
    blocks = drafted_blocks(monkeypatch)
    _, states = engine_metrics(case)
    assert blocks[0] == [1, 2]
    assert len(states[0].generated) <= 3
    assert run_exact_case(case).total_variation <= case.tolerance


def test_a_forced_run_past_the_length_limit_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A forced run bounded by the pass's maximum but not by the row's length limit emits past
    max_new_tokens: the grid's long-run case catches it."""
    case = dataclasses.replace({c.name: c for c in GRAMMAR_CASES}[LONG_RUN], max_new_tokens=3)

    def unbounded(caps, rooms, most=forced_module.MAX_FORCED_RUN):
        return [most if cap > 0 else 0 for cap in caps]

    monkeypatch.setattr(forced_module, "forced_limits", unbounded)
    assert run_exact_case(case).total_variation > 1e-3


def test_forced_tokens_taken_as_the_targets_without_its_p_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forced tokens are verified like any draft: the text is forced, its spelling may not be (the long
    key's `1 2` is also spelled 3), so the target's p of a forced token can be below 1. Emitting a forced
    run as if p were 1 on it (jump-forward without the target's pass) changes the law, and the case
    catches it."""
    import exactspec.decoding.engine as engine_module

    case = {c.name: c for c in GRAMMAR_CASES}[LONG_RUN]
    original = engine_module.chain_probabilities

    def trusting(target, histories, proposal, settings, *args, **kwargs):
        p, reported = original(target, histories, proposal, settings, *args, **kwargs)
        starts = kwargs["prompt_lengths"]
        for b, (history, row_settings) in enumerate(zip(histories, settings, strict=True)):
            drafted = proposal.row_tokens(b)
            run = row_settings.constraint.forced(history[starts[b] :], len(drafted))
            for i, token in enumerate(run):
                if drafted[i] != token:
                    break
                p[b, i] = 0.0
                p[b, i, token] = 1.0  # [V]: the forced token taken as certain
        return p, reported

    assert run_exact_case(case).total_variation <= case.tolerance
    monkeypatch.setattr(engine_module, "chain_probabilities", trusting)
    assert run_exact_case(case).total_variation > 1e-3


def test_draft_calls_count_the_draft_models_steps_not_the_forced_tokens() -> None:
    """Forced tokens run no draft model: the metrics' draft calls (and the round shapes a planner learns
    from) are the draft model's own steps, which a round's forced tokens would otherwise inflate."""
    for name in ("grammar, draft model, forced and free positions", LONG_RUN):
        case = {c.name: c for c in GRAMMAR_CASES}[name]
        target, draft = case.models()
        calls = 0

        def counting(*args, original=draft.logits, **kwargs):
            nonlocal calls
            calls += 1
            return original(*args, **kwargs)

        draft.logits = counting
        engine = case.engine_factory(target, draft)()
        config = DecodeConfig(gamma=case.gamma, max_new_tokens=case.max_new_tokens, settings=case.settings)
        for seed in range(5):
            engine.generate(list(case.prompts), config, SeededSampler(seed))
        assert engine.metrics.forced_tokens > 0
        assert engine.metrics.draft_calls == calls, name
