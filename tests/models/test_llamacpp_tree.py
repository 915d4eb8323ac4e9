"""The llama.cpp adapter's tree pass (`LlamaCppModel.tree_logits`: one branch sequence per leaf, one
decode) against path-by-path scoring and against each place scored from scratch, on tiny float32
GGUF models, over rounds of random trees with rows joining and leaving."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from conftest import assert_place_logits, place_logits, random_tree, tree_batch, tree_rounds

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the `llamacpp` extra)")
pytest.importorskip("transformers")

from tiny_gguf import tiny_gguf_pair  # noqa: E402

from exactspec.checking.tiny_hf import TinyHFSpec  # noqa: E402
from exactspec.models.base import StatelessModel  # noqa: E402
from exactspec.models.llamacpp.model import LlamaCppModel  # noqa: E402
from exactspec.models.tree import path_tree_logits, tree_logits  # noqa: E402

SPEC = TinyHFSpec(family="llama", vocab_size=12, hidden_size=32, layers=2, init_std=0.2, seed=3)
SAME_MODEL_TOLERANCE = 1e-5
"""As tests/models/test_llamacpp.py: llama.cpp's CPU sums may round differently with the pass's shape."""


@pytest.fixture(scope="module")
def target_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_gguf_pair(SPEC, tmp_path_factory.mktemp("gguf"))[0]


def open_model(path: Path, **options: object) -> LlamaCppModel:
    settings = {
        "eos_token_ids": {SPEC.eos_token_id},
        "kv_type": "f32",
        "flash_attention": False,
        "threads": 1,
    }
    return LlamaCppModel(path, **{"context": 512, **settings, **options})


class FromScratch(StatelessModel):
    """Each history scored alone through a fresh sequence of its own model (freed after): no cache reused."""

    def __init__(self, model: LlamaCppModel) -> None:
        self.model = model
        self.vocab_size = model.vocab_size
        self.eos_token_ids = model.eos_token_ids

    def logits(self, histories, num_positions=1, rows=None) -> torch.Tensor:
        out = []
        for history in histories:
            out.append(self.model.logits([history], num_positions, rows=[999])[0])
            self.model.release_rows([999])
        return torch.stack(out)


@pytest.mark.parametrize("scorer", [tree_logits, path_tree_logits], ids=["native", "path by path"])
def test_tree_passes_match_each_place_from_scratch(target_path: Path, scorer) -> None:
    model, reference = open_model(target_path), FromScratch(open_model(target_path))
    tree_rounds(model, reference, scorer, SPEC.vocab_size, rounds=8, seed=2, atol=SAME_MODEL_TOLERANCE)


def test_the_native_pass_agrees_with_path_by_path_scoring_and_frees_its_branches(target_path: Path) -> None:
    native, paths = open_model(target_path), open_model(target_path)
    rng = random.Random(6)
    histories = [[rng.randrange(SPEC.vocab_size) for _ in range(rng.randint(1, 5))] for _ in range(3)]
    for _ in range(4):
        trees = [random_tree(rng, SPEC.vocab_size, 7) for _ in histories]
        tokens, parents, lengths = tree_batch(trees)
        one_pass = native.tree_logits(histories, tokens, parents, lengths)
        by_path = path_tree_logits(paths, histories, tokens, parents, lengths, [0, 1, 2])
        assert_place_logits(one_pass, [by_path[b, : n + 1] for b, n in enumerate(lengths.tolist())], 1e-5)
        kept = [rng.choice([[], *_node_paths(tree)]) for tree in trees]
        histories = [
            h + [t[n] for n in k] + [rng.randrange(SPEC.vocab_size)]
            for h, (t, _), k in zip(histories, trees, kept, strict=True)
        ]
    native.logits(histories, 1)  # every pending tree resolved: the branches are free again
    assert not native._pending
    assert [native.cached_tokens(row) for row in range(3)] == histories


def _node_paths(tree: tuple[list[int], list[int]]) -> list[list[int]]:
    from exactspec.foundations.trees import node_paths

    return node_paths(tree[1], len(tree[1]))


def test_the_kept_path_is_not_recomputed(target_path: Path) -> None:
    model = open_model(target_path)
    reference = FromScratch(open_model(target_path))
    history = [1, 2, 3]
    tokens, parents, lengths = tree_batch([([4, 5, 6, 2], [-1, 0, -1, 1])])
    model.tree_logits([history], tokens, parents, lengths)
    decoded = []
    decode = model._decode
    model._decode = lambda feeds, k, out: decoded.append([f for _, _, f in feeds]) or decode(feeds, k, out)
    got = model.logits([history + [6, 3]], 1)  # node 2 (token 6) kept, then 3
    assert decoded == [[[3]]]
    torch.testing.assert_close(
        got, reference.logits([history + [6, 3]], 1), atol=SAME_MODEL_TOLERANCE, rtol=0
    )


def test_trees_that_need_more_branches_than_are_free_are_scored_path_by_path(target_path: Path) -> None:
    model = open_model(target_path, max_rows=1, tree_sequences=2)
    reference = FromScratch(open_model(target_path))
    trees = [([4, 5, 6], [-1, -1, -1])]  # 3 leaves; 3 sequence ids, one of them the row's
    tokens, parents, lengths = tree_batch(trees)
    got = model.tree_logits([[1, 2]], tokens, parents, lengths)
    assert not model._pending  # not a tree pass
    assert_place_logits(got, place_logits(reference, [[1, 2]], trees), SAME_MODEL_TOLERANCE)


def test_a_long_prompt_goes_in_before_the_tree(target_path: Path) -> None:
    model = open_model(target_path, batch_tokens=32)  # at least max_rows + tree_sequences (16 + 16)
    reference = FromScratch(open_model(target_path))
    history = [(3 * i) % SPEC.vocab_size for i in range(70)]  # 3 decodes of at most 32 tokens, then the tree
    trees = [([4, 5, 6, 7], [-1, 0, 0, -1])]
    tokens, parents, lengths = tree_batch(trees)
    got = model.tree_logits([history], tokens, parents, lengths)
    assert model._pending  # the tree went in one decode after the prompt
    assert_place_logits(got, place_logits(reference, [history], trees), SAME_MODEL_TOLERANCE)


def test_released_rows_free_their_branches(target_path: Path) -> None:
    model = open_model(target_path, max_rows=2, tree_sequences=3)
    tokens, parents, lengths = tree_batch([([4, 5, 6], [-1, -1, -1]), ([], [])])
    model.tree_logits([[1], [2]], tokens, parents, lengths, rows=[0, 1])
    model.release_rows([0])
    model.logits([[3]], 1, rows=[5])  # a new row takes a sequence id the branches had held
    got = model.tree_logits([[3, 1]], *tree_batch([([4, 5, 6], [-1, -1, -1])]), rows=[5])
    assert model._pending[5].place.sequences and got.shape == (1, 4, SPEC.vocab_size)


def test_a_batch_too_small_for_its_sequences_is_refused(target_path: Path) -> None:
    with pytest.raises(ValueError, match=r"batch_tokens \(16\) must be at least max_rows \+ tree_sequences"):
        open_model(target_path, batch_tokens=16)
