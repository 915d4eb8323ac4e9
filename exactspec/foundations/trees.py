"""Trees of candidate tokens: one row's candidates as nodes with a token and a parent.

A drafter that costs nothing (prompt lookup, a suffix tree) can propose several continuations at
once; docs/algorithm.md 5 ("Several candidates: tree verification") verifies them in one target
pass. The shape of such a proposal, shared by the drafters, the models that score it and the
verifier that walks it, lives here:

- tokens [B, N] long: node n's token; parents [B, N] long: node n's parent, -1 for a child of the
  history's last position (the *root*); lengths [B] long: row b's tree is nodes 0..lengths[b] - 1
  (later entries are padding, never read).
- Nodes are in topological order (parent index < node index), and siblings are tried in index order.
- No two siblings carry the same token (`check_tree` refuses it: see there).
- The *depth* of a node is the number of nodes on its root-to-node path (1 for a child of the root).

Example: the candidates "a b", "a c" and "d" after some history are the tree

    root -> a (0) -> b (1)            tokens  [a, b, c, d]
              \\-> c (2)               parents [-1, 0, 0, -1]
    root -> d (3)                     depths  [1, 2, 2, 1]

`node_paths` gives [[0], [0, 1], [0, 2], [3]] and `leaf_paths` [[0, 1], [0, 2], [3]].
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

ROOT = -1
"""The parent of a node that follows the history directly."""


def check_tree(
    tokens: torch.Tensor, parents: torch.Tensor, lengths: torch.Tensor, vocab_size: int | None = None
) -> None:
    """Raise ValueError unless (tokens, parents, lengths) is a batch of trees as the module describes.

    Duplicate sibling tokens are refused, not merged: the second copy can never be accepted (once the
    first is rejected its token has no mass left, docs/algorithm.md 5), so it is a drafter bug that
    costs a target position for nothing, and merging it would make the verified tree differ from the
    drafter's (the accepted node indices the verifier reports refer to the drafter's nodes).
    """
    if tokens.dim() != 2 or tokens.dtype != torch.long:
        raise ValueError(f"tree tokens must be [B, N] int64, got {tokens.dtype} {tuple(tokens.shape)}")
    batch_size, num_nodes = tokens.shape
    if parents.shape != tokens.shape or parents.dtype != torch.long:
        raise ValueError(
            f"tree parents must be [B, N] = {tuple(tokens.shape)} int64 like the tokens, got "
            f"{parents.dtype} {tuple(parents.shape)}"
        )
    if lengths.shape != (batch_size,) or lengths.dtype != torch.long:
        raise ValueError(
            f"tree lengths must be [{batch_size}] int64, got {lengths.dtype} {tuple(lengths.shape)}"
        )
    if ((lengths < 0) | (lengths > num_nodes)).any():
        raise ValueError(f"tree lengths must lie in 0..N={num_nodes}, got {lengths.tolist()}")
    valid = node_mask(lengths, num_nodes)  # [B, N]
    index = torch.arange(num_nodes, device=tokens.device)  # [N]
    bad_parent = valid & ((parents < ROOT) | (parents >= index[None, :]))  # [B, N]
    if bad_parent.any():
        b, n = (int(i) for i in bad_parent.nonzero()[0])
        raise ValueError(
            f"row {b}: node {n} has parent {int(parents[b, n])}; a parent must be -1 (the root) or an "
            f"earlier node 0..{n - 1} (list the nodes in topological order)"
        )
    used = tokens[valid]  # [M]
    if vocab_size is not None and used.numel() and (used.min() < 0 or used.max() >= vocab_size):
        raise ValueError(f"tree token ids must be in 0..{vocab_size - 1}")
    duplicate = (
        valid[:, :, None]
        & valid[:, None, :]
        & (parents[:, :, None] == parents[:, None, :])
        & (tokens[:, :, None] == tokens[:, None, :])
        & (index[:, None] < index[None, :])[None]
    )  # [B, N, N]
    if duplicate.any():
        b, i, j = (int(k) for k in duplicate.nonzero()[0])
        raise ValueError(
            f"row {b}: nodes {i} and {j} are siblings with the same token {int(tokens[b, i])}; a token may "
            "appear once among a node's children (the second copy could never be accepted)"
        )


def node_mask(lengths: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """[B, N] bool, True on the nodes of each row's tree (n < lengths[b])."""
    return torch.arange(num_nodes, device=lengths.device)[None, :] < lengths[:, None]


def depths(parents: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """[B, N] long: each node's depth (1 for a child of the root), 0 on padding.

    >>> depths(torch.tensor([[-1, 0, 0, -1]]), torch.tensor([4])).tolist()
    [[1, 2, 2, 1]]
    """
    batch_size, num_nodes = parents.shape
    valid = node_mask(lengths, num_nodes)  # [B, N]
    depth = torch.zeros(batch_size, num_nodes, dtype=torch.long, device=parents.device)  # [B, N]
    for n in range(num_nodes):  # topological order: a parent's depth is known before its children's
        parent = parents[:, n]  # [B]
        above = depth.gather(1, parent.clamp(0, num_nodes - 1)[:, None]).squeeze(1)  # [B]
        depth[:, n] = torch.where(valid[:, n], torch.where(parent >= 0, above, 0) + 1, 0)
    return depth


def heights(parents: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """[B, N + 1] long: the depth of the deepest node at or below each place; column 0 is the root,
    column n + 1 node n (0 on padding).

    A round that ends at place m could have kept heights[b, m] tokens: for a chain (a tree of
    width 1) of L nodes that is L at every place, the chain's draft length.

    >>> heights(torch.tensor([[-1, 0, 0, -1]]), torch.tensor([4])).tolist()
    [[2, 2, 2, 2, 1]]
    """
    batch_size, num_nodes = parents.shape
    valid = node_mask(lengths, num_nodes)  # [B, N]
    height = torch.zeros(batch_size, num_nodes + 1, dtype=torch.long, device=parents.device)  # [B, N + 1]
    height[:, 1:] = depths(parents, lengths)
    for n in range(num_nodes - 1, -1, -1):  # children after their parents: walk backwards
        place = torch.where(valid[:, n], parents[:, n] + 1, 0)[:, None]  # [B, 1]
        below = torch.where(valid[:, n], height[:, n + 1], 0)[:, None]  # [B, 1]
        height.scatter_reduce_(1, place, below, reduce="amax")
    return height


def node_paths(parents: Sequence[int], length: int) -> list[list[int]]:
    """One row: for each node 0..length - 1, the node indices from the root down to it.

    >>> node_paths([-1, 0, 0, -1], 4)
    [[0], [0, 1], [0, 2], [3]]
    """
    paths: list[list[int]] = []
    for n in range(length):
        parent = int(parents[n])
        paths.append([n] if parent == ROOT else [*paths[parent], n])
    return paths


def leaf_paths(parents: Sequence[int], length: int) -> list[list[int]]:
    """One row: the root-to-leaf paths (node indices), by leaf index; [[]] for an empty tree.

    Every node lies on at least one of them, so scoring them all scores every node.

    >>> leaf_paths([-1, 0, 0, -1], 4)
    [[0, 1], [0, 2], [3]]
    >>> leaf_paths([], 0)
    [[]]
    """
    if length == 0:
        return [[]]
    has_child = {int(parents[n]) for n in range(length)}
    paths = node_paths(parents, length)
    return [paths[n] for n in range(length) if n not in has_child]


def place_histories(
    history: Sequence[int], tokens: Sequence[int], parents: Sequence[int], length: int, num_nodes: int
) -> list[list[int]]:
    """One row: the history each of the N + 1 places is scored after: the root's is `history`, node n's
    is `history` plus its root-to-node path's tokens (a padding node's, n >= length, is `history`).

    What the sampling transforms need where they look at the history (the repetition penalty).

    >>> place_histories([4, 5], [6, 7, 8], [-1, 0, -1], 3, 3)
    [[4, 5], [4, 5, 6], [4, 5, 6, 7], [4, 5, 8]]
    """
    base = list(history)
    paths = node_paths(parents, length)
    return [base] + [
        base + [int(tokens[n]) for n in paths[n]] if n < length else base for n in range(num_nodes)
    ]
