"""Loading Hugging Face causal LMs (and their tokenizers) from the specs users type.

A spec is one of:

* `"default-target"` / `"default-draft"`: the built-in default pair
  (`exactspec.artefacts.default_pair`), fetched and verified on first use;
* a path to a GGUF file (recognised by its magic bytes, not its name);
* a local model folder (with `config.json`, as written by `save_pretrained`);
* a Hugging Face hub id such as `"Qwen/Qwen2.5-0.5B"`.

Transformers turns a GGUF file into a dense model by dequantizing every tensor,
which takes tens of seconds on a CPU (and the tokenizer another ten). That work
is done once: the dense weights, config, generation config and tokenizer are
saved under the exactspec cache (`gguf-converted-v1/<name>-<content key>/<dtype>/`)
and later loads read them from there. The first conversion is checked: the model
reloaded from the cache must give bit-identical logits to the one converted from
GGUF.

The cache is keyed by the file's content, never by its name, size or mtime (which
`cp -p`, `rsync -a` and unpacking an archive carry over to a different file), and
each load checks the provenance record written beside the weights. Staging folders
are named by process id so that those of killed processes can be cleaned, and every
filesystem failure (a folder that is not writable, a file where a folder should be,
a full disk) is a `ModelLoadError` that names the path and the fix.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from exactspec.artefacts.cache import cache_root
from exactspec.artefacts.default_pair import (
    DEFAULT_DRAFT,
    DEFAULT_TARGET,
    DefaultPairError,
    ensure_parted_model,
)
from exactspec.artefacts.staging import publish_folder, staging_folder
from exactspec.artefacts.stamps import stamped_sha256
from exactspec.foundations.errors import InvalidArgument

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "DEFAULT_DTYPE",
    "DEFAULT_SPECS",
    "ModelLoadError",
    "ModelSpecError",
    "check_spec",
    "content_fingerprint",
    "is_gguf_file",
    "load_hf_model",
    "load_tokenizer",
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

# The spec strings that name the built-in default pair.
DEFAULT_SPECS = {"default-target": DEFAULT_TARGET, "default-draft": DEFAULT_DRAFT}

GGUF_MAGIC = b"GGUF"

# Bump when the layout of the conversion cache changes, so old entries are ignored.
_CONVERSION_CACHE = "gguf-converted-v1"
_WEIGHTS_FILE = "model.safetensors"
_TOKENIZER_DIR = "tokenizer"
_PROVENANCE_FILE = "exactspec-conversion.json"

# The content fingerprint of a GGUF file without a verified sha256 (see `content_fingerprint`).
_FINGERPRINT_HEAD = 1 << 20
_FINGERPRINT_BLOCK = 64 << 10
_FINGERPRINT_BLOCKS = 32

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
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")

_TOKENIZER_PROBE = "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)  # héllo 世界 <|im_end|>"


class ModelLoadError(RuntimeError):
    """A model or tokenizer could not be loaded; the message says why and what to do."""


class ModelSpecError(ModelLoadError, InvalidArgument):
    """The spec itself names nothing loadable (a missing path, a file that is not GGUF): a usage error."""


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


def is_gguf_file(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a file that starts with the GGUF magic bytes."""
    try:
        with open(path, "rb") as f:
            return f.read(len(GGUF_MAGIC)) == GGUF_MAGIC
    except OSError:
        return False


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
        return _gguf_tokenizer(target, _conversion_entry(target, cache_root(cache_dir)), progress)
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
    text = _spec_text(spec)
    if text in DEFAULT_SPECS:
        try:
            return "gguf", ensure_parted_model(DEFAULT_SPECS[text], cache_dir, progress=progress)
        except DefaultPairError as error:
            # One exception type for every loading failure; the message already says what to do.
            raise ModelLoadError(str(error)) from error
    return _classify(text)


def check_spec(name: str, spec: str | os.PathLike[str]) -> None:
    """Raise `ModelSpecError` (naming the argument `name`) if `spec` cannot name a model; loads nothing."""
    try:
        text = _spec_text(spec)
        if text not in DEFAULT_SPECS:
            _classify(text)
    except ModelSpecError as error:
        raise ModelSpecError(f"{name}: {error}") from None


def _spec_text(spec: str | os.PathLike[str]) -> str:
    if not isinstance(spec, str | os.PathLike):
        raise ModelSpecError(
            f"a model spec is a str or a path (a hub id, a folder or a .gguf file), got {type(spec).__name__}"
        )
    text = os.fspath(spec)
    if not isinstance(text, str) or not text.strip():
        raise ModelSpecError(
            "the model spec is empty; give a hub id, a model folder, a .gguf file, or 'default-target' / "
            "'default-draft'"
        )
    return text


def _classify(text: str) -> tuple[str, Any]:
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            ggufs = sorted(p.name for p in path.glob("*.gguf"))
            hint = f" It holds {', '.join(ggufs)}: pass that file instead." if ggufs else ""
            raise ModelSpecError(
                f"{path} is a folder but has no config.json, so it is not a Hugging Face model folder "
                f"(one written by save_pretrained).{hint}"
            )
        return "folder", path
    if path.is_file():
        if not is_gguf_file(path):
            raise ModelSpecError(
                f"{path} is not a GGUF file (it does not start with the magic bytes 'GGUF'). Pass a "
                f"GGUF model file, a model folder with config.json, or a Hugging Face hub id."
            )
        return "gguf", path
    if path.exists():
        raise ModelSpecError(f"{path} is neither a regular file nor a folder.")
    if _looks_like_path(text):
        raise ModelSpecError(
            f"{path} does not exist. Check the path (a .gguf file or a model folder), or use "
            f"'default-target' / 'default-draft' for the built-in pair."
        )
    return "hub", text


def _looks_like_path(text: str) -> bool:
    return (
        text.lower().endswith(".gguf")
        or text.startswith((".", "~", "/", os.sep))
        or (os.altsep is not None and os.altsep in text)
        or not _HUB_ID.match(text)
    )


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


# --- GGUF files and their conversion cache ----------------------------------------------------


def content_fingerprint(path: str | os.PathLike[str]) -> str:
    """A sha256 over a GGUF file's size, its first MiB and 32 blocks of 64 KiB spread evenly over the rest.

    Reads about 3 MiB whatever the file's size (a full sha256 of a 1 GB file costs
    seconds on every load, more than the cache saves); files of up to 3 MiB are
    hashed whole. Why that is enough to tell one model file from another: the
    first MiB holds the GGUF header (architecture, hyperparameters, the start of
    the tokenizer, tensor names, shapes, types and offsets), so any two files
    that differ there differ here; two different models with identical headers
    (two fine-tunes or two quantizations of one architecture) differ in nearly
    every weight block, so each of the 33 sampled blocks tells them apart. What
    it cannot see is an edit of a few bytes that no sampled block covers, i.e.
    deliberate tampering, which a conversion cache does not defend against (the
    default pair is checked by its full sha256 instead).
    """
    path = Path(path)
    size = path.stat().st_size
    digest = hashlib.sha256(f"exactspec-gguf-fingerprint-v1 {size}\n".encode())
    with path.open("rb") as f:
        if size <= _FINGERPRINT_HEAD + _FINGERPRINT_BLOCKS * _FINGERPRINT_BLOCK:
            while chunk := f.read(_FINGERPRINT_HEAD):
                digest.update(chunk)
        else:
            digest.update(f.read(_FINGERPRINT_HEAD))
            span = size - _FINGERPRINT_HEAD - _FINGERPRINT_BLOCK
            for index in range(_FINGERPRINT_BLOCKS):
                # Evenly spaced from just after the head to the very end of the file.
                f.seek(_FINGERPRINT_HEAD + span * index // (_FINGERPRINT_BLOCKS - 1))
                digest.update(f.read(_FINGERPRINT_BLOCK))
    return digest.hexdigest()


def _content_key(path: Path) -> dict[str, Any]:
    """What identifies the content of `path`: its size and its verified sha256 or its fingerprint."""
    try:
        size = path.stat().st_size
        sha256 = stamped_sha256(path)
        if sha256:
            return {"size": size, "sha256": sha256}
        return {"size": size, "fingerprint": content_fingerprint(path)}
    except OSError as error:
        raise ModelLoadError(f"Could not read the GGUF file {path}: {error.strerror or error}") from error


def _conversion_entry(path: Path, cache_root: Path) -> Path:
    """Cache folder for conversions of this GGUF file, keyed by its content (`_content_key`).

    A verified sha256 (the default pair's stamp) is the key when there is one,
    else the content fingerprint; never the name, size or mtime alone.
    """
    content = _content_key(path)
    key = f"sha256-{content['sha256'][:16]}" if "sha256" in content else f"fp-{content['fingerprint'][:16]}"
    stem = re.sub(r"[^\w.-]+", "_", path.stem)
    return cache_root / _CONVERSION_CACHE / f"{stem}-{key}"


def _check_provenance(model_dir: Path, path: Path) -> None:
    """Raise unless the record beside a cached conversion says it was made from a file with this content."""
    record_path = model_dir / _PROVENANCE_FILE
    fix = f"Delete {model_dir.parent} and load again to convert {path} afresh."
    try:
        record = json.loads(record_path.read_text())
    except (OSError, ValueError) as error:
        raise ModelLoadError(
            f"The cached conversion {model_dir} has no readable provenance record {record_path.name} "
            f"({error}), so it cannot be trusted to be a conversion of {path}. {fix}"
        ) from error
    content = _content_key(path)
    known = {name: value for name, value in content.items() if isinstance(record, dict) and name in record}
    if (
        not isinstance(record, dict)
        or "size" not in known
        or len(known) < 2
        or any(record[name] != value for name, value in known.items())
    ):
        raise ModelLoadError(
            f"The cached conversion {model_dir} was not made from {path}: its provenance record says "
            f"{ {name: record.get(name) for name in content} if isinstance(record, dict) else record }, "
            f"the file has {content}. {fix}"
        )


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _load_gguf(
    path: Path, dtype: torch.dtype, cache_root: Path, progress: bool
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    entry = _conversion_entry(path, cache_root)
    tokenizer = _gguf_tokenizer(path, entry, progress)
    model_dir = entry / _dtype_name(dtype)
    if model_dir.is_dir():
        _check_provenance(model_dir, path)
        return _load_converted(model_dir, dtype, progress), tokenizer
    return _convert_gguf_model(path, model_dir, dtype, progress), tokenizer


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


def _gguf_tokenizer(path: Path, entry: Path, progress: bool) -> PreTrainedTokenizerBase:
    transformers = _transformers()
    tok_dir = entry / _TOKENIZER_DIR
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
    tmp = _staging_dir(tok_dir)
    try:
        tokenizer.save_pretrained(str(tmp))
        reloaded = transformers.AutoTokenizer.from_pretrained(str(tmp), local_files_only=True)
        _check_same_tokenizer(tokenizer, reloaded, path)
    except OSError as error:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _cache_failure(tmp, error) from error
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _publish(tmp, tok_dir)
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

    tmp = _staging_dir(model_dir)
    try:
        _save_dense(gguf_model, tmp, dtype, path)
    except OSError as error:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _cache_failure(tmp, error) from error
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    del gguf_model
    _publish(tmp, model_dir)

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
    save_file(tensors, str(folder / _WEIGHTS_FILE), metadata={"format": "pt"})
    (folder / _WEIGHTS_FILE).chmod(0o644)  # safetensors writes it owner-only

    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = [type(model).__name__]
    config.dtype = dtype
    config.save_pretrained(str(folder))
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(str(folder))
    st = source.stat()
    content = _content_key(source)
    provenance = {
        "source": str(source.resolve()),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "sha256": content.get("sha256"),
        "fingerprint": content.get("fingerprint"),
        "dtype": _dtype_name(dtype),
        "transformers": _transformers().__version__,
        "torch": torch.__version__,
    }
    (folder / _PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2) + "\n")


def _probe_ids(vocab_size: int) -> torch.Tensor:
    # Ids spread over the whole vocabulary, so every region of the embedding is read.
    return (torch.arange(8) * (vocab_size // 8) + 7).clamp(max=vocab_size - 1).unsqueeze(0)


@torch.inference_mode()
def _probe_logits(model: PreTrainedModel, ids: torch.Tensor) -> torch.Tensor:
    return model(ids, use_cache=False).logits


def _staging_dir(final: Path) -> Path:
    """A fresh folder beside `final` to build in (`artefacts.staging`), or one clear error."""
    try:
        return staging_folder(final)
    except OSError as error:
        raise _cache_failure(final.parent, error) from error


def _cache_failure(path: Path, error: OSError) -> ModelLoadError:
    """One clear message for a filesystem failure in the conversion cache: the path, why, and the fix."""
    if isinstance(error, FileExistsError | NotADirectoryError):
        why = "a regular file stands where a folder of that path should be"
    elif error.errno == 28:  # ENOSPC
        why = "the disk is full"
    else:
        why = error.strerror or str(error)
    return ModelLoadError(
        f"Cannot write the model conversion cache at {path} ({why}). Make it a writable folder with free "
        f"space (a 1.5B model needs about 3 GB), or pass --cache-dir (or set EXACTSPEC_CACHE) to another "
        f"folder."
    )


def _publish(tmp: Path, final: Path) -> None:
    """Move a finished folder into place atomically; if another process won, keep theirs."""
    try:
        publish_folder(tmp, final)
    except OSError as error:
        raise _cache_failure(final.parent, error) from error
