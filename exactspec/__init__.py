"""exactspec: exact (lossless) speculative decoding.

The names below are the public API; README.md gives a tour, docs/algorithm.md
the algorithm contract (p = target, q = draft, gamma, residual, bonus, round)
and docs/architecture.md where each piece lives.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Where each public name lives. They are imported on first use (PEP 562), so that
# `import exactspec` (and `python -m exactspec`) stays light until a name is needed:
# the command line can then treat a Ctrl-C during the heavy imports as an interruption.
_EXPORTS = {
    "SpeculativeDecoder": "exactspec.api.decoder",
    "DecodeConfig": "exactspec.decoding.engine",
    "RowState": "exactspec.decoding.engine",
    "SpeculativeEngine": "exactspec.decoding.engine",
    "Sampler": "exactspec.foundations.sampler",
    "SeededSampler": "exactspec.foundations.sampler",
    "SamplingSettings": "exactspec.foundations.settings",
    "Structure": "exactspec.foundations.grammar",
    "probabilities": "exactspec.foundations.transforms",
    "Drafter": "exactspec.drafters",
    "ModelDrafter": "exactspec.drafters",
    "Proposal": "exactspec.drafters",
    "LanguageModel": "exactspec.models.base",
    "ModelPair": "exactspec.models.pair",
    "NO_TOKEN": "exactspec.verifiers.base",
    "VerifyResult": "exactspec.verifiers.base",
    "verify": "exactspec.verifiers.token",
}

if TYPE_CHECKING:
    from exactspec.api.decoder import SpeculativeDecoder
    from exactspec.decoding.engine import DecodeConfig, RowState, SpeculativeEngine
    from exactspec.drafters import Drafter, ModelDrafter, Proposal
    from exactspec.foundations.grammar import Structure
    from exactspec.foundations.sampler import Sampler, SeededSampler
    from exactspec.foundations.settings import SamplingSettings
    from exactspec.foundations.transforms import probabilities
    from exactspec.models.base import LanguageModel
    from exactspec.models.pair import ModelPair
    from exactspec.verifiers.base import NO_TOKEN, VerifyResult
    from exactspec.verifiers.token import verify

__all__ = [
    "NO_TOKEN",
    "__version__",
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
    "Structure",
    "VerifyResult",
    "probabilities",
    "verify",
]


def package_version() -> str:
    """This package's version: the installed distribution's (package metadata), else, for a source tree
    that was never installed, its pyproject.toml's; "0+unknown" when neither can be read."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("exactspec")
    except PackageNotFoundError:
        pass
    import tomllib
    from pathlib import Path

    try:
        with open(Path(__file__).resolve().parent.parent / "pyproject.toml", "rb") as handle:
            project = tomllib.load(handle).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        return "0+unknown"
    return str(project.get("version", "0+unknown")) if project.get("name") == "exactspec" else "0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":  # read once, on first use (metadata reading is not free at import)
        globals()[name] = package_version()
        return globals()[name]
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'exactspec' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
