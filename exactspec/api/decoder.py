"""The Python API: load a target/draft pair once, then generate (or stream) text.

>>> from exactspec import SpeculativeDecoder, SamplingSettings   # doctest: +SKIP
>>> decoder = SpeculativeDecoder.from_pretrained()               # the built-in Qwen2.5-Coder pair
>>> out = decoder.generate(["def quicksort(xs):"], gamma=4, max_new_tokens=64,
...                        settings=SamplingSettings(temperature=0.7), seed=1)
>>> out.completions[0].text, out.completions[0].finish_reason, out.metrics.acceptance_rate
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from exactspec.api.text import StopStrings, TextStream
from exactspec.core.engine import DecodeConfig, FinishReason, RowState, SpeculativeEngine
from exactspec.core.metrics import DecodeMetrics
from exactspec.core.sampler import SeededSampler
from exactspec.core.settings import SamplingSettings
from exactspec.drafters.model import ModelDrafter
from exactspec.models.base import LanguageModel
from exactspec.models.pair import ModelPair

Prompt = str | Sequence[int]


@dataclass(frozen=True)
class Completion:
    """One prompt's result: text (cut before any stop string), generated token ids, why it ended."""

    text: str
    token_ids: list[int]
    finish_reason: FinishReason
    prompt_tokens: int


@dataclass(frozen=True)
class GenerationOutput:
    completions: list[Completion]
    metrics: DecodeMetrics


@dataclass(frozen=True)
class StreamEvent:
    """Newly accepted output of one row: its text delta and token ids; `finish_reason` once it ends."""

    row: int
    text: str
    token_ids: list[int]
    finish_reason: FinishReason | None = None
    metrics: DecodeMetrics | None = field(default=None, repr=False)


@dataclass
class _Run:
    """One call's engine, row states, config, random streams and stop strings."""

    engine: SpeculativeEngine
    states: list[RowState]
    config: DecodeConfig
    sampler: SeededSampler
    stop: StopStrings | None


class SpeculativeDecoder:
    """A target model, an optional draft model and their shared tokenizer, ready to generate.

    Without a draft only plain decoding (gamma = 0) is available; it runs through
    the same engine, adapter and transforms, which makes it the baseline.
    """

    def __init__(
        self,
        target_model: Any,
        tokenizer: Any,
        draft_model: Any | None = None,
        draft_tokenizer: Any | None = None,
    ) -> None:
        self.pair = ModelPair.from_models(
            target_model, draft_model, tokenizer=tokenizer, draft_tokenizer=draft_tokenizer
        )

    @classmethod
    def from_pair(cls, pair: ModelPair) -> SpeculativeDecoder:
        """A decoder over an already loaded pair (which must have a tokenizer)."""
        if pair.tokenizer is None:
            raise ValueError("SpeculativeDecoder needs the pair's tokenizer; load the pair with one")
        decoder = cls.__new__(cls)
        decoder.pair = pair
        return decoder

    @classmethod
    def from_pretrained(
        cls,
        target: str | os.PathLike[str] = "default-target",
        draft: str | os.PathLike[str] | None = "default-draft",
        *,
        dtype: Any = "auto",
        cache_dir: str | os.PathLike[str] | None = None,
        progress: bool = True,
        device: Any = "cpu",
    ) -> SpeculativeDecoder:
        """Load by hub id, folder, GGUF file, or "default-target" / "default-draft" (the built-in pair).

        `device`: "cpu", "cuda" or "auto" (CUDA when available).
        """
        return cls.from_pair(
            ModelPair.from_pretrained(
                target, draft, dtype=dtype, cache_dir=cache_dir, progress=progress, device=device
            )
        )

    @property
    def tokenizer(self) -> Any:
        return self.pair.tokenizer

    @property
    def target(self) -> LanguageModel:
        return self.pair.target

    @property
    def draft(self) -> LanguageModel | None:
        return self.pair.draft

    @property
    def context_length(self) -> int:
        return self.pair.context_length

    def encode(self, prompts: Sequence[Prompt], chat: bool = False) -> list[list[int]]:
        """Token ids for each prompt (strings are tokenized; `chat` applies the chat template)."""
        encoded = []
        for index, prompt in enumerate(prompts):
            if isinstance(prompt, str):
                if not prompt.strip():
                    raise ValueError(f"prompt {index} is empty; give some text")
                if chat:
                    text = self.tokenizer.apply_chat_template(
                        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
                    )
                else:
                    text = prompt
                ids = self.tokenizer(text, add_special_tokens=not chat)["input_ids"]
            else:
                ids = [int(t) for t in prompt]
            if not ids:
                raise ValueError(f"prompt {index} has no tokens")
            encoded.append(ids)
        return encoded

    def engine(self, gamma: int) -> SpeculativeEngine:
        if gamma > 0 and self.draft is None:
            raise ValueError("speculative decoding (gamma > 0) needs a draft model; load one or use gamma=0")
        drafter = ModelDrafter(self.draft, self.target.vocab_size) if gamma > 0 and self.draft else None
        return SpeculativeEngine(self.target, drafter)

    def stream(
        self,
        prompts: Prompt | Sequence[Prompt],
        *,
        gamma: int = 4,
        max_new_tokens: int = 128,
        settings: SamplingSettings | None = None,
        seed: int = 0,
        stop: Sequence[str] = (),
        chat: bool = False,
    ) -> Iterator[StreamEvent]:
        """Yield text as the target accepts it (one event per row per round that emitted something).

        The event that finishes a row carries `finish_reason` and the run's metrics so far.
        """
        run = self._start(prompts, gamma, max_new_tokens, settings, seed, stop, chat)
        streams = [TextStream(self.tokenizer, run.stop) for _ in run.states]
        for output in run.engine.rounds(run.states, run.config, run.sampler, run.stop):
            for row, tokens in output.new_tokens.items():
                reason = output.finished.get(row)
                delta = streams[row].update(run.states[row].generated, final=reason is not None)
                if tokens or delta or reason:
                    yield StreamEvent(row, delta, tokens, reason, run.engine.metrics if reason else None)

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        *,
        gamma: int = 4,
        max_new_tokens: int = 128,
        settings: SamplingSettings | None = None,
        seed: int = 0,
        stop: Sequence[str] = (),
        chat: bool = False,
    ) -> GenerationOutput:
        """Generate for one prompt or a batch; rows are independent (own seed seed + row, own stops)."""
        run = self._start(prompts, gamma, max_new_tokens, settings, seed, stop, chat)
        for _ in run.engine.rounds(run.states, run.config, run.sampler, run.stop):
            pass
        completions = []
        for state in run.states:
            text = self.tokenizer.decode(state.generated, skip_special_tokens=True)
            if run.stop is not None:
                text = run.stop.cut_text(text)
            assert state.finish_reason is not None  # rounds() ends only when every row has finished
            completions.append(
                Completion(text, list(state.generated), state.finish_reason, len(state.prompt))
            )
        return GenerationOutput(completions, run.engine.metrics)

    def _start(
        self,
        prompts: Prompt | Sequence[Prompt],
        gamma: int,
        max_new_tokens: int,
        settings: SamplingSettings | None,
        seed: int,
        stop: Sequence[str],
        chat: bool,
    ) -> _Run:
        batch = [prompts] if isinstance(prompts, str) else list(prompts)
        if batch and isinstance(batch[0], int):
            batch = [batch]  # one prompt given as token ids
        config = DecodeConfig(
            gamma=gamma, max_new_tokens=max_new_tokens, settings=settings or SamplingSettings()
        )
        ids = self.encode(batch, chat=chat)
        self._check_context(ids, config)
        engine = self.engine(gamma)
        states = engine.start(ids, config)
        stop_strings = StopStrings(self.tokenizer, stop) if stop else None
        sampler = SeededSampler(seed=seed, num_rows=len(states), device=engine.device)
        return _Run(engine, states, config, sampler, stop_strings)

    def _check_context(self, ids: list[list[int]], config: DecodeConfig) -> None:
        if not self.context_length or not ids:  # no prompts: engine.start says so
            return
        longest = max(len(row) for row in ids)
        # The target scores gamma + 1 positions past the history, so leave room for a full block.
        needed = longest + config.max_new_tokens + config.gamma + 1
        if needed > self.context_length:
            raise ValueError(
                f"the prompt has {longest} tokens; with max_new_tokens={config.max_new_tokens} and "
                f"gamma={config.gamma} it needs {needed} positions but the model's context is "
                f"{self.context_length}; shorten the prompt or lower --max-new-tokens"
            )
