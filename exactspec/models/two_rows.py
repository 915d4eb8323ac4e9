"""Dense bfloat16 linears on the CPU fed one row at a time compute it as two: `use_two_row_linears`.

Why. A decoding step with one sequence feeds every linear layer a single row
(one token of one sequence). For bfloat16 weights torch's CPU matmul takes a
different kernel for one row than for two or more, and on this project's
2-core AVX-512-bf16 machine (torch 2.13) that kernel is both slower and
numerically different:

- it computes a row differently from the kernel of a k-row block, so a
  one-token pass and the verifier's k-token pass disagree in the last bits
  (layers 1536 -> 8960, 1536 -> 1536 and the 1536 -> 151936 output head of
  the default target: their one-row outputs differ from row 0 of a 2..6-row
  product; a lone row fed as two equals row 0 of every k-row product bit for
  bit, `tests/models/test_two_rows.py` checks this on the machine it runs on);
- its speed comes in two modes from run to run, and a lone row fed as two
  is no slower (docs/numerics.md).

So each lone row is duplicated, multiplied as a two-row block, and the first
row of the result kept. Rows of a step with two or more rows (a verification
block, a batch) go through unchanged. The result of the duplicated row is
that of the k-row kernel; nothing else about the model changes.

Only exact `nn.Linear` modules with bfloat16 weights on the CPU are switched
(packed int4/int8 layers have their own kernels; float32 and float16 were not
measured, and are left as they are).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

SWITCHED_DTYPES = (torch.bfloat16,)


class TwoRowLinear(nn.Linear):
    """`nn.Linear` whose input of exactly one row is multiplied as two equal rows (first row kept)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in_features] -> [..., out_features]; one row ([1, in], [1, 1, in], ...) goes as two."""
        if x.numel() != x.shape[-1]:
            return F.linear(x, self.weight, self.bias)
        row = x.reshape(1, x.shape[-1])  # [1, in]
        out = F.linear(row.expand(2, -1), self.weight, self.bias)[:1]  # [1, out]: row 0 of the 2-row product
        return out.reshape(*x.shape[:-1], self.out_features)


def use_two_row_linears(model: nn.Module) -> int:
    """Switch `model`'s dense bfloat16 CPU linears to `TwoRowLinear` in place; returns how many.

    The modules keep their parameters (only their class changes), so state dicts, tied weights
    and hooks are untouched. Calling it again switches nothing more.
    """
    switched = 0
    for module in model.modules():
        if type(module) is not nn.Linear:
            continue
        weight: Any = module.weight
        if weight.device.type != "cpu" or weight.dtype not in SWITCHED_DTYPES:
            continue
        module.__class__ = TwoRowLinear
        switched += 1
    return switched
