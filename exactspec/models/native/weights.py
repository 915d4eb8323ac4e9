"""A decoder's weights read from an ONNX export of onnxruntime-genai's model builder (`models.onnx.export`).

The export is where the default path's weights already are: int4 MatMulNBits products (blocks of 32 to
128, symmetric or with zero points), float32 norms, embedding and rotary tables. Reading them from there
gives exactspec's own kernels the very weights ONNX Runtime runs, so the two backends compute the same
function and differ only in rounding and speed, and the first run exports once for both.

What is read, by the builder's node names (Qwen2 and Llama graphs; a product is named MatMul_Q4 when the
builder quantized it, MatMulNBits when it read an int4 checkpoint, as the built-in pair's export does):

    /model/embed_tokens/Gather                      embedding [V, D]
    /model/layers.{l}/input_layernorm/...           its weight [D] and epsilon
    /model/layers.{l}/attn/qkv_proj/MatMul_Q4       fused q, k, v (or q_proj, k_proj, v_proj apart),
                                                    a bias as the node's 6th input or an Add after it
    /model/layers.{l}/attn/o_proj/MatMul_Q4
    /model/layers.{l}/post_attention_layernorm/...
    /model/layers.{l}/mlp/gate_proj|up_proj|down_proj/MatMul_Q4   (gate and up joined here: one product)
    /model/layers.{L}/final_norm_layernorm/...
    /lm_head/MatMul_Q4
    cos_cache, sin_cache                            [context, head_size / 2]

Initializers are read from the external data file one at a time (a read into a buffer of their own, not
a memory map: a map's pages count in the process's resident memory until it is closed, which put the
whole 1.8 GB file on top of the packed weights while they were built, a 4.3 GB peak for a model that
then holds 2.1 GB) and packed for the kernels (`kernels.int4.Int4Weights.from_matmulnbits`): the float32
embedding (0.9 GB for the built-in target) and the packed products are the only copies held.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from exactspec.kernels.int4 import Int4Weights
from exactspec.kernels.rowwise import RotaryTable
from exactspec.models.native.forward import DecoderWeights, LayerWeights, Shape


class UnsupportedGraph(ValueError):
    """The export is not a graph this reader knows (another architecture, float weights, a quantized
    embedding): the message names what is missing."""


class _Graph:
    """The export's nodes by name and its initializers, read lazily from the external data file."""

    def __init__(self, folder: Path, filename: str) -> None:
        import onnx

        self.folder = folder
        model = onnx.load(str(folder / filename), load_external_data=False)
        self.nodes = {node.name: node for node in model.graph.node}
        self.initializers = {tensor.name: tensor for tensor in model.graph.initializer}

    def node(self, pattern: str) -> Any | None:
        """The node whose name matches `pattern` (a regular expression over the whole name), or None."""
        matches = [node for name, node in self.nodes.items() if re.fullmatch(pattern, name)]
        if len(matches) > 1:
            raise UnsupportedGraph(f"{len(matches)} nodes match {pattern!r} in {self.folder}")
        return matches[0] if matches else None

    def array(self, name: str) -> np.ndarray:
        """Initializer `name` as a numpy array of its own (writable; read from the data file if external)."""
        from onnx import helper, numpy_helper

        tensor = self.initializers.get(name)
        if tensor is None:
            raise UnsupportedGraph(f"{self.folder}: no initializer {name!r}")
        if tensor.data_location != 1:  # in the graph itself (small; copied: to_array gives a read-only view)
            return numpy_helper.to_array(tensor).copy()
        info = {entry.key: entry.value for entry in tensor.external_data}
        offset, length = int(info.get("offset", 0)), int(info["length"])
        dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
        raw = np.fromfile(self.folder / info["location"], dtype=np.uint8, count=length, offset=offset)
        if raw.size != length:
            raise UnsupportedGraph(f"{self.folder}: {info['location']} ends inside initializer {name!r}")
        return raw.view(dtype).reshape(tuple(tensor.dims))

    @staticmethod
    def attribute(node: Any, name: str, default: Any = None) -> Any:
        from onnx import helper

        for attribute in node.attribute:
            if attribute.name == name:
                return helper.get_attribute_value(attribute)
        return default


def _products(graph: _Graph, nodes: list[Any]) -> Int4Weights:
    """MatMulNBits nodes over the same input as one product, their outputs side by side in order (their
    inputs joined along N, which is what MatMulNBits' layout lays out first), packed for the kernel."""
    arrays: list[tuple[np.ndarray, np.ndarray, np.ndarray | None]] = []
    shapes = set()
    for node in nodes:
        if node.op_type != "MatMulNBits":
            raise UnsupportedGraph(f"{node.name} is a {node.op_type}, not an int4 MatMulNBits product")
        bits = graph.attribute(node, "bits", 4)
        if bits != 4:
            raise UnsupportedGraph(f"{node.name} has {bits}-bit weights; the kernels take 4-bit weights")
        inputs = list(node.input) + [""] * 6
        if inputs[4]:
            raise UnsupportedGraph(f"{node.name} has a g_idx input (act-order weights): not supported")
        k, n, block = (int(graph.attribute(node, name)) for name in ("K", "N", "block_size"))
        shapes.add((k, block))
        blocks = -(-k // block)
        zero_points = graph.array(inputs[3]).reshape(n, -1) if inputs[3] else None
        packed = graph.array(inputs[1]).reshape(n, blocks, block // 2)
        arrays.append((packed, graph.array(inputs[2]).astype(np.float32).reshape(n, blocks), zero_points))
    if len(shapes) != 1:
        raise UnsupportedGraph(f"{[node.name for node in nodes]} differ in K or block size: cannot join them")
    ((k, block),) = shapes
    if any(z is None for _, _, z in arrays) and not all(z is None for _, _, z in arrays):
        arrays = [
            (b, s, _symmetric_zero_points(b.shape[0], b.shape[1]) if z is None else z) for b, s, z in arrays
        ]
    packed = np.concatenate([b for b, _, _ in arrays])
    scales = np.concatenate([s for _, s, _ in arrays])
    zero_points = None if arrays[0][2] is None else np.concatenate([z for _, _, z in arrays])
    return Int4Weights.from_matmulnbits(packed, scales, zero_points, k=k, n=packed.shape[0], block=block)


def _symmetric_zero_points(n: int, blocks: int) -> np.ndarray:
    """MatMulNBits' packed zero points of 8 (its default when a node gives none)."""
    return np.full((n, (blocks + 1) // 2), 0x88, dtype=np.uint8)


def _bias(graph: _Graph, node: Any) -> np.ndarray | None:
    """A product's bias: its 6th input, or the initializer of an Add that takes its output."""
    inputs = list(node.input) + [""] * 6
    if inputs[5]:
        return graph.array(inputs[5]).astype(np.float32)
    for other in graph.nodes.values():
        if other.op_type == "Add" and node.output[0] in other.input:
            names = [name for name in other.input if name in graph.initializers]
            if names:
                return graph.array(names[0]).astype(np.float32)
    return None


def _norm(graph: _Graph, pattern: str) -> tuple[torch.Tensor, float]:
    node = graph.node(pattern)
    if node is None or "LayerNormalization" not in node.op_type or "Simplified" not in node.op_type:
        raise UnsupportedGraph(f"no RMS norm matches {pattern!r}")
    weight = next(name for name in node.input if name in graph.initializers)
    return torch.from_numpy(graph.array(weight).astype(np.float32, copy=False)), float(
        graph.attribute(node, "epsilon", 1e-6)
    )


def _layer(graph: _Graph, index: int, shape_heads: tuple[int, int, int]) -> tuple[LayerWeights, float, int]:
    prefix = rf"/model/layers\.{index}"
    input_norm, eps = _norm(graph, rf"{prefix}/input_layernorm/.*")
    post_norm, _ = _norm(graph, rf"{prefix}/post_attention_layernorm/.*")
    fused = graph.node(rf"{prefix}/attn/qkv_proj/(?:MatMul_Q4|MatMulNBits)")
    nodes = (
        [fused]
        if fused is not None
        else [graph.node(rf"{prefix}/attn/{p}_proj/(?:MatMul_Q4|MatMulNBits)") for p in "qkv"]
    )
    if any(node is None for node in nodes):
        raise UnsupportedGraph(f"layer {index}: no int4 q/k/v products (is the export int4?)")
    qkv = _products(graph, nodes)
    heads, kv_heads, head_size = shape_heads
    biases = [_bias(graph, node) for node in nodes]
    widths = [int(graph.attribute(node, "N")) for node in nodes]
    if all(b is None for b in biases):
        qkv_bias = None
    else:
        qkv_bias = torch.from_numpy(
            np.concatenate(
                [np.zeros(w, np.float32) if b is None else b for b, w in zip(biases, widths, strict=True)]
            )
        )
    if qkv.n != (heads + 2 * kv_heads) * head_size:
        raise UnsupportedGraph(f"layer {index}: q/k/v products give {qkv.n} outputs, not (H + 2 kvH) x hd")
    mlp = [graph.node(rf"{prefix}/mlp/{p}_proj/(?:MatMul_Q4|MatMulNBits)") for p in ("gate", "up", "down")]
    if any(node is None for node in mlp):
        raise UnsupportedGraph(f"layer {index}: no int4 gate/up/down products")
    gate_up = _products(graph, mlp[:2])
    output = graph.node(rf"{prefix}/attn/o_proj/(?:MatMul_Q4|MatMulNBits)")
    if output is None:
        raise UnsupportedGraph(f"layer {index}: no int4 output projection")
    layer = LayerWeights(
        input_norm=input_norm,
        qkv=qkv,
        qkv_bias=qkv_bias,
        output=_products(graph, [output]),
        post_norm=post_norm,
        gate_up=gate_up,
        down=_products(graph, [mlp[2]]),
    )
    return layer, eps, gate_up.n // 2


def load_exported(folder: str | Path) -> DecoderWeights:
    """The decoder in an export folder (model.onnx and its data, genai_config.json)."""
    folder = Path(folder)
    config_path = folder / "genai_config.json"
    if not config_path.is_file():
        raise UnsupportedGraph(f"no genai_config.json in {folder}: not a model builder output folder")
    config = json.loads(config_path.read_text())["model"]
    decoder = config["decoder"]
    graph = _Graph(folder, decoder.get("filename", "model.onnx"))
    layers_count = int(decoder["num_hidden_layers"])
    heads, kv_heads = int(decoder["num_attention_heads"]), int(decoder["num_key_value_heads"])
    head_size = int(decoder["head_size"])
    embed = graph.node(r"/model/embed_tokens/Gather")
    if embed is None or embed.op_type != "Gather":
        raise UnsupportedGraph(f"{folder}: the embedding is not a float Gather (a quantized embedding?)")
    embedding = torch.from_numpy(graph.array(embed.input[0]).astype(np.float32, copy=False))
    layers: list[LayerWeights] = []
    eps, intermediate = 1e-6, 0
    for index in range(layers_count):
        layer, eps, intermediate = _layer(graph, index, (heads, kv_heads, head_size))
        layers.append(layer)
    final_norm, _ = _norm(graph, rf"/model/layers\.{layers_count}/final_norm_layernorm/.*")
    head = graph.node(r"/lm_head/(?:MatMul_Q4|MatMulNBits)")
    if head is None:
        raise UnsupportedGraph(f"{folder}: no int4 output layer (/lm_head/MatMul_Q4)")
    lm_head = _products(graph, [head])
    cos = torch.from_numpy(graph.array("cos_cache").astype(np.float32, copy=False))
    sin = torch.from_numpy(graph.array("sin_cache").astype(np.float32, copy=False))
    shape = Shape(
        layers=layers_count,
        hidden_size=int(decoder["hidden_size"]),
        heads=heads,
        kv_heads=kv_heads,
        head_size=head_size,
        intermediate_size=intermediate,
        vocab_size=lm_head.n,
        rms_eps=eps,
        context_length=min(int(config["context_length"]), cos.shape[0]),
    )
    return DecoderWeights(shape, embedding, layers, final_norm, lm_head, RotaryTable.given(cos, sin))
