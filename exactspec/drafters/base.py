"""The drafter role: propose tokens and report the exact q each was drawn from (docs/algorithm.md 2.7)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol, runtime_checkable

import torch

from exactspec.foundations.rows import RowLifecycle, RowObserver
from exactspec.foundations.sampler import Sampler
from exactspec.foundations.settings import SamplingSettings
from exactspec.foundations.trees import check_tree


def _padded(rows: Sequence[Sequence[int]], fill: int) -> torch.Tensor:
    """[B, width] long: row b's values, then `fill` up to the longest row's length (padding)."""
    width = max((len(row) for row in rows), default=0)
    out = torch.full((len(rows), width), fill, dtype=torch.long)
    for b, row in enumerate(rows):
        out[b, : len(row)] = torch.tensor(list(row), dtype=torch.long)
    return out


@dataclass(frozen=True)
class Proposal:
    """Draft tokens for one round.

    Attributes:
        tokens: [B, gamma] long, X_1..X_gamma per row; entries at or past
            lengths[b] are padding (any valid id).
        q: [B, gamma, V] the distributions the tokens were drawn from, over the
            *target's* vocabulary (ids the draft lacks have q = 0); rows at or
            past lengths[b] are unused. None only for a deterministic proposal.
        lengths: [B] long, how many tokens row b proposes (a draft that
            proposes EOS stops there: nothing after EOS can be output).
        deterministic: q is one-hot on `tokens` (prompt lookup, n-gram drafts;
            docs/algorithm.md 5). Such a proposal may carry q = None: the verifiers then
            use q_i(X_i) = 1 without a dense [B, gamma, V] tensor.
        parents: [B, N] long, or None for a chain (node i's parent is i - 1). Given, the proposal is
            a tree of several candidates (`exactspec.foundations.trees`): tokens[b, n] is node n's
            token, parents[b, n] its parent (-1: a child of the history's last token), nodes in
            topological order, siblings distinct and tried in index order, lengths[b] the nodes of
            row b's tree, every root-to-node path at most the row's max_tokens long. Verified by
            `exactspec.verifiers.tree.verify_tree` after one target pass over every node. Trees are
            for drafts without probabilities: q must be None and deterministic True.
        model_drawn: [B] long, or None: how many of row b's tokens a draft model drew, where the kind
            of proposal does not say (a hybrid's lookup rows drew theirs from no model; coupled model
            drafts are deterministic, yet drawn by the model): what the round's draft steps are counted
            from (`forced.drafter_steps`).

    Example: the candidates "7 8" and "9" after a row's history are the tree tokens [[7, 8, 9]],
    parents [[-1, 0, -1]], lengths [3].
    """

    tokens: torch.Tensor
    q: torch.Tensor | None
    lengths: torch.Tensor
    deterministic: bool = False
    parents: torch.Tensor | None = None
    model_drawn: torch.Tensor | None = None

    @classmethod
    def from_chains(cls, drafts: Sequence[Sequence[int]]) -> Proposal:
        """A deterministic proposal of one token chain per row (a row with none proposes nothing)."""
        lengths = torch.tensor([len(draft) for draft in drafts], dtype=torch.long)  # [B]
        return cls(tokens=_padded(drafts, 0), q=None, lengths=lengths, deterministic=True)

    @classmethod
    def from_trees(cls, drafts: Sequence[Sequence[int]], parents: Sequence[Sequence[int]]) -> Proposal:
        """A deterministic proposal of one tree per row: drafts[b] its nodes' tokens, parents[b] their
        parents (-1: a root), in the order the class's `parents` describes."""
        lengths = torch.tensor([len(draft) for draft in drafts], dtype=torch.long)  # [B]
        tokens, padded_parents = _padded(drafts, 0), _padded(parents, -1)
        return cls(tokens=tokens, q=None, lengths=lengths, deterministic=True, parents=padded_parents)

    @classmethod
    def empty(cls, rows: int, vocab_size: int, device: torch.device) -> Proposal:
        """No draft for `rows` rows (plain decoding's round: gamma 0)."""
        return cls(
            tokens=torch.zeros(rows, 0, dtype=torch.long, device=device),
            q=torch.zeros(rows, 0, vocab_size, device=device),
            lengths=torch.zeros(rows, dtype=torch.long, device=device),
        )

    def to(self, device: torch.device) -> Proposal:
        """The same proposal with its tensors on `device` (a host-side drafter's, on a GPU run)."""
        if self.tokens.device == device:
            return self
        return Proposal(
            tokens=self.tokens.to(device),
            q=None if self.q is None else self.q.to(device),
            lengths=self.lengths.to(device),
            deterministic=self.deterministic,
            parents=None if self.parents is None else self.parents.to(device),
            model_drawn=None if self.model_drawn is None else self.model_drawn.to(device),
        )

    def __post_init__(self) -> None:
        if self.q is None and not self.deterministic:
            raise ValueError("a Proposal without q must be deterministic (q one-hot on its tokens)")
        if self.parents is not None:
            if self.q is not None or not self.deterministic:
                raise ValueError(
                    "a tree Proposal (parents given) must be deterministic with q None: tree verification "
                    "(docs/algorithm.md 5) is defined for candidates without probabilities"
                )
            check_tree(self.tokens, self.parents, self.lengths)

    def row_tokens(self, row: int) -> list[int]:
        return self.tokens[row, : int(self.lengths[row])].tolist()


@runtime_checkable
class Drafter(RowLifecycle, RowObserver, Protocol):
    """Proposes up to `max_tokens[b]` tokens after each history.

    Row lifecycle (`RowLifecycle`): a drafter with a model passes rows joining and leaving on to
    it; one without per-row state inherits `Stateless`. After every round the engine tells it what
    each row appended (`RowObserver.observe`): a drafter with an index over each row's tokens (a
    suffix structure, an n-gram table) extends it from there instead of re-reading the histories.
    """

    def propose(
        self,
        histories: Sequence[Sequence[int]],
        max_tokens: Sequence[int],
        settings: SamplingSettings | Sequence[SamplingSettings],
        sampler: Sampler,
        rows: Sequence[int],
    ) -> Proposal:
        """Draw the draft block for each row (each row uses its own random stream, rows[b]).

        `settings` is one `SamplingSettings` when every row shares it (the engine passes that
        whenever it can, so a drafter that handles only this case works for uniform batches),
        else one per row: settings[b] defines row b's q (docs/algorithm.md 6). Tensors go on the
        models' device.
        """
        ...


class LookupChain(NamedTuple):
    """The chain a free (lookup) drafter proposes for one row: its tokens, already cut to the depth its match
    length earns (`MatchLengths`), and that match length (`order`, 0: no match, then no tokens)."""

    tokens: list[int]
    order: int


NO_CHAIN = LookupChain([], 0)


@runtime_checkable
class ChainLookup(RowLifecycle, RowObserver, Protocol):
    """A free drafter that can say what it would propose for one row, without a `Proposal` (the hybrid
    drafter asks before the round is planned: `drafters.hybrid`); it follows its rows as a `Drafter`
    does."""

    def lookup(self, row: int, history: Sequence[int], limit: int) -> LookupChain: ...


@runtime_checkable
class LookupProbe(Protocol):
    """A drafter of two sources that looks rows up before the round is planned (`drafters.hybrid`): `probe`
    gives each row's free chain (at most limits[b] tokens), `settle` the plan's choice per row (its chain,
    or the draft model), which the next `propose` follows."""

    def probe(
        self, histories: Sequence[Sequence[int]], limits: Sequence[int], rows: Sequence[int]
    ) -> list[LookupChain]: ...

    def settle(self, rows: Sequence[int], looks_up: Sequence[bool]) -> None: ...


@runtime_checkable
class SharedState(Protocol):
    """A drafter that keeps what finished requests taught it for the requests after them (the suffix
    drafter's global tree), in this process only: what it holds, by name, for a server's /health."""

    def shared_state(self) -> dict[str, int]: ...


def shared_state(drafter: Drafter | None) -> dict[str, int]:
    """What `drafter` holds across requests (`SharedState.shared_state`); {} for one that keeps nothing
    there, or no drafter (plain decoding)."""
    return drafter.shared_state() if isinstance(drafter, SharedState) else {}
