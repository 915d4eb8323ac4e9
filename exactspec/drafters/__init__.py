"""Drafters: whatever proposes draft tokens together with the q they were drawn from."""

from exactspec.drafters.base import Drafter, Proposal
from exactspec.drafters.model import ModelDrafter

__all__ = ["Drafter", "ModelDrafter", "Proposal"]
