"""How many draft tokens each verifier keeps in expectation, given the drafted tokens: no coins flipped.

A sampled run tells how many tokens one verifier kept on its own path; two
runs with different verifiers drift apart after their first different token,
so comparing their tokens per round compares two random paths. Given one
round's inputs (draft tokens, q, p), the expected number of kept draft tokens
under each rule is a closed form, so both rules can be scored on the very
same rounds (`exactspec bench` does this for its block-against-token table):

- token verification (docs/algorithm.md 2): X_k is kept when X_1..X_k all pass
  their coins, so E[tau] = sum_k prod_{i <= k} a_i with a_i = min(1, p_i(X_i) / q_i(X_i)).
- block verification (docs/algorithm.md 5): tau is the largest i whose coin
  (probability h_i) succeeds, so P(tau >= k) = 1 - prod_{i >= k} (1 - h_i).

Both rules first cut a block after its first drafted EOS, as the verifiers do.
Block verification keeps at least as many tokens as token verification in
expectation over the drafts, not on every single draft (`verifiers.block`'s
example), so on real rounds the two sums are compared, not single rounds.

`block_weight_sum` scores block verification over the drafts instead: the sum
of its weights w_1 + ... + w_L on the drafted path has, over drafts X ~ q, the
same mean as block verification's kept tokens (E_q[sum_i w_i] = E[tau]; for
token verification the expression above is already that estimate). It is an
estimate of the expected kept tokens per round in which the drafts' chance is
shared by both rules, and since w_i >= prod_{j <= i} a_j on every draft it is
never below the token rule's on any round: what it measures is by how much
block verification gains, not whether it does.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Literal

import torch

from exactspec.verifiers.block import block_weights, cut_after_first_eos, stop_probabilities
from exactspec.verifiers.residual import acceptance_probability

Rule = Literal["token", "block"]


def expected_accepted(
    draft_tokens: torch.Tensor,
    q: torch.Tensor | None,
    p: torch.Tensor,
    draft_lengths: torch.Tensor,
    eos_token_ids: Collection[int],
    rule: Rule,
) -> torch.Tensor:
    """E[tau | drafts] [B] float64 under `rule`, for one round's verifier inputs.

    Args (as `exactspec.verifiers.token.verify`): draft_tokens [B, gamma] long, q [B, gamma, V]
    or None (deterministic drafts), p [B, gamma + 1, V], draft_lengths [B] long.

    Example (`verifiers.block`'s p = (1/3, 2/3), q = (2/3, 1/3), gamma = 2): the draft (a, b)
    keeps 1/2 + 1/2 = 1 token under token verification (a passes half of the time, then b always)
    and 2 under block verification (w_2 = 1, so h_2 = 1).
    """
    if rule not in ("token", "block"):
        raise ValueError(f"rule must be 'token' or 'block', got {rule!r}")
    batch_size, gamma = draft_tokens.shape
    if gamma == 0:
        return torch.zeros(batch_size, dtype=torch.float64, device=p.device)
    eos = torch.tensor(sorted(eos_token_ids), dtype=torch.long, device=p.device)
    lengths, _ = cut_after_first_eos(draft_tokens, draft_lengths, eos)  # [B]
    position = torch.arange(1, gamma + 1, device=p.device)  # [gamma] 1-based
    inside = position.unsqueeze(0) <= lengths.unsqueeze(1)  # [B, gamma]
    if rule == "token":
        p_x, q_x = _drafted_probabilities(draft_tokens, q, p)  # [B, gamma] each
        accept = acceptance_probability(p_x, q_x)  # [B, gamma]
        kept_through = torch.cumprod(torch.where(inside, accept, torch.zeros_like(accept)), dim=-1)
        return kept_through.sum(dim=-1)
    # Block needs whole rows (its residual masses): float64 copies of p and q.
    p = p.to(torch.float64)
    q = None if q is None else q.to(torch.float64)
    weights = block_weights(draft_tokens, q, p, lengths)  # [B, gamma + 1]
    stop = stop_probabilities(draft_tokens, q, p, lengths, weights)  # [B, gamma]; 0 past L
    # P(no coin at i..gamma succeeds) = prod_{j >= i} (1 - h_j): a reversed cumulative product.
    none_from = torch.flip(torch.cumprod(torch.flip(1.0 - stop, [-1]), dim=-1), [-1])  # [B, gamma]
    at_least = torch.where(inside, 1.0 - none_from, torch.zeros_like(none_from))  # [B, gamma] P(tau >= i)
    return at_least.sum(dim=-1)


def expected_accepted_tree(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    p: torch.Tensor,
    lengths: torch.Tensor,
    eos_token_ids: Collection[int],
    *,
    first_branch: bool = False,
) -> torch.Tensor:
    """E[accepted candidates | tree] [B] float64 under tree verification (docs/algorithm.md 5).

    Args (as `exactspec.verifiers.tree.verify_tree`): tokens, parents [B, N] long, p [B, N + 1, V]
    (p at the root, then after each node), lengths [B] long.

    The walk reaches node n when it reached n's parent and the parent's draw was n's token, so
    P(reach n) = prod over n's path of p(token | the path above it), and the expected number of
    accepted candidates is the sum over nodes of P(reach n). An accepted EOS ends the row: nothing
    below an EOS node is reached. With `first_branch`, only the first branch counts: the root's
    first child, its first child, and so on (siblings are tried in index order), which is the chain
    this tree's drafter would have proposed alone (`drafters.suffix_tree.SuffixTree.speculate`), so
    the two sums compare the tree and the chain on the same drafts and the same p.

    Example: after the root p = (a: 0.5, b: 0.3, c: 0.2) and after "a" p(d) = 0.5; the tree
    root -> a -> d, root -> b accepts 0.5 + 0.5 * 0.5 + 0.3 = 1.05 candidates in expectation, its
    first branch "a d" 0.75.
    """
    batch_size, num_nodes = tokens.shape
    expected = torch.zeros(batch_size, dtype=torch.float64)
    eos = set(eos_token_ids)
    token_rows, parent_rows, length_rows = tokens.tolist(), parents.tolist(), lengths.tolist()
    for b in range(batch_size):
        reach = [0.0] * num_nodes
        on_branch = [False] * num_nodes
        first_child: dict[int, int] = {}  # place (-1: the root) -> its first child
        for n in range(length_rows[b]):
            parent = parent_rows[b][n]
            first_child.setdefault(parent, n)
            if parent >= 0 and (reach[parent] == 0.0 or token_rows[b][parent] in eos):
                continue  # unreachable: below a node the walk cannot pass
            above = 1.0 if parent < 0 else reach[parent]
            reach[n] = above * float(p[b, parent + 1, token_rows[b][n]])
            on_branch[n] = first_child[parent] == n and (parent < 0 or on_branch[parent])
        expected[b] = sum(r for r, on in zip(reach, on_branch, strict=True) if on or not first_branch)
    return expected


def block_weight_sum(
    draft_tokens: torch.Tensor,
    q: torch.Tensor | None,
    p: torch.Tensor,
    draft_lengths: torch.Tensor,
    eos_token_ids: Collection[int],
) -> torch.Tensor:
    """w_1 + ... + w_L per row [B] float64: over drafts X ~ q its mean is block verification's E[tau].

    Arguments as `expected_accepted`. Only the drafted entries of p and q are read (the weights
    need no residual masses). Per draft it is at least token verification's E[tau | drafts]
    (w_i = min(1, w_{i-1} p_i(X_i) / q_i(X_i)) >= w_{i-1} a_i), and equal to it for gamma = 1 and
    for deterministic drafts (q = None: w_i = prod_j p_j(X_j)).

    Example (`verifiers.block`'s p = (1/3, 2/3), q = (2/3, 1/3), gamma = 2): drafts aa, ab, ba,
    bb (q-probabilities 4/9, 2/9, 2/9, 1/9) sum to 3/4, 3/2, 3/2, 2; their q-mean is 11/9, block
    verification's expected kept tokens.
    """
    batch_size, gamma = draft_tokens.shape
    if gamma == 0:
        return torch.zeros(batch_size, dtype=torch.float64, device=p.device)
    eos = torch.tensor(sorted(eos_token_ids), dtype=torch.long, device=p.device)
    lengths, _ = cut_after_first_eos(draft_tokens, draft_lengths, eos)  # [B]
    p_x, q_x = _drafted_probabilities(draft_tokens, q, p)  # [B, gamma] each, float64
    weight = torch.ones(batch_size, dtype=torch.float64, device=p.device)  # [B] w_0
    total = torch.zeros(batch_size, dtype=torch.float64, device=p.device)  # [B]
    for i in range(gamma):
        weight = acceptance_probability(weight * p_x[:, i], q_x[:, i])  # w_{i+1}, as verifiers.block
        total += torch.where(i < lengths, weight, torch.zeros_like(weight))
    return total


def _drafted_probabilities(
    draft_tokens: torch.Tensor, q: torch.Tensor | None, p: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """p_i(X_i) and q_i(X_i) [B, gamma] float64 (q_i(X_i) = 1 for deterministic drafts), all that is read."""
    drafted = draft_tokens.unsqueeze(-1)  # [B, gamma, 1]
    p_x = p[:, : draft_tokens.shape[1]].gather(2, drafted).squeeze(-1).to(torch.float64)  # [B, gamma]
    q_x = torch.ones_like(p_x) if q is None else q.gather(2, drafted).squeeze(-1).to(torch.float64)
    return p_x, q_x
