"""The int4 kernel: a row's bits do not depend on the other rows, M, the row's place, the threads or the
path; the result is x @ w.T within the activations' quantization error; MatMulNBits' layout reads right."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from exactspec.kernels.int4 import Int4Weights, matmul
from exactspec.kernels.paths import available_paths

PATHS = available_paths()
BLOCKS = (32, 64, 128)


def random_weights(
    generator: np.random.Generator, n: int, k: int, block: int, *, zero_points: bool
) -> tuple[Int4Weights, np.ndarray, np.ndarray, np.ndarray]:
    """Random int4 weights and their unpacked q [n, blocks * block], scales and zeros [n, blocks]."""
    blocks = -(-k // block)
    q = generator.integers(0, 16, size=(n, blocks * block), dtype=np.uint8)
    q[:, k:] = 0
    scales = generator.uniform(0.001, 0.05, size=(n, blocks)).astype(np.float32)
    if zero_points:
        zeros = generator.integers(0, 16, size=(n, blocks), dtype=np.uint8)
    else:
        zeros = np.full((n, blocks), 8, dtype=np.uint8)
    return Int4Weights(q, scales, zeros, k=k, block=block), q, scales, zeros


def random_rows(generator: np.random.Generator, m: int, k: int) -> torch.Tensor:
    x = generator.standard_normal((m, k)).astype(np.float32)
    x[:, generator.integers(0, k)] *= 20  # an outlier column, as real activations have
    if m > 1:
        x[1, : min(k, 40)] = 0  # a row with an all-zero block
    return torch.from_numpy(x)


def shapes(seed: int) -> list[tuple[int, int]]:
    """(n, k): ragged n (not a multiple of 16) and ragged k (not a multiple of the block) among them."""
    generator = np.random.default_rng(seed)
    return [(16, 128), (int(generator.integers(1, 60)), int(generator.integers(1, 300))), (37, 200)]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("zero_points", [True, False])
def test_every_row_of_a_pass_is_its_one_row_product(path: str, block: int, zero_points: bool) -> None:
    generator = np.random.default_rng([block, zero_points, PATHS.index(path)])
    for n, k in shapes(block + zero_points):
        weights = random_weights(generator, n, k, block, zero_points=zero_points)[0]
        x = random_rows(generator, 16, k)
        alone = [matmul(x[i : i + 1], weights, path=path, threads=1)[0] for i in range(16)]
        for m in range(2, 17):
            rows = generator.permutation(16)[:m]  # any rows, in any order: a row's place is irrelevant
            together = matmul(x[rows].contiguous(), weights, path=path, threads=1 + m % 4)
            for place, row in enumerate(rows):
                assert torch.equal(together[place], alone[row]), (n, k, m, place)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("block", [32, 128])
@pytest.mark.parametrize("rows", [37, 300])  # amx: groups of 16 and a shorter one; more than 256 at once
def test_more_rows_than_a_pass_holds_keep_their_bits(path: str, block: int, rows: int) -> None:
    generator = np.random.default_rng([rows, block])
    weights = random_weights(generator, 50, 300, block, zero_points=True)[0]
    x = random_rows(generator, rows, 300)
    together = matmul(x, weights, path=path, threads=3)
    for i in range(rows):
        assert torch.equal(together[i], matmul(x[i : i + 1], weights, path=path, threads=2)[0])


@pytest.mark.parametrize("block", BLOCKS)
def test_every_path_gives_the_reference_bits(block: int) -> None:
    generator = np.random.default_rng(block)
    for n, k in [(45, 3 * block + 7), (16, block), (300, 2 * block)]:
        for zero_points in (True, False):
            weights = random_weights(generator, n, k, block, zero_points=zero_points)[0]
            bias = torch.from_numpy(generator.standard_normal(n).astype(np.float32))
            for rows in (5, 15):  # a path may take other instructions for more rows (amx: tiles, 8+ at b128)
                x = random_rows(generator, rows, k)
                reference = matmul(x, weights, bias=bias, path="reference", threads=1)
                for path in PATHS:
                    for threads in (1, 2, 4):
                        product = matmul(x, weights, bias=bias, path=path, threads=threads)
                        assert torch.equal(product, reference), (path, rows, threads)


def quantized_activations(x: np.ndarray, block: int) -> np.ndarray:
    """The scale sa of each (row, block) of x, as the kernel computes it (float32 max|x| / 127)."""
    m, k = x.shape
    blocks = -(-k // block)
    padded = np.zeros((m, blocks * block), dtype=np.float32)
    padded[:, :k] = x
    return (np.abs(padded).reshape(m, blocks, block).max(axis=2) / np.float32(127)).astype(np.float32)


@pytest.mark.parametrize("block", BLOCKS)
def test_the_product_is_x_times_the_weights_within_the_activations_rounding(block: int) -> None:
    """|y - x @ w.T| (float64) <= sum over blocks of sa / 2 * sum |w| (each activation moves at most half
    a step sa when it is rounded to int8) + (blocks + 2) * 2^-23 * sum |w| (|x| + sa) (float32 roundings
    of the block scales' products and of the fused multiply-adds), with 1% slack."""
    generator = np.random.default_rng(block + 7)
    n, k = 70, 5 * block - 3
    weights = random_weights(generator, n, k, block, zero_points=True)[0]
    x = random_rows(generator, 6, k)
    w = weights.dequantize().double().numpy()
    exact = x.double().numpy() @ w.T
    sa = np.repeat(quantized_activations(x.numpy(), block).astype(np.float64), block, axis=1)[:, :k]
    rounding = (sa / 2) @ np.abs(w).T
    floats = (weights.blocks + 2) * 2.0**-23 * ((np.abs(x.double().numpy()) + sa) @ np.abs(w).T)
    for path in PATHS:
        error = np.abs(matmul(x, weights, path=path).double().numpy() - exact)
        assert (error <= 1.01 * (rounding + floats)).all()
        assert error.max() > 0  # the bound is not vacuous: activations are rounded


def test_quantize_round_trips_within_half_a_step() -> None:
    generator = np.random.default_rng(3)
    weight = torch.from_numpy(generator.standard_normal((33, 100)).astype(np.float32))
    weight[0, :32] = 0  # an all-zero block
    weight[1, :32] = 0.5  # a constant block
    weights = Int4Weights.quantize(weight, block=32)
    assert (weights.n, weights.k, weights.block) == (33, 100, 32)
    _, scales, _ = weights.unpacked()
    step = torch.from_numpy(np.repeat(scales, 32, axis=1)[:, :100])
    assert ((weights.dequantize() - weight).abs() <= step / 2 + 1e-6).all()
    assert (weights.dequantize()[0, :32] == 0).all()


@pytest.mark.parametrize("zero_points", [True, False])
def test_matmulnbits_inputs_unpack_to_their_values(zero_points: bool) -> None:
    generator = np.random.default_rng(4)
    n, k, block = 21, 300, 64  # 5 blocks: an odd count, the last zero-point byte half used
    blocks = -(-k // block)
    q = generator.integers(0, 16, size=(n, blocks * block), dtype=np.uint8)
    scales = generator.uniform(0.01, 0.1, size=(n, blocks)).astype(np.float32)
    zeros = generator.integers(0, 16, size=(n, blocks), dtype=np.uint8) if zero_points else None
    packed, packed_zeros = matmulnbits_inputs(q, zeros)
    weights = Int4Weights.from_matmulnbits(packed, scales.reshape(-1), packed_zeros, k=k, n=n, block=block)
    z = (zeros if zero_points else np.full((n, blocks), 8, np.uint8)).astype(np.float32)
    expected = (q.astype(np.float32).reshape(n, blocks, block) - z[..., None]) * scales[..., None]
    expected = expected.reshape(n, -1)[:, :k]
    assert torch.equal(weights.dequantize(), torch.from_numpy(expected))


def matmulnbits_inputs(q: np.ndarray, zeros: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
    """MatMulNBits' B [n, blocks, block / 2] and zero points [n * ceil(blocks / 2)], low nibble first."""
    n, kp = q.shape
    blocks = zeros.shape[1] if zeros is not None else None
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)
    if zeros is None:
        return packed, None
    padded = np.zeros((n, blocks + blocks % 2), dtype=np.uint8)
    padded[:, :blocks] = zeros
    return packed, (padded[:, 0::2] | (padded[:, 1::2] << 4)).reshape(-1)


@pytest.mark.parametrize("block", [32, 128])
@pytest.mark.parametrize("zero_points", [True, False])
def test_from_matmulnbits_matches_onnxruntime(block: int, zero_points: bool) -> None:
    onnxruntime = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    generator = np.random.default_rng(block + zero_points)
    n, k, m = 40, 3 * block + 16, 5
    blocks = -(-k // block)
    q = generator.integers(0, 16, size=(n, blocks * block), dtype=np.uint8)
    scales = generator.uniform(0.001, 0.05, size=n * blocks).astype(np.float32)
    zeros = generator.integers(0, 16, size=(n, blocks), dtype=np.uint8) if zero_points else None
    packed, packed_zeros = matmulnbits_inputs(q, zeros)
    packed = packed.reshape(n, blocks, block // 2)
    initializers = [numpy_helper.from_array(packed, "B"), numpy_helper.from_array(scales, "scales")]
    inputs = ["A", "B", "scales"]
    if zero_points:
        initializers.append(numpy_helper.from_array(packed_zeros, "zero_points"))
        inputs.append("zero_points")
    node = helper.make_node(
        "MatMulNBits",
        inputs,
        ["Y"],
        domain="com.microsoft",
        K=k,
        N=n,
        bits=4,
        block_size=block,
        accuracy_level=4,
    )
    graph = helper.make_graph(
        [node],
        "matmulnbits",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [m, n])],
        initializers,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=10)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    x = random_rows(generator, m, k)
    expected = torch.from_numpy(session.run(None, {"A": x.numpy()})[0])
    weights = Int4Weights.from_matmulnbits(packed, scales, packed_zeros, k=k, n=n, block=block)
    got = matmul(x, weights)
    # Both quantize the activations to int8 per block; the sums differ in rounding order only.
    scale = (x.abs() @ weights.dequantize().abs().T).max()
    assert (got - expected).abs().max() <= 1e-5 * scale


def test_out_and_bias_and_bad_arguments() -> None:
    generator = np.random.default_rng(5)
    weights = random_weights(generator, 20, 64, 32, zero_points=False)[0]
    x = random_rows(generator, 3, 64)
    bias = torch.arange(20, dtype=torch.float32)
    out = torch.full((3, 20), float("nan"))
    assert matmul(x, weights, bias=bias, out=out) is out
    assert torch.equal(out, matmul(x, weights) + bias)
    with pytest.raises(ValueError, match="x must be"):
        matmul(x.double(), weights)
    with pytest.raises(ValueError, match="x must be"):
        matmul(x[:, :32], weights)
    with pytest.raises(ValueError, match="out must be"):
        matmul(x, weights, out=torch.empty(3, 21))
    with pytest.raises(ValueError, match="block must be"):
        Int4Weights.quantize(torch.zeros(4, 16), block=16)


def test_calls_from_several_threads_at_once_keep_their_bits() -> None:
    from concurrent.futures import ThreadPoolExecutor

    generator = np.random.default_rng(6)
    weights = random_weights(generator, 300, 256, 32, zero_points=True)[0]
    x = random_rows(generator, 8, 256)
    expected = matmul(x, weights, threads=1)

    def calls(seed: int) -> bool:
        return all(torch.equal(matmul(x, weights, threads=1 + (seed + i) % 3), expected) for i in range(40))

    with ThreadPoolExecutor(3) as executor:
        assert all(executor.map(calls, range(3)))


def test_a_forked_child_multiplies_with_threads_of_its_own() -> None:
    import os

    generator = np.random.default_rng(7)
    weights = random_weights(generator, 200, 128, 32, zero_points=False)[0]
    x = random_rows(generator, 4, 128)
    expected = matmul(x, weights, threads=2)  # the parent's pool has a worker now
    child = os.fork()
    if child == 0:
        os._exit(0 if np.array_equal(matmul(x, weights, threads=2).numpy(), expected.numpy()) else 1)
    assert os.waitpid(child, 0)[1] == 0
