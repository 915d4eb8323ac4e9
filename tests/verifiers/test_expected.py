"""Closed-form expected kept tokens per round equal the verifiers' exact (enumerated) means, and the
block weights' sum averages, over enumerated drafts, to block verification's expected kept tokens."""

from __future__ import annotations

import itertools

import pytest
import torch

from exactspec.checking.exact import EnumeratingSampler, enumerate_outputs
from exactspec.verifiers.block import verify_block
from exactspec.verifiers.expected import block_weight_sum, expected_accepted, expected_accepted_tree
from exactspec.verifiers.token import verify
from exactspec.verifiers.tree import verify_tree

VERIFIERS = {"token": verify, "block": verify_block}


def _enumerated_mean(rule: str, tokens, q, p, lengths, eos) -> torch.Tensor:
    """E[num_accepted] per row [B], exactly, by enumerating the verifier's coins and draws."""

    def run(sampler: EnumeratingSampler) -> tuple[int, ...]:
        return tuple(VERIFIERS[rule](tokens, q, p, lengths, eos, sampler).num_accepted.tolist())

    distribution, _ = enumerate_outputs(run)
    mean = torch.zeros(tokens.shape[0], dtype=torch.float64)
    for accepted, probability in distribution.items():
        mean += probability * torch.tensor(accepted, dtype=torch.float64)
    return mean


def _random_round(seed: int, batch: int, gamma: int, vocab: int, sparse: bool):
    generator = torch.Generator().manual_seed(seed)
    p = torch.rand(batch, gamma + 1, vocab, generator=generator, dtype=torch.float64)
    q = torch.rand(batch, gamma, vocab, generator=generator, dtype=torch.float64)
    if sparse:  # zeros in p and q: rejections forced, q(X) = 0 entries never divided by
        p[..., 0] = 0.0
        q[..., 1] = 0.0
    p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
    tokens = torch.randint(0, vocab, (batch, gamma), generator=generator)
    lengths = torch.randint(0, gamma + 1, (batch,), generator=generator)
    return tokens, q, p, lengths


@pytest.mark.parametrize("rule", ["token", "block"])
@pytest.mark.parametrize(
    ("seed", "gamma", "sparse"), list(itertools.product((0, 1, 2), (1, 2, 3), (False, True)))
)
def test_expected_accepted_equals_the_enumerated_mean(rule: str, seed: int, gamma: int, sparse: bool) -> None:
    tokens, q, p, lengths = _random_round(seed, batch=3, gamma=gamma, vocab=3, sparse=sparse)
    eos = {2}  # drafted EOS tokens cut the block, as in the verifiers
    for dense_q in (q, None):  # a sampled draft and a deterministic one
        got = expected_accepted(tokens, dense_q, p, lengths, eos, rule)
        want = _enumerated_mean(rule, tokens, dense_q, p, lengths, eos)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_paper_example_per_draft() -> None:
    # verifiers.block's example: draft (a, b) keeps 1 token by token, 2 by block; (a, a) 3/4 and 1/2.
    p = torch.tensor([[[1 / 3, 2 / 3]] * 3], dtype=torch.float64)
    q = torch.tensor([[[2 / 3, 1 / 3]] * 2], dtype=torch.float64)
    lengths = torch.tensor([2])
    for draft, token, block in (((0, 1), 1.0, 2.0), ((0, 0), 0.75, 0.5)):
        tokens = torch.tensor([list(draft)])
        assert expected_accepted(tokens, q, p, lengths, (), "token").item() == pytest.approx(token, abs=1e-12)
        assert expected_accepted(tokens, q, p, lengths, (), "block").item() == pytest.approx(block, abs=1e-12)


def test_empty_blocks_and_unknown_rule() -> None:
    tokens, q, p, _ = _random_round(0, batch=2, gamma=2, vocab=3, sparse=False)
    zero = expected_accepted(tokens, q, p, torch.tensor([0, 0]), (), "block")
    assert zero.tolist() == [0.0, 0.0]
    empty = expected_accepted(tokens[:, :0], q[:, :0], p[:, :1], torch.tensor([0, 0]), (), "token")
    assert empty.tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="rule"):
        expected_accepted(tokens, q, p, torch.tensor([1, 1]), (), "tree")  # type: ignore[arg-type]


def _draft_tree(seed: int, gamma: int, vocab: int):
    """Every draft path of a context-dependent toy round: per path its q-probability, q [1, gamma, V]
    and p [1, gamma + 1, V] (p_i and q_i depend on the drafted prefix, as with real models)."""
    generator = torch.Generator().manual_seed(seed)
    tables: dict[tuple[tuple[int, ...], str], torch.Tensor] = {}

    def dist(prefix: tuple[int, ...], kind: str) -> torch.Tensor:
        if (prefix, kind) not in tables:
            row = torch.rand(vocab, generator=generator, dtype=torch.float64) ** 2  # uneven rows
            tables[(prefix, kind)] = row / row.sum()
        return tables[(prefix, kind)]

    for path in itertools.product(range(vocab), repeat=gamma):
        q = torch.stack([dist(path[:i], "q") for i in range(gamma)]).unsqueeze(0)
        p = torch.stack([dist(path[:i], "p") for i in range(gamma + 1)]).unsqueeze(0)
        probability = float(torch.prod(torch.stack([q[0, i, x] for i, x in enumerate(path)])))
        yield probability, torch.tensor([list(path)]), q, p


@pytest.mark.parametrize(("seed", "gamma", "eos"), list(itertools.product((0, 1, 2), (1, 2, 3), ((), (2,)))))
def test_block_weight_sum_averages_to_block_verification_over_the_drafts(seed: int, gamma: int, eos) -> None:
    """E_{X ~ q}[w_1 + ... + w_L] = E[tau] of block verification, over every draft (EOS cutting too);
    on every single draft it is at least token verification's E[tau | draft]."""
    weighted = blocked = tokened = 0.0
    lengths = torch.tensor([gamma])
    for probability, tokens, q, p in _draft_tree(seed, gamma, vocab=3):
        weights = block_weight_sum(tokens, q, p, lengths, eos).item()
        token = expected_accepted(tokens, q, p, lengths, eos, "token").item()
        assert weights >= token - 1e-15  # w_i >= prod_{j <= i} a_j on this draft
        weighted += probability * weights
        blocked += probability * expected_accepted(tokens, q, p, lengths, eos, "block").item()
        tokened += probability * token
    assert weighted == pytest.approx(blocked, abs=1e-12)
    if gamma == 1:
        assert weighted == pytest.approx(tokened, abs=1e-15)  # one draft token: the rules coincide


def test_block_weight_sum_of_the_paper_example_and_of_deterministic_drafts() -> None:
    p = torch.tensor([[[1 / 3, 2 / 3]] * 3], dtype=torch.float64)
    q = torch.tensor([[[2 / 3, 1 / 3]] * 2], dtype=torch.float64)
    lengths = torch.tensor([2])
    sums = {
        draft: block_weight_sum(torch.tensor([list(draft)]), q, p, lengths, ()).item()
        for draft in ((0, 0), (0, 1), (1, 0), (1, 1))
    }
    assert sums == pytest.approx({(0, 0): 0.75, (0, 1): 1.5, (1, 0): 1.5, (1, 1): 2.0}, abs=1e-15)
    tokens, _, p, lengths = _random_round(4, batch=3, gamma=3, vocab=4, sparse=True)
    # A deterministic draft (q one-hot): w_i = prod_j p_j(X_j), token verification's own sum.
    torch.testing.assert_close(
        block_weight_sum(tokens, None, p, lengths, {2}),
        expected_accepted(tokens, None, p, lengths, {2}, "token"),
        rtol=0,
        atol=1e-15,
    )
    assert block_weight_sum(tokens[:, :0], None, p[:, :1], torch.tensor([0, 0, 0]), ()).tolist() == [0.0] * 3


# ---------------------------------------------------------------- trees

# Two rows of 5-node trees over a 4-token vocabulary (EOS = 3): a root with three children, one with
# an EOS child (nothing below an accepted EOS), and a second level.
TREE_TOKENS = torch.tensor([[0, 1, 2, 1, 0], [1, 3, 0, 2, 1]])
TREE_PARENTS = torch.tensor([[-1, 0, 0, -1, 3], [-1, -1, 0, 0, 1]])


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("lengths", [(5, 5), (3, 2), (0, 1)])
def test_expected_accepted_tree_equals_the_enumerated_mean_of_the_tree_walk(seed: int, lengths) -> None:
    generator = torch.Generator().manual_seed(seed)
    p = torch.rand(2, 6, 4, generator=generator, dtype=torch.float64)
    p[0, 0, 2] = 0.0  # a zero-probability child
    p = p / p.sum(-1, keepdim=True)
    lengths = torch.tensor(lengths)
    eos = {3}

    def walk(sampler: EnumeratingSampler) -> tuple[int, ...]:
        return tuple(verify_tree(TREE_TOKENS, TREE_PARENTS, p, lengths, eos, sampler).num_accepted.tolist())

    distribution, _ = enumerate_outputs(walk)
    want = torch.zeros(2, dtype=torch.float64)
    for accepted, probability in distribution.items():
        want += probability * torch.tensor(accepted, dtype=torch.float64)
    got = expected_accepted_tree(TREE_TOKENS, TREE_PARENTS, p, lengths, eos)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_the_first_branch_of_a_tree_scores_as_that_chain_alone() -> None:
    generator = torch.Generator().manual_seed(5)
    p = torch.softmax(torch.randn(2, 6, 4, generator=generator, dtype=torch.float64), dim=-1)
    lengths = torch.tensor([5, 5])
    eos = {3}
    first = expected_accepted_tree(TREE_TOKENS, TREE_PARENTS, p, lengths, eos, first_branch=True)
    # Row 0's first branch is nodes 0 -> 1 (p after node 0 is p[:, 1]); row 1's is node 0 -> 2.
    chain_p = torch.stack([p[0, [0, 1, 2]], p[1, [0, 1, 3]]])  # [2, 3, 4]: root, after node 0, after node 1|2
    chain_tokens, chain_lengths = torch.tensor([[0, 1], [1, 0]]), torch.tensor([2, 2])
    chain = expected_accepted(chain_tokens, None, chain_p, chain_lengths, eos, "token")
    torch.testing.assert_close(first, chain, rtol=0, atol=1e-12)
    assert (expected_accepted_tree(TREE_TOKENS, TREE_PARENTS, p, lengths, eos) > first).all()
