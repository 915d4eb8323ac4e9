"""Run the whole benchmark: plain decoding, speculative decoding for each gamma, and the peers.

The methods and sampling rows are named in `exactspec.bench.methods`; what to run is a
`config.BenchConfig`. Our engine runs on the pair's backend (`ModelPair.backend`: any registered one);
the peers are transformers' assisted generation and plain `generate` (on a pair with transformers
modules), llama-cpp-python's plain decoding and its prompt lookup decoding (`LlamaPromptLookupDecoding`,
gamma = num_pred_tokens) over the target's GGUF file, and onnxruntime-genai's plain decoding and its n-gram
decoding (gamma = max_draft_tokens) over an ONNX model folder from its model builder.

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

Everything is returned as one `result.BenchResult` (typed records, `exactspec.bench.records`; written
as `bench.json`); the summary and the report are computed from it alone (`exactspec.bench.summary`,
`.report`), so a bench.json read back renders the same report.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from exactspec.bench import theory
from exactspec.bench.config import BenchConfig, EncodedPrompt
from exactspec.bench.costs import COST_KS, CostMeasurement, measure_costs
from exactspec.bench.methods import (
    HF_ASSISTED,
    LLAMACPP_METHODS,
    LLAMACPP_PLAIN,
    ORTGENAI_METHODS,
    ORTGENAI_NGRAM,
    PLAIN,
    SamplingRow,
    is_engine_method,
    strategy_of,
)
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
from exactspec.bench.result import BenchResult
from exactspec.bench.runs import LearnedDrafters, run_engine, run_hf, run_llamacpp, run_ortgenai
from exactspec.foundations.provenance import Provenance
from exactspec.foundations.records import field_values
from exactspec.foundations.settings import SamplingSettings
from exactspec.models.backends.registry import backend
from exactspec.models.base import LanguageModel
from exactspec.models.pair import ModelPair
from exactspec.peers import hf as hf_peer
from exactspec.peers import llamacpp as llamacpp_peer
from exactspec.peers import ortgenai as ortgenai_peer

WARMUP_PROMPT_TOKENS = 16


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
class Peers:
    """The other systems' loaded models a run may use: llama.cpp's Llamas, onnxruntime-genai's model."""

    llamacpp: LlamaCppPeer | None = None
    ortgenai: ortgenai_peer.OrtGenaiModel | None = None


def environment() -> Environment:
    """transformers', llama-cpp-python's and onnxruntime-genai's versions and the load average now (the
    machine itself is in the provenance)."""
    from importlib.metadata import version

    import transformers

    llama_cpp = version("llama_cpp_python") if llamacpp_peer.available() else None
    genai = version("onnxruntime-genai") if ortgenai_peer.available() else None
    return Environment(
        transformers=transformers.__version__,
        load_average_start=_load_average(),
        llama_cpp=llama_cpp,
        onnxruntime_genai=genai,
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
    ortgenai: ortgenai_peer.OrtGenaiModel | None = None,
    provenance: Provenance | None = None,
) -> BenchResult:
    """Run everything and return the raw result (see the module docstring).

    `all_prompt_tokens`: token counts of the whole built-in prompt set, kept to estimate how long
    the full run takes at the speeds measured here. `description`: how the models were asked for
    (specs, load time), stored beside what the models are. `llamacpp`: the loaded Llamas that
    `config.llamacpp` and `config.llamacpp_lookup` run. `ortgenai`: the onnxruntime-genai model that
    `config.ortgenai` and `config.ortgenai_ngram` run. `provenance`: the code, command and
    machine of the run (default: this process's, now).
    """
    _check_inputs(prompts, config, llamacpp, ortgenai)
    say = log or (lambda message: None)
    started = time.perf_counter()
    provenance = provenance or Provenance.collect()
    env = environment()
    costs, peer_costs = _measure_costs(pair, prompts, config, llamacpp, say)

    say("warm-up")
    warm_started = time.perf_counter()
    peers = Peers(llamacpp, ortgenai)
    _warm_up(pair, prompts[0].ids, config, peers)
    warmup_seconds = time.perf_counter() - warm_started

    total = len(prompts) * len(config.sampling_rows()) * len(config.methods()) * config.trials
    with _progress(total, progress) as bar:
        # A drafter that learns from finished requests serves a method's prompts in order, as in a server;
        # with several trials the second would see the first's answer, so then every run starts fresh.
        sweep = _Sweep(pair, config, peers, say, bar, LearnedDrafters() if config.trials == 1 else None)
        for index, prompt in enumerate(prompts):
            sweep.run_prompt(prompt, config.seed + index)
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
        runs=tuple(sweep.runs),
        errors=tuple(sweep.errors),
    )


def _check_inputs(
    prompts: Sequence[EncodedPrompt],
    config: BenchConfig,
    llamacpp: LlamaCppPeer | None,
    ortgenai: ortgenai_peer.OrtGenaiModel | None = None,
) -> None:
    """Raise unless there are prompts and every peer method of `config` has its model loaded."""
    if not prompts:
        raise ValueError("no prompts to run")
    if config.llamacpp and (llamacpp is None or llamacpp.plain is None):
        raise ValueError("config.llamacpp is set but no plain llama.cpp Llama was given")
    missing = [n for n in config.llamacpp_lookup if llamacpp is None or n not in llamacpp.lookup]
    if missing:
        raise ValueError(f"config.llamacpp_lookup has num_pred_tokens {missing} with no Llama loaded for it")
    if (config.ortgenai or config.ortgenai_ngram) and ortgenai is None:
        raise ValueError("config.ortgenai / ortgenai_ngram are set but no onnxruntime-genai model was given")


def _cost_context(prompts: Sequence[EncodedPrompt], max_k: int) -> list[int]:
    """A context longer than `max_k` tokens to time passes on: the first prompt, else the longest, repeated
    when even that is too short."""
    context = max(prompts, key=lambda p: len(p.ids)).ids if len(prompts[0].ids) <= max_k else prompts[0].ids
    if len(context) <= max_k:
        context = list(context) * (max_k // max(1, len(context)) + 2)
    return list(context)


def _measure_costs(
    pair: ModelPair,
    prompts: Sequence[EncodedPrompt],
    config: BenchConfig,
    llamacpp: LlamaCppPeer | None,
    say: Callable[[str], None],
) -> tuple[CostMeasurement, CostMeasurement | None]:
    """c and v(k) through our adapters, and of llama-cpp-python's own passes where a Llama is timed (else
    None), on one warm context."""
    max_k = max(COST_KS, config.max_gamma() + 1)
    context = _cost_context(prompts, max_k)
    say(f"measuring c and v(k) (k = 1..{max_k}) on a warm cache of {len(context)} tokens ({pair.backend})")
    costs_started = time.perf_counter()
    rows = {row.name: row.settings for row in config.sampling_rows()}
    costs = measure_costs(pair, context, max_k, config.cost_repeats, rows)
    costs = dataclasses.replace(costs, seconds=time.perf_counter() - costs_started)
    timed_llama = llamacpp.timed() if llamacpp is not None else None
    if timed_llama is None:
        return costs, None
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
    return costs, peer_costs


def _warm_up(pair: ModelPair, ids: Sequence[int], config: BenchConfig, peers: Peers) -> None:
    """Every method once on a short prefill of `ids` at the last sampling row (first-call costs)."""
    warm_ids = ids[:WARMUP_PROMPT_TOKENS]  # a short prefill: the warm-up is for first-call costs
    warm_tokens = min(config.warmup_tokens, config.max_new_tokens)
    settings = config.sampling_rows()[-1].settings
    for method, gamma in config.methods():
        with contextlib.suppress(Exception):  # a failing method is reported by its real runs below
            _run_one(pair, method, gamma, warm_ids, settings, warm_tokens, config, None, peers)


@dataclass
class _Sweep:
    """The timed runs, prompt by prompt: every sampling row, trial and method in turn, each method's
    fastest trial kept (`runs`); a peer that fails at a sampling row is reported (`errors`) and is not run
    at that row again."""

    pair: ModelPair
    config: BenchConfig
    peers: Peers
    say: Callable[[str], None]
    bar: Any
    learned: LearnedDrafters | None
    runs: list[Run] = dataclasses.field(default_factory=list)
    errors: list[str] = dataclasses.field(default_factory=list)
    failed: set[tuple[str, str]] = dataclasses.field(default_factory=set)  # (method, sampling row)

    def run_prompt(self, prompt: EncodedPrompt, seed: int) -> None:
        """Every sampling row of one prompt: its trials, then the kept runs against plain decoding."""
        config = self.config
        for row in config.sampling_rows():
            trials: dict[tuple[str, int], list[Run]] = {}
            for trial in range(config.trials):
                for method, gamma in config.methods():
                    if self.bar is not None:
                        label = f"{prompt.name} {row.name} {method}{f' gamma={gamma}' if gamma else ''}"
                        if config.trials > 1:
                            label += f" trial {trial + 1}/{config.trials}"
                        self.bar.set_postfix_str(label, refresh=False)
                    run = self._run(prompt, seed, row, method, gamma)
                    if run is None:
                        trials.pop((method, gamma), None)
                    else:
                        trials.setdefault((method, gamma), []).append(run)
                    _advance(self.bar)
            self.runs += _kept_runs(config.methods(), trials)

    def _run(self, prompt: EncodedPrompt, seed: int, row: SamplingRow, method: str, gamma: int) -> Run | None:
        """One timed run; None for a peer that failed here (reported) or earlier at this sampling row."""
        if (method, row.name) in self.failed:
            return None
        try:
            measured = _run_one(
                self.pair,
                method,
                gamma,
                prompt.ids,
                row.settings,
                self.config.max_new_tokens,
                self.config,
                seed,
                self.peers,
                self.learned,
            )
        except Exception as error:  # a peer can refuse a pair or a setting; keep the rest
            if is_engine_method(method):
                raise
            message = f"{method} at {row.name} failed on {prompt.name}: {error!r}"
            self.say(message)
            self.errors.append(message)
            self.failed.add((method, row.name))
            return None
        return Run(
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


def _kept_runs(methods: Sequence[tuple[str, int]], trials: dict[tuple[str, int], list[Run]]) -> list[Run]:
    """Each method's fastest trial in run order, compared with plain decoding's tokens (which runs first)."""
    kept = []
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
        kept.append(run)
    return kept


def _run_one(
    pair: ModelPair,
    method: str,
    gamma: int,
    ids: Sequence[int],
    settings: SamplingSettings,
    max_new_tokens: int,
    config: BenchConfig,
    seed: int | None = None,
    peers: Peers | None = None,
    learned: LearnedDrafters | None = None,
) -> Measurement:
    seed = config.seed if seed is None else seed
    if is_engine_method(method):
        strategy = strategy_of(method)
        return run_engine(
            pair, ids, gamma, settings, max_new_tokens, seed, config.ignore_eos, strategy, learned
        )
    peers = peers or Peers()
    if method in LLAMACPP_METHODS:
        assert peers.llamacpp is not None  # run_bench checked that every llama.cpp method has its Llama
        llm = peers.llamacpp.plain if method == LLAMACPP_PLAIN else peers.llamacpp.lookup[gamma]
        return run_llamacpp(llm, pair, ids, settings, max_new_tokens, seed, config.ignore_eos)
    if method in ORTGENAI_METHODS:
        assert peers.ortgenai is not None  # run_bench checked it
        ngram = gamma if method == ORTGENAI_NGRAM else None
        model = peers.ortgenai
        return run_ortgenai(model, pair, ids, settings, max_new_tokens, seed, config.ignore_eos, ngram)
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
