"""What a bench run through our engine records beside the method's own work: every model call by round
(`PassLog`, written by `LoggedModel`), the target without EOS ids when every side must make the same
number of tokens (`NoEos`), and each verification rule's expected kept draft tokens on the run's own
rounds (`ExpectationRecorder`), with the time that scoring takes, which the run's clocks leave out.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from exactspec.bench.records import ExpectedAccepted
from exactspec.models.base import LanguageModel, ModelWrapper
from exactspec.verifiers.base import Verifier, VerifyResult
from exactspec.verifiers.expected import block_weight_sum, expected_accepted, expected_accepted_tree
from exactspec.verifiers.tree import TreeVerifyResult


class NoEos(ModelWrapper):
    """A `LanguageModel` that is `model` with no EOS ids, so generation always runs to max_new_tokens."""

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return frozenset()


class PassLog:
    """Every model call of one generation through our engine, by round (`LoggedModel` writes it).

    `rounds`: per round, (draft model steps, tokens scored by each target call), closed by `end_round`
    when the engine reports the round (a tree scored path by path is several target calls);
    `target_calls`, `draft_calls`: (positions scored, seconds) of every call, in order.
    """

    def __init__(self) -> None:
        self.rounds: list[tuple[int, ...]] = []
        self.target_calls: list[tuple[int, float]] = []
        self.draft_calls: list[tuple[int, float]] = []
        self._draft_steps = 0
        self._target_widths: list[int] = []

    def record(self, role: str, positions: int, seconds: float) -> None:
        if role == "target":
            self.target_calls.append((positions, seconds))
            self._target_widths.append(positions)
        else:
            self.draft_calls.append((positions, seconds))
            self._draft_steps += 1

    def end_round(self) -> None:
        self.rounds.append((self._draft_steps, *self._target_widths))
        self._draft_steps, self._target_widths = 0, []


class LoggedModel(ModelWrapper):
    """`model` with each `logits` call noted in a `PassLog` as `role` ("target" or "draft"), and timed."""

    def __init__(self, model: LanguageModel, log: PassLog, role: str) -> None:
        super().__init__(model)
        self.log = log
        self.role = role

    def logits(
        self,
        histories: Sequence[Sequence[int]],
        num_positions: int = 1,
        rows: Sequence[int] | None = None,
    ) -> torch.Tensor:
        started = time.perf_counter()
        out = self.model.logits(histories, num_positions, rows)  # [B, k, V]
        self.log.record(self.role, num_positions, time.perf_counter() - started)
        return out


class ExpectationRecorder:
    """A verifier that runs `verifier` and adds up each rule's expected kept draft tokens on the same rounds.

    Two runs with different verifiers sample different paths, so their tokens per
    round differ by chance as well as by rule; scoring both rules on one run's own
    rounds (`exactspec.verifiers.expected`) compares them on identical drafts and
    targets. `block_weights` adds up block verification's weights, whose mean over
    drafts is its expected kept tokens too (`verifiers.expected.block_weight_sum`).
    `seconds` is the time spent scoring, which `run_engine` takes out of the run's
    timings so that the timed work is the verifier's alone.
    """

    def __init__(
        self,
        verifier: Verifier,
        tree_verifier: Callable[..., TreeVerifyResult],
        greedy_verifier: Callable[..., VerifyResult] | None = None,
        vocab_size: int = 0,
    ) -> None:
        """greedy_verifier, vocab_size: the engine's greedy rounds' verifier (`verify_greedy`), and the
        vocabulary its rounds' one-hot p is rebuilt over for the scoring."""
        self.verifier = verifier
        self.tree_verifier = tree_verifier
        self.greedy_verifier = greedy_verifier
        self.vocab_size = vocab_size
        # E[kept | drafts] per rule, and block verification's weights summed (its estimate over drafts);
        # for trees, E[accepted | tree] walking the whole tree and its first branch alone.
        self.expected = {"token": 0.0, "block": 0.0, "block_weights": 0.0, "tree": 0.0, "first_branch": 0.0}
        self.rounds = 0
        self.tree_rounds = 0
        self.seconds = 0.0
        self._seconds_timed = 0.0  # `seconds` when the engine's last round was timed

    @classmethod
    def installed(cls, engine: Any) -> ExpectationRecorder:
        """A recorder in every verifier slot of `engine` (chains, trees, greedy rounds), and its timer."""
        recorder = cls(
            engine.verifier, engine.tree_verifier, engine.greedy_verifier, engine.target.vocab_size
        )
        engine.verifier = recorder
        engine.tree_verifier = recorder.verify_tree
        if engine.greedy_verifier is not None:
            engine.greedy_verifier = recorder.verify_greedy
        engine.round_timer = recorder.round_timer
        return recorder

    def round_timer(self, shape: Any, seconds: float) -> float:
        """The engine's `round_timer`: a round's wall time less its scoring here, so that a planner learns the
        method's round times (the scoring comes off every clock of the run)."""
        scored, self._seconds_timed = self.seconds - self._seconds_timed, self.seconds
        return seconds - scored

    def __call__(
        self,
        draft_tokens: torch.Tensor,
        q: torch.Tensor | None,
        p: torch.Tensor,
        draft_lengths: torch.Tensor,
        eos_token_ids: Any,
        sampler: Any,
        rows: Sequence[int] | None = None,
        *,
        validate: bool = True,
        positions: Sequence[int] | None = None,
    ) -> VerifyResult:
        started = time.perf_counter()
        self._score(draft_tokens, q, p, draft_lengths, eos_token_ids)
        self.seconds += time.perf_counter() - started
        options = {"validate": validate, "positions": positions}
        return self.verifier(draft_tokens, q, p, draft_lengths, eos_token_ids, sampler, rows, **options)

    def verify_greedy(
        self,
        draft_tokens: torch.Tensor,
        target_ids: torch.Tensor,
        draft_lengths: torch.Tensor,
        eos_token_ids: Any,
    ) -> VerifyResult:
        """The engine's greedy rounds (no p built, `verifiers.token.verify_greedy`): scored as `__call__`
        scores a round, on the one-hot p they stand for (built here, on the scoring's clock), then
        verified by the engine's own greedy verifier."""
        assert self.greedy_verifier is not None
        started = time.perf_counter()
        batch, width = target_ids.shape
        p = torch.zeros(batch, width, self.vocab_size, device=target_ids.device)  # [B, gamma + 1, V]
        p.scatter_(2, target_ids.unsqueeze(-1), 1.0)
        self._score(draft_tokens, None, p, draft_lengths, eos_token_ids)
        self.seconds += time.perf_counter() - started
        return self.greedy_verifier(draft_tokens, target_ids, draft_lengths, eos_token_ids)

    def _score(
        self,
        draft_tokens: torch.Tensor,
        q: torch.Tensor | None,
        p: torch.Tensor,
        draft_lengths: torch.Tensor,
        eos_token_ids: Any,
    ) -> None:
        """Add one round's E[kept | drafts] under each rule, block verification's weights and its
        row-rounds (one per row verified)."""
        for rule in ("token", "block"):
            self.expected[rule] += float(
                expected_accepted(draft_tokens, q, p, draft_lengths, eos_token_ids, rule).sum()
            )
        self.expected["block_weights"] += float(
            block_weight_sum(draft_tokens, q, p, draft_lengths, eos_token_ids).sum()
        )
        self.rounds += draft_tokens.shape[0]

    def verify_tree(
        self,
        tokens: torch.Tensor,
        parents: torch.Tensor,
        p: torch.Tensor,
        lengths: torch.Tensor,
        eos_token_ids: Any,
        *args: Any,
        **options: Any,
    ) -> TreeVerifyResult:
        """The engine's tree walk, with the tree and its first branch scored on the same p first."""
        started = time.perf_counter()
        eos = eos_token_ids
        for key, first_branch in (("tree", False), ("first_branch", True)):
            scored = expected_accepted_tree(tokens, parents, p, lengths, eos, first_branch=first_branch)
            self.expected[key] += float(scored.sum())
        self.tree_rounds += tokens.shape[0]
        self.seconds += time.perf_counter() - started
        return self.tree_verifier(tokens, parents, p, lengths, eos_token_ids, *args, **options)

    def record(self) -> ExpectedAccepted:
        """The sums so far, as bench.json keeps them."""
        return ExpectedAccepted(
            token=self.expected["token"],
            block=self.expected["block"],
            rounds=self.rounds,
            block_weights=self.expected["block_weights"],
            tree=self.expected["tree"],
            tree_first_branch=self.expected["first_branch"],
            tree_rounds=self.tree_rounds,
        )
