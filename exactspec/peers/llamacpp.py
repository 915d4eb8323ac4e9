"""llama.cpp as a peer: plain decoding of a GGUF file through llama-cpp-python, timed like our runs.

An optional extra (`pip install exactspec[llamacpp]`; see the README for the build flags this
CPU needs). `available()` says whether the package imports; nothing else in exactspec needs it.

The same token ids go in as for our engine (the built-in pair's tokenizer is the GGUF's own),
each generated token is timestamped as it comes out, and EOS is ignored unless asked, so a run
makes exactly `max_new_tokens` tokens like every other side of the benchmark.
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Collection, Sequence
from typing import Any

from exactspec.foundations.settings import SamplingSettings
from exactspec.models.llamacpp import INSTALL_HINT

__all__ = ["DEFAULT_CONTEXT", "DEFAULT_THREADS", "INSTALL_HINT", "available", "generate", "load"]

DEFAULT_THREADS = 2
DEFAULT_CONTEXT = 4096


def available() -> bool:
    """True when llama-cpp-python can be imported."""
    return importlib.util.find_spec("llama_cpp") is not None


def load(
    gguf_path: str | os.PathLike[str], *, threads: int = DEFAULT_THREADS, context: int = DEFAULT_CONTEXT
) -> Any:
    """A `llama_cpp.Llama` over the GGUF file, CPU only, `threads` threads, quiet."""
    import llama_cpp

    return llama_cpp.Llama(
        model_path=os.fspath(gguf_path),
        n_ctx=context,
        n_threads=threads,
        n_threads_batch=threads,
        n_gpu_layers=0,
        seed=0,
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
    """Plain decoding from `ids`: {"tokens", "events": [(perf_counter time, 1)] per token, "finish_reason"}.

    Sampling maps onto llama.cpp's sampler chain: temperature (0 = greedy), top-k (0 = off),
    top-p, min-p, repetition penalty. Logit bias is not passed (the bench does not use it).
    """
    llm.reset()
    llm.set_seed(seed)
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
    return {"tokens": tokens, "events": events, "finish_reason": finish}
