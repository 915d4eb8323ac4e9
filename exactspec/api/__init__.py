"""The Python API: `SpeculativeDecoder` loads a pair once, then generates or streams text."""

from exactspec.api.decoder import Completion, GenerationOutput, SpeculativeDecoder, StreamEvent

__all__ = ["Completion", "GenerationOutput", "SpeculativeDecoder", "StreamEvent"]
