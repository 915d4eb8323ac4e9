"""The generators under test, behind one interface: draw many samples of the first n tokens.

* `EngineGenerator`: exactspec's engine, speculative (gamma >= 1) or plain
  (gamma = 0, the control), B independent rows per batch, each with its own seed.
* `HFAssistedGenerator`: the peer, `transformers` assisted generation
  (`generate(assistant_model=..., do_sample=True)`), batch size 1.
* `HFSampleGenerator`: plain `transformers` sampling, the peer's own control.
* `BrokenArgmaxDrafter`: a deliberately wrong drafter (argmax token, softmax q)
  that the audit must catch.

Every generator returns sequences in one form: the generated token ids, ending
at the first EOS (kept) or after n tokens, whichever comes first; nothing after
EOS (Hugging Face's padding) is kept. Generation may run past n tokens (a
budget of gamma + 1 tokens lets a whole round happen); only the first n count.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from exactspec.drafters.base import Drafter, Proposal
from exactspec.drafters.model import ModelDrafter
from exactspec.engine import DecodeConfig, SpeculativeEngine
from exactspec.models.base import LanguageModel
from exactspec.sampler import Sampler, SeededSampler
from exactspec.settings import SamplingSettings

Progress = Callable[[int], None]
"""Called with the number of samples just finished (drives a progress bar)."""

SEED_BITS = 32
"""torch's CPU generator (mt19937) keeps only the low 32 bits of a seed: seeds 5 and 2**32 + 5 give the
same stream. Sample seeds are therefore made distinct modulo 2**32."""

_SEED_SPREAD = 2654435761
"""Knuth's multiplicative hash constant: runs with seeds 0, 1, 2, ... start far apart in the 2**32 seeds."""


def sample_seed(seed: int, index: int) -> int:
    """The seed of sample `index` of a run seeded with `seed`: (seed * 2654435761 + index) mod 2**32.

    Within a run the samples' seeds are distinct (N < 2**32); runs with small different seeds use
    disjoint ranges unless N is in the hundreds of millions. Seed 0 gives sample i the seed i.
    """
    return (seed * _SEED_SPREAD + index) % (1 << SEED_BITS)


@runtime_checkable
class Generator(Protocol):
    """Draws `count` independent samples of the first `length` generated tokens after a prompt."""

    name: str

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
        """`count` sequences of the first `length` tokens, each cut at its first EOS; deterministic in `seed`.

        Generation itself runs to `max_new_tokens` (default `length`): by the
        sequence theorem (SPEC.md 3) the first n tokens of a longer generation
        have the same law, and a budget of gamma + 1 lets a full round happen.
        """
        ...

    def details(self) -> dict[str, Any]:
        """Parameters and statistics of the runs so far (gamma, batch size, acceptance rate, ...)."""
        ...


def first_tokens(tokens: Sequence[int], length: int, eos_token_ids: Collection[int]) -> tuple[int, ...]:
    """The first `length` tokens, cut after the first EOS (everything after EOS is padding).

    >>> first_tokens([4, 2, 0, 0], 3, {2}), first_tokens([4, 5, 6, 2], 3, {2})
    ((4, 2), (4, 5, 6))
    """
    for index, token in enumerate(tokens[:length]):
        if token in eos_token_ids:
            return tuple(int(t) for t in tokens[: index + 1])
    return tuple(int(t) for t in tokens[:length])


# --- exactspec ----------------------------------------------------------------------------------


class EngineGenerator:
    """exactspec's `SpeculativeEngine`: batches of B rows with the same prompt, row i seeded on its own.

    With gamma = 0 (no drafter) this is plain target sampling through the same
    engine and transforms: the control that must pass.
    """

    def __init__(
        self,
        target: LanguageModel,
        drafter: Drafter | None,
        gamma: int,
        batch_size: int = 1,
        name: str | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if gamma > 0 and drafter is None:
            raise ValueError("gamma > 0 needs a drafter")
        self.engine = SpeculativeEngine(target, drafter if gamma > 0 else None)
        self.gamma = gamma
        self.batch_size = batch_size
        self.name = name or (f"exactspec gamma={gamma} batch={batch_size}" if gamma else "exactspec plain")

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
        config = DecodeConfig(gamma=self.gamma, max_new_tokens=budget, settings=settings)
        eos = self.engine.target.eos_token_ids
        samples: list[tuple[int, ...]] = []
        while len(samples) < count:
            rows = min(self.batch_size, count - len(samples))
            # One stream per row, seeded by the sample's index: rows never share randomness, and
            # sample i is the same whatever the batch size around it.
            sampler = SeededSampler(seeds=[sample_seed(seed, len(samples) + r) for r in range(rows)])
            states = self.engine.generate([list(prompt)] * rows, config, sampler)
            samples.extend(first_tokens(state.generated, length, eos) for state in states)
            if progress is not None:
                progress(rows)
        return samples

    def details(self) -> dict[str, Any]:
        metrics = self.engine.metrics
        out: dict[str, Any] = {
            "implementation": "exactspec",
            "gamma": self.gamma,
            "batch_size": self.batch_size,
        }
        if self.gamma and metrics.proposed_tokens:
            out["acceptance_rate"] = metrics.acceptance_rate
            out["tokens_per_round"] = metrics.tokens_per_round
        return out


class _ArgmaxSampler:
    """Wraps a Sampler: categorical draws become the argmax (coins pass through)."""

    def __init__(self, inner: Sampler) -> None:
        self.inner = inner

    def categorical(self, probs: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
        return probs.argmax(dim=-1)

    def bernoulli(self, probs: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
        return self.inner.bernoulli(probs, rows)


class BrokenArgmaxDrafter(ModelDrafter):
    """DELIBERATELY WRONG, for demonstrating the audit: proposes the draft's argmax, reports its softmax q.

    SPEC.md 2.7: the q handed to the verifier must be the distribution the token
    was drawn from. Here the token is deterministic (its true q is one-hot) but
    the reported q is the full softmax, so acceptance min(1, p/q) is computed
    with the wrong denominator and the output is not distributed as p.
    """

    def propose(
        self,
        histories: Sequence[Sequence[int]],
        max_tokens: Sequence[int],
        settings: SamplingSettings,
        sampler: Sampler,
        rows: Sequence[int],
    ) -> Proposal:
        return super().propose(histories, max_tokens, settings, _ArgmaxSampler(sampler), rows)


# --- transformers -------------------------------------------------------------------------------


def hf_generation_config(
    settings: SamplingSettings,
    max_new_tokens: int,
    eos_token_ids: Collection[int],
    pad_token_id: int,
) -> Any:
    """A `GenerationConfig` whose logits processors are exactly `settings` (HF's order, HF's definitions).

    Every sampling field is set explicitly, because `generate` fills unset ones
    from the model's generation config and then from global defaults (top_k=50
    among them). `isolated_generation_configs` removes the model's side of that.
    Nothing but EOS and the length limit can stop generation.
    """
    from transformers import GenerationConfig

    bias = [[[int(token)], float(value)] for token, value in sorted(settings.logit_bias.items())]
    return GenerationConfig(
        do_sample=not settings.greedy,
        temperature=1.0 if settings.greedy else settings.temperature,
        top_k=settings.top_k,  # 0 = off; None would become the global default 50
        top_p=settings.top_p,
        min_p=settings.min_p if settings.min_p > 0 else None,
        typical_p=1.0,
        epsilon_cutoff=0.0,
        eta_cutoff=0.0,
        repetition_penalty=settings.repetition_penalty,
        sequence_bias=bias or None,
        no_repeat_ngram_size=0,
        max_new_tokens=max_new_tokens,
        min_new_tokens=0,
        min_length=0,
        eos_token_id=sorted(int(t) for t in eos_token_ids),
        pad_token_id=int(pad_token_id),
        num_beams=1,
        num_return_sequences=1,
        use_cache=True,
        renormalize_logits=False,
        remove_invalid_values=False,
    )


def hf_assistant_config(gamma: int) -> Any:
    """The assistant's own generation config: exactly gamma draft tokens per round, nothing adaptive."""
    from transformers import GenerationConfig

    return GenerationConfig(
        num_assistant_tokens=gamma,
        num_assistant_tokens_schedule="constant",
        assistant_confidence_threshold=0.0,  # 0 turns off the early stop on a low-confidence draft token
    )


@contextlib.contextmanager
def isolated_generation_configs(*pairs: tuple[Any, Any]) -> Iterator[None]:
    """Give each model (model, config) the given generation config for the duration, then restore its own.

    A loaded model's `generation_config` (Qwen2.5-Instruct ships temperature,
    top_p, top_k and repetition_penalty) would otherwise fill every field the
    request leaves unset, on the target and on the assistant.
    """
    from transformers.utils import logging as hf_logging

    saved = [model.generation_config for model, _ in pairs]
    verbosity = hf_logging.get_verbosity()
    try:
        for model, config in pairs:
            model.generation_config = config
        # The assistant's inner generate() warns on every call about its own kwargs; silence it.
        hf_logging.set_verbosity_error()
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        for (model, _), config in zip(pairs, saved, strict=True):
            model.generation_config = config


def _pad_token_id(model: Any, eos_token_ids: Collection[int]) -> int:
    for source in (model.generation_config, model.config):
        value = getattr(source, "pad_token_id", None)
        if isinstance(value, int):
            return value
    return min(eos_token_ids)


class HFAssistedGenerator:
    """transformers' assisted generation with sampling, one sample per `generate` call (batch size 1 only).

    Sample i runs under `torch.manual_seed(sample_seed(seed, i))` inside a
    forked global RNG (transformers draws from the global generator).
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
        self.pad_token_id = _pad_token_id(target_model, self.eos_token_ids)
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
        from transformers import GenerationConfig

        budget = max(length, max_new_tokens or length)
        config = hf_generation_config(settings, budget, self.eos_token_ids, self.pad_token_id)
        input_ids = torch.tensor([list(prompt)], device=self.target_model.device)  # [1, L]
        attention_mask = torch.ones_like(input_ids)
        samples = []
        with isolated_generation_configs(
            (self.target_model, GenerationConfig()), (self.draft_model, hf_assistant_config(self.gamma))
        ):
            for index in range(count):
                with torch.random.fork_rng(devices=[]), torch.inference_mode():
                    torch.manual_seed(sample_seed(seed, index))
                    output = self.target_model.generate(
                        input_ids,
                        attention_mask=attention_mask,
                        generation_config=config,
                        assistant_model=self.draft_model,
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
        self.pad_token_id = _pad_token_id(target_model, self.eos_token_ids)
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
        from transformers import GenerationConfig

        budget = max(length, max_new_tokens or length)
        config = hf_generation_config(settings, budget, self.eos_token_ids, self.pad_token_id)
        samples: list[tuple[int, ...]] = []
        with isolated_generation_configs((self.target_model, GenerationConfig())):
            while len(samples) < count:
                rows = min(self.batch_size, count - len(samples))
                input_ids = torch.tensor([list(prompt)] * rows, device=self.target_model.device)  # [B, L]
                with torch.random.fork_rng(devices=[]), torch.inference_mode():
                    torch.manual_seed(sample_seed(seed, len(samples)))
                    output = self.target_model.generate(
                        input_ids, attention_mask=torch.ones_like(input_ids), generation_config=config
                    )  # [B, L + generated]
                for row in output[:, input_ids.shape[1] :].tolist():
                    samples.append(first_tokens(row, length, self.eos_token_ids))
                if progress is not None:
                    progress(rows)
        return samples

    def details(self) -> dict[str, Any]:
        return {"implementation": "transformers sampling", "gamma": 0, "batch_size": self.batch_size}


# --- building generators by name ----------------------------------------------------------------

GENERATOR_KINDS = ("exactspec", "hf-assisted", "plain", "hf-sample", "broken-argmax")
"""What `--generator` accepts (besides "all"): exactspec's engine, the peer, the two plain-sampling
controls, and the deliberately broken drafter."""

ALL_KINDS = ("exactspec", "hf-assisted", "plain", "hf-sample")
"""What `--generator all` runs (everything but the deliberately broken drafter)."""

SPECULATIVE_KINDS = frozenset({"exactspec", "hf-assisted", "broken-argmax"})


@dataclass
class ModelPair:
    """A target and a draft, as raw Hugging Face models and as exactspec `LanguageModel`s.

    `reference` is a second adapter over the target model, used only for the
    exact probabilities, so that the engine's KV cache rows and the reference's
    never evict each other.
    """

    target_model: Any
    draft_model: Any
    target: LanguageModel
    draft: LanguageModel
    reference: LanguageModel

    @classmethod
    def from_models(cls, target_model: Any, draft_model: Any, eos_token_ids: Collection[int]) -> ModelPair:
        from exactspec.models.hf import HFLanguageModel

        target = HFLanguageModel(target_model, eos_token_ids=eos_token_ids)
        draft = HFLanguageModel(draft_model, eos_token_ids=eos_token_ids)
        if draft.vocab_size > target.vocab_size:
            raise ValueError(
                f"the draft has {draft.vocab_size} output rows, more than the target's {target.vocab_size}"
            )
        reference = HFLanguageModel(target_model, eos_token_ids=eos_token_ids)
        return cls(target_model, draft_model, target, draft, reference)

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self.target.eos_token_ids


def make_generator(kind: str, pair: ModelPair, gamma: int, batch_size: int) -> Generator:
    """The generator `kind` (one of GENERATOR_KINDS) on `pair`."""
    vocab = pair.target.vocab_size
    if kind == "exactspec":
        return EngineGenerator(pair.target, ModelDrafter(pair.draft, vocab), gamma, batch_size)
    if kind == "broken-argmax":
        drafter = BrokenArgmaxDrafter(pair.draft, vocab)
        return EngineGenerator(
            pair.target, drafter, gamma, batch_size, name=f"broken-argmax gamma={gamma} batch={batch_size}"
        )
    if kind == "plain":
        return EngineGenerator(pair.target, None, 0, batch_size, name=f"exactspec plain batch={batch_size}")
    if kind == "hf-assisted":
        return HFAssistedGenerator(pair.target_model, pair.draft_model, gamma, pair.eos_token_ids)
    if kind == "hf-sample":
        return HFSampleGenerator(pair.target_model, pair.eos_token_ids, batch_size)
    raise ValueError(f"unknown generator {kind!r}; choose from {', '.join(GENERATOR_KINDS)}")
