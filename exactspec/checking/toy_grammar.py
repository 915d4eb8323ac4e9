"""A toy grammar over a toy vocabulary: a small automaton as a `TokenConstraint`, for the exact grid.

It has what a JSON schema has, in a few ids: forced stretches (a key, a closing brace), free choices
(a value), and a place where the text may end (EOS allowed there only). `exactspec verify` enumerates
constrained rounds with it (`checking.grid.grammar_cases`): forced drafts at q = 1 ahead of the
drafter's, free positions, a lookup draft that leaves the grammar, and EOS only where it ends; and a
forced run longer than gamma (drafted whole in one round) in which one token has a second spelling, so
the target may reject a forced token.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from exactspec.checking.cases import BLOCK, ExactCase
from exactspec.decoding.strategy import Strategy
from exactspec.foundations.settings import SamplingSettings

TOY_EOS = 0
"""The toy models' EOS id (`checking.toy.random_tabular_model`)."""


@dataclass(frozen=True, eq=False)
class ToyGrammar:
    """A deterministic automaton over token ids: `transitions[state][token]` is the next state; EOS is
    allowed in the `accepting` states only. A pure function of the history (no matcher to move), so one
    object may serve every row; equality is identity, as for every constraint.

    `canonical[state]` is the token the forced run takes in a state that allows several: the text there is
    fixed but may be spelled by more than one token sequence, as a matcher's forced bytes may (llguidance's
    fast-forward tokens are one tokenization of them; the mask allows the others). The target may then
    put mass on the other spelling, and a forced token is accepted with probability p(x) < 1.

    >>> grammar = KEY_VALUE_GRAMMAR
    >>> grammar.forced([], 5), grammar.forced([1, 2], 5), grammar.forced([1, 2, 3, 3], 5)
    ([1, 2], [], [1])
    >>> grammar.allowed([1, 2, 4, 1], 5).tolist()  # the end: EOS, or 2 to go round again
    [True, False, True, False, False]
    >>> long_key = LONG_KEY_GRAMMAR  # the forced run takes 1 where 3 spells the same text
    >>> long_key.forced([], 9), long_key.forced([1, 2], 1), long_key.allowed([1, 2], 5).tolist()
    ([1, 2, 1, 2], [1], [False, True, False, True, False])
    """

    transitions: Mapping[int, Mapping[int, int]]
    accepting: frozenset[int]
    start: int = 0
    canonical: Mapping[int, int] = field(default_factory=dict)

    def state_after(self, generated: Sequence[int]) -> int | None:
        """The state after `generated`, None where it left the grammar or passed its end (an EOS)."""
        state = self.start
        for token in generated:
            following = self.transitions.get(state, {})
            if token not in following:
                return None
            state = following[token]
        return state

    def allowed(self, generated: Sequence[int], vocab_size: int) -> torch.Tensor | None:
        state = self.state_after(generated)
        if state is None:
            return None
        allowed = torch.zeros(vocab_size, dtype=torch.bool)  # [V]
        allowed[list(self.transitions.get(state, {}))] = True
        allowed[TOY_EOS] = state in self.accepting
        return allowed

    def forced(self, generated: Sequence[int], limit: int) -> list[int]:
        out: list[int] = []
        state = self.state_after(generated)
        while state is not None and len(out) < limit and state not in self.accepting:
            following = self.transitions.get(state, {})
            if state in self.canonical:
                token = self.canonical[state]
            elif len(following) == 1:
                (token,) = following
            else:
                break
            out.append(token)
            state = following[token]
        return out

    def failure(self) -> None:
        return None  # an automaton has no limits to reach

    def accepts(self, sequence: Sequence[int]) -> bool:
        """Whether a finished output is in the grammar: it ends with EOS in an accepting state, or was cut
        by the length limit inside the grammar."""
        if sequence and sequence[-1] == TOY_EOS:
            state = self.state_after(sequence[:-1])
            return state is not None and state in self.accepting
        return self.state_after(sequence) is not None


KEY_VALUE_GRAMMAR = ToyGrammar(
    transitions={
        0: {1: 1},  # the key, forced: 1 2
        1: {2: 2},
        2: {3: 3, 4: 3},  # the value, free: one or two of 3, 4
        3: {3: 4, 4: 4, 1: 5},
        4: {1: 5},  # the closing 1, forced after two value tokens
        5: {2: 2},  # the end: EOS, or 2 and another value
    },
    accepting=frozenset({5}),
)
"""`1 2 (3|4) [(3|4)] 1 (2 (3|4) [(3|4)] 1)*` then EOS, over ids 0..4 (0 is EOS)."""


LONG_KEY_GRAMMAR = ToyGrammar(
    transitions={
        0: {1: 1},  # the key, forced: 1 2 1 2, its second half also spelled 3
        1: {2: 2},
        2: {1: 3, 3: 4},
        3: {2: 4},
        4: {3: 5, 4: 5},  # the value, free: 3 or 4
        5: {1: 6},  # the close, forced: 1 2
        6: {2: 7},
        7: {1: 1},  # the end: EOS, or 1 and the key again
    },
    accepting=frozenset({7}),
    canonical={2: 1},
)
"""`1 2 (1 2 | 3) (3|4) 1 2 (1 2 (1 2 | 3) (3|4) 1 2)*` then EOS, over ids 0..4 (0 is EOS): a forced run of
4 tokens from the start (`1 2 1 2`, 3 being the key's other spelling of `1 2`), 2 after the value."""


def grammar_cases() -> list[ExactCase]:
    """Constrained rounds for `exactspec verify`: every case's settings carry a toy grammar
    (`KEY_VALUE_GRAMMAR`; `LONG_KEY_GRAMMAR` for the forced runs longer than gamma), so the rounds draft its
    forced tokens at q = 1 ahead of the drafter's, the draft model's q and the target's p are masked
    position by position, and EOS is allowed only at the grammar's end. The prompts make the lookup
    drafters propose tokens the grammar forbids (prompt 1 2 2: after the forced key the lookup proposes 2
    where only 3 or 4 may come)."""
    grammar = SamplingSettings(constraint=KEY_VALUE_GRAMMAR)
    greedy = SamplingSettings(temperature=0.0, constraint=KEY_VALUE_GRAMMAR)
    transforms = SamplingSettings(
        temperature=0.8, top_k=3, repetition_penalty=1.3, presence_penalty=0.6, constraint=KEY_VALUE_GRAMMAR
    )
    long_key = SamplingSettings(constraint=LONG_KEY_GRAMMAR)
    lookup = Strategy("ngram", adaptive_gamma=False)
    suffix = Strategy("suffix", adaptive_gamma=False)
    leaving = ((1, 2, 2, 1),)
    return [
        ExactCase("grammar, draft model, forced and free positions", 5, 3, 6, grammar),
        ExactCase("grammar, draft model, gamma=1", 5, 1, 5, grammar),
        ExactCase("grammar, draft model, block verification", 5, 3, 5, grammar, strategy=BLOCK),
        ExactCase("grammar, draft model, every transform", 5, 3, 4, transforms),
        ExactCase(
            "grammar, lookup drafts that leave the grammar",
            5,
            3,
            5,
            grammar,
            prompts=leaving,
            strategy=lookup,
        ),
        ExactCase("grammar, greedy, lookup drafts", 5, 4, 6, greedy, prompts=leaving, strategy=lookup),
        ExactCase("grammar, suffix trees", 5, 3, 5, grammar, prompts=leaving, strategy=suffix),
        ExactCase("grammar, batch of 2", 5, 2, 4, grammar, prompts=((1,), (2, 1))),
        ExactCase("grammar, draft model, adaptive gamma", 5, 3, 5, grammar, strategy=Strategy("model")),
        # A forced run of 4 with gamma 1 and 2: drafted whole in one round (jump-forward), its third token
        # rejected where the target spells the key's end 3; its close forced past the cap as well.
        ExactCase("grammar, a forced run longer than gamma, draft model", 5, 1, 8, long_key),
        ExactCase(
            "grammar, a forced run longer than gamma, suffix trees",
            5,
            2,
            7,
            long_key,
            prompts=((1, 2, 3, 4, 1),),
            strategy=suffix,
        ),
    ]
