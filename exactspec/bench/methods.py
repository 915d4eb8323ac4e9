"""The bench's methods and sampling rows, by the names bench.json, the report and `--methods` use.

A *method* is plain decoding, one of our engine's strategies (`exactspec.decoding.strategy`: the draft
model with token or block verification, prompt lookup, hybrid, adaptive gamma; named "speculative",
"speculative-block", "ngram", "hybrid", "adaptive", ...) at a gamma, or a peer: transformers' assisted
generation and plain `generate`, llama-cpp-python's plain decoding and its prompt lookup decoding,
onnxruntime-genai's plain decoding and its n-gram speculative decoding. A
*sampling row* is a named `SamplingSettings`: one per temperature ("0", "0.7") plus named rows such as
"realistic" (`NAMED_SETTINGS`).
"""

from __future__ import annotations

from dataclasses import dataclass

from exactspec.decoding.strategy import Strategy
from exactspec.foundations.settings import REALISTIC_CHAT_SETTINGS, SamplingSettings

PLAIN, SPECULATIVE, HF_ASSISTED, HF_PLAIN = "plain", "speculative", "hf-assisted", "hf-plain"
SPECULATIVE_BLOCK, ADAPTIVE = "speculative-block", "adaptive"
LLAMACPP_PLAIN, LLAMACPP_LOOKUP = "llamacpp-plain", "llamacpp-lookup"
ORTGENAI_PLAIN, ORTGENAI_NGRAM = "ortgenai-plain", "ortgenai-ngram"
PEER_METHODS = (HF_ASSISTED, HF_PLAIN, LLAMACPP_PLAIN, LLAMACPP_LOOKUP, ORTGENAI_PLAIN, ORTGENAI_NGRAM)
LLAMACPP_METHODS = (LLAMACPP_PLAIN, LLAMACPP_LOOKUP)
ORTGENAI_METHODS = (ORTGENAI_PLAIN, ORTGENAI_NGRAM)
"""Methods that run another system; every other method is plain decoding or one of our strategies, named
as `Strategy.name` names them (`decoding.strategy.all_strategies`, from the drafter registry)."""

NAMED_SETTINGS: dict[str, SamplingSettings] = {"realistic": REALISTIC_CHAT_SETTINGS}
"""Sampling rows that are more than a temperature, by the name `--settings` and the report use."""


def is_engine_method(method: str) -> bool:
    """Plain decoding or one of our engine's strategies (not a peer: transformers, llama.cpp or
    onnxruntime-genai)."""
    return method not in PEER_METHODS


def strategy_of(method: str) -> Strategy:
    """The engine strategy of a method name (plain decoding: the default, at gamma 0)."""
    return Strategy() if method == PLAIN else Strategy.from_name(method)


@dataclass(frozen=True)
class SamplingRow:
    """One row of the report: a name ("0", "0.7", "realistic") and the settings every method samples with."""

    name: str
    settings: SamplingSettings


def label(method: str, gamma: int) -> str:
    """`speculative gamma=4`, `speculative-block gamma=4`, `adaptive gamma<=4`, `plain (ours, gamma=0)`."""
    fixed = {
        PLAIN: "plain (ours, gamma=0)",
        HF_ASSISTED: "HF assisted",
        HF_PLAIN: "HF plain generate",
        LLAMACPP_PLAIN: "llama.cpp plain",
        ORTGENAI_PLAIN: "onnxruntime-genai plain",
    }
    if method in fixed:
        return fixed[method]
    if method == LLAMACPP_LOOKUP:
        return f"llama.cpp lookup num_pred_tokens={gamma}"
    if method == ORTGENAI_NGRAM:
        return f"onnxruntime-genai ngram max_draft_tokens={gamma}"
    return f"{method} gamma{'<=' if strategy_of(method).adaptive_gamma else '='}{gamma}"
