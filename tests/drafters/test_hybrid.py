"""The hybrid drafter: a row drafts its free lookup chain or the draft model, as the plan chose, and the
planner prices each source as it costs; the rounds stay exact."""

from __future__ import annotations

import pytest
import torch

from exactspec.checking.grid import GRID_BATCH_COSTS, exact_grid, run_exact_case
from exactspec.checking.toy import random_tabular_model
from exactspec.decoding.builder import build_components
from exactspec.decoding.gamma import RoundRow
from exactspec.decoding.planner import CostAwareGamma
from exactspec.decoding.round_times import RoundShape
from exactspec.decoding.strategy import Strategy
from exactspec.drafters import ModelDrafter
from exactspec.drafters.base import LookupChain
from exactspec.drafters.forced import drafter_steps
from exactspec.drafters.hybrid import HybridDrafter
from exactspec.drafters.ngram import NgramDrafter
from exactspec.drafters.suffix import SuffixDrafter
from exactspec.foundations.costs import BatchCosts
from exactspec.foundations.defaults import DEFAULTS
from exactspec.foundations.rows import RowStart
from exactspec.foundations.sampler import SeededSampler
from exactspec.foundations.settings import SamplingSettings

SETTINGS = SamplingSettings()
EOS = {0}
V = 7


def hybrid(lookup: str = "suffix", coupled: bool = True) -> HybridDrafter:
    drafter = SuffixDrafter(EOS) if lookup == "suffix" else NgramDrafter(EOS)
    return HybridDrafter(drafter, ModelDrafter(random_tabular_model(V, seed=2), V, coupled=coupled), V)


@pytest.mark.parametrize("lookup", ["suffix", "ngram"])
def test_a_lookup_chain_is_what_the_free_drafter_proposes(lookup: str) -> None:
    drafter = SuffixDrafter(EOS) if lookup == "suffix" else NgramDrafter(EOS)
    history = [3, 4, 5, 6, 3, 4, 5]
    drafter.add_rows([RowStart(0, prompt=tuple(history))])
    chain = drafter.lookup(0, history, 3)
    assert chain.tokens == drafter.propose([history], [3], SETTINGS, None, [0]).row_tokens(0) == [6, 3, 4]
    assert chain.order >= 3  # the suffix 3 4 5 occurred before
    assert drafter.lookup(0, [1, 2], 3) == LookupChain([], 0)  # nothing to match


@pytest.mark.parametrize("coupled", [True, False])
def test_settled_rows_draft_from_the_source_the_plan_chose(coupled: bool) -> None:
    drafter = hybrid(coupled=coupled)
    histories = [[3, 4, 5, 3, 4], [3, 4, 5, 3, 4], [1, 2]]
    starts = [RowStart(r, prompt=tuple(h)) for r, h in enumerate(histories)]
    drafter.add_rows(starts)
    chains = drafter.probe(histories, [2, 2, 2], [0, 1, 2])
    assert [chain.tokens for chain in chains] == [[5, 3], [5, 3], []]
    # Row 0 takes its chain; row 1 has one too, but the plan gave it to the model; row 2 has none.
    drafter.settle([0, 1, 2], [True, False, False])
    proposal = drafter.propose(histories, [2, 2, 2], SETTINGS, SeededSampler(0, 3), [0, 1, 2])
    assert proposal.row_tokens(0) == [5, 3]
    model = ModelDrafter(random_tabular_model(V, seed=2), V, coupled=coupled)
    model.add_rows(starts[1:])
    alone = model.propose([histories[1], histories[2]], [2, 2], SETTINGS, SeededSampler(0, 3), [1, 2])
    for b, row in ((0, 1), (1, 2)):
        length = int(alone.lengths[b])
        assert proposal.lengths[row] == length
        assert torch.equal(proposal.tokens[row, :length], alone.tokens[b, :length])
    if coupled:  # coupled drafts are chains, as the lookup's: one deterministic proposal
        assert proposal.deterministic and proposal.q is None and alone.q is None
    else:  # dense: the lookup row one-hot, the model's rows their q
        assert proposal.q is not None and alone.q is not None
        one_hot = torch.nn.functional.one_hot(torch.tensor([5, 3]), V).to(proposal.q.dtype)
        assert torch.equal(proposal.q[0, :2], one_hot)
        for b, row in ((0, 1), (1, 2)):
            length = int(alone.lengths[b])
            assert torch.equal(proposal.q[row, :length], alone.q[b, :length])
    # The round's draft steps are the model's: row 0's chain (2 tokens) ran none.
    assert proposal.model_drawn is not None and proposal.model_drawn.tolist() == [0, *alone.lengths.tolist()]
    assert drafter_steps(proposal, [0, 0, 0]) == max(alone.lengths.tolist())
    # A choice holds for one round: unsettled, a row with a chain looks up again.
    again = drafter.propose(histories[1:2], [2], SETTINGS, SeededSampler(0, 3), [1])
    assert again.deterministic and again.row_tokens(0) == [5, 3]


class ChangingLookup(SuffixDrafter):
    """A suffix drafter whose every later lookup finds another chain: what a lookup whose depth rule
    changed between the probe and the proposal would do."""

    def __init__(self) -> None:
        super().__init__(EOS)
        self.calls = 0

    def lookup(self, row: int, history, limit: int) -> LookupChain:
        self.calls += 1
        chain = super().lookup(row, history, limit)
        return chain if self.calls == 1 else LookupChain(chain.tokens[:1], chain.order)


def test_a_lookup_row_drafts_the_chain_its_plan_priced() -> None:
    lookup = ChangingLookup()
    drafter = HybridDrafter(lookup, ModelDrafter(random_tabular_model(V, seed=2), V), V)
    history = [3, 4, 5, 3, 4]
    drafter.add_rows([RowStart(0, prompt=tuple(history))])
    (chain,) = drafter.probe([history], [3], [0])
    assert chain.tokens == [5, 3]
    drafter.settle([0], [True])
    proposal = drafter.propose([history], [2], SETTINGS, SeededSampler(0, 1), [0])  # the plan took 2
    assert proposal.row_tokens(0) == [5, 3] and lookup.calls == 1  # the probed chain, not a new lookup
    drafter.probe([history], [3], [0])
    drafter.settle([0], [True])
    assert drafter.propose([history], [1], SETTINGS, SeededSampler(0, 1), [0]).row_tokens(0) == [5]
    # A history the probe did not see (forced tokens put before the draft) is looked up again.
    drafter.probe([history], [3], [0])
    drafter.settle([0], [True])
    longer = [*history, 5]
    drafter.propose([longer], [2], SETTINGS, SeededSampler(0, 1), [0])
    assert lookup.calls == 4


# ---------------------------------------------------------------- the planner's choice of source

# A draft-model step costs as much as a target step: model drafts only pay when nearly always kept.
DEAR_DRAFT = BatchCosts(
    rows=(1, 2),
    widths=(1, 2, 3, 4, 5),
    target=((0.05, 0.052, 0.054, 0.056, 0.058), (0.06, 0.064, 0.068, 0.072, 0.076)),
    draft=((0.05,) * 5, (0.055,) * 5),
)


def test_a_row_with_a_chain_drafts_it_at_no_draft_step_where_the_model_would_not_pay() -> None:
    policy = CostAwareGamma(DEAR_DRAFT, match_orders=8)
    policy.add_rows([RowStart(0)])
    assert policy.plan([RoundRow(0, 4, length=20)]) == [0]  # the model alone: its steps cost too much
    assert not policy.looks_up(0)
    planned = policy.plan([RoundRow(0, 4, length=20, lookup=4, lookup_order=6)])
    assert planned == [4] and policy.looks_up(0)  # the same rates, free: the whole chain
    assert policy.plan([RoundRow(0, 4, length=20, lookup=2, lookup_order=6)]) == [2]  # never past the chain


def test_matches_that_keep_failing_hand_the_row_to_the_model() -> None:
    cheap_draft = BatchCosts(
        rows=(1,), widths=(1, 2, 3, 4, 5), target=((0.05, 0.052, 0.054, 0.056, 0.058),), draft=((0.005,) * 5,)
    )
    policy = CostAwareGamma(cheap_draft, match_orders=8)
    policy.add_rows([RowStart(0)])
    assert policy.lengths is not None
    row = RoundRow(0, 4, length=20, lookup=4, lookup_order=1)
    policy.plan([row])
    assert policy.looks_up(0)  # the same prior rates: the free chain first
    for _ in range(6):  # unigram chains rejected at once, while the plan still takes them
        policy.plan([row])
        if not policy.looks_up(0):
            break
        policy.lengths.length_for(0, 1)  # the drafter asks, as SuffixDrafter._cut does
        policy.record(0, 4, 0)
    for _ in range(6):  # the model's drafts all kept
        policy.plan([RoundRow(0, 4, length=20)])
        policy.record(0, 4, 4)
    policy.plan([row])
    assert not policy.looks_up(0)  # a unigram chain is now worth less than the model's draft
    assert policy.lengths.order_rates(0, 6)[0] > 0.7 > policy.lengths.order_rates(0, 1)[0]  # not blamed


def test_each_source_is_stopped_by_its_own_realized_gain() -> None:
    cheap_draft = BatchCosts(
        rows=(1,), widths=(1, 2, 3, 4, 5), target=((0.05, 0.052, 0.054, 0.056, 0.058),), draft=((0.005,) * 5,)
    )
    with_chain = RoundRow(0, 4, length=20, lookup=4, lookup_order=6)

    def fresh() -> CostAwareGamma:
        policy = CostAwareGamma(cheap_draft, match_orders=8)
        policy.add_rows([RowStart(0)])
        return policy

    # A round is filed under the source that drafted it.
    policy = fresh()
    (draft,) = policy.plan([with_chain])
    assert policy.looks_up(0) and draft > 0
    policy.lengths.length_for(0, 6)  # type: ignore[union-attr]  # the drafter asks, as SuffixDrafter._cut does
    policy.record(0, draft, draft)
    policy.timed(RoundShape(1, draft + 1, 0), 0.06)
    assert policy.lookup_gains is not None and policy.lookup_gains.drafting_rounds(0) > 0
    assert policy.gains.drafting_rounds(0) == 0
    # Chains that gave less than plain rounds stop the row's lookups, not the model's drafts ...
    policy = fresh()
    assert policy.lookup_gains is not None
    for _ in range(3):
        policy.lookup_gains.observe(0, drafted=True, tokens=1, plain_equivalents=3.0)
    assert policy.lookup_gains.stopped(0) and not policy.gains.stopped(0)
    assert policy.plan([with_chain])[0] > 0 and not policy.looks_up(0)  # the model drafts, chain or not
    # ... and model drafts that did stop the model, while the row still drafts its chains.
    policy = fresh()
    for _ in range(3):
        policy.gains.observe(0, drafted=True, tokens=1, plain_equivalents=3.0)
    assert policy.gains.stopped(0) and not policy.lookup_gains.stopped(0)  # type: ignore[union-attr]
    assert policy.plan([RoundRow(0, 4, length=20)]) == [0]
    assert policy.plan([with_chain])[0] > 0 and policy.looks_up(0)
    # While it drafts chains, the stopped model rests: after probe_every rounds it is probed again.
    sources = []
    for _ in range(policy.gains.probe_every + 1):
        (draft,) = policy.plan([with_chain])
        sources.append(policy.looks_up(0))
        if policy.looks_up(0):
            policy.lengths.length_for(0, 6)  # type: ignore[union-attr]
        policy.record(0, draft, draft)
    assert sources[0] and not all(sources)


def test_lookup_rounds_teach_the_lookup_and_model_rounds_the_model() -> None:
    policy = CostAwareGamma(DEAR_DRAFT, match_orders=8)
    policy.add_rows([RowStart(0)])
    assert policy.lengths is not None
    model_rates = policy.rates.position_rates(0)
    policy.plan([RoundRow(0, 4, length=20, lookup=4, lookup_order=6)])
    policy.lengths.length_for(0, 6)
    policy.record(0, 4, 0)
    assert policy.rates.position_rates(0) == model_rates  # a failed chain says nothing of the model
    assert policy.lengths.order_rates(0, 6)[0] < model_rates[0]


# ---------------------------------------------------------------- wiring and exactness


def test_the_builder_gives_the_hybrid_the_planner_as_its_lookup_lengths() -> None:
    target = random_tabular_model(5, seed=1)
    draft = random_tabular_model(5, seed=2)
    parts = build_components(
        target, draft, Strategy("hybrid", "token", True), 4, batch_costs=GRID_BATCH_COSTS
    )
    assert isinstance(parts.drafter, HybridDrafter) and isinstance(parts.gamma_policy, CostAwareGamma)
    assert isinstance(parts.drafter.lookup, SuffixDrafter)
    assert parts.drafter.lookup.lengths is parts.gamma_policy
    ngram = Strategy("hybrid", "token", True, drafter_options={"lookup": "ngram"})
    assert isinstance(build_components(target, draft, ngram, 4).drafter.lookup, NgramDrafter)  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="lookup takes one of suffix, ngram"):
        Strategy("hybrid", drafter_options={"lookup": "tree"})


def test_the_hybrid_gets_a_free_drafters_cap_and_the_model_its_own() -> None:
    assert Strategy("hybrid").default_gamma("int4") == DEFAULTS.free_adaptive_gamma_cap
    assert Strategy("suffix").default_gamma("int4") == DEFAULTS.free_adaptive_gamma_cap
    assert Strategy("model").default_gamma("int4") == DEFAULTS.adaptive_gamma_cap
    assert DEFAULTS.adaptive_gamma_cap < DEFAULTS.free_adaptive_gamma_cap
    fixed = Strategy("hybrid", adaptive_gamma=False)
    assert fixed.default_gamma("int4") == DEFAULTS.int4_gamma  # a fixed gamma is the weights' own


def test_the_grid_runs_planned_hybrid_rounds_with_both_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    """The grid's planned hybrid cases (tests/decoding/test_gamma.py proves them exact) really see rows
    choose the chain and rows choose the model."""
    choices: list[bool] = []
    settle = HybridDrafter.settle

    def counting(self: HybridDrafter, rows, looks_up) -> None:  # type: ignore[no-untyped-def]
        choices.extend(looks_up)
        settle(self, rows, looks_up)

    monkeypatch.setattr(HybridDrafter, "settle", counting)
    cases = [case for case in exact_grid() if case.name.startswith("planned gamma token, hybrid")]
    assert len(cases) == 2
    for case in cases:
        assert run_exact_case(case).total_variation <= case.tolerance
    assert True in choices and False in choices
