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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from exactspec.artefacts.staging import publish_folder
from exactspec.checking.grid import AdapterCase, TreeCase
from exactspec.models.base import LanguageModel
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


# --- the exact grid's ONNX cases (`exactspec verify`) ------------------------------------------------

ONNX_TOLERANCE = 1e-5
"""The ONNX cases' bound on the TV distance: p is float32 (the fp32 export), the reference the float64
module it was exported from; logits differ by about 5e-6 (tests/models/test_onnx.py), which moves a
distribution over a handful of sequences by a TV of the same order. An adapter bug (a stale cell, a
wrong slot, a lost rollback) moves it by 1e-2 or more."""

ONNX_SKIP_REASON = "ONNX cases skipped: onnxruntime is not installed (the `onnx` extra)"


@dataclass(frozen=True)
class OnnxCase(AdapterCase):
    """An exact-grid cell whose models are `OnnxModel`s over tiny float32 ONNX exports (`tiny_onnx`) of the
    tiny HF Qwen2 pair of the same spec (hidden size 64); the reference is the float64 module's no-cache
    full forwards, and p is float32, so the case passes to `tiny_onnx.ONNX_TOLERANCE`."""

    tolerance: float = ONNX_TOLERANCE

    def spec(self) -> TinyHFSpec:
        return onnx_spec(super().spec())

    def models(self) -> tuple[LanguageModel, LanguageModel]:  # type: ignore[override]
        from exactspec.models.onnx.model import OnnxModel

        target, draft = tiny_onnx_pair(self.spec())
        options = {"eos_token_ids": {self.eos_token_id}, "threads": 1, "max_rows": 4, "dtype": torch.float64}
        return OnnxModel(target, **options), OnnxModel(draft, **options)  # type: ignore[arg-type]

    def reference(self, target: LanguageModel) -> LanguageModel:
        from exactspec.checking.tiny_hf import FullForwardModel, tiny_hf_pair

        hf_target, _ = tiny_hf_pair(self.spec())
        return FullForwardModel(hf_target, target.eos_token_ids, target.vocab_size)


@dataclass(frozen=True)
class OnnxTreeCase(OnnxCase, TreeCase):
    """A tree case whose target is `OnnxModel` (scored path by path): `OnnxCase`'s models, reference and
    tolerance, `TreeCase`'s drafter and engine."""


def onnx_available() -> bool:
    """Whether the ONNX cases can run (onnxruntime and the model builder import)."""
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("onnxruntime", "onnxruntime_genai"))


def onnx_cases() -> list[Any]:
    """The grid cells that run through ONNX Runtime (`OnnxModel`) on tiny float32 Qwen2 pairs: batches of
    2 rows with prompts of different lengths (one-token passes batched, k-token passes row by row,
    rollbacks, a finished row leaving), the same cells as the llama.cpp cases."""
    from exactspec.checking.grid import BLOCK, MODEL
    from exactspec.decoding.strategy import Strategy
    from exactspec.foundations.settings import SamplingSettings

    all_transforms = SamplingSettings(
        temperature=0.8, top_k=3, top_p=0.95, min_p=0.4, repetition_penalty=1.3, logit_bias={1: 0.5}
    )
    # (name, V, gamma, n, settings, prompts, draft_logit_scale, strategy)
    cells = [
        ("gamma=1", 3, 1, 2, SamplingSettings(), ((1,), (2, 1, 1)), 1.0, MODEL),
        ("gamma=3", 4, 3, 3, SamplingSettings(min_p=0.5), ((1,), (2, 1, 1)), 1.0, MODEL),
        ("gamma=2, all transforms", 4, 2, 3, all_transforms, ((2, 3), (1,)), 1.0, MODEL),
        ("T=0, gamma=5", 4, 5, 6, SamplingSettings(temperature=0.0), ((1,), (3, 2, 1)), 1.0, MODEL),
        ("gamma=2, n=4, rollbacks", 4, 2, 4, SamplingSettings(min_p=0.5), ((1,), (2, 1)), 2.0, MODEL),
        ("block, gamma=3", 4, 3, 3, SamplingSettings(min_p=0.5), ((1,), (2, 1)), 2.0, BLOCK),
        ("ngram, gamma=3", 4, 3, 3, SamplingSettings(), ((1, 2, 1), (2,)), 1.0, Strategy(drafter="ngram")),
    ]
    cases: list[Any] = [
        OnnxCase(
            f"onnx float32: batch of 2, {name}",
            vocab,
            gamma,
            n,
            settings,
            prompts=prompts,
            draft_logit_scale=draft_scale,
            strategy=strategy,
        )
        for name, vocab, gamma, n, settings, prompts, draft_scale, strategy in cells
    ]
    # A tree of candidates, scored path by path (the adapter has no tree pass).
    cases.append(
        OnnxTreeCase(
            "onnx float32: batch of 2, tree 2 x 2",
            4,
            2,
            4,
            SamplingSettings(min_p=0.6),
            prompts=((1,), (2, 3)),
            widths=(2, 2),
            seed=3,
        )
    )
    return cases
