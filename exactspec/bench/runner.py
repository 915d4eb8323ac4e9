"""Run the whole benchmark: plain decoding, speculative decoding for each gamma, and transformers' peers.

For every prompt and temperature the runs are interleaved (plain, each gamma,
HF assisted generation, HF plain `generate`) so that machine noise hits all of
them alike; each single run is in `exactspec.bench.runs`, timed as described
in `exactspec.bench.timing`. The speedup model (`exactspec.bench.theory`)
describes the steady state, so the speedups are computed from it. The cost
ratios c and v(k) are measured directly before the runs
(`exactspec.bench.costs`).

Everything is returned as one JSON-ready dict (`bench.json`); the summary and
the report are computed from it alone (`exactspec.bench.summary`, `.report`).
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from exactspec.bench.costs import measure_costs
from exactspec.bench.runs import run_engine, run_hf, run_llamacpp
from exactspec.models.pair import ModelPair
from exactspec.peers import hf as hf_peer

PLAIN, SPECULATIVE, HF_ASSISTED, HF_PLAIN = "plain", "speculative", "hf-assisted", "hf-plain"
LLAMACPP_PLAIN = "llamacpp-plain"
METHODS = (PLAIN, SPECULATIVE, HF_ASSISTED, HF_PLAIN, LLAMACPP_PLAIN)

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
    llamacpp: bool = False  # plain llama.cpp on the target's GGUF (run_bench gets the loaded model)
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
        if self.llamacpp:
            order.append((LLAMACPP_PLAIN, 0))
        return order


@dataclass(frozen=True)
class EncodedPrompt:
    name: str
    category: str
    ids: list[int]
    text: str | None = None
    chat: bool = False


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
        "weights": getattr(model, "exactspec_weights", "dense"),  # set by models.packed.pack_model
        "vocab_size": hf_peer.config_vocab(model),
        "layers": getattr(model.config, "num_hidden_layers", None),
        "hidden_size": getattr(model.config, "hidden_size", None),
    }


def run_bench(
    pair: ModelPair,
    prompts: Sequence[EncodedPrompt],
    config: BenchConfig,
    *,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
    all_prompt_tokens: Sequence[int] | None = None,
    description: dict[str, Any] | None = None,
    llamacpp_model: Any | None = None,
) -> dict[str, Any]:
    """Run everything and return the raw result (JSON-ready; see the module docstring).

    `all_prompt_tokens`: token counts of the whole built-in prompt set, kept to estimate how long
    the full run takes at the speeds measured here. `description`: how the models were asked for
    (specs, load time), stored beside what the models are. `llamacpp_model`: the loaded
    `llama_cpp.Llama` that `config.llamacpp` runs (`exactspec.peers.llamacpp.load`).
    """
    if not prompts:
        raise ValueError("no prompts to run")
    if config.llamacpp and llamacpp_model is None:
        raise ValueError("config.llamacpp is set but no llamacpp_model was given")
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
            **(description or {}),
            "target": describe_model(pair.target_model),
            "draft": describe_model(pair.draft_model),
        },
        "prompts": [
            {"name": p.name, "category": p.category, "tokens": len(p.ids), "chat": p.chat, "text": p.text}
            for p in prompts
        ],
        "all_prompt_tokens": list(all_prompt_tokens) if all_prompt_tokens else None,
        "hf_policy": hf_peer.draft_policy(pair.draft_model) if config.hf_assisted else None,
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
            _run_one(
                pair,
                method,
                gamma,
                warm_ids,
                config.temperatures[-1],
                warm_tokens,
                config,
                None,
                llamacpp_model,
            )
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
                            pair,
                            method,
                            gamma,
                            prompt.ids,
                            temperature,
                            config.max_new_tokens,
                            config,
                            seed,
                            llamacpp_model,
                        )
                    except Exception as error:  # HF's assisted path can refuse a pair; keep the rest
                        if method not in (HF_ASSISTED, HF_PLAIN, LLAMACPP_PLAIN):
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
    pair: ModelPair,
    method: str,
    gamma: int,
    ids: Sequence[int],
    temperature: float,
    max_new_tokens: int,
    config: BenchConfig,
    seed: int | None = None,
    llamacpp_model: Any | None = None,
) -> dict[str, Any]:
    seed = config.seed if seed is None else seed
    if method in (PLAIN, SPECULATIVE):
        return run_engine(pair, ids, gamma, temperature, max_new_tokens, seed, config.ignore_eos)
    if method == LLAMACPP_PLAIN:
        return run_llamacpp(llamacpp_model, pair, ids, temperature, max_new_tokens, seed, config.ignore_eos)
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
