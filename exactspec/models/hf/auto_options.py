"""What dtype and weights "auto" mean on a device for the transformers backend.

dtype "auto" per device:
- CPU: `exactspec.models.loading.DEFAULT_DTYPE` (bfloat16), measured fastest for the default
  pair on the 2-core AVX-512-bf16 development machine (README, Speed).
- CUDA: bfloat16, the usual choice for inference on current GPUs. Not measured here: the
  development machine has no GPU.

weights "auto" per device (`auto_weights`):
- CPU: "int4", torch's packed 4-bit CPU kernel (`exactspec.models.hf.packed`): on the 2-core
  development machine the default pair decodes faster than with dense bfloat16 weights
  (docs/performance.md, "Packed weights and llama.cpp"). The packed model is the
  target; "bf16" gives the dense (dequantized GGUF) model instead.
- CUDA: "bf16" (the packed kernels used here are CPU kernels).
"""

from __future__ import annotations

import torch

CUDA_DEFAULT_DTYPE = torch.bfloat16
"""dtype "auto" on CUDA (not measured: no GPU on the development machine)."""


def auto_weights(device: torch.device) -> str:
    """What weights "auto" means on this device (see the module docstring)."""
    return "int4" if device.type == "cpu" else "bf16"


def auto_dtype(device: torch.device) -> torch.dtype:
    """What dtype "auto" means on this device."""
    if device.type == "cuda":
        return CUDA_DEFAULT_DTYPE
    from exactspec.models.loading import DEFAULT_DTYPE

    return DEFAULT_DTYPE
