"""Tiny random model pairs small enough to audit in seconds: one per backend that has them
(`tiny_audit_pair`: the backend's registration says how it runs tiny models, `Backend.tiny`).

The models are random transformers models (`tiny_pair`, below) that each backend turns into its own
pair (transformers runs them as they are; a GGUF backend writes them as GGUF files first); a backend
may ask for another architecture or size (`TinyModels.audit_spec`).

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

from dataclasses import dataclass, replace

from transformers import PreTrainedModel

from exactspec.checking.tiny_hf import TinyHFSpec, tiny_hf_pair
from exactspec.models.backends.registry import backend, backends
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


@dataclass(frozen=True)
class TinyAuditPair:
    """A tiny pair to audit, with what the report says it is; `reference`: the model of the exact
    probabilities when it is not `pair.reference`."""

    pair: ModelPair
    title: str
    models: str
    reference: LanguageModel | None = None


def tiny_backends() -> list[str]:
    """The backends `audit --tiny` can run, by rank: those with tiny models that run here, and those
    that choose among the others (`Backend.chooses`: "auto" runs the first of them)."""
    found = [b.name for b in backends().values() if b.tiny is not None and b.unavailable() is None]
    return [b.name for b in backends().values() if b.name in found or (b.chooses and found)]


def tiny_audit_pair(name: str) -> TinyAuditPair:
    """The tiny pair of backend `name` (one of `tiny_backends()`): `TinyPairSpec`'s random models, with the
    fields the backend changes (`TinyModels.audit_spec`), as the backend runs them."""
    chosen = backend(name)
    if chosen.tiny is None:  # a backend that chooses: nothing to measure on tiny models, the first one's
        chosen = backend(next(n for n in tiny_backends() if backend(n).tiny is not None))
    assert chosen.tiny is not None
    spec = replace(TinyPairSpec().builder_spec(), **dict(chosen.tiny.audit_spec))
    target, draft = tiny_hf_pair(spec)
    tiny = chosen.tiny.pair(target, draft, spec.eos_token_id)
    return TinyAuditPair(tiny.pair, tiny.title, f"{spec}", tiny.reference)
