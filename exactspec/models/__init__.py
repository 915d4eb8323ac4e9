"""Model backends: everything that turns token histories into next-token logits, and loads the models.

Modules: `base` (the `LanguageModel` protocol), `rows_cache` (the per-row cache bookkeeping adapters
share), one folder per backend with its adapter and helpers (`hf/`, `llamacpp/`, `onnx/`) and their
registrations (`backends/`), `loading` (hub ids, folders, GGUF files and "default-target" /
"default-draft" into transformers models, asking `exactspec.artefacts` for the
files: the built-in pair, the GGUF conversion cache), `pair` (`ModelPair`:
target + draft, used by the API, the benchmark and the audit), `tokenizers`
(tokenizer agreement, end-of-generation ids).
"""

from exactspec.models.base import LanguageModel

__all__ = ["LanguageModel"]
