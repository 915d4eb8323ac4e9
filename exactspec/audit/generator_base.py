"""What every audit generator shares: the `Generator` interface, each sample's seed and the cut at EOS.

`exactspec.audit.generators` (exactspec's own generators and `make_generator`) and
`exactspec.audit.peer_generators` (the peers') both build on it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any, Protocol, runtime_checkable

from exactspec.foundations.settings import SamplingSettings

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
