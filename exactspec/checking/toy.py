"""Toy language models: any Python function of the history, exactly enumerable.

They implement the same `LanguageModel` protocol as real models, so the exact
check (`exactspec.checking.exact`) drives the production decoding engine with them.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Collection, Sequence

import torch

from exactspec.models.base import StatelessModel

Distribution = Callable[[tuple[int, ...]], Sequence[float] | torch.Tensor]


class TabularModel(StatelessModel):
    """A language model defined by a function `history -> next-token probabilities`.

    Logits are log-probabilities in float64 (log 0 = -inf), so after the
    identity transform the model's p is exactly the function's output.

    >>> model = TabularModel(lambda history: [0.25, 0.75], vocab_size=2, eos_token_ids={0})
    >>> model.logits([[1, 1]], num_positions=1).exp().tolist()
    [[[0.25, 0.75]]]
    """

    def __init__(self, distribution: Distribution, vocab_size: int, eos_token_ids: Collection[int]) -> None:
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        if any(not 0 <= t < vocab_size for t in eos_token_ids):
            raise ValueError(f"EOS ids {sorted(eos_token_ids)} must lie in 0..{vocab_size - 1}")
        self._distribution = distribution
        self._vocab_size = vocab_size
        self._eos_token_ids = frozenset(eos_token_ids)
        self._memo: dict[tuple[int, ...], torch.Tensor] = {}

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._eos_token_ids

    def next_token_log_probs(self, history: Sequence[int]) -> torch.Tensor:
        """[V] float64 log-probabilities of the token after `history` (memoised: the function is pure)."""
        key = tuple(history)
        cached = self._memo.get(key)
        if cached is None:
            probs = torch.as_tensor(self._distribution(key), dtype=torch.float64)
            if probs.shape != (self._vocab_size,):
                raise ValueError(
                    f"distribution returned shape {tuple(probs.shape)}, expected ({self._vocab_size},)"
                )
            if not torch.isfinite(probs).all() or (probs < 0).any() or abs(float(probs.sum()) - 1.0) > 1e-12:
                raise ValueError(
                    f"distribution for history {key} is not a probability vector: {probs.tolist()}"
                )
            cached = probs.log()
            self._memo[key] = cached
        return cached

    def logits(
        self,
        histories: Sequence[Sequence[int]],
        num_positions: int = 1,
        rows: Sequence[int] | None = None,
    ) -> torch.Tensor:
        del rows  # stateless: nothing to cache per row
        out = torch.empty(len(histories), num_positions, self._vocab_size, dtype=torch.float64)  # [B, k, V]
        for b, history in enumerate(histories):
            if len(history) < num_positions:
                raise ValueError(f"history of length {len(history)} cannot give {num_positions} positions")
            start = len(history) - num_positions + 1
            for j in range(num_positions):
                out[b, j] = self.next_token_log_probs(history[: start + j])
        return out


def random_tabular_model(
    vocab_size: int,
    seed: int,
    *,
    eos_token_id: int | None = 0,
    sharpness: float = 1.0,
    zero_ids: Collection[int] = (),
    one_hot: bool = False,
) -> TabularModel:
    """A random model: each history gets its own distribution softmax(sharpness * N(0, 1) logits).

    The distribution of a history depends only on (seed, history), through a
    stable hash, so the model is reproducible across processes.

    Args:
        vocab_size: V.
        seed: chooses the model.
        eos_token_id: the EOS id (None: no EOS).
        sharpness: scale of the random logits; larger values give peaked rows.
        zero_ids: ids that get probability 0 in every row (a support that
            misses tokens); at least one id must remain.
        one_hot: put all the mass on one random id per history (a
            deterministic model).
    """
    allowed = torch.tensor([t for t in range(vocab_size) if t not in set(zero_ids)], dtype=torch.long)
    if allowed.numel() == 0:
        raise ValueError("zero_ids removes every token; at least one must keep probability")

    def distribution(history: tuple[int, ...]) -> torch.Tensor:
        generator = torch.Generator().manual_seed(_stable_hash(seed, history))
        probs = torch.zeros(vocab_size, dtype=torch.float64)
        if one_hot:
            probs[allowed[int(torch.randint(len(allowed), (), generator=generator))]] = 1.0
            return probs
        logits = sharpness * torch.randn(len(allowed), generator=generator, dtype=torch.float64)
        probs[allowed] = torch.softmax(logits, dim=0)
        return probs

    eos = set() if eos_token_id is None else {eos_token_id}
    return TabularModel(distribution, vocab_size, eos)


def _stable_hash(seed: int, history: tuple[int, ...]) -> int:
    """A seed for torch.Generator from (seed, history) that is the same in every process (unlike hash())."""
    # crc32 is 32 bits, which is all torch keeps of a seed anyway (its mt19937 takes the low 32 bits).
    return zlib.crc32(repr((seed, history)).encode())
