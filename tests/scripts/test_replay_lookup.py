"""scripts/replay_lookup.py: its replay of prompt lookup on a greedy answer is the engine's own rounds."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from exactspec.checking.toy import random_tabular_model
from exactspec.decoding.builder import build_engine
from exactspec.decoding.engine import DecodeConfig
from exactspec.decoding.gamma import LookupGamma
from exactspec.decoding.strategy import Strategy
from exactspec.drafters.ngram import DEFAULT_MAX_NGRAM, DEFAULT_MIN_NGRAM
from exactspec.foundations.costs import CostModel
from exactspec.foundations.sampler import SeededSampler
from exactspec.foundations.settings import SamplingSettings

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "replay_lookup.py"
COSTS = CostModel(0.0, (1.0, 0.9, 0.95, 1.0, 1.1, 1.2, 1.3))


def _replay_module():
    spec = importlib.util.spec_from_file_location("replay_lookup", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("adaptive", [False, True], ids=["fixed gamma", "adaptive lookup"])
def test_replay_proposes_what_the_engine_proposed_at_t0(adaptive: bool) -> None:
    # No EOS: the greedy answer runs to the length limit over 4 ids, so matches of every order occur.
    target = random_tabular_model(4, seed=3, eos_token_id=None, sharpness=2.0)
    prompt = [1, 2, 3, 1, 2, 0, 3]
    gamma = COSTS.max_gamma
    engine = build_engine(target, None, Strategy("ngram", adaptive_gamma=adaptive), gamma, costs=COSTS)
    config = DecodeConfig(gamma=gamma, max_new_tokens=60, settings=SamplingSettings(temperature=0.0))
    events = list(engine.stream([prompt], config, SeededSampler(0)))  # one per round: a single row
    proposed = [event.proposed for event in events]
    answer = [token for event in events for token in event.tokens]

    lengths = LookupGamma(COSTS, DEFAULT_MAX_NGRAM) if adaptive else None
    replayed = _replay_module().replay(prompt, answer, gamma, DEFAULT_MIN_NGRAM, DEFAULT_MAX_NGRAM, lengths)
    assert replayed == proposed  # one entry per round: the same rounds, each proposing as much
    assert len(set(proposed)) >= 3, proposed  # rounds of different lengths, not one repeated case
