"""The request's sampling settings: what defines p (target) and q (draft)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from exactspec.foundations.constraints import TokenConstraint
from exactspec.foundations.defaults import DEFAULTS
from exactspec.foundations.errors import InvalidArgument

# The documented ranges of the settings (docs/cli.md, docs/serving.md): the CLI's flags, the server's
# schema and `SamplingSettings` itself all enforce these, so a value outside them is refused before
# any model runs. They follow what users of OpenAI, vLLM and llama.cpp already send: OpenAI's
# logit-bias range, and bounds wide enough for every temperature and penalty seen in practice.
TEMPERATURE_MAX = 100.0
"""Highest temperature. Already at T = 100, logits spread over 20 nats differ by 0.2 nats: near-uniform
noise over the allowed tokens; higher values only add floating-point trouble (T beyond float32's range
turns a banned token's -inf / T into NaN). Any T in (0, TEMPERATURE_MAX] is served: where scores / T
would overflow, the row takes its T -> 0 limit, the greedy row (`exactspec.foundations.overflow`)."""
REPETITION_PENALTY_MIN = 0.01
"""Lowest repetition penalty (< 1 favours repeated tokens; 0.01 multiplies a positive logit by 100)."""
REPETITION_PENALTY_MAX = 100.0
"""Highest repetition penalty (100 divides a positive logit by 100: a repeated token is all but banned)."""
OUTPUT_PENALTY_MAX = 2.0
"""Largest |presence_penalty| and |frequency_penalty|, OpenAI's range [-2, 2]."""
LOGIT_BIAS_MAX = 100.0
"""Largest |logit bias|, OpenAI's: -100 all but bans a token and +100 all but forces it. -inf is also
accepted in Python and on the CLI, where it bans the token outright."""


@dataclass(frozen=True)
class SamplingSettings:
    """How a row of logits becomes the distribution that is sampled from.

    The same settings, applied by `exactspec.foundations.transforms.probabilities`, build
    p for the target and q for the draft (docs/algorithm.md section 4). Each transform
    follows Hugging Face's definition so that results are comparable with
    `transformers.generate`, except where ties decide (top-p, below).

    Attributes:
        temperature: 0 means greedy (one-hot on the argmax, ties broken by the
            lowest id); otherwise logits are divided by it. In [0, TEMPERATURE_MAX];
            a positive T so small that scores / T overflows gives the row's T -> 0
            limit (the greedy row; ids tied at the max share it equally).
        top_k: keep the k highest logits (ties with the k-th are kept, as in
            Hugging Face); 0 disables.
        top_p: nucleus sampling, Hugging Face's rule: sort ascending, remove the
            tokens whose cumulative mass is <= 1 - top_p, always keep the most
            likely; 1.0 disables. Among tokens tied at the cut, the highest ids
            are kept (a stable sort); Hugging Face's unstable sort may keep other
            tied ids, so on a tie at the cut the two can keep different tokens.
        min_p: drop tokens whose probability is below min_p times the largest
            probability; 0.0 disables.
        repetition_penalty: Hugging Face's penalty on every token already in the
            row's history (prompt included): a positive logit is divided by it,
            a negative one multiplied; 1.0 disables. In [REPETITION_PENALTY_MIN,
            REPETITION_PENALTY_MAX].
        logit_bias: token id -> additive bias on its logit (applied first), each
            in [-LOGIT_BIAS_MAX, LOGIT_BIAS_MAX], or -inf to ban the token.
        presence_penalty: OpenAI's: subtracted once from the logit of every token
            the row has generated so far (the prompt does not count); 0.0 disables.
            In [-OUTPUT_PENALTY_MAX, OUTPUT_PENALTY_MAX].
        frequency_penalty: OpenAI's: times the number of times the row has
            generated the token so far, subtracted from its logit; 0.0 disables.
            In [-OUTPUT_PENALTY_MAX, OUTPUT_PENALTY_MAX]. Both are applied after
            the repetition penalty and before the temperature
            (`exactspec.foundations.penalties`).
        constraint: a token constraint (a JSON schema or a grammar,
            `exactspec.foundations.grammar`): the tokens it forbids after the
            row's generated tokens get -inf, after the penalties and before the
            temperature (`exactspec.foundations.constraints`); None: no constraint.
            One constraint object follows one row (the API, the server and batch
            jobs give every row its own from the request's structure).
    """

    temperature: float = DEFAULTS.temperature
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    constraint: TokenConstraint | None = None

    def __post_init__(self) -> None:
        _require_finite("temperature", self.temperature)
        if not 0.0 <= self.temperature <= TEMPERATURE_MAX:
            raise InvalidArgument(
                f"temperature must be in [0, {TEMPERATURE_MAX:g}] (0 is greedy), got {self.temperature}",
                param="temperature",
            )
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int):
            raise InvalidArgument(
                f"top_k must be an integer (0 disables it), got {self.top_k!r}", param="top_k"
            )
        if self.top_k < 0:
            raise InvalidArgument(f"top_k must be >= 0 (0 disables it), got {self.top_k}", param="top_k")
        _require_finite("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidArgument(f"top_p must be in (0, 1] (1 disables it), got {self.top_p}", param="top_p")
        _require_finite("min_p", self.min_p)
        if not 0.0 <= self.min_p <= 1.0:
            raise InvalidArgument(f"min_p must be in [0, 1] (0 disables it), got {self.min_p}", param="min_p")
        _require_finite("repetition_penalty", self.repetition_penalty)
        if not REPETITION_PENALTY_MIN <= self.repetition_penalty <= REPETITION_PENALTY_MAX:
            raise InvalidArgument(
                f"repetition_penalty must be in [{REPETITION_PENALTY_MIN:g}, {REPETITION_PENALTY_MAX:g}] "
                f"(1 disables it), got {self.repetition_penalty}",
                param="repetition_penalty",
            )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _require_finite(name, value)
            if not -OUTPUT_PENALTY_MAX <= value <= OUTPUT_PENALTY_MAX:
                raise InvalidArgument(
                    f"{name} must be in [-{OUTPUT_PENALTY_MAX:g}, {OUTPUT_PENALTY_MAX:g}] (0 disables it), "
                    f"got {value}",
                    param=name,
                )
            object.__setattr__(self, name, float(value))
        bias: dict[int, float] = {}
        for token, value in dict(self.logit_bias).items():
            if isinstance(token, bool) or not isinstance(token, int) or token < 0:
                raise InvalidArgument(
                    f"logit_bias keys must be token ids (integers >= 0), got {token!r}", param="logit_bias"
                )
            if not isinstance(value, int | float) or (isinstance(value, float) and math.isnan(value)):
                raise InvalidArgument(
                    f"logit_bias[{token}] must be a number, got {value!r}", param="logit_bias"
                )
            if value != -math.inf and not -LOGIT_BIAS_MAX <= value <= LOGIT_BIAS_MAX:
                # +inf would make every other token impossible (and NaN next to a second +inf), and a
                # finite bias past float32's range is +inf in the logits; -inf stays allowed: it bans
                # the token.
                raise InvalidArgument(
                    f"logit_bias[{token}] must be in [-{LOGIT_BIAS_MAX:g}, {LOGIT_BIAS_MAX:g}] (or -inf to "
                    f"ban the token), got {value!r}",
                    param="logit_bias",
                )
            bias[token] = float(value)
        # Frozen all the way down: a shared settings object must not change under a running request.
        object.__setattr__(self, "logit_bias", MappingProxyType(bias))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalises_output(self) -> bool:
        """The presence or the frequency penalty is on: p depends on the tokens generated so far."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def reads_output(self) -> bool:
        """p depends on the tokens generated so far (the presence or frequency penalty, or a constraint):
        the transforms need each position's history and where its prompt ends."""
        return self.penalises_output or self.constraint is not None

    @property
    def uses_history(self) -> bool:
        """p depends on the row's history (the repetition penalty, or what `reads_output` names): the
        transforms need each position's own history."""
        return self.repetition_penalty != 1.0 or self.reads_output

    def check_vocab(self, vocab_size: int) -> None:
        """Raise if a logit-bias id does not exist in a vocabulary of this size."""
        bad = sorted(t for t in self.logit_bias if t >= vocab_size)
        if bad:
            raise ValueError(
                f"logit_bias names token id(s) {bad[:5]} outside the vocabulary (size {vocab_size}); "
                f"use ids in 0..{vocab_size - 1}"
            )

    def __hash__(self) -> int:
        return hash(
            (
                self.temperature,
                self.top_k,
                self.top_p,
                self.min_p,
                self.repetition_penalty,
                tuple(sorted(self.logit_bias.items())),
                self.presence_penalty,
                self.frequency_penalty,
                self.constraint,  # hashed and compared by identity: one object per row
            )
        )

    def describe(self) -> str:
        """Short human-readable form, listing only the transforms that are on."""
        parts = ["greedy" if self.greedy else f"T={self.temperature:g}"]
        if self.top_k:
            parts.append(f"top_k={self.top_k}")
        if self.top_p < 1.0:
            parts.append(f"top_p={self.top_p:g}")
        if self.min_p > 0.0:
            parts.append(f"min_p={self.min_p:g}")
        if self.repetition_penalty != 1.0:
            parts.append(f"rep={self.repetition_penalty:g}")
        if self.presence_penalty != 0.0:
            parts.append(f"presence={self.presence_penalty:g}")
        if self.frequency_penalty != 0.0:
            parts.append(f"frequency={self.frequency_penalty:g}")
        if self.logit_bias:
            parts.append(f"bias={dict(self.logit_bias)}")
        if self.constraint is not None:
            parts.append("constrained")
        return " ".join(parts)


def _require_finite(name: str, value: object) -> None:
    # An int is finite however large (math.isfinite would raise OverflowError past float's range).
    if isinstance(value, int) and not isinstance(value, bool):
        return
    if not isinstance(value, float) or not math.isfinite(value):
        raise InvalidArgument(f"{name} must be a finite number, got {value!r}", param=name)


# The "realistic chat settings" row of the benchmark: the sampling defaults that the Qwen2.5 instruct
# models publish in their generation_config.json (temperature 0.7, top-p 0.8, top-k 20, repetition
# penalty 1.05), i.e. what a chat user of these models samples with unless they change it.
REALISTIC_CHAT_SETTINGS = SamplingSettings(temperature=0.7, top_k=20, top_p=0.8, repetition_penalty=1.05)
