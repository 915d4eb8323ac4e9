"""The records the decoding layer passes around: a run's config, a row's state, one round's result, events.

Vocabulary: a *request* is one prompt with its own sampling settings, seed, gamma, length limit
and stop rule; once admitted to a batch it is a *row*, named by a row id
(`exactspec.foundations.rows`). Each round (`SpeculativeEngine.round`) returns a `RoundOutput`
for its rows; the batch driver (`exactspec.decoding.scheduler.Scheduler`) turns it into one
`RowEvent` per row, the one event type every consumer reads (the API's streams, the server,
the benchmark, `SpeculativeEngine.generate`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from exactspec.decoding.logprobs import TokenLogprob
from exactspec.foundations.defaults import DEFAULTS
from exactspec.foundations.settings import SamplingSettings

FinishReason = Literal["eos", "length", "stop", "cancelled", "error"]
"""Why a row ended: it emitted EOS, reached its length limit or a stop string, was cancelled by its
submitter, or its round failed (`RowEvent.error` says how)."""

StopCondition = Callable[[int, list[int]], int | None]
"""(row, generated tokens so far) -> None to go on, or how many generated tokens to keep and stop.

Used for stop strings: the text layer finds the first token that completes a
stop string and the engine cuts the row there. The cut depends only on the
emitted tokens, so the kept prefix keeps the target's distribution.
"""

MAX_GAMMA = 64
"""More draft tokens than this per round is never useful (acceptance decays geometrically) and
usually a typo; it also bounds the [B, gamma, V] q tensor."""


@dataclass(frozen=True)
class DecodeConfig:
    """How a generation runs: draft length, length limit and sampling settings.

    The engine knows no weights, so its default draft length is the dense one (`DEFAULTS.dense_gamma`);
    the length limit is `DEFAULTS.max_tokens`.
    """

    gamma: int = DEFAULTS.dense_gamma
    max_new_tokens: int = DEFAULTS.max_tokens
    settings: SamplingSettings = field(default_factory=SamplingSettings)

    def __post_init__(self) -> None:
        if (
            isinstance(self.gamma, bool)
            or not isinstance(self.gamma, int)
            or not 0 <= self.gamma <= MAX_GAMMA
        ):
            raise ValueError(
                f"gamma must be an integer in 0..{MAX_GAMMA} (0 = plain decoding), got {self.gamma!r}"
            )
        if (
            isinstance(self.max_new_tokens, bool)
            or not isinstance(self.max_new_tokens, int)
            or self.max_new_tokens < 1
        ):
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")


@dataclass
class RowState:
    """One row's generation so far, and the row's own settings (docs/algorithm.md 6).

    `settings`, `gamma` and `max_new_tokens` override the `DecodeConfig` of the run for this row
    (None: use the config's); that is how rows of one batch sample with different settings,
    draft lengths and length limits. A gamma policy drafts at most `gamma` for the row, and
    exactly `gamma` when `fixed_gamma` (its request asked for that gamma).
    """

    prompt: list[int]
    generated: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    settings: SamplingSettings | None = None
    gamma: int | None = None
    max_new_tokens: int | None = None
    fixed_gamma: bool = False  # its request fixed gamma: a gamma policy leaves its draft length alone
    logprobs: int | None = None  # None: no log-probabilities; k: each token's and k alternatives
    _history: list[int] = field(init=False, repr=False, compare=False)

    @classmethod
    def checked(
        cls,
        prompt: Sequence[int],
        vocab_size: int,
        *,
        drafts: bool,
        settings: SamplingSettings | None = None,
        gamma: int | None = None,
        max_new_tokens: int | None = None,
        index: int = 0,
    ) -> RowState:
        """A row of `prompt` whose ids, settings, gamma and length limit are valid for a target of
        `vocab_size` ids and an engine that `drafts` (has a drafter); `index` names the prompt in errors."""
        tokens = [int(t) for t in prompt]
        if not tokens:
            raise ValueError(f"prompt {index} is empty; give at least one token")
        if any(not 0 <= t < vocab_size for t in tokens):
            raise ValueError(f"prompt {index} has token ids outside 0..{vocab_size - 1}")
        if settings is not None:
            settings.check_vocab(vocab_size)
        if gamma is not None or max_new_tokens is not None:
            # DecodeConfig holds the validation rules for both.
            checked = DecodeConfig(
                gamma=0 if gamma is None else gamma,
                max_new_tokens=1 if max_new_tokens is None else max_new_tokens,
            )
            if checked.gamma > 0 and not drafts:
                raise ValueError("gamma > 0 needs a drafter; use gamma = 0 for plain decoding")
        return cls(prompt=tokens, settings=settings, gamma=gamma, max_new_tokens=max_new_tokens)

    def __post_init__(self) -> None:
        self._history = [*self.prompt, *self.generated]

    @property
    def history(self) -> list[int]:
        """prompt + generated: one list kept up to date as the row grows (`extend`, `cut`), never rebuilt,
        so a round costs nothing in the length of the history. Callers read it; only the round grows it."""
        return self._history

    def extend(self, tokens: Sequence[int]) -> None:
        """Append emitted tokens to the row."""
        self.generated.extend(tokens)
        self._history.extend(tokens)

    def cut(self, keep: int) -> None:
        """Keep only the first `keep` generated tokens (a stop string ended the row inside a round)."""
        del self.generated[keep:]
        del self._history[len(self.prompt) + keep :]


RowStates = Sequence[RowState] | Mapping[int, RowState]
"""The rows of a run, indexed by row id: a list (ids 0..B-1) or, for a scheduler, a dict."""


@dataclass(frozen=True)
class RoundOutput:
    """What one round added: row -> tokens newly emitted (after any stop cut), and rows that finished."""

    new_tokens: dict[int, list[int]]
    finished: dict[int, FinishReason]
    proposed: dict[int, int] = field(default_factory=dict)  # row -> draft tokens it proposed
    accepted: dict[int, int] = field(default_factory=dict)  # row -> draft tokens the verifier kept
    # rows that asked for log-probabilities -> one per new token
    logprobs: dict[int, list[TokenLogprob]] = field(default_factory=dict)


@dataclass(frozen=True)
class Request:
    """One row to decode: prompt token ids and the row's own settings.

    Attributes:
        prompt: token ids (at least one).
        settings: the row's sampling settings (its own p and q).
        max_new_tokens: the row's length limit.
        gamma: the row's draft length (None: the scheduler's; 0: plain decoding for this row).
        seed: seed of the row's random stream (None: the sampler's default stream for the row id;
            the scheduler's own sampler starts from a random base seed, so that is a fresh stream).
        stop: the row's stop rule, called as stop(row id, generated tokens) like the engine's
            `StopCondition` (e.g. `exactspec.api.text.StopStrings`).
        logprobs: None, or k in 0..TOP_LOGPROBS_MAX: every emitted token comes with the log of the
            target's p at its position and its k most likely alternatives (`decoding.logprobs`).
    """

    prompt: Sequence[int]
    settings: SamplingSettings = field(default_factory=SamplingSettings)
    max_new_tokens: int = DEFAULTS.max_tokens
    gamma: int | None = None
    seed: int | None = None
    stop: StopCondition | None = None
    logprobs: int | None = None


@dataclass(frozen=True)
class RowEvent:
    """What one round did for one row: its new tokens, and why it ended once it has.

    `proposed` and `accepted` count this round's draft tokens; `error` says what failed when
    `finish_reason` is "error", and `error_param` names the request field at fault when the request
    itself is (a constraint its matcher could not enforce: the server's 400), else None (a failed round).
    """

    row: int
    tokens: list[int]
    finish_reason: FinishReason | None = None
    proposed: int = 0
    accepted: int = 0
    error: str | None = None
    logprobs: list[TokenLogprob] | None = None  # one per token, when the row's request asked
    error_param: str | None = None


def prompt_ends(histories: list[list[int]], positions: list[int]) -> list[int]:
    """Where each row's prompt ends: its history less the `positions` tokens it generated so far."""
    return [len(history) - position for history, position in zip(histories, positions, strict=True)]
