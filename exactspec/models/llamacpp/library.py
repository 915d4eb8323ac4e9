"""llama-cpp-python for the llama.cpp adapter (`models.llamacpp.model`): whether it is installed and how to
install it, its module loaded once with its backend initialised and its log quiet, the KV cache types,
and the check that a tokenizer's ids mean the same tokens in a GGUF vocabulary.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from typing import Any

INSTALL_HINT = (
    "from a clone, make setup-llamacpp (scripts/setup.sh --llamacpp) compiles llama-cpp-python 0.3.36 "
    "with the flags this CPU needs and keeps the wheel (a compile of minutes on 2 cores, once per machine; "
    "docs/install.md); elsewhere "
    'CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=ON -DLLAVA_BUILD=OFF" pip install "exactspec[llamacpp]" '
    'on a CPU with avx512f, else CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON '
    '-DLLAVA_BUILD=OFF" (a native -march=native build segfaults on its first decode on some CPUs)'
)
"""How to install llama-cpp-python, in every message that finds it missing (`--backend llamacpp`, the
bench's llama.cpp peer, `--backend auto` leaving llama.cpp out)."""

KV_TYPES = {"f16": 1, "f32": 0}
"""KV cache element types (ggml type ids): f16 is llama.cpp's default; f32 for float32 references."""

_backend_lock = threading.Lock()
_backend_ready = False


class LlamaCppUnavailable(ImportError):
    """llama-cpp-python is not installed; the message says how to install it."""


def available() -> bool:
    """True when llama-cpp-python can be imported."""
    return importlib.util.find_spec("llama_cpp") is not None


def llama_cpp() -> Any:
    """The `llama_cpp` module, its backend initialised once per process and its log quiet."""
    global _backend_ready
    try:
        import llama_cpp
        from llama_cpp import _logger
    except ImportError as error:
        raise LlamaCppUnavailable(
            f"the llama.cpp backend needs llama-cpp-python, which is not installed: {INSTALL_HINT}"
        ) from error
    with _backend_lock:
        if not _backend_ready:
            # llama.cpp logs every load at INFO to stderr otherwise, and the built-in pair's vocabulary
            # draws a harmless ERROR line ("control-looking token ... not control-type") at each load;
            # what fails is reported by the exceptions raised here instead.
            _logger.set_verbose(False)
            _logger.logger.setLevel(logging.CRITICAL)
            llama_cpp.llama_backend_init()
            _backend_ready = True
    return llama_cpp


def check_vocabulary(tokenizer: Any, model: Any) -> None:
    """Raise ValueError unless every id of `tokenizer`'s vocabulary names the same token in the GGUF.

    The engine tokenizes with the tokenizer exactspec loads for the spec (models.loading) and the
    llama.cpp model scores ids: an id that means another token to the GGUF would score the wrong text.
    """
    vocab = tokenizer.get_vocab()  # token -> id
    if len(vocab) > model.vocab_size:
        raise ValueError(
            f"the tokenizer has {len(vocab)} tokens, the GGUF model {model.path.name} only {model.vocab_size}"
        )
    for token, index in sorted(vocab.items(), key=lambda item: item[1]):
        if index >= model.vocab_size:
            raise ValueError(
                f"the tokenizer's id {index} ({token!r}) is outside {model.path.name}'s vocabulary"
            )
        gguf_token = model.token_text(index)
        if gguf_token != token:
            raise ValueError(
                f"the tokenizer and the GGUF vocabulary of {model.path.name} disagree on id {index}: "
                f"tokenizer {token!r}, GGUF {gguf_token!r}; load the tokenizer from the same model"
            )
