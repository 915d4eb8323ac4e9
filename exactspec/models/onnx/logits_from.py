"""A variant of an exported graph whose logits start at a chosen position, so prefill skips the output layer.

The model builder's graph computes logits [B, S, V] at every position it is fed. A prefill pass (a
joining row's prompt chunk, `OnnxModel._prefill`) needs none of them, yet pays the output layer at
each of its S positions: V x hidden multiply-adds a position (151936 x 1536 for the built-in target,
15% of a token's), and writes S x V float32 logits. The variant adds one input, `logits_from`
([1] int64: 0 gives what the builder's graph gives), and slices the output layer's input to
positions logits_from .. S - 1:

    final norm [B, S, H] -> Slice(starts=logits_from, ends=INT64_MAX, axes=[1]) -> [B, S - logits_from, H]
        -> the output layer (MatMulNBits or MatMul, and what follows it) -> logits [B, S - logits_from, V]

It is written once beside the builder's model (`VARIANT_FILE`, a few hundred KB: the weights stay in
the shared `model.onnx.data`), so onnxruntime-genai, which reads `model.onnx`, finds the folder as the
builder left it. A folder that cannot be written, or a graph whose output layer is not found, is run
as the builder wrote it (`variant_path` returns None).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from exactspec.models.onnx.graph_files import write_variant

VARIANT_FILE = "model.logits-from.onnx"
INPUT_NAME = "logits_from"
OUTPUT_LAYERS = ("MatMulNBits", "MatMul")
FOLLOWERS = ("Add", "Mul", "Div", "Tanh", "Where", "Cast")
"""Ops the builder may put between the output layer and `logits` (bias, scale, soft-capping, a mask)."""
INT64_MAX = 2**63 - 1


class NoOutputLayer(ValueError):
    """The graph's `logits` are not computed by an output layer this variant can slice in front of."""


def variant_path(folder: Path, model_file: str) -> Path | None:
    """The variant of `folder / model_file` (written on first use, reused after: `graph_files.write_variant`),
    or None when it cannot be made: the output layer is not found, or the folder is not writable."""
    try:
        return write_variant(folder, model_file, VARIANT_FILE, _with_logits_from)
    except Exception:  # a graph onnx cannot read or edit (its errors have several types), or an OSError
        return None


def _with_logits_from(model: Any) -> Any:
    """`model` (loaded without its external weights) with the `logits_from` slice; `NoOutputLayer` when no
    output layer feeds `logits` through the ops the builder puts after it."""
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph
    if any(i.name == INPUT_NAME for i in graph.input):
        return model
    producer = {output: node for node in graph.node for output in node.output}
    constants = {i.name for i in graph.initializer}
    node = producer.get("logits")
    for _ in range(len(FOLLOWERS) + 1):  # walk back from `logits` to the output layer
        if node is None or node.op_type in OUTPUT_LAYERS:
            break
        if node.op_type not in FOLLOWERS:
            raise NoOutputLayer(f"{node.op_type} lies between the output layer and logits")
        activations = [name for name in node.input if name in producer and name not in constants]
        node = producer.get(activations[0]) if len(activations) == 1 else None
    if node is None or node.op_type not in OUTPUT_LAYERS:
        raise NoOutputLayer("no MatMulNBits or MatMul feeds logits")
    hidden = node.input[0]
    sliced = f"{hidden}/logits_from"
    # A required input, not an overridable initializer: ONNX Runtime's IO binding binds graph inputs only.
    graph.initializer.extend(
        [
            numpy_helper.from_array(_int64([INT64_MAX]), f"{INPUT_NAME}/ends"),
            numpy_helper.from_array(_int64([1]), f"{INPUT_NAME}/axes"),
        ]
    )
    graph.input.append(helper.make_tensor_value_info(INPUT_NAME, TensorProto.INT64, [1]))
    graph.node.append(
        helper.make_node(
            "Slice",
            [hidden, INPUT_NAME, f"{INPUT_NAME}/ends", f"{INPUT_NAME}/axes"],
            [sliced],
            name=f"/{INPUT_NAME}/Slice",
        )
    )
    node.input[0] = sliced
    # The positions axis of everything after the slice is no longer the input's: give it its own name.
    downstream = _downstream(graph, sliced)
    for value in [*graph.value_info, *graph.output]:
        if value.name in downstream:
            dims = value.type.tensor_type.shape.dim
            if len(dims) == 3:
                dims[1].Clear()
                dims[1].dim_param = "logits_length"
    _topological(graph)
    return model  # ONNX Runtime checks it when it loads it (`OnnxModel` falls back to the builder's)


def _int64(values: list[int]) -> Any:
    import numpy as np

    return np.asarray(values, dtype=np.int64)


def _downstream(graph: Any, start: str) -> set[str]:
    """Every value computed from `start` (start included)."""
    reached, changed = {start}, True
    while changed:
        changed = False
        for node in graph.node:
            if any(name in reached for name in node.input):
                for output in node.output:
                    if output not in reached:
                        reached.add(output)
                        changed = True
    return reached


def _topological(graph: Any) -> None:
    """Put the appended Slice before the node it feeds (ONNX wants nodes in topological order)."""
    slice_node = graph.node[-1]
    nodes = list(graph.node[:-1])
    consumer = next(i for i, node in enumerate(nodes) if slice_node.output[0] in node.input)
    nodes.insert(consumer, slice_node)
    del graph.node[:]
    graph.node.extend(nodes)
