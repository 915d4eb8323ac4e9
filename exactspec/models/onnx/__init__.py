"""The ONNX Runtime backend's parts: the adapter (`model.OnnxModel`, a `models.rows_cache.RowCacheModel`),
where each row's cells live (`rows`), the export of a model to int4 ONNX with onnxruntime-genai's model
builder (`export`) and the tiny float32 exports its grid cases and `audit --tiny` run (`tiny`);
registered in `models/backends/onnx.py`."""
