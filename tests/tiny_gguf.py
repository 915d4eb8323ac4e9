"""Tiny random GGUF models (llama architecture, float32), so the llama.cpp backend can be checked exactly.

Each file is the GGUF form of a tiny Hugging Face Llama model (`tiny_hf`), written by
`models.llamacpp.gguf_writer` (which says how); the float64 module of the same spec is the reference.
"""

from __future__ import annotations

import os
from pathlib import Path

from transformers import PreTrainedModel

from exactspec.checking.tiny_hf import TinyHFSpec, tiny_hf_pair
from exactspec.models.llamacpp.gguf_writer import CONTEXT_LENGTH, gguf_file, token_texts, write_gguf

__all__ = ["CONTEXT_LENGTH", "tiny_gguf_pair", "token_texts", "write_gguf"]


def tiny_gguf_pair(
    spec: TinyHFSpec, folder: str | os.PathLike[str]
) -> tuple[Path, Path, PreTrainedModel, PreTrainedModel]:
    """(target GGUF, draft GGUF, target HF module, draft HF module) for a llama-family `spec`, written
    into `folder` (a file already there is reused: same weights, same file)."""
    if spec.family != "llama":
        raise ValueError(f"tiny GGUF pairs are llama models; spec.family is {spec.family!r}")
    target, draft = tiny_hf_pair(spec)
    return (
        gguf_file(target, spec.eos_token_id, folder),
        gguf_file(draft, spec.eos_token_id, folder),
        target,
        draft,
    )
