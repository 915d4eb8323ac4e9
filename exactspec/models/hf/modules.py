"""What exactspec reads from a transformers causal LM module, without importing transformers itself: its
structural copy (what an adapter switches), its logits rows and its end-of-generation ids.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

import torch


def module_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A structural copy of `model`: new module objects (and config), the very same parameter and buffer
    tensors. Switching the copy's classes, attention or config leaves `model` untouched; no weight is
    duplicated (tied weights stay tied, since the memo maps each tensor to itself)."""
    shared = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    return copy.deepcopy(model, shared)


def output_rows(model: Any) -> int:
    """Rows of the model's logits: the output layer's size, else the config's vocab_size."""
    head = model.get_output_embeddings()
    weight = getattr(head, "weight", None)
    if weight is not None:
        return int(weight.shape[0])
    return int(model.config.get_text_config().vocab_size)


def model_eos_ids(model: Any) -> frozenset[int]:
    """EOS ids named by the model's generation config and config (may be empty)."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config.get_text_config()):
        value = getattr(source, "eos_token_id", None)
        if value is None:
            continue
        ids.update([value] if isinstance(value, int) else value)
    return frozenset(int(t) for t in ids)
