"""A GGUF file exported to ONNX tensor by tensor (`models.onnx.gguf_folder`): the tensors are transformers'
own, the int4 weights are the bytes the builder's quantizer makes of them, and an export through the
quantized folder is the export through the float32 folder, weight for weight and logit for logit, with
nothing but the tokenizer left in the conversion cache. Tiny llama models written as GGUF files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_causal_lm

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxruntime_genai")
pytest.importorskip("gguf")

from exactspec.artefacts.conversion import CONVERSION_CACHE  # noqa: E402
from exactspec.models.llamacpp.gguf_writer import write_gguf  # noqa: E402
from exactspec.models.onnx import export, gguf_folder  # noqa: E402
from exactspec.models.onnx.model import OnnxModel  # noqa: E402

VOCAB = 48
EOS = 0
RECIPE = export.ExportRecipe(block_size=32)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A float32 llama GGUF (q and k rows permuted as llama.cpp writes them); head size 16."""
    model = tiny_causal_lm(
        "llama",
        vocab_size=VOCAB,
        seed=3,
        initializer_range=0.2,
        eos_token_id=EOS,
        tie_word_embeddings=False,
        hidden_size=64,
        intermediate_size=128,
    )
    return write_gguf(model, tmp_path_factory.mktemp("gguf") / "tiny.gguf", EOS)


def test_the_tensors_are_transformers_own_gguf_tensors(tiny_gguf: Path) -> None:
    import transformers

    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        str(tiny_gguf.parent), gguf_file=tiny_gguf.name, dtype=torch.float32
    )
    config = transformers.AutoConfig.from_pretrained(str(tiny_gguf.parent), gguf_file=tiny_gguf.name)
    streamed = dict(gguf_folder.gguf_tensors(tiny_gguf, config))
    state = loaded.state_dict()
    assert set(streamed) == set(state)
    for name, weights in streamed.items():
        assert np.array_equal(weights, state[name].numpy()), name  # bit for bit, q and k un-permuted


def test_chunked_dequantization_is_the_whole_tensors(
    monkeypatch: pytest.MonkeyPatch, tiny_gguf: Path
) -> None:
    import gguf

    reader = gguf.GGUFReader(str(tiny_gguf))
    embedding = next(t for t in reader.tensors if t.name == "token_embd.weight")
    whole = gguf_folder._dequantize(embedding)
    monkeypatch.setattr(gguf_folder, "ROWS_PER_CHUNK", 5)  # 48 rows: 10 chunks, the last one short
    assert np.array_equal(gguf_folder._dequantize(embedding), whole)


def test_int4_weights_are_the_builders_quantizer_bytes() -> None:
    """`quantize_int4` of an [N, K] weight = onnxruntime's default MatMulNBits quantizer on the MatMul
    weight [K, N] the builder makes of it (symmetric, blocks of 32), with K a whole number of blocks and
    not."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    rng = np.random.default_rng(0)
    for out_features, in_features in ((24, 64), (16, 80)):
        weight = rng.normal(size=(out_features, in_features)).astype(np.float32)
        initializer = onnx.numpy_helper.from_array(np.ascontiguousarray(weight.T), "w")
        node = onnx.helper.make_node("MatMul", ["a", "w"], ["y"], name="m")
        graph = onnx.helper.make_graph(
            [node],
            "g",
            [onnx.helper.make_tensor_value_info("a", onnx.TensorProto.FLOAT, [1, in_features])],
            [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, out_features])],
            [initializer],
        )
        quantizer = MatMulNBitsQuantizer(onnx.helper.make_model(graph), block_size=32, is_symmetric=True)
        quantizer.process()
        made = {i.name: onnx.numpy_helper.to_array(i) for i in quantizer.model.model.graph.initializer}
        qweight, scales, zeros = gguf_folder.quantize_int4(weight, 32)
        assert np.array_equal(qweight.reshape(-1), made["w_Q4"].reshape(-1))
        assert np.array_equal(scales.reshape(-1), made["w_scales"].reshape(-1))
        assert (zeros == 0x88).all()


def _initializers(folder: Path) -> dict[str, np.ndarray]:
    """The export's MatMulNBits weights and scales in graph order, and its other initializers by name."""
    import onnx_ir as ir

    model = ir.load(str(folder / export.MODEL_FILE))
    out: dict[str, np.ndarray] = {}
    matmuls = [n for n in model.graph if n.op_type == "MatMulNBits"]
    for index, node in enumerate(matmuls):
        assert len(node.inputs) == 3  # no zero points: MatMulNBits' default for symmetric weights
        out[f"matmul {index} weight"] = node.inputs[1].const_value.numpy().reshape(-1)
        out[f"matmul {index} scales"] = node.inputs[2].const_value.numpy().reshape(-1)
        out[f"matmul {index} attributes"] = np.array(sorted((k, a.value) for k, a in node.attributes.items()))
    quantized = {v.name for n in matmuls for v in n.inputs[1:]}
    for name, value in model.graph.initializers.items():
        if name not in quantized:
            out[name] = value.const_value.numpy()
    return out


@pytest.fixture(scope="module")
def int4_export(tiny_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[str]]:
    """(export folder, its cache, its progress lines): the int4 export of `tiny_gguf`, as a first run."""
    cache = tmp_path_factory.mktemp("int4-export")
    lines: list[str] = []
    return export.exported_model(tiny_gguf, RECIPE, cache_dir=cache, progress=lines.append), cache, lines


def test_an_export_through_the_quantized_folder_is_the_float32_folders(
    tiny_gguf: Path, int4_export: tuple[Path, Path, list[str]], tmp_path: Path
) -> None:
    """The int4 export of a GGUF file (weights quantized before the builder) has the weights, graph and
    logits of the builder's own quantization of the float32 folder; the conversion cache keeps only the
    tokenizer, and the export's record says which folder the builder read."""
    streamed, cache, lines = int4_export
    record = (streamed / export.PROVENANCE_FILE).read_text()
    assert '"builder_input": "quantized"' in record
    assert any("wrote 2 of 2 layers" in line for line in lines)
    [entry] = (cache / CONVERSION_CACHE).iterdir()
    assert [p.name for p in entry.iterdir()] == ["tokenizer"]  # no float32 copy of the model is kept

    float_folder = tmp_path / "float32"
    gguf_folder.write_model_folder(tiny_gguf, float_folder, gguf_folder.FLOAT32, 32, lambda line: None)
    for item in (entry / "tokenizer").iterdir():
        (float_folder / item.name).symlink_to(item)
    reference = export.exported_model(float_folder, RECIPE, cache_dir=tmp_path / "other")
    assert '"builder_input": "folder"' in (reference / export.PROVENANCE_FILE).read_text()

    ours, theirs = _initializers(streamed), _initializers(reference)
    assert ours.keys() == theirs.keys()
    assert all(np.array_equal(ours[name], theirs[name]) for name in ours)
    history = [[3, 5, 7, 11, 2, 9]]
    a = OnnxModel(streamed, eos_token_ids={EOS}, threads=1)
    b = OnnxModel(reference, eos_token_ids={EOS}, threads=1)
    assert torch.equal(a.logits(history, 4), b.logits(history, 4))


def test_other_recipes_read_the_float32_folder(tiny_gguf: Path, tmp_path: Path) -> None:
    """A recipe the builder quantizes its own way (k_quant here) gets the float32 tensors."""
    assert not export.ExportRecipe(algo="k_quant").prequantizable and RECIPE.prequantizable
    folder = tmp_path / "folder"
    kind = gguf_folder.write_model_folder(tiny_gguf, folder, gguf_folder.FLOAT32, 32, lambda line: None)
    from safetensors.numpy import load_file

    tensors: dict[str, np.ndarray] = {}
    for shard in sorted(folder.glob("*.safetensors")):
        tensors |= load_file(shard)
    assert kind == gguf_folder.FLOAT32 and "quantization_config" not in (folder / "config.json").read_text()
    assert all(t.dtype == np.float32 for t in tensors.values())
    assert "model.layers.0.self_attn.q_proj.weight" in tensors and "lm_head.weight" in tensors


def test_the_builder_child_writes_the_builders_own_files(
    tiny_gguf: Path,
    int4_export: tuple[Path, Path, list[str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`builder_child` (the builder less its quantization pass where every product is already int4) writes
    byte for byte the files the builder itself writes from the same int4 folder."""
    ours = int4_export[0]
    monkeypatch.setattr(export, "BUILDER_MODULE", "onnxruntime_genai.models.builder")
    theirs = export.exported_model(tiny_gguf, RECIPE, cache_dir=tmp_path / "builder")
    for name in ("model.onnx", "model.onnx.data", "genai_config.json"):
        assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name
