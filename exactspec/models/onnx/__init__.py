"""The ONNX Runtime backend's parts: the adapter (`model.OnnxModel`), the per-row bookkeeping (`rows`) and
the export of a model to int4 ONNX with onnxruntime-genai's model builder (`export`)."""
