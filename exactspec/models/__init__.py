"""Model adapters: everything that turns token histories into next-token logits."""

from exactspec.models.base import LanguageModel

__all__ = ["LanguageModel"]
