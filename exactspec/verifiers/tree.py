"""Tree verification: several deterministic candidates in one round (docs/algorithm.md 5), a pure function.

Multi-candidate verification for candidates without probabilities (q one-hot on each candidate:
prompt lookup, suffix trees), by coupling. The drafter proposes a tree of candidate tokens
(`exactspec.foundations.trees`: tokens, parents, lengths); the target scores every node in one pass,
giving p at the root (after the history) and p after each node.

Vocabulary (docs/algorithm.md): walk from the root. At the current place the row draws Y from
p(. | path so far) (its positioned draw for that output position, `Sampler.categorical_at`, when the
caller gives positions). If a child of the place holds Y, that child is *accepted*: Y is emitted and
the child becomes the place. Otherwise Y is emitted and the round ends: when the place has children
that is the *residual* outcome (a token none of them holds), at a leaf whose path was all accepted it
is the *bonus*. The row's output stops at the first EOS: an accepted EOS child ends the round.

Every emitted token is a draw from p at its place, so every position is distributed exactly as p
(docs/algorithm.md 5, "Several candidates: tree verification"); child x is accepted with probability
p(x), which is what SpecInfer's sequential rule gives it too (try the children in order, accept x with
r(x) / sum(r), remove it from r on rejection), with one draw per position instead of a coin per child
and a residual draw. A tree of width 1 is the chain rule for a one-hot q token for token
(`exactspec.verifiers.token.verify` with q None draws the same Y at each position).

No model, cache or I/O in here: tokens, parents, probabilities and a random source in, tokens and
the accepted path out.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch

from exactspec.foundations.sampler import Sampler
from exactspec.foundations.trees import check_tree, depths, heights, node_mask
from exactspec.verifiers.base import NO_TOKEN, VerifyResult, check_distributions


@dataclass(frozen=True)
class TreeVerifyResult(VerifyResult):
    """A `VerifyResult` (tokens [B, depth + 1], with depth the deepest tree's) and the path it kept.

    Attributes:
        accepted_nodes: [B, depth] long; row b's first num_accepted[b] entries are the node indices
            of its accepted path, root side first, then NO_TOKEN.
        path_lengths: [B] long, how many candidates the round could have kept on the path it took:
            the depth of the deepest node at or below the place where the walk ended (num_accepted
            after an accepted EOS). For a tree of width 1 this is the chain's draft length, which is
            what acceptance statistics per draft position count (`DecodeMetrics.record_positions`).
    """

    accepted_nodes: torch.Tensor
    path_lengths: torch.Tensor


def verify_tree(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    p: torch.Tensor,
    lengths: torch.Tensor,
    eos_token_ids: Collection[int],
    sampler: Sampler,
    rows: Sequence[int] | None = None,
    *,
    validate: bool = True,
    positions: Sequence[int] | None = None,
) -> TreeVerifyResult:
    """Walk each row's tree of deterministic candidates so that every emitted token is distributed as p.

    Args:
        tokens: [B, N] long, node n's candidate token (entries at or past lengths[b] are padding).
        parents: [B, N] long, node n's parent: -1 for a child of the root, else an earlier node.
        p: [B, N + 1, V] target distributions: p[:, 0] after the history (the root), p[:, n + 1]
            after node n's root-to-node path (the bonus distribution if node n is the last accepted).
        lengths: [B] long, nodes in row b's tree (0..N; 0: one plain draw from p[:, 0]).
        eos_token_ids: every id that ends generation.
        sampler: the random source; row b draws from stream rows[b]: one categorical draw per
            emitted token.
        rows: the batch-row id of each row (default 0..B-1).
        validate: check the trees (`exactspec.foundations.trees.check_tree`: topological order, token
            ids, no duplicate siblings) and that the p rows the walk can read are finite and sum to 1.
        positions: per row, the tokens it emitted before this round: the draw at depth d is then the
            row's positioned draw for output position positions[b] + d (the same token plain decoding
            draws there with the same seed); None: the rows' sequential streams.

    Returns:
        A TreeVerifyResult: num_accepted[b] accepted nodes (its path in accepted_nodes), then at most
        one residual or bonus token. No NaN can leave this function: a zero mass is never divided by.

    Example (V = 4, EOS 0): p[:, 0] = [0.1, 0.5, 0.3, 0.1], root children token 1 (node 0) then
    token 2 (node 1), node 2 (token 3) a child of node 0:

        tokens [[1, 2, 3]], parents [[-1, -1, 0]], lengths [3]

    The root's draw Y is 1 with probability 0.5: node 0 is accepted and node 2 is tried against a draw
    from p[:, 1]. Y = 2 (0.3) accepts node 1, a leaf, whose bonus is drawn from p[:, 2]. Y = 0 or 3
    (0.1 each) matches no child: Y is emitted and the round ends. The first token is p[:, 0]'s draw.
    """
    if tokens.dim() != 2:
        raise ValueError(f"tree tokens must be [B, N], got shape {tuple(tokens.shape)}")
    rows = list(range(tokens.shape[0])) if rows is None else list(rows)
    if validate:
        _check_inputs(tokens, parents, p, lengths, rows)
    if positions is not None and len(positions) != tokens.shape[0]:
        raise ValueError(
            f"positions must give one offset per row, got {len(positions)} for {tokens.shape[0]}"
        )
    walk = _Walk(tokens, parents, lengths, eos_token_ids, p.device)
    # Each pass emits one token per row still walking, so a row takes at most depth + 1 passes.
    while True:
        walking = (~walk.finished).nonzero().squeeze(-1)  # [W]
        if walking.numel() == 0:
            break
        probs = p[walking, walk.place[walking]]  # [W, V]
        drawn = _draw(probs, walking, walk.num_accepted, sampler, rows, positions)  # [W]
        for b, y in zip(walking.tolist(), drawn.tolist(), strict=True):
            walk.take(b, y)
    return walk.result(parents, lengths)


class _Walk:
    """The rows' walks down their trees (`verify_tree`), one drawn token at a time.

    Attributes:
        out: [B, depth + 1] long, each row's emitted tokens so far, then NO_TOKEN.
        accepted_nodes: [B, depth] long, the nodes accepted so far; num_accepted: [B] long, how many.
        place: [B] long, where each row stands: 0 = the root, n + 1 = node n.
        hit_eos, finished: [B] bool, the row emitted an EOS; the row's walk is over.
    """

    def __init__(
        self,
        tokens: torch.Tensor,
        parents: torch.Tensor,
        lengths: torch.Tensor,
        eos_token_ids: Collection[int],
        device: torch.device,
    ) -> None:
        batch_size, num_nodes = tokens.shape
        depth = int(depths(parents, lengths).max()) if num_nodes else 0
        self.eos = frozenset(int(t) for t in eos_token_ids)
        self.children = _children_by_place(tokens, parents, lengths)
        self.out = torch.full((batch_size, depth + 1), NO_TOKEN, dtype=torch.long, device=device)
        self.accepted_nodes = torch.full((batch_size, depth), NO_TOKEN, dtype=torch.long, device=device)
        self.num_accepted = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.hit_eos = torch.zeros(batch_size, dtype=torch.bool, device=device)
        self.finished = torch.zeros(batch_size, dtype=torch.bool, device=device)
        self.place = torch.zeros(batch_size, dtype=torch.long, device=device)

    def take(self, b: int, y: int) -> None:
        """Row b drew token y at its place: emitted; the child holding it is accepted and the walk goes on
        from it, else (the residual outcome, or the bonus at a leaf) the walk ends, as it does at EOS."""
        self.out[b, self.num_accepted[b]] = y
        child = matching_child(self.children[b].get(int(self.place[b]), {}), y)
        if child is not None:
            self.accepted_nodes[b, self.num_accepted[b]] = child
            self.num_accepted[b] += 1
            self.place[b] = child + 1
        else:
            self.finished[b] = True
        if y in self.eos:
            self.hit_eos[b] = True
            self.finished[b] = True

    def result(self, parents: torch.Tensor, lengths: torch.Tensor) -> TreeVerifyResult:
        num_emitted = (self.out != NO_TOKEN).sum(dim=-1)  # [B]
        below = heights(parents, lengths).gather(1, self.place[:, None]).squeeze(1)  # [B]
        # [B] the last emitted token is an accepted EOS
        ended_on_eos = self.hit_eos & (num_emitted == self.num_accepted)
        path_lengths = torch.where(ended_on_eos, self.num_accepted, below)
        return TreeVerifyResult(
            self.out, num_emitted, self.num_accepted, self.hit_eos, self.accepted_nodes, path_lengths
        )


def _children_by_place(
    tokens: torch.Tensor, parents: torch.Tensor, lengths: torch.Tensor
) -> list[dict[int, dict[int, int]]]:
    """children[b][place]: {token: node} of each place's children (0 = the root, n + 1 = node n); trees
    are small, so the walk is a Python one."""
    children: list[dict[int, dict[int, int]]] = []
    for b in range(tokens.shape[0]):
        by_place: dict[int, dict[int, int]] = {}
        for n in range(int(lengths[b])):
            by_place.setdefault(int(parents[b, n]) + 1, {})[int(tokens[b, n])] = n
        children.append(by_place)
    return children


def _draw(
    probs: torch.Tensor,
    walking: torch.Tensor,
    num_accepted: torch.Tensor,
    sampler: Sampler,
    rows: list[int],
    positions: Sequence[int] | None,
) -> torch.Tensor:
    """[W] one token per walking row from its place's p (probs [W, V]): the row's positioned draw for
    the output position after its accepted nodes when `positions` are given."""
    chosen = [rows[b] for b in walking.tolist()]
    if positions is None:
        return sampler.categorical(probs, chosen)
    where = [positions[b] + int(num_accepted[b]) for b in walking.tolist()]
    return sampler.categorical_at(probs, chosen, where)


def matching_child(children: dict[int, int], drawn: int) -> int | None:
    """The node among a place's children ({token: node}) that holds the drawn token, None when none does.

    >>> matching_child({1: 0, 2: 1}, 2), matching_child({1: 0, 2: 1}, 3)
    (1, None)
    """
    return children.get(drawn)


def _check_inputs(
    tokens: torch.Tensor, parents: torch.Tensor, p: torch.Tensor, lengths: torch.Tensor, rows: list[int]
) -> None:
    """ValueError on a malformed tree, a p of the wrong shape, or p rows the walk can read that are not
    finite and normalised."""
    batch_size, num_nodes = tokens.shape
    if p.dim() != 3 or p.shape[0] != batch_size or p.shape[1] != num_nodes + 1:
        raise ValueError(
            f"p must be [B, N + 1, V] = [{batch_size}, {num_nodes + 1}, V], got {tuple(p.shape)}"
        )
    check_tree(tokens, parents, lengths, p.shape[2])
    if len(rows) != batch_size:
        raise ValueError(f"rows must name one random stream per batch row: {len(rows)} for {batch_size} rows")
    root = torch.ones(batch_size, 1, dtype=torch.bool, device=p.device)  # [B, 1]
    used = torch.cat([root, node_mask(lengths, num_nodes).to(p.device)], dim=1)  # [B, N + 1]: root, nodes
    check_distributions("p", p[used])
