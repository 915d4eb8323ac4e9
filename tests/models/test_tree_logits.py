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
from conftest import assert_place_logits, place_logits, random_tree, tiny_causal_lm, tree_batch, tree_rounds

from exactspec.checking.tiny_hf import FullForwardModel
from exactspec.checking.toy import random_tabular_model
from exactspec.foundations.trees import node_paths
from exactspec.models.base import ModelWrapper
from exactspec.models.hf.model import HFLanguageModel
from exactspec.models.tree import TreeScoringModel, path_tree_logits, tree_logits

VOCAB = 7
EOS = 0
FLOAT64_TOLERANCE = 1e-12


def test_a_table_scores_every_place_of_every_tree() -> None:
    model = random_tabular_model(VOCAB, seed=3)
    rng = random.Random(0)
    histories = [[1, 2, 3], [4], [5, 6]]
    trees = [random_tree(rng, VOCAB, 6) for _ in histories]
    trees[1] = ([2, 3, 4], [-1, 0, 1])  # a history of one token under a path of 3
    trees[2] = ([], [])  # an empty tree: the root only
    tokens, parents, lengths = tree_batch(trees)
    got = tree_logits(model, histories, tokens, parents, lengths)
    assert got.shape == (3, tokens.shape[1] + 1, VOCAB)
    assert_place_logits(got, place_logits(model, histories, trees), atol=0.0)
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
    tokens, parents, lengths = tree_batch(trees)
    got = tree_logits(model, [[1], [2, 3]], tokens, parents, lengths)
    assert Counting.calls == 2
    assert_place_logits(got, place_logits(model.model, [[1], [2, 3]], trees), atol=0.0)


def test_bad_trees_are_refused_before_the_model_sees_them() -> None:
    model = random_tabular_model(VOCAB, seed=3)
    with pytest.raises(ValueError, match="siblings with the same token 2"):
        tree_logits(model, [[1]], torch.tensor([[2, 2]]), torch.tensor([[-1, -1]]), torch.tensor([2]))
    with pytest.raises(ValueError, match="token ids must be in 0..6"):
        tree_logits(model, [[1]], torch.tensor([[9]]), torch.tensor([[-1]]), torch.tensor([1]))
    with pytest.raises(ValueError, match="2 histories for 1 trees"):
        tree_logits(model, [[1], [2]], torch.tensor([[2]]), torch.tensor([[-1]]), torch.tensor([1]))


EAGER_TOLERANCE = 1e-6
"""transformers' eager attention takes its softmax in float32 even for a float64 model: a pass over a
cache with holes and a pass without round differently there (about 1e-8 on these models)."""

ADAPTER_SETUPS = [  # (family, attention, max_hole_fraction, tolerance); "sdpa" runs as the grouped attention
    ("qwen2", "sdpa", 0.5, FLOAT64_TOLERANCE),
    ("llama", "sdpa", 0.0, FLOAT64_TOLERANCE),
    ("qwen2", "eager", 1.0, EAGER_TOLERANCE),
    ("llama", "torch sdpa", 0.5, FLOAT64_TOLERANCE),  # transformers' sdpa kept (grouped_attention=False)
]


def float64_module(family: str, attn: str):
    return tiny_causal_lm(family, vocab_size=VOCAB, eos_token_id=EOS, attn_implementation=attn).to(
        torch.float64
    )


@pytest.mark.parametrize(("family", "attn", "max_hole_fraction", "atol"), ADAPTER_SETUPS)
@pytest.mark.parametrize("scorer", [path_tree_logits, tree_logits], ids=["path by path", "native"])
def test_the_hf_adapter_matches_full_forwards(scorer, family, attn, max_hole_fraction, atol) -> None:
    """Rounds of random trees, rows joining and leaving, paths kept, branches rolled back, holes and
    (max_hole_fraction 0) compaction: every place as a full forward of its own history gives it."""
    module = float64_module(family, attn.removeprefix("torch "))
    model = HFLanguageModel(
        module, max_hole_fraction=max_hole_fraction, grouped_attention=attn != "torch sdpa"
    )
    reference = FullForwardModel(module, model.eos_token_ids, VOCAB)
    tree_rounds(model, reference, scorer, VOCAB, rounds=8, seed=1, atol=atol)


def test_the_native_pass_agrees_with_path_by_path_scoring() -> None:
    module = float64_module("llama", "sdpa")
    native, paths = HFLanguageModel(module), HFLanguageModel(module)
    rng = random.Random(4)
    histories = [[rng.randrange(VOCAB) for _ in range(rng.randint(1, 5))] for _ in range(3)]
    for _ in range(4):
        trees = [random_tree(rng, VOCAB, 7) for _ in histories]
        tokens, parents, lengths = tree_batch(trees)
        one_pass = native.tree_logits(histories, tokens, parents, lengths)
        by_path = path_tree_logits(paths, histories, tokens, parents, lengths, [0, 1, 2])
        for b, size in enumerate(lengths.tolist()):
            torch.testing.assert_close(one_pass[b, : size + 1], by_path[b, : size + 1], atol=1e-12, rtol=0)
        for b, (row_tokens, row_parents) in enumerate(trees):
            kept = rng.choice([[], *node_paths(row_parents, len(row_tokens))])
            histories[b] = histories[b] + [row_tokens[n] for n in kept] + [rng.randrange(VOCAB)]


def forward_feeds(module) -> list[tuple[int, ...]]:
    """Records the [B, W] input shape of every forward of `module` (what each call fed)."""
    shapes: list[tuple[int, ...]] = []
    module.register_forward_pre_hook(
        lambda _module, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    return shapes


@pytest.mark.parametrize(
    ("kept", "valid"),
    [
        ([4, 5], [True] * 6),  # the other nodes were the last slots: cropped
        ([6], [True, True, True, False, False, True, True]),  # 4 and 5 stay as holes inside the cache
    ],
)
def test_one_forward_per_tree_and_the_kept_path_is_not_recomputed(kept: list[int], valid: list[bool]) -> None:
    model = HFLanguageModel(float64_module("qwen2", "sdpa"))
    shapes = forward_feeds(model.module)
    history = [1, 2, 3]
    model.logits([history], 1)  # prefill
    tokens, parents, lengths = tree_batch([([4, 5, 6, 2], [-1, 0, -1, 1])])  # 4 -> 5 -> 2, and 6
    model.tree_logits([history], tokens, parents, lengths)
    assert shapes[-1] == (1, 1 + 4)  # the last history token again (its logits), then the 4 nodes
    # The walk kept `kept` and emitted 3: only 3 is new.
    got = model.logits([history + kept + [3]], 1)
    assert shapes[-1] == (1, 1)
    reference = FullForwardModel(model.module, model.eos_token_ids, VOCAB)
    torch.testing.assert_close(got, reference.logits([history + kept + [3]], 1), atol=1e-12, rtol=0)
    assert model._tokens[0] == history + kept + [3]
    assert model._valid[0].tolist() == valid


def test_a_history_that_leaves_the_tree_keeps_nothing_of_it() -> None:
    model = HFLanguageModel(float64_module("qwen2", "sdpa"))
    tokens, parents, lengths = tree_batch([([4, 5], [-1, 0])])
    model.tree_logits([[1, 2]], tokens, parents, lengths)
    got = model.logits([[1, 6, 4, 5]], 2)  # the row went back into its history: recomputed from there
    reference = FullForwardModel(model.module, model.eos_token_ids, VOCAB)
    torch.testing.assert_close(got, reference.logits([[1, 6, 4, 5]], 2), atol=1e-12, rtol=0)


def test_a_row_released_while_another_has_a_pending_tree() -> None:
    module = float64_module("llama", "sdpa")
    model = HFLanguageModel(module, max_hole_fraction=0.0)
    reference = FullForwardModel(module, model.eos_token_ids, VOCAB)
    tokens, parents, lengths = tree_batch([([4, 5, 6], [-1, 0, 1]), ([2], [-1])])
    model.tree_logits([[1, 2, 3, 4, 5, 6], [3]], tokens, parents, lengths, rows=[0, 1])
    model.release_rows([0])  # row 1's tree slot is a trailing hole: it must survive the crop
    shapes = forward_feeds(model.module)
    got = model.logits([[3, 2, 1]], 1, rows=[1])
    assert shapes == [(1, 1)]  # 2 kept from the tree, 1 fed
    torch.testing.assert_close(got, reference.logits([[3, 2, 1]], 1), atol=1e-12, rtol=0)


def test_a_row_joining_in_a_tree_call_and_a_row_left_aside() -> None:
    module = float64_module("qwen2", "sdpa")
    model = HFLanguageModel(module)
    reference = FullForwardModel(module, model.eos_token_ids, VOCAB)
    model.logits([[1, 2], [3, 4, 5, 6]], 1, rows=[0, 1])
    trees = [([4, 5], [-1, -1]), ([6, 1, 2], [-1, 0, 0])]
    tokens, parents, lengths = tree_batch(trees)
    histories = [[1, 2, 3], [2, 2, 2, 2, 2]]
    got = model.tree_logits(histories, tokens, parents, lengths, rows=[0, 7])  # row 7 joins, row 1 aside
    assert_place_logits(got, place_logits(reference, histories, trees), FLOAT64_TOLERANCE)
    # Row 1 (set aside, merged back behind holes) and both tree rows go on: 5 kept for row 0, 6 2 for row 7.
    nexts = [[1, 2, 3, 5, 1], [3, 4, 5, 6, 1], [2, 2, 2, 2, 2, 6, 2, 3]]
    got = model.logits(nexts, 2, rows=[0, 1, 7])
    for b, history in enumerate(nexts):
        torch.testing.assert_close(got[b], reference.logits([history], 2)[0], atol=1e-12, rtol=0)


def test_flash_attention_models_are_scored_path_by_path(monkeypatch: pytest.MonkeyPatch) -> None:
    model = HFLanguageModel(float64_module("qwen2", "sdpa"))
    calls = []
    monkeypatch.setattr(model.module.config, "_attn_implementation", "flash_attention_2")
    fallback = "exactspec.models.rows_cache.path_tree_logits"
    monkeypatch.setattr(fallback, lambda *args: calls.append(args) or torch.zeros(1, 2, VOCAB))
    model.tree_logits([[1]], torch.tensor([[2]]), torch.tensor([[-1]]), torch.tensor([1]))
    assert len(calls) == 1
