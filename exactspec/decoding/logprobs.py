"""What a request that asks for log-probabilities gets: for each emitted token, the log of the target's p
at its position (after the request's transforms, docs/algorithm.md 4) and the most likely alternatives.

Every emitted token is reported from the p of the position it was emitted at, whether it was a kept
draft token, a residual draw or the bonus: the number plain decoding (gamma = 0) reports for the same
token after the same history, so a seeded request gives the same tokens and log-probabilities with and
without speculation (on a batch-invariant backend bit for bit; elsewhere within the float rounding of a
wider target pass, docs/numerics.md).

- A sampled row (temperature > 0) reports log p, the distribution its token was drawn from: after the
  temperature, top-k, top-p and min-p. Ids those filters removed have p = 0; their log is reported as
  FILTERED_LOGPROB (JSON has no -inf; vLLM reports the same number).
- A greedy row (temperature 0) has a one-hot p, whose log says nothing; it reports the log-softmax of its
  biased and penalised logits instead (the scores its argmax is taken over: temperature 1, no filters),
  so its token is the top alternative.

Nothing here runs for a row that did not ask (`RowState.logprobs` None): the rounds of such rows build
nothing more than before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from exactspec.foundations.settings import SamplingSettings
from exactspec.foundations.transforms import penalised_scores
from exactspec.verifiers.base import VerifyResult

TOP_LOGPROBS_MAX = 20
"""Most alternatives a request may ask for per token (OpenAI's top_logprobs range, 0..20)."""
FILTERED_LOGPROB = -9999.0
"""The log-probability reported for an id the row's filters removed (p = 0)."""


@dataclass(frozen=True)
class TokenLogprob:
    """One emitted token: its id, log p of it at its position, and the `top` most likely ids with theirs
    (most likely first; among equal values the lower id first, and which of several ids tied at the
    last place is listed is left to `torch.topk`)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def reported_log_probs(
    logits: torch.Tensor,
    p: torch.Tensor | None,
    settings: Sequence[SamplingSettings],
    histories: Sequence[Sequence[int]] | None,
    prompt_lengths: Sequence[int] | None,
) -> torch.Tensor:
    """[N, V] float32 log-probabilities each position reports (the module docstring).

    Args:
        logits: [N, V] the target's raw logits at the positions.
        p: [N, V] their probabilities (`transforms.probabilities_per_row`), or None when the caller
            built none (rows that are all greedy); needed for every sampled row.
        settings, histories, prompt_lengths: per position, as the transforms take them.
    """
    out = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)  # [N, V]
    for n, row_settings in enumerate(settings):
        if row_settings.greedy:
            history = None if histories is None else [histories[n]]
            start = None if prompt_lengths is None else [prompt_lengths[n]]
            scores = penalised_scores(logits[n : n + 1], row_settings, history, start)  # [1, V]
            out[n] = torch.log_softmax(scores[0].double(), dim=-1).float()
        else:
            if p is None:
                raise ValueError("a sampled row's log-probabilities need its p")
            out[n] = torch.log(p[n].double()).float()
    return out.clamp_(min=FILTERED_LOGPROB)


def emitted(
    reported: torch.Tensor, places: Sequence[int], tokens: Sequence[int], top: int
) -> list[TokenLogprob]:
    """One row's `TokenLogprob`s: token j read from reported[places[j]].

    Args:
        reported: [W, V] the row's reported log-probabilities at each scored place of its round.
        places: which place each emitted token was drawn at (a chain: 0, 1, ...; a tree: the root, then
            each kept node's place).
        tokens: the emitted ids, as many as places.
        top: how many alternatives to list (0: none).

    Example: reported [[-0.1, -2.4], [-1.2, -0.4]], places [0, 1], tokens [0, 1], top 1 gives
    TokenLogprob(0, -0.1, ((0, -0.1),)) and TokenLogprob(1, -0.4, ((1, -0.4),)).
    """
    rows = reported[list(places)]  # [J, V]
    chosen = rows.gather(1, torch.tensor(tokens, device=rows.device).unsqueeze(-1))[:, 0].tolist()  # [J]
    if top == 0:
        return [TokenLogprob(token, value) for token, value in zip(tokens, chosen, strict=True)]
    values, ids = torch.topk(rows, min(top, rows.shape[-1]), dim=-1)  # [J, k] each
    out = []
    for token, value, row_ids, row_values in zip(tokens, chosen, ids.tolist(), values.tolist(), strict=True):
        ranked = sorted(zip(row_ids, row_values, strict=True), key=lambda pair: (-pair[1], pair[0]))
        out.append(TokenLogprob(token, value, tuple(ranked)))
    return out


def round_logprobs(
    reported: dict[int, torch.Tensor], result: VerifyResult, rows: Sequence[int], top: Sequence[int | None]
) -> dict[int, list[TokenLogprob]]:
    """Row id -> the `TokenLogprob`s of the tokens its round emitted, for the rows that asked (`reported`
    holds their places, by position b in the round; top[b] their number of alternatives).

    A chain's token j was drawn at place j; a tree's at the root (place 0), then after each kept node n
    (place n + 1, `TreeVerifyResult.accepted_nodes`)."""
    if not reported:
        return {}
    emitted_counts = result.num_emitted.tolist()
    accepted_nodes = getattr(result, "accepted_nodes", None)
    out: dict[int, list[TokenLogprob]] = {}
    for b, log_probs in reported.items():
        count = emitted_counts[b]
        tokens = result.tokens[b, :count].tolist()
        if accepted_nodes is None:
            places = list(range(count))
        else:
            places = [0, *(node + 1 for node in accepted_nodes[b, : count - 1].tolist())]
        out[rows[b]] = emitted(log_probs, places, tokens, top[b] or 0)
    return out
