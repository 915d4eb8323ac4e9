"""Tiny float32 ONNX models exported by the model builder, so the ONNX Runtime adapter can be checked exactly.

Each model is a tiny Hugging Face Qwen2 model of a `TinyHFSpec` (`tiny_hf`), saved in float32 with a
word-level tokenizer of its vocabulary and exported with `FP32_RECIPE` (`models.onnx.export`): the
same function as the float64 module that `FullForwardModel` runs, up to float32 rounding. ONNX
Runtime's GroupQueryAttention needs a head size that is a multiple of 16, so the tiny specs here have
hidden size 64 (4 heads of 16). Exports are cached by content under the folder given (a few seconds
each, once).
"""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from exactspec.artefacts.staging import publish_folder
from exactspec.models.onnx.export import FP32_RECIPE, exported_model

if TYPE_CHECKING:  # transformers loads only when a case runs (keeps `verify` start-up light)
    from exactspec.checking.tiny_hf import TinyHFSpec

HIDDEN_SIZE = 64
"""Hidden size of the tiny ONNX models: 4 heads of 16 (GroupQueryAttention's smallest head size)."""


def onnx_spec(spec: TinyHFSpec) -> TinyHFSpec:
    """`spec` with the hidden size the ONNX export needs (family qwen2: the builder's Qwen2 exporter)."""
    return replace(spec, hidden_size=HIDDEN_SIZE)


def tiny_onnx_folder() -> Path:
    """Where the grid keeps its tiny exports (the same spec always gives the same folder)."""
    return Path(tempfile.gettempdir()) / "exactspec-tiny-onnx"


def tiny_onnx_pair(spec: TinyHFSpec, root: Path | None = None) -> tuple[Path, Path]:
    """(target folder, draft folder): the spec's tiny pair exported to float32 ONNX under `root`."""
    import tokenizers
    import transformers

    from exactspec.checking.tiny_hf import tiny_hf_pair

    root = tiny_onnx_folder() if root is None else Path(root)
    target, draft = tiny_hf_pair(spec)
    vocab = {("</s>" if i == spec.eos_token_id else f"t{i}"): i for i in range(spec.vocab_size)}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab=vocab, unk_token="</s>"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>")
    folders = []
    for role, model in (("target", target), ("draft", draft)):
        digest = hashlib.sha256(repr(spec).encode()).hexdigest()[:12]
        source = root / "hf" / f"{spec.family}-v{spec.vocab_size}-s{spec.seed}-{role}-{digest}"
        if not (source / "config.json").is_file():
            source.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{source.name}-", dir=source.parent))
            model.to(torch.float32).save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            publish_folder(tmp, source)  # atomic: a racing process's folder is as good
        folders.append(exported_model(source, FP32_RECIPE, cache_dir=root))
    return folders[0], folders[1]


ONNX_TOLERANCE = 1e-5
"""The ONNX cases' bound on the TV distance (`checking.grid.OnnxCase`): p is float32 (the fp32 export),
the reference the float64 module it was exported from; logits differ by about 5e-6
(tests/models/test_onnx.py), which moves a distribution over a handful of sequences by a TV of the same
order. An adapter bug (a stale cell, a wrong slot, a lost rollback) moves it by 1e-2 or more."""


def onnx_available() -> bool:
    """Whether the ONNX cases can run (onnxruntime and the model builder import)."""
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("onnxruntime", "onnxruntime_genai"))
