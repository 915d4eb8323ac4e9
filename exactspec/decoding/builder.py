"""The one builder: a `Strategy` (drafter, verifier, gamma policy) on a backend's models -> engine, scheduler.

Every entry point builds here: the Python API (`SpeculativeDecoder`), `exactspec generate`,
`serve`, `bench`, `audit`, `batch`, and the `verify` grid, whose exact cases name strategies and
run through these same functions, so the proof covers the wiring that ships. The backend is the
pair of `LanguageModel`s handed in (Hugging Face, llama.cpp, toy tables).

>>> from exactspec.checking.toy import random_tabular_model
>>> target = random_tabular_model(5, seed=1)
>>> fixed = Strategy(drafter="ngram", verifier="block", adaptive_gamma=False)
>>> parts = build_components(target, None, fixed, gamma=4)
>>> type(parts.drafter).__name__, parts.verifier.__name__, parts.gamma_policy
('NgramDrafter', 'verify_block', None)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import NamedTuple

from exactspec.decoding.engine import SpeculativeEngine
from exactspec.decoding.gamma import ConfidenceGamma, GammaPolicy, LookupGamma
from exactspec.decoding.planner import CostAwareGamma
from exactspec.decoding.round_times import RoundTimer
from exactspec.decoding.scheduler import Scheduler
from exactspec.decoding.strategy import VERIFIERS, CostSource, Strategy
from exactspec.drafters.base import Drafter
from exactspec.drafters.registry import DrafterParts
from exactspec.foundations.costs import BatchCosts, CostModel
from exactspec.foundations.defaults import DEFAULTS
from exactspec.foundations.metrics import Stopwatch
from exactspec.foundations.sampler import Sampler
from exactspec.models.base import LanguageModel
from exactspec.models.costs import measure_cost_model
from exactspec.models.timed import TimedModel
from exactspec.verifiers.base import Verifier

PolicyOptions = Mapping[str, float]
"""Keyword arguments of `AdaptiveGamma` (prior, probe, memory: `exactspec.decoding.gamma`) for an adaptive
strategy's policy; the defaults are what ships, the `verify` grid passes a weak prior so that a few
enumerated rounds already move gamma."""


class Components(NamedTuple):
    """What `SpeculativeEngine(target, drafter, verifier, gamma_policy)` takes."""

    drafter: Drafter | None
    verifier: Verifier
    gamma_policy: GammaPolicy | None


def build_components(
    target: LanguageModel,
    draft: LanguageModel | None,
    strategy: Strategy,
    gamma: int,
    costs: CostSource | None = None,
    *,
    policy_options: PolicyOptions | None = None,
    batch_costs: BatchCosts | None = None,
) -> Components:
    """The drafter, verifier and gamma policy for `strategy` at (maximum) draft length `gamma`.

    gamma = 0 is plain decoding: no drafter and no policy, whatever the strategy. Adaptive gamma
    needs c and v(1..gamma + 1): from `costs` if given (a `CostModel` or a function of max_gamma,
    such as `ModelPair.cost_model`), else measured here with `measure_cost_model` (a few seconds
    on a real pair; not cached). Prompt lookup's c is 0 whatever was measured for the draft model.
    `policy_options`: the adaptive policy's keyword arguments (default: what ships).
    `batch_costs`: with adaptive gamma, the measured pass costs that seed the round times
    (`exactspec.decoding.round_times`): a model drafter's rounds are then planned for the whole batch
    (`exactspec.decoding.planner.CostAwareGamma`) instead of row by row with the draft's confidence stop
    (`ConfidenceGamma`); a free drafter's rounds too (without draft steps), each row's depth within its
    planned cap then chosen by its match length (`LookupGamma`, from whole rounds' measured times).

    Raises ValueError when the strategy needs a draft model and `draft` is None.
    """
    verifier = VERIFIERS[strategy.verifier]
    if gamma == 0:
        return Components(None, verifier, None)
    kind = strategy.kind
    if kind.needs_draft_model and draft is None:
        raise ValueError(
            f"drafter {strategy.drafter!r} needs a draft model; load one, use a drafter that needs none "
            "(e.g. 'ngram', prompt lookup) or gamma 0"
        )
    options = dict(policy_options or {})
    policy: GammaPolicy | None = None
    lengths = stop = None
    if strategy.adaptive_gamma and kind.free and batch_costs is not None:
        # The batch's caps planned from whole rounds' costs (no draft steps: the drafter runs no model),
        # each row's depth within its cap by its match length (decoding.planner, decoding.gamma.LookupGamma).
        free_costs = dataclasses.replace(batch_costs, draft=None)
        max_order = kind.max_match_order(strategy.options)
        policy = lengths = CostAwareGamma(free_costs, match_orders=max_order, **options)
    elif strategy.adaptive_gamma and kind.free:
        # A free draft's length is chosen per match length, once the round's match is found.
        lookup_costs = _cost_model(target, draft, strategy, gamma, costs)
        max_order = kind.max_match_order(strategy.options)
        policy = lengths = LookupGamma(lookup_costs, max_order, **options)
    elif strategy.adaptive_gamma and batch_costs is not None:
        # A model drafter's rounds with draft steps; a hybrid's lookup rows (`drafters.hybrid`) without,
        # each lookup chain's depth by its match length as for a free drafter.
        max_order = kind.max_match_order(strategy.options)
        policy = CostAwareGamma(batch_costs, match_orders=max_order, **options)
        lengths = policy if max_order else None
    elif strategy.adaptive_gamma:
        # The cap per row from AdaptiveGamma, and within it the draft stops where it grows unsure.
        policy = stop = ConfidenceGamma(_cost_model(target, draft, strategy, gamma, costs), **options)
    # Block verification gains only over drafts drawn from a q it is told; the token verifier keeps a
    # coupled draft where the target's positioned draw agrees (docs/algorithm.md 5).
    coupled = strategy.keeps_plain_tokens
    parts = DrafterParts(target, draft, strategy.options, lengths=lengths, stop=stop, coupled=coupled)
    return Components(kind.build(parts), verifier, policy)


def build_engine(
    target: LanguageModel,
    draft: LanguageModel | None,
    strategy: Strategy,
    gamma: int,
    costs: CostSource | None = None,
    *,
    validate: bool = True,
    policy_options: PolicyOptions | None = None,
    batch_costs: BatchCosts | None = None,
    round_timer: RoundTimer | None = None,
) -> SpeculativeEngine:
    """A `SpeculativeEngine` over `build_components` (same arguments).

    The draft model's forwards are timed (`exactspec.models.timed.TimedModel`) into the engine's
    metrics. `validate`: the verifier checks its inputs every round (tests and `verify`); the
    production entry points pass False (the checks change no token). `round_timer`: the engine's
    (a deterministic clock for `exactspec verify`).
    """
    stopwatch = None
    if draft is not None and gamma > 0 and strategy.needs_draft_model:
        stopwatch = Stopwatch(draft.device)
        draft = TimedModel(draft, stopwatch)
    drafter, verifier, policy = build_components(
        target, draft, strategy, gamma, costs, policy_options=policy_options, batch_costs=batch_costs
    )
    if stopwatch is not None:
        stopwatch.take()  # a cost measurement above ran the draft; that is not decoding time
    return SpeculativeEngine(
        target,
        drafter,
        verifier,
        policy,
        validate=validate,
        draft_stopwatch=stopwatch,
        round_timer=round_timer,
    )


def build_scheduler(
    target: LanguageModel,
    draft: LanguageModel | None,
    strategy: Strategy,
    gamma: int,
    costs: CostSource | None = None,
    *,
    max_gamma: int | None = None,
    max_batch: int = DEFAULTS.max_batch,
    max_waiting: int = DEFAULTS.max_waiting,
    sampler: Sampler | None = None,
    validate: bool = True,
    policy_options: PolicyOptions | None = None,
    batch_costs: BatchCosts | None = None,
    prefill_chunk: int | None = None,
    raise_round_errors: bool = False,
) -> Scheduler:
    """A `Scheduler` over `build_engine`: rows draft `gamma` tokens unless their request asks otherwise.

    `max_gamma` (default `gamma`) is the longest draft a request may ask for: the engine's parts
    are built for it (an adaptive policy's costs are measured up to it). `batch_costs`: adaptive
    rounds planned for the whole batch (`build_components`). `prefill_chunk`: joining rows'
    prompts are prefilled at most this many tokens per round (`Scheduler`). The other arguments are
    the scheduler's (`raise_round_errors`: a failed round raises out of `step`, for direct callers) and
    the engine's.
    """
    cap = gamma if max_gamma is None else max_gamma
    if cap < gamma:
        raise ValueError(f"max_gamma {cap} is below the default gamma {gamma}")
    engine = build_engine(
        target,
        draft,
        strategy,
        cap,
        costs,
        validate=validate,
        policy_options=policy_options,
        batch_costs=batch_costs,
    )
    return Scheduler(
        engine,
        gamma=gamma,
        max_batch=max_batch,
        max_waiting=max_waiting,
        sampler=sampler,
        prefill_chunk=prefill_chunk,
        raise_round_errors=raise_round_errors,
    )


def _cost_model(
    target: LanguageModel,
    draft: LanguageModel | None,
    strategy: Strategy,
    gamma: int,
    costs: CostSource | None,
) -> CostModel:
    if costs is None:
        model = measure_cost_model(target, draft if strategy.needs_draft_model else None, gamma)
    elif isinstance(costs, CostModel):
        model = costs.up_to(gamma)
    else:
        model = costs(gamma)
    # Hybrid rows that find a lookup draft pay no model step; c of the draft model is the
    # conservative choice for the rows that do not.
    return model.without_draft_model() if strategy.kind.free else model
