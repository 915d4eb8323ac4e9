"""Probe for docs/bench/numerics-two-rows: can a bfloat16 one-token pass be bit-identical to the block pass?

Run: PYTHONPATH=. python scripts/batch_invariance_probe.py  (a random bfloat16 Qwen2 with the
default target's layer shapes, 2 of its 28 layers; no model download; about a minute on 2 cores),
or with --default-target: the built-in 1.5B target in bfloat16, on the first bench prompt.

Two changes together make them bit-identical on this CPU (torch 2.13, oneDNN):
1. one-token passes padded to 2 or more rows (a dummy token after the real one, rolled back by the
   adapter like a rejected draft token): bfloat16 linear layers take a different kernel at M = 1;
2. "rowwise" attention: each query attends, alone, to exactly its valid keys (the same shapes in a
   block pass and in a one-token pass; stock SDPA packs GQA queries differently at q_len = 1).
"""

from __future__ import annotations

import sys
import time

import torch
import torch.nn.functional as F
import transformers
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from exactspec.models.hf.model import HFLanguageModel


def rowwise(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """query [B, H, Q, D], key/value [B, H_kv, K, D], attention_mask [B, 1, Q, K] (True = attend)."""
    batch, heads, queries, dim = query.shape
    groups = heads // key.shape[1]
    out = torch.zeros(batch, queries, heads, dim, dtype=query.dtype)  # [B, Q, H, D]
    for b in range(batch):
        for i in range(queries):
            if attention_mask is None:
                keep = torch.arange(key.shape[2] - queries + i + 1)
            else:
                row = attention_mask[b, 0, i]
                keep = (row if row.dtype == torch.bool else row == 0).nonzero().flatten()
            if len(keep) == 0:
                continue
            k = key[b : b + 1, :, keep].repeat_interleave(groups, 1)
            v = value[b : b + 1, :, keep].repeat_interleave(groups, 1)
            out[b, i] = F.scaled_dot_product_attention(query[b : b + 1, :, i : i + 1], k, v, scale=scaling)[
                0, :, 0
            ]
    return out, None


def main() -> None:
    AttentionInterface.register("rowwise", rowwise)
    AttentionMaskInterface.register("rowwise", sdpa_mask)
    if "--default-target" in sys.argv:
        from exactspec.api.decoder import SpeculativeDecoder
        from exactspec.bench.prompts import PROMPTS
        from exactspec.models.pair import ModelPair

        pair = ModelPair.from_pretrained("default-target", None, dtype="bfloat16", progress=False)
        model = pair.target_model
        ids = SpeculativeDecoder.from_pair(pair).encode([PROMPTS[0].text], chat=PROMPTS[0].chat)[0]
        run(model, ids[:-15], ids[-15:], eos=pair.eos_token_ids)
        return
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=2000,
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=2,
        num_attention_heads=12,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=0,
    )
    model = transformers.Qwen2ForCausalLM(config).to(torch.bfloat16).eval()
    run(model, list(range(3, 60)), [7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61])


def run(model, prompt: list[int], tokens: list[int], eos=None) -> None:
    """Block pass vs one-token passes at 3 blocks of k = 5 positions after `prompt` (15 tokens)."""
    k = 5
    sequence = prompt + tokens
    for attention, pad in (("sdpa", 1), ("sdpa", k), ("rowwise", 1), ("rowwise", 2), ("rowwise", k)):
        model.set_attn_implementation(attention)
        lm = HFLanguageModel(model, eos_token_ids=eos)
        worst, identical, seconds, block_seconds = 0.0, 0, 0.0, 0.0
        for block in range(3):
            start = len(prompt) + block * k
            lm.clear_cache()
            lm.logits([sequence[: start - 1]], 1)
            clock = time.perf_counter()
            block_logits = lm.logits([sequence[: start + k - 1]], k)[0]  # [k, V]
            block_seconds += time.perf_counter() - clock
            for j in range(k):
                lm.clear_cache()
                lm.logits([sequence[: start + j - 1]], 1)
                clock = time.perf_counter()
                single = lm.logits([sequence[: start + j] + [0] * (pad - 1)], pad)[0, 0]  # [V]
                seconds += time.perf_counter() - clock
                diff = float((single - block_logits[j]).abs().max())
                worst, identical = max(worst, diff), identical + (diff == 0.0)
        print(
            f"{attention:8} one-token pass padded to {pad} rows: max |logit diff| {worst:.4g}, "
            f"bit-identical {identical}/15, {1e3 * seconds / 15:.0f} ms per one-token pass, "
            f"{1e3 * block_seconds / 3:.0f} ms per block pass",
            flush=True,
        )


if __name__ == "__main__":
    main()
