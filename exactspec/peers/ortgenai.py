"""onnxruntime-genai as a peer: its own `Generator` over an ONNX model folder, run as its users run it.

The folder is one written by onnxruntime-genai's model builder (`model.onnx`, its weights and the
`genai_config.json` the generator reads), such as the onnx backend's export of the target. The package
is the `onnx` extra; `available()` says whether it imports, and nothing else in exactspec needs it.

Two methods, both `og.Generator` driven one `generate_next_token()` per token:

* plain decoding (`generate(..., ngram_tokens=None)`): greedy at temperature 0 (`do_sample=False`),
  else sampled by the generator's own search (temperature, top-k, top-p, repetition penalty) from its own
  `random_seed`;
* n-gram speculative decoding (`ngram_tokens=N`): `GeneratorParams.set_speculative_options(ngram_size=
  NGRAM_SIZE, max_draft_tokens=N)`, the generator's prompt lookup, as its docs/SpeculativeDecoding.md
  advises starting it (ngram_size 3 or 4, max_draft_tokens 4; fixed width, no adaptive K).

Its n-gram verification is exact at every temperature, not greedy-match only: at each position it draws
the target's token from p and keeps the proposal while the draw equals it, which for a one-hot q is
Leviathan et al.'s rule; with the same seed it repeats plain sampling's tokens (the reading of its
source: docs/performance.md, onnxruntime-genai).

EOS: the generator ends a sequence at EOS (`GreedySearch_Cpu::SetNextToken`); an empty EOS list falls back
to the pad token, so it cannot be switched off. When EOS is ignored (the bench's default) the peer appends
the emitted EOS with `Generator.append_tokens` and carries on: the same one-token pass plain decoding's
next step makes, so every run makes exactly `max_new_tokens` tokens like every other side.

Rounds: after each `generate_next_token()` of an n-gram run the generator's cumulative statistics
(`get_speculative_stats`) say whether a speculative round started ("rounds", with its proposed and
accepted draft tokens) or a lookup miss ran a standard step ("standard_fallback_steps"); calls that only
emit a round's buffered tokens start neither. Reading them is cheap beside a model pass.
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exactspec.foundations.defaults import DEFAULTS
from exactspec.foundations.settings import SamplingSettings

__all__ = [
    "GENAI_CONFIG",
    "INSTALL_HINT",
    "NGRAM_SIZE",
    "OrtGenaiModel",
    "available",
    "generate",
    "is_model_folder",
    "load",
    "search_options",
]

NGRAM_SIZE = 3
"""The n-gram decoding's ngram_size: match the last 2 committed tokens (docs/SpeculativeDecoding.md's
'start with ngram_size=3 or 4'; 3 matches as much history as llama-cpp-python's prompt lookup, 2 tokens)."""
GENAI_CONFIG = "genai_config.json"
INSTALL_HINT = 'pip install -e ".[onnx]" (onnxruntime-genai 0.18.0)'


def available() -> bool:
    """True when onnxruntime-genai can be imported."""
    return importlib.util.find_spec("onnxruntime_genai") is not None


def is_model_folder(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a folder the generator can load (it holds the builder's genai_config.json)."""
    return (Path(path) / GENAI_CONFIG).is_file()


@dataclass(frozen=True)
class OrtGenaiModel:
    """An `og.Model` loaded from `folder` with `threads` intra-op threads, and what its config says."""

    folder: Path
    threads: int
    model: Any  # onnxruntime_genai.Model
    vocab_size: int
    context_length: int
    eos_token_ids: tuple[int, ...]
    version: str

    def describe(self) -> str:
        return f"onnxruntime-genai {self.version} on {self.folder.name} ({self.threads} threads)"


def load(folder: str | os.PathLike[str], *, threads: int = DEFAULTS.threads) -> OrtGenaiModel:
    """The generator's model over `folder`, on the CPU with `threads` intra-op threads (set through the
    config's decoder session options; everything else as the builder wrote it)."""
    import onnxruntime_genai as og

    folder = Path(folder).expanduser()
    if not is_model_folder(folder):
        raise FileNotFoundError(f"{folder} holds no {GENAI_CONFIG}: not a model builder export")
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    written = json.loads((folder / GENAI_CONFIG).read_text())["model"]
    config = og.Config(os.fspath(folder))
    config.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": threads}}}}))
    eos = written.get("eos_token_id", [])
    return OrtGenaiModel(
        folder=folder,
        threads=threads,
        model=og.Model(config),
        vocab_size=int(written["vocab_size"]),
        context_length=int(written["context_length"]),
        eos_token_ids=tuple(int(t) for t in (eos if isinstance(eos, list) else [eos])),
        version=og.__version__,
    )


def search_options(settings: SamplingSettings, max_length: int, vocab_size: int, seed: int) -> dict[str, Any]:
    """The generator's search options for `settings` (`GeneratorParams.set_search_options`).

    Greedy at temperature 0; otherwise sampling with the temperature, top-k (0 = off, as ours; capped at
    the vocabulary, which the generator requires), top-p (1 = off) and repetition penalty (Hugging Face's
    rule over the whole sequence, as ours). It has no min-p, no logit bias and no presence or frequency
    penalty: settings with any of them raise ValueError (the bench reports the method as failed at that
    sampling row). `seed` is taken modulo 2**31 (the generator's seed is a 32-bit int; -1 means a random
    one).
    """
    if settings.min_p > 0:
        raise ValueError(f"onnxruntime-genai has no min-p (asked min_p={settings.min_p})")
    if settings.logit_bias:
        raise ValueError("onnxruntime-genai has no logit bias")
    if settings.constraint is not None:  # a peer runs as its users run it: no exactspec constraint
        raise ValueError(
            "onnxruntime-genai is not given exactspec's token constraints; compare it unconstrained"
        )
    if settings.penalises_output:
        raise ValueError("onnxruntime-genai has no presence or frequency penalty")
    options: dict[str, Any] = {
        "max_length": max_length,
        "min_length": 0,
        "num_beams": 1,
        "repetition_penalty": settings.repetition_penalty,
    }
    if settings.temperature == 0:
        return {**options, "do_sample": False}
    return {
        **options,
        "do_sample": True,
        "temperature": settings.temperature,
        "top_k": min(settings.top_k, vocab_size),
        "top_p": settings.top_p,
        "random_seed": seed % 2**31,
    }


def generate(
    model: OrtGenaiModel,
    ids: Sequence[int],
    settings: SamplingSettings,
    max_new_tokens: int,
    *,
    seed: int,
    eos_token_ids: Collection[int] = (),
    ngram_tokens: int | None = None,
) -> dict[str, Any]:
    """Decoding from `ids` by the generator: plain, or n-gram speculative decoding with
    max_draft_tokens=`ngram_tokens`.

    Returns {"tokens", "events": [(perf_counter time, 1)] per token, "finish_reason", "rounds", "stats"}:
    "rounds" is None for plain decoding, else one (proposed, kept) pair per speculative round or standard
    step (a lookup miss: (0, 0)), in order; "stats" the generator's final `get_speculative_stats()` (n-gram
    runs; None for plain). A run stops at `max_new_tokens`, or at a token of `eos_token_ids`; the model's
    own EOS is appended and decoded past when it is not among them (see the module docstring).
    """
    import onnxruntime_genai as og

    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if ngram_tokens is not None and not 1 <= ngram_tokens <= 16:
        raise ValueError(f"max_draft_tokens must lie in 1..16 (the generator's limit), got {ngram_tokens}")
    max_length = len(ids) + max_new_tokens
    if max_length > model.context_length:
        limit = model.context_length
        raise ValueError(f"{len(ids)} + {max_new_tokens} tokens exceed the model's context of {limit}")
    params = og.GeneratorParams(model.model)
    params.set_search_options(**search_options(settings, max_length, model.vocab_size, seed))
    if ngram_tokens is not None:
        params.set_speculative_options(ngram_size=NGRAM_SIZE, max_draft_tokens=ngram_tokens)
    generator = og.Generator(model.model, params)
    generator.append_tokens(list(ids))
    events: list[tuple[float, int]] = []
    tokens: list[int] = []
    rounds: list[tuple[int, int]] | None = None if ngram_tokens is None else []
    seen = _round_counts(generator) if rounds is not None else None
    finish = "length"
    while len(tokens) < max_new_tokens:
        if generator.is_done():  # the model's EOS ended the sequence, and it is not to stop this run
            generator.append_tokens(tokens[-1:])
        generator.generate_next_token()
        events.append((time.perf_counter(), 1))
        token = int(generator.get_next_tokens()[0])
        tokens.append(token)
        if rounds is not None:
            now = _round_counts(generator)
            rounds += _new_rounds(seen, now)
            seen = now
        if token in eos_token_ids:
            finish = "eos"
            break
    stats = dict(generator.get_speculative_stats()) if rounds is not None else None
    return {"tokens": tokens, "events": events, "finish_reason": finish, "rounds": rounds, "stats": stats}


_COUNTS = ("rounds", "standard_fallback_steps", "draft_tokens_proposed", "draft_tokens_accepted")


def _round_counts(generator: Any) -> tuple[int, ...]:
    """The generator's cumulative (rounds, standard steps, proposed, accepted)."""
    stats = generator.get_speculative_stats()
    return tuple(int(stats[name]) for name in _COUNTS)


def _new_rounds(before: tuple[int, ...], after: tuple[int, ...]) -> list[tuple[int, int]]:
    """The (proposed, kept) of what one `generate_next_token` started: a round (its draft tokens' counts),
    a standard step ((0, 0)), or nothing (it emitted a token a round had buffered).

    >>> _new_rounds((2, 5, 6, 3), (3, 5, 10, 4)), _new_rounds((2, 5, 6, 3), (2, 6, 6, 3))
    ([(4, 1)], [(0, 0)])
    >>> _new_rounds((2, 5, 6, 3), (2, 5, 6, 3))
    []
    """
    rounds, steps, proposed, accepted = (a - b for a, b in zip(after, before, strict=True))
    if rounds:  # one call starts at most one round
        return [(proposed, accepted)]
    return [(0, 0)] * steps
