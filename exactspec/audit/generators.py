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

from collections.abc import Sequence
from typing import Any

from exactspec.audit.broken import BrokenArgmaxDrafter
from exactspec.audit.generator_base import Generator, Progress, first_tokens, sample_seed
from exactspec.audit.peer_generators import (
    HFAssistedGenerator,
    HFSampleGenerator,
    LlamaCppGenerator,
    OrtGenaiGenerator,
)
from exactspec.decoding.builder import build_scheduler
from exactspec.decoding.engine import SpeculativeEngine
from exactspec.decoding.records import Request
from exactspec.decoding.scheduler import Scheduler
from exactspec.decoding.strategy import CostSource, Strategy
from exactspec.foundations.defaults import DEFAULTS
from exactspec.foundations.settings import SamplingSettings
from exactspec.models.base import LanguageModel
from exactspec.models.pair import ModelPair
from exactspec.peers import llamacpp as llamacpp_peer
from exactspec.peers import ortgenai as ortgenai_peer

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
        threads = getattr(pair.target, "threads", None) or DEFAULTS.threads
        model = ortgenai_peer.load(pair.target.folder, threads=threads)  # type: ignore[attr-defined]
        name = f"ortgenai-ngram gamma={gamma}" if ngram else "ortgenai-plain"
        return OrtGenaiGenerator(model, gamma if ngram else 0, pair.eos_token_ids, name)
    raise ValueError(f"unknown generator {kind!r}; choose from {', '.join(GENERATOR_KINDS)}")
