"""Scoring trees of candidates (`models.tree.tree_logits`): every place gets the logits of its own history.

The reference is the plainest scoring there is: each place's history (the row's history plus the
node's root-to-node path) scored alone, one position, no cache (`FullForwardModel` for the HF models).
The HF adapter is driven through rounds of random trees (rows joining and leaving, accepted paths
kept, the other branches rolled back, holes and compaction) and must match it to float64 rounding.
"""

from __future__ import annotations

import random

import pytest
import torch
from conftest import tiny_causal_lm

from exactspec.checking.tiny_hf import FullForwardModel
from exactspec.checking.toy import random_tabular_model
from exactspec.foundations.trees import node_paths, place_histories
from exactspec.models.base import ModelWrapper
from exactspec.models.hf import HFLanguageModel
from exactspec.models.tree import TreeScoringModel, path_tree_logits, tree_logits

VOCAB = 7
EOS = 0
FLOAT64_TOLERANCE = 1e-12


def random_tree(rng: random.Random, vocab: int, max_nodes: int) -> tuple[list[int], list[int]]:
    """Random (tokens, parents) in topological order, no two siblings with the same token."""
    tokens: list[int] = []
    parents: list[int] = []
    for n in range(rng.randint(0, max_nodes)):
        parent = rng.randint(-1, n - 1)
        free = [t for t in range(vocab) if (t, parent) not in set(zip(tokens, parents, strict=True))]
        if free:
            tokens.append(rng.choice(free))
            parents.append(parent)
    return tokens, parents


def batch(trees: list[tuple[list[int], list[int]]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """tokens [B, N], parents [B, N] (padding: token 1, parent -1), lengths [B]."""
    width = max(len(tokens) for tokens, _ in trees)
    tokens = torch.tensor([t + [1] * (width - len(t)) for t, _ in trees], dtype=torch.long).reshape(
        len(trees), width
    )
    parents = torch.tensor([q + [-1] * (width - len(q)) for _, q in trees], dtype=torch.long).reshape(
        len(trees), width
    )
    return tokens, parents, torch.tensor([len(t) for t, _ in trees])


def expected_logits(reference, histories, trees) -> list[torch.Tensor]:
    """Per row, [lengths[b] + 1, V]: each place's history scored alone (root first)."""
    out = []
    for history, (tokens, parents) in zip(histories, trees, strict=True):
        places = place_histories(history, tokens, parents, len(tokens), len(tokens))
        out.append(torch.cat([reference.logits([place], 1)[:, 0] for place in places]))
    return out


def assert_scores(got: torch.Tensor, expected: list[torch.Tensor], atol: float) -> None:
    for b, row in enumerate(expected):
        torch.testing.assert_close(got[b, : row.shape[0]], row.to(got.dtype), atol=atol, rtol=0)


def test_a_table_scores_every_place_of_every_tree() -> None:
    model = random_tabular_model(VOCAB, seed=3)
    rng = random.Random(0)
    histories = [[1, 2, 3], [4], [5, 6]]
    trees = [random_tree(rng, VOCAB, 6) for _ in histories]
    trees[1] = ([2, 3, 4], [-1, 0, 1])  # a history of one token under a path of 3
    trees[2] = ([], [])  # an empty tree: the root only
    tokens, parents, lengths = batch(trees)
    got = tree_logits(model, histories, tokens, parents, lengths)
    assert got.shape == (3, tokens.shape[1] + 1, VOCAB)
    assert_scores(got, expected_logits(model, histories, trees), atol=0.0)
    assert (got[2, 1:] == 0).all()  # padding places of the empty tree


def test_the_docstring_example() -> None:
    model = random_tabular_model(VOCAB, seed=3)
    got = tree_logits(
        model, [[4, 5]], torch.tensor([[6, 2, 1]]), torch.tensor([[-1, 0, -1]]), torch.tensor([3])
    )
    for place, history in enumerate([[4, 5], [4, 5, 6], [4, 5, 6, 2], [4, 5, 1]]):
        assert torch.equal(got[0, place], model.logits([history], 1)[0, 0])


def test_a_native_tree_pass_is_used_when_the_model_has_one() -> None:
    class Native:
        vocab_size = VOCAB
        calls: list[list[int]] = []

        def tree_logits(self, histories, tokens, parents, lengths, rows=None) -> torch.Tensor:
            self.calls.append(list(rows))
            return torch.zeros(tokens.shape[0], tokens.shape[1] + 1, VOCAB)

    model = Native()
    assert isinstance(model, TreeScoringModel)
    tree_logits(model, [[1]], torch.tensor([[2]]), torch.tensor([[-1]]), torch.tensor([1]), rows=[7])
    assert model.calls == [[7]]


def test_a_wrapper_is_scored_through_its_own_logits() -> None:
    class Counting(ModelWrapper):
        calls = 0

        def logits(self, histories, num_positions=1, rows=None):
            Counting.calls += 1
            return super().logits(histories, num_positions, rows)

    model = Counting(random_tabular_model(VOCAB, seed=3))
    trees = [([1, 2, 3], [-1, 0, -1]), ([4], [-1])]  # 2 leaf paths, then 1: two waves
    tokens, parents, lengths = batch(trees)
    got = tree_logits(model, [[1], [2, 3]], tokens, parents, lengths)
    assert Counting.calls == 2
    assert_scores(got, expected_logits(model.model, [[1], [2, 3]], trees), atol=0.0)


def test_bad_trees_are_refused_before_the_model_sees_them() -> None:
    model = random_tabular_model(VOCAB, seed=3)
    with pytest.raises(ValueError, match="siblings with the same token 2"):
        tree_logits(model, [[1]], torch.tensor([[2, 2]]), torch.tensor([[-1, -1]]), torch.tensor([2]))
    with pytest.raises(ValueError, match="token ids must be in 0..6"):
        tree_logits(model, [[1]], torch.tensor([[9]]), torch.tensor([[-1]]), torch.tensor([1]))
    with pytest.raises(ValueError, match="2 histories for 1 trees"):
        tree_logits(model, [[1], [2]], torch.tensor([[2]]), torch.tensor([[-1]]), torch.tensor([1]))


def tree_rounds(model, reference, scorer, rounds: int, seed: int, atol: float) -> None:
    """Rounds of random trees on 3 rows: score, compare, keep a random path plus one token; rows leave
    and join (a new row id with a fresh prompt) now and then."""
    rng = random.Random(seed)
    histories = {row: [rng.randrange(VOCAB) for _ in range(rng.randint(1, 6))] for row in range(3)}
    next_row = 3
    for _ in range(rounds):
        rows = sorted(histories)
        trees = [random_tree(rng, VOCAB, 6) for _ in rows]
        tokens, parents, lengths = batch(trees)
        got = scorer(model, [histories[r] for r in rows], tokens, parents, lengths, rows)
        assert_scores(got, expected_logits(reference, [histories[r] for r in rows], trees), atol)
        for row, (row_tokens, row_parents) in zip(rows, trees, strict=True):
            paths = node_paths(row_parents, len(row_tokens))
            kept = rng.choice([[], *paths])  # the accepted path: any node's, or none
            histories[row] += [row_tokens[n] for n in kept] + [rng.randrange(VOCAB)]
        if rng.random() < 0.3:  # a row leaves, another joins
            gone = rng.choice(rows)
            model.release_rows([gone])
            del histories[gone]
            histories[next_row] = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 6))]
            next_row += 1


EAGER_TOLERANCE = 1e-6
"""transformers' eager attention takes its softmax in float32 even for a float64 model: a pass over a
cache with holes and a pass without round differently there (about 1e-8 on these models)."""

ADAPTER_SETUPS = [
    ("qwen2", "sdpa", 0.5, FLOAT64_TOLERANCE),
    ("llama", "sdpa", 0.0, FLOAT64_TOLERANCE),
    ("qwen2", "eager", 1.0, EAGER_TOLERANCE),
]


@pytest.mark.parametrize(("family", "attn", "max_hole_fraction", "atol"), ADAPTER_SETUPS)
def test_the_hf_adapter_scored_path_by_path_matches_full_forwards(
    family, attn, max_hole_fraction, atol
) -> None:
    module = tiny_causal_lm(family, vocab_size=VOCAB, eos_token_id=EOS, attn_implementation=attn).to(
        torch.float64
    )
    model = HFLanguageModel(module, max_hole_fraction=max_hole_fraction)
    reference = FullForwardModel(module, model.eos_token_ids, VOCAB)
    tree_rounds(model, reference, path_tree_logits, rounds=6, seed=1, atol=atol)
