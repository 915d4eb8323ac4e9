"""Toy language models and a toy tree drafter: any Python function of the history, exactly enumerable.

They implement the same `LanguageModel` and `Drafter` protocols as the real ones, so the exact
check (`exactspec.checking.exact`) drives the production decoding engine with them.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Collection, Sequence

import torch

from exactspec.drafters.base import Proposal
from exactspec.foundations.rows import Stateless
from exactspec.foundations.sampler import Sampler
from exactspec.foundations.settings import SamplingSettings
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


TreeFunction = Callable[[tuple[int, ...]], Sequence[tuple[int, int]]]
"""history -> a tree of candidates as (token, parent) pairs in topological order (parent -1: the root)."""


class FixedTreeDrafter(Stateless):
    """A `Drafter` that proposes the tree `trees(history)` for each row: deterministic, q None.

    Nodes deeper than the row's max_tokens are cut (their descendants with them), so a round never
    proposes past the length limit, and so are the nodes below a candidate in `eos_token_ids`
    (nothing after an EOS can be emitted; every drafter stops there, docs/algorithm.md 2.1).
    `as_chain`: propose each tree, which must then have width 1 (node i's parent is i - 1), as a
    chain (parents None): the same candidates through the engine's chain verifier, to compare the
    two rules on one drafter.

    >>> drafter = FixedTreeDrafter(lambda history: [(5, -1), (6, 0), (7, -1)])
    >>> proposal = drafter.propose([[1, 2]], [1], SamplingSettings(), None, [0])
    >>> proposal.tokens.tolist(), proposal.parents.tolist(), proposal.lengths.tolist()
    ([[5, 7]], [[-1, -1]], [2])
    """

    def __init__(
        self, trees: TreeFunction, eos_token_ids: Collection[int] = (), *, as_chain: bool = False
    ) -> None:
        self.trees = trees
        self.eos_token_ids = frozenset(eos_token_ids)
        self.as_chain = as_chain

    def propose(
        self,
        histories: Sequence[Sequence[int]],
        max_tokens: Sequence[int],
        settings: SamplingSettings | Sequence[SamplingSettings],
        sampler: Sampler,
        rows: Sequence[int],
    ) -> Proposal:
        del settings, sampler, rows  # no randomness, no model, no per-row state
        cut = [
            _cut_tree(list(self.trees(tuple(history))), limit, self.eos_token_ids)
            for history, limit in zip(histories, max_tokens, strict=True)
        ]
        tokens = [[token for token, _ in nodes] for nodes in cut]
        if not self.as_chain:
            return Proposal.from_trees(tokens, [[parent for _, parent in nodes] for nodes in cut])
        if any(parent != n - 1 for nodes in cut for n, (_, parent) in enumerate(nodes)):
            raise ValueError("as_chain needs trees of width 1 (node i's parent is i - 1)")
        return Proposal.from_chains(tokens)


def _cut_tree(nodes: list[tuple[int, int]], max_depth: int, eos: frozenset[int]) -> list[tuple[int, int]]:
    """The nodes at depth <= max_depth and not below an EOS node, parents renumbered.

    [(5, -1), (6, 0), (7, -1)] cut at depth 1 -> [(5, -1), (7, -1)].
    """
    kept: dict[int, int] = {}  # old index -> new index
    depth: dict[int, int] = {-1: 0}
    out: list[tuple[int, int]] = []
    for n, (token, parent) in enumerate(nodes):
        if parent != -1 and (parent not in kept or nodes[parent][0] in eos):
            continue  # below a cut node or an EOS
        depth[n] = depth[parent] + 1
        if depth[n] > max_depth:
            continue
        kept[n] = len(out)
        out.append((token, -1 if parent == -1 else kept[parent]))
    return out


def rotating_tree(vocab_size: int, widths: Sequence[int], seed: int = 0) -> TreeFunction:
    """A tree function for the exact grid: widths[d] children under every node at depth d.

    The children of a place are `widths[d]` consecutive ids (mod V) starting at an offset drawn from
    (seed, history, path) by a stable hash, so trees change with the history and EOS is a child
    somewhere. widths (3,) proposes three candidate next tokens; (1, 1, 1) is a chain of three.

    >>> rotating_tree(4, (2, 1))((1,))
    [(3, -1), (0, -1), (0, 0), (1, 1)]
    """

    def trees(history: tuple[int, ...]) -> list[tuple[int, int]]:
        nodes: list[tuple[int, int]] = []
        frontier: list[tuple[int, tuple[int, ...]]] = [(-1, ())]  # (place, path tokens)
        for width in widths:
            next_frontier = []
            for place, path in frontier:
                start = _stable_hash(seed, (*history, -1, *path)) % vocab_size
                for j in range(width):
                    token = (start + j) % vocab_size
                    nodes.append((token, place))
                    next_frontier.append((len(nodes) - 1, (*path, token)))
            frontier = next_frontier
        return nodes  # built level by level: every parent is listed before its children

    return trees
