"""A model exported once to ONNX by onnxruntime-genai's model builder, cached with its provenance.

The builder (`python -m onnxruntime_genai.models.builder`, run in a child process through `builder_child`,
which skips its no-op quantization pass on int4 checkpoints: it prints as it goes) reads a Hugging Face
model folder. A GGUF file is first written as one in a scratch folder, tensor by
tensor, in another child process (`gguf_folder`): the float32 values transformers gives the "hf"
backend, and for the int4 recipes with the builder's default algorithm their int4 quantization by the
very function the builder's quantizer calls, so the builder holds int4 weights instead of the float32
model (about 2.4 GB instead of 17 for the built-in target) and the ONNX weights are byte for byte those it
would have made from the float32 folder. Either way the ONNX model's int4 weights are a re-quantization
of the GGUF's dequantized weights: with int4 ONNX weights the ONNX model, not the GGUF, is the target.
The scratch folder is deleted with the export; only the tokenizer stays in the conversion cache.

Layout under the exactspec cache:

```
onnx-exported-v1/
  <source stem>-<recipe name>-<key>/     key: sha256 of (source content, recipe, builder version)
    model.onnx, model.onnx.data, genai_config.json, tokenizer files (the builder's output)
    model.onnx.data.verified.json        the stamp of the weights (`artefacts.stamps`)
    exactspec-export.json                the provenance record: source path and content, recipe,
                                         builder arguments, library versions, seconds taken
  <...>.lock                             one export of an entry at a time, across processes
```

An entry is reused only when its record names the same key and its weights still match their stamp
(size and mtime: the file was not touched since it was hashed); otherwise it is exported again. The
folder is built beside its final name and renamed into place (`conversion.staged_entry`), so a killed
export never leaves a half-written entry. Progress lines go to the caller's `progress` callback.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from exactspec.artefacts.cache import cache_root
from exactspec.artefacts.conversion import content_fingerprint, content_key, staged_entry
from exactspec.artefacts.inventory import Kind
from exactspec.artefacts.locks import exclusive_lock
from exactspec.artefacts.stamps import stamped_sha256, write_stamp
from exactspec.foundations.provenance import installed_versions
from exactspec.models.onnx.gguf_folder import FLOAT32, KIND_LINE, QUANTIZED, strip_zero_points

EXPORT_CACHE = "onnx-exported-v1"
PROVENANCE_FILE = "exactspec-export.json"
MODEL_FILE = "model.onnx"
WEIGHTS_FILE = "model.onnx.data"
LIBRARIES = ("onnxruntime-genai", "onnxruntime", "onnx-ir", "onnx", "transformers", "torch")
"""Versions recorded in the provenance; the builder's is part of the cache key."""

BUILDER_MODULE = "exactspec.models.onnx.builder_child"
"""The module the export runs (`python -m`): the builder, less a pass that only copies an int4 checkpoint."""
CACHE_KIND = Kind(f"{EXPORT_CACHE}/*", "onnx", "model exported to ONNX (the onnx backend's weights)")
"""The exports as `exactspec cache` lists them."""

Progress = Callable[[str], None]


class ExportError(RuntimeError):
    """The model builder failed, or the export cache cannot be written."""


@dataclass(frozen=True)
class ExportRecipe:
    """How the builder exports a model.

    Attributes:
        precision: "int4" (MatMulNBits weights, float32 activations) or "fp32" (tiny test models).
        block_size: int4 weights per scale (the builder's block_size: 16..256).
        accuracy_level: MatMulNBits' compute type: 4 = int8 activations (VNNI), 1 = float32.
        algo: the builder's algo_config: "default" (round to nearest), "rtn" or "k_quant".
        mixed_precision: the builder's matmul_mixed_precision ("" = every MatMul in int4; e.g.
            "last_matmul:int8" keeps the output layer in int8).
    """

    precision: str = "int4"
    block_size: int = 128
    accuracy_level: int = 4
    algo: str = "default"
    mixed_precision: str = ""

    def __post_init__(self) -> None:
        if self.precision not in ("int4", "fp32"):
            raise ValueError(f"precision must be 'int4' or 'fp32', got {self.precision!r}")
        if self.block_size not in (16, 32, 64, 128, 256):
            raise ValueError(f"block_size must be 16, 32, 64, 128 or 256, got {self.block_size}")
        if self.accuracy_level not in (1, 2, 3, 4):
            raise ValueError(f"accuracy_level must be 1..4, got {self.accuracy_level}")

    @property
    def name(self) -> str:
        """'int4-b128-a4' (plus '-k_quant', '-mixed'), or 'fp32': part of the cache folder's name."""
        if self.precision == "fp32":
            return "fp32"
        name = f"int4-b{self.block_size}-a{self.accuracy_level}"
        name += "" if self.algo == "default" else f"-{self.algo}"
        return name + ("-mixed" if self.mixed_precision else "")

    @property
    def prequantizable(self) -> bool:
        """Whether a GGUF source's projections can be quantized before the builder sees them
        (`gguf_folder.QUANTIZED`): int4 with the builder's default algorithm in one width."""
        return self.precision == "int4" and self.algo == "default" and not self.mixed_precision

    def builder_arguments(self) -> list[str]:
        """The builder's -p / -e / --extra_options for this recipe (CPU execution provider)."""
        arguments = ["-p", self.precision, "-e", "cpu"]
        if self.precision == "int4":
            extra = [f"block_size={self.block_size}", f"accuracy_level={self.accuracy_level}"]
            extra += [f"algo_config={self.algo}"] if self.algo != "default" else []
            extra += [f"matmul_mixed_precision={self.mixed_precision}"] if self.mixed_precision else []
            arguments += ["--extra_options", *extra]
        return arguments


DEFAULT_RECIPE = ExportRecipe()
"""int4, block 128, int8 compute: the fastest one-token step of the block sizes measured, with no steeper
v(k) and the same NLL on real text (docs/performance.md)."""
FP32_RECIPE = ExportRecipe(precision="fp32")
INVARIANT_RECIPE = ExportRecipe(block_size=32)
"""int4 in blocks of 32, int8 compute: the weights whose products ONNX Runtime computes the same way for a
row whatever the rows beside it (at blocks of 64 and 128 it computes rows in pairs and a lone row another
way), which the batch-invariant mode needs (`invariant`; docs/numerics.md)."""


def library_versions() -> dict[str, str]:
    """Installed versions of the libraries an export depends on ("" when one is missing)."""
    return installed_versions(LIBRARIES)


def source_content(source: Path) -> dict[str, Any]:
    """What identifies a source's content: a GGUF file's `content_key`, or for a model folder its config
    text's sha256 and each weights file's size and `content_fingerprint`."""
    if source.is_file():
        return {"gguf": content_key(source)}
    files = sorted(p for p in source.iterdir() if p.suffix in (".safetensors", ".bin") and p.is_file())
    if not files or not (source / "config.json").is_file():
        raise ExportError(f"{source} is neither a GGUF file nor a model folder (config.json and weights)")
    return {
        "config": hashlib.sha256((source / "config.json").read_bytes()).hexdigest(),
        "weights": {p.name: [p.stat().st_size, content_fingerprint(p)] for p in files},
    }


def export_key(source: Path, recipe: ExportRecipe, versions: dict[str, str]) -> dict[str, Any]:
    """The cache key of an export: the source's content, the recipe and the builder's version."""
    return {
        "layout": EXPORT_CACHE,
        "source": source_content(source),
        "recipe": asdict(recipe),
        "builder": versions.get("onnxruntime-genai", ""),
    }


def entry_folder(source: Path, recipe: ExportRecipe, key: dict[str, Any], root: Path) -> Path:
    """`<root>/onnx-exported-v1/<stem>-<recipe>-<16 hex digits of the key's sha256>`."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    stem = re.sub(r"[^\w.-]+", "_", source.stem if source.is_file() else source.name)
    return root / EXPORT_CACHE / f"{stem}-{recipe.name}-{digest}"


def entry_matches(folder: Path, key: dict[str, Any]) -> bool:
    """Whether a cached export can be reused: its record names `key` and its weights match their stamp."""
    try:
        record = json.loads((folder / PROVENANCE_FILE).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(record, dict) or record.get("key") != key:
        return False
    recorded = record.get("weights_sha256")
    weights = folder / record.get("weights_file", WEIGHTS_FILE)
    return recorded is not None and stamped_sha256(weights) == recorded


def exported_model(
    source: str | os.PathLike[str],
    recipe: ExportRecipe = DEFAULT_RECIPE,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    progress: Progress | None = None,
) -> Path:
    """The folder of `source` exported to ONNX by `recipe`: from the cache, else exported now (about a
    minute for a 1.5B model on 2 cores, plus the GGUF's dequantization on first use).

    Args:
        source: a GGUF file or a Hugging Face model folder (config, weights and tokenizer).
        recipe: the builder's precision and int4 options.
        cache_dir: the exactspec cache (`artefacts.cache.cache_root`).
        progress: hears a line per export stage (None: silent).
    """
    source = Path(source).expanduser()
    if not source.exists():
        raise ExportError(f"{source} does not exist")
    root = cache_root(cache_dir)
    versions = library_versions()
    if not versions["onnxruntime-genai"]:
        raise ExportError('the export needs onnxruntime-genai\'s model builder: pip install -e ".[onnx]"')
    key = export_key(source, recipe, versions)
    final = entry_folder(source, recipe, key, root)
    if entry_matches(final, key):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(final.parent / f"{final.name}.lock"):
        if entry_matches(final, key):  # another process exported it while this one waited
            return final
        if final.exists():  # touched or from an interrupted older layout: export afresh
            shutil.rmtree(final)
        _export(source, recipe, key, versions, final, cache_dir, progress)
    return final


def _export(
    source: Path,
    recipe: ExportRecipe,
    key: dict[str, Any],
    versions: dict[str, str],
    final: Path,
    cache_dir: str | os.PathLike[str] | None,
    progress: Progress | None,
) -> None:
    say = progress or (lambda line: None)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="exactspec-onnx-export-") as scratch:
        model_folder, kind = _model_folder(source, Path(scratch) / "input", recipe, cache_dir, say)
        with staged_entry(final) as tmp:
            arguments = ["-i", str(model_folder), "-o", str(tmp), "-c", str(Path(scratch) / "builder-cache")]
            arguments += recipe.builder_arguments()
            say(f"exporting {source.name} to ONNX ({recipe.name}) with onnxruntime-genai's model builder")
            _run_child(
                [sys.executable, "-m", BUILDER_MODULE, *arguments],
                lambda line: say(f"export {recipe.name}: {line}"),
            )
            if kind == QUANTIZED:
                dropped = strip_zero_points(tmp / MODEL_FILE)
                say(f"export {recipe.name}: {dropped} MatMulNBits nodes take the default zero point")
            weights = tmp / WEIGHTS_FILE if (tmp / WEIGHTS_FILE).is_file() else tmp / MODEL_FILE
            say(f"export {recipe.name}: hashing {weights.name}")
            digest = _sha256(weights)
            write_stamp(weights, digest)
            record = {
                "key": key,
                "source_path": str(source.resolve()),
                "recipe": asdict(recipe),
                "builder_input": kind,
                "builder_arguments": arguments,
                "versions": versions,
                "weights_file": weights.name,
                "weights_sha256": digest,
                "seconds": round(time.perf_counter() - started, 1),
                "exported_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
            (tmp / PROVENANCE_FILE).write_text(json.dumps(record, indent=2) + "\n")
    say(f"exported {source.name} ({recipe.name}) in {time.perf_counter() - started:.0f} s: {final}")


def _model_folder(
    source: Path, scratch: Path, recipe: ExportRecipe, cache_dir: Any, say: Progress
) -> tuple[Path, str]:
    """A Hugging Face folder the builder can read and its kind: `source` itself ("folder"), or for a GGUF
    file one written into `scratch` tensor by tensor in a child process (`gguf_folder`: int4 weights
    quantized as the builder would where the recipe allows, else float32), with the tokenizer of the
    conversion cache linked beside it. Nothing but the tokenizer is cached: the scratch goes with the
    export."""
    if source.is_dir():
        return source, "folder"
    from exactspec.artefacts.conversion import conversion_entry
    from exactspec.models.loading import load_tokenizer

    load_tokenizer(source, cache_dir=cache_dir, progress=False)
    wanted = QUANTIZED if recipe.prequantizable else FLOAT32
    lines: list[str] = []

    def hear(line: str) -> None:
        lines.append(line)
        if not line.startswith(KIND_LINE):
            say(line)

    module = "exactspec.models.onnx.gguf_folder"
    _run_child(
        [sys.executable, "-m", module, str(source), str(scratch), wanted, str(recipe.block_size)], hear
    )
    kind = next((line.removeprefix(KIND_LINE) for line in lines if line.startswith(KIND_LINE)), "")
    if kind not in (QUANTIZED, FLOAT32):
        raise ExportError(f"{module} wrote no model folder for {source}:\n" + "\n".join(lines[-15:]))
    for item in conversion_entry(source, cache_root(cache_dir)).tokenizer_folder.iterdir():
        if not (scratch / item.name).exists():
            (scratch / item.name).symlink_to(item)
    return scratch, kind


def _run_child(command: list[str], say: Progress) -> None:
    """Run `command` (the model builder, or the GGUF folder writer) in a child process; its progress
    lines ("Reading layer 3", "Saving ONNX model", "wrote layer 3 of 28") go to `say`, and its output's
    tail is in the error when it fails."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    assert process.stdout is not None
    tail: list[str] = []
    pending = b""
    saving = ""  # the layer being written, as the builder's progress bar names it
    while chunk := process.stdout.read1(4096):  # type: ignore[attr-defined]
        pending += chunk
        *lines, pending = re.split(rb"[\r\n]", pending)
        for raw in lines:
            line = raw.decode("utf-8", errors="replace").strip()
            if not line:
                continue
            tail = (tail + [line])[-15:]
            layer = re.match(r"Saving model\.layers\.(\d+)\.", line)  # tqdm's bar while it writes
            if layer and layer.group(1) != saving:
                saving = layer.group(1)
                say(f"writing layer {saving}")
            elif line.startswith(("Reading", "Saving ONNX", "Saving GenAI", "wrote", "writing", KIND_LINE)):
                say(line)
    if process.wait() != 0:
        raise ExportError(f"{' '.join(command)} failed (exit {process.returncode}):\n" + "\n".join(tail))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def cached_export(
    source: str | os.PathLike[str], recipe: ExportRecipe = DEFAULT_RECIPE, cache_dir: Any = None
) -> Path | None:
    """The cached export of `source` by `recipe` when there is a usable one, else None (nothing is
    fetched or exported: `--backend auto` measures only what is exported already)."""
    source = Path(source).expanduser()
    versions = library_versions()
    if not source.exists() or not versions["onnxruntime-genai"]:
        return None
    try:
        key = export_key(source, recipe, versions)
    except (ExportError, OSError, RuntimeError):
        return None
    folder = entry_folder(source, recipe, key, cache_root(cache_dir))
    return folder if entry_matches(folder, key) else None
