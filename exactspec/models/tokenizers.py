"""Tokenizer facts decoding depends on: do two tokenizers agree on shared ids, which ids end generation."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from exactspec.foundations.errors import InvalidArgument

END_OF_TURN_TOKENS = (
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<|end|>",
    "<end_of_turn>",
)
"""Chat end-of-turn tokens that end generation whenever the tokenizer has them."""


def check_tokenizers_compatible(target_tokenizer: Any, draft_tokenizer: Any) -> None:
    """Raise if the two tokenizers map any shared id to different tokens (docs/algorithm.md 4).

    A draft token id must mean the same text to the target, or accepting it
    would output a different token than the one that was verified.
    """
    target_tokens = {index: token for token, index in target_tokenizer.get_vocab().items()}
    draft_tokens = {index: token for token, index in draft_tokenizer.get_vocab().items()}
    for index in sorted(set(target_tokens) & set(draft_tokens)):
        if target_tokens[index] != draft_tokens[index]:
            raise InvalidArgument(
                f"the draft and target tokenizers disagree on token id {index}: "
                f"target {target_tokens[index]!r}, "
                f"draft {draft_tokens[index]!r}; speculative decoding needs a draft that shares the target's "
                "vocabulary (pick a draft from the same model family)"
            )
    missing = sorted(set(draft_tokens) - set(target_tokens))
    if missing:
        raise InvalidArgument(
            f"the draft tokenizer has id {missing[0]} ({draft_tokens[missing[0]]!r}) that the target lacks; "
            "the draft vocabulary must be a prefix of the target's"
        )


def end_of_generation_ids(tokenizer: Any, model_ids: Iterable[int] = ()) -> frozenset[int]:
    """Every id that ends generation: the model's EOS ids, the tokenizer's, and chat end-of-turn tokens."""
    ids = set(model_ids)
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    vocab = tokenizer.get_vocab()
    ids.update(vocab[token] for token in END_OF_TURN_TOKENS if token in vocab)
    return frozenset(ids)
