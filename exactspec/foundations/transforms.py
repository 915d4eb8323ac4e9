"""Sampling transforms: logits plus the request's settings -> the distribution sampled from.

One function, `probabilities`, builds p from the target's logits and q from the
draft's logits (docs/algorithm.md section 4): if the two were built differently, the
acceptance rule would compare distributions that are not the ones the tokens
were drawn from, and the output would silently stop being exact.

Order and definitions follow Hugging Face `generate` (logit bias, repetition
penalty, temperature, top-k, top-p, min-p), so exactspec's p is the p that a
Hugging Face user already means by these settings. OpenAI's presence and
frequency penalties (`exactspec.foundations.penalties`) come right after the
repetition penalty, on the logits, as in vLLM.

`probabilities` is the fast path; `_probabilities_reference` is the original
straightforward implementation (a full stable sort for top-p, a second softmax
for min-p, Python index lists for the repetition penalty), kept as the
definition the fast path is tested against. The fast path returns the same
tensor bit for bit: it decides every filter exactly as the reference does and
then runs the very same final softmax on the very same masked scores
(tests/core/test_transforms_fast.py checks this on random and adversarial rows).
With top-k on, top-k and top-p are decided on the few top candidates
(`_top_k_top_p_compact`), not over the vocabulary; rows it cannot decide for
certain take the full route.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import chain
from typing import Any

import numpy as np
import torch

from exactspec.foundations.constraints import apply_constraint
from exactspec.foundations.overflow import divide_by_temperature, penalise
from exactspec.foundations.penalties import apply_output_penalties, output_penalties_reference
from exactspec.foundations.settings import SamplingSettings

# Rows whose finite scores (after top-k) number at most 1/_TOPK_SHARE of the vocabulary get their sorted
# values from one `torch.topk`; denser rows use a full sort of the values.
_TOPK_SHARE = 8
# Candidates fetched beyond top_k by the compact top-k/top-p route, so that ties with the k-th best
# value are seen among them (a row whose last candidate still ties takes the full route).
_TOPK_EXTRA = 8
# Chunk length of `_top_candidates`' first stage (row maxima per chunk).
_CHUNK = 64
# Half-width of the compact top-p route's "too close to call" band around 1 - top_p, in units of the
# dtype's eps times (candidates + 8): a few times the rounding the two softmax-and-cumsum orders can
# differ by (see `_top_k_top_p_compact`); a row with a cumulative sum inside it takes the full route.
_TOP_P_MARGIN_EPS = 8
# Half-width of min-p's "too close to call" band, in units of the dtype's eps, times (1 + |ln min_p|).
# It covers the softmax kernel's exp (a few ulps), its reciprocal and products, and min_p's rounding to
# the dtype; a token inside the band sends its row to the reference rule, so the band only costs time.
_MIN_P_MARGIN_EPS = 128


def probabilities(
    logits: torch.Tensor,
    settings: SamplingSettings,
    histories: Sequence[Sequence[int]] | None = None,
    *,
    validate: bool = True,
    prompt_lengths: Sequence[int] | None = None,
) -> torch.Tensor:
    """Turn rows of logits into the probability vectors that are sampled from.

    Args:
        logits: [N, V] raw next-token logits (any float dtype; -inf marks ids
            the model cannot produce, such as the rows a smaller draft
            vocabulary lacks).
        settings: the request's sampling settings.
        histories: N token histories, the one each row really has (prompt plus
            every token before this position). Needed only for the repetition,
            presence and frequency penalties (`SamplingSettings.uses_history`).
        validate: check every row for NaN, +inf and "-inf everywhere" (one
            reduction over [N, V] and one host sync). With False the caller
            vouches for the logits; invalid rows then give NaN rows instead of
            an error. Shapes, settings and histories are always checked.
        prompt_lengths: N ints, how many leading tokens of each history are the
            prompt, which the presence and frequency penalties do not count.
            Needed only for those two.

    Returns:
        [N, V] probabilities in float64 if `logits` is float64, else float32.
        Each row sums to 1. Temperature 0 gives a one-hot row on the argmax of
        the biased and penalised logits, ties broken by the lowest id.
        Bit-identical to `_probabilities_reference`.
    """
    if settings.greedy:
        best = _greedy_ids(logits, settings, histories, validate, prompt_lengths)  # [N]
        return torch.zeros_like(logits, dtype=_dtype_of(logits)).scatter_(1, best.unsqueeze(-1), 1.0)
    scores, row_max = _penalised_scores(logits, settings, histories, validate, prompt_lengths)

    # Rows where scores / T would overflow take the greedy limit (`overflow.divide_by_temperature`).
    scores = divide_by_temperature(scores, settings.temperature, row_max)
    # The rows were checked finite above, which the compact route needs (topk ranks NaN first).
    compact = (
        _top_k_top_p_compact(scores, settings.top_k, settings.top_p) if settings.top_k and validate else None
    )
    if compact is not None:
        scores = compact
    else:
        if settings.top_k:
            scores = _top_k(scores, settings.top_k)
        if settings.top_p < 1.0:
            scores = _top_p(scores, settings.top_p)
    if settings.min_p > 0.0:
        scores = _min_p(scores, settings.min_p)
    return torch.softmax(scores, dim=-1)


def _penalised_scores(
    logits: torch.Tensor,
    settings: SamplingSettings,
    histories: Sequence[Sequence[int]] | None,
    validate: bool,
    prompt_lengths: Sequence[int] | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """[N, V] logits -> (scores, row maxima): float32 (float64 kept), the logit bias and the repetition,
    presence and frequency penalties applied, every row checked (`_check_rows`; row maxima None when
    `validate` is off)."""
    if logits.dim() != 2:
        raise ValueError(f"logits must be [N, V], got shape {tuple(logits.shape)}")
    scores = logits.to(_dtype_of(logits))
    if settings.logit_bias:
        scores = _apply_logit_bias(scores, settings)
    if settings.repetition_penalty != 1.0:
        if histories is None or len(histories) != logits.shape[0]:
            raise ValueError("the repetition penalty needs one history per row of logits")
        scores = _apply_repetition_penalty(scores, histories, settings.repetition_penalty)
    if settings.penalises_output:
        scores = _apply_output_penalties(scores, settings, histories, prompt_lengths)
    if settings.constraint is not None:
        scores = apply_constraint(scores, settings.constraint, histories, prompt_lengths)
    return scores, _check_rows(scores) if validate else None


def penalised_scores(
    logits: torch.Tensor,
    settings: SamplingSettings,
    histories: Sequence[Sequence[int]] | None = None,
    prompt_lengths: Sequence[int] | None = None,
) -> torch.Tensor:
    """[N, V] logits -> the scores before the temperature: float32 (float64 kept), the logit bias and the
    repetition, presence and frequency penalties applied, unchecked. A greedy row's argmax is taken over
    these (what a greedy row reports as its log-probabilities: `decoding.logprobs`)."""
    scores, _ = _penalised_scores(logits, settings, histories, False, prompt_lengths)
    return scores


def _apply_output_penalties(
    scores: torch.Tensor,
    settings: SamplingSettings,
    histories: Sequence[Sequence[int]] | None,
    prompt_lengths: Sequence[int] | None,
) -> torch.Tensor:
    """The presence and frequency penalties (`penalties.apply_output_penalties`), after checking that the
    caller gave what they count: each row's history and where its prompt ends."""
    if histories is None or prompt_lengths is None:
        raise ValueError(
            "the presence and frequency penalties need one history and one prompt length per row of logits"
        )
    return apply_output_penalties(
        scores, histories, prompt_lengths, settings.presence_penalty, settings.frequency_penalty
    )


def _dtype_of(logits: torch.Tensor) -> torch.dtype:
    """What the transforms compute in: float64 logits stay float64, everything else is float32."""
    return torch.float64 if logits.dtype == torch.float64 else torch.float32


def _greedy_ids(
    logits: torch.Tensor,
    settings: SamplingSettings,
    histories: Sequence[Sequence[int]] | None,
    validate: bool,
    prompt_lengths: Sequence[int] | None = None,
) -> torch.Tensor:
    """[N] each row's biased and penalised argmax (`_argmax_ids`), its rows checked as `_check_rows`
    checks them but from the value at that id: one pass over the row instead of two."""
    scores, _ = _penalised_scores(logits, settings, histories, False, prompt_lengths)
    best = _argmax_ids(scores)  # [N]
    if validate:
        _check_row_max(scores.gather(1, best.unsqueeze(-1)).squeeze(-1))
    return best


def _argmax_ids(scores: torch.Tensor) -> torch.Tensor:
    """[N, V] scores -> [N] each row's first maximal id (ties go to the lowest id, as torch.argmax's do).

    On the CPU numpy's argmax finds the same id (it too returns the first maximal index, and takes NaN as
    maximal), vectorised: 0.06 against 0.16 ms over the built-in pair's 151,936 ids with cold caches,
    as they are after a model pass (2-core Zen 4).
    """
    if scores.device.type == "cpu":
        return torch.from_numpy(scores.detach().numpy().argmax(axis=-1))
    return scores.argmax(dim=-1)


def greedy_ids(
    logits: torch.Tensor,
    settings: Sequence[SamplingSettings],
    histories: Sequence[Sequence[int]] | None = None,
    prompt_lengths: Sequence[int] | None = None,
) -> torch.Tensor:
    """[N, V] logits of rows whose settings are all greedy -> [N] long: the id `probabilities_per_row`
    puts each row's whole mass on (its biased and penalised argmax, the same checks and errors), without
    building the one-hot rows. A draw from such a row is that id whatever the uniform, which is what
    lets a round of greedy rows skip p (`decoding.target_pass.chain_probabilities` with greedy).

    >>> greedy = SamplingSettings(temperature=0)
    >>> greedy_ids(torch.tensor([[0.0, 1.0], [2.0, 2.0]]), [greedy, greedy]).tolist()
    [1, 0]
    """
    settings = list(settings)
    if not all(row_settings.greedy for row_settings in settings):
        raise ValueError("greedy_ids is for rows at temperature 0; use probabilities_per_row")

    def ids(rows: torch.Tensor, group: SamplingSettings, group_histories: Any, starts: Any) -> torch.Tensor:
        return _greedy_ids(rows, group, group_histories, True, starts).to(logits.device)

    return _by_settings(logits, settings, histories, prompt_lengths, ids)  # [N]


def _check_rows(scores: torch.Tensor) -> torch.Tensor:
    """[N, V] scores -> their [N] row maxima, after checking every row is valid."""
    # One reduction checks every row: amax propagates NaN, is +inf if any entry is, and is -inf
    # only when the whole row is (no token possible).
    row_max = scores.amax(dim=-1)  # [N]
    _check_row_max(row_max)
    return row_max


def _check_row_max(row_max: torch.Tensor) -> None:
    """Raise unless every row maximum [N] is finite: NaN or +inf means invalid scores, -inf a row with no
    possible token. Any reduction that propagates NaN gives the same verdict (amax, or the value at
    argmax's id, which is the first NaN or else the first maximum)."""
    if row_max.device.type == "cpu" and bool(np.isfinite(row_max.detach().numpy()).all()):
        return  # the usual case, without a torch call per test
    if (torch.isnan(row_max) | torch.isposinf(row_max)).any():
        raise ValueError("logits contain NaN or +inf; the model produced invalid scores")
    if torch.isneginf(row_max).any():
        raise ValueError("a row of logits is -inf everywhere: no token is possible")


def _apply_repetition_penalty(
    scores: torch.Tensor, histories: Sequence[Sequence[int]], penalty: float
) -> torch.Tensor:
    """Hugging Face's rule on each distinct token of the row's own history, by one gather and one scatter.

    If histories = [[5, 2, 5], [], [7]] then rows = [0, 0, 0, 2] and tokens = [5, 2, 5, 7]: entries
    (0, 5), (0, 2) and (2, 7) are penalised. A token repeated in a history is written twice with the
    same value, so it is penalised once, as in the reference. Indexing follows Python's rules, as the
    reference's does (an id >= V raises IndexError).
    """
    lengths = [len(history) for history in histories]
    total = sum(lengths)
    if total == 0:
        return scores
    tokens = torch.from_numpy(np.fromiter(chain.from_iterable(histories), dtype=np.int64, count=total))
    rows = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))  # [total]
    tokens, rows = tokens.to(scores.device), rows.to(scores.device)
    seen = scores[rows, tokens]  # [total]
    # The same elementwise operations as the reference's `penalise` over [N, V]: bit-identical values.
    penalised = penalise(seen, penalty)
    scores = scores.clone()
    scores[rows, tokens] = penalised
    return scores


def _top_p(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """The reference's top-p (ascending stable sort, cumulative <= 1 - top_p removed, the last kept),
    decided without the stable argsort.

    The cumulative sums depend only on the sorted VALUES, which are the same whatever the sort
    (equal values are interchangeable), so they are computed by the reference's own softmax and
    cumsum on an identical tensor: the same floats, the same decisions. What the stable argsort
    adds is which ids sit at the sorted positions; the kept set is a suffix of the ascending order,
    so it is "every id above the first kept value, and the highest ids among those equal to it".
    Example: scores [2, 5, 2, 1] with 2 positions removed: sorted values [1, 2, 2, 5], first kept
    value 2 at position 2, one id is below it, so 2 - 1 = 1 of the tied ids (the lowest, id 0,
    first in stable order) is removed: kept ids {1, 2}.
    """
    sorted_scores = _ascending_values(scores)  # [N, V]
    cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)  # [N, V]
    remove_sorted = cumulative <= (1.0 - top_p)
    remove_sorted[:, -1] = False  # the most likely token always stays
    # cumulative is non-decreasing (a sum of non-negative terms), so the removed positions are a prefix.
    num_removed = remove_sorted.sum(dim=-1, keepdim=True)  # [N, 1]
    first_kept = sorted_scores.gather(1, num_removed)  # [N, 1]
    keep = scores > first_kept  # [N, V]
    tied = scores == first_kept  # [N, V]
    tied_removed = num_removed - (scores < first_kept).sum(dim=-1, keepdim=True)  # [N, 1]
    if bool((tied_removed > 0).any()):
        # Stable order lists tied ids by increasing id, so the lowest tied_removed of them go.
        tie_rank = tied.cumsum(dim=-1) - 1  # [N, V]: 0 for the lowest tied id of the row
        tied &= tie_rank >= tied_removed
    return scores.masked_fill(~(keep | tied), float("-inf"))


def _top_k_top_p_compact(scores: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor | None:
    """`_top_p(_top_k(scores, top_k), top_p)` (or `_top_k` alone when top_p = 1), bit for bit, from
    one `torch.topk` of W = top_k + _TOPK_EXTRA candidates instead of passes over [N, V].

    None when W is too large a share of the vocabulary for this to pay. Rows of finite scores only.

    Which ids top-k keeps: every id scoring at least the k-th best value (ties with it stay). They
    are all among the W candidates unless the W-th candidate still ties the k-th; such rows (and
    rows whose top-p decision is too close to call, below) are decided by the full route.

    Top-p on the candidates: after top-k the full ascending row is (V - W) -inf entries followed by
    the W candidates' values (-inf for those top-k removed), so its softmax and cumulative sums are
    those of the W values alone, up to rounding: every term is the same exp of the same difference
    (the maximum is exact), and only the order of the float32 sum and the exp kernel can differ.
    Each cumulative sum of both is within (W + 6) eps of the exact one (W nonzero terms, each exp
    and the division a few ulps), so a position whose cumulative sum lies further than the margin
    8 (W + 8) eps from 1 - top_p gets the same decision in both; a row with a position inside it
    goes to the full route. The -inf positions have cumulative sum exactly 0 in both. The kept set
    and the tie rule (lowest tied ids removed first) then follow `_top_p`, counted on the
    candidates: the full row has V - W more -inf entries, all removed and all below the first kept
    value, which cancel in its tie count. The result has each kept id's own score and -inf
    elsewhere, the very tensor the masked_fills of the full route give.

    Example: top_k = 2, candidate values [5, 3, 3, 1] (W = 4): the 2nd best is 3, the third
    candidate ties it, the fourth (1) is below, so top-k keeps the three ids scoring 5, 3 and 3.
    """
    num_rows, vocab_size = scores.shape
    k = min(top_k, vocab_size)
    width = k + _TOPK_EXTRA
    if width * _TOPK_SHARE > vocab_size:
        return None
    values, ids = _top_candidates(scores, width)  # [N, W] each, values descending
    kth = values[:, k - 1 : k]  # [N, 1]
    member = values >= kth  # [N, W]: the candidates top-k keeps (a prefix, in descending order)
    # Rows whose top-k set may reach past the W candidates: the last candidate ties the k-th.
    full_route = values[:, -1] >= kth[:, 0]  # [N]
    if top_p < 1.0:
        ascending = torch.where(member, values, float("-inf")).flip(-1)  # [N, W]
        cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)  # [N, W]
        threshold = 1.0 - top_p
        margin = _TOP_P_MARGIN_EPS * (width + 8) * torch.finfo(scores.dtype).eps
        close = (cumulative.double() - threshold).abs() <= margin  # [N, W]
        close &= ascending > float("-inf")
        close[:, -1] = False  # the most likely token stays whatever its cumulative sum
        full_route |= close.any(dim=-1)
        remove_sorted = cumulative <= threshold
        remove_sorted[:, -1] = False
        num_removed = remove_sorted.sum(dim=-1, keepdim=True)  # [N, 1], a prefix as in `_top_p`
        first_kept = ascending.gather(1, num_removed)  # [N, 1]
        keep = values > first_kept  # [N, W]; candidates outside top-k lie below first_kept
        tied = values == first_kept  # [N, W]
        tied_removed = num_removed - (ascending < first_kept).sum(dim=-1, keepdim=True)  # [N, 1]
        if bool((tied_removed > 0).any()):
            # tie_rank[n, i]: tied candidates of row n with a lower id than candidate i.
            lower = tied.unsqueeze(1) & (ids.unsqueeze(1) < ids.unsqueeze(2))  # [N, W, W]
            tied &= lower.sum(dim=-1) >= tied_removed
        member = keep | tied
    out = torch.full_like(scores, float("-inf"))
    out.scatter_(1, ids, torch.where(member, values, float("-inf")))
    redo = full_route.nonzero().flatten().tolist()
    if redo:
        filtered = _top_k(scores[redo], top_k)
        out[redo] = _top_p(filtered, top_p) if top_p < 1.0 else filtered
    return out


def _top_candidates(scores: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The `width` highest values of each row, descending, and ids holding them: torch.topk's values.

    In two stages, each a few times cheaper than one topk over the vocabulary: the row is cut into
    chunks of _CHUNK entries, and the top `width` values all lie in the `width` chunks with the
    highest maxima. (Every chunk whose maximum beats the width-th highest maximum m is chosen, so
    every value above m is among the chosen chunks; the chosen chunks whose maximum is m hold at
    least as many values equal to m as the top `width` needs.) Among ids with equal values the
    choice may differ from torch.topk's; the values, in order, are the same.
    """
    num_rows, vocab_size = scores.shape
    num_chunks = -(-vocab_size // _CHUNK)
    if num_chunks < 2 * width:
        return torch.topk(scores, width, dim=-1)
    padded = scores
    if vocab_size % _CHUNK:
        padded = torch.nn.functional.pad(scores, (0, num_chunks * _CHUNK - vocab_size), value=float("-inf"))
    chunks = padded.view(num_rows, num_chunks, _CHUNK)  # [N, C, _CHUNK]
    chosen = torch.topk(chunks.amax(dim=-1), width, dim=-1).indices  # [N, W]
    candidates = chunks.gather(1, chosen.unsqueeze(-1).expand(-1, -1, _CHUNK))  # [N, W, _CHUNK]
    values, where = torch.topk(candidates.reshape(num_rows, -1), width, dim=-1)  # [N, W]
    ids = chosen.gather(1, where // _CHUNK) * _CHUNK + where % _CHUNK  # [N, W]
    return values, ids


def _ascending_values(scores: torch.Tensor) -> torch.Tensor:
    """[N, V] -> the values of each row in ascending order (equal to torch.sort(scores).values)."""
    num_rows, vocab_size = scores.shape
    finite_mask = scores > float("-inf")  # [N, V]
    counts = finite_mask.sum(dim=-1)  # [N]
    finite = int(counts.max())
    if finite * _TOPK_SHARE <= vocab_size:
        # After top-k (or a bias that bans most ids) a row holds few finite scores: sort just those
        # and put them after the -inf ones. (torch.topk over a row of mostly equal -inf is slow.)
        rows, cols = finite_mask.nonzero(as_tuple=True)  # row-major: each row's ids in order
        starts = torch.cumsum(counts, dim=0) - counts  # [N]: where each row's entries begin
        slot = torch.arange(rows.numel(), device=scores.device) - starts[rows]  # rank within the row
        compact = scores.new_full((num_rows, finite), float("-inf"))  # [N, finite]
        compact[rows, slot] = scores[rows, cols]
        ascending = torch.full_like(scores, float("-inf"))
        ascending[:, vocab_size - finite :] = torch.sort(compact, dim=-1).values
        return ascending
    if scores.device.type == "cpu":
        return _numpy_sort(scores)
    return torch.sort(scores, dim=-1).values


def _numpy_sort(scores: torch.Tensor) -> torch.Tensor:
    """numpy's sort of each row's values (about twice as fast as torch.sort here), rows split over
    torch's thread count (numpy releases the GIL while it sorts)."""
    values = scores.numpy()  # [N, V], shares memory
    workers = min(torch.get_num_threads(), values.shape[0])
    if workers <= 1:
        return torch.from_numpy(np.sort(values, axis=-1))
    out = np.empty_like(values)
    chunks = np.array_split(np.arange(values.shape[0]), workers)

    def sort_rows(rows: np.ndarray) -> None:
        out[rows[0] : rows[-1] + 1] = np.sort(values[rows[0] : rows[-1] + 1], axis=-1)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(sort_rows, chunks))
    return torch.from_numpy(out)


def _min_p(scores: torch.Tensor, min_p: float) -> torch.Tensor:
    """The reference's min-p (probs < min_p * max prob removed) decided on the scores, without a softmax.

    probs = exp(s - max) / sum, so "probs < min_p * max prob" is "s - max < ln min_p" up to the
    rounding of the reference's softmax; tokens clear of ln min_p by the margin are decided here,
    and a row with a token inside the band is decided by the reference rule itself. Tokens at the
    max (s - max = 0) always stay: their probability is the max, and min_p <= 1.
    """
    finfo = torch.finfo(scores.dtype)
    vocab_size = scores.shape[-1]
    if min_p / vocab_size < 1e4 * finfo.tiny:
        # The reference's threshold could be subnormal, where rounding is no longer relative.
        return _min_p_reference(scores, min_p)
    log_min_p = math.log(min_p)
    margin = _MIN_P_MARGIN_EPS * finfo.eps * (1.0 + abs(log_min_p))
    gap = scores - scores.amax(dim=-1, keepdim=True)  # [N, V], <= 0; -inf where banned
    remove = gap <= log_min_p - margin
    unsure = ~remove & (gap < log_min_p + margin) & (gap != 0)  # [N, V]
    unsure_rows = unsure.any(dim=-1).nonzero().flatten().tolist()
    filtered = scores.masked_fill(remove, float("-inf"))
    if unsure_rows:
        # These rows need the reference's own rounded probabilities, from the unfiltered scores.
        filtered[unsure_rows] = _min_p_reference(scores[unsure_rows], min_p)
    return filtered


# ---------------------------------------------------------------- the reference


def _probabilities_reference(
    logits: torch.Tensor,
    settings: SamplingSettings,
    histories: Sequence[Sequence[int]] | None = None,
    prompt_lengths: Sequence[int] | None = None,
) -> torch.Tensor:
    """The original implementation of `probabilities`, kept as its definition (see the module docstring).

    Args:
        logits: [N, V] raw next-token logits (any float dtype; -inf marks ids
            the model cannot produce, such as the rows a smaller draft
            vocabulary lacks).
        settings: the request's sampling settings.
        histories: N token histories, the one each row really has (prompt plus
            every token before this position). Needed only for the repetition
            penalty.

    Returns:
        [N, V] probabilities in float64 if `logits` is float64, else float32.
        Each row sums to 1. Temperature 0 gives a one-hot row on the argmax of
        the biased and penalised logits, ties broken by the lowest id.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [N, V], got shape {tuple(logits.shape)}")
    num_rows, vocab_size = logits.shape
    scores = logits.to(_dtype_of(logits))
    if settings.logit_bias:
        scores = _apply_logit_bias(scores, settings)
    if settings.repetition_penalty != 1.0:
        if histories is None or len(histories) != num_rows:
            raise ValueError("the repetition penalty needs one history per row of logits")
        scores = _repetition_penalty_reference(scores, histories, settings.repetition_penalty)
    if settings.penalises_output:
        if histories is None or prompt_lengths is None:
            raise ValueError("the presence and frequency penalties need histories and prompt lengths")
        scores = output_penalties_reference(
            scores, histories, prompt_lengths, settings.presence_penalty, settings.frequency_penalty
        )
    if settings.constraint is not None:
        scores = apply_constraint(scores, settings.constraint, histories, prompt_lengths)
    row_max = _check_rows(scores)

    if settings.greedy:
        # torch.argmax returns the first maximal index: ties go to the lowest id.
        best = scores.argmax(dim=-1)  # [N]
        return torch.nn.functional.one_hot(best, vocab_size).to(scores.dtype)

    scores = divide_by_temperature(scores, settings.temperature, row_max)
    if settings.top_k:
        scores = _top_k(scores, settings.top_k)
    if settings.top_p < 1.0:
        scores = _top_p_reference(scores, settings.top_p)
    if settings.min_p > 0.0:
        scores = _min_p_reference(scores, settings.min_p)
    return torch.softmax(scores, dim=-1)


def probabilities_per_row(
    logits: torch.Tensor,
    settings: SamplingSettings | Sequence[SamplingSettings],
    histories: Sequence[Sequence[int]] | None = None,
    prompt_lengths: Sequence[int] | None = None,
) -> torch.Tensor:
    """`probabilities` where each row of logits has its own settings (docs/algorithm.md 6).

    Rows are grouped by identical settings and each group goes through `probabilities` once, so
    the work is vectorised over rows (a loop over the distinct settings, never over the
    vocabulary), and every row gets exactly what `probabilities` gives it alone.

    Args:
        logits: [N, V] raw logits.
        settings: one `SamplingSettings` for every row, or N of them (row n uses settings[n]).
        histories: N histories; needed only when some row's settings use them (`uses_history`).
        prompt_lengths: N prompt lengths; needed only when some row has a presence or frequency penalty.

    Returns:
        [N, V] probabilities, as `probabilities`.

    >>> logits = torch.tensor([[0.0, 1.0], [0.0, 1.0], [2.0, 0.0]])
    >>> greedy, hot = SamplingSettings(temperature=0), SamplingSettings(temperature=2)
    >>> probabilities_per_row(logits, [greedy, hot, greedy]).tolist()[0::2]
    [[0.0, 1.0], [1.0, 0.0]]
    """
    if isinstance(settings, SamplingSettings):
        return probabilities(logits, settings, histories, prompt_lengths=prompt_lengths)

    def transform(
        rows: torch.Tensor, group: SamplingSettings, group_histories: Any, starts: Any
    ) -> torch.Tensor:
        return probabilities(rows, group, group_histories, prompt_lengths=starts)

    return _by_settings(logits, list(settings), histories, prompt_lengths, transform)


def _by_settings(
    logits: torch.Tensor,
    settings: list[SamplingSettings],
    histories: Sequence[Sequence[int]] | None,
    prompt_lengths: Sequence[int] | None,
    transform: Callable[[torch.Tensor, SamplingSettings, Any, Any], torch.Tensor],
) -> torch.Tensor:
    """`transform`(rows, settings, their histories, their prompt lengths) once per group of rows with
    identical settings (all rows at once when they share them), its [N_group, ...] results put back in
    row order: [N, ...]. Histories and prompt lengths go to a group only when its penalties need them."""
    if logits.dim() != 2 or len(settings) != logits.shape[0]:
        raise ValueError(
            f"need one SamplingSettings per row of logits [N, V]: {len(settings)} for {tuple(logits.shape)}"
        )
    groups: dict[SamplingSettings, list[int]] = {}
    for n, row_settings in enumerate(settings):
        groups.setdefault(row_settings, []).append(n)
    if len(groups) == 1:
        return transform(logits, settings[0], histories, prompt_lengths)
    out: torch.Tensor | None = None
    for group_settings, members in groups.items():
        index = torch.tensor(members, device=logits.device)
        group_histories = group_starts = None
        if histories is not None and group_settings.uses_history:
            group_histories = [histories[n] for n in members]
        if prompt_lengths is not None and group_settings.reads_output:
            group_starts = [prompt_lengths[n] for n in members]
        result = transform(logits[index], group_settings, group_histories, group_starts)  # [N_group, ...]
        if out is None:
            out = result.new_empty((logits.shape[0], *result.shape[1:]))
        out[index] = result
    assert out is not None
    return out


def _apply_logit_bias(scores: torch.Tensor, settings: SamplingSettings) -> torch.Tensor:
    settings.check_vocab(scores.shape[-1])
    ids = torch.tensor(list(settings.logit_bias.keys()), dtype=torch.long, device=scores.device)
    bias = torch.tensor(list(settings.logit_bias.values()), dtype=scores.dtype, device=scores.device)
    scores = scores.clone()
    scores[:, ids] += bias
    return scores


def _repetition_penalty_reference(
    scores: torch.Tensor, histories: Sequence[Sequence[int]], penalty: float
) -> torch.Tensor:
    # Hugging Face's rule, applied at most once per distinct token of the row's own history.
    num_rows, vocab_size = scores.shape
    seen = torch.zeros(num_rows, vocab_size, dtype=torch.bool, device=scores.device)  # [N, V]
    row_index = [row for row, history in enumerate(histories) for _ in history]
    token_index = [token for history in histories for token in history]
    if token_index:
        seen[
            torch.tensor(row_index, device=scores.device), torch.tensor(token_index, device=scores.device)
        ] = True
    return torch.where(seen, penalise(scores, penalty), scores)


def _top_k(scores: torch.Tensor, top_k: int) -> torch.Tensor:
    k = min(top_k, scores.shape[-1])
    kth_best = torch.topk(scores, k, dim=-1).values[:, -1:]  # [N, 1]
    return scores.masked_fill(scores < kth_best, float("-inf"))


def _top_p_reference(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    # Ascending sort, as Hugging Face does; stable so equal scores always resolve the same way.
    sorted_scores, order = torch.sort(scores, dim=-1, stable=True)  # [N, V]
    cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
    remove_sorted = cumulative <= (1.0 - top_p)
    remove_sorted[:, -1] = False  # the most likely token always stays
    remove = remove_sorted.scatter(1, order, remove_sorted)
    return scores.masked_fill(remove, float("-inf"))


def _min_p_reference(scores: torch.Tensor, min_p: float) -> torch.Tensor:
    probs = torch.softmax(scores, dim=-1)
    threshold = min_p * probs.amax(dim=-1, keepdim=True)  # [N, 1]
    remove = probs < threshold
    # The most likely token always stays, even when rounding puts it below the threshold.
    remove.scatter_(1, probs.argmax(dim=-1, keepdim=True), False)
    return scores.masked_fill(remove, float("-inf"))
