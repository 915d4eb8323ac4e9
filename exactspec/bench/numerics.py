"""How far the verification pass's p is from one-token passes, in the dtype in use and in float32.

The verifier scores k = gamma + 1 positions in one forward pass (the block
pass); plain decoding scores one new token per pass. In exact arithmetic the
two give the same p; in floating point they differ in the last bits, and in
bfloat16 visibly (docs/algorithm.md 7). This module measures that difference on real
prompts, beside the precision's own error (the dtype against float32, both one-token
passes), so the size of the numerical effect is stated, not guessed.

For each prompt, with k = gamma + 1 and `blocks` blocks:

1. One-token passes in the dtype: the prompt minus its last token is cached,
   then each step feeds one token and scores the next (greedy continuation of
   blocks * k tokens). This fixes the token sequence every other pass scores.
2. Block passes in the dtype: block i caches the sequence up to its first
   position minus one and feeds k tokens at once, scoring k positions (exactly
   the verification pass of a round whose draft is the next gamma tokens).
3. The same one-token and block passes of float32 weights over the same tokens.
4. Optionally (`padded`), one-token passes padded to k: each step re-feeds the
   last k tokens (k - 1 of them already cached) and keeps the last position,
   so a single token is scored with the block pass's kernel shapes.

At each position and temperature T, p = softmax(logits / T) in float64 and
the total variation distances between the passes are recorded, with how
often their argmax (greedy) tokens differ and the largest |logit difference|.

Records (written to numerics.json under their field names): `PositionStats` per position,
`ComparisonSummary` (with a `TvSummary` per temperature) and `Comparison` per kind of
comparison, and `NumericsResult` for a whole run, with its provenance.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from exactspec.foundations.defaults import DEFAULTS
from exactspec.foundations.provenance import Provenance
from exactspec.foundations.records import JsonRecord
from exactspec.models.base import LanguageModel

DEFAULT_GAMMA = DEFAULTS.check_gamma
DEFAULT_BLOCKS = 3
NUMERICS_TEMPERATURES = (1.0, 0.7)
"""The temperatures at which the passes' p are compared: the model's own law, and a common sampling one."""

COMPARISONS = {
    "block_vs_single": "dtype: block pass vs one-token passes",
    "block_vs_single_float32": "float32: block pass vs one-token passes",
    "dtype_vs_float32": "dtype vs float32 (one-token passes): the precision's own error",
    "block_vs_float32": "dtype block pass (what the verifier uses) vs float32 one-token passes",
    "padded_vs_block": "dtype: one-token passes padded to k vs block pass",
}
"""Every comparison the measurement can make, by key, with what it compares."""


@dataclass(frozen=True)
class PositionStats(JsonRecord):
    """One position, two kinds of pass: TV per temperature ("1", "0.7"), argmax agreement, max logit gap."""

    tv: dict[str, float]
    argmax_differs: bool
    max_abs_logit_diff: float


@dataclass(frozen=True)
class TvSummary(JsonRecord):
    """Total variation over the positions at one temperature: median, 99th percentile, max."""

    median: float
    p99: float
    max: float


@dataclass(frozen=True)
class ComparisonSummary(JsonRecord):
    """One comparison over every prompt's positions (`summarize`)."""

    positions: int
    tv: dict[str, TvSummary]  # by temperature, named as in PositionStats.tv
    argmax_differs: int
    argmax_differs_rate: float
    max_abs_logit_diff: float


@dataclass(frozen=True)
class Comparison(JsonRecord):
    """One kind of comparison (a key of COMPARISONS): its summary and every position's statistics."""

    summary: ComparisonSummary
    positions: tuple[PositionStats, ...]


@dataclass(frozen=True)
class NumericsPrompt(JsonRecord):
    name: str
    tokens: int


@dataclass(frozen=True, kw_only=True)
class NumericsResult(JsonRecord):
    """A whole `exactspec numerics` run (numerics.json).

    `backend`: what ran the passes (`models.backends`; "hf" in files from before it was kept).
    `dtype`, `weights`: the target as measured (e.g. bfloat16, int4; float32, gguf on llama.cpp);
    `timings`: seconds of each
    part ("bfloat16_seconds", "float32_seconds", and with padded passes the mean seconds of a
    one-token and a padded step); `seconds`: the whole run. `comparisons`: by key of COMPARISONS.
    """

    provenance: Provenance
    target: str
    backend: str = "hf"
    dtype: str
    weights: str
    gamma: int
    k: int
    blocks: int
    temperatures: tuple[float, ...]
    prompts: tuple[NumericsPrompt, ...]
    timings: dict[str, float]
    seconds: float
    comparisons: dict[str, Comparison]

    @property
    def label(self) -> str:
        """The dtype with the weight format when it is packed: "bfloat16", "bfloat16 int4"."""
        return self.dtype if self.weights == "bf16" else f"{self.dtype} {self.weights}"


@dataclass(frozen=True)
class Passes:
    """[n, V] float32 logits of the n measured positions of one prompt, one tensor per kind of pass."""

    tokens: list[int]  # the n tokens the positions predict (the greedy continuation)
    single: torch.Tensor
    block: torch.Tensor
    padded: torch.Tensor | None = None


def score_passes(
    model: LanguageModel,
    prompt: Sequence[int],
    tokens: Sequence[int] | None,
    gamma: int = DEFAULT_GAMMA,
    blocks: int = DEFAULT_BLOCKS,
    padded: bool = False,
) -> Passes:
    """One-token, block (and padded one-token) logits at n = blocks * (gamma + 1) positions after `prompt`.

    Position j scores the token that follows prompt + tokens[:j]. With `tokens` None the
    continuation is greedy from the one-token passes (then it is returned in `Passes.tokens`).
    """
    k = gamma + 1
    n = blocks * k
    prompt = [int(t) for t in prompt]
    if len(prompt) < 2:
        raise ValueError("the prompt needs at least 2 tokens (one is cached before the first one-token pass)")
    clear = getattr(model, "clear_cache", None)
    if clear is not None:
        clear()
    model.logits([prompt[:-1]], 1)  # cache all but the last prompt token: position 0 is a one-token pass
    sequence = list(prompt)
    single = []
    for j in range(n):
        logits = model.logits([sequence], 1)[0, 0]  # [V]: the cache holds sequence[:-1], one token is fed
        single.append(logits.float())
        sequence.append(int(logits.argmax()) if tokens is None else int(tokens[j]))
    generated = sequence[len(prompt) :]
    block = []
    for i in range(blocks):
        start = len(prompt) + i * k  # the block scores what follows sequence[:start + j], j = 0..k-1
        # The cache holds more than sequence[:start - 1]; the adapter rolls it back and feeds k tokens.
        block.append(model.logits([sequence[: start + k - 1]], k)[0].float())  # [k, V]
    padded_logits = None
    if padded:
        rows = []
        for j in range(n):
            end = len(prompt) + j
            rows.append(model.logits([sequence[:end]], min(k, end))[0, -1].float())  # [V]
        padded_logits = torch.stack(rows)
    return Passes(generated, torch.stack(single), torch.cat(block), padded_logits)


def position_stats(
    first: torch.Tensor, second: torch.Tensor, temperatures: Sequence[float]
) -> list[PositionStats]:
    """Per position: TV at each temperature, whether the argmax differs, max |logit difference|.

    first, second: [n, V] logits of the same positions from two kinds of pass.
    """
    a, b = first.to(torch.float64), second.to(torch.float64)
    tv = {t: 0.5 * (torch.softmax(a / t, -1) - torch.softmax(b / t, -1)).abs().sum(-1) for t in temperatures}
    argmax_differs = a.argmax(-1) != b.argmax(-1)  # [n]
    max_abs = (a - b).abs().amax(-1)  # [n]
    return [
        PositionStats(
            tv={f"{t:g}": float(tv[t][j]) for t in temperatures},
            argmax_differs=bool(argmax_differs[j]),
            max_abs_logit_diff=float(max_abs[j]),
        )
        for j in range(a.shape[0])
    ]


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between order statistics."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    position = (len(ordered) - 1) * q / 100.0
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(positions: Sequence[PositionStats], temperatures: Sequence[float]) -> ComparisonSummary:
    """Median, 99th percentile and max of TV per temperature; argmax disagreement rate; max |logit diff|."""
    tv = {}
    for t in temperatures:
        values = [p.tv[f"{t:g}"] for p in positions]
        tv[f"{t:g}"] = TvSummary(
            median=statistics.median(values), p99=percentile(values, 99), max=max(values)
        )
    differs = sum(p.argmax_differs for p in positions)
    return ComparisonSummary(
        positions=len(positions),
        tv=tv,
        argmax_differs=differs,
        argmax_differs_rate=differs / len(positions),
        max_abs_logit_diff=max(p.max_abs_logit_diff for p in positions),
    )


def compare(
    dtype_passes: Sequence[Passes],
    float32_passes: Sequence[Passes] | None,
    temperatures: Sequence[float] = NUMERICS_TEMPERATURES,
) -> dict[str, Comparison]:
    """Comparison key -> its `Comparison` over every prompt's positions."""
    pairs: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {"block_vs_single": []}
    for index, passes in enumerate(dtype_passes):
        pairs["block_vs_single"].append((passes.block, passes.single))
        if passes.padded is not None:
            pairs.setdefault("padded_vs_block", []).append((passes.padded, passes.block))
        if float32_passes is not None:
            reference = float32_passes[index]
            if reference.tokens != passes.tokens:
                raise ValueError(f"prompt {index}: the float32 passes scored other tokens")
            pairs.setdefault("block_vs_single_float32", []).append((reference.block, reference.single))
            pairs.setdefault("dtype_vs_float32", []).append((passes.single, reference.single))
            pairs.setdefault("block_vs_float32", []).append((passes.block, reference.single))
    result = {}
    for key in COMPARISONS:
        if key not in pairs:
            continue
        positions = [stat for a, b in pairs[key] for stat in position_stats(a, b, temperatures)]
        result[key] = Comparison(summarize(positions, temperatures), tuple(positions))
    return result


def markdown_table(comparisons: dict[str, Comparison], dtype: str, temperatures: Sequence[float]) -> str:
    """The comparisons as one Markdown table (TV median / p99 / max per temperature, greedy differences)."""
    header = ["comparison", "positions"]
    for t in temperatures:
        header += [f"TV T={t:g} median", f"TV T={t:g} p99", f"TV T={t:g} max"]
    header += ["greedy token differs", "max abs logit diff"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * 2 + "---:|" * (len(header) - 2)]
    for key, value in comparisons.items():
        s = value.summary
        cells = [COMPARISONS[key].replace("dtype", dtype), str(s.positions)]
        for t in temperatures:
            tv = s.tv[f"{t:g}"]
            cells += [f"{tv.median:.2g}", f"{tv.p99:.2g}", f"{tv.max:.2g}"]
        cells += [f"{s.argmax_differs} ({100 * s.argmax_differs_rate:.1f}%)", f"{s.max_abs_logit_diff:.3g}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_markdown(result: NumericsResult) -> str:
    """numerics.md: the provenance, what was compared, the table, the timings."""
    names = ", ".join(p.name for p in result.prompts)
    table = markdown_table(result.comparisons, result.label, result.temperatures)
    return "\n".join(
        [
            f"# Numerics: block pass vs one-token passes ({result.target}, {result.backend} backend, "
            f"{result.dtype}, {result.weights} weights)",
            "",
            *result.provenance.markdown(),
            "",
            f"k = gamma + 1 = {result.k} tokens per verification pass, {result.blocks} blocks per prompt, "
            f"prompts: {names}. TV = total variation between the two passes' p = softmax(logits / T) at the "
            "same position; greedy token differs = their argmax differs.",
            "",
            table,
            "",
            f"Timings (s): {json.dumps({k: round(v, 4) for k, v in result.timings.items()})}; "
            f"{result.seconds:.0f} s in all.",
            "",
        ]
    )
