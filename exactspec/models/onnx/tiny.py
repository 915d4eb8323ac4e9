"""Tiny float32 ONNX models exported by the model builder, so the ONNX Runtime adapter can be checked exactly.

Each model is a tiny Hugging Face Qwen2 module (built by `checking.tiny_hf`, which hands it to the
backend's `TinyModels` hooks), saved in float32 with a word-level tokenizer of its vocabulary and
exported with `FP32_RECIPE` (`export`): the same function as the float64 module that `FullForwardModel`
runs, up to float32 rounding. ONNX Runtime's GroupQueryAttention needs a head size that is a multiple
of 16, so the tiny models here have hidden size 64 (4 heads of 16: `HIDDEN_SIZE`, which the backend's
registration asks the tiny-model builder for). Exports are cached by the modules' content under the
folder given (a few seconds each, once).
"""

from __future__ import annotations

import copy
import hashlib
import tempfile
from pathlib import Path
from typing import Any

import torch

from exactspec.artefacts.staging import publish_folder
from exactspec.models.onnx.export import FP32_RECIPE, ExportRecipe, exported_model

HIDDEN_SIZE = 64
"""Hidden size of the tiny ONNX models: 4 heads of 16 (GroupQueryAttention's smallest head size)."""


def tiny_onnx_folder() -> Path:
    """Where the grid keeps its tiny exports (the same weights always give the same folder)."""
    return Path(tempfile.gettempdir()) / "exactspec-tiny-onnx"


def module_digest(module: Any, eos_token_id: int) -> str:
    """A digest of a transformers module's config, weights and EOS id (names its export)."""
    digest = hashlib.sha256(str(eos_token_id).encode())
    digest.update(repr(sorted(module.config.to_dict().items(), key=lambda item: item[0])).encode())
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().to(torch.float64).contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def exported_module(
    module: Any, eos_token_id: int, root: Path | None = None, recipe: ExportRecipe = FP32_RECIPE
) -> Path:
    """The folder of a tiny transformers module exported by `recipe` (default float32) under `root`
    (default `tiny_onnx_folder()`): saved with a word-level tokenizer of its vocabulary, then exported."""
    import tokenizers
    import transformers

    root = tiny_onnx_folder() if root is None else Path(root)
    vocab_size = int(module.config.vocab_size)
    source = root / "hf" / f"{module.config.model_type}-v{vocab_size}-{module_digest(module, eos_token_id)}"
    if not (source / "config.json").is_file():
        vocab = {("</s>" if i == eos_token_id else f"t{i}"): i for i in range(vocab_size)}
        backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab=vocab, unk_token="</s>"))
        backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
        tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>")
        source.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{source.name}-", dir=source.parent))
        # A copy: `.to` converts a module in place, and the caller's float64 module is the reference.
        copy.deepcopy(module).to(torch.float32).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        publish_folder(tmp, source)  # atomic: a racing process's folder is as good
    return exported_model(source, recipe, cache_dir=root)


TOLERANCE = 1e-5
"""The ONNX grid cases' bound on the TV distance: p is float32 (the fp32 export), the reference the
float64 module it was exported from; logits differ by about 5e-6 (tests/models/test_onnx.py), which
moves a distribution over a handful of sequences by a TV of the same order. An adapter bug (a stale
cell, a wrong slot, a lost rollback) moves it by 1e-2 or more."""
