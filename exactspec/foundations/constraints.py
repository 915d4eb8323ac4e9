"""Token constraints: a mask over the vocabulary at each position, a transform of p and q like the others.

A constraint (a JSON schema, a grammar: `exactspec.foundations.grammar`) says which tokens may come next
given the tokens generated so far. Applied to the scores, the tokens it forbids get -inf, so probability 0
after the softmax and never the argmax of a greedy row. It is a pure function of the position's own
history, so one call builds p and q alike (docs/algorithm.md 4): inside a draft block, position i of a
row is masked after the row's generated tokens plus the drafted X_1..X_{i-1} before it, exactly as the
repetition penalty sees them. The verifier then compares the masked p with the masked q, and the rule
stays exact: the output has the law of plain constrained decoding.

A drafted token the constraint forbids has p = 0 there and is always rejected; the positions after it are
scored by the target (one pass scores the whole block) but never read. For them, and after the
constraint has ended (an EOS consumed), `allowed` answers None: no mask, any finite p will do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch

from exactspec.foundations.errors import InvalidArgument


@runtime_checkable
class TokenConstraint(Protocol):
    """The tokens allowed after a row's generated tokens. One object follows one row: it may keep the
    state of its last answer (a grammar matcher) and move it forward or back to the next history asked
    for, which is what makes the masks incremental. Equality is identity."""

    def allowed(self, generated: Sequence[int], vocab_size: int) -> torch.Tensor | None:
        """[vocab_size] bool: True where the token may follow `generated` (the tokens after the prompt);
        None where `generated` already left the constraint or ended it (the position is never read)."""
        ...

    def forced(self, generated: Sequence[int], limit: int) -> list[int]:
        """The tokens that must follow `generated`, up to `limit` of them: the only continuation the
        constraint allows (a key, a closing brace). Empty when there is a choice (EOS is never forced)."""
        ...

    def failure(self) -> InvalidArgument | None:
        """None while the constraint holds; else why it can no longer be enforced (a matcher's limit
        reached), naming the request field. From then on `allowed` allows EOS only, and the scheduler
        ends the row with this error: a row never goes on unconstrained."""
        ...


def apply_constraint(
    scores: torch.Tensor,
    constraint: TokenConstraint,
    histories: Sequence[Sequence[int]] | None,
    prompt_lengths: Sequence[int] | None,
) -> torch.Tensor:
    """[N, V] scores with -inf on every token the constraint forbids at each row's position.

    Args:
        scores: [N, V] float scores (biased and penalised logits).
        constraint: the rows' constraint (every row of a settings group shares it).
        histories: N histories, each the prompt plus every token before this position.
        prompt_lengths: N ints, where each history's generated tokens begin.

    Returns:
        A new [N, V] tensor; rows where the constraint answers None are unchanged.

    >>> class EvenIds:
    ...     def allowed(self, generated, vocab_size):
    ...         return torch.arange(vocab_size) % 2 == 0
    ...     def forced(self, generated, limit):
    ...         return []
    ...     def failure(self):
    ...         return None
    >>> apply_constraint(torch.zeros(1, 4), EvenIds(), [[7]], [1]).tolist()
    [[0.0, -inf, 0.0, -inf]]
    """
    if histories is None or prompt_lengths is None:
        raise ValueError("a token constraint needs one history and one prompt length per row of logits")
    if len(histories) != scores.shape[0] or len(prompt_lengths) != scores.shape[0]:
        raise ValueError(
            f"a token constraint needs one history and one prompt length per row of logits: "
            f"{len(histories)} histories and {len(prompt_lengths)} prompt lengths for {scores.shape[0]} rows"
        )
    vocab_size = scores.shape[1]
    out = scores.clone()  # [N, V]
    for n, (history, start) in enumerate(zip(histories, prompt_lengths, strict=True)):
        allowed = constraint.allowed(history[start:], vocab_size)  # [V] or None
        if allowed is not None:  # one pass over the row: no [N, V] mask built first
            out[n].masked_fill_(allowed.logical_not().to(scores.device), -torch.inf)
    return out
