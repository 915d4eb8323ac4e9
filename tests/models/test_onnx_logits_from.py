"""The `logits_from` graph variant on small hand-made graphs (no model builder needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from exactspec.models.onnx.logits_from import INPUT_NAME, VARIANT_FILE, variant_path  # noqa: E402

HIDDEN, VOCAB = 3, 5


def _save(folder: Path, nodes: list, initializers: list) -> None:
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["batch", "positions", HIDDEN])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "positions", VOCAB])],
        initializer=initializers,
    )
    # IR version 10: what ONNX Runtime 1.31 reads (onnx 1.23 writes 14 by default).
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.save(model, str(folder / "model.onnx"))


def _head_with_bias(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((HIDDEN, VOCAB)).astype(np.float32)
    bias = rng.standard_normal(VOCAB).astype(np.float32)
    _save(
        folder,
        [
            helper.make_node("Relu", ["hidden"], ["normed"]),  # stands for the final norm
            helper.make_node("MatMul", ["normed", "weight"], ["projected"]),
            helper.make_node("Add", ["projected", "bias"], ["logits"]),
        ],
        [numpy_helper.from_array(weight, "weight"), numpy_helper.from_array(bias, "bias")],
    )
    return weight, bias


def test_the_variant_slices_the_output_layers_input_at_the_position_asked(tmp_path: Path) -> None:
    weight, bias = _head_with_bias(tmp_path)
    path = variant_path(tmp_path, "model.onnx")
    assert path == tmp_path / VARIANT_FILE
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    hidden = np.random.default_rng(1).standard_normal((2, 4, HIDDEN)).astype(np.float32)  # [B, S, H]
    full = np.maximum(hidden, 0) @ weight + bias  # [B, S, V]
    for start in (0, 1, 3):  # 0: every position, as the builder's graph
        (got,) = session.run(None, {"hidden": hidden, INPUT_NAME: np.asarray([start], dtype=np.int64)})
        assert got.shape == (2, 4 - start, VOCAB)
        np.testing.assert_allclose(got, full[:, start:], rtol=1e-6, atol=1e-6)
    assert variant_path(tmp_path, "model.onnx") == path  # made once, then reused


def test_no_variant_when_no_output_layer_feeds_the_logits(tmp_path: Path) -> None:
    _save(tmp_path, [helper.make_node("Identity", ["hidden"], ["logits"])], [])
    assert variant_path(tmp_path, "model.onnx") is None
    assert not (tmp_path / VARIANT_FILE).exists()


def test_no_variant_for_a_graph_onnx_cannot_read(tmp_path: Path) -> None:
    (tmp_path / "model.onnx").write_bytes(b"not a model")
    assert variant_path(tmp_path, "model.onnx") is None
