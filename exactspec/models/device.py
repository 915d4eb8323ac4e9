"""Which device the models run on.

`auto` picks CUDA when torch sees a GPU, else the CPU. Every tensor of the decoding core
(transforms, verifier, sampler, drafter, engine) is created on the models' device, and each
row's random stream is a generator on that device. What dtype and weights "auto" mean on a
device is the business of the backend that reads them (`Backend.options`).
"""

from __future__ import annotations

import torch

from exactspec.foundations.errors import InvalidArgument

DEVICE_CHOICES = ("auto", "cpu", "cuda")


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """ "auto" -> cuda if available else cpu; "cuda" without a GPU is an error that says so."""
    if isinstance(device, torch.device):
        return device
    name = str(device).lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise InvalidArgument(
                "--device cuda: torch sees no CUDA device here (this torch build or machine); "
                "use --device cpu"
            )
        return torch.device(name)
    if name == "cpu":
        return torch.device("cpu")
    raise InvalidArgument(f"unknown device {device!r}; use one of {', '.join(DEVICE_CHOICES)}")
