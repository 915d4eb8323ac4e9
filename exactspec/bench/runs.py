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
from collections.abc import Sequence
from typing import Any

import torch

from exactspec.api.session import Choice, Session, SessionConfig, TextRequest
from exactspec.bench.recording import ExpectationRecorder, LoggedModel, NoEos, PassLog
from exactspec.bench.records import (
    AssistedRounds,
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
from exactspec.models.base import LanguageModel
from exactspec.models.pair import ModelPair
from exactspec.peers import hf as hf_peer
from exactspec.peers import llamacpp as llamacpp_peer
from exactspec.peers import ortgenai as ortgenai_peer


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
    session = _logged_session(pair, strategy, gamma, ignore_eos, log)
    engine = session.scheduler.engine
    if learned is not None:
        learned.use(engine, strategy, gamma, settings)
    recorder = ExpectationRecorder.installed(engine)
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


def _logged_session(
    pair: ModelPair, strategy: Strategy, gamma: int, ignore_eos: bool, log: PassLog
) -> Session:
    """A session over the pair's models wrapped to note every call in `log` (without EOS ids when
    `ignore_eos`), for one request that joins it at once: no waiting queue, no prefill chunks (as
    `generate` runs it)."""
    target: LanguageModel = LoggedModel(NoEos(pair.target) if ignore_eos else pair.target, log, "target")
    draft: LanguageModel | None = None
    if pair.draft is not None:
        draft = LoggedModel(NoEos(pair.draft) if ignore_eos else pair.draft, log, "draft")
    config = SessionConfig(strategy, gamma, max_batch=1, max_waiting=0, prefill_chunk=None)
    return Session(pair, config, raise_round_errors=True, models=(target, draft))


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
