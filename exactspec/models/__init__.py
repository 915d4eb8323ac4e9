"""Model backends: everything that turns token histories into next-token logits, and loads the models.

Modules: `base` (the `LanguageModel` protocol), `hf` (Hugging Face adapter,
KV cache per row), `loading` (hub ids, folders, GGUF files; the built-in pair's
files come from `exactspec.artefacts.default_pair`), `pair` (`ModelPair`: target + draft,
used by the API, the benchmark and the audit), `tokenizers` (tokenizer
agreement, end-of-generation ids).
"""

from exactspec.models.base import LanguageModel

__all__ = ["LanguageModel"]
