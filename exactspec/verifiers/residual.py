"""Residual arithmetic shared by the verifiers, for a dense q and for a deterministic (one-hot) q.

A deterministic draft (n-gram / prompt lookup, docs/algorithm.md 5) proposes X with
q = one-hot(X). Then q(X) = 1 and [w p - q]+ is w p with the entry at X
replaced by [w p(X) - 1]+ = 0 (w <= 1 and p(X) <= 1), so
sum_x [w p - q]+ = w (1 - p(X)) and the normalised residual is p with X removed,
renormalised: the weight w cancels. These helpers compute exactly that from p
and X alone, without a dense [B, gamma, V] one-hot q; `q_rows=None` means
"one-hot on `drafted`" everywhere below.

One-hot verification is exact whatever chose X, even a random draw: given X,
y comes out with probability p(X) [y = X] + (1 - p(X)) p(y) [y != X] / (1 - p(X))
= p(y). Claiming "deterministic" for sampled tokens only wastes acceptance;
claiming a one-hot on a token other than X does break exactness (q(X) = 0).
"""

from __future__ import annotations

import torch


def draft_probability(q_rows: torch.Tensor | None, drafted: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """q(X) of each drafted token: q_rows [N, V] (or None: one-hot), drafted [N] long -> [N] of `dtype`."""
    if q_rows is None:
        return torch.ones(drafted.shape[0], dtype=dtype, device=drafted.device)
    return q_rows.gather(1, drafted.unsqueeze(-1)).squeeze(-1)


def acceptance_probability(p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """a = min(1, p(X) / q(X)) per entry (docs/algorithm.md 1.2), and 1 where q(X) = 0.

    A token with q(X) = 0 cannot have been drawn, so its coin is never needed; 1 keeps it
    defined (the safe denominator only keeps the unused branch finite). p_x, q_x: same shape.
    """
    usable = q_x > 0
    safe_q = torch.where(usable, q_x, torch.ones_like(q_x))
    return torch.where(usable, (p_x / safe_q).clamp(max=1.0), torch.ones_like(q_x))


def residual_mass(
    p_rows: torch.Tensor,
    q_rows: torch.Tensor | None,
    drafted: torch.Tensor,
    weight: torch.Tensor,
) -> torch.Tensor:
    """sum_x [w p(x) - q(x)]+ per row: p_rows [N, V], q_rows [N, V] or None, drafted [N], weight [N] -> [N].

    With weight 1 this is beta = d_TV(p, q), the token verifier's rejection
    probability (docs/algorithm.md 1.3); block verification uses weight w_i < 1 too.
    """
    if q_rows is None:
        # sum(p) - p(X) rather than 1 - p(X): the same mass that `residual_distribution` normalises.
        return weight * (p_rows.sum(dim=-1) - p_rows.gather(1, drafted.unsqueeze(-1)).squeeze(-1)).clamp(
            min=0.0
        )
    return (weight.unsqueeze(-1) * p_rows - q_rows).clamp(min=0.0).sum(dim=-1)


def residual_distribution(
    p_rows: torch.Tensor,
    q_rows: torch.Tensor | None,
    drafted: torch.Tensor,
    weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """[w p - q]+ normalised: p_rows [N, V], q_rows [N, V] or None, drafted [N], weight [N] -> [N, V].

    weight None means 1 (the token verifier's [p - q]+). A row with zero
    residual mass is drawn from p instead: exactly, that row's residual is
    never sampled (its rejection or stop probability is 0), but in floating
    point a coin can land on it when p and the weighted q differ only by
    rounding, and p is what the exact rule converges to as that difference
    goes to 0 (the same fallback as `exactspec.verifiers.token._residual`).
    """
    if q_rows is None:
        # Weight cancels for a one-hot q: the residual is p with X removed, renormalised.
        excess = p_rows.scatter(1, drafted.unsqueeze(-1), 0.0)  # [N, V]
    else:
        scale = (
            torch.ones(p_rows.shape[0], dtype=p_rows.dtype, device=p_rows.device)
            if weight is None
            else weight.to(p_rows.dtype)
        )
        excess = (scale.unsqueeze(-1) * p_rows - q_rows).clamp(min=0.0)  # [N, V]
    mass = excess.sum(dim=-1, keepdim=True)  # [N, 1]
    degenerate = mass <= 0
    safe_mass = torch.where(degenerate, torch.ones_like(mass), mass)
    return torch.where(degenerate, p_rows, excess / safe_mass)
