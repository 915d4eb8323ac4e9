"""The native backend's adapter (`models.native`): a position's logits are the same bits however the work is
cut (rows, tokens per pass, prefill passes, shared prefixes, trees), on every kernel path; its function is the
model's (the int4 export as ONNX Runtime runs it; the float module within int4 rounding)."""

from __future__ import annotations

import copy
import random
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from exactspec.checking.tiny_hf import TinyHFSpec, tiny_hf_pair  # noqa: E402
from exactspec.foundations.rows import RowStart  # noqa: E402
from exactspec.kernels.decoder import DecoderKernel  # noqa: E402
from exactspec.kernels.paths import FORCE_ENV, available_paths  # noqa: E402
from exactspec.models.native import model as native_model  # noqa: E402
from exactspec.models.native.forward import forward  # noqa: E402
from exactspec.models.native.model import NativeModel  # noqa: E402
from exactspec.models.native.modules import from_module  # noqa: E402
from exactspec.models.tree import path_tree_logits  # noqa: E402

VOCAB = 40
SPEC = TinyHFSpec(family="qwen2", vocab_size=VOCAB, seed=5, hidden_size=64)


@pytest.fixture(scope="module")
def weights():  # type: ignore[no-untyped-def]
    target, _ = tiny_hf_pair(SPEC)
    return from_module(target.float())


@pytest.fixture(params=available_paths())
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(FORCE_ENV, request.param)
    return str(request.param)


def _model(weights, **options) -> NativeModel:  # type: ignore[no-untyped-def]
    return NativeModel(weights, eos_token_ids={0}, **{"threads": 1, "max_rows": 6, **options})


def _history(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, VOCAB) for _ in range(length)]


def _one_token_passes(model: NativeModel, history: list[int], row: int = 0) -> torch.Tensor:
    """[len, V]: the logits after every prefix, each position fed alone (plain decoding's passes)."""
    model.release_rows([row])
    return torch.cat([model.logits([history[: n + 1]], 1, rows=[row])[0] for n in range(len(history))])


def test_a_block_pass_gives_each_position_its_one_token_bits(weights, path: str) -> None:  # type: ignore[no-untyped-def]
    history = _history(1, 30)
    steps = _one_token_passes(_model(weights), history)
    for threads in (1, 2, 3):
        model = _model(weights, threads=threads)
        assert torch.equal(model.logits([history], len(history), rows=[0])[0], steps)
        model.logits([history[:10]], 1, rows=[1])  # a cached prefix, then 20 tokens in one pass
        assert torch.equal(model.logits([history], 20, rows=[1])[0], steps[10:])


def test_every_pass_the_model_runs_gives_forwards_bits(weights, path: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The model's one-call passes (`kernels.decoder`) against `forward.forward` on a copy of the cache,
    over the plans the model builds: prompts cut into passes, several rows, one-token steps, a tree."""
    run = DecoderKernel.run
    tokens_checked = []

    def checked_run(self, cache, plan, threads=None, **options):  # type: ignore[no-untyped-def]
        twin = copy.deepcopy(cache)
        expected = forward(self.weights, twin, plan, threads)
        logits = run(self, cache, plan, threads, **options)
        assert torch.equal(logits, expected[:, : logits.shape[1]])
        assert torch.equal(cache.keys, twin.keys) and torch.equal(cache.values, twin.values)
        tokens_checked.append(plan.tokens.numel())
        return logits

    monkeypatch.setattr(DecoderKernel, "run", checked_run)
    monkeypatch.setattr(native_model, "PASS_TOKENS", 16)
    histories = [_history(seed, length) for seed, length in ((20, 33), (21, 9), (22, 17))]
    for threads in (1, 2, 3):
        model = _model(weights, threads=threads)
        model.logits(histories, 2, rows=[0, 1, 2])
        model.logits([h + [3] for h in histories], 1, rows=[0, 1, 2])
        tokens = torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0], [11, 0, 0, 0]])
        parents = torch.tensor([[-1, 0, 0, 1], [-1, 0, -1, -1], [-1, -1, -1, -1]])
        model.tree_logits(histories, tokens, parents, torch.tensor([4, 2, 1]), rows=[0, 1, 2])
        model.logits([histories[0] + [5, 6, 8]], 1, rows=[0])
    assert sum(tokens_checked) > 3 * (33 + 9 + 17)


def test_rows_sharing_a_pass_do_not_change_each_others_bits(weights) -> None:  # type: ignore[no-untyped-def]
    histories = [_history(seed, length) for seed, length in ((2, 12), (3, 25), (4, 7), (5, 18))]
    alone = [_one_token_passes(_model(weights), h)[-3:] for h in histories]
    model = _model(weights, threads=2)
    together = model.logits(histories, 3, rows=[10, 11, 12, 13])
    for b in range(len(histories)):
        assert torch.equal(together[b], alone[b])
    # Decoding on: the rows take turns and new rows join; every step still matches.
    extended = [h + [7, 8] for h in histories]
    again = model.logits(list(reversed(extended)), 2, rows=[13, 12, 11, 10])
    for b, h in enumerate(reversed(extended)):
        assert torch.equal(again[b], _one_token_passes(_model(weights), h)[-2:])


def test_prefill_cut_into_passes_changes_no_bit(weights, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    history = _history(6, 45)
    whole = _model(weights).logits([history], 4, rows=[0])
    monkeypatch.setattr(native_model, "PASS_TOKENS", 7)
    model = _model(weights)
    assert torch.equal(model.logits([history], 4, rows=[0]), whole)
    model.prefill(1, history[:-4])
    assert torch.equal(model.logits([history], 4, rows=[1]), whole)


def test_a_shared_prefix_is_copied_with_the_bits_it_would_be_computed_with(weights) -> None:  # type: ignore[no-untyped-def]
    prompt = _history(7, 20)
    model = _model(weights)
    model.logits([prompt + [3, 4]], 1, rows=[0])
    model.add_rows([RowStart(1, prompt + [5])])
    shared = model.logits([prompt + [5, 6]], 2, rows=[1])
    assert model.shared_tokens >= len(prompt)
    assert torch.equal(shared[0], _one_token_passes(_model(weights), prompt + [5, 6])[-2:])


def test_a_tree_scored_in_one_pass_equals_its_paths_and_the_chain_after_it(weights, path: str) -> None:  # type: ignore[no-untyped-def]
    histories = [_history(8, 9), _history(9, 14)]
    tokens = torch.tensor([[5, 6, 7, 8, 9], [11, 12, 13, 0, 0]])
    parents = torch.tensor([[-1, 0, 0, 1, -1], [-1, 0, 1, -1, -1]])
    lengths = torch.tensor([5, 3])
    model = _model(weights)
    one_pass = model.tree_logits(histories, tokens, parents, lengths, rows=[0, 1])
    by_paths = path_tree_logits(_model(weights), histories, tokens, parents, lengths, [0, 1])
    for b, n in enumerate(lengths.tolist()):
        assert torch.equal(one_pass[b, : n + 1], by_paths[b, : n + 1])
    # The next call takes a path down each tree: its cells are where a chain would have written them.
    nexts = [histories[0] + [5, 6, 8, 21], histories[1] + [11, 12, 13, 22]]
    after = model.logits(nexts, 2, rows=[0, 1])
    for b, h in enumerate(nexts):
        assert torch.equal(after[b], _one_token_passes(_model(weights), h)[-2:])


def _with_weights_of(module, weights):  # type: ignore[no-untyped-def]
    """`module` holding the native model's int4 weights, dequantized (float32)."""
    with torch.no_grad():
        for block, layer in zip(module.model.layers, weights.layers, strict=True):
            attention, mlp = block.self_attn, block.mlp
            q, k = attention.q_proj.out_features, attention.k_proj.out_features
            qkv, gate_up = layer.qkv.dequantize(), layer.gate_up.dequantize()
            attention.q_proj.weight.copy_(qkv[:q])
            attention.k_proj.weight.copy_(qkv[q : q + k])
            attention.v_proj.weight.copy_(qkv[q + k :])
            attention.o_proj.weight.copy_(layer.output.dequantize())
            mlp.gate_proj.weight.copy_(gate_up[: mlp.gate_proj.out_features])
            mlp.up_proj.weight.copy_(gate_up[mlp.gate_proj.out_features :])
            mlp.down_proj.weight.copy_(layer.down.dequantize())
        module.lm_head.weight.copy_(weights.lm_head.dequantize())
    return module


def test_the_native_function_is_the_modules_with_its_weights(weights) -> None:  # type: ignore[no-untyped-def]
    """The same function as transformers' module holding the same (dequantized) weights, within what int8
    activations round (measured 4% of the largest logit on this random model; a wrong rotary, bias or
    head layout is off by the logits' own size)."""
    target, _ = tiny_hf_pair(SPEC)
    reference_module = _with_weights_of(target.float(), weights)
    history = _history(10, 24)
    with torch.no_grad():
        reference = reference_module(torch.tensor([history])).logits[0]
    native = _model(weights).logits([history], len(history), rows=[0])[0]
    gap = (native - reference).abs().max() / reference.abs().max()
    assert gap < 0.08, gap
    assert (native.argmax(-1) == reference.argmax(-1)).float().mean() > 0.9


def test_memory_rows_and_context_are_checked(weights) -> None:  # type: ignore[no-untyped-def]
    model = _model(weights, max_rows=2)
    model.logits([_history(11, 60), _history(12, 30)], 1, rows=[0, 1])  # the cache grows to two slots
    assert model.release_memory() == 0  # rows live
    model.release_rows([0, 1])
    assert model.release_memory() > 0
    with pytest.raises(ValueError, match="context"):
        model.logits([[1] * (weights.shape.context_length + 1)], 1, rows=[0])
    with pytest.raises(RuntimeError, match="at most 2 rows"):
        model.logits([[1], [2], [3]], 1, rows=[0, 1, 2])
    assert model.logits([[1, 2]], 1, rows=[5]).shape == (1, 1, VOCAB)  # cleared after the failure, usable


def test_weights_read_from_an_int4_export_compute_what_onnx_runtime_computes() -> None:
    """`weights.load_exported` reads the builder's graph (fused q/k/v with its bias, gate and up joined,
    the rotary tables): the native model then gives ONNX Runtime's logits on the same export, to float32
    rounding of the same int8-activation products."""
    pytest.importorskip("onnxruntime_genai")
    from exactspec.models.native.weights import load_exported
    from exactspec.models.onnx.export import INVARIANT_RECIPE
    from exactspec.models.onnx.model import OnnxModel
    from exactspec.models.onnx.tiny import HIDDEN_SIZE, exported_module

    spec = TinyHFSpec(family="qwen2", vocab_size=5, seed=2, hidden_size=HIDDEN_SIZE)  # the ONNX tests' export
    target, _ = tiny_hf_pair(spec)
    folder = exported_module(target, spec.eos_token_id, recipe=INVARIANT_RECIPE)
    weights = load_exported(folder)
    history = [random.Random(13).randrange(5) for _ in range(40)]
    native = NativeModel(weights, eos_token_ids={0}, threads=1).logits([history], 8, rows=[0])
    onnx = OnnxModel(folder, eos_token_ids={0}, threads=1).logits([history], 8, rows=[0])
    assert (native - onnx).abs().max() < 1e-4
    steps = _one_token_passes(NativeModel(weights, eos_token_ids={0}, threads=1), history)
    assert torch.equal(native[0], steps[-8:])


def test_a_narrower_vocabulary_gives_the_first_columns_bits(weights) -> None:  # type: ignore[no-untyped-def]
    histories = [[t % (VOCAB - 7) for t in _history(seed, length)] for seed, length in ((30, 12), (31, 5))]
    whole = _model(weights).logits(histories, 3, rows=[0, 1])
    narrow = _model(weights, vocab_size=VOCAB - 7)
    assert torch.equal(narrow.logits(histories, 3, rows=[0, 1]), whole[..., : VOCAB - 7])
    tokens, parents = torch.tensor([[5, 6], [7, 0]]), torch.tensor([[-1, 0], [-1, -1]])
    trees = _model(weights).tree_logits(histories, tokens, parents, torch.tensor([2, 1]), rows=[0, 1])
    narrow_trees = narrow.tree_logits(histories, tokens, parents, torch.tensor([2, 1]), rows=[0, 1])
    assert torch.equal(narrow_trees[0], trees[0, :, : VOCAB - 7])
    assert torch.equal(narrow_trees[1, :2], trees[1, :2, : VOCAB - 7])


def test_the_padding_of_a_narrower_tree_is_finite(weights) -> None:  # type: ignore[no-untyped-def]
    """A row whose tree has fewer nodes than the call's width gets finite entries past its nodes (the
    transforms run over every entry and refuse NaN)."""
    tokens, parents = torch.tensor([[5, 6, 7], [8, 0, 0]]), torch.tensor([[-1, 0, 0], [-1, -1, -1]])
    for _ in range(5):  # fresh memory each time
        out = _model(weights).tree_logits([[1, 2], [3]], tokens, parents, torch.tensor([3, 1]), rows=[0, 1])
        assert torch.isfinite(out[1, 2:]).all() and torch.equal(out[1, 2:], torch.zeros_like(out[1, 2:]))


def test_an_export_whose_data_file_is_cut_short_is_refused_by_name(tmp_path: Path) -> None:
    """An initializer past the end of the external data file (an interrupted copy) is an UnsupportedGraph
    naming the file, not a short array packed into wrong weights."""
    pytest.importorskip("onnxruntime_genai")
    from exactspec.models.native.weights import UnsupportedGraph, load_exported
    from exactspec.models.onnx.export import INVARIANT_RECIPE
    from exactspec.models.onnx.tiny import HIDDEN_SIZE, exported_module

    spec = TinyHFSpec(family="qwen2", vocab_size=5, seed=2, hidden_size=HIDDEN_SIZE)
    target, _ = tiny_hf_pair(spec)
    folder = tmp_path / "export"
    shutil.copytree(exported_module(target, spec.eos_token_id, recipe=INVARIANT_RECIPE), folder)
    (data,) = folder.glob("*.onnx.data")
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    with pytest.raises(UnsupportedGraph, match=data.name):
        load_exported(folder)
