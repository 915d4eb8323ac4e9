"""The proof by machine: the engine's exact output distribution equals the target's, over a grid of cases.

`check_speculative` enumerates every random path of the real decoding code on
tiny toy models and compares the result with the target's own autoregressive
distribution. Each case stays under ~3000 paths so the whole file runs in
well under a minute on a loaded 2-core machine. The teeth tests show that the
same check catches a wrong residual and a drafter that misreports its q.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
import torch

import exactspec.verifiers.token as verifier_module
from exactspec.checking.exact import (
    EnumeratingSampler,
    check_speculative,
    enumerate_outputs,
    target_distribution,
    total_variation,
)
from exactspec.checking.toy import TabularModel, random_tabular_model
from exactspec.decoding.engine import DecodeConfig, SpeculativeEngine
from exactspec.drafters import ModelDrafter, Proposal
from exactspec.foundations.rows import Stateless
from exactspec.foundations.sampler import Sampler
from exactspec.foundations.settings import SamplingSettings
from exactspec.foundations.transforms import probabilities

EXACT_TOLERANCE = 1e-12
MAX_CASE_PATHS = 3000


@dataclass(frozen=True)
class Case:
    """One exact check: a target, a draft built from it, prompts and a DecodeConfig."""

    name: str
    vocab_size: int
    max_new_tokens: int
    gamma: int
    settings: SamplingSettings = field(default_factory=SamplingSettings)
    prompts: tuple[tuple[int, ...], ...] = ((1,),)
    target_options: dict = field(default_factory=dict)
    draft_options: dict = field(default_factory=dict)
    draft_vocab_size: int | None = None
    draft_is_target: bool = False
    no_drafter: bool = False

    def build(self) -> tuple[TabularModel, ModelDrafter | None]:
        target = random_tabular_model(self.vocab_size, seed=1, **self.target_options)
        if self.no_drafter:
            return target, None
        if self.draft_is_target:
            draft = target  # the same object: q = p exactly, beta = 0
        else:
            draft = random_tabular_model(
                self.draft_vocab_size or self.vocab_size, seed=2, **self.draft_options
            )
        return target, ModelDrafter(draft, self.vocab_size)

    def config(self) -> DecodeConfig:
        return DecodeConfig(gamma=self.gamma, max_new_tokens=self.max_new_tokens, settings=self.settings)


CASES = [
    # gamma, including gamma > max_new_tokens
    *(Case(f"gamma={g}", vocab_size=3, max_new_tokens=4, gamma=g) for g in (1, 2, 3, 5, 8)),
    # vocabulary sizes, EOS = 0 in each
    Case("V=2", vocab_size=2, max_new_tokens=4, gamma=2),
    Case("V=3", vocab_size=3, max_new_tokens=3, gamma=2),
    Case("V=4", vocab_size=4, max_new_tokens=3, gamma=2),
    Case("V=5", vocab_size=5, max_new_tokens=3, gamma=2),
    # No "V=6 n=3" (2590 paths, a fifth of this file's time): a random draft over 3 tokens is "V=5",
    # one at V=6 is "V=6 n=2", and V=6 with 3 tokens is "one-hot draft V=6" and "top_k=3 V=6" below.
    Case("V=6 n=2", vocab_size=6, max_new_tokens=2, gamma=3),
    # max_new_tokens 1..4 with gamma 3 (1 and 2 are below gamma)
    *(Case(f"max_new_tokens={n}", vocab_size=4, max_new_tokens=n, gamma=3) for n in (1, 2, 3, 4)),
    # draft = target (beta = 0), supports that miss tokens, deterministic drafts
    Case("draft is target", vocab_size=4, max_new_tokens=3, gamma=3, draft_is_target=True),
    Case("draft is target V=6", vocab_size=6, max_new_tokens=2, gamma=5, draft_is_target=True),
    Case("draft misses tokens", vocab_size=5, max_new_tokens=3, gamma=2, draft_options={"zero_ids": (1, 2)}),
    Case(
        "target misses tokens", vocab_size=5, max_new_tokens=3, gamma=2, target_options={"zero_ids": (2, 3)}
    ),
    Case(
        "both miss tokens",
        vocab_size=5,
        max_new_tokens=3,
        gamma=3,
        target_options={"zero_ids": (1,)},
        draft_options={"zero_ids": (2, 3)},
    ),
    Case("draft misses EOS", vocab_size=4, max_new_tokens=3, gamma=2, draft_options={"zero_ids": (0,)}),
    Case("one-hot draft", vocab_size=4, max_new_tokens=3, gamma=3, draft_options={"one_hot": True}),
    Case("one-hot draft V=6", vocab_size=6, max_new_tokens=3, gamma=2, draft_options={"one_hot": True}),
    Case("one-hot target", vocab_size=4, max_new_tokens=3, gamma=2, target_options={"one_hot": True}),
    Case("smaller draft vocabulary", vocab_size=4, max_new_tokens=3, gamma=2, draft_vocab_size=3),
    Case("draft without EOS", vocab_size=4, max_new_tokens=3, gamma=2, draft_options={"eos_token_id": None}),
    Case("draft with other EOS", vocab_size=4, max_new_tokens=3, gamma=2, draft_options={"eos_token_id": 2}),
    Case(
        "no EOS",
        vocab_size=3,
        max_new_tokens=3,
        gamma=2,
        target_options={"eos_token_id": None},
        draft_options={"eos_token_id": None},
    ),
    Case(
        "peaked",
        vocab_size=5,
        max_new_tokens=3,
        gamma=2,
        target_options={"sharpness": 3.0},
        draft_options={"sharpness": 3.0},
    ),
    # sampling transforms
    *(
        Case(f"T={t}", vocab_size=4, max_new_tokens=3, gamma=2, settings=SamplingSettings(temperature=t))
        for t in (0.0, 0.5, 1.0, 1.7)
    ),
    Case("greedy V=6", vocab_size=6, max_new_tokens=4, gamma=3, settings=SamplingSettings(temperature=0)),
    Case("top_k=2", vocab_size=4, max_new_tokens=3, gamma=2, settings=SamplingSettings(top_k=2)),
    Case("top_k=3 V=6", vocab_size=6, max_new_tokens=3, gamma=3, settings=SamplingSettings(top_k=3)),
    Case("top_p=0.7", vocab_size=4, max_new_tokens=3, gamma=2, settings=SamplingSettings(top_p=0.7)),
    Case("min_p=0.3", vocab_size=4, max_new_tokens=3, gamma=2, settings=SamplingSettings(min_p=0.3)),
    Case(
        "rep=1.5", vocab_size=4, max_new_tokens=3, gamma=2, settings=SamplingSettings(repetition_penalty=1.5)
    ),
    Case(
        "rep=0.7", vocab_size=4, max_new_tokens=3, gamma=2, settings=SamplingSettings(repetition_penalty=0.7)
    ),
    Case(
        "logit bias",
        vocab_size=4,
        max_new_tokens=3,
        gamma=2,
        settings=SamplingSettings(logit_bias={1: 1.0, 3: -1.5}),
    ),
    Case(
        "logit bias bans a token",
        vocab_size=4,
        max_new_tokens=3,
        gamma=2,
        settings=SamplingSettings(logit_bias={2: float("-inf")}),
    ),
    Case(
        "all transforms",
        vocab_size=5,
        max_new_tokens=3,
        gamma=3,
        settings=SamplingSettings(
            temperature=0.8, top_k=4, top_p=0.9, min_p=0.05, repetition_penalty=1.3, logit_bias={2: 0.7}
        ),
    ),
    # batches: the joint output over rows must be the product of each row's target distribution
    Case("batch of 2", vocab_size=3, max_new_tokens=2, gamma=2, prompts=((1,), (2, 2))),
    Case(
        "batch of 2 with penalty",
        vocab_size=3,
        max_new_tokens=2,
        gamma=1,
        prompts=((1,), (2, 0, 1)),
        settings=SamplingSettings(temperature=1.7, repetition_penalty=1.4),
    ),
    # gamma = 0: the plain path through the same round
    Case("plain", vocab_size=4, max_new_tokens=3, gamma=0, no_drafter=True),
]


def _check(case: Case):
    target, drafter = case.build()
    return check_speculative(
        lambda: SpeculativeEngine(target, drafter), [list(p) for p in case.prompts], case.config()
    )


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_speculative_output_distribution_equals_the_target(case: Case) -> None:
    result = _check(case)
    assert result.paths <= MAX_CASE_PATHS, f"case too big to keep the file fast: {result.paths} paths"
    assert sum(result.speculative.values()) == pytest.approx(1.0, abs=EXACT_TOLERANCE)
    assert sum(result.target.values()) == pytest.approx(1.0, abs=EXACT_TOLERANCE)
    assert result.sequences == len(result.target)
    assert result.total_variation <= EXACT_TOLERANCE, result.total_variation
    for rows in result.speculative:
        assert len(rows) == len(case.prompts)
        assert all(len(sequence) <= case.max_new_tokens for sequence in rows)


def test_case_names_are_unique() -> None:
    names = [case.name for case in CASES]
    assert len(names) == len(set(names))


# ---------------------------------------------------------------- teeth


TEETH_CASES = [
    Case("V=4", vocab_size=4, max_new_tokens=3, gamma=2),
    Case("one-hot draft", vocab_size=4, max_new_tokens=3, gamma=3, draft_options={"one_hot": True}),
    Case("batch of 2", vocab_size=3, max_new_tokens=2, gamma=2, prompts=((1,), (2, 2))),
]


@pytest.mark.parametrize("case", TEETH_CASES, ids=lambda case: case.name)
def test_wrong_residual_is_detected(case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    # Rejections drawn from p instead of [p - q]+ give min(p, q) + beta * p per position, not p.
    monkeypatch.setattr(verifier_module, "_residual", lambda p_rows, q_rows: p_rows)
    result = _check(case)
    assert result.total_variation > 1e-3


class ArgmaxDrafter(Stateless):
    """Proposes the argmax of q but reports q itself: the mistake docs/algorithm.md 2.7 forbids."""

    def __init__(self, model: TabularModel) -> None:
        self.model = model

    def propose(
        self,
        histories: Sequence[Sequence[int]],
        max_tokens: Sequence[int],
        settings: SamplingSettings,
        sampler: Sampler,
        rows: Sequence[int],
    ) -> Proposal:
        gamma = max(max_tokens)
        vocab = self.model.vocab_size
        tokens = torch.zeros(len(histories), gamma, dtype=torch.long)
        q = torch.zeros(len(histories), gamma, vocab, dtype=torch.float64)
        lengths = torch.zeros(len(histories), dtype=torch.long)
        for b, history in enumerate(histories):
            context = list(history)
            for i in range(max_tokens[b]):
                q_i = probabilities(self.model.logits([context], 1)[:, 0], settings, [context])[0]
                token = int(q_i.argmax())
                tokens[b, i], q[b, i] = token, q_i
                lengths[b] += 1
                context.append(token)
                if token in self.model.eos_token_ids:
                    break
        return Proposal(tokens=tokens, q=q, lengths=lengths)


@pytest.mark.parametrize("gamma", [1, 3])
def test_argmax_drafter_reporting_softmax_q_is_detected(gamma: int) -> None:
    target = random_tabular_model(4, seed=1)
    drafter = ArgmaxDrafter(random_tabular_model(4, seed=2))
    result = check_speculative(
        lambda: SpeculativeEngine(target, drafter), [[1]], DecodeConfig(gamma=gamma, max_new_tokens=3)
    )
    assert result.total_variation > 1e-3


def test_argmax_drafter_is_fine_when_q_really_is_one_hot() -> None:
    # Control for the test above: at temperature 0 the argmax is the draw, so the check passes.
    target = random_tabular_model(4, seed=1)
    drafter = ArgmaxDrafter(random_tabular_model(4, seed=2))
    config = DecodeConfig(gamma=2, max_new_tokens=3, settings=SamplingSettings(temperature=0))
    assert (
        check_speculative(lambda: SpeculativeEngine(target, drafter), [[1]], config).total_variation
        <= EXACT_TOLERANCE
    )


# ---------------------------------------------------------------- the enumeration machinery


def test_enumerating_sampler_gives_a_known_categorical_distribution() -> None:
    probs = torch.tensor([[0.2, 0.0, 0.5, 0.3]], dtype=torch.float64)
    distribution, paths = enumerate_outputs(lambda sampler: int(sampler.categorical(probs, [0])[0]))
    assert paths == 3  # the zero-probability id is pruned
    assert distribution == pytest.approx({0: 0.2, 2: 0.5, 3: 0.3}, abs=1e-15)


def test_enumerating_sampler_combines_coins_and_draws() -> None:
    # Flip a 0.3 coin; on heads draw from [0.5, 0.5], on tails from [0.1, 0.9]; output (coin, token).
    def run(sampler: EnumeratingSampler) -> tuple[bool, int]:
        coin = bool(sampler.bernoulli(torch.tensor([0.3], dtype=torch.float64), [0])[0])
        row = [0.5, 0.5] if coin else [0.1, 0.9]
        return coin, int(sampler.categorical(torch.tensor([row], dtype=torch.float64), [0])[0])

    distribution, paths = enumerate_outputs(run)
    assert paths == 4
    assert sum(distribution.values()) == pytest.approx(1.0, abs=1e-15)
    assert distribution == pytest.approx(
        {(True, 0): 0.15, (True, 1): 0.15, (False, 0): 0.07, (False, 1): 0.63}, abs=1e-15
    )


def test_a_positions_coupled_drafts_and_its_draw_share_one_uniform() -> None:
    """Drafts of a position by q's inverse CDF (`draft_at`) and its draw from p (`categorical_at`) read one
    uniform u: the enumeration gives (draft, draw) the quantile coupling's joint law, |I_q(x) ∩ I_p(y)|
    over the CDF intervals in id order, so the draw alone is p, and a second draft of the position (a
    later round's, another q) narrows u further without changing the draw's law."""
    q = torch.tensor([[0.5, 0.25, 0.25]], dtype=torch.float64)  # I_q: [0, .5) [.5, .75) [.75, 1)
    q_again = torch.tensor([[0.25, 0.5, 0.25]], dtype=torch.float64)  # [0, .25) [.25, .75) [.75, 1)
    p = torch.tensor([[0.25, 0.5, 0.25]], dtype=torch.float64)  # I_p: [0, .25) [.25, .75) [.75, 1)

    def run(sampler: EnumeratingSampler) -> tuple[int, int, int]:
        draft = int(sampler.draft_at(q, [0], [4])[0])
        again = int(sampler.draft_at(q_again, [0], [4])[0])
        return draft, again, int(sampler.categorical_at(p, [0], [4])[0])

    distribution, _ = enumerate_outputs(run)
    assert distribution == pytest.approx(
        {(0, 0, 0): 0.25, (0, 1, 1): 0.25, (1, 1, 1): 0.25, (2, 2, 2): 0.25}, abs=1e-15
    )
    draws: dict[int, float] = {}
    for (_, _, draw), probability in distribution.items():
        draws[draw] = draws.get(draw, 0.0) + probability
    assert draws == pytest.approx({0: 0.25, 1: 0.5, 2: 0.25}, abs=1e-15)

    def drawn_twice(sampler: EnumeratingSampler) -> None:
        sampler.categorical_at(p, [0], [4])
        sampler.draft_at(q, [0], [4])

    with pytest.raises(AssertionError, match="drafted its position 4 after drawing it"):
        enumerate_outputs(drawn_twice)


def test_enumerating_sampler_handles_batched_calls_and_certain_coins() -> None:
    def run(sampler: EnumeratingSampler) -> tuple:
        coins = sampler.bernoulli(torch.tensor([1.0, 0.0, 0.5], dtype=torch.float64), [0, 1, 2])
        draws = sampler.categorical(torch.tensor([[0.0, 1.0], [0.25, 0.75]], dtype=torch.float64), [0, 1])
        return tuple(coins.tolist()), tuple(draws.tolist())

    distribution, paths = enumerate_outputs(run)
    assert paths == 4  # only the 0.5 coin and the [0.25, 0.75] row branch
    assert distribution == pytest.approx(
        {
            ((True, False, True), (1, 0)): 0.125,
            ((True, False, True), (1, 1)): 0.375,
            ((True, False, False), (1, 0)): 0.125,
            ((True, False, False), (1, 1)): 0.375,
        },
        abs=1e-15,
    )


def test_enumerating_sampler_follows_its_script_and_counts_options() -> None:
    sampler = EnumeratingSampler(script=[1, 0])
    probs = torch.tensor([[0.5, 0.0, 0.25, 0.25]], dtype=torch.float64)
    assert sampler.categorical(probs, [0]).tolist() == [2]  # the second option with mass
    assert sampler.bernoulli(torch.tensor([0.4], dtype=torch.float64), [0]).tolist() == [True]
    assert sampler.categorical(probs, [0]).tolist() == [0]  # past the script: option 0
    assert sampler.taken == [1, 0, 0]
    assert sampler.option_counts == [3, 2, 3]
    assert sampler.probability == pytest.approx(0.25 * 0.4 * 0.5, abs=1e-15)
    assert sampler.next_script() == [1, 0, 1]
    last = EnumeratingSampler(script=[2, 1])
    last.categorical(probs, [0])
    last.bernoulli(torch.tensor([0.4], dtype=torch.float64), [0])
    assert last.next_script() is None


def test_enumerating_sampler_needs_float64() -> None:
    with pytest.raises(ValueError, match="float64"):
        EnumeratingSampler().categorical(torch.tensor([[0.5, 0.5]]), [0])


def test_enumeration_stops_past_max_paths() -> None:
    probs = torch.full((1, 4), 0.25, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="more than 10 random paths"):
        enumerate_outputs(lambda s: tuple(int(s.categorical(probs, [0])[0]) for _ in range(2)), max_paths=10)


def test_speculative_path_probabilities_sum_to_one() -> None:
    result = _check(Case("V=5", vocab_size=5, max_new_tokens=3, gamma=2))
    assert result.paths > 100
    assert sum(result.speculative.values()) == pytest.approx(1.0, abs=1e-13)


def test_total_variation_on_known_distributions() -> None:
    assert total_variation({"a": 0.5, "b": 0.5}, {"a": 0.5, "b": 0.5}) == 0.0
    assert total_variation({"a": 1.0}, {"b": 1.0}) == 1.0
    assert total_variation({"a": 0.5, "b": 0.5}, {"a": 0.2, "b": 0.3, "c": 0.5}) == pytest.approx(0.5)


def test_target_distribution_of_a_hand_model() -> None:
    # p = [0.25, 0.75] after every history, EOS = 0, at most 2 tokens.
    model = TabularModel(lambda history: [0.25, 0.75], vocab_size=2, eos_token_ids={0})
    distribution = target_distribution(model, [1], SamplingSettings(), max_new_tokens=2)
    assert distribution == pytest.approx({(0,): 0.25, (1, 0): 0.1875, (1, 1): 0.5625}, abs=1e-15)
    greedy = target_distribution(model, [1], SamplingSettings(temperature=0), max_new_tokens=2)
    assert greedy == {(1, 1): 1.0}


def test_check_speculative_on_a_hand_model() -> None:
    target = TabularModel(lambda history: [0.25, 0.75], vocab_size=2, eos_token_ids={0})
    draft = TabularModel(lambda history: [0.5, 0.5], vocab_size=2, eos_token_ids={0})
    result = check_speculative(
        lambda: SpeculativeEngine(target, ModelDrafter(draft, 2)),
        [[1]],
        DecodeConfig(gamma=2, max_new_tokens=2),
    )
    assert result.target == pytest.approx({((0,),): 0.25, ((1, 0),): 0.1875, ((1, 1),): 0.5625}, abs=1e-15)
    assert result.speculative == pytest.approx(result.target, abs=1e-15)
    assert result.total_variation <= EXACT_TOLERANCE


def test_the_verify_grid_runs_every_shipped_strategy_sampled() -> None:
    """`exactspec verify` covers each strategy the builder ships, with at least one sampled (T > 0) case."""
    from exactspec.checking.grid import exact_grid
    from exactspec.decoding.strategy import all_strategies

    sampled = {case.strategy for case in exact_grid() if not case.settings.greedy and not case.schedule}
    assert sampled >= set(all_strategies())


def test_every_registered_drafter_gets_grid_cases_and_the_earlier_requests_reach_a_shared_tree() -> None:
    """A drafter that registers itself is enumerated by `exactspec verify` with no edit of the grid; the
    "after earlier requests" case really drafts from what the earlier requests left (suffix: the
    shared tree)."""
    from exactspec.checking.grid import DRAFTERS_WITH_OWN_CASES, registered_drafter_cases
    from exactspec.drafters.registry import drafter_kinds

    cases = registered_drafter_cases()
    assert {c.strategy.drafter for c in cases} == set(drafter_kinds()) - DRAFTERS_WITH_OWN_CASES
    after = next(c for c in cases if c.strategy.drafter == "suffix" and c.previous)
    target, draft = after.models()
    engine = after.engine_factory(target, draft)()
    assert engine.drafter.draft(0, list(after.prompts[0]), after.gamma).source == "global"
