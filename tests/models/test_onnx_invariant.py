"""The ONNX adapter's batch-invariant mode: a position's logits and a cell's keys and values are the same bits
however the work is cut, so speculative output is plain decoding's token for token.

References are computed in this test session: the same export fed one token at a time (for bits), and the
float64 module it was exported from (for the function). Both export recipes the mode can meet are checked:
float32 weights (the tiny models of the exactness grid) and int4 in blocks of 32 (`INVARIANT_RECIPE`, what
the built-in pair runs in the mode).

The mode needs ONNX Runtime's kernels for the weights to be invariant on this CPU (they are on the AVX-512
CPUs measured; an AVX2-only Zen 3 refused them): a test that runs the mode is skipped, with the refusal as
its reason, where the mode's load-time probe refuses the export (`skip_unless_kernels_are_invariant`).
ONNX Runtime chooses its kernel path by the CPU's instruction sets and has no setting that forces another,
so one CPU runs one path; the tests of the graph and of the refusal run everywhere.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from conftest import skip_unless_kernels_are_invariant

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxruntime_genai")

from exactspec.checking.tiny_hf import FullForwardModel, TinyHFSpec, tiny_hf_pair  # noqa: E402
from exactspec.decoding.builder import build_engine  # noqa: E402
from exactspec.decoding.engine import DecodeConfig  # noqa: E402
from exactspec.decoding.strategy import Strategy  # noqa: E402
from exactspec.foundations.costs import CostModel  # noqa: E402
from exactspec.foundations.rows import RowStart  # noqa: E402
from exactspec.foundations.sampler import SeededSampler  # noqa: E402
from exactspec.foundations.settings import SamplingSettings  # noqa: E402
from exactspec.models.onnx import invariant  # noqa: E402
from exactspec.models.onnx.export import FP32_RECIPE, INVARIANT_RECIPE  # noqa: E402
from exactspec.models.onnx.model import OnnxModel  # noqa: E402
from exactspec.models.onnx.tiny import HIDDEN_SIZE, exported_module  # noqa: E402

SPEC = TinyHFSpec(family="qwen2", vocab_size=5, seed=2, hidden_size=HIDDEN_SIZE)
"""The other ONNX tests' spec: its float32 export is made once per machine in the grid's folder."""
FLOAT32_TOLERANCE = 2e-5
"""The float32 export against the float64 module (as tests/models/test_onnx.py; measured about 5e-6)."""
LENGTH = 56


def _exports(recipe: object) -> tuple[Path, Path]:
    """(target, draft) exported by `recipe` in the grid's folder (named by weights and recipe)."""
    target, draft = tiny_hf_pair(SPEC)
    return (
        exported_module(target, SPEC.eos_token_id, recipe=recipe),  # type: ignore[arg-type]
        exported_module(draft, SPEC.eos_token_id, recipe=recipe),  # type: ignore[arg-type]
    )


def _invariant_exports(recipe: object) -> tuple[Path, Path]:
    """`_exports(recipe)`, the calling test skipped where this CPU's kernels are not invariant on them."""
    exports = _exports(recipe)
    for folder in exports:
        skip_unless_kernels_are_invariant(folder)
    return exports


@pytest.fixture(scope="module", params=[FP32_RECIPE, INVARIANT_RECIPE], ids=lambda r: r.name)
def exports(request: pytest.FixtureRequest) -> tuple[Path, Path]:
    return _exports(request.param)


@pytest.fixture(scope="module", params=[FP32_RECIPE, INVARIANT_RECIPE], ids=lambda r: r.name)
def folders(request: pytest.FixtureRequest) -> tuple[Path, Path]:
    """The exports of the mode's two recipes, where this CPU runs the mode on them."""
    return _invariant_exports(request.param)


def _model(folder: Path, **options: object) -> OnnxModel:
    settings: dict[str, object] = {"eos_token_ids": {0}, "threads": 2, "max_rows": 4, **options}
    return OnnxModel(folder, batch_invariant=True, **settings)  # type: ignore[arg-type]


def _history(seed: int, length: int = LENGTH) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, SPEC.vocab_size) for _ in range(length)]


@pytest.fixture(scope="module")
def one_at_a_time(folders: tuple[Path, Path]) -> torch.Tensor:
    """[LENGTH, V]: the logits of every position of `_history(0)`, each from a one-token pass."""
    model = _model(folders[0])
    history = _history(0)
    return torch.cat([model.logits([history[: n + 1]], 1)[0] for n in range(LENGTH)])


def test_the_variant_replaces_every_attention_and_is_told_positions_cells_and_visibility(
    exports: tuple[Path, Path],
) -> None:
    import onnx

    path = invariant.invariant_path(exports[0], "model.onnx", HIDDEN_SIZE // 4)
    graph = onnx.load(str(path), load_external_data=False).graph
    ops = {node.op_type for node in graph.node}
    assert "GroupQueryAttention" not in ops and {"ScatterND", "RotaryEmbedding", "FusedMatMul"} <= ops
    inputs = {value.name for value in graph.input}
    assert set(invariant.NEW_INPUTS) <= inputs and "attention_mask" not in inputs


def test_a_graph_without_group_query_attention_is_refused_by_name(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node("Relu", ["x"], ["y"])
    value = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    graph = helper.make_graph(
        [node], "g", [value], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])]
    )
    onnx.save(helper.make_model(graph), str(tmp_path / "model.onnx"))
    with pytest.raises(invariant.InvariantGraphError, match="no GroupQueryAttention"):
        invariant.invariant_path(tmp_path, "model.onnx", 16)


@pytest.mark.parametrize("k", [2, 3, 5, 8])
def test_k_token_passes_give_every_position_the_bits_of_one_token_passes(
    folders: tuple[Path, Path], one_at_a_time: torch.Tensor, k: int
) -> None:
    model, history = _model(folders[0]), _history(0)
    got, fed = [], 0
    while fed < LENGTH:
        width = min(k, LENGTH - fed)
        got.append(model.logits([history[: fed + width]], width)[0])
        fed += width
    assert torch.equal(torch.cat(got), one_at_a_time)


def test_rows_slots_and_batch_size_do_not_change_a_rows_bits(
    folders: tuple[Path, Path], one_at_a_time: torch.Tensor
) -> None:
    """The row of interest moves between slots and shares passes of 1 to 3 rows with rows of other lengths."""
    model, history = _model(folders[0]), _history(0)
    others = [_history(seed, 50) for seed in (1, 2)]
    model.add_rows([RowStart(7, others[0][:3]), RowStart(8, others[1][:3])])
    got = [model.logits([others[0][:20], history[:10], others[1][:31]], 4, rows=[7, 5, 8])[1]]
    model.release_rows([7])  # row 5 now lies apart from row 8: the next call gathers them
    got.append(model.logits([history[:15], others[1][:36]], 5, rows=[5, 8])[0])
    got.append(model.logits([history[:16]], 1, rows=[5])[0])
    assert torch.equal(torch.cat(got), one_at_a_time[6:16])


def test_prefill_chunks_shared_prefixes_and_growing_buffers_keep_the_bits(
    folders: tuple[Path, Path], one_at_a_time: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    from exactspec.models.onnx import model as onnx_model

    monkeypatch.setattr(onnx_model, "PREFILL_CHUNK", 7)
    monkeypatch.setattr(onnx_model, "MIN_CAPACITY", 8)  # the buffers double three times on the way
    model, history = _model(folders[0]), _history(0)
    model.prefill(1, history[:23])  # chunks of 7: 7 + 7 + 7 + 2
    assert torch.equal(model.logits([history[:30]], 3, rows=[1])[0], one_at_a_time[27:30])
    model.add_rows([RowStart(2, history[:40])])
    before = model.shared_tokens
    out = model.logits([history[:44]], 2, rows=[2])[0]  # its first 30 cells are copied from row 1's slot
    assert model.shared_tokens - before == 30
    assert torch.equal(out, one_at_a_time[42:44])


def test_the_invariant_graph_computes_the_models_function(folders: tuple[Path, Path]) -> None:
    if "fp32" not in folders[0].name:
        pytest.skip("int4 weights are a re-quantization: only the float32 export is the module's function")
    target, _ = tiny_hf_pair(SPEC)
    reference = FullForwardModel(target, frozenset({0}), SPEC.vocab_size)
    history = _history(3, 40)
    got = _model(folders[0]).logits([history], 40)[0]
    assert (got.double() - reference.logits([history], 40)[0]).abs().max() < FLOAT32_TOLERANCE


def test_rows_of_k_tokens_are_scored_in_one_pass(
    folders: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _model(folders[0])
    histories = [_history(seed, 20) for seed in range(4)]
    model.logits([h[:16] for h in histories], 1, rows=[0, 1, 2, 3])
    widths: list[tuple[int, int]] = []
    original = model._pass

    def counting(first_slot, ids, lengths, out=None, wanted=None):  # type: ignore[no-untyped-def]
        widths.append((len(ids), len(ids[0])))
        return original(first_slot, ids, lengths, out, wanted)

    monkeypatch.setattr(model, "_pass", counting)
    model.logits([h[:20] for h in histories], 4, rows=[0, 1, 2, 3])
    assert widths == [(4, 4)]  # 4 rows x 4 tokens, one pass


NO_EOS = {0: -50.0}  # rows run to max_new_tokens, so every case compares as many tokens
GREEDY = SamplingSettings(temperature=0.0, logit_bias=NO_EOS)
SAMPLED = SamplingSettings(temperature=0.7, logit_bias=NO_EOS)


@pytest.fixture(scope="module")
def int4_folders() -> tuple[Path, Path]:
    """(target, draft) in the mode's own recipe, int4 in blocks of 32, where this CPU runs the mode."""
    return _invariant_exports(INVARIANT_RECIPE)


@pytest.mark.parametrize(
    ("drafter", "settings", "adaptive"),
    [
        ("model", GREEDY, False),
        ("ngram", SAMPLED, False),
        ("suffix", GREEDY, True),
        ("suffix", SAMPLED, True),
    ],
    ids=["model-greedy-fixed", "ngram-T0.7-fixed", "suffix-greedy-adaptive", "suffix-T0.7-adaptive"],
)
def test_speculative_output_is_plain_decodings_token_for_token(
    int4_folders: tuple[Path, Path], drafter: str, settings: SamplingSettings, adaptive: bool
) -> None:
    """Greedy output equals plain decoding's for every drafter, seeded sampled output for the drafters whose
    draws are positioned (n-gram, suffix). A draft model's sampled rows keep their coins and residual draws
    on the row's sequential stream (docs/algorithm.md 5): their law is plain decoding's, their seeded
    tokens need not be, whatever the numerics."""
    prompts = [[1, 2, 3, 1, 2, 3, 1], [4, 3, 4, 3, 4], [2, 2]]
    config = DecodeConfig(gamma=3, max_new_tokens=24, settings=settings)
    folders = int4_folders
    draft = _model(folders[1]) if drafter == "model" else None
    strategy = Strategy(drafter, adaptive_gamma=adaptive)
    # Given costs under which drafting pays: the adaptive rows draft whatever this machine's passes cost.
    costs = CostModel.linear(0.1, 0.05, max_gamma=config.gamma)
    engine = build_engine(_model(folders[0]), draft, strategy, config.gamma, costs)
    speculative = [s.generated for s in engine.generate(prompts, config, SeededSampler(seeds=[3, 4, 5]))]
    plain_engine = build_engine(_model(folders[0]), None, Strategy(), 0)
    plain_config = DecodeConfig(gamma=0, max_new_tokens=24, settings=settings)
    plain = [
        s.generated for s in plain_engine.generate(prompts, plain_config, SeededSampler(seeds=[3, 4, 5]))
    ]
    assert speculative == plain
    # Drafts were scored (and, at a fixed gamma, kept): not plain against plain. An adaptive policy may
    # find that its drafts are rejected and stop after a few proposals.
    assert engine.metrics.proposed_tokens > 0
    assert adaptive or engine.metrics.accepted_tokens > 0


def test_a_served_requests_seeded_tokens_do_not_depend_on_the_load_or_on_drafting(
    int4_folders: tuple[Path, Path],
) -> None:
    """The server's session (continuous batching, prompt chunks of the server's size, shared prefixes,
    planned gamma) on the mode: one seeded request's tokens alone and among 15 concurrent others, with the
    defaults (planned gamma: whether it drafts depends on this machine's timings), a fixed gamma 4 (it
    drafts) and gamma 0, are the same six times."""
    from exactspec.api.session import Session, SessionConfig, TextRequest
    from exactspec.models.pair import ModelPair

    pair = ModelPair(
        None, _model(int4_folders[0], max_rows=16), None, None, None, weights="int4", backend="onnx"
    )
    config = SessionConfig(max_batch=16, prefill_chunk=8)
    session = Session(pair, config, sampler=SeededSampler(0), raise_round_errors=True)
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
    others = [
        TextRequest(_history(seed, 6 + seed), settings=SAMPLED, max_tokens=12 + seed, seed=seed)
        for seed in range(15)
    ]
    outputs = []
    for gamma in (None, 4, 0):
        ask = TextRequest(prompt, settings=SAMPLED, max_tokens=24, seed=9, gamma=gamma)
        before = session.metrics.proposed_tokens
        alone = session.generate([ask]).choices[0].tokens
        crowded = session.generate([*others[:7], ask, *others[7:]]).choices[7].tokens
        outputs += [alone, crowded]
        if gamma == 4:  # drafts were scored: not plain against plain
            assert session.metrics.proposed_tokens > before
    assert len(outputs[0]) == 24 and all(tokens == outputs[0] for tokens in outputs)


def test_weights_whose_products_are_not_invariant_here_are_refused_at_load() -> None:
    """int4 in blocks of 64: ONNX Runtime computes a lone row another way than rows in pairs, so the load's
    check finds a block pass and one-token passes apart and says what the mode needs."""
    from exactspec.models.onnx.export import ExportRecipe

    target, _ = tiny_hf_pair(SPEC)
    folder = exported_module(target, SPEC.eos_token_id, recipe=ExportRecipe(block_size=64))
    with pytest.raises(invariant.KernelsNotInvariantHere, match="blocks of 32"):
        _model(folder)
    with pytest.raises(pytest.skip.Exception, match="not batch invariant on this CPU"):
        skip_unless_kernels_are_invariant(folder)  # what the tests of the mode do where it is refused


def test_an_idle_model_gives_its_grown_buffers_back_and_grows_them_again(folders: tuple[Path, Path]) -> None:
    model = _model(folders[0])
    small = sum(b.nbytes for b in (*model._keys, *model._values))
    histories = [_history(seed, 50) for seed in range(4)]
    before = model.logits(histories, 2, rows=[0, 1, 2, 3])
    assert sum(b.nbytes for b in (*model._keys, *model._values)) > small  # 4 slots now
    assert model.release_memory() == 0  # rows alive: their cells stay
    model.release_rows([0, 1, 2, 3])
    assert model.release_memory() > 0
    assert sum(b.nbytes for b in (*model._keys, *model._values)) == small
    assert torch.equal(model.logits(histories, 2, rows=[0, 1, 2, 3]), before)  # grown again, same bits
