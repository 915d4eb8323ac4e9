"""Tree verification: several deterministic candidates in one round (docs/algorithm.md 5), a pure function.

SpecInfer's multi-step speculative sampling (Miao et al., ASPLOS 2024) for candidates without
probabilities (q one-hot on each candidate: prompt lookup, suffix trees). The drafter proposes a
tree of candidate tokens (`exactspec.foundations.trees`: tokens, parents, lengths); the target
scores every node in one pass, giving p at the root (after the history) and p after each node.

Vocabulary (docs/algorithm.md): walk from the root. At the current place, r = p(. | path so far).
For each child x in index order: *accept* x with probability r(x) / sum(r); on rejection set
r(x) = 0 and try the next child. An accepted child is emitted and becomes the current place. When
every child is rejected (or the place has none), emit one token drawn from r renormalised: after
rejections that is the *residual* (p with the rejected children removed), at a leaf whose path was
all accepted it is the *bonus* draw from p. The row's output stops at the first EOS: an accepted
EOS child ends the round with no bonus.

Each step is the one-hot rule of docs/algorithm.md 5 applied to r, which is why every place emits
exactly p: the proof is docs/algorithm.md 5, "Several candidates: tree verification". A tree of
width 1 is the chain rule for a one-hot q token for token: while no sibling was rejected the coin
is p(x) and the draw is from p itself, exactly the numbers `exactspec.verifiers.token.verify`
uses with q = None, and after one rejection r renormalised is `residual_distribution`'s p with
x removed.

No model, cache or I/O in here: tokens, parents, probabilities and a random source in, tokens and
the accepted path out.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch

from exactspec.foundations.sampler import Sampler
from exactspec.foundations.trees import check_tree, child_links, depths, heights, node_mask
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
) -> TreeVerifyResult:
    """Walk each row's tree of deterministic candidates so that every emitted token is distributed as p.

    Args:
        tokens: [B, N] long, node n's candidate token (entries at or past lengths[b] are padding).
        parents: [B, N] long, node n's parent: -1 for a child of the root, else an earlier node.
        p: [B, N + 1, V] target distributions: p[:, 0] after the history (the root), p[:, n + 1]
            after node n's root-to-node path (the bonus distribution if node n is the last accepted).
        lengths: [B] long, nodes in row b's tree (0..N; 0: one plain draw from p[:, 0]).
        eos_token_ids: every id that ends generation.
        sampler: the random source; row b draws from stream rows[b]: one coin per child tried,
            then one categorical draw unless an accepted EOS ends the row.
        rows: the batch-row id of each row (default 0..B-1).
        validate: check the trees (`exactspec.foundations.trees.check_tree`: topological order, token
            ids, no duplicate siblings) and that the p rows the walk can read are finite and sum to 1.

    Returns:
        A TreeVerifyResult: num_accepted[b] accepted nodes (its path in accepted_nodes), then at most
        one residual or bonus token. No NaN can leave this function: a zero mass is never divided by.

    Example (V = 4, EOS 0): p[:, 0] = [0.1, 0.5, 0.3, 0.1], root children token 1 (node 0) then
    token 2 (node 1), node 2 (token 3) a child of node 0:

        tokens [[1, 2, 3]], parents [[-1, -1, 0]], lengths [3]

    Token 1 is accepted with probability 0.5 (then node 2 is tried against p[:, 1]). Else r becomes
    [0.1, 0, 0.3, 0.1] and token 2 is accepted with probability 0.3 / 0.5 = 0.6; else r becomes
    [0.1, 0, 0, 0.1] and the residual draw gives 0 or 3 with probability 1/2 each. So the first
    token is 2 with probability 0.5 * 0.6 = 0.3 and 0 with 0.5 * 0.4 * 0.5 = 0.1: p[:, 0] itself.
    """
    if tokens.dim() != 2:
        raise ValueError(f"tree tokens must be [B, N], got shape {tuple(tokens.shape)}")
    rows = list(range(tokens.shape[0])) if rows is None else list(rows)
    if validate:
        _check_inputs(tokens, parents, p, lengths, rows)
    batch_size, num_nodes = tokens.shape
    device = p.device
    eos = torch.tensor(sorted(eos_token_ids), dtype=torch.long, device=device)
    first_child, next_sibling = child_links(parents, lengths)  # [B, N + 1], [B, N]
    depth = int(depths(parents, lengths).max()) if num_nodes else 0

    out = torch.full((batch_size, depth + 1), NO_TOKEN, dtype=torch.long, device=device)  # [B, depth + 1]
    accepted_nodes = torch.full((batch_size, depth), NO_TOKEN, dtype=torch.long, device=device)  # [B, depth]
    num_accepted = torch.zeros(batch_size, dtype=torch.long, device=device)  # [B]
    hit_eos = torch.zeros(batch_size, dtype=torch.bool, device=device)  # [B]
    finished = torch.zeros(batch_size, dtype=torch.bool, device=device)  # [B]
    place = torch.zeros(batch_size, dtype=torch.long, device=device)  # [B] 0 = root, n + 1 = node n
    candidate = first_child[:, 0].clone()  # [B] the child tried next, -1 when none is left
    remaining = p[:, 0].clone()  # [B, V] r unnormalised: p at the place, rejected children set to 0
    rejected_here = torch.zeros(batch_size, dtype=torch.bool, device=device)  # [B] a child of place failed

    # Each pass either tries one child or ends the row, so a row takes at most N + 1 passes.
    while True:
        ending = (~finished & (candidate < 0)).nonzero().squeeze(-1)  # [E]
        if ending.numel():
            at_place = p[ending, place[ending]]  # [E, V]
            draw_from = torch.where(
                rejected_here[ending, None], _renormalised(remaining[ending], at_place), at_place
            )  # [E, V]
            drawn = sampler.categorical(draw_from, [rows[b] for b in ending.tolist()])  # [E]
            out[ending, num_accepted[ending]] = drawn
            hit_eos[ending] = torch.isin(drawn, eos)
            finished[ending] = True
        trying = (~finished & (candidate >= 0)).nonzero().squeeze(-1)  # [T]
        if trying.numel() == 0:
            break
        node = candidate[trying]  # [T]
        x = tokens[trying, node]  # [T]
        accept_prob = child_acceptance(remaining[trying], x, rejected_here[trying])  # [T]
        accepted = sampler.bernoulli(accept_prob, [rows[b] for b in trying.tolist()])  # [T] bool

        kept, kept_node = trying[accepted], node[accepted]  # [K], [K]
        if kept.numel():
            accepted_nodes[kept, num_accepted[kept]] = kept_node
            out[kept, num_accepted[kept]] = x[accepted]
            num_accepted[kept] += 1
            ends_row = torch.isin(x[accepted], eos)  # [K] an accepted EOS: nothing after it, no bonus
            hit_eos[kept[ends_row]] = True
            finished[kept[ends_row]] = True
            place[kept] = kept_node + 1
            remaining[kept] = p[kept, kept_node + 1]
            rejected_here[kept] = False
            candidate[kept] = first_child[kept, kept_node + 1]

        refused, refused_node = trying[~accepted], node[~accepted]  # [R], [R]
        if refused.numel():
            remaining[refused, x[~accepted]] = 0.0
            rejected_here[refused] = True
            candidate[refused] = next_sibling[refused, refused_node]

    num_emitted = (out != NO_TOKEN).sum(dim=-1)  # [B]
    below = heights(parents, lengths).gather(1, place[:, None]).squeeze(1)  # [B]
    ended_on_eos = hit_eos & (num_emitted == num_accepted)  # [B] the last emitted token is an accepted EOS
    return TreeVerifyResult(
        tokens=out,
        num_emitted=num_emitted,
        num_accepted=num_accepted,
        hit_eos=hit_eos,
        accepted_nodes=accepted_nodes,
        path_lengths=torch.where(ended_on_eos, num_accepted, below),
    )


def child_acceptance(remaining: torch.Tensor, x: torch.Tensor, renormalise: torch.Tensor) -> torch.Tensor:
    """The coin of child x: r(x) / sum(r) (docs/algorithm.md 5). remaining [T, V] (r unnormalised),
    x [T] long, renormalise [T] bool (a sibling was rejected at this place) -> [T] in [0, 1].

    While no sibling was rejected r = p sums to 1 and the coin is p(x), the chain's one-hot coin
    (`token.verify` with q None) bit for bit. After a rejection it is r(x) / sum(r): sum(r) > 0
    whenever this is reached with positive probability (a rejection needs mass outside x), and
    r(x) <= sum(r). Example: r = [0.1, 0, 0.3, 0.1] after token 1 was rejected, x = 2: 0.3 / 0.5 = 0.6.
    """
    r_x = remaining.gather(1, x[:, None]).squeeze(1)  # [T]
    mass = remaining.sum(dim=-1)  # [T]
    safe_mass = torch.where(mass > 0, mass, torch.ones_like(mass))
    renormalised = torch.where(mass > 0, r_x / safe_mass, torch.zeros_like(r_x))  # [T]
    return torch.where(renormalise, renormalised, r_x).clamp(0.0, 1.0)


def _renormalised(remaining: torch.Tensor, at_place: torch.Tensor) -> torch.Tensor:
    """r / sum(r) per row: remaining [E, V], at_place [E, V] (p at the place) -> [E, V].

    The same arithmetic as `verifiers.residual.residual_distribution` for a one-hot q (a width-1 tree
    draws exactly the chain's residual). Zero mass cannot be reached with positive probability (every
    child was rejected, yet the last one held all of r); rounding aside it never happens, and p itself
    is drawn from there, as residual.py does for beta = 0.
    """
    mass = remaining.sum(dim=-1, keepdim=True)  # [E, 1]
    degenerate = mass <= 0
    safe_mass = torch.where(degenerate, torch.ones_like(mass), mass)
    return torch.where(degenerate, at_place, remaining / safe_mass)


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
