"""The defaults fall back to plain decoding where drafting runs slower than plain decoding would, and look
again after waits that double: a target whose k-token pass sleeps far longer than the measured pass costs
say (an injected slow pass, timed by the wall clock as every round is)."""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from exactspec.checking.toy import TabularModel
from exactspec.decoding.builder import build_engine
from exactspec.decoding.engine import DecodeConfig
from exactspec.decoding.planner import CostAwareGamma
from exactspec.decoding.strategy import Strategy
from exactspec.foundations.costs import BatchCosts
from exactspec.foundations.defaults import DEFAULTS
from exactspec.foundations.sampler import SeededSampler
from exactspec.models.base import ModelWrapper

STEP = 0.001
"""Seconds a one-token pass sleeps."""
WIDE = 0.080
"""Seconds a pass of several tokens sleeps: 80 one-token passes, so no draft of up to 8 tokens can pay."""
MEASURED = BatchCosts(
    rows=(1,), widths=tuple(range(1, 10)), target=(tuple(STEP * (1 + 0.05 * k) for k in range(9)),)
)
"""The pass costs a measurement saw: a wider pass nearly as cheap as a one-token one (as ONNX Runtime's
measured 2-token pass was, at 1.09 one-token steps, where generation's 2-token rounds took 1.78)."""
GAMMA = 8
TOKENS = 200


class SlowWidePass(ModelWrapper):
    """The wrapped model, each pass sleeping STEP (one token a row) or WIDE (more), its width recorded."""

    def __init__(self, model: TabularModel) -> None:
        super().__init__(model)
        self.widths: list[int] = []

    def logits(
        self, histories: Sequence[Sequence[int]], num_positions: int = 1, rows: Sequence[int] | None = None
    ) -> torch.Tensor:
        self.widths.append(num_positions)
        time.sleep(WIDE if num_positions > 1 else STEP)
        return self.model.logits(histories, num_positions, rows)


def repeating_model() -> TabularModel:
    """Next-token probabilities that depend on the last token only (sharp): the text cycles, so the suffix
    drafter finds matches and most of its drafts are kept."""
    generator = torch.Generator().manual_seed(3)
    table = torch.softmax(3.0 * torch.randn(8, 8, generator=generator, dtype=torch.float64), dim=-1)
    return TabularModel(lambda history: table[history[-1]], 8, ())


def test_the_defaults_fall_back_to_plain_within_a_few_rounds_and_probe_ever_more_rarely() -> None:
    target = SlowWidePass(repeating_model())
    engine = build_engine(
        target, None, Strategy(DEFAULTS.free_drafter), GAMMA, batch_costs=MEASURED
    )  # the defaults without a draft model: suffix, planned
    policy = engine.gamma_policy
    assert isinstance(policy, CostAwareGamma)
    prompt = [1, 2, 3, 4] * 3
    config = DecodeConfig(gamma=GAMMA, max_new_tokens=TOKENS)
    (state,) = engine.generate([prompt], config, SeededSampler(7))
    drafted = [r for r, width in enumerate(target.widths) if width > 1]  # each round is one target pass
    assert drafted and drafted[0] <= 1  # the measured costs say drafting pays: it drafts at once
    assert all(r < 4 for r in drafted[:2]) and not [r for r in drafted if 4 <= r < policy.gains.probe_every]
    probes = [r for r in drafted if r >= policy.gains.probe_every]
    waits = [b - a for a, b in zip(probes, probes[1:], strict=False)]
    assert len(probes) >= 2 and all(later > earlier for earlier, later in zip(waits, waits[1:], strict=False))
    assert len(drafted) <= 3 + len(probes)
    assert engine.metrics.round_time_error == engine.metrics.round_time_error  # predictions were compared
    # Exact all along: the suffix drafts' q is a point mass, so the seeded tokens are plain decoding's.
    plain = build_engine(repeating_model(), None, Strategy(DEFAULTS.free_drafter), 0)
    (expected,) = plain.generate([prompt], DecodeConfig(gamma=0, max_new_tokens=TOKENS), SeededSampler(7))
    assert state.generated == expected.generated and len(expected.generated) == TOKENS
