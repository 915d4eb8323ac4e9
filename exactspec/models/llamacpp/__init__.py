"""The llama.cpp backend's parts: the adapter (`model.LlamaCppModel`, a `models.rows_cache.RowCacheModel`
over one llama.cpp context whose sequences are the rows), the model, context and batches it calls
llama.cpp through (`context`), llama-cpp-python loaded once and the vocabulary check (`library`), and
the GGUF files its tiny grid models are written as (`gguf_writer`); registered in
`models/backends/llamacpp.py`."""
