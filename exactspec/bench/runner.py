"""Run the whole benchmark: plain decoding, speculative decoding for each gamma, and the peers.

A *method* is plain decoding, one of our engine's strategies (`exactspec.decoding.strategy`: the draft
model with token or block verification, prompt lookup, hybrid, adaptive gamma; named
"speculative", "speculative-block", "ngram", "hybrid", "adaptive", ...) at a gamma, or a peer:
transformers' assisted generation and plain `generate` (on a pair with transformers modules),
llama-cpp-python's plain decoding and its prompt lookup decoding (`LlamaPromptLookupDecoding`,
gamma = num_pred_tokens) over the target's GGUF file. Our engine runs on the pair's backend
(`ModelPair.backend`: any registered one). A *sampling row* is a named `SamplingSettings`: one per
temperature ("0", "0.7") plus named rows such as "realistic" (`NAMED_SETTINGS`).

For every prompt and sampling row the runs are interleaved (plain, each method,
HF assisted generation, HF plain `generate`) so that machine noise hits all of
them alike; with `BenchConfig.trials` > 1 the whole sequence repeats and each
method keeps its fastest trial (`_fastest_trial`). Each single run is in
`exactspec.bench.runs`, timed as described in `exactspec.bench.timing`. The
speedup model (`exactspec.bench.theory`) describes the steady state, so the
speedups are computed from it. The cost ratios c and v(k) (k = 1..9 at least) are measured
directly before the runs (`exactspec.bench.costs`): through our adapters, and of
llama-cpp-python's own passes where it runs (`peers.llamacpp.time_eval`), so that every
method's speed can be predicted from its own rounds and the costs of what ran them.

Everything is returned as one `BenchResult` (typed records, `exactspec.bench.records`; written
as `bench.json`); the summary and the report are computed from it alone (`exactspec.bench.summary`,
`.report`), so a bench.json read back renders the same report.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from exactspec.bench import theory
from exactspec.bench.costs import COST_KS, CostMeasurement, measure_costs
from exactspec.bench.records import (
    Environment,
    HfPolicy,
    Measurement,
    ModelRecord,
    Models,
    ModelSpecs,
    PromptRecord,
    Run,
)
from exactspec.bench.runs import LearnedDrafters, run_engine, run_hf, run_llamacpp
from exactspec.decoding.strategy import Strategy
from exactspec.foundations.provenance import Machine, Provenance
from exactspec.foundations.records import JsonRecord, field_values
from exactspec.foundations.settings import REALISTIC_CHAT_SETTINGS, SamplingSettings
from exactspec.models.backends.registry import backend
from exactspec.models.base import LanguageModel
from exactspec.models.pair import ModelPair
from exactspec.peers import hf as hf_peer
from exactspec.peers import llamacpp as llamacpp_peer

PLAIN, SPECULATIVE, HF_ASSISTED, HF_PLAIN = "plain", "speculative", "hf-assisted", "hf-plain"
SPECULATIVE_BLOCK, ADAPTIVE = "speculative-block", "adaptive"
LLAMACPP_PLAIN, LLAMACPP_LOOKUP = "llamacpp-plain", "llamacpp-lookup"
PEER_METHODS = (HF_ASSISTED, HF_PLAIN, LLAMACPP_PLAIN, LLAMACPP_LOOKUP)
LLAMACPP_METHODS = (LLAMACPP_PLAIN, LLAMACPP_LOOKUP)
"""Methods that run another system; every other method is plain decoding or one of our strategies, named
as `Strategy.name` names them (`decoding.strategy.all_strategies`, from the drafter registry)."""

NAMED_SETTINGS: dict[str, SamplingSettings] = {"realistic": REALISTIC_CHAT_SETTINGS}
"""Sampling rows that are more than a temperature, by the name `--settings` and the report use."""

DEFAULT_GAMMAS = (1, 2, 4, 6, 8)
DEFAULT_TEMPERATURES = (0.0, 0.7)
DEFAULT_MAX_NEW_TOKENS = 128
QUICK_GAMMAS = (2, 4)
QUICK_MAX_NEW_TOKENS = 32

SCHEMA_VERSION = 2
"""bench.json's format: 2 added the provenance and left the machine to it (1: results before it)."""
WARMUP_PROMPT_TOKENS = 16


def is_engine_method(method: str) -> bool:
    """Plain decoding or one of our engine's strategies (not a peer: transformers or llama.cpp)."""
    return method not in PEER_METHODS


def strategy_of(method: str) -> Strategy:
    """The engine strategy of a method name (plain decoding: the default, at gamma 0)."""
    return Strategy() if method == PLAIN else Strategy.from_name(method)


@dataclass(frozen=True)
class SamplingRow:
    """One row of the report: a name ("0", "0.7", "realistic") and the settings every method samples with."""

    name: str
    settings: SamplingSettings


@dataclass(frozen=True)
class BenchConfig(JsonRecord):
    """What to run. `cost_repeats` timed forwards per k measure c and v(k); `warmup_tokens` per method.

    `trials`: how many times each prompt and sampling row runs its whole method sequence (in turn:
    every method, then every method again); each method keeps its fastest trial (steady state). Every
    trial uses the same seed, so trials repeat one generation and differ only in timing: a run that
    the machine slowed down is outvoted instead of deciding a comparison.

    Methods: plain, then `method` (default "speculative") at each of `gammas`, then `extra_methods`
    ((name, gamma) pairs such as ("ngram", 8) or ("adaptive", 4)), then the HF peers, then
    llama-cpp-python's plain decoding (`llamacpp`) and its prompt lookup decoding at each
    num_pred_tokens of `llamacpp_lookup`. Sampling rows: one per temperature, then each of
    `named_settings` (keys of `NAMED_SETTINGS`).
    """

    gammas: tuple[int, ...] = DEFAULT_GAMMAS
    temperatures: tuple[float, ...] = DEFAULT_TEMPERATURES
    method: str = SPECULATIVE
    extra_methods: tuple[tuple[str, int], ...] = ()
    named_settings: tuple[str, ...] = ()
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    seed: int = 0
    hf_assisted: bool = True
    hf_plain: bool = True
    llamacpp: bool = False  # plain llama.cpp on the target's GGUF (run_bench gets the loaded model)
    llamacpp_lookup: tuple[int, ...] = ()  # LlamaPromptLookupDecoding's num_pred_tokens, one method each
    ignore_eos: bool = True
    cost_repeats: int = 5
    warmup_tokens: int = 4
    trials: int = 1

    def __post_init__(self) -> None:
        if not self.gammas or any(g < 1 for g in self.gammas):
            raise ValueError(f"gammas must be integers >= 1 (plain decoding always runs), got {self.gammas}")
        if any(t < 0 or math.isnan(t) for t in self.temperatures):
            raise ValueError(f"temperatures must be >= 0, got {self.temperatures}")
        if not self.temperatures and not self.named_settings:
            raise ValueError("give at least one temperature or named sampling setting")
        unknown = [name for name in self.named_settings if name not in NAMED_SETTINGS]
        if unknown:
            raise ValueError(f"unknown sampling settings {unknown}; known: {', '.join(NAMED_SETTINGS)}")
        for name, gamma in ((self.method, 1), *self.extra_methods):
            if not is_engine_method(name) or name == PLAIN:
                raise ValueError(f"{name!r} is not a speculative method of our engine")
            strategy_of(name)  # raises for unknown names
            if not gamma >= 1:
                raise ValueError(f"method {name} needs gamma >= 1, got {gamma}")
        if self.max_new_tokens < 2:
            raise ValueError(
                f"max_new_tokens must be >= 2 (one round is the prefill), got {self.max_new_tokens}"
            )
        if self.cost_repeats < 1:
            raise ValueError(f"cost_repeats must be >= 1, got {self.cost_repeats}")
        if self.trials < 1:
            raise ValueError(f"trials must be >= 1, got {self.trials}")
        if any(n < 1 for n in self.llamacpp_lookup):
            raise ValueError(f"llamacpp_lookup holds num_pred_tokens >= 1, got {self.llamacpp_lookup}")

    def methods(self) -> list[tuple[str, int]]:
        """(method, gamma) in run order for one prompt and sampling row."""
        order = [(PLAIN, 0)] + [(self.method, g) for g in self.gammas]
        order += [item for item in self.extra_methods if item not in order]
        if self.hf_assisted:
            order.append((HF_ASSISTED, 0))
        if self.hf_plain:
            order.append((HF_PLAIN, 0))
        if self.llamacpp:
            order.append((LLAMACPP_PLAIN, 0))
        order += [(LLAMACPP_LOOKUP, n) for n in dict.fromkeys(self.llamacpp_lookup)]
        return order

    def sampling_rows(self) -> list[SamplingRow]:
        """One row per temperature (named by it: "0", "0.7"), then the named settings."""
        rows = [SamplingRow(f"{t:g}", SamplingSettings(temperature=t)) for t in self.temperatures]
        return rows + [SamplingRow(name, NAMED_SETTINGS[name]) for name in self.named_settings]

    def max_gamma(self) -> int:
        return max(gamma for _, gamma in self.methods())

    def to_json(self) -> dict[str, Any]:
        # The run order and sampling rows these fields mean, for a reader of bench.json (read back,
        # they are computed again from the fields).
        return {
            **super().to_json(),
            "methods": [list(m) for m in self.methods()],
            "sampling_rows": [
                {
                    "name": row.name,
                    "temperature": row.settings.temperature,
                    "describe": row.settings.describe(),
                }
                for row in self.sampling_rows()
            ],
        }


@dataclass
class LlamaCppPeer:
    """The `llama_cpp.Llama`s the llama.cpp methods run (`exactspec.peers.llamacpp.load`, over the target's
    GGUF file): `plain` for llamacpp-plain (None: not run), `lookup[n]` for llamacpp-lookup with
    num_pred_tokens n, `draft` over the draft's GGUF file, timed for the peer's c (None: not timed)."""

    plain: Any | None = None
    lookup: dict[int, Any] = dataclasses.field(default_factory=dict)
    draft: Any | None = None

    def timed(self) -> Any | None:
        """The Llama whose passes are timed for the peer's costs: a lookup one when there is one (it keeps
        logits of every position, as its verification pays), else the plain one."""
        return next(iter(self.lookup.values()), self.plain)


@dataclass(frozen=True)
class EncodedPrompt:
    name: str
    category: str
    ids: list[int]
    text: str | None = None
    chat: bool = False


@dataclass(frozen=True, kw_only=True)
class BenchResult(JsonRecord):
    """Everything one bench run measured: bench.json, less the summary computed from it.

    `runs`: one `Run` per prompt, sampling row and method, in run order (with trials, each
    method's fastest); `errors`: the peer runs that failed, one line each. `costs`: our adapters'
    passes timed before the runs; `peer_costs`: llama-cpp-python's, where it ran. `all_prompt_tokens`:
    token counts of the whole built-in prompt set (to estimate the full run's duration).
    `provenance`: read from a schema 1 file (before it was kept), only the machine is known and
    the rest says "not recorded"; None when the file kept nothing of it.
    """

    schema: int = SCHEMA_VERSION
    provenance: Provenance | None = None
    config: BenchConfig
    environment: Environment
    models: Models
    prompts: tuple[PromptRecord, ...]
    all_prompt_tokens: tuple[int, ...] | None = None
    hf_policy: HfPolicy | None = None
    costs: CostMeasurement
    peer_costs: CostMeasurement | None = None
    warmup_seconds: float = math.nan
    duration_seconds: float = math.nan
    runs: tuple[Run, ...]
    errors: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, data: Any) -> BenchResult:
        if "provenance" not in data and "cpu_count" in data.get("environment", {}):
            data = {**data, "provenance": _schema_1_provenance(data["environment"]).to_json()}
        return super().from_json(data)


NOT_RECORDED = "not recorded"


def _schema_1_provenance(environment: dict[str, Any]) -> Provenance:
    """What a schema 1 bench.json kept of its provenance: the machine, in its "environment"."""
    return Provenance(
        commit=NOT_RECORDED,
        command=NOT_RECORDED,
        machine=Machine(
            cpu=environment.get("processor") or NOT_RECORDED,
            cores=environment.get("cpu_count"),
            memory_bytes=None,
            os=environment.get("platform") or NOT_RECORDED,
            python=environment.get("python") or NOT_RECORDED,
            torch=environment.get("torch") or NOT_RECORDED,
            torch_threads=environment.get("torch_threads") or 0,
        ),
        created=NOT_RECORDED,
    )


def environment() -> Environment:
    """transformers' and llama-cpp-python's versions and the load average now (the machine itself is in the
    provenance)."""
    import transformers

    llama_cpp = None
    if llamacpp_peer.available():
        from importlib.metadata import version

        llama_cpp = version("llama_cpp_python")
    return Environment(
        transformers=transformers.__version__, load_average_start=_load_average(), llama_cpp=llama_cpp
    )


def _load_average() -> tuple[float, ...] | None:
    return tuple(os.getloadavg()) if hasattr(os, "getloadavg") else None


def describe_model(pair: ModelPair, model: LanguageModel) -> ModelRecord:
    """What `model` (the pair's target or draft adapter) is, as the backend that loaded the pair describes
    it (`Backend.describe`: for transformers the adapter's own module, packed when --weights says; for
    llama.cpp what the GGUF file says of itself)."""
    return ModelRecord(**dataclasses.asdict(backend(pair.backend).describe(model)))


def run_bench(
    pair: ModelPair,
    prompts: Sequence[EncodedPrompt],
    config: BenchConfig,
    *,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
    all_prompt_tokens: Sequence[int] | None = None,
    description: ModelSpecs | None = None,
    llamacpp: LlamaCppPeer | None = None,
    provenance: Provenance | None = None,
) -> BenchResult:
    """Run everything and return the raw result (see the module docstring).

    `all_prompt_tokens`: token counts of the whole built-in prompt set, kept to estimate how long
    the full run takes at the speeds measured here. `description`: how the models were asked for
    (specs, load time), stored beside what the models are. `llamacpp`: the loaded Llamas that
    `config.llamacpp` and `config.llamacpp_lookup` run. `provenance`: the code, command and
    machine of the run (default: this process's, now).
    """
    if not prompts:
        raise ValueError("no prompts to run")
    if config.llamacpp and (llamacpp is None or llamacpp.plain is None):
        raise ValueError("config.llamacpp is set but no plain llama.cpp Llama was given")
    missing = [n for n in config.llamacpp_lookup if llamacpp is None or n not in llamacpp.lookup]
    if missing:
        raise ValueError(f"config.llamacpp_lookup has num_pred_tokens {missing} with no Llama loaded for it")
    say = log or (lambda message: None)
    started = time.perf_counter()
    provenance = provenance or Provenance.collect()
    env = environment()
    rows = config.sampling_rows()
    runs: list[Run] = []
    errors: list[str] = []

    max_k = max(COST_KS, config.max_gamma() + 1)
    context = max(prompts, key=lambda p: len(p.ids)).ids if len(prompts[0].ids) <= max_k else prompts[0].ids
    if len(context) <= max_k:
        context = list(context) * (max_k // max(1, len(context)) + 2)
    say(f"measuring c and v(k) (k = 1..{max_k}) on a warm cache of {len(context)} tokens ({pair.backend})")
    costs_started = time.perf_counter()
    costs = measure_costs(pair, context, max_k, config.cost_repeats, {row.name: row.settings for row in rows})
    costs = dataclasses.replace(costs, seconds=time.perf_counter() - costs_started)
    peer_costs = None
    timed_llama = llamacpp.timed() if llamacpp is not None else None
    if timed_llama is not None:
        assert llamacpp is not None
        say(f"measuring llama.cpp's own c and v(k) (Llama.eval, k = 1..{max_k})")
        costs_started = time.perf_counter()
        target_times, draft_times = llamacpp_peer.time_eval(
            timed_llama, context, max_k, config.cost_repeats, llamacpp.draft
        )
        peer_costs = CostMeasurement(
            context_tokens=len(context),
            repeats=config.cost_repeats,
            target_seconds=target_times,
            target_forward_seconds={},
            draft_seconds=draft_times,
            draft_forward_seconds=(),
            transform_and_sample_seconds={},
            seconds=time.perf_counter() - costs_started,
            name="llama.cpp peer",
            how="Llama.eval on k tokens, logits of "
            + ("every position (a Llama with a draft model)" if llamacpp.lookup else "the last position"),
        )

    say("warm-up")
    warm_started = time.perf_counter()
    warm_ids = prompts[0].ids[:WARMUP_PROMPT_TOKENS]  # a short prefill: the warm-up is for first-call costs
    warm_tokens = min(config.warmup_tokens, config.max_new_tokens)
    for method, gamma in config.methods():
        with contextlib.suppress(Exception):  # a failing method is reported by its real runs below
            _run_one(pair, method, gamma, warm_ids, rows[-1].settings, warm_tokens, config, None, llamacpp)
    warmup_seconds = time.perf_counter() - warm_started

    methods = config.methods()
    total = len(prompts) * len(rows) * len(methods) * config.trials
    # A drafter that learns from finished requests serves a method's prompts in order, as in a server;
    # with several trials the second would see the first's answer, so then every run starts fresh.
    learned = LearnedDrafters() if config.trials == 1 else None
    failed_methods: set[tuple[str, str]] = set()
    with _progress(total, progress) as bar:
        for index, prompt in enumerate(prompts):
            seed = config.seed + index
            for row in rows:
                trials: dict[tuple[str, int], list[Run]] = {}
                for trial in range(config.trials):
                    for method, gamma in methods:
                        label = f"{prompt.name} {row.name} {method}{f' gamma={gamma}' if gamma else ''}"
                        if config.trials > 1:
                            label += f" trial {trial + 1}/{config.trials}"
                        if bar is not None:
                            bar.set_postfix_str(label, refresh=False)
                        if (method, row.name) in failed_methods:
                            _advance(bar)
                            continue
                        try:
                            measured = _run_one(
                                pair,
                                method,
                                gamma,
                                prompt.ids,
                                row.settings,
                                config.max_new_tokens,
                                config,
                                seed,
                                llamacpp,
                                learned,
                            )
                        except Exception as error:  # a peer can refuse a pair or a setting; keep the rest
                            if is_engine_method(method):
                                raise
                            message = f"{method} at {row.name} failed on {prompt.name}: {error!r}"
                            say(message)
                            errors.append(message)
                            failed_methods.add((method, row.name))
                            trials.pop((method, gamma), None)
                            _advance(bar)
                            continue
                        run = Run(
                            **field_values(measured),
                            prompt=prompt.name,
                            category=prompt.category,
                            prompt_tokens=len(prompt.ids),
                            setting=row.name,
                            temperature=row.settings.temperature,
                            method=method,
                            gamma=gamma,
                            seed=seed,
                        )
                        trials.setdefault((method, gamma), []).append(run)
                        _advance(bar)
                plain_tokens: tuple[int, ...] | None = None
                for method, gamma in methods:
                    if (method, gamma) not in trials:
                        continue
                    run = _fastest_trial(trials[(method, gamma)])
                    if method == PLAIN:
                        plain_tokens = run.tokens
                    if plain_tokens is not None and method != PLAIN:
                        run = dataclasses.replace(
                            run,
                            same_tokens_as_plain=run.tokens == plain_tokens,
                            first_difference=_first_difference(run.tokens, plain_tokens),
                        )
                    runs.append(run)
    env = dataclasses.replace(env, load_average_end=_load_average())
    return BenchResult(
        provenance=provenance,
        config=config,
        environment=env,
        models=Models(
            **{**field_values(description or ModelSpecs()), "backend": pair.backend},
            # What our engine runs (the adapters' own modules, packed when --weights says; a backend's
            # own models where it has no transformers modules); the transformers peers run the stock
            # modules, dense.
            target=describe_model(pair, pair.target),
            draft=describe_model(pair, pair.draft),
        ),
        prompts=tuple(
            PromptRecord(name=p.name, category=p.category, tokens=len(p.ids), chat=p.chat, text=p.text)
            for p in prompts
        ),
        all_prompt_tokens=tuple(all_prompt_tokens) if all_prompt_tokens else None,
        hf_policy=HfPolicy(**hf_peer.draft_policy(pair.draft_model)) if config.hf_assisted else None,
        costs=costs,
        peer_costs=peer_costs,
        warmup_seconds=warmup_seconds,
        duration_seconds=time.perf_counter() - started,
        runs=tuple(runs),
        errors=tuple(errors),
    )


def _run_one(
    pair: ModelPair,
    method: str,
    gamma: int,
    ids: Sequence[int],
    settings: SamplingSettings,
    max_new_tokens: int,
    config: BenchConfig,
    seed: int | None = None,
    llamacpp: LlamaCppPeer | None = None,
    learned: LearnedDrafters | None = None,
) -> Measurement:
    seed = config.seed if seed is None else seed
    if is_engine_method(method):
        strategy = strategy_of(method)
        return run_engine(
            pair, ids, gamma, settings, max_new_tokens, seed, config.ignore_eos, strategy, learned
        )
    if method in LLAMACPP_METHODS:
        assert llamacpp is not None  # run_bench checked that every llama.cpp method has its Llama
        llm = llamacpp.plain if method == LLAMACPP_PLAIN else llamacpp.lookup[gamma]
        return run_llamacpp(llm, pair, ids, settings, max_new_tokens, seed, config.ignore_eos)
    return run_hf(pair, ids, method == HF_ASSISTED, settings, max_new_tokens, seed, config.ignore_eos)


def _fastest_trial(runs: Sequence[Run]) -> Run:
    """The trial with the highest steady-state tokens/s, with every trial's speed and agreement beside it.

    `trial_tokens_per_second` lists each trial's steady-state speed in run order;
    `trials_same_tokens` says whether every trial emitted the same tokens (same seed: they should,
    up to the numerics of the machine, and a difference is reported rather than hidden).
    """
    best = max(runs, key=lambda r: theory.nan_low(r.steady_tokens_per_second))
    if len(runs) == 1:
        return best
    return dataclasses.replace(
        best,
        trial_tokens_per_second=tuple(r.steady_tokens_per_second for r in runs),
        trials_same_tokens=all(r.tokens == runs[0].tokens for r in runs),
    )


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@contextlib.contextmanager
def _progress(total: int, enabled: bool) -> Iterator[Any]:
    if not enabled:
        yield None
        return
    from tqdm.auto import tqdm

    with tqdm(total=total, desc="bench", unit="run", dynamic_ncols=True) as bar:
        yield bar


def _advance(bar: Any) -> None:
    if bar is not None:
        bar.update(1)
