"""A smaller language model as the drafter."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

import torch

from exactspec.drafters.base import Proposal
from exactspec.drafters.registry import DrafterKind, DrafterParts, register
from exactspec.foundations.rows import RowStart
from exactspec.foundations.sampler import Sampler
from exactspec.foundations.settings import SamplingSettings
from exactspec.foundations.transforms import probabilities_per_row
from exactspec.models.base import LanguageModel


@runtime_checkable
class DraftStop(Protocol):
    """Decides, token by token, whether a row drafts another token (`decoding.gamma.ConfidenceGamma`)."""

    def keep_drafting(self, row: int, drafted: int, confidence: float) -> bool:
        """Row `row` just drafted its `drafted`-th token this round from a draft distribution whose
        largest probability (the draft model's own softmax, before any sampling transform) was
        `confidence`: draft another? Called for every drafted token in order, the last one too."""
        ...


class ModelDrafter:
    """Samples gamma tokens autoregressively from the draft model's q.

    q is built by the same `probabilities` function, with the same settings and
    each position's real history, as the target's p, and the returned q is
    exactly the tensor the token was drawn from (docs/algorithm.md 2.7).

    A draft vocabulary smaller than the target's (Qwen2.5: 151936 vs 152064
    rows) is padded with -inf logits, i.e. q = 0 on the ids the draft lacks:
    those ids are never proposed, which is exact.

    The draft model's own cache follows the accepted prefix by itself: the
    next round's histories share their prefix with what it has seen, and
    `LanguageModel.logits` rolls back the rest (including the bonus-token
    case, where the draft has not yet seen the last accepted draft token).

    The presence and frequency penalties count a row's generated tokens, so the
    drafter keeps each row's prompt length from `add_rows` (`RowStart.prompt`);
    a penalised row it was not told about is an error, never a guess.

    Coupled (what the builder wires under token verification; docs/algorithm.md 5, "Coupled model
    drafts"): the token at a row's output position t is q's inverse CDF at the uniform the target's
    positioned draw of t uses (`Sampler.draft_at`), and the proposal is deterministic (q None): the
    verifier keeps it where the target's own draw agrees, so every emitted token is the one plain
    decoding draws there with the same seed, whatever the draft. A batch with a row whose prompt the
    drafter was not told (no position to key by) draws from the rows' sequential streams and reports
    q, as uncoupled drafts do.
    """

    def __init__(
        self,
        model: LanguageModel,
        target_vocab_size: int,
        stop: DraftStop | None = None,
        *,
        coupled: bool = False,
    ) -> None:
        """stop: if given, a row stops drafting early when `stop.keep_drafting` says so (within its
        max_tokens); the decision depends on the draft's own distributions only, so it stays exact
        (docs/algorithm.md 5). coupled: draft by the positioned uniforms (the class); False draws from
        the rows' streams and reports q, what block verification needs."""
        if model.vocab_size > target_vocab_size:
            raise ValueError(
                f"the draft vocabulary ({model.vocab_size}) is larger than the target's "
                f"({target_vocab_size}); the draft's ids must be a prefix of the target's"
            )
        self.model = model
        self.target_vocab_size = target_vocab_size
        self.stop = stop
        self.coupled = coupled
        self._prompt_lengths: dict[int, int] = {}  # row id -> its prompt's length (RowStart.prompt)

    def propose(
        self,
        histories: Sequence[Sequence[int]],
        max_tokens: Sequence[int],
        settings: SamplingSettings | Sequence[SamplingSettings],
        sampler: Sampler,
        rows: Sequence[int],
    ) -> Proposal:
        batch_size = len(histories)
        gamma = max(max_tokens, default=0)
        per_row = [settings] * batch_size if isinstance(settings, SamplingSettings) else list(settings)
        device = self.model.device
        tokens = torch.zeros(batch_size, gamma, dtype=torch.long, device=device)  # [B, gamma]
        q: torch.Tensor | None = None  # [B, gamma, V], allocated once the dtype is known
        lengths = torch.zeros(batch_size, dtype=torch.long, device=device)  # [B]
        eos = self.model.eos_token_ids
        live = [b for b in range(batch_size) if max_tokens[b] > 0]
        coupled = self.coupled and all(rows[b] in self._prompt_lengths for b in live)
        # One copy of each drafting row's history per round, its draft tokens appended in place step
        # by step (the histories handed in are the engine's and stay as they are).
        extended = {b: list(histories[b]) for b in live}
        for step in range(gamma):
            if not live:
                break
            contexts = [extended[b] for b in live]
            logits = self.model.logits(contexts, 1, rows=[rows[b] for b in live])[:, 0]  # [A, V_draft]
            confidences = None
            if self.stop is not None:  # the draft's own top probability, exp(max - logsumexp): [A]
                top = logits.max(dim=-1).values - torch.logsumexp(logits, dim=-1)
                confidences = top.exp().tolist()
            logits = _pad_vocab(logits, self.target_vocab_size)  # [A, V]
            live_settings = [per_row[b] for b in live]
            starts = self._prompt_starts([rows[b] for b in live], live_settings)
            q_step = probabilities_per_row(logits, live_settings, contexts, starts)  # [A, V]
            live_rows = [rows[b] for b in live]
            if coupled:  # the token's output position: what the row has emitted, and drafted before it
                positions = [len(extended[b]) - self._prompt_lengths[rows[b]] for b in live]
                drawn = sampler.draft_at(q_step, live_rows, positions)  # [A]
            else:
                drawn = sampler.categorical(q_step, live_rows)  # [A]
            if q is None and not coupled:
                q = torch.zeros(
                    batch_size, gamma, self.target_vocab_size, dtype=q_step.dtype, device=q_step.device
                )
            index = torch.tensor(live, device=tokens.device)
            if q is not None:
                q[index, step] = q_step
            tokens[index, step] = drawn
            lengths[index] += 1
            still_live = []
            for live_index, (b, token) in enumerate(zip(live, drawn.tolist(), strict=True)):
                extended[b].append(token)
                more = token not in eos and step + 1 < max_tokens[b]
                if confidences is not None:
                    assert self.stop is not None
                    more = self.stop.keep_drafting(rows[b], step + 1, confidences[live_index]) and more
                if more:
                    still_live.append(b)
            live = still_live
        if coupled:  # deterministic, but drawn by the draft model: its steps count (`forced.drafter_steps`)
            return Proposal(tokens=tokens, q=None, lengths=lengths, deterministic=True, model_drawn=lengths)
        if q is None:
            q = torch.zeros(batch_size, gamma, self.target_vocab_size, device=device)
        return Proposal(tokens=tokens, q=q, lengths=lengths)

    def add_rows(self, rows: Sequence[RowStart]) -> None:
        """Rows joining: the draft model sets up their state (the stop policy is the engine's to tell)."""
        self.model.add_rows(rows)
        for start in rows:
            if start.prompt:  # an empty prompt means the driver did not say (`RowStart`)
                self._prompt_lengths[start.row] = len(start.prompt)
            else:
                self._prompt_lengths.pop(start.row, None)

    def release_rows(self, rows: Sequence[int]) -> None:
        """Free the draft model's cache of these rows (rows that left the batch)."""
        self.model.release_rows(rows)
        for row in rows:
            self._prompt_lengths.pop(row, None)

    def _prompt_starts(self, rows: Sequence[int], settings: Sequence[SamplingSettings]) -> list[int] | None:
        """Where each row's generated tokens begin, when some row has a presence or frequency penalty or a
        token constraint."""
        if not any(row_settings.reads_output for row_settings in settings):
            return None
        unknown = [row for row in rows if row not in self._prompt_lengths]
        if unknown:
            raise ValueError(
                f"rows {unknown} have a presence or frequency penalty or a constraint but joined without "
                "their prompt (add_rows with RowStart.prompt): the draft cannot tell generated tokens from "
                "the prompt"
            )
        return [self._prompt_lengths[row] for row in rows]

    def observe(self, appended: Mapping[int, Sequence[int]]) -> None:
        """Nothing to update: the draft model's cache follows the histories it is handed (the class)."""


def _pad_vocab(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[N, V_draft] -> [N, V] with -inf (q = 0) on the ids the draft lacks."""
    missing = vocab_size - logits.shape[-1]
    if missing == 0:
        return logits
    return torch.nn.functional.pad(logits, (0, missing), value=float("-inf"))


def _build(parts: DrafterParts) -> ModelDrafter:
    if parts.draft is None:
        raise ValueError("the model drafter needs a draft model")
    return ModelDrafter(parts.draft, parts.target.vocab_size, stop=parts.stop, coupled=parts.coupled)


KIND = register(
    DrafterKind(
        name="model",
        method="speculative",
        summary="the draft model (default): free text, code written from scratch",
        needs_draft_model=True,
        free=False,
        build=_build,
        rank=0,
    )
)
