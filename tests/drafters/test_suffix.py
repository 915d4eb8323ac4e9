"""Suffix drafting: the counted suffix tree, the drafter's proposals, and that the engine stays exact."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch
from conftest import assert_implements

from exactspec.checking.exact import check_speculative
from exactspec.checking.grid import EXACT_TOLERANCE
from exactspec.checking.toy import TabularModel
from exactspec.decoding.engine import DecodeConfig, SpeculativeEngine
from exactspec.drafters.base import Drafter, shared_state
from exactspec.drafters.ngram import NgramDrafter
from exactspec.drafters.suffix import SuffixDrafter
from exactspec.drafters.suffix_tree import SuffixTree
from exactspec.foundations.rows import RowStart
from exactspec.foundations.sampler import SeededSampler
from exactspec.foundations.settings import SamplingSettings

EOS = {0}
SETTINGS = SamplingSettings()
GREEDY = SamplingSettings(temperature=0.0)


def naive_counts(sequences: list[list[int]], depth: int) -> dict[tuple[int, ...], int]:
    """Occurrences of every string of at most `depth` tokens, counted by brute force."""
    counts: Counter[tuple[int, ...]] = Counter()
    for sequence in sequences:
        for start in range(len(sequence)):
            for length in range(1, min(depth, len(sequence) - start) + 1):
                counts[tuple(sequence[start : start + length])] += 1
    return dict(counts)


def built_at_once(sequences: list[list[int]], depth: int) -> SuffixTree:
    tree = SuffixTree(depth)
    for seq, tokens in enumerate(sequences):
        tree.add(seq, tokens)
    return tree


# ---------------------------------------------------------------- the tree


def test_tree_counts_match_brute_force_while_growing_and_after_evictions() -> None:
    # Small alphabets make long repeats and periodic runs (the hard cases for a compressed tree).
    rng = random.Random(0)
    for _ in range(150):
        depth, vocab = rng.randint(1, 6), rng.randint(1, 3)
        tree = SuffixTree(depth)
        held: list[tuple[int, list[int]]] = []
        for seq in range(rng.randint(1, 5)):
            if held and rng.random() < 0.4:
                tree.remove(held.pop(0)[0])  # the oldest
            tokens = [rng.randrange(vocab) for _ in range(rng.randint(0, 20))]
            grown: list[int] = []
            tree.extend(seq, [])
            while len(grown) < len(tokens):  # in chunks, as rounds append them
                chunk = tokens[len(grown) : len(grown) + rng.randint(1, 4)]
                tree.extend(seq, chunk)
                grown += chunk
                assert tree.trie() == naive_counts([t for _, t in held] + [grown], depth)
            tree.close(seq)
            held.append((seq, tokens))
            texts = [t for _, t in held]
            assert tree.trie() == naive_counts(texts, depth)
            # canonical: the same explicit nodes as a tree built from scratch on what is held
            assert tree.explicit_nodes() == built_at_once(texts, depth).explicit_nodes()
            assert tree.nodes == len(tree.explicit_nodes()) + 1
            assert tree.tokens_held == sum(map(len, texts))


def test_only_the_oldest_closed_sequence_can_be_removed() -> None:
    tree = SuffixTree(3)
    tree.add(0, [1, 2])
    tree.add(1, [2, 3])
    with pytest.raises(ValueError, match="oldest"):
        tree.remove(1)
    tree.extend(2, [4])
    with pytest.raises(ValueError, match="close"):
        tree.remove(0)
    tree.close(2)
    tree.remove(0)
    assert tree.trie() == naive_counts([[2, 3], [4]], 3)
    with pytest.raises(ValueError, match="closed"):
        tree.extend(1, [5])


def test_speculation_follows_the_most_frequent_child_and_stops_below_the_probability() -> None:
    tree = SuffixTree(4)
    tree.add(0, [5, 6, 1, 5, 6, 2, 5, 7, 3])  # after 5: 6 twice, 7 once
    locus = tree.locate([5])
    assert tree.speculate(locus, 2).tokens == (6, 1)  # after (5, 6): 1 and 2 tie, the smaller id
    assert tree.speculate(locus, 2).probabilities == pytest.approx((2 / 3, 1 / 3))
    assert tree.speculate(locus, 2, min_probability=0.5).tokens == (6,)
    assert tree.speculate(locus, 2, eos_token_ids={6}).tokens == (6,)  # nothing after an EOS


# ---------------------------------------------------------------- the drafter's proposals


def propose(drafter: SuffixDrafter, history: list[int], max_tokens: int, row: int = 0) -> list[int]:
    return drafter.propose([history], [max_tokens], SETTINGS, SeededSampler(0), [row]).row_tokens(0)


def test_the_longest_match_wins_and_drafts_at_most_alpha_times_its_length() -> None:
    # (2, 3) was followed by 7 and by 8; the longer suffix (1, 2, 3) only by 7.
    history = [1, 2, 3, 7, 9, 2, 3, 8, 1, 2, 3]
    assert propose(SuffixDrafter(EOS), history, 8) == [7, 9, 2]  # match of 3, alpha 1: 3 tokens
    assert propose(SuffixDrafter(EOS, alpha=2.0), history, 8) == [7, 9, 2, 3, 8, 1]
    assert propose(SuffixDrafter(EOS, alpha=2.0), history, 4) == [7, 9, 2, 3]  # the row's max_tokens
    assert propose(SuffixDrafter(EOS, alpha=2.0, max_spec_tokens=2), history, 8) == [7, 9]
    assert propose(SuffixDrafter(EOS, max_depth=2), history, 8) == [7, 9]  # (2, 3): 7 and 8 tie


def test_the_most_frequent_continuation_wins_over_the_most_recent() -> None:
    history = [5, 6, 1, 5, 6, 2, 5, 7, 3, 5]
    assert propose(SuffixDrafter(EOS), history, 4) == [6]  # 6 twice, 7 (the latest) once
    draft = SuffixDrafter(EOS).draft(0, history, 4)
    assert draft.match_length == 1 and draft.source == "row"
    assert draft.speculation.probabilities == pytest.approx((2 / 3,))


def test_no_draft_below_min_token_probability_after_an_eos_or_without_room() -> None:
    spread = [5, 1, 5, 2, 5, 3, 5, 4, 5, 6, 5, 7, 5, 8, 5, 9, 5, 10, 5, 11, 5, 12, 5]  # 5: 11 ids, once each
    assert propose(SuffixDrafter(EOS), spread, 4) == []
    assert propose(SuffixDrafter(EOS, min_token_probability=0.05), spread, 4) == [1]
    assert propose(SuffixDrafter(EOS, alpha=8.0), [4, 5, 0, 9, 4], 8) == [5, 0]  # EOS ends the draft
    drafter = SuffixDrafter(EOS)
    proposal = drafter.propose([[3, 4, 3], [3, 4, 3]], [0, 2], SETTINGS, SeededSampler(0), [0, 1])
    assert proposal.lengths.tolist() == [0, 1] and proposal.row_tokens(1) == [4]
    assert proposal.deterministic and proposal.q is None and proposal.parents is None


def test_observed_rows_draft_as_if_built_from_their_whole_history() -> None:
    rng = random.Random(1)
    followed = SuffixDrafter(EOS, global_budget_tokens=0)
    prompt = [rng.randrange(4) for _ in range(12)]
    followed.add_rows([RowStart(7, prompt=tuple(prompt))])
    history = list(prompt)
    for _ in range(30):
        fresh = SuffixDrafter(EOS, global_budget_tokens=0)  # indexes the whole history at its first proposal
        assert propose(followed, history, 6, row=7) == propose(fresh, history, 6, row=7)
        chunk = [rng.randrange(4) for _ in range(rng.randint(0, 3))]
        history += chunk
        followed.observe({7: chunk})
    (text,) = followed._rows
    assert text.index.tree.trie() == built_at_once([history], followed.tree_depth).trie()


def test_the_global_tree_learns_released_rows() -> None:
    drafter = SuffixDrafter(EOS)
    drafter.add_rows([RowStart(0, prompt=(1, 2))])
    drafter.observe({0: [8, 9, 10, 11, 12, 0]})
    drafter.release_rows([0])
    assert drafter.global_tree.trie() == naive_counts([[8, 9, 10, 11, 12, 0]], drafter.tree_depth)
    # a new request whose text reaches (8, 9, 10): the earlier answer goes on with 11, 12, EOS
    drafter.add_rows([RowStart(1, prompt=(3, 8, 9, 10))])
    draft = drafter.draft(1, [3, 8, 9, 10], 8)
    assert draft.source == "global" and draft.match_length == 3 and draft.tokens == (11, 12, 0)
    assert drafter.memory().global_tree.tokens == 6 and drafter.memory().rows.tokens == 4
    # what a server's /health reports, asked through the drafter protocol (`drafters.base.shared_state`)
    assert shared_state(drafter) == {"suffix_global_tokens": 6}
    assert shared_state(NgramDrafter(EOS)) == {} and shared_state(None) == {}

    with_prompts = SuffixDrafter(EOS, global_prompts=True)
    with_prompts.add_rows([RowStart(0, prompt=(1, 2))])
    with_prompts.observe({0: [8]})
    with_prompts.release_rows([0])
    assert with_prompts.global_tree.trie() == naive_counts([[1, 2, 8]], with_prompts.tree_depth)


def test_the_global_budget_evicts_the_oldest_request_and_its_counts() -> None:
    texts = [[1, 2, 3, 4], [2, 3, 5], [3, 4, 6, 7]]
    drafter = SuffixDrafter(EOS, global_budget_tokens=8)
    for text in texts:
        drafter.learn(text)
    # 4 + 3 + 4 > 8: the first request went; the counts are those of the other two alone
    assert drafter.global_tree.trie() == naive_counts(texts[1:], drafter.tree_depth)
    scratch = built_at_once(texts[1:], drafter.tree_depth)
    assert drafter.global_tree.explicit_nodes() == scratch.explicit_nodes()
    memory = drafter.memory().global_tree
    assert (memory.tokens, memory.sequences) == (7, 2) and memory.nodes > 1 and memory.approx_bytes > 0
    drafter.learn(list(range(1, 20)))  # longer than the budget: its last 8 tokens
    assert drafter.global_tree.trie() == naive_counts([list(range(12, 20))], drafter.tree_depth)
    assert SuffixDrafter(EOS, global_budget_tokens=0).draft(0, [1, 2, 3], 4).tokens == ()


def test_bad_options_are_refused() -> None:
    bad = ({"max_depth": 0}, {"alpha": 0.0}, {"min_token_probability": 1.5}, {"global_budget_tokens": -1})
    for options in bad:
        with pytest.raises(ValueError):
            SuffixDrafter(EOS, **options)


# ---------------------------------------------------------------- tree drafts


def test_tree_drafts_are_well_formed_and_best_first() -> None:
    # After 5: 6 three times, 7 twice, 8 once; after (5, 6): 1 twice, 2 once.
    history = [5, 6, 1, 5, 6, 1, 5, 6, 2, 5, 7, 3, 5, 7, 4, 5, 8, 9, 5]
    drafter = SuffixDrafter(EOS, alpha=3.0, max_branches=3, max_nodes=6, min_token_probability=0.0)
    proposal = drafter.propose([history, [1, 2]], [3, 3], SETTINGS, SeededSampler(0), [0, 1])
    assert proposal.parents is not None and proposal.lengths.tolist() == [6, 0]
    tokens, parents = proposal.row_tokens(0), proposal.parents[0, :6].tolist()
    draft = drafter.draft(0, history, 3)
    probabilities = draft.speculation.probabilities
    depth = []
    for node, parent in enumerate(parents):
        assert -1 <= parent < node  # topological
        depth.append(1 if parent == -1 else depth[parent] + 1)
        assert depth[-1] <= 3  # the row's max_tokens bounds every path
    for parent in set(parents):
        siblings = [n for n in range(6) if parents[n] == parent]
        assert len({tokens[n] for n in siblings}) == len(siblings)  # distinct
        ranked = [probabilities[n] for n in siblings]
        assert ranked == sorted(ranked, reverse=True)
    # The greedy chain 6 1 5 first (1/2, 1/3, 1/3), then the alternatives best first: 7 (1/3), then
    # 8 and 6 2 (1/6 each), ties in the order they were found.
    assert (tokens, parents) == ([6, 1, 5, 7, 8, 2], [-1, 0, 1, -1, -1, 0])
    assert probabilities[3:] == tuple(sorted(probabilities[3:], reverse=True))
    chain = SuffixDrafter(EOS, alpha=3.0, min_token_probability=0.0).draft(0, history, 3)
    assert chain.parents == (-1, 0, 1) and chain.tokens == (6, 1, 5)  # the tree's first branch


def test_a_trees_first_branch_is_the_chain_even_when_its_nodes_are_unlikely() -> None:
    # After 5: 6 four times, 7 three times; after (5, 6) four different tokens once each, so the chain's
    # second node (1/4 x 4/7 = 1/7) is less likely than the alternative 7 (3/7): best-first alone would
    # spend a 2-node budget on 6 and 7 and lose the chain.
    history = [5, 6, 1, 5, 6, 2, 5, 6, 3, 5, 6, 4, 5, 7, 0, 5, 7, 0, 5, 7, 0, 9, 5]  # matches "5" only
    chain = SuffixDrafter(EOS, alpha=3.0, min_token_probability=0.0).draft(0, history, 2)
    tree = SuffixDrafter(EOS, alpha=3.0, max_branches=2, max_nodes=3, min_token_probability=0.0)
    draft = tree.draft(0, history, 2)
    assert chain.tokens == (6, 1) and draft.tokens[:2] == chain.tokens and draft.parents[:2] == (-1, 0)
    assert draft.tokens[2] == 7 and draft.parents[2] == -1


# ---------------------------------------------------------------- through the engine


def markov_model(vocab_size: int, seed: int, sharpness: float) -> TabularModel:
    """Next-token probabilities that depend on the last token only: greedy text cycles, so it repeats."""
    generator = torch.Generator().manual_seed(seed)
    noise = torch.randn(vocab_size, vocab_size, generator=generator, dtype=torch.float64)  # [V, V]
    logits = sharpness * noise  # [V, V]
    table = torch.softmax(logits, dim=-1)  # [V, V]: row t is P(next | last token t)
    return TabularModel(lambda history: table[history[-1]], vocab_size, EOS)


def test_greedy_speculative_output_equals_plain_greedy_and_drafts_are_kept() -> None:
    target = markov_model(12, seed=3, sharpness=3.0)
    config = DecodeConfig(gamma=6, max_new_tokens=40, settings=GREEDY)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    plain_config = DecodeConfig(gamma=0, max_new_tokens=40, settings=GREEDY)
    plain = SpeculativeEngine(target).generate(prompts, plain_config, SeededSampler(0, num_rows=3))
    drafter = SuffixDrafter(target.eos_token_ids)
    engine = SpeculativeEngine(target, drafter)
    rounds = []
    for _ in range(2):  # the second batch also drafts from the first one's answers (the global tree)
        before = engine.metrics.rounds
        states = engine.generate(prompts, config, SeededSampler(0, num_rows=3))
        assert [state.generated for state in states] == [state.generated for state in plain]
        rounds.append(engine.metrics.rounds - before)
    assert engine.metrics.accepted_tokens > 0
    assert rounds[1] < rounds[0] < 40  # drafts kept; more of them once earlier answers are known
    assert drafter.memory().global_tree.sequences == 6 and drafter.memory().rows.tokens == 0


@pytest.mark.parametrize(
    ("earlier", "prompt"),
    [((), (1, 2, 3, 1, 2)), ((2, 3, 1, 2, 3, 1), (3, 1, 2))],
    ids=["row tree", "global tree"],
)
def test_suffix_drafts_are_exact(earlier: tuple[int, ...], prompt: tuple[int, ...]) -> None:
    # The whole output law, enumerated, equals the target's. `earlier` is a finished request the drafter
    # learned before; each enumerated path gets a fresh drafter that learned the same.
    target = markov_model(4, seed=5, sharpness=1.0)
    config = DecodeConfig(gamma=3, max_new_tokens=3)
    metrics = []

    def drafter() -> SuffixDrafter:
        built = SuffixDrafter(target.eos_token_ids, min_token_probability=0.0)
        built.learn(earlier)
        return built

    def engine() -> SpeculativeEngine:
        built = SpeculativeEngine(target, drafter())
        metrics.append(built.metrics)
        return built

    assert drafter().draft(0, list(prompt), 2).source == ("global" if earlier else "row")
    result = check_speculative(engine, [prompt], config)
    assert result.total_variation <= EXACT_TOLERANCE
    assert sum(m.proposed_tokens for m in metrics) > 0


def test_the_drafter_is_a_drafter() -> None:
    assert_implements(SuffixDrafter(EOS), Drafter)
