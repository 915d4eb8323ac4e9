"""Loading Hugging Face causal LMs (and their tokenizers) from the specs users type (what a spec names:
`models.specs`).

A spec is one of:

* `"default-target"` / `"default-draft"`: the built-in default pair
  (`exactspec.artefacts.default_pair`), fetched and verified on first use;
* a path to a GGUF file (recognised by its magic bytes, not its name);
* a local model folder (with `config.json`, as written by `save_pretrained`);
* a Hugging Face hub id such as `"Qwen/Qwen2.5-0.5B"`.

Transformers turns a GGUF file into a dense model by dequantizing every tensor,
which takes tens of seconds on a CPU (and the tokenizer another ten). That work
is done once: the dense weights, config, generation config and tokenizer are
saved in the conversion cache (`exactspec.artefacts.conversion`: where entries
live, keyed by content, their provenance records, staging into place) and later
loads read them from there. The first conversion is checked: the model reloaded
from the cache must give bit-identical logits to the one converted from GGUF.

Every failure, including those of the artefacts (fetching the default pair, a
conversion cache that is not writable or holds an untrusted entry), is a
`ModelLoadError` whose message names the path and the fix.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from exactspec.artefacts.cache import cache_root
from exactspec.artefacts.conversion import (
    WEIGHTS_FILE,
    ConversionCacheError,
    ConversionEntry,
    check_provenance,
    conversion_entry,
    staged_entry,
    write_provenance,
)
from exactspec.artefacts.default_pair import (
    DefaultPairError,
    ensure_parted_model,
)
from exactspec.models.specs import (
    DEFAULT_SPECS,
    ModelLoadError,
    ModelSpecError,
    check_spec,
    classify,
    is_gguf_file,
    names_gguf,
    spec_text,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "DEFAULT_DTYPE",
    "DEFAULT_SPECS",
    "ModelLoadError",
    "ModelSpecError",
    "check_spec",
    "is_gguf_file",
    "load_hf_model",
    "load_tokenizer",
    "names_gguf",
    "one_gguf_parse",
    "resolve_dtype",
]

# What dtype="auto" means: the fastest for the default pair on CPU, measured with
# scripts/measure_dtype.py (2-core AMD EPYC with AVX512-BF16, KV cache of 200
# tokens, 1 thread, ms per forward, float32 -> bfloat16): draft 1-token 143 -> 130,
# 5-token 296 -> 147; target 1-token 574 -> 528, 5-token 1411 -> 573. With 2
# threads the gap is wider (target 5-token ~710 -> ~200). bfloat16 also halves
# memory. Caveat: in bfloat16 a 5-token pass and five 1-token passes give logits
# that differ by up to ~0.2 (float32: ~3e-5); neither is bit-identical.
DEFAULT_DTYPE = torch.bfloat16

_DTYPE_NAMES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}

# A hub id is `name` or `owner/name`; anything else that does not exist is a missing path.
_TOKENIZER_PROBE = "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)  # héllo 世界 <|im_end|>"


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """`"auto"` -> `DEFAULT_DTYPE`; also accepts torch dtypes and names like "bf16"."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return DEFAULT_DTYPE
    try:
        return _DTYPE_NAMES[dtype.lower().removeprefix("torch.")]
    except (KeyError, AttributeError):
        raise ModelLoadError(
            f"Unknown dtype {dtype!r}; use 'auto', a torch dtype, or one of "
            f"{', '.join(sorted(_DTYPE_NAMES))}."
        ) from None


def load_hf_model(
    spec: str | os.PathLike[str],
    *,
    dtype: torch.dtype | str = "auto",
    cache_dir: str | os.PathLike[str] | None = None,
    progress: bool = True,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer, in eval mode, on the CPU.

    Args:
        spec: "default-target", "default-draft", a `.gguf` file, a model folder or a hub id.
        dtype: weight dtype; "auto" is `DEFAULT_DTYPE`, the fastest measured on CPU.
        cache_dir: exactspec cache folder (default pair files and GGUF conversions);
            default `exactspec.artefacts.cache.default_cache_dir()`.
        progress: show progress bars (download, conversion, weight loading) on stderr.

    Raises:
        ModelLoadError: the spec names nothing loadable, or the default pair could not be
            fetched; the message says how to fix it.
    """
    torch_dtype = resolve_dtype(dtype)
    kind, target = _resolve(spec, cache_dir, progress)
    if kind == "gguf":
        with _artefact_errors():
            return _load_gguf(target, torch_dtype, cache_root(cache_dir), progress)
    if kind == "folder":
        return _load_pretrained(str(target), torch_dtype, progress, local=True)
    return _load_pretrained(str(target), torch_dtype, progress, local=False)


def load_tokenizer(
    spec: str | os.PathLike[str],
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    progress: bool = True,
) -> PreTrainedTokenizerBase:
    """The tokenizer of `spec` alone (same specs as `load_hf_model`), without loading weights."""
    kind, target = _resolve(spec, cache_dir, progress)
    if kind == "gguf":
        with _artefact_errors():
            return _gguf_tokenizer(target, conversion_entry(target, cache_root(cache_dir)), progress)
    return _auto_tokenizer(str(target), local=kind == "folder")


# --- spec resolution --------------------------------------------------------------------------


def gguf_path(
    spec: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None, progress: bool = True
) -> Path | None:
    """The GGUF file a model spec names ("default-target" / "default-draft" or a .gguf path), else None."""
    kind, target = _resolve(spec, cache_dir, progress)
    return target if kind == "gguf" else None


def _resolve(
    spec: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None, progress: bool
) -> tuple[str, Any]:
    """(kind, target): kind is "gguf" (target a Path), "folder" (Path) or "hub" (str)."""
    text = spec_text(spec)
    if text in DEFAULT_SPECS:
        with _artefact_errors():
            return "gguf", ensure_parted_model(DEFAULT_SPECS[text], cache_dir, progress=progress)
    return classify(text)


@contextlib.contextmanager
def _artefact_errors() -> Iterator[None]:
    """Failures of the artefacts (the default pair's files, the conversion cache) as `ModelLoadError`."""
    try:
        yield
    except (DefaultPairError, ConversionCacheError) as error:
        # One exception type for every loading failure; the message already says what to do.
        raise ModelLoadError(str(error)) from error


# --- Hugging Face folders and hub ids ---------------------------------------------------------


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as error:
        raise ModelLoadError(
            "Loading Hugging Face models needs transformers: pip install 'exactspec[hf]'."
        ) from error
    return transformers


def _offline() -> bool:
    flags = (os.environ.get(name, "") for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    return any(flag.strip().lower() in {"1", "true", "yes", "on"} for flag in flags)


def _network_failure(error: BaseException) -> bool:
    """Whether a failed hub load comes down to not reaching the hub (or being told not to)."""
    seen: BaseException | None = error
    while seen is not None:
        name = type(seen).__name__
        if name in {"LocalEntryNotFoundError", "OfflineModeIsEnabled", "gaierror"} or any(
            word in name for word in ("ConnectError", "ConnectionError", "Timeout")
        ):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _load_failure(spec: str, local: bool, error: BaseException) -> ModelLoadError:
    if local:
        return ModelLoadError(f"Could not load the model folder {spec}: {error}")
    if _offline():
        return ModelLoadError(
            f"{spec!r} is not a local path, and as a Hugging Face hub id it is not in the local HF cache; "
            f"HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set, so it was not downloaded. Unset it to "
            f"download, or pass a local folder or .gguf file."
        )
    if _network_failure(error):
        return ModelLoadError(
            f"{spec!r} is not a local path, and the Hugging Face hub could not be reached to download it "
            f"(no network?). Download it where the hub is reachable, or pass a local folder or .gguf file. "
            f"({error})"
        )
    return ModelLoadError(
        f"Could not load {spec!r} as a Hugging Face hub id (it is not a local path either): {error}"
    )


def _auto_tokenizer(spec: str, *, local: bool) -> PreTrainedTokenizerBase:
    transformers = _transformers()
    try:
        return transformers.AutoTokenizer.from_pretrained(spec, local_files_only=local or _offline())
    except Exception as error:
        raise _load_failure(spec, local, error) from error


def _load_pretrained(
    spec: str, dtype: torch.dtype, progress: bool, *, local: bool
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    transformers = _transformers()
    try:
        with _progress_bars(progress):
            model = transformers.AutoModelForCausalLM.from_pretrained(
                spec, dtype=dtype, local_files_only=local or _offline()
            )
    except Exception as error:
        raise _load_failure(spec, local, error) from error
    return model.eval(), _auto_tokenizer(spec, local=local)


@contextlib.contextmanager
def _progress_bars(enabled: bool) -> Iterator[None]:
    """Show or hide transformers' progress bars for the duration, then restore them."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    # The GGUF dequantization bar is a plain tqdm, outside transformers' switch.
    legacy = _gguf_legacy_module()
    legacy_tqdm = getattr(legacy, "tqdm", None)
    if enabled != was_enabled:
        (hf_logging.enable_progress_bar if enabled else hf_logging.disable_progress_bar)()
    if not enabled and legacy_tqdm is not None:
        legacy.tqdm = functools.partial(legacy_tqdm, disable=True)
    try:
        yield
    finally:
        if legacy_tqdm is not None:
            legacy.tqdm = legacy_tqdm
        if enabled != was_enabled:
            (hf_logging.enable_progress_bar if was_enabled else hf_logging.disable_progress_bar)()


def _gguf_legacy_module() -> Any:
    try:
        from transformers import modeling_gguf_pytorch_utils
    except ImportError:
        return None
    return modeling_gguf_pytorch_utils


# --- GGUF files, converted once into the conversion cache -------------------------------------


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _load_gguf(
    path: Path, dtype: torch.dtype, cache_root: Path, progress: bool
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    entry = conversion_entry(path, cache_root)
    with one_gguf_parse():
        tokenizer = _gguf_tokenizer(path, entry, progress)
        model_dir = entry.model_folder(_dtype_name(dtype))
        if model_dir.is_dir():
            check_provenance(model_dir, path)
            return _load_converted(model_dir, dtype, progress), tokenizer
        return _convert_gguf_model(path, model_dir, dtype, progress), tokenizer


@contextlib.contextmanager
def one_gguf_parse() -> Iterator[None]:
    """Within the block, every `gguf.GGUFReader` of one file is the same reader.

    transformers parses a GGUF file anew for its tokenizer, its config and its weights (a `GGUFReader`
    each, in `load_gguf_checkpoint`), and a parse walks the metadata in Python, element by element:
    the built-in target's vocabulary and merges take many seconds a parse on a small CPU, three times
    in a first conversion. A reader only maps the file and reads it, so
    sharing one changes nothing it returns."""
    try:
        import gguf
    except ImportError:  # transformers says what to install when it needs it
        yield
        return
    original = gguf.GGUFReader
    readers: dict[str, Any] = {}

    def shared(path: Any, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs:  # another mode than reading: not shared
            return original(path, *args, **kwargs)
        key = os.path.realpath(os.fspath(path))
        if key not in readers:
            readers[key] = original(path)
        return readers[key]

    gguf.GGUFReader = shared
    try:
        yield
    finally:
        gguf.GGUFReader = original


def _load_converted(model_dir: Path, dtype: torch.dtype, progress: bool) -> PreTrainedModel:
    transformers = _transformers()
    try:
        with _progress_bars(progress):
            model = transformers.AutoModelForCausalLM.from_pretrained(
                str(model_dir), dtype=dtype, local_files_only=True
            )
    except Exception as error:
        raise ModelLoadError(
            f"The cached conversion {model_dir} could not be loaded ({error}). Delete that folder and "
            f"load again to redo the conversion from the GGUF file."
        ) from error
    return model.eval()


def _gguf_tokenizer(path: Path, entry: ConversionEntry, progress: bool) -> PreTrainedTokenizerBase:
    transformers = _transformers()
    tok_dir = entry.tokenizer_folder
    if tok_dir.is_dir():
        try:
            return transformers.AutoTokenizer.from_pretrained(str(tok_dir), local_files_only=True)
        except Exception as error:
            raise ModelLoadError(
                f"The cached tokenizer {tok_dir} could not be loaded ({error}). Delete that folder and "
                f"load again to rebuild it from {path}."
            ) from error
    try:
        with _progress_bars(progress):
            tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as error:
        raise ModelLoadError(f"Could not read the tokenizer of the GGUF file {path}: {error}") from error
    with staged_entry(tok_dir) as tmp:
        tokenizer.save_pretrained(str(tmp))
        reloaded = transformers.AutoTokenizer.from_pretrained(str(tmp), local_files_only=True)
        _check_same_tokenizer(tokenizer, reloaded, path)
    # Loaded from the files the next run will read, so this run tokenizes the same way.
    return reloaded


def _check_same_tokenizer(original: Any, reloaded: Any, path: Path) -> None:
    probe = _TOKENIZER_PROBE
    same = (
        original(probe)["input_ids"] == reloaded(probe)["input_ids"]
        and len(original) == len(reloaded)
        and original.eos_token_id == reloaded.eos_token_id
        and getattr(original, "chat_template", None) == getattr(reloaded, "chat_template", None)
    )
    if not same:
        raise ModelLoadError(
            f"The tokenizer of {path} does not survive save_pretrained/from_pretrained unchanged, so it "
            f"cannot be cached safely. Please report this with your transformers version."
        )


def _convert_gguf_model(path: Path, model_dir: Path, dtype: torch.dtype, progress: bool) -> PreTrainedModel:
    transformers = _transformers()
    kwargs: dict[str, Any] = {}
    try:
        from transformers.utils.quantization_config import GgufConfig
    except ImportError:
        pass
    else:
        # Dense weights are what the cache stores; for architectures that
        # transformers can keep packed, ask for the dense version explicitly.
        kwargs["quantization_config"] = GgufConfig(dequantize=True)
    try:
        with _progress_bars(progress):
            gguf_model = transformers.AutoModelForCausalLM.from_pretrained(
                str(path.parent), gguf_file=path.name, dtype=dtype, **kwargs
            )
    except Exception as error:
        raise ModelLoadError(
            f"transformers could not load the GGUF file {path}: {error}. Only the architectures "
            f"transformers supports for GGUF load this way (install 'exactspec[hf]' for gguf and "
            f"accelerate)."
        ) from error
    gguf_model.eval()
    # Reference logits now, so the GGUF-loaded copy can be freed before the
    # cached copy is loaded: two copies of a 1.5B model in float32 is 13 GB.
    probe = _probe_ids(int(gguf_model.config.vocab_size))
    expected = _probe_logits(gguf_model, probe)

    with staged_entry(model_dir) as tmp:
        _save_dense(gguf_model, tmp, dtype, path)
        del gguf_model

    cached = _load_converted(model_dir, dtype, progress)
    if not torch.equal(_probe_logits(cached, probe), expected):
        shutil.rmtree(model_dir, ignore_errors=True)
        raise ModelLoadError(
            f"The model converted from {path} and saved to the cache does not reproduce the logits of "
            f"the GGUF-loaded model, so the cache entry was removed. Please report this with your "
            f"transformers version."
        )
    return cached


def _save_dense(model: PreTrainedModel, folder: Path, dtype: torch.dtype, source: Path) -> None:
    """Weights, config and generation config of a dequantized model, as a plain HF folder.

    `save_pretrained` refuses models loaded from GGUF (they count as quantized),
    so this writes the pieces itself and drops the quantization config, which
    would otherwise send the next load back to the GGUF loader.
    """
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    seen: set[tuple[int, tuple[int, ...], torch.dtype]] = set()
    for name, tensor in model.state_dict().items():
        # Tied weights (lm_head = embeddings) share storage; safetensors refuses
        # duplicates, and from_pretrained re-ties them from the config.
        identity = (tensor.data_ptr(), tuple(tensor.shape), tensor.dtype)
        if identity in seen:
            continue
        seen.add(identity)
        tensors[name] = tensor.detach().contiguous()
    save_file(tensors, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    (folder / WEIGHTS_FILE).chmod(0o644)  # safetensors writes it owner-only

    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = [type(model).__name__]
    config.dtype = dtype
    config.save_pretrained(str(folder))
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(str(folder))
    libraries = {"transformers": _transformers().__version__, "torch": torch.__version__}
    write_provenance(folder, source, _dtype_name(dtype), libraries)


def _probe_ids(vocab_size: int) -> torch.Tensor:
    # Ids spread over the whole vocabulary, so every region of the embedding is read.
    return (torch.arange(8) * (vocab_size // 8) + 7).clamp(max=vocab_size - 1).unsqueeze(0)


@torch.inference_mode()
def _probe_logits(model: PreTrainedModel, ids: torch.Tensor) -> torch.Tensor:
    return model(ids, use_cache=False).logits
