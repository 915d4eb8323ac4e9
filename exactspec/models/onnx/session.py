"""Opening an exported folder's graph in ONNX Runtime: which graph file, the session options, the names.

Three graphs can run an export: the builder's (`model.onnx`), its `logits_from` variant (prefill passes
skip the output layer; used whenever it can be written and loaded), and the invariant variant of that
(`invariant`: every position's result independent of how the pass is cut), which `batch_invariant`
asks for and which must load: a caller that asked for invariance never silently runs without it.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from exactspec.models.onnx.logits_from import variant_path

INSTALL_HINT = 'pip install -e ".[onnx]" (onnxruntime and onnxruntime-genai\'s model builder, pinned)'
CACHE_LINE = 64


class OnnxUnavailable(ImportError):
    """onnxruntime is not installed; the message says how to install it."""


def available() -> bool:
    """True when onnxruntime can be imported."""
    return importlib.util.find_spec("onnxruntime") is not None


def default_threads() -> int:
    """The cores this process may run on (ONNX Runtime's intra-op threads)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def onnxruntime() -> Any:
    """The onnxruntime module, or `OnnxUnavailable` saying how to install it."""
    try:
        import onnxruntime
    except ImportError as error:
        raise OnnxUnavailable(
            f"the ONNX backend needs onnxruntime, which is not installed: {INSTALL_HINT}"
        ) from error
    return onnxruntime


@dataclass(frozen=True)
class SessionChoice:
    """The session that runs an export, and which graph it runs."""

    session: Any
    logits_from: bool
    """Whether the graph takes `logits_from` (prefill passes skip the output layer)."""
    invariant: bool
    """Whether the graph is the invariant variant (`feeds.invariant_feeds` inputs)."""


def open_session(
    folder: Path,
    model_file: str,
    *,
    threads: int,
    spinning: bool,
    stop_spinning_after_run: bool,
    batch_invariant: bool,
    head_size: int,
) -> SessionChoice:
    """An ONNX Runtime CPU session over the best graph of `folder` (the module docstring)."""
    ort = onnxruntime()
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    if stop_spinning_after_run:
        options.add_session_config_entry("session.force_spinning_stop", "1")
    options.log_severity_level = 3  # errors only: ONNX Runtime warns about unused initializers otherwise

    def session(path: Path) -> Any:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    variant = variant_path(folder, model_file)  # prefill passes skip the output layer
    if batch_invariant:
        from exactspec.models.onnx.invariant import invariant_path

        base = model_file if variant is None else variant.name
        return SessionChoice(session(invariant_path(folder, base, head_size)), variant is not None, True)
    if variant is not None:
        try:
            return SessionChoice(session(variant), True, False)
        except Exception:  # ONNX Runtime refused the variant (its error types vary): run the builder's graph
            pass
    return SessionChoice(session(folder / model_file), False, False)


def aligned_zeros(shape: tuple[int, ...]) -> np.ndarray:
    """A zeroed float32 array of `shape` whose first element sits on a cache line (64 bytes).

    numpy's large arrays start 16 bytes into a page (the allocator's header), so every head's row of
    the cache (head_size float32) would straddle one more cache line than it fills and every 64-byte
    load of the attention kernel would span two lines.
    """
    count = int(np.prod(shape))
    raw = np.zeros(count + CACHE_LINE // 4, dtype=np.float32)
    skip = (-raw.ctypes.data % CACHE_LINE) // 4
    return raw[skip : skip + count].reshape(shape)


def io_names(decoder: dict[str, Any], layers: int) -> dict[str, str]:
    """The graph's input and output names, read from the genai config (matched by name, never by order:
    the session lists every present key before the values)."""
    inputs, outputs = decoder["inputs"], decoder["outputs"]
    names = {
        "input_ids": inputs["input_ids"],
        "attention_mask": inputs["attention_mask"],
        "logits": outputs["logits"],
    }
    for layer in range(layers):
        names[f"past.{layer}.key"] = inputs["past_key_names"] % layer
        names[f"past.{layer}.value"] = inputs["past_value_names"] % layer
        names[f"present.{layer}.key"] = outputs["present_key_names"] % layer
        names[f"present.{layer}.value"] = outputs["present_value_names"] % layer
    return names
