"""Tree verification: hand-built cases with known answers, exact laws of random trees, the chain it
reduces to at width 1, and a broken variant that the exact check catches.

The law a round must have (docs/algorithm.md 5, "Several candidates"): each emitted token is drawn
from p at the place the walk has reached, and the walk moves into a child exactly when the emitted
token is that child's token (and not EOS). `_round_law` computes that law straight from the tree and
p, independently of the verifier; `_verifier_law` enumerates the verifier's own draws.
"""

from __future__ import annotations

import pytest
import torch
from conftest import grid_cases

import exactspec.decoding.engine as engine_module
import exactspec.verifiers.tree as tree_module
from exactspec.checking.exact import EnumeratingSampler, check_speculative, enumerate_outputs, total_variation
from exactspec.checking.grid import EXACT_TOLERANCE, TreeCase, run_exact_case
from exactspec.decoding.engine import DecodeConfig
from exactspec.foundations.sampler import SeededSampler
from exactspec.verifiers.base import NO_TOKEN
from exactspec.verifiers.token import verify
from exactspec.verifiers.tree import TreeVerifyResult, verify_tree

EOS = 0
LAW_TOLERANCE = 1e-14


def _tree(
    tokens: list[int], parents: list[int], p_rows: list[list[float]]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One row: tokens [1, N], parents [1, N], p [1, N + 1, V] float64, lengths [1]."""
    return (
        torch.tensor([tokens], dtype=torch.long),
        torch.tensor([parents], dtype=torch.long),
        torch.tensor([p_rows], dtype=torch.float64),
        torch.tensor([len(tokens)]),
    )


def _verifier_law(tokens, parents, p, lengths, eos=(EOS,), verifier=verify_tree) -> dict[tuple, float]:
    """Exact law of (emitted tokens per row, accepted nodes per row, hit_eos per row) of one call."""

    def run(sampler: EnumeratingSampler) -> tuple:
        result = verifier(tokens, parents, p, lengths, eos, sampler)
        emitted = tuple(tuple(result.emitted(b)) for b in range(tokens.shape[0]))
        nodes = tuple(
            tuple(result.accepted_nodes[b, : int(result.num_accepted[b])].tolist())
            for b in range(tokens.shape[0])
        )
        return emitted, nodes, tuple(result.hit_eos.tolist())

    law, _ = enumerate_outputs(run)
    return law


def _emitted_law(law: dict[tuple, float], row: int = 0) -> dict[tuple[int, ...], float]:
    out: dict[tuple[int, ...], float] = {}
    for (emitted, _, _), prob in law.items():
        out[emitted[row]] = out.get(emitted[row], 0.0) + prob
    return out


def _round_law(tokens: list[int], parents: list[int], p: torch.Tensor, eos=(EOS,)) -> dict[tuple, float]:
    """The law a round must have: p at each place, into a child exactly when its token is emitted.

    tokens, parents: one row's tree; p: [N + 1, V].
    """
    child_of = {
        (parent + 1, token): node for node, (token, parent) in enumerate(zip(tokens, parents, strict=True))
    }
    law: dict[tuple, float] = {}

    def extend(place: int, prefix: tuple[int, ...], mass: float) -> None:
        for y, prob in enumerate(p[place].tolist()):
            if prob == 0.0:
                continue
            node = child_of.get((place, y))
            if node is not None and y not in eos:
                extend(node + 1, (*prefix, y), mass * prob)
            else:
                law[(*prefix, y)] = law.get((*prefix, y), 0.0) + mass * prob

    extend(0, (), 1.0)
    return law


def _random_tree(generator: torch.Generator, vocab: int, max_nodes: int) -> tuple[list[int], list[int]]:
    """Random tokens and parents in topological order, no two siblings with the same token."""
    tokens: list[int] = []
    parents: list[int] = []
    for n in range(int(torch.randint(0, max_nodes + 1, (), generator=generator))):
        parent = int(torch.randint(-1, n, (), generator=generator))
        taken = {t for t, q in zip(tokens, parents, strict=True) if q == parent}
        free = [t for t in range(vocab) if t not in taken]
        if not free:
            continue
        tokens.append(free[int(torch.randint(len(free), (), generator=generator))])
        parents.append(parent)
    return tokens, parents


def _random_p(generator: torch.Generator, places: int, vocab: int) -> torch.Tensor:
    """[places, V] float64 distributions with some exact zeros (zero-probability children)."""
    weights = torch.rand(places, vocab, generator=generator, dtype=torch.float64)
    weights[torch.rand(places, vocab, generator=generator) < 0.3] = 0.0
    weights[:, -1] += 1e-3  # every row keeps some mass
    return weights / weights.sum(dim=-1, keepdim=True)


# ---------------------------------------------------------------- hand-built cases


def test_docstring_example() -> None:
    # p at the root [0.1, 0.5, 0.3, 0.1]; nodes: token 1, token 2 (root children), token 3 under node 0.
    after_node_0 = [0.2, 0.2, 0.2, 0.4]
    tokens, parents, p, lengths = _tree(
        [1, 2, 3], [-1, -1, 0], [[0.1, 0.5, 0.3, 0.1], after_node_0, [0.25] * 4, [0.7, 0.1, 0.1, 0.1]]
    )
    law = _verifier_law(tokens, parents, p, lengths)
    emitted = _emitted_law(law)
    assert sum(prob for seq, prob in emitted.items() if seq[0] == 2) == pytest.approx(0.3, abs=1e-15)
    assert emitted[(0,)] == pytest.approx(0.1, abs=1e-15)  # 0.5 * 0.4 * 0.5
    assert emitted[(3,)] == pytest.approx(0.1, abs=1e-15)
    # Token 1 accepted (0.5), then token 3 under it: accepted with 0.4, then the bonus from p after node 2.
    assert emitted[(1, 3, 0)] == pytest.approx(0.5 * 0.4 * 0.7, abs=1e-15)
    assert emitted == pytest.approx(_round_law([1, 2, 3], [-1, -1, 0], p[0]), abs=LAW_TOLERANCE)
    nodes = {(seq[0], accepted[0]) for (seq, accepted, _) in law}
    assert ((1, 3, 0), (0, 2)) in nodes and ((2, 1), (1,)) in nodes and ((3,), ()) in nodes


def test_every_child_rejected_draws_from_p_without_them() -> None:
    # Children 1 and 2 hold 0.8 of the root's mass; when both fail, the draw is from [0.1, 0, 0, 0.1] / 0.2.
    tokens, parents, p, lengths = _tree([1, 2], [-1, -1], [[0.1, 0.5, 0.3, 0.1], [0.25] * 4, [0.25] * 4])
    law = _verifier_law(tokens, parents, p, lengths)
    rejected_both = {key: prob for key, prob in law.items() if key[1] == ((),)}
    assert rejected_both == pytest.approx(
        {(((0,),), ((),), (True,)): 0.1, (((3,),), ((),), (False,)): 0.1}, abs=1e-15
    )


def test_whole_path_accepted_draws_the_bonus_from_the_leaf() -> None:
    # A chain of two nodes the target always keeps: the bonus comes from p after the leaf.
    tokens, parents, p, lengths = _tree([1, 2], [-1, 0], [[0, 1, 0, 0], [0, 0, 1, 0], [0.5, 0, 0, 0.5]])
    law = _verifier_law(tokens, parents, p, lengths)
    assert law == pytest.approx(
        {(((1, 2, 0),), ((0, 1),), (True,)): 0.5, (((1, 2, 3),), ((0, 1),), (False,)): 0.5}, abs=1e-15
    )


def test_zero_probability_children_are_always_rejected() -> None:
    # Tokens 1 and 2 have p = 0: both rejected with probability 1 (the enumeration meets no other branch).
    tokens, parents, p, lengths = _tree([1, 2], [-1, -1], [[0.4, 0, 0, 0.6], [0.25] * 4, [0.25] * 4])
    paths = []

    def run(sampler: EnumeratingSampler) -> tuple:
        result = verify_tree(tokens, parents, p, lengths, (EOS,), sampler)
        paths.append(list(sampler.option_counts))
        return tuple(result.emitted(0))

    law, _ = enumerate_outputs(run)
    assert law == pytest.approx({(0,): 0.4, (3,): 0.6}, abs=1e-15)
    assert all(counts == [2] for counts in paths)  # one draw, over {0, 3}: the children are never drawn


def test_an_accepted_eos_child_ends_the_round_without_bonus() -> None:
    # EOS is a child with p = 0.6; its own child (token 3) can never be reached.
    tokens, parents, p, lengths = _tree([EOS, 3], [-1, 0], [[0.6, 0.4, 0, 0], [0, 0, 0, 1], [0.25] * 4])
    law = _verifier_law(tokens, parents, p, lengths)
    assert law == pytest.approx(
        {(((EOS,),), ((0,),), (True,)): 0.6, (((1,),), ((),), (False,)): 0.4}, abs=1e-15
    )


def test_an_empty_tree_is_one_plain_draw_from_the_root() -> None:
    tokens = torch.zeros(1, 0, dtype=torch.long)
    p = torch.tensor([[[0.25, 0.75]]], dtype=torch.float64)
    law = _verifier_law(tokens, tokens.clone(), p, torch.tensor([0]))
    assert law == pytest.approx({(((0,),), ((),), (True,)): 0.25, (((1,),), ((),), (False,)): 0.75})


def test_padding_nodes_are_never_read() -> None:
    # Row 0 has 1 node, row 1 has 3; row 0's padding (a duplicate of its node, a bad parent) is ignored.
    tokens = torch.tensor([[1, 1, 2], [1, 2, 3]])
    parents = torch.tensor([[-1, 5, -1], [-1, -1, 0]])
    p = torch.tensor([[[0.5, 0.5, 0, 0]] * 4, [[0.25] * 4] * 4], dtype=torch.float64)
    lengths = torch.tensor([1, 3])
    law = _verifier_law(tokens, parents, p, lengths)
    for row, (row_tokens, row_parents) in enumerate([([1], [-1]), ([1, 2, 3], [-1, -1, 0])]):
        expected = _round_law(row_tokens, row_parents, p[row])
        assert _emitted_law(law, row) == pytest.approx(expected, abs=LAW_TOLERANCE)
    result = verify_tree(tokens, parents, p, lengths, (EOS,), SeededSampler(0, num_rows=2))
    assert isinstance(result, TreeVerifyResult)
    assert result.tokens.shape == (2, 3) and result.accepted_nodes.shape == (2, 2)  # depth 2, plus 1


def test_accepted_nodes_follow_the_emitted_tokens() -> None:
    generator = torch.Generator().manual_seed(5)
    tokens_list, parents_list = _random_tree(generator, 4, max_nodes=6)
    tokens, parents, p, lengths = _tree(
        tokens_list, parents_list, _random_p(generator, 7, 4)[: len(tokens_list) + 1].tolist()
    )
    for (emitted, nodes, _), _prob in _verifier_law(tokens, parents, p, lengths).items():
        place = -1
        for token, node in zip(emitted[0], nodes[0], strict=False):
            assert parents_list[node] == place and tokens_list[node] == token
            place = node
        assert len(emitted[0]) in (len(nodes[0]), len(nodes[0]) + 1)


# ---------------------------------------------------------------- width 1 is the chain


def _chain_tree(draft: list[int]) -> torch.Tensor:
    return torch.tensor([[i - 1 for i in range(len(draft))]], dtype=torch.long)


@pytest.mark.parametrize("seed", range(6))
def test_a_width_one_tree_is_the_one_hot_chain_rule(seed: int) -> None:
    generator = torch.Generator().manual_seed(100 + seed)
    vocab, gamma = 4, 3
    draft = torch.randint(vocab, (1, gamma), generator=generator)
    p = _random_p(generator, gamma + 1, vocab).unsqueeze(0)  # [1, gamma + 1, V]
    lengths = torch.tensor([gamma])

    def chain(tokens, parents, p, lengths, eos, sampler):
        return verify(tokens, None, p, lengths, eos, sampler)

    tree_law = _verifier_law(draft, _chain_tree(draft[0].tolist()), p, lengths)
    chain_law = _verifier_law(draft, None, p, lengths, verifier=_with_nodes(chain))
    assert _emitted_law(tree_law) == pytest.approx(_emitted_law(chain_law), abs=1e-15)
    # Token for token: the same coins and draws on a seeded stream, for every seed.
    for stream in range(50):
        tree = verify_tree(draft, _chain_tree(draft[0].tolist()), p, lengths, (EOS,), SeededSampler(stream))
        plain = verify(draft, None, p, lengths, (EOS,), SeededSampler(stream))
        assert torch.equal(tree.tokens, plain.tokens) and torch.equal(tree.num_accepted, plain.num_accepted)
        # The positions a chain proposes: its length, or up to an accepted EOS.
        eos_kept = bool(plain.hit_eos[0]) and int(plain.num_emitted[0]) == int(plain.num_accepted[0])
        assert tree.path_lengths.tolist() == (plain.num_accepted if eos_kept else lengths).tolist()


def _with_nodes(chain):
    """A chain verifier dressed as verify_tree for `_verifier_law` (accepted nodes = 0..num_accepted - 1)."""

    def run(tokens, parents, p, lengths, eos, sampler):
        result = chain(tokens, parents, p, lengths, eos, sampler)
        nodes = torch.arange(tokens.shape[1]).expand(tokens.shape[0], -1)
        return TreeVerifyResult(
            result.tokens,
            result.num_emitted,
            result.num_accepted,
            result.hit_eos,
            accepted_nodes=nodes,
            path_lengths=lengths,
        )

    return run


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("tokens", "parents", "message"),
    [
        ([1, 1], [-1, -1], "siblings with the same token 1"),
        ([1, 2, 2], [-1, 0, 0], "siblings with the same token 2"),
        ([1, 2], [-1, 1], "parent 1; a parent must be -1"),
        ([1, 2], [-1, -2], "parent -2"),
        ([1, 7], [-1, 0], "token ids must be in 0..3"),
    ],
)
def test_malformed_trees_raise(tokens: list[int], parents: list[int], message: str) -> None:
    t, q, p, lengths = _tree(tokens, parents, [[0.25] * 4] * (len(tokens) + 1))
    with pytest.raises(ValueError, match=message):
        verify_tree(t, q, p, lengths, (EOS,), EnumeratingSampler())


def test_bad_shapes_and_probabilities_raise() -> None:
    tokens, parents, p, lengths = _tree([1, 2], [-1, 0], [[0.25] * 4] * 3)
    with pytest.raises(ValueError, match=r"p must be \[B, N \+ 1, V\]"):
        verify_tree(tokens, parents, p[:, :2], lengths, (EOS,), EnumeratingSampler())
    with pytest.raises(ValueError, match="lengths must lie in 0..N=2"):
        verify_tree(tokens, parents, p, torch.tensor([3]), (EOS,), EnumeratingSampler())
    with pytest.raises(ValueError, match="sum to 1"):
        verify_tree(tokens, parents, p * 2, lengths, (EOS,), EnumeratingSampler())
    with pytest.raises(ValueError, match="parents must be"):
        verify_tree(tokens, parents[:, :1], p, lengths, (EOS,), EnumeratingSampler())


# ---------------------------------------------------------------- teeth


def test_teeth_walking_into_a_child_the_draw_did_not_match(monkeypatch: pytest.MonkeyPatch) -> None:
    # The broken rule: on a miss, walk into the first child anyway (the drawn token is still emitted, so the
    # first token's law is right, but the next one is drawn after the wrong history).
    tokens, parents, p, lengths = _tree(
        [1, 2, 3], [-1, -1, 0], [[0.1, 0.5, 0.3, 0.1], [0.0, 0.0, 0.0, 1.0], [0.25] * 4, [0.25] * 4]
    )
    monkeypatch.setattr(tree_module, "matching_child", _broken_match)
    emitted = _emitted_law(_verifier_law(tokens, parents, p, lengths))
    assert total_variation(emitted, _round_law([1, 2, 3], [-1, -1, 0], p[0])) > 0.05


def _broken_match(children: dict[int, int], drawn: int) -> int | None:
    """The child holding the drawn token, else the first child (wrong: its history is not the output's)."""
    return children.get(drawn, next(iter(children.values()), None))


def test_no_token_pads_after_the_emitted_tokens() -> None:
    tokens, parents, p, lengths = _tree([1, 2], [-1, 0], [[0, 0, 1, 0], [0.25] * 4, [0.25] * 4])
    result = verify_tree(tokens, parents, p, lengths, (EOS,), SeededSampler(0))
    assert result.tokens.tolist() == [[2, NO_TOKEN, NO_TOKEN]]
    assert result.accepted_nodes.tolist() == [[NO_TOKEN, NO_TOKEN]]


def test_path_lengths_count_the_candidates_the_path_could_have_kept() -> None:
    # root -> 1 (0) -> 2 (1) -> 3 (2); root -> 2 (3). Ending at the root: 3; after token 2 at the root: 1.
    tokens, parents, p, lengths = _tree(
        [1, 2, 3, 2],
        [-1, 0, 1, -1],
        [[0.1, 0.4, 0.4, 0.1], [0.5, 0, 0, 0.5], [0.25] * 4, [0.25] * 4, [1, 0, 0, 0]],
    )
    seen = {}

    def run(sampler: EnumeratingSampler) -> tuple:
        result = verify_tree(tokens, parents, p, lengths, (EOS,), sampler)
        seen[tuple(result.emitted(0))] = int(result.path_lengths[0])
        return tuple(result.emitted(0))

    enumerate_outputs(run)
    assert seen[(0,)] == 3 and seen[(3,)] == 3  # every root child rejected
    assert seen[(1, 0)] == 3 and seen[(1, 3)] == 3  # token 1 kept, its child 2 rejected: the path is 3 deep
    assert seen[(2, EOS)] == 1  # node 3 kept (a leaf), then the bonus: EOS


# ---------------------------------------------------------------- the exact grid's tree cases

# The toy-table tree cases; those on the HF adapter are tests/checking/test_adapter_grid.py's.
TREE_CASES = grid_cases("tree")


@pytest.mark.parametrize("case", TREE_CASES, ids=lambda case: case.name)
def test_tree_verification_is_exact(case: TreeCase) -> None:
    result = run_exact_case(case)
    assert result.total_variation <= EXACT_TOLERANCE, result.total_variation


EVENTS_BY_CASE = {
    "tree 2-1-1, three levels": {
        "every child rejected",
        "an accepted EOS child",
        "a bonus after a leaf",
        "3 levels",
    },
    "tree target misses an id": {"a zero-probability child", "every child rejected", "a bonus after a leaf"},
    "tree T=0, batch of 2": {"a zero-probability child", "every child rejected", "a bonus after a leaf"},
    "tree T=0.7 top_k=3 top_p=0.95": {
        "a zero-probability child",
        "every child rejected",
        "a bonus after a leaf",
    },
    # Every id is a child of the root: a rejection of all of them is impossible (the last holds all of r).
    "tree every id a child of the root": {"an accepted EOS child", "a bonus after a leaf"},
}


@pytest.mark.parametrize(("name", "expected"), EVENTS_BY_CASE.items(), ids=list(EVENTS_BY_CASE))
def test_the_tree_cases_meet_their_events(
    monkeypatch: pytest.MonkeyPatch, name: str, expected: set[str]
) -> None:
    """What `tree_cases` promises happens on some enumerated path of the case (and the impossible never)."""
    events: set[str] = set()

    def spy(tokens, parents, p, lengths, eos, sampler, rows=None, **options):
        result = verify_tree(tokens, parents, p, lengths, eos, sampler, rows, **options)
        for b in range(tokens.shape[0]):
            accepted, emitted = int(result.num_accepted[b]), int(result.num_emitted[b])
            path = result.accepted_nodes[b, :accepted].tolist()
            reached = [-1, *path]
            for n in range(int(lengths[b])):
                if int(parents[b, n]) in reached and p[b, int(parents[b, n]) + 1, tokens[b, n]] == 0:
                    events.add("a zero-probability child")
            if any(int(tokens[b, n]) in eos for n in path):
                events.add("an accepted EOS child")
            if emitted == accepted + 1 and int(result.path_lengths[b]) > accepted:
                events.add("every child rejected")
            if emitted == accepted + 1 and 0 < accepted == int(result.path_lengths[b]):
                events.add("a bonus after a leaf")
            if accepted >= 3:
                events.add("3 levels")
        return result

    monkeypatch.setattr(engine_module, "verify_tree", spy)
    case = next(c for c in TREE_CASES if c.name == name)
    assert run_exact_case(case).total_variation <= EXACT_TOLERANCE
    assert events >= expected
    if name == "tree every id a child of the root":
        assert "every child rejected" not in events


def test_the_width_one_cases_have_the_chain_law() -> None:
    tree, chain = (
        next(c for c in TREE_CASES if c.name == f"tree width 1{s}")
        for s in ("", " as chains (token verifier)")
    )
    laws = []
    for case in (tree, chain):
        target, draft = case.models()
        config = DecodeConfig(gamma=case.gamma, max_new_tokens=case.max_new_tokens, settings=case.settings)
        laws.append(check_speculative(case.engine_factory(target, draft), case.prompts, config).speculative)
    assert total_variation(*laws) <= 1e-15


def test_teeth_the_broken_walk_fails_the_exact_check(monkeypatch: pytest.MonkeyPatch) -> None:
    case = next(c for c in TREE_CASES if c.name == "tree 3 candidates")
    assert run_exact_case(case).total_variation <= EXACT_TOLERANCE
    monkeypatch.setattr(tree_module, "matching_child", _broken_match)
    assert run_exact_case(case).total_variation > 1e-3


SUFFIX_TREE_CASES = grid_cases("suffix trees")


@pytest.mark.parametrize("case", SUFFIX_TREE_CASES, ids=lambda case: case.name)
def test_suffix_tree_drafts_are_exact_and_branch(case, monkeypatch: pytest.MonkeyPatch) -> None:
    """The suffix drafter's tree drafts, built by the shipped builder, through tree verification."""
    branching = []

    def spy(tokens, parents, p, lengths, *args, **kwargs):
        for b in range(tokens.shape[0]):
            row_parents = parents[b, : int(lengths[b])].tolist()
            branching.append(len(set(row_parents)) < len(row_parents))  # some node has two children
        return verify_tree(tokens, parents, p, lengths, *args, **kwargs)

    monkeypatch.setattr(engine_module, "verify_tree", spy)
    assert run_exact_case(case).total_variation <= EXACT_TOLERANCE
    # Adaptive gamma after earlier requests keeps only depth-limited drafts here: chains as trees.
    assert any(branching) or case.name == "suffix trees, adaptive gamma, after earlier requests"
