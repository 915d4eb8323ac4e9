"""The truncation filters of the sampling transforms (`foundations.transforms.probabilities`): top-k,
top-p and min-p, each on [N, V] scores, masking the ids it removes with -inf.

Each decides exactly as the straightforward definition does (tests/reference_transforms.py: a full
stable sort for top-p, a softmax for min-p) at a fraction of its cost: top-p from the sorted values
alone (`top_p_filter`), or with top-k on from the few top candidates (`top_k_top_p_compact`); min-p on the
scores, with the rows too close to call decided by the definition itself (`min_p_filter_reference`).
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

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
# differ by (see `top_k_top_p_compact`); a row with a cumulative sum inside it takes the full route.
_TOP_P_MARGIN_EPS = 8
# Half-width of min-p's "too close to call" band, in units of the dtype's eps, times (1 + |ln min_p|).
# It covers the softmax kernel's exp (a few ulps), its reciprocal and products, and min_p's rounding to
# the dtype; a token inside the band sends its row to the reference rule, so the band only costs time.
_MIN_P_MARGIN_EPS = 128


def top_p_filter(scores: torch.Tensor, top_p: float) -> torch.Tensor:
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


def top_k_top_p_compact(scores: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor | None:
    """`top_p_filter(top_k_filter(scores, top_k), top_p)` (or `top_k_filter` alone when top_p = 1), bit
    for bit, from one `torch.topk` of W = top_k + _TOPK_EXTRA candidates instead of passes over [N, V].

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
    and the tie rule (lowest tied ids removed first) then follow `top_p_filter`, counted on the
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
        num_removed = remove_sorted.sum(dim=-1, keepdim=True)  # [N, 1], a prefix as in `top_p_filter`
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
        filtered = top_k_filter(scores[redo], top_k)
        out[redo] = top_p_filter(filtered, top_p) if top_p < 1.0 else filtered
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


def min_p_filter(scores: torch.Tensor, min_p: float) -> torch.Tensor:
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
        return min_p_filter_reference(scores, min_p)
    log_min_p = math.log(min_p)
    margin = _MIN_P_MARGIN_EPS * finfo.eps * (1.0 + abs(log_min_p))
    gap = scores - scores.amax(dim=-1, keepdim=True)  # [N, V], <= 0; -inf where banned
    remove = gap <= log_min_p - margin
    unsure = ~remove & (gap < log_min_p + margin) & (gap != 0)  # [N, V]
    unsure_rows = unsure.any(dim=-1).nonzero().flatten().tolist()
    filtered = scores.masked_fill(remove, float("-inf"))
    if unsure_rows:
        # These rows need the reference's own rounded probabilities, from the unfiltered scores.
        filtered[unsure_rows] = min_p_filter_reference(scores[unsure_rows], min_p)
    return filtered


def top_k_filter(scores: torch.Tensor, top_k: int) -> torch.Tensor:
    k = min(top_k, scores.shape[-1])
    kth_best = torch.topk(scores, k, dim=-1).values[:, -1:]  # [N, 1]
    return scores.masked_fill(scores < kth_best, float("-inf"))


def min_p_filter_reference(scores: torch.Tensor, min_p: float) -> torch.Tensor:
    probs = torch.softmax(scores, dim=-1)
    threshold = min_p * probs.amax(dim=-1, keepdim=True)  # [N, 1]
    remove = probs < threshold
    # The most likely token always stays, even when rounding puts it below the threshold.
    remove.scatter_(1, probs.argmax(dim=-1, keepdim=True), False)
    return scores.masked_fill(remove, float("-inf"))
