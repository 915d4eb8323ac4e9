"""A GGUF file as a model folder that onnxruntime-genai's model builder reads, written tensor by tensor.

The builder loads a Hugging Face folder whole, in float32, then copies the whole graph once more to
quantize it: about 17 GB of memory for a 1.5B model. This module never holds more than one tensor:
it reads the GGUF file through `gguf`'s memory-mapped reader and dequantizes each tensor with `gguf`'s
`dequantize`, named and laid out by transformers' own GGUF mapping (`get_gguf_hf_weights_map` and the
architecture's tensor processor, which e.g. undoes llama.cpp's q/k row permutation), so each float32
tensor is exactly the one transformers' GGUF loader gives the "hf" backend.

Two folders come out of it (`write_model_folder`):

* quantized (`QUANTIZED`), for the int4 recipes with the builder's default algorithm: every projection
  (q, k, v, o, gate, up, down, the output layer) is quantized here by the very function the builder's
  default quantizer calls on the same float32 [K, N] matrix (onnxruntime's `quantize_matmul_4bits`,
  symmetric, in blocks of the recipe's size), and written as an "olive" quantized checkpoint, which the
  builder turns into MatMulNBits nodes as it finds them. So the ONNX weights are the bytes the builder
  would have written from the float32 folder, and the builder holds int4 weights (plus the float32
  embedding) instead of the float32 model. The checkpoint carries zero points of 8 (the format
  requires them for the fused q/k/v projection); `strip_zero_points` then drops them from the exported
  graph, since 8 is MatMulNBits' default for symmetric weights.
* float32 (`FLOAT32`), for every other recipe: the float32 tensors as they are, for the builder to
  load and quantize as it does any Hugging Face folder.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

QUANTIZED = "quantized"
FLOAT32 = "float32"
ZERO_POINT = 8
"""MatMulNBits' zero point for symmetric 4-bit weights when none is given: two of them per byte, 0x88."""
PROJECTIONS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)
"""The layers' projections the builder's loader of quantized checkpoints reads (llama-like models)."""
QUANTIZABLE_TYPES = ("llama", "qwen2", "mistral")
"""Model types whose every projection is one of `PROJECTIONS` (the others get the float32 folder)."""
ROWS_PER_CHUNK = 16384
"""Rows dequantized at a time, so a [151936, 1536] embedding never needs more than its own float32 array."""

KIND_LINE = "model folder kind: "
"""How `main` says the kind it wrote."""

Say = Callable[[str], None]


def main(argv: list[str] | None = None) -> int:
    """`python -m exactspec.models.onnx.gguf_folder SOURCE FOLDER KIND BLOCK_SIZE`: `write_model_folder` in a
    process of its own (the export runs it so, apart from the command's), printing the kind written last."""
    source, folder, kind, block_size = argv if argv is not None else sys.argv[1:]
    from exactspec.models.loading import one_gguf_parse

    with one_gguf_parse():
        written = write_model_folder(Path(source), Path(folder), kind, int(block_size), _print)
    print(f"{KIND_LINE}{written}", flush=True)
    return 0


def _print(line: str) -> None:
    print(line, flush=True)


def write_model_folder(source: Path, folder: Path, kind: str, block_size: int, say: Say) -> str:
    """Write `source` (a GGUF file) into `folder` as a Hugging Face folder: weights, config and generation
    config (the caller adds the tokenizer). `kind` asks for `QUANTIZED` (int4 in blocks of `block_size`)
    or `FLOAT32`; the answer is the kind written (`FLOAT32` where the architecture is not one
    `QUANTIZABLE_TYPES` names)."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(str(source.parent), gguf_file=source.name)
    if kind == QUANTIZED and config.model_type not in QUANTIZABLE_TYPES:
        kind = FLOAT32
    folder.mkdir(parents=True, exist_ok=True)
    say(f"writing {source.name} as a {kind} model folder, tensor by tensor")
    shard: dict[str, np.ndarray] = {}
    shards = 0
    layer = None
    where: dict[str, str] = {}  # tensor name -> shard file (the index transformers reads)
    written = 0  # layers written (the file orders them as text: 0, 1, 10, 11, ...)
    for name, weights in gguf_tensors(source, config):
        parts = name.split(".")
        this_layer = parts[2] if name.startswith("model.layers.") else None
        if shard and this_layer != layer:  # one shard per layer (and one for what is outside them)
            shards = _save_shard(folder, shard, shards, where)
        layer = this_layer
        if kind == QUANTIZED and _is_projection(name):
            base = name.removesuffix(".weight")
            qweight, scales, qzeros = quantize_int4(weights, block_size)
            shard |= {f"{base}.qweight": qweight, f"{base}.scales": scales, f"{base}.qzeros": qzeros}
        else:
            shard[name] = weights
        if this_layer is not None and parts[3:4] == ["mlp"] and parts[4] == "down_proj":
            written += 1
            say(f"wrote {written} of {config.num_hidden_layers} layers")
    if shard:
        _save_shard(folder, shard, shards, where)
    index = {"metadata": {}, "weight_map": dict(sorted(where.items()))}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    _write_config(config, folder, kind, block_size)
    return kind


def gguf_tensors(source: Path, config: Any) -> Iterator[tuple[str, np.ndarray]]:
    """(Hugging Face name, float32 array) for each tensor of `source`, one at a time, as transformers'
    GGUF loader names and lays it out; tensors transformers does not map are skipped."""
    import gguf
    import torch
    import transformers
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        TensorProcessor,
        get_gguf_hf_weights_map,
        load_gguf_checkpoint,
    )

    parsed = load_gguf_checkpoint(str(source), return_tensors=False)
    reader = gguf.GGUFReader(str(source))
    architecture = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=parsed["config"])
    with torch.device("meta"):
        skeleton = transformers.AutoModelForCausalLM.from_config(config)
    mapping = get_gguf_hf_weights_map(skeleton, processor)
    for tensor in reader.tensors:
        weights = _dequantize(tensor)
        result = processor.process(
            weights=weights, name=tensor.name, tensor_key_mapping=mapping, parsed_parameters=parsed
        )
        if result.name in mapping:
            yield mapping[result.name], np.ascontiguousarray(result.weights, dtype=np.float32)


def _dequantize(tensor: Any) -> np.ndarray:
    """A GGUF tensor in float32, `ROWS_PER_CHUNK` rows at a time (`gguf.dequantize` on a whole embedding
    needs several times its float32 size)."""
    import gguf

    data = tensor.data  # memory-mapped: [rows, bytes a row] for block types, [rows, columns] for floats
    if data.ndim < 2 or data.shape[0] <= ROWS_PER_CHUNK:
        return np.asarray(gguf.dequantize(data, tensor.tensor_type), dtype=np.float32)
    first = gguf.dequantize(data[:ROWS_PER_CHUNK], tensor.tensor_type)
    out = np.empty((data.shape[0], *first.shape[1:]), dtype=np.float32)
    out[:ROWS_PER_CHUNK] = first
    for start in range(ROWS_PER_CHUNK, data.shape[0], ROWS_PER_CHUNK):
        stop = min(start + ROWS_PER_CHUNK, data.shape[0])
        out[start:stop] = gguf.dequantize(data[start:stop], tensor.tensor_type)
    return out


def quantize_int4(weight: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A Hugging Face [N, K] projection weight as the builder's default quantizer quantizes the MatMul
    weight [K, N] it makes of it: onnxruntime's `quantize_matmul_4bits`, symmetric, one block of
    `block_size` rows of one column at a time. Returns (qweight [N, K / 2] uint8, scales
    [N, K / block_size] float32, zero points [N, ceil(K / block_size / 2)] uint8, all 0x88)."""
    from onnxruntime.capi._pybind_state import quantize_matmul_4bits

    out_features, in_features = weight.shape
    blocks = -(-in_features // block_size)
    matrix = np.ascontiguousarray(weight.T)  # [K, N], the MatMul's initializer
    if blocks * block_size != in_features:  # padded to whole blocks, as the quantizer pads it (and told K)
        matrix = np.pad(matrix, ((0, blocks * block_size - in_features), (0, 0)))
    packed = np.zeros((out_features, blocks, block_size // 2), dtype=np.uint8)
    scales = np.zeros((out_features, blocks), dtype=np.float32)
    unused = np.zeros((out_features, -(-blocks // 2)), dtype=np.uint8)
    quantize_matmul_4bits(packed, matrix, scales, unused, block_size, out_features, in_features, True)
    zeros = np.full_like(unused, ZERO_POINT * 0x11)
    return packed.reshape(out_features, -1), scales, zeros


def _is_projection(name: str) -> bool:
    return name == "lm_head.weight" or any(name.endswith(f".{p}.weight") for p in PROJECTIONS)


def _save_shard(folder: Path, shard: dict[str, np.ndarray], index: int, where: dict[str, str]) -> int:
    from safetensors.numpy import save_file

    name = f"model-{index:05d}.safetensors"
    save_file(shard, str(folder / name), metadata={"format": "pt"})
    where.update(dict.fromkeys(shard, name))
    shard.clear()
    return index + 1


def _write_config(config: Any, folder: Path, kind: str, block_size: int) -> None:
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type]]
    config.dtype = "float32"
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(str(folder))
    transformers.GenerationConfig.from_model_config(config).save_pretrained(str(folder))
    if kind == QUANTIZED:  # the builder's loader of "olive" checkpoints, symmetric, no act-order
        path = folder / "config.json"
        record = json.loads(path.read_text())
        record["quantization_config"] = {
            "quant_method": "olive",
            "bits": 4,
            "group_size": block_size,
            "desc_act": False,
            "sym": True,
        }
        path.write_text(json.dumps(record, indent=2) + "\n")


def strip_zero_points(model_file: Path) -> int:
    """Drop the zero-point input of every MatMulNBits node of `model_file` whose zero points are all
    `ZERO_POINT` (what MatMulNBits assumes without them), rewriting the model and its external data file
    beside it one tensor at a time; returns how many nodes lost it."""
    import onnx_ir as ir

    model = ir.load(str(model_file))
    dropped = 0
    for node in model.graph:
        if node.op_type != "MatMulNBits" or len(node.inputs) < 4 or node.inputs[3] is None:
            continue
        value = node.inputs[3]
        if value.const_value is None or not np.all(value.const_value.numpy() == ZERO_POINT * 0x11):
            continue
        node.resize_inputs(3)
        if not value.uses():
            model.graph.initializers.pop(value.name)
        dropped += 1
    staged = model_file.parent / "stripped"  # beside it, so the external data keeps its own name
    staged.mkdir()
    data_name = f"{model_file.name}.data"
    ir.save(model, str(staged / model_file.name), external_data=data_name, size_threshold_bytes=0)
    del model
    (staged / data_name).replace(model_file.with_name(data_name))
    (staged / model_file.name).replace(model_file)
    staged.rmdir()
    return dropped


if __name__ == "__main__":
    sys.exit(main())
