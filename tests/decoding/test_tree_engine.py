"""The engine's tree path: a proposal with parents is scored in one pass and walked by `verify_tree`.

A tree of width 1 must decode exactly as the same candidates proposed as a chain (token for token on a
seeded stream, with the same metrics); a tree too deep for the row's limit is refused; the repetition
penalty sees each node's own history (a mutant that gives every node the root's history is caught by
the exact check).
"""

from __future__ import annotations

import pytest
import torch

import exactspec.decoding.target_pass as target_pass
from exactspec.checking.exact import check_speculative
from exactspec.checking.toy import FixedTreeDrafter, random_tabular_model, rotating_tree
from exactspec.decoding.engine import DecodeConfig, SpeculativeEngine
from exactspec.foundations.sampler import SeededSampler
from exactspec.foundations.settings import SamplingSettings

VOCAB = 5
PROMPTS = [[1, 2], [3], [4, 4, 1]]


def _target():
    return random_tabular_model(VOCAB, seed=21, sharpness=1.5)


@pytest.mark.parametrize("settings", [SamplingSettings(), SamplingSettings(temperature=0.7, top_k=3)])
def test_a_width_one_tree_decodes_as_the_chain_token_for_token(settings: SamplingSettings) -> None:
    target = _target()
    trees = rotating_tree(VOCAB, (1, 1, 1), seed=5)
    config = DecodeConfig(gamma=3, max_new_tokens=8, settings=settings)
    tree_engine = SpeculativeEngine(target, FixedTreeDrafter(trees, target.eos_token_ids))
    chain_engine = SpeculativeEngine(target, FixedTreeDrafter(trees, target.eos_token_ids, as_chain=True))
    for seed in range(8):
        tree_rows = tree_engine.generate(PROMPTS, config, SeededSampler(seed))
        chain_rows = chain_engine.generate(PROMPTS, config, SeededSampler(seed))
        assert [row.generated for row in tree_rows] == [row.generated for row in chain_rows]
    for counted in ("rounds", "proposed_tokens", "accepted_tokens", "emitted_tokens"):
        assert getattr(tree_engine.metrics, counted) == getattr(chain_engine.metrics, counted), counted
    assert tree_engine.metrics.proposed_by_position == chain_engine.metrics.proposed_by_position
    assert tree_engine.metrics.accepted_by_position == chain_engine.metrics.accepted_by_position
    assert tree_engine.metrics.accepted_tokens > 0  # the candidates are sometimes right


def test_a_tree_round_is_one_target_call_and_counts_the_path_it_took() -> None:
    # root -> 1 -> 2, root -> 3. A round that keeps the leaf 3 could have kept 1 candidate on its path;
    # any other round 2 (the chain's draft length; the tree has 3 nodes).
    target = _target()
    engine = SpeculativeEngine(target, FixedTreeDrafter(lambda history: [(1, -1), (2, 0), (3, -1)]))
    seen = set()
    for seed in range(30):
        state = engine.new_row([1, 2])
        before = engine.metrics.proposed_tokens
        engine.round([state], [0], DecodeConfig(gamma=2, max_new_tokens=5), SeededSampler(seed))
        kept_leaf = state.generated[0] == 3 and len(state.generated) == 2
        assert engine.metrics.proposed_tokens - before == (1 if kept_leaf else 2)
        seen.add(kept_leaf)
    assert seen == {True, False}
    assert engine.metrics.target_calls == 30 and engine.metrics.draft_calls == 0


def test_a_tree_deeper_than_the_rows_limit_is_refused() -> None:
    class Overreaching(FixedTreeDrafter):
        def propose(self, histories, max_tokens, settings, sampler, rows):
            return super().propose(histories, [limit + 1 for limit in max_tokens], settings, sampler, rows)

    engine = SpeculativeEngine(_target(), Overreaching(rotating_tree(VOCAB, (1, 1, 1))))
    with pytest.raises(ValueError, match=r"trees \[3\] deep for rows allowed \[2\] tokens"):
        engine.generate([[1]], DecodeConfig(gamma=2, max_new_tokens=5), SeededSampler(0))


def test_an_empty_tree_is_a_plain_round() -> None:
    target = _target()
    config = DecodeConfig(gamma=2, max_new_tokens=4)
    empty = SpeculativeEngine(target, FixedTreeDrafter(lambda history: []))
    plain = SpeculativeEngine(target)
    assert [r.generated for r in empty.generate(PROMPTS, config, SeededSampler(3))] == [
        r.generated
        for r in plain.generate(PROMPTS, DecodeConfig(gamma=0, max_new_tokens=4), SeededSampler(3))
    ]


def test_teeth_the_repetition_penalty_needs_each_nodes_own_history(monkeypatch: pytest.MonkeyPatch) -> None:
    target = random_tabular_model(4, seed=7, sharpness=1.5)
    drafter = FixedTreeDrafter(rotating_tree(4, (2, 1), seed=3))
    config = DecodeConfig(gamma=2, max_new_tokens=3, settings=SamplingSettings(repetition_penalty=1.5))

    def check() -> float:
        return check_speculative(lambda: SpeculativeEngine(target, drafter), [[1, 2]], config).total_variation

    assert check() <= 1e-12
    original = target_pass.place_histories

    def roots_only(history, tokens, parents, length, num_nodes):
        return [list(history)] * len(original(history, tokens, parents, length, num_nodes))

    monkeypatch.setattr(target_pass, "place_histories", roots_only)
    assert check() > 1e-4


def test_a_tree_proposal_on_a_gpu_run_moves_with_its_parents() -> None:
    # The engine moves a host-side proposal to the target's device; the parents must travel with it.
    proposal = FixedTreeDrafter(lambda history: [(1, -1), (2, -1)]).propose(
        [[1]], [1], SamplingSettings(), None, [0]
    )
    engine = SpeculativeEngine(_target(), FixedTreeDrafter(lambda history: [(1, -1), (2, -1)]))
    moved, _ = engine._draft([[1]], [1], [1], [1], SamplingSettings(), SeededSampler(0), [0], [0])
    assert torch.equal(moved.parents, proposal.parents) and moved.parents.device == engine.device
