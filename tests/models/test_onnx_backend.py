"""The "onnx" backend: registered, says how to install what it lacks, and `exactspec generate --backend onnx`
runs on tiny model folders exported in this session (into the test's cache folder, never the user's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import (
    TOKENIZER_EOS_ID,
    TOKENIZER_VOCAB,
    skip_unless_kernels_are_invariant,
    tiny_causal_lm,
    tiny_tokenizer,
)

from exactspec.cli.common import EXIT_OK
from exactspec.cli.main import main
from exactspec.models.backends.registry import LoadSpec, backend, backends

PROMPT = "def f(x):"


def test_onnx_is_registered_and_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "onnx" in backends() and backend("onnx").options == frozenset({"threads", "batch_invariant"})
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime" else real(name, *a)
    )
    assert 'pip install -e ".[onnx]"' in (backend("onnx").unavailable() or "")


def test_auto_measures_onnx_for_models_it_can_export_before_they_are_exported(tmp_path: Path) -> None:
    """The first `--backend auto` run exports what it measures: a model folder or GGUF file is accepted
    with nothing exported yet, a hub id is not (the builder reads files)."""
    from exactspec.models.backends.auto import _candidates

    save_tiny(tmp_path / "target", 0)
    spec = LoadSpec(str(tmp_path / "target"), None, cache_dir=tmp_path / "cache")
    assert backend("onnx").accepts(spec) is None
    assert "onnx" in [name for _, name, _ in _candidates(spec)]
    assert not (tmp_path / "cache").exists()  # accepting exports nothing; measuring it does
    assert "neither" in (backend("onnx").accepts(LoadSpec("some/hub-id", None)) or "")


def test_describe_says_what_the_export_recipe_was(tmp_path: Path) -> None:
    """The bench's model record of an ONNX model comes from its export's provenance (int4, block size,
    accuracy level), not from a guess by class."""
    from types import SimpleNamespace

    from exactspec.models.onnx.export import PROVENANCE_FILE

    recipe = {
        "precision": "int4",
        "block_size": 32,
        "accuracy_level": 4,
        "algo": "k_quant",
        "mixed_precision": "",
    }
    (tmp_path / PROVENANCE_FILE).write_text(json.dumps({"recipe": recipe}))
    model = SimpleNamespace(folder=tmp_path, vocab_size=7, layers=2, hidden_size=64)
    facts = backend("onnx").describe(model)  # type: ignore[arg-type]
    assert facts.weights == "int4 ONNX (MatMulNBits, block 32, accuracy level 4, algo k_quant)"
    assert (facts.dtype, facts.vocab_size, facts.layers, facts.hidden_size) == ("float32", 7, 2, 64)


pytest.importorskip("onnxruntime")
pytest.importorskip("onnxruntime_genai")


def save_tiny(folder: Path, seed: int) -> Path:
    """A tiny Qwen2 folder with the suite's tokenizer; hidden size 64 (GroupQueryAttention's head size 16)."""
    model = tiny_causal_lm(
        vocab_size=len(TOKENIZER_VOCAB),
        seed=seed,
        initializer_range=0.2,
        eos_token_id=TOKENIZER_EOS_ID,
        tie_word_embeddings=False,
        hidden_size=64,
        intermediate_size=128,
    )
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, str]:
    """(target folder, draft folder, cache folder)."""
    root = tmp_path_factory.mktemp("onnx-cli")
    return str(save_tiny(root / "target", 0)), str(save_tiny(root / "draft", 1)), str(root / "cache")


@pytest.fixture(scope="module")
def exported(folders: tuple[str, str, str]) -> tuple[str, str, str]:
    """`folders` with the target and the draft exported to the cache by the default recipe, as a run with
    --backend onnx leaves them (each test that needs the export builds it, whatever ran before)."""
    from exactspec.models.onnx.export import DEFAULT_RECIPE, exported_model

    target, draft, cache = folders
    for source in (target, draft):
        exported_model(source, DEFAULT_RECIPE, cache_dir=cache)
    return folders


def generate(
    folders: tuple[str, str, str], capsys: pytest.CaptureFixture[str], *extra: str, draft: bool = True
) -> dict:
    target, draft_folder, cache = folders
    argv = ["generate", "--backend", "onnx", "--target", target, "--cache-dir", cache]
    argv += ["--draft", draft_folder] if draft else []
    argv += ["--no-progress", "--max-new-tokens", "12", "--json", *extra, PROMPT]
    assert main(argv) == EXIT_OK
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_generate_on_the_onnx_backend_is_plain_decoding_greedily(
    folders: tuple[str, str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Greedy output of the draft model's speculation and of the suffix drafter's are plain decoding's
    tokens (the ONNX model computes a block's logits as its one-token steps, to float32 rounding)."""
    plain = generate(folders, capsys, "--plain")
    assert plain["backend"] == "onnx" and plain["weights"] == "int4-b128-a4" and plain["gamma"] == 0
    assert len(plain["token_ids"]) >= 1
    with_draft = generate(folders, capsys, "--drafter", "model", "--gamma", "3", "--fixed-gamma")
    assert with_draft["statistics"]["proposed_tokens"] > 0
    assert with_draft["token_ids"] == plain["token_ids"]
    suffix = generate(folders, capsys, draft=False)  # the default drafter: suffix trees
    assert suffix["drafter"] == "suffix" and suffix["token_ids"] == plain["token_ids"]
    exports = list((Path(folders[2]) / "onnx-exported-v1").glob("*-int4-b128-a4-*"))
    assert len([e for e in exports if e.is_dir()]) == 2  # target and draft, exported once each


def test_auto_measures_onnx_once_it_is_exported(exported: tuple[str, str, str]) -> None:
    target, draft, cache = exported
    assert backend("onnx").accepts(LoadSpec(target, draft, cache_dir=cache)) is None


def test_the_audit_tiny_pair_is_run_by_onnx_runtime_with_its_reference() -> None:
    """`audit --tiny --backend onnx` reaches the registration's pair: two ONNX Runtime sessions over float32
    exports of the tiny modules (head size 16), and a reference session that scores as the target does."""
    from exactspec.audit.tiny import tiny_audit_pair
    from exactspec.models.onnx.model import OnnxModel

    tiny = tiny_audit_pair("onnx")
    target, reference = tiny.pair.target, tiny.reference
    assert tiny.pair.backend == "onnx" and isinstance(target, OnnxModel) and isinstance(reference, OnnxModel)
    assert target.hidden_size == 64 and reference.folder == target.folder
    history = [[5, 7, 11, 3]]
    assert (target.logits(history, 2) == reference.logits(history, 2)).all()


def test_the_reference_is_a_second_session_over_the_same_export(folders: tuple[str, str, str]) -> None:
    from exactspec.models.onnx.model import OnnxModel
    from exactspec.models.pair import ModelPair

    target, _, cache = folders
    pair = ModelPair.from_pretrained(target, None, backend="onnx", cache_dir=cache, progress=False, threads=1)
    reference = pair.reference
    assert isinstance(reference, OnnxModel) and reference is not pair.target
    assert reference.folder == pair.target.folder and reference.threads == 1  # type: ignore[attr-defined]
    ids = pair.tokenizer(PROMPT)["input_ids"]
    assert pair.target.logits([ids], 3).equal(reference.logits([ids], 3))
    assert pair.draft is None and pair.describe_backend() == "backend onnx"


def test_sessions_stop_spinning_after_each_run_only_where_the_drafter_runs_the_draft_model(
    folders: tuple[str, str, str],
) -> None:
    """Two sessions that take turns stop their threads spinning as each run returns (else each holds the
    cores the other's next run needs); a pair whose drafter runs no model keeps spinning, the faster
    setting for a lone session (docs/bench/onnx-spinning)."""
    from exactspec.models.backends.registry import Workload
    from exactspec.models.pair import ModelPair

    target, draft, cache = folders
    common = {"backend": "onnx", "cache_dir": cache, "progress": False, "threads": 1}
    drafting = Workload(drafter="model", draft_model=True)
    pair = ModelPair.from_pretrained(target, draft, workload=drafting, **common)
    assert pair.target.stop_spinning_after_run and pair.draft.stop_spinning_after_run  # type: ignore[union-attr]
    lone = ModelPair.from_pretrained(target, draft, workload=Workload(), **common)  # the suffix drafter
    assert not lone.target.stop_spinning_after_run  # type: ignore[attr-defined]
    assert not lone.draft.stop_spinning_after_run  # type: ignore[union-attr]


def test_generate_with_batch_invariant_exports_blocks_of_32_and_gives_plain_decodings_tokens(
    folders: tuple[str, str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """`--batch-invariant` on the command line: the pair is exported in blocks of 32 and run on the invariant
    graph, and the suffix drafter's greedy tokens are plain decoding's (sampled: test_onnx_invariant.py).
    Skipped where this CPU's kernels are not invariant on the export (the command refuses the mode there)."""
    from exactspec.models.onnx.export import INVARIANT_RECIPE, exported_model

    target, _, cache = folders
    skip_unless_kernels_are_invariant(exported_model(target, INVARIANT_RECIPE, cache_dir=cache))
    greedy = ("--temperature", "0", "--batch-invariant", "--max-new-tokens", "40")  # tiny models loop
    greedy += ("--logit-bias", f"{TOKENIZER_EOS_ID}=-100")  # every run is 40 tokens long
    plain = generate(folders, capsys, "--plain", *greedy, draft=False)
    assert plain["weights"] == "int4-b32-a4" and plain["gamma"] == 0
    # The suffix drafter at a fixed gamma: a planned one may find drafting does not pay on tiny models.
    defaults = generate(folders, capsys, *greedy, "--fixed-gamma", "--gamma", "4", draft=False)
    assert defaults["token_ids"] == plain["token_ids"] and len(plain["token_ids"]) == 40
    assert defaults["statistics"]["accepted_tokens"] > 0  # drafts were kept: not plain against plain


def test_batch_invariant_on_a_backend_without_the_mode_is_a_usage_error(
    folders: tuple[str, str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    target, _, cache = folders
    argv = ["generate", "--backend", "hf", "--target", target, "--cache-dir", cache, "--draft", "none"]
    assert main([*argv, "--batch-invariant", "--no-progress", PROMPT]) != EXIT_OK
    error = capsys.readouterr().err
    assert "--batch-invariant" in error and "onnx" in error and "Traceback" not in error
