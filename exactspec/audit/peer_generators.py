"""The peers' generators under the audit's `Generator` interface: `transformers` assisted generation and
plain sampling, llama-cpp-python's prompt lookup decoding and plain generation, onnxruntime-genai's n-gram
decoding and plain generation (what each one is: `exactspec.audit.generators`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import torch

from exactspec.audit.generator_base import Progress, first_tokens, sample_seed
from exactspec.foundations.settings import SamplingSettings
from exactspec.peers import hf as hf_peer
from exactspec.peers import llamacpp as llamacpp_peer
from exactspec.peers import ortgenai as ortgenai_peer

# --- transformers -------------------------------------------------------------------------------


class HFAssistedGenerator:
    """transformers' assisted generation with sampling, one sample per `generate` call (batch size 1 only).

    Sample i runs with global seed `sample_seed(seed, i)` (transformers draws from the global
    generator; `exactspec.peers.hf.generate` restores the caller's state afterwards).
    """

    def __init__(
        self, target_model: Any, draft_model: Any, gamma: int, eos_token_ids: Collection[int]
    ) -> None:
        if gamma < 1:
            raise ValueError(f"assisted generation needs gamma >= 1, got {gamma}")
        self.target_model = target_model
        self.draft_model = draft_model
        self.gamma = gamma
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.name = f"hf-assisted gamma={gamma}"

    def sample(
        self,
        prompt: Sequence[int],
        length: int,
        settings: SamplingSettings,
        count: int,
        seed: int,
        max_new_tokens: int | None = None,
        progress: Progress | None = None,
    ) -> list[tuple[int, ...]]:
        budget = max(length, max_new_tokens or length)
        input_ids = torch.tensor([list(prompt)], device=self.target_model.device)  # [1, L]
        samples = []
        for index in range(count):
            output = hf_peer.generate(
                self.target_model,
                input_ids,
                settings,
                budget,
                eos_token_ids=self.eos_token_ids,
                seed=sample_seed(seed, index),
                draft_model=self.draft_model,
                assistant_gamma=self.gamma,
            )  # [1, L + generated]
            generated = output[0, input_ids.shape[1] :].tolist()
            samples.append(first_tokens(generated, length, self.eos_token_ids))
            if progress is not None:
                progress(1)
        return samples

    def details(self) -> dict[str, Any]:
        return {
            "implementation": "transformers assisted generation",
            "gamma": self.gamma,
            "batch_size": 1,
            "num_assistant_tokens_schedule": "constant",
            "assistant_confidence_threshold": 0.0,
        }


class HFSampleGenerator:
    """transformers' plain sampling (`generate(do_sample=True)`, no assistant): the peer's control.

    A batch of B copies of the prompt (no padding needed) is one `generate`
    call under one seed; torch.multinomial draws every row independently.
    """

    def __init__(self, target_model: Any, eos_token_ids: Collection[int], batch_size: int = 1) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.target_model = target_model
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.batch_size = batch_size
        self.name = f"hf-sample batch={batch_size}"

    def sample(
        self,
        prompt: Sequence[int],
        length: int,
        settings: SamplingSettings,
        count: int,
        seed: int,
        max_new_tokens: int | None = None,
        progress: Progress | None = None,
    ) -> list[tuple[int, ...]]:
        budget = max(length, max_new_tokens or length)
        samples: list[tuple[int, ...]] = []
        while len(samples) < count:
            rows = min(self.batch_size, count - len(samples))
            input_ids = torch.tensor([list(prompt)] * rows, device=self.target_model.device)  # [B, L]
            output = hf_peer.generate(
                self.target_model,
                input_ids,
                settings,
                budget,
                eos_token_ids=self.eos_token_ids,
                seed=sample_seed(seed, len(samples)),
            )  # [B, L + generated]
            for row in output[:, input_ids.shape[1] :].tolist():
                samples.append(first_tokens(row, length, self.eos_token_ids))
            if progress is not None:
                progress(rows)
        return samples

    def details(self) -> dict[str, Any]:
        return {"implementation": "transformers sampling", "gamma": 0, "batch_size": self.batch_size}


# --- one sample per call: llama.cpp and onnxruntime-genai ------------------------------------------


class _OneSampleGenerator:
    """A peer that generates one sample per call (batch size 1): sample i is seeded `sample_seed(seed, i)`,
    and the rounds the peer reports (proposed, kept) add up to its acceptance. Subclasses say how one
    sample is generated (`_generate`), what runs (`_implementation`) and what drafts (`_drafts`)."""

    def __init__(self, gamma: int, eos_token_ids: Collection[int], name: str) -> None:
        self.gamma = gamma
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.name = name
        self.proposed = self.kept = self.rounds = 0

    def _generate(self, prompt: Sequence[int], settings: SamplingSettings, budget: int, seed: int) -> dict:
        """{"tokens": the generated ids, "rounds": [(proposed, kept), ...] or None}."""
        raise NotImplementedError

    def _implementation(self) -> str:
        raise NotImplementedError

    def _drafts(self) -> str:
        raise NotImplementedError

    def sample(
        self,
        prompt: Sequence[int],
        length: int,
        settings: SamplingSettings,
        count: int,
        seed: int,
        max_new_tokens: int | None = None,
        progress: Progress | None = None,
    ) -> list[tuple[int, ...]]:
        budget = max(length, max_new_tokens or length)
        samples = []
        for index in range(count):
            out = self._generate(prompt, settings, budget, sample_seed(seed, index))
            samples.append(first_tokens(out["tokens"], length, self.eos_token_ids))
            for proposed, kept in out["rounds"] or ():
                self.proposed += proposed
                self.kept += kept
                self.rounds += 1
            if progress is not None:
                progress(1)
        return samples

    def details(self) -> dict[str, Any]:
        out: dict[str, Any] = {"implementation": self._implementation(), "gamma": self.gamma, "batch_size": 1}
        if self.gamma:
            out["draft_model"] = self._drafts()
            out["acceptance_rate"] = self.kept / self.proposed if self.proposed else float("nan")
            out["proposed_per_round"] = self.proposed / self.rounds if self.rounds else float("nan")
        return out


class LlamaCppGenerator(_OneSampleGenerator):
    """llama-cpp-python's `Llama.generate`, one sample per call (batch size 1), plain or with prompt lookup.

    Sample i sets the Llama's seed to `sample_seed(seed, i)` (llama.cpp's sampler chain draws from
    its own generator, seeded per call). `llm`: a `llama_cpp.Llama` from `exactspec.peers.llamacpp.load`
    (with `lookup_tokens` = gamma for the lookup peer).
    """

    def __init__(self, llm: Any, gamma: int, eos_token_ids: Collection[int], name: str) -> None:
        super().__init__(gamma, eos_token_ids, name)
        self.llm = llm

    def _generate(self, prompt: Sequence[int], settings: SamplingSettings, budget: int, seed: int) -> dict:
        return llamacpp_peer.generate(
            self.llm, prompt, settings, budget, seed=seed, eos_token_ids=self.eos_token_ids
        )

    def _implementation(self) -> str:
        return "llama-cpp-python Llama.generate"

    def _drafts(self) -> str:
        return (
            f"LlamaPromptLookupDecoding(max_ngram_size={llamacpp_peer.LOOKUP_NGRAM}, "
            f"num_pred_tokens={self.gamma})"
        )


class OrtGenaiGenerator(_OneSampleGenerator):
    """onnxruntime-genai's `Generator`, one sample per call (batch size 1), plain or with its n-gram decoding.

    Sample i sets the generator's `random_seed` to `sample_seed(seed, i)`. `model`: an `OrtGenaiModel`
    from `exactspec.peers.ortgenai.load`; `gamma`: the n-gram decoding's max_draft_tokens (0: plain).
    """

    def __init__(
        self, model: ortgenai_peer.OrtGenaiModel, gamma: int, eos_token_ids: Collection[int], name: str
    ) -> None:
        super().__init__(gamma, eos_token_ids, name)
        self.model = model

    def _generate(self, prompt: Sequence[int], settings: SamplingSettings, budget: int, seed: int) -> dict:
        return ortgenai_peer.generate(
            self.model,
            prompt,
            settings,
            budget,
            seed=seed,
            eos_token_ids=self.eos_token_ids,
            ngram_tokens=self.gamma or None,
        )

    def _implementation(self) -> str:
        return self.model.describe()

    def _drafts(self) -> str:
        return f"NGramDecodingStrategy(ngram_size={ortgenai_peer.NGRAM_SIZE}, max_draft_tokens={self.gamma})"


# --- building generators by name ----------------------------------------------------------------
