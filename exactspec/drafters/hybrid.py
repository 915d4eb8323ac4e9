"""A lookup draft where the history has one, the draft model where it has none, row by row, round by round."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from exactspec.drafters.base import NO_CHAIN, ChainLookup, Drafter, LookupChain, Proposal, shared_state
from exactspec.drafters.model import ModelDrafter
from exactspec.drafters.registry import DrafterKind, DrafterOption, DrafterParts, drafter_kind, register
from exactspec.foundations.rows import RowStart
from exactspec.foundations.sampler import Sampler
from exactspec.foundations.settings import SamplingSettings

LOOKUPS = ("suffix", "ngram")
"""The free drafters a hybrid can look up with (the `lookup` option)."""


class HybridDrafter:
    """Rows whose lookup finds a continuation take that free draft; the other rows ask the draft model.

    The lookup is a free drafter that can say what it would propose for one row (`base.ChainLookup`: the
    suffix drafter, or n-gram prompt lookup), cut to the depth its match length has earned. Grounded text
    (a document being quoted, code being edited) is copied for free; text written from scratch, where
    lookups find nothing, gets the draft model's tokens.

    Under the batch planner the source is chosen with the plan: `probe` looks every row up, the planner
    gives a row with a chain the source whose draft it predicts more tokens per second from (the chain at
    its match length's rates, no draft-model step; the model at the model's rates, with its steps) and
    prices the round accordingly (`decoding.planner.CostAwareGamma`), `settle` hears the choice, and
    `propose` drafts each row from it. Without that, a row looks up and falls back to the model when
    nothing is found. Each row's proposal is exact on its own (one-hot q for lookup rows, the model's q
    for model rows), and which source a row uses depends only on its history and finished rounds, so
    the round stays exact (docs/algorithm.md 2.7 and 5).

    A round where both kinds of rows occur returns one dense q [B, gamma, V] with one-hot rows for the
    lookup rows: simpler than a per-row "deterministic" flag through both verifiers, and the dense one-hot
    rows cost one [gamma, V] slice per lookup row, no more than the model rows already cost. A round where
    every row uses one source returns that source's proposal (q = None when all rows look up).
    """

    def __init__(self, lookup: ChainLookup, model_drafter: Drafter, vocab_size: int) -> None:
        """lookup: a free drafter that says its chain per row (`ChainLookup`); vocab_size: the target's V
        (the width of the dense q in mixed rounds)."""
        self.lookup = lookup
        self.model_drafter = model_drafter
        self.vocab_size = vocab_size
        self._looks_up: dict[int, bool] = {}  # row -> the plan's source this round (True: its chain)
        self._probed: dict[int, tuple[int, LookupChain]] = {}  # row -> (history length, chain) probed

    def add_rows(self, rows: Sequence[RowStart]) -> None:
        """Rows joining: both drafters set up their state."""
        self.lookup.add_rows(rows)
        self.model_drafter.add_rows(rows)

    def release_rows(self, rows: Sequence[int]) -> None:
        self.lookup.release_rows(rows)
        self.model_drafter.release_rows(rows)
        for row in rows:
            self._looks_up.pop(row, None)

    def observe(self, appended: Mapping[int, Sequence[int]]) -> None:
        self.lookup.observe(appended)
        self.model_drafter.observe(appended)

    def shared_state(self) -> dict[str, int]:
        """What the lookup keeps across requests (the suffix drafter's global tree), for /health."""
        return shared_state(self.lookup)  # type: ignore[arg-type]

    def probe(
        self, histories: Sequence[Sequence[int]], limits: Sequence[int], rows: Sequence[int]
    ) -> list[LookupChain]:
        """Before the round is planned: each row's lookup chain, at most limits[b] tokens (maybe none). The
        chains are kept for `propose`: what the plan priced is what a lookup row drafts."""
        chains = [
            self.lookup.lookup(row, history, limit) if limit > 0 else NO_CHAIN
            for history, limit, row in zip(histories, limits, rows, strict=True)
        ]
        self._probed = {
            row: (len(history), chain) for history, row, chain in zip(histories, rows, chains, strict=True)
        }
        return chains

    def settle(self, rows: Sequence[int], looks_up: Sequence[bool]) -> None:
        """The plan's choice, per row: its lookup chain (True) or the draft model (False) in the next
        `propose`."""
        self._looks_up = dict(zip(rows, looks_up, strict=True))

    def propose(
        self,
        histories: Sequence[Sequence[int]],
        max_tokens: Sequence[int],
        settings: SamplingSettings | Sequence[SamplingSettings],
        sampler: Sampler,
        rows: Sequence[int],
    ) -> Proposal:
        looks_up, self._looks_up = self._looks_up, {}
        probed, self._probed = self._probed, {}
        chains = [
            self._chain(row, history, limit, probed.get(row)) if looks_up.get(row, True) else NO_CHAIN
            for history, limit, row in zip(histories, max_tokens, rows, strict=True)
        ]
        chain_tokens = [chain.tokens for chain in chains]
        looked_up = Proposal.from_chains(chain_tokens)
        model_rows = [
            b
            for b, (limit, row) in enumerate(zip(max_tokens, rows, strict=True))
            if limit > 0 and not chains[b].tokens and not looks_up.get(row, False)
        ]
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
        return self._merge(chain_tokens, looked_up, drafted, model_rows)

    def _chain(
        self, row: int, history: Sequence[int], limit: int, probed: tuple[int, LookupChain] | None
    ) -> LookupChain:
        """The row's chain, at most `limit` tokens: the probed one where the history is still the one
        probed (forced tokens put before the draft lengthen it: then it is looked up again)."""
        if limit <= 0:
            return NO_CHAIN
        if probed is not None and probed[0] == len(history):
            chain = probed[1]
            return LookupChain(chain.tokens[:limit], chain.order) if chain.tokens else NO_CHAIN
        return self.lookup.lookup(row, history, limit)

    def _merge(
        self, chain_tokens: list[list[int]], looked_up: Proposal, drafted: Proposal, model_rows: list[int]
    ) -> Proposal:
        """One proposal: the lookup rows' chains (`chain_tokens`, as `looked_up` holds them), `model_rows`
        from the model's proposal; deterministic when the model's is (coupled drafts), else dense with the
        lookup rows one-hot."""
        if drafted.q is None:
            chains = list(chain_tokens)
            for index, b in enumerate(model_rows):
                chains[b] = drafted.tokens[index, : int(drafted.lengths[index])].tolist()
            merged = Proposal.from_chains(chains)
            model_drawn = torch.zeros_like(merged.lengths)  # [B]: the lookup rows drew theirs from no model
            model_drawn[model_rows] = drafted.lengths.to(model_drawn.device)
            return dataclasses.replace(merged, model_drawn=model_drawn).to(drafted.tokens.device)
        batch_size = looked_up.tokens.shape[0]
        width = max(looked_up.tokens.shape[1], drafted.tokens.shape[1])
        dtype = drafted.q.dtype
        device = drafted.tokens.device  # the draft model's device; the lookup ran on the host
        tokens = torch.zeros(batch_size, width, dtype=torch.long, device=device)  # [B, gamma]
        tokens[:, : looked_up.tokens.shape[1]] = looked_up.tokens.to(device)
        q = torch.nn.functional.one_hot(tokens, self.vocab_size).to(dtype)  # [B, gamma, V] one-hot everywhere
        lengths = looked_up.lengths.to(device, copy=True)  # [B]
        index = torch.tensor(model_rows, dtype=torch.long, device=device)  # [M]
        model_width = drafted.tokens.shape[1]
        tokens[index] = 0
        tokens[index, :model_width] = drafted.tokens
        q[index] = 0.0
        q[index, :model_width] = drafted.q
        lengths[index] = drafted.lengths
        model_drawn = torch.zeros_like(lengths)  # [B]: the lookup rows drew theirs from no model
        model_drawn[index] = drafted.lengths
        return Proposal(tokens=tokens, q=q, lengths=lengths, model_drawn=model_drawn)


def _lookup_kind(options: Mapping[str, Any]) -> tuple[DrafterKind, dict[str, Any]]:
    """The registered free drafter the hybrid looks up with, and its default options."""
    kind = drafter_kind(options["lookup"])
    return kind, kind.resolve_options()


def _build(parts: DrafterParts) -> HybridDrafter:
    if parts.draft is None:
        raise ValueError("the hybrid drafter needs a draft model")
    target = parts.target
    model_drafter = ModelDrafter(parts.draft, target.vocab_size, stop=parts.stop, coupled=parts.coupled)
    kind, options = _lookup_kind(parts.options)
    lookup = kind.build(
        DrafterParts(target, None, options, lengths=parts.lengths)
    )  # as --drafter NAME builds it
    assert isinstance(lookup, ChainLookup)
    return HybridDrafter(lookup, model_drafter, target.vocab_size)


def _max_match_order(options: Mapping[str, Any]) -> int:
    kind, lookup_options = _lookup_kind(options)
    return kind.max_match_order(lookup_options)


KIND = register(
    DrafterKind(
        name="hybrid",
        method="hybrid",
        summary="a free lookup draft (suffix trees, or n-grams) where the history has one, the draft model "
        "elsewhere: mixed work, partly grounded and partly written from scratch",
        needs_draft_model=True,
        free=False,
        build=_build,
        max_match_order=_max_match_order,
        options=(
            DrafterOption(
                "lookup", str, "suffix", "the lookup: suffix (trees) or ngram (prompt lookup)", LOOKUPS
            ),
        ),
        rank=2,
    )
)
