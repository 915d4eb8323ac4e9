"""Run the benchmark: plain decoding, speculative decoding for each gamma, and Hugging Face's peers.

For every prompt and temperature the runs are interleaved (plain, each gamma,
HF assisted generation, HF plain `generate`) so that machine noise hits all of
them alike. Every run starts from empty KV caches, uses the same seed, and
makes exactly `max_new_tokens` tokens: by default EOS does not stop any side
(our engine sees no EOS ids, HF gets `eos_token_id=None`), so all sides time
the same amount of work.

Timing, the same for every side:

* end to end: wall time of the whole call (prefill included);
* steady state: tokens after the first round / time after the first round.
  The first round holds the prefill, which no decoding method speeds up; the
  speedup model (`exactspec.bench.theory`) describes the steady state, so the
  speedups are computed from it. Round boundaries come from the engine's
  `rounds()` for our engine and from a streamer (one `put` per round) for HF.
* model time: forward hooks on the two HF models time every forward pass, so
  "time outside the models" is measured the same way for our engine and HF.

The cost ratios c and v(k) are measured directly before the runs: timed
forwards through the same adapters on a warm KV cache (`measure_costs`).

Everything is returned as one JSON-ready dict (`bench.json`); the summary and
the report are computed from it alone (`exactspec.bench.summary`, `.report`).
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from exactspec.drafters.model import ModelDrafter
from exactspec.engine import DecodeConfig, SpeculativeEngine
from exactspec.models.base import LanguageModel
from exactspec.sampler import SeededSampler
from exactspec.settings import SamplingSettings
from exactspec.transforms import probabilities

PLAIN, SPECULATIVE, HF_ASSISTED, HF_PLAIN = "plain", "speculative", "hf-assisted", "hf-plain"
METHODS = (PLAIN, SPECULATIVE, HF_ASSISTED, HF_PLAIN)

DEFAULT_GAMMAS = (1, 2, 4, 6, 8)
DEFAULT_TEMPERATURES = (0.0, 0.7)
DEFAULT_MAX_NEW_TOKENS = 128
QUICK_GAMMAS = (2, 4)
QUICK_MAX_NEW_TOKENS = 32

SCHEMA_VERSION = 1
WARMUP_PROMPT_TOKENS = 16


@dataclass(frozen=True)
class BenchConfig:
    """What to run. `cost_repeats` timed forwards per k measure c and v(k); `warmup_tokens` per method."""

    gammas: tuple[int, ...] = DEFAULT_GAMMAS
    temperatures: tuple[float, ...] = DEFAULT_TEMPERATURES
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    seed: int = 0
    hf_assisted: bool = True
    hf_plain: bool = True
    ignore_eos: bool = True
    cost_repeats: int = 5
    warmup_tokens: int = 4

    def __post_init__(self) -> None:
        if not self.gammas or any(g < 1 for g in self.gammas):
            raise ValueError(f"gammas must be integers >= 1 (plain decoding always runs), got {self.gammas}")
        if not self.temperatures or any(t < 0 or math.isnan(t) for t in self.temperatures):
            raise ValueError(f"temperatures must be >= 0, got {self.temperatures}")
        if self.max_new_tokens < 2:
            raise ValueError(
                f"max_new_tokens must be >= 2 (one round is the prefill), got {self.max_new_tokens}"
            )
        if self.cost_repeats < 1:
            raise ValueError(f"cost_repeats must be >= 1, got {self.cost_repeats}")

    def methods(self) -> list[tuple[str, int]]:
        """(method, gamma) in run order for one prompt and temperature."""
        order = [(PLAIN, 0)] + [(SPECULATIVE, g) for g in self.gammas]
        if self.hf_assisted:
            order.append((HF_ASSISTED, 0))
        if self.hf_plain:
            order.append((HF_PLAIN, 0))
        return order


@dataclass(frozen=True)
class EncodedPrompt:
    name: str
    category: str
    ids: list[int]
    text: str | None = None
    chat: bool = False


@dataclass
class BenchPair:
    """The models under test: the HF modules (for HF's `generate`) and our adapters around those modules."""

    target: Any  # HFLanguageModel (has clear_cache())
    draft: Any  # HFLanguageModel
    target_model: Any  # transformers PreTrainedModel
    draft_model: Any
    tokenizer: Any | None = None  # only needed by HF when the two vocabulary sizes differ
    description: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_decoder(cls, decoder: Any, description: dict[str, Any] | None = None) -> BenchPair:
        """From a loaded `exactspec.api.SpeculativeDecoder` with a draft (no second copy of any model)."""
        if decoder.draft is None or getattr(decoder, "draft_model", None) is None:
            raise ValueError("the benchmark needs a draft model")
        return cls(
            decoder.target,
            decoder.draft,
            decoder.target_model,
            decoder.draft_model,
            decoder.tokenizer,
            dict(description or {}),
        )


class _NoEos:
    """A `LanguageModel` that is `model` with no EOS ids, so generation always runs to max_new_tokens."""

    def __init__(self, model: LanguageModel) -> None:
        self._model = model

    @property
    def vocab_size(self) -> int:
        return self._model.vocab_size

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return frozenset()

    def logits(
        self, histories: Sequence[Sequence[int]], num_positions: int = 1, rows: Sequence[int] | None = None
    ) -> torch.Tensor:
        return self._model.logits(histories, num_positions, rows)


class ForwardTimer:
    """Forward hooks that record (tokens fed, seconds) of every forward pass of an HF model."""

    def __init__(self, model: Any) -> None:
        self.calls: list[tuple[int, float]] = []
        self._model = model
        self._started = 0.0
        self._width = 0
        self._handles: list[Any] = []

    def _before(self, module: Any, args: tuple, kwargs: dict) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        self._width = int(ids.shape[-1]) if ids is not None else 0
        self._started = time.perf_counter()

    def _after(self, module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        self.calls.append((self._width, time.perf_counter() - self._started))

    def __enter__(self) -> ForwardTimer:
        self._handles = [
            self._model.register_forward_pre_hook(self._before, with_kwargs=True),
            self._model.register_forward_hook(self._after, with_kwargs=True),
        ]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    @property
    def seconds(self) -> float:
        return sum(s for _, s in self.calls)


class _RoundStreamer:
    """An HF streamer that timestamps every `put` (HF puts the prompt first, then each round's tokens)."""

    def __init__(self) -> None:
        self.events: list[tuple[float, int]] = []

    def put(self, value: torch.Tensor) -> None:
        self.events.append((time.perf_counter(), int(value.numel())))

    def end(self) -> None:
        pass


# --------------------------------------------------------------------------- direct cost measurement


def measure_costs(
    pair: BenchPair, context: Sequence[int], max_k: int, repeats: int, temperatures: Sequence[float]
) -> dict[str, Any]:
    """Time target k-token forwards (k = 1..max_k) and draft 1-token steps on a warm KV cache.

    The adapters are called with the same history again and again: each call
    rolls back the last k cached tokens and feeds them again, so every timed
    forward runs k tokens over a warm cache of len(context) - k tokens. The ks
    are interleaved inside each repeat so that machine noise spreads over all.
    Also timed: the per-token work outside the models (SPEC transforms over the
    whole vocabulary plus one categorical draw), which every decoding step pays.
    """
    history = list(context)
    if len(history) < max_k + 1:
        raise ValueError(f"the cost context needs more than {max_k} tokens, got {len(history)}")
    pair.target.clear_cache()
    pair.draft.clear_cache()
    target_times: dict[int, list[float]] = {k: [] for k in range(1, max_k + 1)}
    target_forward: dict[int, list[float]] = {k: [] for k in range(1, max_k + 1)}
    draft_times: list[float] = []
    draft_forward: list[float] = []
    with ForwardTimer(pair.target_model) as target_timer, ForwardTimer(pair.draft_model) as draft_timer:
        pair.target.logits([history], 1)  # prefill (untimed)
        pair.draft.logits([history], 1)
        pair.target.logits([history], min(2, max_k))  # untimed: first-call allocations
        for _ in range(repeats):
            for k in range(1, max_k + 1):
                before = len(target_timer.calls)
                started = time.perf_counter()
                pair.target.logits([history], k)
                target_times[k].append(time.perf_counter() - started)
                target_forward[k].append(sum(s for _, s in target_timer.calls[before:]))
                before = len(draft_timer.calls)
                started = time.perf_counter()
                pair.draft.logits([history], 1)
                draft_times.append(time.perf_counter() - started)
                draft_forward.append(sum(s for _, s in draft_timer.calls[before:]))
    pair.target.clear_cache()
    pair.draft.clear_cache()

    vocab = pair.target.vocab_size
    logits = torch.randn(1, vocab, generator=torch.Generator().manual_seed(0))
    sampler = SeededSampler(0)
    step_overhead: dict[str, list[float]] = {}
    for temperature in temperatures:
        settings = SamplingSettings(temperature=temperature)
        sampler.categorical(probabilities(logits, settings), [0])  # untimed warm-up
        samples = []
        for _ in range(repeats):
            started = time.perf_counter()
            sampler.categorical(probabilities(logits, settings), [0])
            samples.append(time.perf_counter() - started)
        step_overhead[f"{temperature:g}"] = samples
    return {
        "context_tokens": len(history),
        "repeats": repeats,
        "target_seconds": {str(k): v for k, v in target_times.items()},
        "target_forward_seconds": {str(k): v for k, v in target_forward.items()},
        "draft_seconds": draft_times,
        "draft_forward_seconds": draft_forward,
        "transform_and_sample_seconds": step_overhead,
    }


def cost_ratios(costs: dict[str, Any], forward_only: bool = False) -> dict[str, Any]:
    """c and v(k) from `measure_costs` output (medians): through the adapter, or forward passes only."""
    target_key, draft_key = (
        ("target_forward_seconds", "draft_forward_seconds")
        if forward_only
        else ("target_seconds", "draft_seconds")
    )
    target = {int(k): statistics.median(v) for k, v in costs[target_key].items()}
    draft = statistics.median(costs[draft_key])
    one = target[1]
    return {
        "target_step_seconds": one,
        "draft_step_seconds": draft,
        "c": draft / one,
        "v": {k: t / one for k, t in sorted(target.items())},
    }


# --------------------------------------------------------------------------- single runs


def _steady(events: list[tuple[float, int]], started: float) -> dict[str, Any]:
    """Round times (from `started`) and tokens, and steady-state tokens/s (after the first round)."""
    times = [t - started for t, _ in events]
    tokens = [n for _, n in events]
    total = sum(tokens)
    steady_tokens = total - tokens[0] if tokens else 0
    steady_seconds = times[-1] - times[0] if len(times) > 1 else 0.0
    return {
        "round_times": times,
        "round_tokens": tokens,
        "new_tokens": total,
        "first_round_seconds": times[0] if times else math.nan,
        "first_round_tokens": tokens[0] if tokens else 0,
        "steady_tokens": steady_tokens,
        "steady_seconds": steady_seconds,
        "steady_tokens_per_second": steady_tokens / steady_seconds if steady_seconds > 0 else math.nan,
    }


def run_engine(
    pair: BenchPair,
    ids: Sequence[int],
    gamma: int,
    temperature: float,
    max_new_tokens: int,
    seed: int,
    ignore_eos: bool,
) -> dict[str, Any]:
    """One generation through our engine (gamma = 0 is plain decoding), from empty caches."""
    pair.target.clear_cache()
    pair.draft.clear_cache()
    target: LanguageModel = _NoEos(pair.target) if ignore_eos else pair.target
    drafter = None
    if gamma > 0:
        draft: LanguageModel = _NoEos(pair.draft) if ignore_eos else pair.draft
        drafter = ModelDrafter(draft, target.vocab_size)
    engine = SpeculativeEngine(target, drafter)
    config = DecodeConfig(
        gamma=gamma, max_new_tokens=max_new_tokens, settings=SamplingSettings(temperature=temperature)
    )
    states = engine.start([list(ids)], config)
    sampler = SeededSampler(seed=seed)
    events: list[tuple[float, int]] = []
    with ForwardTimer(pair.target_model) as target_timer, ForwardTimer(pair.draft_model) as draft_timer:
        started = time.perf_counter()
        for output in engine.rounds(states, config, sampler):
            events.append((time.perf_counter(), len(output.new_tokens.get(0, []))))
        wall = time.perf_counter() - started
    metrics = engine.metrics
    record = {
        "wall_seconds": wall,
        **_steady(events, started),
        "tokens": list(states[0].generated),
        "finish_reason": states[0].finish_reason,
        "metrics": {
            **metrics.as_dict(),
            "proposed_by_position": list(metrics.proposed_by_position),
            "accepted_by_position": list(metrics.accepted_by_position),
        },
        "target_forwards": [list(c) for c in target_timer.calls],
        "draft_forwards": [list(c) for c in draft_timer.calls],
        "model_seconds": target_timer.seconds + draft_timer.seconds,
    }
    pair.target.clear_cache()
    pair.draft.clear_cache()
    return record


def hf_draft_policy(draft_model: Any) -> dict[str, Any]:
    """The draft-length policy of HF assisted generation: the assistant's generation config + defaults."""
    config = draft_model.generation_config
    defaults_fn = getattr(type(config), "_get_default_generation_params", None)
    defaults = defaults_fn() if callable(defaults_fn) else {}

    def value(name: str) -> Any:
        own = getattr(config, name, None)
        return own if own is not None else defaults.get(name)

    try:
        import sklearn  # noqa: F401

        adaptive = True
    except ImportError:
        adaptive = False
    return {
        "num_assistant_tokens": value("num_assistant_tokens"),
        "num_assistant_tokens_schedule": value("num_assistant_tokens_schedule"),
        "assistant_confidence_threshold": value("assistant_confidence_threshold"),
        # HF re-fits the confidence threshold from an ROC curve only when scikit-learn is installed.
        "adaptive_confidence_threshold": adaptive,
    }


def run_hf(
    pair: BenchPair,
    ids: Sequence[int],
    assisted: bool,
    temperature: float,
    max_new_tokens: int,
    seed: int,
    ignore_eos: bool,
) -> dict[str, Any]:
    """One `target_model.generate` call (assisted by the draft or plain), timed like `run_engine`."""
    model = pair.target_model
    input_ids = torch.tensor([list(ids)], device=model.device)
    kwargs: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "do_sample": temperature > 0,
        "repetition_penalty": 1.0,
        "pad_token_id": _pad_id(model),
    }
    if temperature > 0:
        # Pure temperature sampling, as in our engine (HF's global default would add top_k=50).
        kwargs.update(temperature=temperature, top_k=0, top_p=1.0)
    if ignore_eos:
        kwargs["eos_token_id"] = None
    generator_kind = None
    if assisted:
        kwargs["assistant_model"] = pair.draft_model
        generator_kind = "AssistedCandidateGenerator"
        if _config_vocab(model) != _config_vocab(pair.draft_model):
            # HF treats different vocabulary sizes as different tokenizers (universal assisted generation).
            if pair.tokenizer is None:
                raise ValueError(
                    "HF assisted generation needs the tokenizer when the vocabulary sizes differ"
                )
            kwargs.update(tokenizer=pair.tokenizer, assistant_tokenizer=pair.tokenizer)
            generator_kind = "universal (different vocabulary sizes)"
    saved_config = copy.deepcopy(pair.draft_model.generation_config)
    streamer = _RoundStreamer()
    torch.manual_seed(seed)
    try:
        with (
            _quiet_transformers(),
            ForwardTimer(model) as target_timer,
            ForwardTimer(pair.draft_model) as draft_timer,
        ):
            started = time.perf_counter()
            with torch.inference_mode():
                output = model.generate(
                    input_ids, attention_mask=torch.ones_like(input_ids), streamer=streamer, **kwargs
                )
            wall = time.perf_counter() - started
    finally:
        # A "heuristic" schedule writes its draft length back into the assistant's config; undo that
        # so that every run starts from the same policy.
        pair.draft_model.generation_config = saved_config
    events = streamer.events[1:]  # the first put is the prompt
    tokens = output[0, len(ids) :].tolist()
    record = {
        "wall_seconds": wall,
        **_steady(events, started),
        "tokens": tokens,
        "finish_reason": "length" if len(tokens) >= max_new_tokens else "eos",
        "target_forwards": [list(c) for c in target_timer.calls],
        "draft_forwards": [list(c) for c in draft_timer.calls],
        "model_seconds": target_timer.seconds + draft_timer.seconds,
    }
    if assisted:
        # Round r's target forward scores its candidates plus one: width - 1 candidates (the
        # first forward also holds the prompt). Accepted = emitted - 1 per round.
        widths = [w for w, _ in target_timer.calls]
        candidates = [widths[0] - len(ids)] + [w - 1 for w in widths[1:]] if widths else []
        accepted = [max(0, n - 1) for n in record["round_tokens"]]
        record["hf"] = {
            "generator": generator_kind,
            "candidate_lengths": candidates,
            "accepted_per_round": accepted,
            "proposed_tokens": sum(candidates),
            "accepted_tokens": sum(accepted),
        }
    return record


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Silence transformers' warnings for the duration (assisted generation warns about its own internal
    calls on every round, which would bury the progress bar)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def _pad_id(model: Any) -> int:
    for source in (model.generation_config, model.config):
        value = getattr(source, "pad_token_id", None)
        if isinstance(value, int):
            return value
    return 0


def _config_vocab(model: Any) -> int:
    return int(model.config.get_text_config().vocab_size)


# --------------------------------------------------------------------------- the whole benchmark


def environment() -> dict[str, Any]:
    import transformers

    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
        "load_average_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def describe_model(model: Any) -> dict[str, Any]:
    parameters = sum(p.numel() for p in model.parameters())
    return {
        "class": type(model).__name__,
        "parameters": parameters,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "vocab_size": _config_vocab(model),
        "layers": getattr(model.config, "num_hidden_layers", None),
        "hidden_size": getattr(model.config, "hidden_size", None),
    }


def run_bench(
    pair: BenchPair,
    prompts: Sequence[EncodedPrompt],
    config: BenchConfig,
    *,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
    all_prompt_tokens: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Run everything and return the raw result (JSON-ready; see the module docstring).

    `all_prompt_tokens`: token counts of the whole built-in prompt set, kept to estimate how long
    the full run takes at the speeds measured here.
    """
    if not prompts:
        raise ValueError("no prompts to run")
    say = log or (lambda message: None)
    started = time.perf_counter()
    env = environment()
    result: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "config": {
            **asdict(config),
            "gammas": list(config.gammas),
            "temperatures": list(config.temperatures),
        },
        "environment": env,
        "models": {
            **pair.description,
            "target": describe_model(pair.target_model),
            "draft": describe_model(pair.draft_model),
        },
        "prompts": [
            {"name": p.name, "category": p.category, "tokens": len(p.ids), "chat": p.chat, "text": p.text}
            for p in prompts
        ],
        "all_prompt_tokens": list(all_prompt_tokens) if all_prompt_tokens else None,
        "hf_policy": hf_draft_policy(pair.draft_model) if config.hf_assisted else None,
        "runs": [],
        "errors": [],
    }

    max_k = max(config.gammas) + 1
    context = max(prompts, key=lambda p: len(p.ids)).ids if len(prompts[0].ids) <= max_k else prompts[0].ids
    if len(context) <= max_k:
        context = list(context) * (max_k // max(1, len(context)) + 2)
    say(f"measuring c and v(k) (k = 1..{max_k}) on a warm cache of {len(context)} tokens")
    costs_started = time.perf_counter()
    result["costs"] = measure_costs(pair, context, max_k, config.cost_repeats, config.temperatures)
    result["costs"]["seconds"] = time.perf_counter() - costs_started

    say("warm-up")
    warm_started = time.perf_counter()
    warm_ids = prompts[0].ids[:WARMUP_PROMPT_TOKENS]  # a short prefill: the warm-up is for first-call costs
    warm_tokens = min(config.warmup_tokens, config.max_new_tokens)
    for method, gamma in config.methods():
        with contextlib.suppress(Exception):  # a failing method is reported by its real runs below
            _run_one(pair, method, gamma, warm_ids, config.temperatures[-1], warm_tokens, config)
    result["warmup_seconds"] = time.perf_counter() - warm_started

    methods = config.methods()
    total = len(prompts) * len(config.temperatures) * len(methods)
    failed_methods: set[tuple[str, float]] = set()
    with _progress(total, progress) as bar:
        for index, prompt in enumerate(prompts):
            seed = config.seed + index
            for temperature in config.temperatures:
                plain_tokens: list[int] | None = None
                for method, gamma in methods:
                    label = f"{prompt.name} T={temperature:g} {method}{f' gamma={gamma}' if gamma else ''}"
                    if bar is not None:
                        bar.set_postfix_str(label, refresh=False)
                    if (method, temperature) in failed_methods:
                        _advance(bar)
                        continue
                    try:
                        record = _run_one(
                            pair, method, gamma, prompt.ids, temperature, config.max_new_tokens, config, seed
                        )
                    except Exception as error:  # HF's assisted path can refuse a pair; keep the rest
                        if method not in (HF_ASSISTED, HF_PLAIN):
                            raise
                        message = f"{method} at T={temperature:g} failed on {prompt.name}: {error!r}"
                        say(message)
                        result["errors"].append(message)
                        failed_methods.add((method, temperature))
                        _advance(bar)
                        continue
                    if method == PLAIN:
                        plain_tokens = record["tokens"]
                    if plain_tokens is not None and method != PLAIN:
                        record["same_tokens_as_plain"] = record["tokens"] == plain_tokens
                        record["first_difference"] = _first_difference(record["tokens"], plain_tokens)
                    result["runs"].append(
                        {
                            "prompt": prompt.name,
                            "category": prompt.category,
                            "prompt_tokens": len(prompt.ids),
                            "temperature": temperature,
                            "method": method,
                            "gamma": gamma,
                            "seed": seed,
                            **record,
                        }
                    )
                    _advance(bar)
    env["load_average_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    result["duration_seconds"] = time.perf_counter() - started
    return result


def _run_one(
    pair: BenchPair,
    method: str,
    gamma: int,
    ids: Sequence[int],
    temperature: float,
    max_new_tokens: int,
    config: BenchConfig,
    seed: int | None = None,
) -> dict[str, Any]:
    seed = config.seed if seed is None else seed
    if method in (PLAIN, SPECULATIVE):
        return run_engine(pair, ids, gamma, temperature, max_new_tokens, seed, config.ignore_eos)
    return run_hf(pair, ids, method == HF_ASSISTED, temperature, max_new_tokens, seed, config.ignore_eos)


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
