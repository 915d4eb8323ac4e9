"""exactspec: exact (lossless) speculative decoding.

The names below are the public API; see README.md for a tour and SPEC.md for
the algorithm contract (p = target, q = draft, gamma, residual, bonus, round).
"""

from exactspec.drafters import Drafter, ModelDrafter, Proposal
from exactspec.engine import DecodeConfig, RowState, SpeculativeEngine
from exactspec.models.base import LanguageModel
from exactspec.sampler import Sampler, SeededSampler
from exactspec.settings import SamplingSettings
from exactspec.transforms import probabilities
from exactspec.verifier import NO_TOKEN, VerifyResult, verify

__all__ = [
    "NO_TOKEN",
    "DecodeConfig",
    "Drafter",
    "LanguageModel",
    "ModelDrafter",
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


def __getattr__(name: str) -> object:
    # The Hugging Face layer imports transformers (seconds); load it only when asked for.
    if name == "SpeculativeDecoder":
        from exactspec.api import SpeculativeDecoder

        return SpeculativeDecoder
    raise AttributeError(f"module 'exactspec' has no attribute {name!r}")
