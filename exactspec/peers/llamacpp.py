"""llama.cpp as a peer: llama-cpp-python's own generation over a GGUF file, run as its users run it.

An optional extra (`pip install exactspec[llamacpp]`; see the README for the build flags this
CPU needs). `available()` says whether the package imports; nothing else in exactspec needs it.

Two methods, both llama-cpp-python's high-level `Llama.generate`:

* plain decoding (`load(path)`): one token per `Llama.eval`, sampled by llama.cpp's sampler chain;
* prompt lookup decoding (`load(path, lookup_tokens=N)`): `Llama(..., draft_model=
  LlamaPromptLookupDecoding(num_pred_tokens=N))`, as llama-cpp-python's README shows it. Each round
  the draft model proposes up to N tokens that continue the first earlier occurrence of the last
  two tokens, else of the last one (max_ngram_size 2; fewer where the history ends sooner, none when
  nothing matches), one `Llama.eval` scores the pending
  token and the proposal together (the Llama keeps logits of every position), and the sampler chain
  then samples position by position: a proposed token is kept when the token sampled at its position
  equals it, and the first sampled token that differs is emitted in its place and ends the round (the
  cells after it are dropped). The proposal is deterministic (a one-hot q), and every emitted token is
  the sampler's own draw from the target's distribution given the tokens before it, so this rule
  keeps plain sampling's law at every temperature, not only greedy, up to the numerics of a k-token
  pass (docs/performance.md). Its acceptance rate at a position is p(proposed token).

The same token ids go in as for our engine (the built-in pair's tokenizer is the GGUF's own),
each generated token is timestamped as it comes out, and EOS is ignored unless asked, so a run
makes exactly `max_new_tokens` tokens like every other side of the benchmark.
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from exactspec.foundations.defaults import DEFAULTS
from exactspec.foundations.settings import SamplingSettings
from exactspec.models.llamacpp.library import INSTALL_HINT

__all__ = [
    "DEFAULT_CONTEXT",
    "INSTALL_HINT",
    "LOOKUP_NGRAM",
    "LookupRecorder",
    "available",
    "generate",
    "load",
    "time_eval",
]

DEFAULT_CONTEXT = 4096
LOOKUP_NGRAM = 2
"""`LlamaPromptLookupDecoding`'s max_ngram_size: its default, which llama-cpp-python's README keeps."""

RANDOM_SEED = 0xFFFFFFFF
"""llama.cpp's LLAMA_DEFAULT_SEED: a sampler given it seeds itself at random."""


def available() -> bool:
    """True when llama-cpp-python can be imported."""
    return importlib.util.find_spec("llama_cpp") is not None


@dataclass
class LookupRecorder:
    """`LlamaPromptLookupDecoding` as the Llama calls it, with every proposal noted on the way out.

    The Llama calls its draft model with the tokens so far (prompt and generated) and drafts what it
    returns; this passes the call on unchanged and keeps (tokens so far, proposal) per call, from which
    `generate` counts each round's proposed and kept tokens. `lookup`: the `LlamaPromptLookupDecoding`.
    """

    lookup: Any
    proposals: list[tuple[int, list[int]]] = field(default_factory=list)

    def __call__(self, input_ids: Any, /, **kwargs: Any) -> Any:
        drafted = self.lookup(input_ids, **kwargs)
        self.proposals.append((len(input_ids), [int(t) for t in drafted]))
        return drafted

    @property
    def num_pred_tokens(self) -> int:
        return int(self.lookup.num_pred_tokens)


def load(
    gguf_path: str | os.PathLike[str],
    *,
    threads: int = DEFAULTS.threads,
    context: int = DEFAULT_CONTEXT,
    lookup_tokens: int | None = None,
) -> Any:
    """A `llama_cpp.Llama` over the GGUF file, CPU only, `threads` threads, quiet; with `lookup_tokens`, the
    prompt lookup decoding peer (`draft_model=LlamaPromptLookupDecoding(num_pred_tokens=lookup_tokens)`,
    seen through a `LookupRecorder`)."""
    import llama_cpp
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    if lookup_tokens is not None and lookup_tokens < 1:
        raise ValueError(f"lookup_tokens must be >= 1, got {lookup_tokens}")
    draft_model = None
    if lookup_tokens is not None:
        lookup = LlamaPromptLookupDecoding(max_ngram_size=LOOKUP_NGRAM, num_pred_tokens=lookup_tokens)
        draft_model = LookupRecorder(lookup)
    return llama_cpp.Llama(
        model_path=os.fspath(gguf_path),
        n_ctx=context,
        n_threads=threads,
        n_threads_batch=threads,
        n_gpu_layers=0,
        seed=0,
        draft_model=draft_model,
        # llama-cpp-python 0.3.36 keeps logits of every position once a draft model is set, but sizes its
        # scores buffer from this argument: without it a prompt longer than n_batch (512) fails to
        # evaluate ("could not broadcast input array ... into shape (0,)").
        logits_all=draft_model is not None,
        verbose=False,
    )


def generate(
    llm: Any,
    ids: Sequence[int],
    settings: SamplingSettings,
    max_new_tokens: int,
    *,
    seed: int,
    eos_token_ids: Collection[int] = (),
) -> dict[str, Any]:
    """Decoding from `ids` as `llm` does it (plain, or prompt lookup when it was loaded with it).

    Returns {"tokens", "events": [(perf_counter time, 1)] per token, "finish_reason", "rounds"}:
    "rounds" is None for plain decoding, else one (proposed, kept) pair per proposal (a proposal of
    0 tokens is a plain step). Sampling maps onto llama.cpp's sampler chain: temperature (0 =
    greedy), top-k (0 = off), top-p, min-p, repetition penalty. Logit bias is not passed (the bench
    does not use it). `seed` is taken modulo 2**32 - 1 (llama.cpp's 2**32 - 1 means a random seed).
    """
    if settings.constraint is not None:  # a peer runs as its users run it: no exactspec constraint
        raise ValueError(
            "llama.cpp's generation is not given exactspec's token constraints; compare it unconstrained"
        )
    if settings.penalises_output:
        # llama.cpp's penalties count the last tokens of the whole context, prompt included: not OpenAI's.
        raise ValueError("llama.cpp's presence and frequency penalties count the prompt too; not comparable")
    draft_model = getattr(llm, "draft_model", None)
    recorder = draft_model if isinstance(draft_model, LookupRecorder) else None
    if recorder is not None:
        recorder.proposals.clear()
    llm.reset()
    llm.set_seed(seed % RANDOM_SEED)
    events: list[tuple[float, int]] = []
    tokens: list[int] = []
    finish = "length"
    for token in llm.generate(
        list(ids),
        top_k=settings.top_k,
        top_p=settings.top_p,
        min_p=settings.min_p,
        temp=settings.temperature,
        repeat_penalty=settings.repetition_penalty,
        reset=True,
    ):
        events.append((time.perf_counter(), 1))
        tokens.append(int(token))
        if int(token) in eos_token_ids:
            finish = "eos"
            break
        if len(tokens) >= max_new_tokens:
            break
    rounds = None
    if recorder is not None:
        rounds = [_kept(proposal, tokens[seen - len(ids) :]) for seen, proposal in recorder.proposals]
    return {"tokens": tokens, "events": events, "finish_reason": finish, "rounds": rounds}


def _kept(proposal: list[int], following: list[int]) -> tuple[int, int]:
    """(proposed, kept) of one proposal: kept = how many of its first tokens the generation then emitted.

    >>> _kept([4, 5, 6], [4, 5, 9, 1]), _kept([], [4])
    ((3, 2), (0, 0))
    """
    kept = 0
    for drafted, emitted in zip(proposal, following, strict=False):
        if drafted != emitted:
            break
        kept += 1
    return len(proposal), kept


def time_eval(
    llm: Any, context: Sequence[int], max_k: int, repeats: int, draft: Any | None = None
) -> tuple[dict[int, tuple[float, ...]], tuple[float, ...]]:
    """Seconds of `llm.eval` on k tokens over a warm cache of len(context) - k tokens, k = 1..max_k, and of
    `draft.eval` on one token (empty without a draft Llama), after all of the target's.

    The procedure of `exactspec.models.costs.measure_cost_model` for llama-cpp-python's own passes: the
    context is evaluated once (untimed), then each timed call drops the last k cached tokens (the
    Llama's n_tokens, as `Llama.generate` sets it to reuse a cached prefix) and evaluates them again.
    A Llama loaded for prompt lookup keeps logits of every position (what its verification pays); a
    plain one of the last only. Both Llamas are reset afterwards.
    """
    history = [int(t) for t in context]
    if len(history) <= max_k:
        raise ValueError(f"the cost context needs more than {max_k} tokens, got {len(history)}")
    llamas = [m for m in (llm, draft) if m is not None]
    for model in llamas:
        model.reset()
        model.eval(history)  # prefill, untimed
    llm.n_tokens = len(history) - min(2, max_k)
    llm.eval(history[-min(2, max_k) :])  # untimed: first-call allocations
    target: dict[int, list[float]] = {k: [] for k in range(1, max_k + 1)}
    steps: list[float] = []
    for _ in range(repeats):
        for k in range(1, max_k + 1):
            llm.n_tokens = len(history) - k
            started = time.perf_counter()
            llm.eval(history[-k:])
            target[k].append(time.perf_counter() - started)
    if draft is not None:  # after the target's passes, as in `bench.costs.measure_costs`
        for _ in range(repeats * max_k):
            draft.n_tokens = len(history) - 1
            started = time.perf_counter()
            draft.eval(history[-1:])
            steps.append(time.perf_counter() - started)
    for model in llamas:
        model.reset()
    return {k: tuple(v) for k, v in target.items()}, tuple(steps)
