"""Prompt lookup where it matches, the draft model where it does not, in the same round."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from exactspec.drafters.base import Drafter, Proposal
from exactspec.drafters.model import ModelDrafter
from exactspec.drafters.ngram import NgramDrafter
from exactspec.drafters.registry import DrafterKind, DrafterParts, register
from exactspec.foundations.rows import RowStart
from exactspec.foundations.sampler import Sampler
from exactspec.foundations.settings import SamplingSettings


class HybridDrafter:
    """Rows whose history has an n-gram match take the free lookup draft; the other rows ask the model.

    Each row's proposal is exact on its own (one-hot q for lookup rows, the
    model's q for model rows), and which source a row uses depends only on
    its history, so the round stays exact (docs/algorithm.md 2.7 and 5).

    A round where both kinds of rows occur returns one dense q [B, gamma, V]
    with one-hot rows for the lookup rows: simpler than a per-row
    "deterministic" flag through both verifiers, and the dense one-hot rows
    cost one [gamma, V] slice per lookup row, no more than the model rows
    already cost. A round where every row uses one source returns that
    source's proposal unchanged (q = None when all rows look up).
    """

    def __init__(self, lookup: NgramDrafter, model_drafter: Drafter, vocab_size: int) -> None:
        """vocab_size: the target's V (the width of the dense q in mixed rounds)."""
        self.lookup = lookup
        self.model_drafter = model_drafter
        self.vocab_size = vocab_size

    def add_rows(self, rows: Sequence[RowStart]) -> None:
        """Rows joining: both drafters set up their state."""
        self.lookup.add_rows(rows)
        self.model_drafter.add_rows(rows)

    def release_rows(self, rows: Sequence[int]) -> None:
        self.lookup.release_rows(rows)
        self.model_drafter.release_rows(rows)

    def observe(self, appended: Mapping[int, Sequence[int]]) -> None:
        self.lookup.observe(appended)
        self.model_drafter.observe(appended)

    def propose(
        self,
        histories: Sequence[Sequence[int]],
        max_tokens: Sequence[int],
        settings: SamplingSettings | Sequence[SamplingSettings],
        sampler: Sampler,
        rows: Sequence[int],
    ) -> Proposal:
        looked_up = self.lookup.propose(histories, max_tokens, settings, sampler, rows)
        lookup_lengths = looked_up.lengths.tolist()
        model_rows = [b for b, limit in enumerate(max_tokens) if limit > 0 and lookup_lengths[b] == 0]
        if not model_rows:
            return looked_up
        drafted = self.model_drafter.propose(
            [histories[b] for b in model_rows],
            [max_tokens[b] for b in model_rows],
            settings if isinstance(settings, SamplingSettings) else [settings[b] for b in model_rows],
            sampler,
            [rows[b] for b in model_rows],
        )
        if len(model_rows) == len(histories):
            return drafted
        return self._merge(looked_up, drafted, model_rows)

    def _merge(self, looked_up: Proposal, drafted: Proposal, model_rows: list[int]) -> Proposal:
        """One dense proposal: lookup rows one-hot, `model_rows` from the model's proposal."""
        batch_size = looked_up.tokens.shape[0]
        width = max(looked_up.tokens.shape[1], drafted.tokens.shape[1])
        dtype = drafted.q.dtype if drafted.q is not None else torch.float32
        device = drafted.tokens.device  # the draft model's device; the lookup ran on the host
        tokens = torch.zeros(batch_size, width, dtype=torch.long, device=device)  # [B, gamma]
        tokens[:, : looked_up.tokens.shape[1]] = looked_up.tokens.to(device)
        q = torch.nn.functional.one_hot(tokens, self.vocab_size).to(dtype)  # [B, gamma, V] one-hot everywhere
        lengths = looked_up.lengths.to(device, copy=True)  # [B]
        index = torch.tensor(model_rows, dtype=torch.long, device=device)  # [M]
        model_width = drafted.tokens.shape[1]
        tokens[index] = 0
        tokens[index, :model_width] = drafted.tokens
        if drafted.q is not None:
            q[index] = 0.0
            q[index, :model_width] = drafted.q
        else:  # a deterministic model drafter: its rows are one-hot on its own tokens too
            q[index] = torch.nn.functional.one_hot(tokens[index], self.vocab_size).to(dtype)
        lengths[index] = drafted.lengths
        return Proposal(tokens=tokens, q=q, lengths=lengths)


def _build(parts: DrafterParts) -> HybridDrafter:
    if parts.draft is None:
        raise ValueError("the hybrid drafter needs a draft model")
    target = parts.target
    model_drafter = ModelDrafter(parts.draft, target.vocab_size, stop=parts.stop)
    return HybridDrafter(NgramDrafter(target.eos_token_ids), model_drafter, target.vocab_size)


KIND = register(
    DrafterKind(
        name="hybrid",
        method="hybrid",
        summary="prompt lookup where the history has a match, the draft model elsewhere",
        needs_draft_model=True,
        free=False,
        build=_build,
        rank=2,
    )
)
