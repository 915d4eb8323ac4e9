"""The "native" backend: the pair run by exactspec's own CPU kernels (`exactspec.kernels`), whose every
position's logits are the same bits however a pass is cut, so speculative output is plain decoding's.

Its weights are the int4 export the "onnx" backend runs (`models.onnx.export`: exported once, cached),
read by `models.native.weights`; the adapter is `models.native.model.NativeModel`. Tiny test modules are
quantized directly (`models.native.modules`), and their exactness cases are checked against the law of
the native model's own one-token passes, to float64 rounding: there is no other rounding left to allow
for, since a pass of any shape gives a position the bits of its one-token pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from exactspec.foundations.errors import InvalidArgument
from exactspec.models.backends.registry import (
    FLOAT64_TOLERANCE,
    Backend,
    GridCell,
    LoadSpec,
    ModelFacts,
    OnDisk,
    TinyModels,
    TinyPair,
    register,
    two_row_cells,
)
from exactspec.models.base import LanguageModel, ModelWrapper
from exactspec.models.pair import ModelPair
from exactspec.models.tokenizers import check_tokenizers_compatible, end_of_generation_ids

NAME = "native"


def load(spec: LoadSpec, **options: Any) -> ModelPair:
    """The pair's int4 exports (`onnx`'s, made on first use) run by the native kernels; `options`:
    `NativeModel` keyword arguments (max_rows, dtype, share_prefixes)."""
    from exactspec.kernels.build import KernelBuildError, build
    from exactspec.models.backends.onnx import exported_folder
    from exactspec.models.native.model import NativeModel
    from exactspec.models.native.weights import UnsupportedGraph, load_exported
    from exactspec.models.onnx.export import DEFAULT_RECIPE

    try:
        build()
    except KernelBuildError as error:
        raise InvalidArgument(f"--backend native: {error}") from error
    if spec.threads is not None:
        options = {"threads": spec.threads, **options}

    def open_model(role: str, name: Any, eos: Any) -> tuple[NativeModel, Any]:
        folder, tokenizer = exported_folder(spec, name, DEFAULT_RECIPE)
        eos = end_of_generation_ids(tokenizer) if eos is None else eos
        try:
            weights = load_exported(folder)
        except UnsupportedGraph as error:
            raise InvalidArgument(f"the {role} model cannot run on the native kernels: {error}") from error
        model = NativeModel(weights, eos_token_ids=eos, name=str(folder), **options)
        model.folder = folder
        if len(tokenizer) > model.vocab_size:
            raise InvalidArgument(
                f"the {role} tokenizer has {len(tokenizer)} tokens, the model only {model.vocab_size}"
            )
        return model, tokenizer

    target, tokenizer = open_model("target", spec.target, None)
    draft = None
    if spec.draft is not None and spec.workload.draft_model:
        draft, draft_tokenizer = open_model("draft", spec.draft, target.eos_token_ids)
        check_tokenizers_compatible(tokenizer, draft_tokenizer)
        if draft.vocab_size > target.vocab_size:
            raise InvalidArgument("the draft vocabulary must be a prefix of the target's")
    pair = ModelPair(None, target, None, draft, tokenizer, weights=DEFAULT_RECIPE.name, backend=NAME)
    pair.source = {"backend": NAME, "target": str(spec.target), "draft": str(spec.draft)}
    return pair


def reference(pair: ModelPair) -> LanguageModel:
    """A second model over the target's weights (shared, read-only) with a cache of its own."""
    from exactspec.models.native.model import NativeModel

    target = pair.target
    assert isinstance(target, NativeModel)
    return NativeModel(target.weights, eos_token_ids=pair.eos_token_ids, name=target.name)


def unavailable() -> str | None:
    """None when the kernels build here and the export's tools import, else why not and the fix."""
    import importlib.util

    from exactspec.kernels.build import KernelBuildError, compiler

    try:
        compiler()
    except KernelBuildError as error:
        return str(error)
    missing = [name for name in ("onnx", "onnxruntime_genai") if importlib.util.find_spec(name) is None]
    if missing:
        names = " and ".join(missing)
        return f'{names} not installed (its weights come from the int4 export): pip install -e ".[onnx]"'
    return None


def accepts(spec: LoadSpec) -> str | None:
    """What the onnx backend exports, this backend runs (GGUF files and model folders)."""
    from exactspec.models.backends.onnx import accepts as exportable

    return exportable(spec)


def describe(model: LanguageModel) -> ModelFacts:
    """int4 weights (the export's blocks), int8 activations per block, float32 elsewhere."""
    weights = getattr(model, "weights", None)
    block = weights.lm_head.block if weights is not None else None
    shape = weights.shape if weights is not None else None
    return ModelFacts(
        class_name=type(model).__name__,
        parameters=0,
        dtype="float32",
        weights=f"int4 (exactspec kernels, block {block}, int8 activations)",
        vocab_size=model.vocab_size,
        layers=None if shape is None else shape.layers,
        hidden_size=None if shape is None else shape.hidden_size,
    )


# ---------------------------------------------------------------- tiny models (verify, audit --tiny, tests)


class OneTokenPasses(ModelWrapper):
    """The law the native model defines: every position's logits from a one-token pass after the
    positions before it (each fed alone, in order, in a row of its own), float64; memoized by history,
    since the enumeration asks for the same prefixes again and again."""

    def __init__(self, model: LanguageModel) -> None:
        super().__init__(model)
        self._known: dict[tuple[int, ...], torch.Tensor] = {}  # history -> [V] logits after it

    def _after(self, history: tuple[int, ...]) -> torch.Tensor:
        if history not in self._known:
            self.model.clear_cache()
            for n in range(1, len(history) + 1):
                if history[:n] not in self._known:
                    self._known[history[:n]] = self.model.logits([list(history[:n])], 1, rows=[0])[0, 0]
                else:  # its cells are what this row's one-token passes would write: feed it anyway
                    self.model.logits([list(history[:n])], 1, rows=[0])
        return self._known[history]

    def logits(self, histories, num_positions=1, rows=None):  # type: ignore[no-untyped-def]
        out = [
            torch.stack(
                [self._after(tuple(h[: len(h) - num_positions + j + 1])) for j in range(num_positions)]
            )
            for h in histories
        ]
        return torch.stack(out).to(torch.float64)


def _tiny_model(module: Any, eos: int, **options: Any) -> Any:
    from exactspec.models.native.model import NativeModel
    from exactspec.models.native.modules import from_module

    settings: dict[str, Any] = {"max_rows": 4, "dtype": torch.float64, "threads": 1, **options}
    return NativeModel(from_module(module), eos_token_ids={eos}, name=type(module).__name__, **settings)


def tiny_adapters(target: Any, draft: Any, eos: int, options: Mapping[str, Any]) -> tuple[Any, Any]:
    """The grid's adapters: the tiny modules quantized to int4 and run by the kernels, float64 logits
    (their float32 values widened exactly)."""
    return _tiny_model(target, eos, **options), _tiny_model(draft, eos, **options)


def tiny_reference(target: Any, eos: int) -> LanguageModel:
    """The law the grid compares with: the native model's own one-token passes (`OneTokenPasses`)."""
    return OneTokenPasses(_tiny_model(target, eos))


def tiny_pair(target: Any, draft: Any, eos: int) -> TinyPair:
    """The tiny modules quantized for the kernels, loaded as `load` loads a pair, without a tokenizer."""
    pair = ModelPair(
        None,
        _tiny_model(target, eos, dtype=torch.float32),
        None,
        _tiny_model(draft, eos, dtype=torch.float32),
        None,
        weights="int4",
        backend=NAME,
    )
    return TinyPair(
        pair,
        "tiny random Qwen2 models (int4, exactspec kernels)",
        _tiny_model(target, eos, dtype=torch.float32),
    )


def grid_cells() -> list[GridCell]:
    """The per-row-cache cells (`two_row_cells`), trees scored in one pass."""
    return two_row_cells("native int4")


def _kernel_build() -> str:
    """The kernels' build key (`kernels.build.source_key`) and the path that runs: an edited kernel, or
    another path forced (`EXACTSPEC_KERNEL_PATH`), is measured again by auto."""
    from exactspec.kernels.build import source_key
    from exactspec.kernels.paths import PathUnavailable, path

    try:
        running = path()
    except PathUnavailable:
        running = "unavailable"  # the load says why
    return f"{source_key()} {running}"


BACKEND = register(
    Backend(
        name=NAME,
        summary="the pair's int4 export run by exactspec's own CPU kernels: a position's logits are the "
        "same bits however a pass is cut, so speculation gives plain decoding's tokens",
        load=load,
        reference=reference,
        unavailable=unavailable,
        accepts=accepts,
        options=frozenset({"threads", "batch_invariant"}),
        rank=1,
        own_threads=True,
        describe=describe,
        tiny=TinyModels(
            family="qwen2",
            adapters=tiny_adapters,
            cells=grid_cells,
            tolerance=FLOAT64_TOLERANCE,
            pair=tiny_pair,
            reference=tiny_reference,
        ),
        runtime_packages=(),
        runtime_key=_kernel_build,
        on_disk=OnDisk(folder=True, path=lambda model: model.folder),  # type: ignore[attr-defined]
    )
)
