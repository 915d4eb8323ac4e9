"""exactspec.kernels.decoder: the one-call pass gives `models.native.forward.forward`'s bits (logits, keys
and values) on every path and thread count, for chains, several rows and tree-shaped cell lists; bad plans
are refused before the cache is touched."""

from __future__ import annotations

import pytest
import torch

from exactspec.kernels.attention import KVCache
from exactspec.kernels.decoder import DecoderKernel
from exactspec.kernels.int4 import Int4Weights
from exactspec.kernels.paths import FORCE_ENV, available_paths
from exactspec.kernels.rowwise import RotaryTable
from exactspec.models.native.forward import DecoderWeights, LayerWeights, PassPlan, Shape, forward


def random_weights(*, bias: bool, head_size: int = 24, hidden: int = 72, seed: int = 0) -> DecoderWeights:
    """Small random weights with ragged sizes: head_size and hidden not multiples of 16, K not a whole
    number of blocks, a vocabulary not a whole number of tiles."""
    generator = torch.Generator().manual_seed(seed)
    shape = Shape(
        layers=3,
        hidden_size=hidden,
        heads=6,
        kv_heads=2,
        head_size=head_size,
        intermediate_size=100,
        vocab_size=53,
        rms_eps=1e-6,
        context_length=64,
    )

    def matrix(n: int, k: int, block: int = 32) -> Int4Weights:
        return Int4Weights.quantize(torch.randn(n, k, generator=generator) * k**-0.5, block=block)

    def norm() -> torch.Tensor:
        return 1 + 0.1 * torch.randn(shape.hidden_size, generator=generator)

    qkv = (shape.heads + 2 * shape.kv_heads) * head_size
    layers = [
        LayerWeights(
            input_norm=norm(),
            qkv=matrix(qkv, hidden),
            qkv_bias=torch.randn(qkv, generator=generator) * 0.1 if bias else None,
            output=matrix(hidden, shape.heads * head_size, 64),
            post_norm=norm(),
            gate_up=matrix(2 * shape.intermediate_size, hidden),
            down=matrix(hidden, shape.intermediate_size),
        )
        for _ in range(shape.layers)
    ]
    return DecoderWeights(
        shape=shape,
        embedding=torch.randn(shape.vocab_size, hidden, generator=generator),
        layers=layers,
        final_norm=norm(),
        lm_head=matrix(shape.vocab_size, hidden),
        rotary=RotaryTable(head_size, 10000.0),
    )


def plans(vocab: int) -> list[PassPlan]:
    """Passes over a 3-slot cache, in order: a prompt per slot, chains of one and several tokens in
    several rows, a tree (nodes attending to their history, ancestors and themselves), nothing wanted."""
    generator = torch.Generator().manual_seed(1)
    out = []

    def plan(entries: list[tuple[int, int, int, list[int]]], wanted: list[int]) -> PassPlan:
        """entries: (slot, position, cell, visible cells) per token."""
        offsets = [0]
        for *_, cells in entries:
            offsets.append(offsets[-1] + len(cells))

        def ints(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int32)

        return PassPlan(
            tokens=torch.randint(0, vocab, (len(entries),), generator=generator),
            slots=ints([e[0] for e in entries]),
            positions=ints([e[1] for e in entries]),
            cells=ints([e[2] for e in entries]),
            offsets=ints(offsets),
            visible=ints([c for *_, cells in entries for c in cells]),
            wanted=torch.tensor(wanted, dtype=torch.int64),
        )

    def chain(slot: int, start: int, count: int) -> list[tuple[int, int, int, list[int]]]:
        return [(slot, p, p, list(range(p + 1))) for p in range(start, start + count)]

    out.append(plan(chain(0, 0, 20) + chain(1, 0, 7), [19, 26, 3]))
    out.append(plan(chain(2, 0, 40), []))
    out.append(plan(chain(0, 20, 1), [0]))
    out.append(plan(chain(1, 7, 4) + chain(0, 21, 1) + chain(2, 40, 2), [6, 0, 1, 2, 3, 4, 5]))
    # A tree after slot 0's 22 cells: node n in cell 22 + n, parents -1, 0, 0, 1.
    history = list(range(22))
    tree = [
        (0, 22, 22, [*history, 22]),
        (0, 23, 23, [*history, 22, 23]),
        (0, 23, 24, [*history, 22, 24]),
        (0, 24, 25, [*history, 22, 23, 25]),
    ]
    out.append(plan(tree + chain(1, 11, 1), [4, 3, 2, 1, 0]))
    return out


def new_cache(weights: DecoderWeights) -> KVCache:
    shape = weights.shape
    return KVCache(
        layers=shape.layers, slots=3, kv_heads=shape.kv_heads, head_size=shape.head_size, capacity=48
    )


@pytest.mark.parametrize("path", available_paths())
@pytest.mark.parametrize("bias", [True, False])
def test_the_one_call_pass_gives_forwards_bits(path: str, bias: bool, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv(FORCE_ENV, path)
    weights = random_weights(bias=bias, head_size=24 if bias else 32)
    kernel = DecoderKernel(weights)
    expected_cache = new_cache(weights)
    expected = [forward(weights, expected_cache, plan, threads=1) for plan in plans(weights.shape.vocab_size)]
    for threads in (1, 2, 3):
        cache = new_cache(weights)
        for plan, logits in zip(plans(weights.shape.vocab_size), expected, strict=True):
            assert torch.equal(kernel.run(cache, plan, threads), logits)
        assert torch.equal(cache.keys, expected_cache.keys)
        assert torch.equal(cache.values, expected_cache.values)


def test_fewer_columns_are_the_same_bits_as_those_of_all() -> None:
    weights = random_weights(bias=True)
    kernel = DecoderKernel(weights)
    first, *_ = plans(weights.shape.vocab_size)
    whole = kernel.run(new_cache(weights), first)
    for columns in (1, 16, 17, 40):
        assert torch.equal(kernel.run(new_cache(weights), first, columns=columns), whole[:, :columns])
    with pytest.raises(ValueError, match="columns"):
        kernel.run(new_cache(weights), first, columns=weights.shape.vocab_size + 1)


def test_a_grown_cache_is_read_where_it_now_is() -> None:
    weights = random_weights(bias=True)
    kernel = DecoderKernel(weights)
    expected_cache, cache = new_cache(weights), new_cache(weights)
    first, second, *_ = plans(weights.shape.vocab_size)
    assert torch.equal(kernel.run(cache, first), forward(weights, expected_cache, first))
    for c in (cache, expected_cache):
        c.grow(slots=4, capacity=96)
    assert torch.equal(kernel.run(cache, second), forward(weights, expected_cache, second))
    assert torch.equal(cache.keys, expected_cache.keys)


@pytest.mark.parametrize(
    "field, value",
    [
        ("cells", [48]),
        ("slots", [3]),
        ("tokens", [53]),
        ("visible", [1, 0]),
        ("wanted", [1]),
    ],
)
def test_a_bad_plan_is_refused_before_the_cache_is_written(field: str, value: list[int]) -> None:
    weights = random_weights(bias=False)
    cache = new_cache(weights)
    entries = {
        "tokens": torch.tensor([5]),
        "slots": torch.tensor([0], dtype=torch.int32),
        "positions": torch.tensor([1], dtype=torch.int32),
        "cells": torch.tensor([1], dtype=torch.int32),
        "offsets": torch.tensor([0, 2], dtype=torch.int32),
        "visible": torch.tensor([0, 1], dtype=torch.int32),
        "wanted": torch.tensor([0]),
    }
    entries[field] = torch.tensor(value, dtype=entries[field].dtype)
    with pytest.raises(ValueError, match="DecoderKernel.run"):
        DecoderKernel(weights).run(cache, PassPlan(**entries))
    assert not cache.keys.any() and not cache.values.any()
