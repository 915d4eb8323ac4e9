"""A variant of an exported graph whose every position's result is independent of how the pass is cut.

The builder's GroupQueryAttention multiplies a head's S new queries by the keys as one S-row product, and
ONNX Runtime's matrix library runs a one-row product through another kernel than several rows: a
one-token step and a k-token pass round the same query differently (docs/numerics.md). The variant
replaces every GroupQueryAttention with attention in which **each query is a product of its own**, so the
same kernels run for a query whatever else is in the pass:

    qkv [B, S, (H + 2 kvH) hd] -> Split -> q [B, S, H hd], k, v [B, S, kvH hd]
    q, k -> RotaryEmbedding(position_ids [B, S])              positions given, not read off a mask
    k, v -> [B, kvH, S, hd] -> ScatterND(past, cache_indices)  -> present [B, kvH, T, hd], in place
    q -> [B, kvH, S, G, 1, hd]  x  present keys [B, kvH, 1, 1, T, hd]^T  -> scores [B, kvH, S, G, 1, T]
        x scale, + attention_bias [B, 1, S, 1, 1, T] (0 where a query may attend, -inf elsewhere)
        -> softmax (its sum a one-row product by ones) -> x values -> [B, S, H hd]

G = H / kvH query heads share a key head, and T is the bound capacity: a one-row product's sums are the
same bits with more masked (exact zero) cells after a query's own, so T does not change a result either
(tests/models/test_onnx_invariant.py). The bias is the caller's; a tree's nodes could be masked that way,
but masked zeros lying between a node's ancestors change a one-row product's sum order, so `OnnxModel`
scores trees path by path. The weights' own products are invariant only as int4 in blocks of 32
(`export.INVARIANT_RECIPE`). Inputs added: `position_ids`, `cache_indices` [B, kvH, S, 3] ((row, head,
cell) of each new key and value) and `attention_bias` [B, S, T]; `attention_mask` goes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from exactspec.models.onnx.graph_files import write_variant

VARIANT_SUFFIX = ".invariant.onnx"
"""The variant of `model.onnx` is `model.invariant.onnx`, of `model.logits-from.onnx` ..."""
POSITION_IDS = "position_ids"
CACHE_INDICES = "cache_indices"
ATTENTION_BIAS = "attention_bias"
NEW_INPUTS = (POSITION_IDS, CACHE_INDICES, ATTENTION_BIAS)


class InvariantGraphError(ValueError):
    """The graph has an attention this variant cannot replace (named in the message)."""


class KernelsNotInvariantHere(InvariantGraphError):
    """The graph was made invariant, but on this machine ONNX Runtime's kernels for its weights are not: a
    block pass and one-token passes give different logits (`OnnxModel`'s load-time check).

    A property of the CPU (ONNX Runtime picks its matrix kernels by the instruction sets it finds, and has
    no setting that forces another path) and of the weights' recipe, not of the graph.
    """


def invariant_path(folder: Path, source_file: str, head_size: int) -> Path:
    """The invariant variant of `folder / source_file` (written on first use, reused after).

    Raises:
        InvariantGraphError: the graph's attention is not one this variant can replace.
        OSError: the folder cannot be written.
    """
    variant = Path(source_file).name.removesuffix(".onnx") + VARIANT_SUFFIX
    return write_variant(folder, source_file, variant, lambda model: _rewrite(model, head_size))


def _rewrite(model: Any, head_size: int) -> Any:
    """`model` with every GroupQueryAttention replaced (the module docstring); edits it in place."""
    from onnx import TensorProto, helper

    graph = model.graph
    if any(i.name == POSITION_IDS for i in graph.input):
        return model
    nodes = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    if not nodes:
        raise InvariantGraphError("the graph has no GroupQueryAttention node to replace")
    kv_heads = _attribute(nodes[0], "kv_num_heads")
    graph.input.extend(
        [
            helper.make_tensor_value_info(POSITION_IDS, TensorProto.INT64, ["batch_size", "sequence_length"]),
            helper.make_tensor_value_info(
                CACHE_INDICES, TensorProto.INT64, ["batch_size", kv_heads, "sequence_length", 3]
            ),
            helper.make_tensor_value_info(
                ATTENTION_BIAS, TensorProto.FLOAT, ["batch_size", "sequence_length", "total_sequence_length"]
            ),
        ]
    )
    shared = _SharedNodes(graph)
    rewritten = []
    for node in graph.node:
        if node.op_type == "GroupQueryAttention":
            rewritten.extend(_attention(node, head_size, shared))
        else:
            rewritten.append(node)
    del graph.node[:]
    graph.node.extend([*shared.nodes, *rewritten])
    _prune(graph)
    # The builder's shapes of intermediate values name the dimensions GroupQueryAttention gave them;
    # ONNX Runtime infers the new graph's shapes itself.
    del graph.value_info[:]
    return model


class _SharedNodes:
    """Constants, the reshaped attention bias and the softmax's ones, made once and used by every layer."""

    def __init__(self, graph: Any) -> None:
        import numpy as np
        from onnx import helper, numpy_helper

        self.graph = graph
        self.nodes: list[Any] = []
        self.bias = "/invariant/attention_bias_6d"
        self.ones = "/invariant/ones"
        shape = "/invariant/ones_shape"
        one = numpy_helper.from_array(np.ones(1, np.float32))
        self.nodes += [
            # [B, S, T] -> [B, 1, S, 1, 1, T], broadcast over the key heads and the heads of a group.
            helper.make_node(
                "Unsqueeze", [ATTENTION_BIAS, self.constant("axes_1_3_4", [1, 3, 4])], [self.bias]
            ),
            # ones [T, 1] (T the bias's last dimension: the bound capacity), the softmax's sum vector.
            helper.make_node("Shape", [ATTENTION_BIAS], [f"{shape}/T"], start=2),
            helper.make_node("Concat", [f"{shape}/T", self.constant("one", [1])], [shape], axis=0),
            helper.make_node("ConstantOfShape", [shape], [self.ones], value=one),
        ]
        for node in self.nodes:
            node.name = f"{node.output[0]}/{node.op_type}"

    def constant(self, name: str, values: list[int]) -> str:
        import numpy as np
        from onnx import numpy_helper

        full = f"/invariant/constants/{name}"
        if not any(i.name == full for i in self.graph.initializer):
            self.graph.initializer.append(numpy_helper.from_array(np.asarray(values, dtype=np.int64), full))
        return full

    def scalar(self, name: str, value: float) -> str:
        import numpy as np
        from onnx import numpy_helper

        full = f"/invariant/constants/{name}"
        if not any(i.name == full for i in self.graph.initializer):
            self.graph.initializer.append(numpy_helper.from_array(np.asarray(value, dtype=np.float32), full))
        return full


def _attention(gqa: Any, head_size: int, shared: _SharedNodes) -> list[Any]:
    """The nodes that replace one GroupQueryAttention node (same outputs, same names)."""
    from onnx import helper

    heads, kv_heads, scale, interleaved = _settings(gqa, head_size)
    inputs = list(gqa.input) + [""] * (12 - len(gqa.input))
    query, key, value, past_key, past_value = inputs[:5]
    cos, sin = inputs[7], inputs[8]
    groups = heads // kv_heads
    out, present_key, present_value = gqa.output
    nodes: list[Any] = []

    def name(part: str) -> str:
        return f"{gqa.name}/invariant/{part}"

    def add(op: str, inputs: list[str], output: str, **attributes: Any) -> None:
        domain = "com.microsoft" if op in ("RotaryEmbedding", "FusedMatMul") else ""
        nodes.append(
            helper.make_node(op, inputs, [output], name=f"{output}/{op}", domain=domain, **attributes)
        )

    if not key:  # packed: the query input holds q, k and v side by side
        sizes = [heads * head_size, kv_heads * head_size, kv_heads * head_size]
        split = shared.constant(f"split_{'_'.join(map(str, sizes))}", sizes)
        query, key, value = name("q"), name("k"), name("v")
        nodes.append(
            helper.make_node("Split", [inputs[0], split], [query, key, value], axis=2, name=name("Split"))
        )
    for source, count, rotated in ((query, heads, name("q_rotated")), (key, kv_heads, name("k_rotated"))):
        add(
            "RotaryEmbedding",
            [source, POSITION_IDS, cos, sin],
            rotated,
            interleaved=interleaved,
            num_heads=count,
        )
    new_shape = shared.constant(f"kv_shape_{kv_heads}_{head_size}", [0, 0, kv_heads, head_size])
    axes = shared.constant("axes_2_3", [2, 3])
    for source, past, present, part in (
        (name("k_rotated"), past_key, present_key, "key"),
        (value, past_value, present_value, "value"),
    ):
        # [B, S, kvH hd] -> [B, S, kvH, hd] -> [B, kvH, S, hd]: the cells ScatterND writes in place.
        add("Reshape", [source, new_shape], name(f"{part}_4d"))
        add("Transpose", [name(f"{part}_4d")], name(f"{part}_new"), perm=[0, 2, 1, 3])
        nodes.append(
            helper.make_node(
                "ScatterND",
                [past, CACHE_INDICES, name(f"{part}_new")],
                [present],
                name=name(f"{part}/ScatterND"),
            )
        )
        add("Unsqueeze", [present, axes], name(f"{part}_6d"))  # [B, kvH, 1, 1, T, hd]
    q_shape = shared.constant(
        f"q_shape_{kv_heads}_{groups}_{head_size}", [0, 0, kv_heads, groups, 1, head_size]
    )
    add("Reshape", [name("q_rotated"), q_shape], name("q_6d"))  # [B, S, kvH, G, 1, hd]
    add("Transpose", [name("q_6d")], name("q_heads"), perm=[0, 2, 1, 3, 4, 5])  # [B, kvH, S, G, 1, hd]
    # x [B, kvH, 1, 1, T, hd]^T -> [B, kvH, S, G, 1, T]: one-row products (alpha 1 keeps them one-row ones).
    add("FusedMatMul", [name("q_heads"), name("key_6d")], name("scores"), transA=0, transB=1, alpha=1.0)
    add("Mul", [name("scores"), shared.scalar(f"scale_{scale!r}", scale)], name("scaled"))
    add("Add", [name("scaled"), shared.bias], name("biased"))
    # Softmax, its sum a one-row product by ones like the values' sum: the masked cells past a query's
    # own add exact zeros, so the bound capacity does not change its result.
    add("ReduceMax", [name("biased"), shared.constant("axis_last", [-1])], name("max"), keepdims=1)
    add("Sub", [name("biased"), name("max")], name("shifted"))
    add("Exp", [name("shifted")], name("exp"))
    add("MatMul", [name("exp"), shared.ones], name("sum"))  # [B, kvH, S, G, 1, 1]
    add("Div", [name("exp"), name("sum")], name("weights"))
    add("MatMul", [name("weights"), name("value_6d")], name("context"))  # [B, kvH, S, G, 1, hd]
    add("Transpose", [name("context")], name("context_t"), perm=[0, 2, 1, 3, 4, 5])  # [B, S, kvH, G, 1, hd]
    flat = shared.constant(f"out_shape_{heads}_{head_size}", [0, 0, heads * head_size])
    nodes.append(helper.make_node("Reshape", [name("context_t"), flat], [out], name=name("context/Reshape")))
    return nodes


def _settings(gqa: Any, head_size: int) -> tuple[int, int, float, int]:
    """(heads, key heads, scale, rotary_interleaved) of a GroupQueryAttention node this variant can
    replace; `InvariantGraphError` names what it cannot."""
    if _attribute(gqa, "do_rotary", 0) != 1:
        raise InvariantGraphError(f"{gqa.name}: only attention with rotary inside (do_rotary=1) is replaced")
    if _attribute(gqa, "softcap", 0.0) or _attribute(gqa, "local_window_size", -1) != -1:
        raise InvariantGraphError(f"{gqa.name}: soft-capping and local windows are not supported")
    if any(list(gqa.input)[9:]):
        raise InvariantGraphError(f"{gqa.name}: position ids, attention bias or head sinks as inputs")
    scale = _attribute(gqa, "scale", 0.0) or head_size**-0.5
    heads, kv_heads = _attribute(gqa, "num_heads"), _attribute(gqa, "kv_num_heads")
    return heads, kv_heads, scale, _attribute(gqa, "rotary_interleaved", 0)


def _attribute(node: Any, name: str, default: Any = None) -> Any:
    from onnx import helper

    for attribute in node.attribute:
        if attribute.name == name:
            return helper.get_attribute_value(attribute)
    if default is None:
        raise InvariantGraphError(f"{node.name} has no attribute {name}")
    return default


def _prune(graph: Any) -> None:
    """Drop nodes nothing reads any more (the mask's reformatting) and inputs no node reads."""
    needed = {output.name for output in graph.output}
    kept: list[Any] = []
    for node in reversed(list(graph.node)):
        if any(name in needed for name in node.output):
            kept.append(node)
            needed.update(name for name in node.input if name)
    del graph.node[:]
    graph.node.extend(reversed(kept))
    unused = [i for i in graph.input if i.name not in needed]
    for value in unused:
        graph.input.remove(value)
