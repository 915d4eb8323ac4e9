"""Randomness as an object: every random choice of drafting and verification goes through a Sampler.

Passing the random source in (never the global seed) is what makes runs
reproducible, gives each batch row its own stream, and lets
`exactspec.checking.exact.EnumeratingSampler` replace chance by enumeration to compute
the exact output distribution of the real decoding code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch

from exactspec.foundations.rows import RowLifecycle, RowStart


@runtime_checkable
class Sampler(RowLifecycle, Protocol):
    """Batched random choices, one independent stream per batch row.

    Row lifecycle (`exactspec.foundations.rows`): `add_rows` starts each row's stream from its
    seed, `release_rows` drops it.
    """

    def categorical(self, probs: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
        """Draw one index per row: probs [N, V] (rows sum to 1) -> [N] long.

        `rows[n]` names the batch row whose random stream draws row n.
        """
        ...

    def bernoulli(self, probs: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
        """Flip one coin per row: probs [N] in [0, 1] -> [N] bool, True with probability probs[n]."""
        ...

    def categorical_at(
        self, probs: torch.Tensor, rows: Sequence[int], positions: Sequence[int]
    ) -> torch.Tensor:
        """Draw the token at output position positions[n] of row rows[n]: probs [N, V] -> [N] long.

        The draw depends only on the row's seed and the position (never on how many draws the row
        made before), so the token a row emits at a position is the same whichever rounds, drafts
        and batches led there (docs/algorithm.md 5, coupled verification). Each (row, position) is
        asked for at most once per generation: a position's token is decided once.
        """
        ...

    def draft_at(self, probs: torch.Tensor, rows: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
        """The token a coupled draft proposes at output position positions[n] of row rows[n]: probs [N, V]
        (a draft's q) -> [N] long, by the same uniform `categorical_at` will draw that position with.

        It decides nothing: the position may be drafted again (a later round, another q) and is still
        drawn once by `categorical_at`. A draft proposed this way is verified as a deterministic one, so
        the emitted token is the positioned draw from p whatever the draft (docs/algorithm.md 5, coupled
        model drafts); sharing the uniform is what makes the draft likely to agree with that draw.
        """
        ...


class SeededSampler:
    """A `Sampler` on `torch.Generator`s: one stream per batch row.

    Row r's stream is seeded with `seeds[r]` (default `seed + r`), so a
    row's draws depend only on its own seed: adding rows to a batch never
    changes the rows already in it. Rows join and leave by id through the row
    lifecycle (`add_rows`, `release_rows`): a joining row's stream starts from
    the seed its `RowStart` names, or from its default seed above, which is how
    the scheduler gives each request its own stream (docs/algorithm.md 6).

    The generators and the uniforms they draw live on `device` (the models'
    device); a CUDA generator gives a different, equally valid stream than a
    CPU one for the same seed.

    >>> sampler = SeededSampler(seed=0, num_rows=2)
    >>> sampler.categorical(torch.tensor([[0.0, 1.0], [1.0, 0.0]]), rows=[0, 1]).tolist()
    [1, 0]
    """

    def __init__(
        self,
        seed: int = 0,
        num_rows: int = 1,
        seeds: Sequence[int] | None = None,
        *,
        device: torch.device | str | None = None,
    ) -> None:
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an integer, got {seed!r}")
        if seeds is None and num_rows < 1:
            raise ValueError(f"num_rows must be >= 1, got {num_rows}")
        self._base_seed = seed
        # Explicit seeds name the only rows this sampler may give a default stream to.
        self._seeds = None if seeds is None else list(seeds)
        self._generators: dict[int, torch.Generator] = {}
        self._row_seeds: dict[int, int] = {}  # row -> its seed (what keys its positioned draws)
        initial = range(num_rows) if seeds is None else range(len(seeds))
        self.add_rows([RowStart(row) for row in initial])

    @property
    def num_rows(self) -> int:
        return len(self._generators)

    def add_rows(self, rows: Sequence[RowStart]) -> None:
        """Give each row id a fresh stream (replacing any it had), seeded with its `RowStart.seed`, or
        with its default seed when that is None (`seeds[row]`, or `seed + row`)."""
        for start in rows:
            seed = self._default_seed(start.row) if start.seed is None else start.seed
            if isinstance(seed, bool) or not isinstance(seed, int):
                raise ValueError(f"seeds must be integers, got {seed!r}")
            generator = torch.Generator(device=self.device)
            # torch's CPU generator (mt19937) keeps only the low 32 bits of a seed, so seeds that
            # differ by a multiple of 2**32 share a stream; folding here makes that explicit.
            generator.manual_seed(seed % (1 << 32))
            self._generators[start.row] = generator
            self._row_seeds[start.row] = seed

    def release_rows(self, rows: Sequence[int]) -> None:
        """Forget these rows' streams (rows that left the batch); unknown ids are ignored."""
        for row in rows:
            self._generators.pop(row, None)
            self._row_seeds.pop(row, None)

    def _default_seed(self, row: int) -> int:
        if self._seeds is None:
            return self._base_seed + row
        if not 0 <= row < len(self._seeds):
            raise ValueError(
                f"row {row} has no seed: this sampler was given seeds for rows 0..{len(self._seeds) - 1}; "
                "pass the row's seed in its RowStart"
            )
        return self._seeds[row]

    def _generator(self, row: int) -> torch.Generator:
        generator = self._generators.get(row)
        if generator is None:
            raise ValueError(
                f"row {row} has no random stream (this sampler has rows {sorted(self._generators)})"
            )
        return generator

    def _uniforms(self, rows: Sequence[int]) -> torch.Tensor:
        """[N] float64 uniforms in [0, 1), one from each row's own stream (exactly one draw per row)."""
        return torch.stack(
            [
                torch.rand((), generator=self._generator(r), dtype=torch.float64, device=self.device)
                for r in rows
            ]
        )

    def categorical(self, probs: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
        if probs.dim() != 2 or probs.shape[0] != len(rows):
            raise ValueError(f"probs must be [len(rows), V], got {tuple(probs.shape)} for {len(rows)} rows")
        if not rows:
            return torch.empty(0, dtype=torch.long, device=probs.device)
        # Inverse-CDF with one uniform per row: a row consumes exactly one draw per call,
        # whatever the other rows do.
        return _inverse_cdf(probs, self._uniforms(rows).to(probs.device))

    def categorical_at(
        self, probs: torch.Tensor, rows: Sequence[int], positions: Sequence[int]
    ) -> torch.Tensor:
        """The protocol's `categorical_at`: the uniform of (row, position) comes from a counter-based hash of
        the row's seed and the position (`position_uniform`), not from the row's sequential stream."""
        if probs.dim() != 2 or probs.shape[0] != len(rows) or len(positions) != len(rows):
            raise ValueError(
                f"probs must be [len(rows), V] with one position per row, got {tuple(probs.shape)}, "
                f"{len(rows)} rows, {len(positions)} positions"
            )
        if not rows:
            return torch.empty(0, dtype=torch.long, device=probs.device)
        uniforms = [position_uniform(self._seed(r), t) for r, t in zip(rows, positions, strict=True)]
        return _inverse_cdf(probs, torch.tensor(uniforms, dtype=torch.float64, device=probs.device))

    def draft_at(self, probs: torch.Tensor, rows: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
        """The protocol's `draft_at`: `categorical_at`'s inverse CDF at the same positioned uniform."""
        return self.categorical_at(probs, rows, positions)

    def _seed(self, row: int) -> int:
        seed = self._row_seeds.get(row)
        if seed is None:
            known = sorted(self._row_seeds)
            raise ValueError(f"row {row} has no random stream (this sampler has rows {known})")
        return seed

    def bernoulli(self, probs: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
        if probs.dim() != 1 or probs.shape[0] != len(rows):
            raise ValueError(f"probs must be [len(rows)], got {tuple(probs.shape)} for {len(rows)} rows")
        if not rows:
            return torch.empty(0, dtype=torch.bool, device=probs.device)
        return self._uniforms(rows).to(probs.device) < probs.to(torch.float64)


MASK_64 = (1 << 64) - 1


def _mix64(value: int) -> int:
    """SplitMix64's finaliser: a bijection of 64-bit integers that scatters every input bit."""
    value = (value ^ (value >> 30)) * 0xBF58476D1CE4E5B9 & MASK_64
    value = (value ^ (value >> 27)) * 0x94D049BB133111EB & MASK_64
    return value ^ (value >> 31)


def position_uniform(seed: int, position: int) -> float:
    """A uniform in [0, 1) that is a function of (seed, position) only: SplitMix64 over the seed, then over
    the position added to it (a counter-based generator: distinct positions give independent-looking
    draws, as a sequential stream's successive draws are), 53 bits as a float64.

    >>> position_uniform(0, 0) == position_uniform(0, 0) != position_uniform(0, 1)
    True
    """
    key = _mix64((seed & MASK_64) + 0x9E3779B97F4A7C15 & MASK_64)
    return (_mix64(key + (position + 1) * 0x9E3779B97F4A7C15 & MASK_64) >> 11) * 2.0**-53


def _inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Row n's index for uniform uniforms[n]: the first id whose CDF exceeds it (probs [N, V] -> [N]).

    The one body of both draws, the sequential `categorical` and the positioned `categorical_at`.
    """
    index = _inverse_cdf_on_support(probs, uniforms) if probs.device.type == "cpu" else None
    if index is None:
        cdf = probs.to(torch.float64).cumsum(dim=-1)  # [N, V]; float64 avoids a gap at the top of the CDF
        cdf = cdf / cdf[:, -1:]  # rows sum to 1 up to rounding; renormalise so u < 1 always lands
        index = torch.searchsorted(cdf, uniforms.unsqueeze(-1), right=True).squeeze(-1)  # [N]
    # searchsorted can land on a zero-probability id only through rounding at the top; clamp and
    # step back to the last id with mass.
    index = index.clamp(max=probs.shape[-1] - 1)
    bad = probs.gather(1, index.unsqueeze(-1)).squeeze(-1) <= 0
    if bad.any():
        last_positive = (probs > 0).to(torch.int64).cumsum(-1).argmax(-1)
        index = torch.where(bad, last_positive, index)
    return index


SPARSE_SHARE = 8
"""`SeededSampler.categorical` walks only the nonzero entries of rows that have at most 1/SPARSE_SHARE of
the vocabulary nonzero (top-k, top-p and one-hot rows), which gives the same index as the full walk."""

_PROBE_STRIDE = 64


def _inverse_cdf_on_support(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor | None:
    """The index `categorical`'s full inverse-CDF walk finds, from each row's nonzero entries alone.

    None (use the full walk) unless every row has at least one and at most V / SPARSE_SHARE nonzero
    entries, all positive and finite.
    Why it is the same index: the CPU cumsum adds left to right in float64, and adding a zero
    changes nothing, so the full CDF at a nonzero entry equals the CDF of the nonzero entries alone
    at that entry (the row total, the last value, too), and the normalised values are the same
    floats. searchsorted(right=True) finds the first entry whose CDF exceeds u; the CDF only rises
    at nonzero entries, so that entry is a nonzero one, the first of them whose CDF exceeds u
    (one always does: the last CDF value is 1 and u < 1; past the end would be V, as in the full
    walk). A CUDA cumsum is a parallel scan, which may round differently: the caller uses this on
    the CPU only.

    Example: probs [[0, 0.25, 0, 0.75]], u = 0.5: nonzero entries at ids [1, 3] with CDF
    [0.25, 1.0]; the first above 0.5 is the second, id 3, as the full CDF [0, 0.25, 0.25, 1.0] gives.
    """
    num_rows, vocab_size = probs.shape
    # A look at every _PROBE_STRIDE-th entry tells dense rows from sparse ones for a fraction of a pass
    # (only which walk runs depends on it, never the index).
    probe = probs[:, ::_PROBE_STRIDE]
    if int(torch.count_nonzero(probe)) * SPARSE_SHARE > probe.numel():
        return None
    row_of, ids = probs.nonzero(as_tuple=True)  # row-major: each row's ids in increasing order
    counts = torch.bincount(row_of, minlength=num_rows)  # [N]
    width = int(counts.max()) if row_of.numel() else 0
    if width == 0 or int(counts.min()) == 0 or width * SPARSE_SHARE > vocab_size:
        return None
    values = probs[row_of, ids]
    if not bool(((values > 0) & torch.isfinite(values)).all()):
        return None
    if width == 1:  # one entry a row (greedy rows): its CDF is [1.0], and every u < 1 lands on it
        return ids
    starts = torch.cumsum(counts, dim=0) - counts  # [N]
    slot = torch.arange(row_of.numel()) - starts[row_of]  # rank of each entry within its row
    compact = torch.zeros(num_rows, width, dtype=torch.float64)  # [N, W], zeros after a row's entries
    compact[row_of, slot] = values.to(torch.float64)
    compact_ids = torch.full((num_rows, width), vocab_size, dtype=torch.long)  # [N, W]; V past the entries
    compact_ids[row_of, slot] = ids
    cdf = compact.cumsum(dim=-1)  # [N, W]
    cdf = cdf / cdf[:, -1:]
    found = torch.searchsorted(cdf, uniforms.unsqueeze(-1), right=True)  # [N, 1] in 0..W
    past_end = torch.full((num_rows, 1), vocab_size, dtype=torch.long)
    return torch.cat([compact_ids, past_end], dim=1).gather(1, found).squeeze(-1)  # [N]
