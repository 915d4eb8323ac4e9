"""Tiny random Hugging Face model pairs: real `transformers` models small enough to audit in seconds.

A random Qwen2 model with the usual 0.02 initialisation is close to uniform over
its vocabulary, which makes a weak test: every sampler looks right on a flat
distribution. The output layer is therefore scaled up (next-token entropy of
one to two nats), and one EOS row is made likely after some histories so that
sequences also end early. The draft is the target with Gaussian noise on every
weight: different from the target (acceptance well below 1) but close enough
that several draft tokens in a row are often accepted.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


@dataclass(frozen=True)
class TinyPairSpec:
    """How a tiny (target, draft) pair is built; the same spec always builds the same weights.

    Attributes:
        vocab_size: V, including EOS.
        eos_token_id: the EOS id.
        pad_token_id: the id Hugging Face writes after EOS in a batch (a real token too).
        logit_scale: factor on the output layer's weights (1 gives near-uniform outputs).
        eos_like: the token whose output row EOS copies (scaled by `eos_weight`), so EOS is
            likely exactly where that token is.
        eos_weight: scale of the copied row (below 1: EOS is a little less likely than its twin).
        draft_noise: standard deviation of the draft's weight noise, relative to each tensor's own.
        seed: seeds the target's weights and the draft's noise.
    """

    vocab_size: int = 48
    eos_token_id: int = 2
    pad_token_id: int = 0
    logit_scale: float = 40.0
    eos_like: int = 11
    eos_weight: float = 0.9
    draft_noise: float = 0.15
    hidden_size: int = 32
    layers: int = 2
    seed: int = 0


TINY_PROMPT = (5, 7, 11, 3)
"""The prompt the tiny grid audits (no EOS, no pad id)."""


def tiny_config(spec: TinyPairSpec) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=2 * spec.hidden_size,
        num_hidden_layers=spec.layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        eos_token_id=spec.eos_token_id,
        bos_token_id=spec.eos_token_id,
        pad_token_id=spec.pad_token_id,
        tie_word_embeddings=False,
    )


def tiny_pair(spec: TinyPairSpec = TinyPairSpec()) -> tuple[Qwen2ForCausalLM, Qwen2ForCausalLM]:
    """(target, draft): float32 Qwen2 models in eval mode, same vocabulary, different weights."""
    torch.manual_seed(spec.seed)  # HF initialises weights from the global generator
    target = Qwen2ForCausalLM(tiny_config(spec)).eval()
    with torch.no_grad():
        head = target.lm_head.weight  # [V, hidden]
        head.mul_(spec.logit_scale)
        head[spec.eos_token_id] = spec.eos_weight * head[spec.eos_like]
    draft = copy.deepcopy(target)
    noise = torch.Generator().manual_seed(spec.seed + 1)
    with torch.no_grad():
        for parameter in draft.parameters():
            scale = float(parameter.std()) if parameter.numel() > 1 else 0.0
            if scale > 0:
                parameter.add_(torch.randn(parameter.shape, generator=noise) * spec.draft_noise * scale)
    return target, draft
