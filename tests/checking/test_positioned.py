"""The checks of the draws keyed by position (`exactspec.checking.positioned`) and their grid cases: the
inverse of the hash, the seeds that hit a chosen uniform, and that each check fails where it should."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import grid_cases

from exactspec.checking import positioned
from exactspec.checking.cases import EXACT_TOLERANCE, ExactCase, run_exact_case
from exactspec.foundations import sampler as sampler_module
from exactspec.foundations.sampler import MASK_64, position_uniform


def test_unmix64_inverts_the_finaliser() -> None:
    rng = random.Random(0)
    values = [0, 1, MASK_64, 1 << 63, *(rng.getrandbits(64) for _ in range(2000))]
    assert all(positioned.unmix64(sampler_module._mix64(v)) == v for v in values)
    assert all(sampler_module._mix64(positioned.unmix64(v)) == v for v in values)


@pytest.mark.parametrize("position", [0, 5, 1 << 40])
def test_a_seed_for_any_grid_value_at_any_position(position: int) -> None:
    for k in (0, 1, 12345, positioned.GRID // 3, positioned.GRID - 1):
        seed = positioned.seed_for_uniform(k, position)
        assert 0 <= seed <= MASK_64 and position_uniform(seed, position) == k / positioned.GRID
    with pytest.raises(ValueError, match="2\\^53"):
        positioned.seed_for_uniform(positioned.GRID, 0)


def test_the_law_check_fails_where_the_draw_steps_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """A draw that reads its uniform a little high (u + 2^-52) lands on the next id at each step's end."""
    real = sampler_module._inverse_cdf
    monkeypatch.setattr(
        sampler_module, "_inverse_cdf", lambda probs, u: real(probs, (u + 2.0**-52).clamp(max=0.9))
    )
    with pytest.raises(AssertionError, match="the CDF says"):
        positioned.positioned_law(torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64), 3)


def test_the_point_mass_check_fails_where_a_draft_position_reads_the_next_positions_draw(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Token verification of a deterministic draft that drew position i with position i + 1's uniform: the
    law of each token is unchanged, the seeded tokens are not plain decoding's."""
    from exactspec.verifiers import token

    real = token._Block.coupled

    def shifted(self, p, draft_tokens, active, i):  # type: ignore[no-untyped-def]
        self.positions = [t + 1 for t in self.positions]
        try:
            real(self, p, draft_tokens, active, i)
        finally:
            self.positions = [t - 1 for t in self.positions]

    monkeypatch.setattr(token._Block, "coupled", shifted)
    (case,) = [c for c in grid_cases("positioned") if c.name.endswith("plain tokens, suffix")]
    assert run_exact_case(case).total_variation > 0.1


POSITIONED_CASES = grid_cases("positioned")


@pytest.mark.parametrize("case", POSITIONED_CASES, ids=lambda case: case.name)
def test_positioned_draws_are_exact(case: ExactCase) -> None:
    result = run_exact_case(case)
    assert result.total_variation <= EXACT_TOLERANCE, result.total_variation
