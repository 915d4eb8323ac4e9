"""The transformers backend's parts: the adapter (`model.HFLanguageModel`, a `models.rows_cache.RowCacheModel`
with one KV cache row per row id), its slot bookkeeping (`slots`), what it reads of a transformers module
(`modules`), the grouped-query CPU attention (`attention`) and two-row linears (`two_rows`) it switches
in, and the packed int4 / int8 weights (`packed`, `gguf_int4`); registered in `models/backends/hf.py`."""
