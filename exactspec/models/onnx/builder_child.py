"""onnxruntime-genai's model builder, run as `python -m onnxruntime_genai.models.builder` runs it, less one
pass that has nothing to do on an int4 checkpoint.

Before it saves, the builder hands the whole graph to onnxruntime's MatMulNBits quantizer
(`Model.to_nbits`), which first copies every weight into one ModelProto. From the int4 checkpoint that
`gguf_folder` writes, every product is already a MatMulNBits node, the quantizer skips them all, and the
copy only adds the weights a second time to the child's memory: the builder's export of the built-in
target peaked there at 4.93 GB of resident memory (1.85 GB of it the checkpoint's mapped file),
without the pass at 2.44 GB (the quiet SPR, sampled every 0.25 s). Where the graph has no node the
quantizer would quantize, this skips the pass; otherwise (a float32 folder) the builder's own pass
runs. The files written are the same either way (`tests/models/test_onnx_gguf_folder.py`)."""

from __future__ import annotations

import runpy

import onnxruntime_genai.models  # noqa: F401  (puts the builder's folder on sys.path, as -m does)
from builders import base  # type: ignore[import-not-found]  # the module object the builder itself uses

_quantize = base.Model.to_nbits


def _to_nbits(self):  # type: ignore[no-untyped-def]
    kinds = set(self.quant_attrs["op_types_to_quantize"])
    if not any(node.op_type in kinds for node in self.model.graph):
        return self.model
    return _quantize(self)


base.Model.to_nbits = _to_nbits

if __name__ == "__main__":
    runpy.run_module("onnxruntime_genai.models.builder", run_name="__main__", alter_sys=True)
