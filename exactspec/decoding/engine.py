"""The decoding engine: rounds of draft, target, verify (docs/algorithm.md section 2) over a batch.

Each row has its own history, its own random stream and its own stop state;
finished rows leave the batch and stop costing compute. gamma = 0 is plain
autoregressive decoding through the very same round (no draft, the "bonus"
token is the ordinary next token), so the baseline and the speculative path
cannot drift apart.

`SpeculativeEngine.round` is one round. Rows join and leave between rounds through the
row lifecycle (`add_rows`, `release_rows`: the target, the drafter and the gamma policy
each set up or free the row's state); the batch driver that decides when is
`exactspec.decoding.scheduler.Scheduler`, and `generate` / `stream` below are thin uses
of it. Engines are built from a strategy in one place, `exactspec.decoding.builder`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace

import torch

from exactspec.decoding.emitting import append_emitted, max_new_tokens
from exactspec.decoding.gamma import GammaPolicy, LookupChooser, RoundRow, record_round
from exactspec.decoding.logprobs import round_logprobs
from exactspec.decoding.records import (
    MAX_GAMMA,
    DecodeConfig,
    FinishReason,
    Request,
    RoundOutput,
    RowEvent,
    RowState,
    RowStates,
    StopCondition,
    prompt_ends,
)
from exactspec.decoding.round_times import RoundShape, RoundTimer
from exactspec.decoding.scheduler import Scheduler
from exactspec.decoding.target_pass import chain_probabilities, tree_probabilities
from exactspec.drafters.base import NO_CHAIN, Drafter, LookupProbe, Proposal
from exactspec.drafters.forced import draft_limits, drafter_own_counts, drafter_steps, propose_after_forced
from exactspec.foundations.metrics import DecodeMetrics, Stopwatch
from exactspec.foundations.rows import RowLifecycle, RowStart
from exactspec.foundations.sampler import Sampler
from exactspec.foundations.settings import SamplingSettings
from exactspec.models.base import LanguageModel, prefill, reusable_prefix
from exactspec.verifiers.base import Verifier, VerifyResult
from exactspec.verifiers.token import verify, verify_greedy
from exactspec.verifiers.tree import TreeVerifyResult, verify_tree

__all__ = [
    "MAX_GAMMA",
    "DecodeConfig",
    "FinishReason",
    "RoundOutput",
    "RowState",
    "SpeculativeEngine",
    "StopCondition",
]


class SpeculativeEngine:
    """Runs speculative (or, with gamma = 0, plain) decoding for a batch of prompts.

    >>> from exactspec.checking.toy import random_tabular_model
    >>> from exactspec.drafters import ModelDrafter
    >>> from exactspec.foundations.sampler import SeededSampler
    >>> target, draft = random_tabular_model(5, seed=1), random_tabular_model(5, seed=2)
    >>> engine = SpeculativeEngine(target, ModelDrafter(draft, target.vocab_size))
    >>> rows = engine.generate([[1, 2]], DecodeConfig(gamma=3, max_new_tokens=4), SeededSampler(0))
    >>> len(rows[0].generated) <= 4
    True
    """

    def __init__(
        self,
        target: LanguageModel,
        drafter: Drafter | None = None,
        verifier: Verifier = verify,
        gamma_policy: GammaPolicy | None = None,
        *,
        validate: bool = True,
        draft_stopwatch: Stopwatch | None = None,
        round_timer: RoundTimer | None = None,
    ) -> None:
        """Args:
        verifier: token verification (`exactspec.verifiers.token.verify`, the default) or block
            verification (`exactspec.verifiers.block.verify_block`); both are exact.
        gamma_policy: if given (`exactspec.decoding.gamma.AdaptiveGamma`), row b drafts
            min(policy's choice, its gamma, room left before max_new_tokens) tokens each round.
        validate: the verifier checks its inputs every round (shapes, ids, finite normalised p
            and q: passes over [B, gamma + 1, V] and host syncs). The engine builds p and q itself
            from logits that the transforms check, so serving entry points turn it off
            (`exactspec.decoding.builder.build_engine` with validate=False); tests and `exactspec verify`
            keep it on. Off changes no token.
        draft_stopwatch: adds up the draft model's forward time (`exactspec.models.timed.TimedModel`
            around the drafter's model shares it); the engine reads it after each draft step into
            `metrics.draft_forward_seconds`. None: that time is not split out.
        round_timer: the seconds a round of a shape is taken to have lasted, given its measured wall time
            (what a planning gamma policy learns from, `decoding.round_times`); default the wall time.
            `exactspec verify` passes a deterministic function of the shape: time, like chance, is an
            input, and the enumeration needs a decode that depends on the random choices alone.
        """
        self.target = target
        self.drafter = drafter
        self.verifier = verifier
        # Trees of candidates are walked by this function (`verifiers.tree.verify_tree`'s signature); a
        # slot like `verifier`, so that the bench can score the same trees another way as they pass.
        self.tree_verifier = verify_tree
        # Rounds whose rows are all greedy and whose draft is deterministic (or empty) need no p: every
        # draw from a one-hot row is its id, so token verification reduces to comparing ids
        # (`verifiers.token.verify_greedy`). A slot, like `tree_verifier`; None (block verification,
        # a verifier of the caller's) builds p for every round.
        self.greedy_verifier: Callable[..., VerifyResult] | None = (
            verify_greedy if verifier is verify else None
        )
        self.gamma_policy = gamma_policy
        self.validate = validate
        self.draft_stopwatch = draft_stopwatch
        self.round_timer = round_timer
        self.target_stopwatch = Stopwatch(target.device)
        self.metrics = DecodeMetrics()
        self._prefilled: set[int] = set()  # rows whose prompt `prefill` put in the target's cache

    # ------------------------------------------------------------------ rows

    def add_rows(self, rows: Sequence[RowStart]) -> None:
        """Rows join: the target, the drafter and the gamma policy set up their state (the sampler is
        the batch driver's to tell)."""
        for role in self._row_roles():
            role.add_rows(rows)

    def release_rows(self, rows: Sequence[int]) -> None:
        """Rows left (finished or cancelled): every role frees their state, the other rows are untouched."""
        rows = list(rows)
        if rows:
            for role in self._row_roles():
                role.release_rows(rows)
            self._prefilled.difference_update(rows)

    def prefill(self, row: int, tokens: Sequence[int]) -> None:
        """Put a joining row's first `tokens` (a prefix of its prompt) in the target's cache ahead of its
        first round; the logits of that pass are not needed (the round scores its own positions)."""
        if not tokens:
            return
        with self.target_stopwatch.timing():
            prefill(self.target, row, tokens)
        seconds = self.target_stopwatch.take()
        self.metrics.prefill_seconds += seconds
        self._prefilled.add(row)

    def reusable_prefix(self, row: int, tokens: Sequence[int]) -> int:
        """Leading `tokens` the target can give a joining row without computing them
        (`models.base.reusable_prefix`): the scheduler spends its prefill budget on the rest."""
        return reusable_prefix(self.target, row, tokens)

    def joining(self, rows: int) -> None:
        """`rows` rows are about to join the running batch (the scheduler's rows being prefilled or waiting,
        up to its free rows): the gamma policy hears it before the next round (`decoding.planner`)."""
        if self.gamma_policy is not None:
            self.gamma_policy.joining(rows)

    def _row_roles(self) -> list[RowLifecycle]:
        return [role for role in (self.target, self.drafter, self.gamma_policy) if role is not None]

    def new_row(
        self,
        prompt: Sequence[int],
        *,
        settings: SamplingSettings | None = None,
        gamma: int | None = None,
        max_new_tokens: int | None = None,
        index: int = 0,
    ) -> RowState:
        """A validated RowState for one prompt, with optional per-row settings (`RowState.checked`)."""
        return RowState.checked(
            prompt,
            self.target.vocab_size,
            drafts=self.drafter is not None,
            settings=settings,
            gamma=gamma,
            max_new_tokens=max_new_tokens,
            index=index,
        )

    # ------------------------------------------------------------------ whole generations

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        config: DecodeConfig,
        sampler: Sampler,
        stop: StopCondition | None = None,
    ) -> list[RowState]:
        """Generate for every prompt (row i has row id i); returns one RowState per prompt, in order."""
        scheduler, states = self._batch(prompts, config, sampler, stop)
        scheduler.run_until_idle()
        return states

    def stream(
        self,
        prompts: Sequence[Sequence[int]],
        config: DecodeConfig,
        sampler: Sampler,
        stop: StopCondition | None = None,
    ) -> Iterator[RowEvent]:
        """Like `generate`, yielding each row's `RowEvent` of every round as the round ends.

        Row i's events carry row id i; its last event has its `finish_reason`. The prompts are
        checked before the first round (a bad one raises at once, before anything is yielded).
        """
        events: list[RowEvent] = []
        scheduler, _ = self._batch(prompts, config, sampler, stop, on_event=events.append)
        return _drain(scheduler, events)

    def _batch(
        self,
        prompts: Sequence[Sequence[int]],
        config: DecodeConfig,
        sampler: Sampler,
        stop: StopCondition | None,
        on_event: Callable[[RowEvent], None] | None = None,
    ) -> tuple[Scheduler, list[RowState]]:
        """A scheduler with every prompt admitted at once (the batch never waits), and their states."""
        if config.gamma > 0 and self.drafter is None:
            raise ValueError("gamma > 0 needs a drafter; use gamma = 0 for plain decoding")
        if not prompts:
            raise ValueError("no prompts given")
        config.settings.check_vocab(self.target.vocab_size)
        scheduler = Scheduler(
            self,
            gamma=config.gamma,
            max_batch=len(prompts),
            max_waiting=0,
            sampler=sampler,
            raise_round_errors=True,  # a direct caller gets the exception, as from any function
        )
        # gamma None: each row drafts the scheduler's gamma (config.gamma), or what the gamma policy
        # chooses up to it; seed None: the sampler's own stream for the row id.
        request = Request((), config.settings, config.max_new_tokens, gamma=None, seed=None, stop=stop)
        handles = [scheduler.submit(replace(request, prompt=prompt), on_event=on_event) for prompt in prompts]
        return scheduler, [handle.state for handle in handles]

    # ------------------------------------------------------------------ one round

    def round(
        self,
        states: RowStates,
        active: list[int],
        config: DecodeConfig,
        sampler: Sampler,
        stop: StopCondition | None = None,
    ) -> RoundOutput:
        """One round for the active rows: docs/algorithm.md 2.1 to 2.5.

        Each row uses its own settings, gamma and length limit (`RowState`, falling back to
        `config`) and its own random stream (`sampler`, by row id).
        """
        started = time.perf_counter()
        # A row's first round feeds its whole prompt unless `prefill` did: a round time no shape predicts.
        feeds_prompt = any(
            not states[row].generated and len(states[row].prompt) > 1 and row not in self._prefilled
            for row in active
        )
        histories = [states[row].history for row in active]
        settings = [states[row].settings or config.settings for row in active]
        rooms = self._rooms(states, active, config)
        caps = self._draft_caps(states, active, config, rooms)
        planned = self._plan(states, active, caps, histories)
        # A drafter gets one SamplingSettings when every row shares it (drafters written for
        # one batch-wide setting keep working), else one per row.
        shared = all(row_settings == settings[0] for row_settings in settings)
        # Each row's output position of this round's first token: the positioned draws are keyed by it.
        positions = [len(states[row].generated) for row in active]
        proposal, forced = self._draft(
            histories, caps, rooms, planned, settings[0] if shared else settings, sampler, active, positions
        )  # 2.1
        # What each row may hold: its forced run (past its cap if the constraint forces more), then the
        # drafter's planned own within the cap.
        max_draft = draft_limits(caps, forced, planned)
        top = [states[row].logprobs for row in active]  # None: the row reports no log-probabilities
        if proposal.parents is None:
            result, reported = self._verify_chain(
                histories, proposal, settings, sampler, active, positions, top
            )  # 2.2-2.5
            drafted = proposal.lengths
        else:  # several candidates (docs/algorithm.md 5): one target pass over the tree, an exact walk
            result, reported = self._verify_tree(
                histories, proposal, max_draft, settings, sampler, active, positions, top
            )
            drafted = result.path_lengths
        proposed, accepted = self._record(drafted, result.num_accepted, forced, active)
        logprobs = round_logprobs(reported, result, active, top)
        output = append_emitted(states, active, result, config, stop, logprobs)
        self.metrics.emitted_tokens += sum(len(tokens) for tokens in output.new_tokens.values())
        if self.drafter is not None:
            self.drafter.observe(output.new_tokens)  # every row of the round, in order (RowObserver)
        output.proposed.update(zip(active, proposed, strict=True))
        output.accepted.update(zip(active, accepted, strict=True))
        elapsed = time.perf_counter() - started
        self.metrics.total_seconds += elapsed
        if self.gamma_policy is not None and not feeds_prompt:
            self._teach_round_time(proposal, drafter_steps(proposal, forced), len(active), elapsed)
        return output

    def _rooms(self, states: RowStates, active: list[int], config: DecodeConfig) -> list[int]:
        """Each active row's most draft tokens before its length limit (a round emits at most draft length
        + 1 tokens)."""
        return [max_new_tokens(states[row], config) - len(states[row].generated) - 1 for row in active]

    def _draft_caps(
        self, states: RowStates, active: list[int], config: DecodeConfig, rooms: list[int]
    ) -> list[int]:
        """Each active row's most draft tokens of the drafter's own this round: its gamma, within its room.
        Its constraint's forced tokens may fill the cap whatever the gamma policy plans (they cost no draft
        work), and a forced run longer than the cap goes whole, up to the room (`drafters.forced`); a row
        whose request names gamma 0 drafts none."""
        return [
            min(config.gamma if states[row].gamma is None else states[row].gamma, room)
            for row, room in zip(active, rooms, strict=True)
        ]

    def _plan(
        self, states: RowStates, active: list[int], max_draft: list[int], histories: list[list[int]]
    ) -> list[int]:
        """The drafter's own tokens each row may propose: the gamma policy's choice up to its cap. A drafter
        that looks up before it runs the draft model (`drafters.hybrid`) first says which rows have a free
        chain, so that the plan prices each row's draft by its source."""
        if self.gamma_policy is None:
            return max_draft
        policy, drafter = self.gamma_policy, self.drafter
        chooses = isinstance(drafter, LookupProbe) and isinstance(policy, LookupChooser)
        chains = drafter.probe(histories, max_draft, active) if chooses else [NO_CHAIN] * len(active)
        # docs/algorithm.md 5: draft lengths chosen before the round's draws keep the round exact.
        planned = policy.plan(
            [
                RoundRow(
                    row,
                    limit,
                    states[row].fixed_gamma,
                    len(states[row].prompt) + len(states[row].generated),
                    len(chain.tokens),
                    chain.order,
                )
                for row, limit, chain in zip(active, max_draft, chains, strict=True)
            ]
        )
        if chooses:
            drafter.settle(active, [policy.looks_up(row) for row in active])
        return planned

    def _teach_round_time(self, proposal: Proposal, steps: int, rows: int, elapsed: float) -> None:
        """What the round cost, by its shape (`steps`: the draft model's), teaches a gamma policy that plans
        from round times."""
        assert self.gamma_policy is not None
        width = proposal.tokens.shape[1] + 1
        shape = RoundShape(rows, width, steps)
        if self.round_timer is not None:
            elapsed = self.round_timer(shape, elapsed)
        predicted = self.gamma_policy.timed(shape, elapsed)
        if predicted is not None:
            self.metrics.record_round_time(predicted, elapsed)

    @property
    def device(self) -> torch.device:
        """Where the target's tensors (and so p and the verifier's work) live."""
        return self.target.device

    def _verify_chain(
        self,
        histories: list[list[int]],
        proposal: Proposal,
        settings: list[SamplingSettings],
        sampler: Sampler,
        rows: list[int],
        positions: list[int],
        top: list[int | None],
    ) -> tuple[VerifyResult, dict[int, torch.Tensor]]:
        """2.2 - 2.5 for a draft block: one target pass over each history plus its block, the verifier;
        with the log-probabilities of the rows whose `top` is not None (`target_pass`). `positions` are
        each row's generated tokens so far, so history length - position is where its prompt ends (what
        the presence and frequency penalties count from)."""
        prompt_lengths = prompt_ends(histories, positions)
        report = [wants is not None for wants in top]
        if (
            self.greedy_verifier is not None
            and (proposal.q is None or proposal.tokens.shape[1] == 0)
            and all(row_settings.greedy for row_settings in settings)
        ):
            ids, reported = chain_probabilities(
                self.target,
                histories,
                proposal,
                settings,
                rows,
                self.target_stopwatch,
                self.metrics,
                greedy=True,
                prompt_lengths=prompt_lengths,
                report=report,
            )  # 2.2: [A, gamma + 1], the id p is one-hot on at each position
            clock = time.perf_counter()
            result = self.greedy_verifier(proposal.tokens, ids, proposal.lengths, self.target.eos_token_ids)
            self.metrics.verify_seconds += time.perf_counter() - clock
            return result, reported
        p, reported = chain_probabilities(
            self.target,
            histories,
            proposal,
            settings,
            rows,
            self.target_stopwatch,
            self.metrics,
            prompt_lengths=prompt_lengths,
            report=report,
        )  # 2.2: [A, gamma + 1, V]
        clock = time.perf_counter()
        result = self.verifier(
            proposal.tokens,
            proposal.q,
            p,
            proposal.lengths,  # 2.3 - 2.5
            self.target.eos_token_ids,
            sampler,
            rows,
            validate=self.validate,
            positions=positions,
        )
        self.metrics.verify_seconds += time.perf_counter() - clock
        return result, reported

    def _verify_tree(
        self,
        histories: list[list[int]],
        proposal: Proposal,
        max_draft: list[int],
        settings: list[SamplingSettings],
        sampler: Sampler,
        rows: list[int],
        positions: list[int],
        top: list[int | None],
    ) -> tuple[TreeVerifyResult, dict[int, torch.Tensor]]:
        """A tree of deterministic candidates (docs/algorithm.md 5, "Several candidates"): p at the root and
        after every node from one target pass (`models.tree.tree_logits`), then `verify_tree`'s walk.

        The engine's verifier (token or block) is for chains; a tree is always walked by `verify_tree`.
        """
        prompt_lengths = prompt_ends(histories, positions)
        p, reported = tree_probabilities(
            self.target,
            histories,
            proposal,
            max_draft,
            settings,
            rows,
            self.target_stopwatch,
            self.metrics,
            prompt_lengths,
            [wants is not None for wants in top],
        )  # [A, N + 1, V]
        clock = time.perf_counter()
        result = self.tree_verifier(
            proposal.tokens,
            proposal.parents,
            p,
            proposal.lengths,
            self.target.eos_token_ids,
            sampler,
            rows,
            validate=self.validate,
            positions=positions,
        )
        self.metrics.verify_seconds += time.perf_counter() - clock
        return result, reported

    def _draft(
        self,
        histories: list[list[int]],
        caps: list[int],
        rooms: list[int],
        planned: list[int],
        settings: SamplingSettings | list[SamplingSettings],
        sampler: Sampler,
        rows: list[int],
        positions: list[int],
    ) -> tuple[Proposal, list[int]]:
        """The round's proposal and how many leading tokens of each row's draft its constraint forced: the
        forced run first, at q = 1, whole up to the row's room (jump-forward), then the drafter's proposal
        after it, up to its planned length and the cap (`drafters.forced`)."""
        if self.drafter is None or max(caps) <= 0:
            return Proposal.empty(len(rows), self.target.vocab_size, self.device), [0] * len(rows)
        clock = time.perf_counter()
        starts = prompt_ends(histories, positions)
        proposal, forced = propose_after_forced(
            self.drafter,
            histories,
            caps,
            settings,
            sampler,
            rows,
            starts,
            own_limits=planned,
            vocab_size=self.target.vocab_size,
            rooms=rooms,
        )
        self.metrics.draft_seconds += time.perf_counter() - clock
        if self.draft_stopwatch is not None:
            self.metrics.draft_forward_seconds += self.draft_stopwatch.take()
        proposal = proposal.to(self.device)  # a host-side drafter (prompt lookup) on a GPU run
        self.metrics.draft_calls += drafter_steps(proposal, forced)
        return proposal, forced

    def _record(
        self, drafted: torch.Tensor, num_accepted: torch.Tensor, forced: list[int], active: list[int]
    ) -> tuple[list[int], list[int]]:
        """Count the round and tell the gamma policy. drafted [A]: the draft length of each row (a tree's:
        the candidates its path could have kept); forced: how many of them the row's constraint forced."""
        proposed, accepted = drafted.tolist(), num_accepted.tolist()
        self.metrics.record_round(proposed, accepted, forced)
        if self.gamma_policy is not None:
            # The policy learns how the drafter's own tokens fare: forced tokens are the constraint's.
            drafted_own, accepted_own = drafter_own_counts(proposed, accepted, forced)
            record_round(self.gamma_policy, active, drafted_own, accepted_own)
        return proposed, accepted


def _drain(scheduler: Scheduler, events: list[RowEvent]) -> Iterator[RowEvent]:
    """Run the scheduler's rounds, yielding the events each one appended to `events`.

    A consumer that stops early (closes the iterator) cancels the rows left, which frees their caches.
    """
    try:
        while scheduler.step():
            yield from events
            events.clear()
        yield from events
    finally:
        scheduler.stop()
