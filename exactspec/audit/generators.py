"""The generators under test, behind one interface: draw many samples of the first n tokens.

* `EngineGenerator`: exactspec's scheduler over the engine the builder wires (what serves requests),
  speculative (gamma >= 1) or plain (gamma = 0, the control), B independent rows per batch, each with
  its own seed.
* `HFAssistedGenerator`: the peer, `transformers` assisted generation
  (`generate(assistant_model=..., do_sample=True)`), batch size 1.
* `HFSampleGenerator`: plain `transformers` sampling, the peer's own control.
* `LlamaCppGenerator`: llama-cpp-python's own `Llama.generate` over the target's GGUF file, with
  `LlamaPromptLookupDecoding` (the llama.cpp peer, `llamacpp-lookup`) or plain (its control,
  `llamacpp-plain`), batch size 1; beside a llama.cpp target only, whose reference scores the same
  GGUF file.
* `OrtGenaiGenerator`: onnxruntime-genai's own `Generator` over the target's ONNX export, with its n-gram
  decoding (`ortgenai-ngram`, max_draft_tokens = gamma) or plain (its control, `ortgenai-plain`), batch
  size 1; beside an ONNX target only (`--backend onnx`), whose reference scores the same folder.
* `broken-argmax`: exactspec's engine with `exactspec.audit.broken.BrokenArgmaxDrafter`, a
  deliberately wrong drafter (argmax token, softmax q) that the audit must catch.

Every generator returns sequences in one form: the generated token ids, ending
at the first EOS (kept) or after n tokens, whichever comes first; nothing after
EOS (Hugging Face's padding) is kept. Generation may run past n tokens (a
budget of gamma + 1 tokens lets a whole round happen); only the first n count.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from exactspec.audit.broken import BrokenArgmaxDrafter
from exactspec.decoding.builder import build_scheduler
from exactspec.decoding.engine import SpeculativeEngine
from exactspec.decoding.records import Request
from exactspec.decoding.scheduler import Scheduler
from exactspec.decoding.strategy import CostSource, Strategy
from exactspec.foundations.settings import SamplingSettings
from exactspec.models.base import LanguageModel
from exactspec.models.pair import ModelPair
from exactspec.peers import hf as hf_peer
from exactspec.peers import llamacpp as llamacpp_peer
from exactspec.peers import ortgenai as ortgenai_peer

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
        sequence theorem (docs/algorithm.md 3) the first n tokens of a longer generation
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
    """exactspec's scheduler (what serves requests): batches of B rows with the same prompt, row i seeded on
    its own.

    With gamma = 0 (no drafter) this is plain target sampling through the same
    engine and transforms: the control that must pass.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        gamma: int,
        batch_size: int = 1,
        name: str | None = None,
    ) -> None:
        """scheduler: built by `exactspec.decoding.builder.build_scheduler` (what ships), or around an
        engine built by hand for the deliberately broken control; it runs `batch_size` rows at a time."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if gamma > 0 and scheduler.engine.drafter is None:
            raise ValueError("gamma > 0 needs a drafter")
        self.scheduler = scheduler
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
        eos = self.scheduler.engine.target.eos_token_ids
        samples: list[tuple[int, ...]] = []
        while len(samples) < count:
            rows = min(self.batch_size, count - len(samples))
            # One stream per row, seeded by the sample's index: rows never share randomness, and
            # sample i is the same whatever the batch size around it. gamma None: the scheduler's (the
            # strategy's policy chooses up to it, as for a request that names none).
            handles = [
                self.scheduler.submit(
                    Request(list(prompt), settings, budget, seed=sample_seed(seed, len(samples) + r))
                )
                for r in range(rows)
            ]
            self.scheduler.run_until_idle()
            samples.extend(first_tokens(handle.state.generated, length, eos) for handle in handles)
            if progress is not None:
                progress(rows)
        return samples

    def details(self) -> dict[str, Any]:
        metrics = self.scheduler.metrics
        out: dict[str, Any] = {
            "implementation": "exactspec",
            "gamma": self.gamma,
            "batch_size": self.batch_size,
        }
        if self.gamma and metrics.proposed_tokens:
            out["acceptance_rate"] = metrics.acceptance_rate
            out["tokens_per_round"] = metrics.tokens_per_round
        return out


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


# --- llama.cpp ----------------------------------------------------------------------------------


class LlamaCppGenerator:
    """llama-cpp-python's `Llama.generate`, one sample per call (batch size 1), plain or with prompt lookup.

    Sample i sets the Llama's seed to `sample_seed(seed, i)` (llama.cpp's sampler chain draws from
    its own generator, seeded per call). `llm`: a `llama_cpp.Llama` from `exactspec.peers.llamacpp.load`
    (with `lookup_tokens` = gamma for the lookup peer).
    """

    def __init__(self, llm: Any, gamma: int, eos_token_ids: Collection[int], name: str) -> None:
        self.llm = llm
        self.gamma = gamma
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.name = name
        self.proposed = self.kept = self.rounds = 0

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
            out = llamacpp_peer.generate(
                self.llm,
                prompt,
                settings,
                budget,
                seed=sample_seed(seed, index),
                eos_token_ids=self.eos_token_ids,
            )
            samples.append(first_tokens(out["tokens"], length, self.eos_token_ids))
            for proposed, kept in out["rounds"] or ():
                self.proposed += proposed
                self.kept += kept
                self.rounds += 1
            if progress is not None:
                progress(1)
        return samples

    def details(self) -> dict[str, Any]:
        out: dict[str, Any] = {"implementation": "llama-cpp-python Llama.generate", "gamma": self.gamma}
        out["batch_size"] = 1
        if self.gamma:
            out["draft_model"] = (
                f"LlamaPromptLookupDecoding(max_ngram_size={llamacpp_peer.LOOKUP_NGRAM}, "
                f"num_pred_tokens={self.gamma})"
            )
            out["acceptance_rate"] = self.kept / self.proposed if self.proposed else float("nan")
            out["proposed_per_round"] = self.proposed / self.rounds if self.rounds else float("nan")
        return out


# --- onnxruntime-genai ----------------------------------------------------------------------------


class OrtGenaiGenerator:
    """onnxruntime-genai's `Generator`, one sample per call (batch size 1), plain or with its n-gram decoding.

    Sample i sets the generator's `random_seed` to `sample_seed(seed, i)`. `model`: an `OrtGenaiModel`
    from `exactspec.peers.ortgenai.load`; `gamma`: the n-gram decoding's max_draft_tokens (0: plain).
    """

    def __init__(
        self, model: ortgenai_peer.OrtGenaiModel, gamma: int, eos_token_ids: Collection[int], name: str
    ) -> None:
        self.model = model
        self.gamma = gamma
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.name = name
        self.proposed = self.kept = self.rounds = 0

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
            out = ortgenai_peer.generate(
                self.model,
                prompt,
                settings,
                budget,
                seed=sample_seed(seed, index),
                eos_token_ids=self.eos_token_ids,
                ngram_tokens=self.gamma or None,
            )
            samples.append(first_tokens(out["tokens"], length, self.eos_token_ids))
            for proposed, kept in out["rounds"] or ():
                self.proposed += proposed
                self.kept += kept
                self.rounds += 1
            if progress is not None:
                progress(1)
        return samples

    def details(self) -> dict[str, Any]:
        out: dict[str, Any] = {"implementation": self.model.describe(), "gamma": self.gamma, "batch_size": 1}
        if self.gamma:
            out["draft_model"] = (
                f"NGramDecodingStrategy(ngram_size={ortgenai_peer.NGRAM_SIZE}, max_draft_tokens={self.gamma})"
            )
            out["acceptance_rate"] = self.kept / self.proposed if self.proposed else float("nan")
            out["proposed_per_round"] = self.proposed / self.rounds if self.rounds else float("nan")
        return out


# --- building generators by name ----------------------------------------------------------------

GENERATOR_KINDS = (
    "exactspec",
    "hf-assisted",
    "llamacpp-lookup",
    "plain",
    "hf-sample",
    "llamacpp-plain",
    "ortgenai-ngram",
    "ortgenai-plain",
    "broken-argmax",
)
"""What `--generator` accepts (besides "all"): exactspec's engine, the peers (transformers' assisted
generation, llama-cpp-python's prompt lookup, onnxruntime-genai's n-gram decoding), the plain-sampling
controls (ours, and each peer's own), and the deliberately broken drafter."""

ALL_KINDS = (
    "exactspec",
    "hf-assisted",
    "llamacpp-lookup",
    "ortgenai-ngram",
    "plain",
    "hf-sample",
    "llamacpp-plain",
    "ortgenai-plain",
)
"""What `--generator all` runs (everything but the deliberately broken drafter) where it can run."""

SPECULATIVE_KINDS = frozenset(
    {"exactspec", "hf-assisted", "llamacpp-lookup", "ortgenai-ngram", "broken-argmax"}
)
ONE_ROW_KINDS = frozenset(
    {"hf-assisted", "llamacpp-lookup", "llamacpp-plain", "ortgenai-ngram", "ortgenai-plain"}
)
"""Peers that sample one sequence per call (batch size 1 only)."""
TRANSFORMERS_KINDS = frozenset({"hf-assisted", "hf-sample"})
LLAMACPP_KINDS = frozenset({"llamacpp-lookup", "llamacpp-plain"})
ORTGENAI_KINDS = frozenset({"ortgenai-ngram", "ortgenai-plain"})
DEFAULT_STRATEGY = Strategy(drafter="model", adaptive_gamma=False)
"""What the exactspec generator runs when given no strategy: the draft model, token verification, a
fixed gamma; its reports keep the short generator name."""


def unavailable(kind: str, pair: ModelPair) -> str | None:
    """Why generator `kind` cannot run on `pair` (None when it can).

    The transformers peers run the pair's stock transformers modules; llama-cpp-python's run the
    target's GGUF file, beside a llama.cpp target only (the audit's reference then scores that same
    file: against a transformers reference the two would differ by more than chance); onnxruntime-genai's
    run the target's ONNX export, beside a target loaded from one (`--backend onnx`), for the same reason.
    """
    if kind in TRANSFORMERS_KINDS and pair.target_model is None:
        return f"the {pair.backend} backend loads no transformers modules"
    if kind in LLAMACPP_KINDS:
        from exactspec.models.llamacpp import LlamaCppModel

        if not llamacpp_peer.available():
            return f"llama-cpp-python is not installed ({llamacpp_peer.INSTALL_HINT})"
        if not isinstance(pair.target, LlamaCppModel):
            return (
                "it samples the target's GGUF file through llama-cpp-python: audit it with --backend llamacpp"
            )
    if kind in ORTGENAI_KINDS:
        if not ortgenai_peer.available():
            return f"onnxruntime-genai is not installed ({ortgenai_peer.INSTALL_HINT})"
        folder = getattr(pair.target, "folder", None)
        if folder is None or not ortgenai_peer.is_model_folder(folder):
            return (
                "it samples the target's ONNX export through onnxruntime-genai: audit it with --backend onnx"
            )
    return None


def _scheduler(
    target: LanguageModel,
    draft: LanguageModel | None,
    strategy: Strategy,
    gamma: int,
    batch_size: int,
    costs: CostSource | None = None,
) -> Scheduler:
    """The scheduler every entry point builds (`build_scheduler`), `batch_size` rows at a time; a failed
    round raises out of the audit."""
    return build_scheduler(
        target, draft, strategy, gamma, costs, max_batch=batch_size, max_waiting=0, raise_round_errors=True
    )


def make_generator(
    kind: str, pair: ModelPair, gamma: int, batch_size: int, strategy: Strategy | None = None
) -> Generator:
    """The generator `kind` (one of GENERATOR_KINDS) on `pair`; exactspec's runs `strategy` (default: the
    draft model with token verification), built by the builder every entry point uses."""
    strategy = strategy or DEFAULT_STRATEGY
    why_not = unavailable(kind, pair) if kind in GENERATOR_KINDS else None
    if why_not is not None:
        raise ValueError(f"generator {kind} cannot run on this pair: {why_not}")
    if kind == "exactspec":
        scheduler = _scheduler(pair.target, pair.draft, strategy, gamma, batch_size, pair.cost_model)
        name = f"exactspec {strategy.name} gamma={gamma} batch={batch_size}"
        return EngineGenerator(
            scheduler, gamma, batch_size, name=name if strategy != DEFAULT_STRATEGY else None
        )
    if kind == "broken-argmax":
        # Not a shipped strategy: the deliberately wrong drafter, wired by hand (the audit's control).
        engine = SpeculativeEngine(pair.target, BrokenArgmaxDrafter(pair.draft, pair.target.vocab_size))
        scheduler = Scheduler(engine, gamma=gamma, max_batch=batch_size, raise_round_errors=True)
        return EngineGenerator(
            scheduler, gamma, batch_size, name=f"broken-argmax gamma={gamma} batch={batch_size}"
        )
    if kind == "plain":
        scheduler = _scheduler(pair.target, None, strategy, 0, batch_size)
        return EngineGenerator(scheduler, 0, batch_size, name=f"exactspec plain batch={batch_size}")
    if kind == "hf-assisted":
        return HFAssistedGenerator(pair.target_model, pair.draft_model, gamma, pair.eos_token_ids)
    if kind == "hf-sample":
        return HFSampleGenerator(pair.target_model, pair.eos_token_ids, batch_size)
    if kind in LLAMACPP_KINDS:
        lookup = kind == "llamacpp-lookup"
        path, threads = pair.target.path, pair.target.threads  # type: ignore[attr-defined]
        llm = llamacpp_peer.load(path, threads=threads, lookup_tokens=gamma if lookup else None)
        name = f"llamacpp-lookup gamma={gamma}" if lookup else "llamacpp-plain"
        return LlamaCppGenerator(llm, gamma if lookup else 0, pair.eos_token_ids, name)
    if kind in ORTGENAI_KINDS:
        ngram = kind == "ortgenai-ngram"
        threads = getattr(pair.target, "threads", None) or ortgenai_peer.DEFAULT_THREADS
        model = ortgenai_peer.load(pair.target.folder, threads=threads)  # type: ignore[attr-defined]
        name = f"ortgenai-ngram gamma={gamma}" if ngram else "ortgenai-plain"
        return OrtGenaiGenerator(model, gamma if ngram else 0, pair.eos_token_ids, name)
    raise ValueError(f"unknown generator {kind!r}; choose from {', '.join(GENERATOR_KINDS)}")
