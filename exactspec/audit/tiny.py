"""Tiny random model pairs small enough to audit in seconds: one per backend that has them (`TINY_PAIRS`).

"hf": real `transformers` models (`tiny_pair`, below); "llamacpp": tiny float32 GGUF files run by
llama.cpp (`tiny_llamacpp_audit_pair`, the GGUF form of a tiny Llama model: `checking.tiny_gguf`).

A random Qwen2 model with the usual 0.02 initialisation is close to uniform over
its vocabulary, which makes a weak test: every sampler looks right on a flat
distribution. The output layer is therefore scaled up (next-token entropy of
one to two nats), and one EOS row is made likely after some histories so that
sequences also end early. The draft is the target with Gaussian noise on every
weight: different from the target (acceptance well below 1) but close enough
that several draft tokens in a row are often accepted. The models come from the one
tiny-model builder, `exactspec.checking.tiny_hf`, in float32.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from transformers import PreTrainedModel

from exactspec.checking.tiny_hf import TinyHFSpec, tiny_hf_pair
from exactspec.models.base import LanguageModel
from exactspec.models.pair import ModelPair


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

    def builder_spec(self) -> TinyHFSpec:
        """The same pair as `checking.tiny_hf` builds it: float32 Qwen2, transformers' 0.02 initialisation."""
        return replace(
            TinyHFSpec(),
            family="qwen2",
            vocab_size=self.vocab_size,
            eos_token_id=self.eos_token_id,
            init_std=0.02,
            logit_scale=self.logit_scale,
            draft_noise=self.draft_noise,
            hidden_size=self.hidden_size,
            layers=self.layers,
            seed=self.seed,
            dtype="float32",
            pad_token_id=self.pad_token_id,
            eos_like=self.eos_like,
            eos_weight=self.eos_weight,
            context=128,
        )


TINY_PROMPT = (5, 7, 11, 3)
"""The prompt the tiny grid audits (no EOS, no pad id)."""


def tiny_pair(spec: TinyPairSpec = TinyPairSpec()) -> tuple[PreTrainedModel, PreTrainedModel]:
    """(target, draft): float32 Qwen2 models in eval mode, same vocabulary, different weights."""
    return tiny_hf_pair(spec.builder_spec())


TINY_GGUF_SPEC = TinyHFSpec(
    family="llama",
    vocab_size=16,
    hidden_size=32,
    layers=2,
    init_std=0.2,
    logit_scale=1.5,
    draft_noise=0.05,
    seed=5,
)
"""The llama.cpp tiny pair: after `TINY_PROMPT` the target's next token has about 2 nats of entropy and the
draft's acceptance min(p, q) summed is 0.75, so rounds keep several draft tokens and reject others."""


@dataclass(frozen=True)
class TinyAuditPair:
    """A tiny pair to audit, with what the report says it is; `reference`: the model of the exact
    probabilities when it is not `pair.reference`."""

    pair: ModelPair
    title: str
    models: str
    reference: LanguageModel | None = None


def tiny_hf_audit_pair() -> TinyAuditPair:
    """`tiny_pair` (random Qwen2 models) as a transformers pair."""
    spec = TinyPairSpec()
    target_model, draft_model = tiny_pair(spec)
    pair = ModelPair.from_models(target_model, draft_model, eos_token_ids={spec.eos_token_id})
    return TinyAuditPair(pair, "tiny random Qwen2 models", f"{spec}")


def tiny_llamacpp_audit_pair() -> TinyAuditPair:
    """`TINY_GGUF_SPEC` as float32 GGUF files run by llama.cpp (one thread, its own KV type and attention),
    written once under the temporary folder the verify grid uses.

    The reference is a second llama.cpp context over the target's file with the pair's settings (one
    thread: on tiny models llama.cpp's threads wait on each other far longer than they compute).
    """
    from exactspec.checking.grid import tiny_gguf_folder
    from exactspec.checking.tiny_gguf import TINY_LLAMACPP_OPTIONS, tiny_llamacpp_pair
    from exactspec.models.llamacpp import LlamaCppModel

    pair, target, draft = tiny_llamacpp_pair(TINY_GGUF_SPEC, tiny_gguf_folder())
    options = {**TINY_LLAMACPP_OPTIONS, "eos_token_ids": pair.eos_token_ids}
    return TinyAuditPair(
        pair,
        "tiny random Llama models (GGUF, llama.cpp)",
        f"{TINY_GGUF_SPEC}: {target.name}, {draft.name}",
        reference=LlamaCppModel(target, **options),
    )


TINY_PAIRS: dict[str, Callable[[], TinyAuditPair]] = {
    "auto": tiny_hf_audit_pair,  # nothing to measure on tiny models: transformers', as before "auto"
    "hf": tiny_hf_audit_pair,
    "llamacpp": tiny_llamacpp_audit_pair,
}
"""`audit --tiny`'s pair for each backend (by registered name) that has tiny models."""
