"""Scoring a tree of candidates with the target: p at the root and after every node.

`tree_logits(model, histories, tokens, parents, lengths, rows)` is what the engine calls for a tree
proposal (`exactspec.foundations.trees`; docs/algorithm.md 5, "Several candidates"). A backend with
a native tree pass (a `tree_logits` method: `TreeScoringModel`) scores every node in one forward,
each node attending to the history and its own ancestors only. Any other `LanguageModel` is scored
path by path (`path_tree_logits`): every root-to-leaf path is an ordinary history, so
`LanguageModel.logits` scores it, and each node gets the logits of the first leaf path through it.
That is correct for every model (toy tables, the cached adapters, whose rollback by prefix
bookkeeping handles one row scored along several paths in turn), at the price of one call per leaf.

Wrappers (`models.base.ModelWrapper`: timing, checks) are scored path by path too, through their own
`logits`, so what they add to each call still happens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch

from exactspec.foundations.trees import check_tree, leaf_paths
from exactspec.models.base import LanguageModel


@runtime_checkable
class TreeScoringModel(Protocol):
    """A backend that scores a whole tree in one pass (same arguments and result as `tree_logits`)."""

    def tree_logits(
        self,
        histories: Sequence[Sequence[int]],
        tokens: torch.Tensor,
        parents: torch.Tensor,
        lengths: torch.Tensor,
        rows: Sequence[int] | None = None,
    ) -> torch.Tensor: ...


def tree_logits(
    model: LanguageModel,
    histories: Sequence[Sequence[int]],
    tokens: torch.Tensor,
    parents: torch.Tensor,
    lengths: torch.Tensor,
    rows: Sequence[int] | None = None,
) -> torch.Tensor:
    """[B, N + 1, V] logits: entry [b, 0] scores what follows histories[b], entry [b, n + 1] what follows
    histories[b] plus node n's root-to-node path (entries of padding nodes, n >= lengths[b], are 0).

    Args:
        model: the target; its native tree pass is used when it has one (`TreeScoringModel`).
        histories: B token lists (each at least one token).
        tokens, parents: [B, N] long, the trees (`exactspec.foundations.trees`).
        lengths: [B] long, nodes in row b's tree.
        rows: the row ids (default 0..B-1), as for `LanguageModel.logits`.

    Example: history [4, 5], tokens [[6, 7, 8]], parents [[-1, 0, -1]] gives entries after
    [4, 5], [4, 5, 6], [4, 5, 6, 7] and [4, 5, 8].
    """
    check_tree(tokens, parents, lengths, model.vocab_size)
    if len(histories) != tokens.shape[0]:
        raise ValueError(f"got {len(histories)} histories for {tokens.shape[0]} trees")
    row_ids = list(range(len(histories))) if rows is None else [int(r) for r in rows]
    if isinstance(model, TreeScoringModel):
        return model.tree_logits(histories, tokens, parents, lengths, row_ids)
    return path_tree_logits(model, histories, tokens, parents, lengths, row_ids)


def path_tree_logits(
    model: LanguageModel,
    histories: Sequence[Sequence[int]],
    tokens: torch.Tensor,
    parents: torch.Tensor,
    lengths: torch.Tensor,
    rows: Sequence[int],
) -> torch.Tensor:
    """`tree_logits` by `model.logits` over each root-to-leaf path (the fallback, and the reference a
    native tree pass is tested against).

    Leaf paths go in waves: wave w scores the w-th leaf path of every row that has one, in one
    `logits` call with k = the longest path in the wave + 1 (a row whose history is too short for
    that k is scored in a call of its own).
    """
    batch_size, num_nodes = tokens.shape
    token_lists, length_list = tokens.tolist(), lengths.tolist()
    paths = [leaf_paths(parents[b].tolist(), length_list[b]) for b in range(batch_size)]
    sequences = [
        [list(h) + [token_lists[b][n] for n in path] for path in paths[b]] for b, h in enumerate(histories)
    ]
    out: torch.Tensor | None = None  # [B, N + 1, V], allocated from the first call's dtype
    scored = torch.zeros(batch_size, num_nodes + 1, dtype=torch.bool)  # [B, N + 1]
    for wave in range(max(len(row_paths) for row_paths in paths)):
        members = [b for b in range(batch_size) if wave < len(paths[b])]
        k = max(len(paths[b][wave]) for b in members) + 1
        together = [b for b in members if len(sequences[b][wave]) >= k]
        calls = ([together] if together else []) + [[b] for b in members if b not in together]
        for call in calls:
            width = max(len(paths[b][wave]) for b in call) + 1
            logits = model.logits([sequences[b][wave] for b in call], width, rows=[rows[b] for b in call])
            if out is None:  # [C, width, V]
                out = logits.new_zeros(batch_size, num_nodes + 1, logits.shape[-1])
            for j, b in enumerate(call):
                path = paths[b][wave]
                places = torch.tensor([0, *(n + 1 for n in path)])  # [len(path) + 1] root, then the path
                fresh = ~scored[b, places]  # each place keeps the logits of the first path through it
                out[b, places[fresh]] = logits[j, width - len(path) - 1 :][fresh.to(logits.device)]
                scored[b, places] = True
    assert out is not None  # every row has at least one (possibly empty) leaf path
    return out
