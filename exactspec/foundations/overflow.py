"""The two steps of the sampling transforms that can leave float range, written so that they cannot.

`exactspec.foundations.transforms` builds p and q through these (its fast path and its reference
alike, so the two stay bit-identical), which keeps every setting in its documented range
(`exactspec.foundations.settings`) giving finite probabilities that sum to 1:

- Temperature: scores / T overflows once |max score| / T passes the dtype's largest finite value
  (float32: T below about 1e-38 for logits near 1; any T below the dtype's smallest subnormal, where
  T itself rounds to 0). Such a row takes its limit as T -> 0+: uniform over the ids that share the
  row's max score, which is the greedy row (T = 0) whenever the max is unique. Ties keep every tied id,
  as softmax(scores / T) does at every T that does not overflow, so the distribution does not jump
  where overflow begins (T = 0 itself is the greedy convention: the lowest tied id). Every other row
  is divided as before, bit for bit.
- Repetition penalty: a seen logit divided by a small penalty, or multiplied by a large one, can
  leave float range; the result is clamped to the finite range (a banned -inf stays -inf).

Both steps are pure functions of the logits and the settings, so p and q still come from one
definition (docs/algorithm.md 4) and exactness is untouched: a draft row that takes the greedy limit
is the q its token was drawn from, and a target row that does is the p that plain decoding samples.
"""

from __future__ import annotations

import torch

# A row whose max score divided by T is larger in magnitude than this share of the dtype's largest
# finite value takes the T -> 0+ limit. Half rather than all of it leaves room for an elementwise
# division that rounds differently from the one on the row maxima (a reciprocal multiply on some
# devices): no score of such a row can reach inf. The limit is also what softmax would give: two
# distinct floats near a max m with |m| / T above max / 2 lie at least ulp(m) / T > 1e31 apart after
# the division, so exp of the gap is exactly 0 (the subnormal case works out the same).
_OVERFLOW_SHARE = 0.5


def divide_by_temperature(
    scores: torch.Tensor, temperature: float, row_max: torch.Tensor | None
) -> torch.Tensor:
    """scores / temperature, with each row where that would overflow replaced by its T -> 0+ limit.

    Args:
        scores: [N, V] float32 or float64 scores (biased and penalised logits; -inf marks banned ids).
        temperature: T > 0.
        row_max: [N] scores.amax(-1) if the caller has it (else it is computed when T < 1).

    Returns:
        [N, V] scores / T; a row whose max is finite but whose max / T is not safely finite gets 0 on
        every id holding its max and -inf elsewhere, which every later filter keeps whole (each keeps
        the most likely ids) and which softmax turns into the uniform distribution on those ids: the
        one-hot greedy row when the max is unique. Rows whose max is NaN, +inf or -inf (invalid
        logits, or every id banned) are divided as they are, so they fail or give NaN as before.

    Example: float32 scores [[2, 1, 3]] at T = 1e-40: 3 / 1e-40 = 3e40 overflows float32, so the row
    becomes [[-inf, -inf, 0]], softmax [[0, 0, 1]], as at T = 0. Scores [[2, 1, 2]] become
    [[0, -inf, 0]], softmax [[0.5, 0, 0.5]], as at T = 1e-30 (where nothing overflows).
    """
    scaled = scores / temperature
    if temperature >= 1.0:
        return scaled  # |s / T| <= |s|: nothing can overflow
    if row_max is None:
        row_max = scores.amax(dim=-1)  # [N]
    limit = torch.finfo(scores.dtype).max * _OVERFLOW_SHARE
    # NaN compares False: T rounding to 0 in the dtype gives 0 / 0 = NaN for a zero max, caught here.
    too_large = torch.isfinite(row_max) & ~((row_max / temperature).abs() <= limit)  # [N]
    rows = too_large.nonzero().flatten()  # [R]
    if rows.numel() == 0:
        return scaled
    limited = scores[rows]  # [R, V]
    at_max = limited == row_max[rows].unsqueeze(-1)  # [R, V]
    scaled[rows] = torch.zeros_like(limited).masked_fill(~at_max, float("-inf"))
    return scaled


def penalise(seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """Hugging Face's repetition penalty on the logits of seen tokens, clamped to the finite range.

    Args:
        seen: [...] logits of tokens already in their row's history.
        penalty: > 0; a negative logit is multiplied by it, a non-negative one divided.

    Returns:
        [...] the penalised logits; a finite logit stays finite (clamped to +-the dtype's largest
        value where the product or quotient would overflow), -inf stays -inf (a banned token stays
        banned), NaN stays NaN (invalid logits are still caught by the caller's check).
    """
    penalised = torch.where(seen < 0, seen * penalty, seen / penalty)
    largest = torch.finfo(seen.dtype).max
    return torch.where(seen == float("-inf"), seen, penalised.clamp(min=-largest, max=largest))
