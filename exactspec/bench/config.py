"""What a bench run is asked to run: `BenchConfig` (methods, gammas, sampling rows, lengths, trials) and the
prompts as token ids (`EncodedPrompt`), with the defaults of the full and the quick run."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from exactspec.bench.methods import (
    HF_ASSISTED,
    HF_PLAIN,
    LLAMACPP_LOOKUP,
    LLAMACPP_PLAIN,
    NAMED_SETTINGS,
    ORTGENAI_NGRAM,
    ORTGENAI_PLAIN,
    PLAIN,
    SPECULATIVE,
    SamplingRow,
    is_engine_method,
    strategy_of,
)
from exactspec.foundations.records import JsonRecord
from exactspec.foundations.settings import SamplingSettings

DEFAULT_GAMMAS = (1, 2, 4, 6, 8)
BENCH_TEMPERATURES = (0.0, 0.7)
"""The bench's sampling rows: greedy, and sampled at the temperature of common use."""
DEFAULT_MAX_NEW_TOKENS = 128
QUICK_GAMMAS = (2, 4)
QUICK_MAX_NEW_TOKENS = 32


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
    num_pred_tokens of `llamacpp_lookup`, then onnxruntime-genai's plain decoding (`ortgenai`) and its
    n-gram decoding at each max_draft_tokens of `ortgenai_ngram`. Sampling rows: one per temperature,
    then each of `named_settings` (keys of `NAMED_SETTINGS`).
    """

    gammas: tuple[int, ...] = DEFAULT_GAMMAS
    temperatures: tuple[float, ...] = BENCH_TEMPERATURES
    method: str = SPECULATIVE
    extra_methods: tuple[tuple[str, int], ...] = ()
    named_settings: tuple[str, ...] = ()
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    seed: int = 0
    hf_assisted: bool = True
    hf_plain: bool = True
    llamacpp: bool = False  # plain llama.cpp on the target's GGUF (run_bench gets the loaded model)
    llamacpp_lookup: tuple[int, ...] = ()  # LlamaPromptLookupDecoding's num_pred_tokens, one method each
    ortgenai: bool = False  # onnxruntime-genai's plain decoding on an ONNX model folder (run_bench gets it)
    ortgenai_ngram: tuple[int, ...] = ()  # its n-gram decoding's max_draft_tokens, one method each
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
        if any(not 1 <= n <= 16 for n in self.ortgenai_ngram):
            raise ValueError(f"ortgenai_ngram holds max_draft_tokens in 1..16, got {self.ortgenai_ngram}")

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
        if self.ortgenai:
            order.append((ORTGENAI_PLAIN, 0))
        order += [(ORTGENAI_NGRAM, n) for n in dict.fromkeys(self.ortgenai_ngram)]
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


@dataclass(frozen=True)
class EncodedPrompt:
    name: str
    category: str
    ids: list[int]
    text: str | None = None
    chat: bool = False
