"""Which device the models run on, and the dtype that `--dtype auto` means there.

`auto` picks CUDA when torch sees a GPU, else the CPU. Every tensor of the decoding core
(transforms, verifier, sampler, drafter, engine) is created on the models' device, and each
row's random stream is a generator on that device.

dtype "auto" per device:
- CPU: `exactspec.models.loading.DEFAULT_DTYPE` (bfloat16), measured fastest for the default
  pair on the 2-core AVX-512-bf16 development machine (README, Speed).
- CUDA: bfloat16, the usual choice for inference on current GPUs. Not measured here: the
  development machine has no GPU.

weights "auto" per device (`auto_weights`):
- CPU: "int4", torch's packed 4-bit CPU kernel (`exactspec.models.packed`): on the 2-core
  development machine the default pair decodes faster than with dense bfloat16 weights
  (docs/performance.md, "Packed weights and llama.cpp"). The packed model is the
  target; "bf16" gives the dense (dequantized GGUF) model instead.
- CUDA: "bf16" (the packed kernels used here are CPU kernels).
"""

from __future__ import annotations

import torch

from exactspec.foundations.errors import InvalidArgument

DEVICE_CHOICES = ("auto", "cpu", "cuda")

CUDA_DEFAULT_DTYPE = torch.bfloat16
"""dtype "auto" on CUDA (not measured: no GPU on the development machine)."""


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


def auto_weights(device: torch.device) -> str:
    """What weights "auto" means on this device (see the module docstring)."""
    return "int4" if device.type == "cpu" else "bf16"


def auto_dtype(device: torch.device) -> torch.dtype:
    """What dtype "auto" means on this device."""
    if device.type == "cuda":
        return CUDA_DEFAULT_DTYPE
    from exactspec.models.loading import DEFAULT_DTYPE

    return DEFAULT_DTYPE
