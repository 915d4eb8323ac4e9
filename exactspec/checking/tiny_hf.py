"""Tiny Hugging Face pairs: float64 ones so that `exactspec verify` enumerates the real model adapter, and the
float32 ones `exactspec audit --tiny` samples (`exactspec.audit.tiny`): one builder for both.

The exact grid's toy models are tables; they never touch `HFLanguageModel`
(KV cache rows, rollback by bookkeeping, holes, compaction, position ids).
These builders make real `transformers` models (Qwen2 and Llama) that are
small enough to run thousands of times per grid case: vocabulary of at most 6
ids including EOS, 2 layers, hidden size 16, all in float64 so that the
adapter's logits are exact to float64 rounding.

A random model with the usual 0.02 initialisation is almost uniform and
almost independent of the history, so an adapter bug (a wrong position, a
stale cache slot) would change its output by very little. The weights are
therefore drawn wider (`init_std`) and the output layer is scaled
(`logit_scale`), so the next-token distribution is far from uniform and
depends on every earlier token and its position. The draft is the target
with Gaussian noise on every weight: different enough that rejections are
common, close enough that several tokens in a row are accepted.

`FullForwardModel` is the reference: one no-cache forward over each whole
history, the simplest scoring that is obviously right. The grid computes the
target's distribution with it, so an adapter bug cannot cancel out.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel, Qwen2Config, Qwen2ForCausalLM

from exactspec.models.base import StatelessModel

FAMILIES = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}


@dataclass(frozen=True)
class TinyHFSpec:
    """How a tiny float64 (target, draft) pair is built; the same spec always gives the same weights.

    Attributes:
        family: "qwen2" or "llama" (the architecture of both models).
        vocab_size: V, EOS included (at most 6 keeps the enumeration small).
        eos_token_id: the EOS id.
        init_std: standard deviation of the random weights (0.02 gives near-uniform outputs).
        logit_scale: factor on the output layer's weights.
        draft_noise: standard deviation of the draft's weight noise, relative to each tensor's own.
        draft_logit_scale: extra factor on the draft's output layer. Above 1 the draft is sharper
            than the target; with min-p on, its q then keeps one or two ids where p keeps more,
            which bounds how many draft blocks the enumeration has to follow (rejections still
            happen: p(x) < 1 for the proposed x).
        seed: seeds the target's weights and the draft's noise.
        dtype: "float64" (the exact grid: logits exact to float64 rounding) or "float32" (the audit's
            real-model stand-in).
        pad_token_id: the id Hugging Face writes after EOS in a batch (default the EOS id).
        eos_like, eos_weight: if set, EOS's output row becomes eos_weight x the row of `eos_like`, so
            EOS is likely exactly where that token is and sequences also end early.
        context: the model's maximum positions.
    """

    family: str = "qwen2"
    vocab_size: int = 4
    eos_token_id: int = 0
    init_std: float = 0.2
    logit_scale: float = 1.0
    draft_noise: float = 0.3
    draft_logit_scale: float = 1.0
    hidden_size: int = 16
    layers: int = 2
    seed: int = 0
    dtype: str = "float64"
    pad_token_id: int | None = None
    eos_like: int | None = None
    eos_weight: float = 1.0
    context: int = 64


def tiny_hf_model(spec: TinyHFSpec) -> PreTrainedModel:
    """The target: a random float64 causal LM in eval mode (4 query heads, 2 KV heads)."""
    config_class, model_class = FAMILIES[spec.family]
    config = config_class(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=2 * spec.hidden_size,
        num_hidden_layers=spec.layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=spec.context,
        initializer_range=spec.init_std,
        eos_token_id=spec.eos_token_id,
        bos_token_id=spec.eos_token_id,
        pad_token_id=spec.eos_token_id if spec.pad_token_id is None else spec.pad_token_id,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    torch.manual_seed(spec.seed)  # transformers initialises weights from the global generator
    model = model_class(config).to(getattr(torch, spec.dtype)).eval()
    with torch.no_grad():
        head = model.lm_head.weight  # [V, hidden]
        head.mul_(spec.logit_scale)
        if spec.eos_like is not None:
            head[spec.eos_token_id] = spec.eos_weight * head[spec.eos_like]
    return model


def tiny_hf_pair(spec: TinyHFSpec) -> tuple[PreTrainedModel, PreTrainedModel]:
    """(target, draft): float64 models of the same architecture and vocabulary, different weights."""
    target = tiny_hf_model(spec)
    draft = copy.deepcopy(target)
    noise = torch.Generator().manual_seed(spec.seed + 1)
    with torch.no_grad():
        for parameter in draft.parameters():
            scale = float(parameter.std()) if parameter.numel() > 1 else 0.0
            if scale > 0:
                noise_draw = torch.randn(parameter.shape, generator=noise, dtype=parameter.dtype)
                parameter.add_(noise_draw * spec.draft_noise * scale)
        draft.lm_head.weight.mul_(spec.draft_logit_scale)
    return target, draft


class FullForwardModel(StatelessModel):
    """A `LanguageModel` that runs one no-cache forward over each whole history (the reference)."""

    def __init__(self, model: PreTrainedModel, eos_token_ids: frozenset[int], vocab_size: int) -> None:
        self._model = model.eval()
        self._eos_token_ids = frozenset(eos_token_ids)
        self._vocab_size = vocab_size

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._eos_token_ids

    def logits(
        self,
        histories: Sequence[Sequence[int]],
        num_positions: int = 1,
        rows: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """[B, k, V] logits, each row scored alone from scratch (no cache, no padding)."""
        k = num_positions
        out = []
        with torch.inference_mode():
            for history in histories:
                ids = torch.tensor([list(history)])  # [1, n]
                out.append(self._model(input_ids=ids, use_cache=False).logits[0, -k:, : self._vocab_size])
        return torch.stack(out)  # [B, k, V]
