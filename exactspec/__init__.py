"""exactspec: exact (lossless) speculative decoding.

The names below are the public API; README.md gives a tour, docs/algorithm.md
the algorithm contract (p = target, q = draft, gamma, residual, bonus, round)
and docs/architecture.md where each piece lives.
"""

from exactspec.api.decoder import SpeculativeDecoder
from exactspec.core.engine import DecodeConfig, RowState, SpeculativeEngine
from exactspec.core.sampler import Sampler, SeededSampler
from exactspec.core.settings import SamplingSettings
from exactspec.core.transforms import probabilities
from exactspec.drafters import Drafter, ModelDrafter, Proposal
from exactspec.models.base import LanguageModel
from exactspec.models.pair import ModelPair
from exactspec.verifiers.base import NO_TOKEN, VerifyResult
from exactspec.verifiers.token import verify

__all__ = [
    "NO_TOKEN",
    "DecodeConfig",
    "Drafter",
    "LanguageModel",
    "ModelDrafter",
    "ModelPair",
    "Proposal",
    "RowState",
    "Sampler",
    "SamplingSettings",
    "SeededSampler",
    "SpeculativeDecoder",
    "SpeculativeEngine",
    "VerifyResult",
    "probabilities",
    "verify",
]
