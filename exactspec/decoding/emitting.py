"""What a round's verified tokens do to each row (docs/algorithm.md 2, the round's last step): they are
appended to its history, cut where its stop condition says, and the row finishes at EOS, at a stop or
at its length limit.
"""

from __future__ import annotations

from exactspec.decoding.logprobs import TokenLogprob
from exactspec.decoding.records import (
    DecodeConfig,
    FinishReason,
    RoundOutput,
    RowState,
    RowStates,
    StopCondition,
)
from exactspec.verifiers.base import VerifyResult


def max_new_tokens(state: RowState, config: DecodeConfig) -> int:
    """The row's length limit: its own, else the config's."""
    return config.max_new_tokens if state.max_new_tokens is None else state.max_new_tokens


def append_emitted(
    states: RowStates,
    active: list[int],
    result: VerifyResult,
    config: DecodeConfig,
    stop: StopCondition | None,
    logprobs: dict[int, list[TokenLogprob]],
) -> RoundOutput:
    """Append each active row's emitted tokens (`result`, row b of the batch is `active[b]`), cut at its
    stop condition and length limit; `logprobs` (rows that asked) are cut to the tokens kept."""
    new_tokens: dict[int, list[int]] = {}
    finished: dict[int, FinishReason] = {}
    emitted_rows = result.tokens.tolist()  # one host copy for the whole batch, not one per row
    emitted_counts = result.num_emitted.tolist()
    eos_flags = result.hit_eos.tolist()
    for b, row in enumerate(active):
        state = states[row]
        before = len(state.generated)
        state.extend(emitted_rows[b][: emitted_counts[b]])
        reason: FinishReason | None = "eos" if eos_flags[b] else None
        if stop is not None:
            keep = stop(row, state.generated)
            if keep is not None and not before <= keep <= len(state.generated):
                raise ValueError(
                    f"stop condition kept {keep} tokens of row {row}; it may only cut this round's "
                    f"tokens ({before}..{len(state.generated)})"
                )
            if keep is not None:
                state.cut(keep)
                reason = "stop"
        if reason is None and len(state.generated) >= max_new_tokens(state, config):
            reason = "length"
        state.finish_reason = reason
        new_tokens[row] = state.generated[before:]
        if row in logprobs:
            logprobs[row] = logprobs[row][: len(new_tokens[row])]
        if reason is not None:
            finished[row] = reason
    return RoundOutput(new_tokens=new_tokens, finished=finished, logprobs=logprobs)
