"""Single timed runs of the benchmark: one generation through our engine, through transformers' `generate`,
through llama-cpp-python's `Llama.generate` (plain, or with prompt lookup decoding), or through
onnxruntime-genai's `Generator` (plain, or with n-gram decoding).

Every run starts from empty KV caches, uses the given seed, and by default
makes exactly `max_new_tokens` tokens: EOS stops no side (our engine sees no
EOS ids, transformers, llama.cpp and onnxruntime-genai get none), so all sides time the same amount of
work.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from exactspec.api.session import Choice, Session, SessionConfig, TextRequest
from exactspec.bench.records import (
    AssistedRounds,
    ExpectedAccepted,
    Measurement,
    PolicyCosts,
    RunMetrics,
)
from exactspec.bench.timing import ForwardTimer, RoundStreamer, engine_module, steady_state
from exactspec.decoding.records import RowEvent
from exactspec.decoding.strategy import Strategy
from exactspec.drafters.base import Drafter
from exactspec.foundations.costs import BatchCosts
from exactspec.foundations.records import field_values
from exactspec.foundations.settings import SamplingSettings
from exactspec.models.base import LanguageModel, ModelWrapper
from exactspec.models.pair import ModelPair
from exactspec.peers import hf as hf_peer
from exactspec.peers import llamacpp as llamacpp_peer
from exactspec.peers import ortgenai as ortgenai_peer
from exactspec.verifiers.base import Verifier, VerifyResult
from exactspec.verifiers.expected import block_weight_sum, expected_accepted, expected_accepted_tree
from exactspec.verifiers.tree import TreeVerifyResult


class NoEos(ModelWrapper):
    """A `LanguageModel` that is `model` with no EOS ids, so generation always runs to max_new_tokens."""

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return frozenset()


class PassLog:
    """Every model call of one generation through our engine, by round (`LoggedModel` writes it).

    `rounds`: per round, (draft model steps, tokens scored by each target call), closed by `end_round`
    when the engine reports the round (a tree scored path by path is several target calls);
    `target_calls`, `draft_calls`: (positions scored, seconds) of every call, in order.
    """

    def __init__(self) -> None:
        self.rounds: list[tuple[int, ...]] = []
        self.target_calls: list[tuple[int, float]] = []
        self.draft_calls: list[tuple[int, float]] = []
        self._draft_steps = 0
        self._target_widths: list[int] = []

    def record(self, role: str, positions: int, seconds: float) -> None:
        if role == "target":
            self.target_calls.append((positions, seconds))
            self._target_widths.append(positions)
        else:
            self.draft_calls.append((positions, seconds))
            self._draft_steps += 1

    def end_round(self) -> None:
        self.rounds.append((self._draft_steps, *self._target_widths))
        self._draft_steps, self._target_widths = 0, []


class LoggedModel(ModelWrapper):
    """`model` with each `logits` call noted in a `PassLog` as `role` ("target" or "draft"), and timed."""

    def __init__(self, model: LanguageModel, log: PassLog, role: str) -> None:
        super().__init__(model)
        self.log = log
        self.role = role

    def logits(
        self,
        histories: Sequence[Sequence[int]],
        num_positions: int = 1,
        rows: Sequence[int] | None = None,
    ) -> torch.Tensor:
        started = time.perf_counter()
        out = self.model.logits(histories, num_positions, rows)  # [B, k, V]
        self.log.record(self.role, num_positions, time.perf_counter() - started)
        return out


class ExpectationRecorder:
    """A verifier that runs `verifier` and adds up each rule's expected kept draft tokens on the same rounds.

    Two runs with different verifiers sample different paths, so their tokens per
    round differ by chance as well as by rule; scoring both rules on one run's own
    rounds (`exactspec.verifiers.expected`) compares them on identical drafts and
    targets. `block_weights` adds up block verification's weights, whose mean over
    drafts is its expected kept tokens too (`verifiers.expected.block_weight_sum`).
    `seconds` is the time spent scoring, which `run_engine` takes out of the run's
    timings so that the timed work is the verifier's alone.
    """

    def __init__(
        self,
        verifier: Verifier,
        tree_verifier: Callable[..., TreeVerifyResult],
        greedy_verifier: Callable[..., VerifyResult] | None = None,
        vocab_size: int = 0,
    ) -> None:
        """greedy_verifier, vocab_size: the engine's greedy rounds' verifier (`verify_greedy`), and the
        vocabulary its rounds' one-hot p is rebuilt over for the scoring."""
        self.verifier = verifier
        self.tree_verifier = tree_verifier
        self.greedy_verifier = greedy_verifier
        self.vocab_size = vocab_size
        # E[kept | drafts] per rule, and block verification's weights summed (its estimate over drafts);
        # for trees, E[accepted | tree] walking the whole tree and its first branch alone.
        self.expected = {"token": 0.0, "block": 0.0, "block_weights": 0.0, "tree": 0.0, "first_branch": 0.0}
        self.rounds = 0
        self.tree_rounds = 0
        self.seconds = 0.0
        self._seconds_timed = 0.0  # `seconds` when the engine's last round was timed

    def round_timer(self, shape: Any, seconds: float) -> float:
        """The engine's `round_timer`: a round's wall time less its scoring here, so that a planner learns the
        method's round times (the scoring comes off every clock of the run)."""
        scored, self._seconds_timed = self.seconds - self._seconds_timed, self.seconds
        return seconds - scored

    def __call__(
        self,
        draft_tokens: torch.Tensor,
        q: torch.Tensor | None,
        p: torch.Tensor,
        draft_lengths: torch.Tensor,
        eos_token_ids: Any,
        sampler: Any,
        rows: Sequence[int] | None = None,
        *,
        validate: bool = True,
        positions: Sequence[int] | None = None,
    ) -> VerifyResult:
        started = time.perf_counter()
        self._score(draft_tokens, q, p, draft_lengths, eos_token_ids)
        self.seconds += time.perf_counter() - started
        options = {"validate": validate, "positions": positions}
        return self.verifier(draft_tokens, q, p, draft_lengths, eos_token_ids, sampler, rows, **options)

    def verify_greedy(
        self,
        draft_tokens: torch.Tensor,
        target_ids: torch.Tensor,
        draft_lengths: torch.Tensor,
        eos_token_ids: Any,
    ) -> VerifyResult:
        """The engine's greedy rounds (no p built, `verifiers.token.verify_greedy`): scored as `__call__`
        scores a round, on the one-hot p they stand for (built here, on the scoring's clock), then
        verified by the engine's own greedy verifier."""
        assert self.greedy_verifier is not None
        started = time.perf_counter()
        batch, width = target_ids.shape
        p = torch.zeros(batch, width, self.vocab_size, device=target_ids.device)  # [B, gamma + 1, V]
        p.scatter_(2, target_ids.unsqueeze(-1), 1.0)
        self._score(draft_tokens, None, p, draft_lengths, eos_token_ids)
        self.seconds += time.perf_counter() - started
        return self.greedy_verifier(draft_tokens, target_ids, draft_lengths, eos_token_ids)

    def _score(
        self,
        draft_tokens: torch.Tensor,
        q: torch.Tensor | None,
        p: torch.Tensor,
        draft_lengths: torch.Tensor,
        eos_token_ids: Any,
    ) -> None:
        """Add one round's E[kept | drafts] under each rule, block verification's weights and its
        row-rounds (one per row verified)."""
        for rule in ("token", "block"):
            self.expected[rule] += float(
                expected_accepted(draft_tokens, q, p, draft_lengths, eos_token_ids, rule).sum()
            )
        self.expected["block_weights"] += float(
            block_weight_sum(draft_tokens, q, p, draft_lengths, eos_token_ids).sum()
        )
        self.rounds += draft_tokens.shape[0]

    def verify_tree(
        self,
        tokens: torch.Tensor,
        parents: torch.Tensor,
        p: torch.Tensor,
        lengths: torch.Tensor,
        eos_token_ids: Any,
        *args: Any,
        **options: Any,
    ) -> TreeVerifyResult:
        """The engine's tree walk, with the tree and its first branch scored on the same p first."""
        started = time.perf_counter()
        eos = eos_token_ids
        for key, first_branch in (("tree", False), ("first_branch", True)):
            scored = expected_accepted_tree(tokens, parents, p, lengths, eos, first_branch=first_branch)
            self.expected[key] += float(scored.sum())
        self.tree_rounds += tokens.shape[0]
        self.seconds += time.perf_counter() - started
        return self.tree_verifier(tokens, parents, p, lengths, eos_token_ids, *args, **options)

    def record(self) -> ExpectedAccepted:
        """The sums so far, as bench.json keeps them."""
        return ExpectedAccepted(
            token=self.expected["token"],
            block=self.expected["block"],
            rounds=self.rounds,
            block_weights=self.expected["block_weights"],
            tree=self.expected["tree"],
            tree_first_branch=self.expected["first_branch"],
            tree_rounds=self.tree_rounds,
        )


class LearnedDrafters:
    """One drafter per method, gamma and sampling settings for drafters that learn from finished requests.

    The suffix drafter's global tree holds earlier requests' outputs, as it does in a server or a
    batch job where one drafter serves every request; a bench run gives each method's runs one such
    drafter, in prompt order, so that a repetitive workload (`exactspec.bench.workloads`) is measured
    as it is served. Drafters without that memory are built fresh for every run, as before.
    """

    def __init__(self) -> None:
        self._drafters: dict[tuple[str, int, SamplingSettings], Drafter] = {}

    def use(self, engine: Any, strategy: Strategy, gamma: int, settings: SamplingSettings) -> None:
        """Give `engine` the drafter its method used before, or keep its new one for the next runs."""
        if engine.drafter is None or not getattr(engine.drafter, "learns_across_requests", False):
            return
        fresh = engine.drafter
        kept = self._drafters.setdefault((strategy.name, gamma, settings), fresh)
        if kept is not fresh and hasattr(fresh, "lengths"):
            # Under adaptive gamma the drafter asks the engine's own gamma policy for its depths; this
            # engine's rows are added to the new policy, not to the one the kept drafter was built with.
            kept.lengths = fresh.lengths
        engine.drafter = kept


def run_engine(
    pair: ModelPair,
    ids: Sequence[int],
    gamma: int,
    settings: SamplingSettings,
    max_new_tokens: int,
    seed: int,
    ignore_eos: bool,
    strategy: Strategy | None = None,
    learned: LearnedDrafters | None = None,
) -> Measurement:
    """One generation through our engine (gamma = 0 is plain decoding), from empty caches.

    It runs as `exactspec generate` runs it: one request in a `Session` over the pair (the one place that
    wires a strategy to its engine: adaptive gamma plans each round from the pair's measured pass costs
    and round times, measured once per pair and machine before the timed part of the first such run), the
    seed the request's, no per-round input checks in the verifier. The session's rounds run through
    `LoggedModel` wrappers (every pass noted), without EOS when `ignore_eos`. `learned`: the drafters that
    carry what they learned from one run to the next (`LearnedDrafters`).
    """
    strategy = strategy or Strategy()
    log = PassLog()
    target: LanguageModel = LoggedModel(NoEos(pair.target) if ignore_eos else pair.target, log, "target")
    draft: LanguageModel | None = None
    if pair.draft is not None:
        draft = LoggedModel(NoEos(pair.draft) if ignore_eos else pair.draft, log, "draft")
    # One request joins an idle session at once: no waiting queue, no prefill chunks (as `generate`).
    config = SessionConfig(strategy, gamma, max_batch=1, max_waiting=0, prefill_chunk=None)
    session = Session(pair, config, raise_round_errors=True, models=(target, draft))
    engine = session.scheduler.engine
    if learned is not None:
        learned.use(engine, strategy, gamma, settings)
    recorder = ExpectationRecorder(
        engine.verifier, engine.tree_verifier, engine.greedy_verifier, pair.target.vocab_size
    )
    engine.verifier = recorder
    engine.tree_verifier = recorder.verify_tree
    if engine.greedy_verifier is not None:
        engine.greedy_verifier = recorder.verify_greedy
    engine.round_timer = recorder.round_timer
    pair.clear_caches()
    request = TextRequest(list(ids), settings=settings, max_tokens=max_new_tokens, seed=seed)
    events: list[tuple[float, int]] = []
    tokens: list[int] = []
    finish_reason = None

    def on_event(choice: Choice, event: RowEvent) -> None:
        nonlocal finish_reason
        # The recorder's scoring is not the method's work: its time comes off every clock.
        events.append((time.perf_counter() - recorder.seconds, len(event.tokens)))
        log.end_round()
        tokens.extend(event.tokens)
        finish_reason = event.finish_reason or finish_reason

    with (
        ForwardTimer(engine_module(pair, pair.target)) as target_timer,
        ForwardTimer(engine_module(pair, pair.draft)) as draft_timer,
    ):
        started = time.perf_counter()
        session.submit(request, on_event)
        session.run_until_idle()
        wall = time.perf_counter() - started - recorder.seconds
    metrics = session.metrics
    metrics.verify_seconds -= recorder.seconds
    metrics.total_seconds -= recorder.seconds
    costs = getattr(engine.gamma_policy, "costs", None)  # what adaptive gamma optimised with
    if isinstance(costs, BatchCosts):  # a planned round: one row's c and v(k) of the costs it plans from
        costs = costs.single_row()
    # Forward hooks where the backend runs transformers modules; else each adapter call is the pass.
    hooked = engine_module(pair, pair.target) is not None
    target_forwards = tuple(target_timer.calls) if hooked else tuple(log.target_calls)
    draft_forwards = tuple(draft_timer.calls) if hooked else tuple(log.draft_calls)
    record = Measurement(
        **field_values(steady_state(events, started)),
        wall_seconds=wall,
        tokens=tuple(tokens),
        finish_reason=finish_reason,
        metrics=RunMetrics.of(metrics),
        target_forwards=target_forwards,
        draft_forwards=draft_forwards,
        model_seconds=sum(s for _, s in target_forwards + draft_forwards),
        round_passes=tuple(log.rounds),
        # E[kept draft tokens] summed over this run's rounds under each rule, on identical inputs.
        expected_accepted=recorder.record(),
        gamma_policy_costs=None
        if costs is None
        else PolicyCosts(costs.draft_cost, tuple(costs.verify_costs)),
    )
    pair.clear_caches()
    return record


def run_hf(
    pair: ModelPair,
    ids: Sequence[int],
    assisted: bool,
    settings: SamplingSettings,
    max_new_tokens: int,
    seed: int,
    ignore_eos: bool,
) -> Measurement:
    """One `target_model.generate` call (assisted by the draft or plain), timed like `run_engine`."""
    model = pair.target_model
    input_ids = torch.tensor([list(ids)], device=model.device)  # [1, L]
    # Exactly our settings (transformers' global defaults, top_k=50 among them, are kept out).
    streamer = RoundStreamer()
    with ForwardTimer(model) as target_timer, ForwardTimer(pair.draft_model) as draft_timer:
        started = time.perf_counter()
        output = hf_peer.generate(
            model,
            input_ids,
            settings,
            max_new_tokens,
            eos_token_ids=None if ignore_eos else pair.eos_token_ids,
            seed=seed,
            draft_model=pair.draft_model if assisted else None,
            tokenizer=pair.tokenizer,
            streamer=streamer,
        )  # [1, L + generated]
        wall = time.perf_counter() - started
    events = streamer.events[1:]  # the first put is the prompt
    tokens = output[0, len(ids) :].tolist()
    steady = steady_state(events, started)
    hf = None
    if assisted:
        # Round r's target forward scores its candidates plus one: width - 1 candidates (the
        # first forward also holds the prompt). Accepted = emitted - 1 per round.
        widths = [w for w, _ in target_timer.calls]
        candidates = [widths[0] - len(ids)] + [w - 1 for w in widths[1:]] if widths else []
        accepted = [max(0, n - 1) for n in steady.round_tokens]
        universal = hf_peer.uses_universal_assistant(model, pair.draft_model)
        hf = AssistedRounds(
            generator="universal (different vocabulary sizes)" if universal else "AssistedCandidateGenerator",
            candidate_lengths=tuple(candidates),
            accepted_per_round=tuple(accepted),
            proposed_tokens=sum(candidates),
            accepted_tokens=sum(accepted),
        )
    return Measurement(
        **field_values(steady),
        wall_seconds=wall,
        tokens=tuple(tokens),
        finish_reason="length" if len(tokens) >= max_new_tokens else "eos",
        target_forwards=tuple(target_timer.calls),
        draft_forwards=tuple(draft_timer.calls),
        model_seconds=target_timer.seconds + draft_timer.seconds,
        hf=hf,
    )


def run_llamacpp(
    llm: Any,
    pair: ModelPair,
    ids: Sequence[int],
    settings: SamplingSettings,
    max_new_tokens: int,
    seed: int,
    ignore_eos: bool,
) -> Measurement:
    """One llama-cpp-python generation (`exactspec.peers.llamacpp`: plain, or prompt lookup decoding when
    `llm` was loaded with it), timed like `run_engine`.

    Its rounds: the prompt's pass emits the first token; then plain decoding passes one token per
    token, and prompt lookup the pending token and each proposal in one pass (`round_passes`).
    """
    started = time.perf_counter()
    out = llamacpp_peer.generate(
        llm,
        ids,
        settings,
        max_new_tokens,
        seed=seed,
        eos_token_ids=() if ignore_eos else pair.eos_token_ids,
    )
    wall = time.perf_counter() - started
    generator = None
    if out["rounds"] is not None:
        recorder = llm.draft_model
        generator = (
            f"LlamaPromptLookupDecoding(max_ngram_size={recorder.lookup.max_ngram_size}, "
            f"num_pred_tokens={recorder.num_pred_tokens})"
        )
    # all of llama.cpp's time is inside llama.cpp
    passes, lookup = _peer_rounds(out, len(ids), generator)
    return Measurement(**_peer_fields(out, started, wall, passes), llamacpp=lookup)


def _peer_rounds(
    out: dict, prompt_tokens: int, generator: str | None
) -> tuple[tuple[tuple[int, int], ...], AssistedRounds | None]:
    """A peer's passes (the prompt's, then one per token for plain decoding or one per round: its pending
    token and proposal) and, for its speculative decoding, its rounds under `generator`'s name."""
    rounds = out["rounds"]
    if rounds is None:
        return tuple([(0, prompt_tokens)] + [(0, 1)] * (len(out["tokens"]) - 1)), None
    passes = tuple([(0, prompt_tokens)] + [(0, 1 + proposed) for proposed, _ in rounds])
    return passes, AssistedRounds(
        generator=generator or "",
        candidate_lengths=tuple(proposed for proposed, _ in rounds),
        accepted_per_round=tuple(kept for _, kept in rounds),
        proposed_tokens=sum(proposed for proposed, _ in rounds),
        accepted_tokens=sum(kept for _, kept in rounds),
    )


def _peer_fields(out: dict, started: float, wall: float, passes: tuple) -> dict[str, Any]:
    """A peer generation's Measurement fields: all of its time is inside the peer (model_seconds = wall)."""
    return dict(
        **field_values(steady_state(out["events"], started)),
        wall_seconds=wall,
        tokens=tuple(out["tokens"]),
        finish_reason=out["finish_reason"],
        target_forwards=(),
        draft_forwards=(),
        model_seconds=wall,
        round_passes=passes,
    )


def run_ortgenai(
    model: ortgenai_peer.OrtGenaiModel,
    pair: ModelPair,
    ids: Sequence[int],
    settings: SamplingSettings,
    max_new_tokens: int,
    seed: int,
    ignore_eos: bool,
    ngram_tokens: int | None = None,
) -> Measurement:
    """One onnxruntime-genai generation (`exactspec.peers.ortgenai`: plain, or n-gram decoding with
    max_draft_tokens=`ngram_tokens`), timed like `run_llamacpp`.

    Its rounds, as llama.cpp's: the prompt's pass, then one token per pass for plain decoding, and for
    n-gram decoding each round's pending token and proposal in one pass (a lookup miss: one token); the
    generator's re-anchoring passes (`SpeculativeDecodingStrategy`) are inside its wall time, not listed.
    """
    started = time.perf_counter()
    out = ortgenai_peer.generate(
        model,
        ids,
        settings,
        max_new_tokens,
        seed=seed,
        eos_token_ids=() if ignore_eos else pair.eos_token_ids,
        ngram_tokens=ngram_tokens,
    )
    wall = time.perf_counter() - started
    generator = (
        f"onnxruntime-genai NGramDecodingStrategy(ngram_size={ortgenai_peer.NGRAM_SIZE}, "
        f"max_draft_tokens={ngram_tokens})"
    )
    passes, ngram = _peer_rounds(out, len(ids), generator)
    return Measurement(**_peer_fields(out, started, wall, passes), ortgenai=ngram)
