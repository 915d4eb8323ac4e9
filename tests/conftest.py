"""Test-wide settings and the tiny models and tokenizer that many test modules share.

Toy models and tiny HF models make thousands of tiny tensor ops; with more
than one intra-op thread each op pays thread wake-up costs that dominate
(measured: torch.softmax on a [1, 4] float64 tensor took 4 ms with 2 threads
on a loaded 2-core machine, 0.02 ms with 1). Real-model speed is measured by
`exactspec bench`, never here.

The builders are plain functions (test modules import them with
`from conftest import ...`): most callers need a model at collection time or
under `functools.cache`, where a fixture cannot be used. The fake part packages
of a parted model (the built-in pair's PyPI layout) are built here too, because
tests of the artefacts and of model loading both fetch through them.

`grid_cases(owner)` hands each case of `exactspec verify`'s exact grid to exactly one test module,
so that the suite runs every case once (tests/checking/test_grid.py checks the split).
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch

from exactspec.artefacts.cache import CACHE_ENV
from exactspec.artefacts.default_pair import PartedModel

if TYPE_CHECKING:  # the grid (and scipy) load when a test module asks for its cases
    from exactspec.checking.grid import ExactCase

torch.set_num_threads(1)

# --- a temporary exactspec cache: the suite never reads or writes the user's ---------------------------

USER_CACHE = os.environ.get(CACHE_ENV)
"""$EXACTSPEC_CACHE as the suite found it (None: unset): what the opt-in slow tests use."""


def pytest_configure(config: pytest.Config) -> None:
    """Point $EXACTSPEC_CACHE at a fresh temporary folder for the whole run (in-process code, doctests and
    the commands tests start, which inherit the environment): measured costs, backend choices and
    converted models of the tiny test models go there, never into the user's cache."""
    folder = tempfile.mkdtemp(prefix="exactspec-test-cache-")
    config.stash[_CACHE_KEY] = folder
    os.environ[CACHE_ENV] = folder


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(_CACHE_KEY, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
        if USER_CACHE is None:
            os.environ.pop(CACHE_ENV, None)
        else:
            os.environ[CACHE_ENV] = USER_CACHE


_CACHE_KEY = pytest.StashKey[str]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Each test's cache, set before any of its fixtures is made (a module-scoped one included): the
    temporary one, or for the opt-in slow tests (`-m slow`) the user's, where the built-in pair they run
    lives (fetching and converting it again would take minutes)."""
    if item.get_closest_marker("slow") is None:
        os.environ[CACHE_ENV] = item.config.stash[_CACHE_KEY]
    elif USER_CACHE is None:
        os.environ.pop(CACHE_ENV, None)
    else:
        os.environ[CACHE_ENV] = USER_CACHE


MERGES = [("d", "e"), ("de", "f"), ("Ġ", "f"), ("r", "e"), ("re", "t")]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_level_vocab() -> list[str]:
    """Byte-level BPE symbols (GPT-2's byte-to-unicode map) for newline, printable ASCII and the two
    bytes of "é" (so partial UTF-8 still occurs), then merges, then special tokens (Qwen's layout).

    Leaving out the other bytes keeps random models' output mostly readable text.
    """
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    shifted = iter(range(256, 512))
    alphabet = {b: chr(b) if b in printable else chr(next(shifted)) for b in range(256)}
    kept = [ord("\n"), *range(ord(" "), ord("~") + 1), *"é".encode()]
    return [alphabet[b] for b in kept] + [a + b for a, b in MERGES] + SPECIALS


TOKENIZER_VOCAB = byte_level_vocab()
TOKENIZER_EOS_ID = TOKENIZER_VOCAB.index("<|endoftext|>")
TOKENIZER_IM_END_ID = TOKENIZER_VOCAB.index("<|im_end|>")


def tiny_tokenizer(vocab: list[str] = TOKENIZER_VOCAB) -> Any:
    """An in-memory byte-level BPE tokenizer with Qwen's special tokens and a chat template (no hub)."""
    import tokenizers
    import transformers

    backend = tokenizers.Tokenizer(
        tokenizers.models.BPE(vocab={t: i for i, t in enumerate(vocab)}, merges=MERGES)
    )
    backend.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = tokenizers.decoders.ByteLevel()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|endoftext|>", additional_special_tokens=SPECIALS[1:]
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_causal_lm(
    family: str = "qwen2",
    *,
    vocab_size: int,
    seed: int = 0,
    layers: int = 2,
    context: int = 256,
    **config: Any,
) -> Any:
    """A random causal LM in eval mode: hidden size 32, 4 query heads, 2 KV heads (grouped-query attention).

    `seed` seeds the global generator right before the weights are drawn, so the same arguments
    always give the same weights. `config` adds or overrides config fields (eos_token_id,
    initializer_range, attn_implementation, ...).
    """
    import transformers

    config_class, model_class = {
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    }[family]
    fields = dict(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=context,
    )
    fields.update(config)
    torch.manual_seed(seed)
    return model_class(config_class(**fields)).eval()


def add_weight_noise(model: Any, noise: float, seed: int) -> Any:
    """Add N(0, noise^2) to every weight of `model` in place, from a generator seeded `seed + 1000`
    (a draft that is the target plus a little noise is accepted often, but not always)."""
    generator = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(noise * torch.randn(parameter.shape, generator=generator))
    return model


# --- fake part packages of a parted model (exactspec.artefacts.default_pair) -----------------

PART_VERSION = "1.2.3"


def fake_parted_model(prefix: str, chunks: list[bytes], *, sha256: str | None = None) -> PartedModel:
    """A model whose parts `{prefix}1..{prefix}N` hold `chunks`; sha256 that of their join unless given."""
    joined = b"".join(chunks)
    return PartedModel(
        name=f"fake {prefix}",
        package_prefix=prefix,
        version=PART_VERSION,
        count=len(chunks),
        sha256=sha256 or hashlib.sha256(joined).hexdigest(),
        size=len(joined),
        file_name=f"{prefix}.gguf",
    )


def _part_metadata(dist: str) -> str:
    return f"Metadata-Version: 2.1\nName: {dist}\nVersion: {PART_VERSION}\n"


def write_part_wheels(
    model: PartedModel, chunks: list[bytes], folder: Path, indices: list[int] | None = None
) -> None:
    """Wheels laid out like the real parts: `<module>/data/partNN.bin` plus dist-info."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in indices or list(model.indices):
        dist = model.distribution(i)
        module = dist.replace("-", "_")
        info = f"{module}-{PART_VERSION}.dist-info"
        with zipfile.ZipFile(
            folder / f"{module}-{PART_VERSION}-py3-none-any.whl", "w", zipfile.ZIP_DEFLATED
        ) as whl:
            whl.writestr(f"{module}/__init__.py", "")
            whl.writestr(model.member(i), chunks[i - 1])
            whl.writestr(f"{info}/METADATA", _part_metadata(dist))
            whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
            whl.writestr(f"{info}/RECORD", "")


def install_parts(model: PartedModel, chunks: list[bytes], site: Path, indices: list[int]) -> None:
    """Parts as if pip-installed into `site` (module folder plus dist-info)."""
    for i in indices:
        dist = model.distribution(i)
        module = dist.replace("-", "_")
        part = site / model.member(i)
        part.parent.mkdir(parents=True, exist_ok=True)
        (site / module / "__init__.py").write_text("")
        part.write_bytes(chunks[i - 1])
        info = site / f"{module}-{PART_VERSION}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(_part_metadata(dist))


def install_parted_file(data: bytes, site: Path, parts: int = 2) -> PartedModel:
    """A parted model of `data` cut into `parts` parts, installed into `site` (put it on sys.path)."""
    step = -(-len(data) // parts)
    chunks = [data[i : i + step] for i in range(0, len(data), step)]
    model = fake_parted_model("exactspec-hardening-part", chunks)
    install_parts(model, chunks, site, list(model.indices))
    return model


def dead_pid() -> int:
    """The id of a process that has exited (what a killed run leaves in its temporary names)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


# --- tiny models in folders, and one local Ray instance (batch jobs and Ray Serve replicas) ----------


def save_tiny_model(folder: Path, seed: int) -> Path:
    """A tiny float32 model and the tiny tokenizer saved as a model folder (what --target/--draft load)."""
    model = tiny_causal_lm(
        vocab_size=len(TOKENIZER_VOCAB),
        seed=seed,
        initializer_range=0.2,
        eos_token_id=TOKENIZER_EOS_ID,
        tie_word_embeddings=False,
    )
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_model_folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """(target folder, draft folder): tiny float32 models another process can load by path."""
    root = tmp_path_factory.mktemp("tiny-folders")
    return str(save_tiny_model(root / "target", 0)), str(save_tiny_model(root / "draft", 1))


def skip_unless_kernels_are_invariant(folder: Path | str) -> None:
    """Skip the calling test where ONNX Runtime's kernels are not batch invariant on this CPU for the export
    in `folder`: the mode's own load-time probe (an 8-token pass against eight one-token passes) refuses it
    (`KernelsNotInvariantHere`; measured invariant on AVX-512 CPUs, refused on an AVX2-only Zen 3). ONNX
    Runtime picks its kernels by the CPU's instruction sets and has no setting that forces another path, so
    a test of the mode runs only on a CPU whose path is invariant."""
    from exactspec.models.onnx.invariant import KernelsNotInvariantHere
    from exactspec.models.onnx.model import OnnxModel

    try:
        OnnxModel(Path(folder), batch_invariant=True, eos_token_ids={0}, threads=2, max_rows=1)
    except KernelsNotInvariantHere as error:
        pytest.skip(f"ONNX Runtime's kernels are not batch invariant on this CPU: {error}")


def skip_if_refused_for_kernels(error: BaseException) -> None:
    """Skip the calling test when `error` (a load's failure, or what wraps it) is the batch-invariant mode's
    refusal of this CPU's kernels (`skip_unless_kernels_are_invariant`)."""
    from exactspec.models.onnx.invariant import KernelsNotInvariantHere

    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, KernelsNotInvariantHere):
            pytest.skip(f"ONNX Runtime's kernels are not batch invariant on this CPU: {cause}")
        cause = cause.__cause__


TINY_GGUF_CONTEXT = 2048
"""Cells of the tiny GGUF pairs' contexts in CLI tests: the bench prompts in the tiny tokenizer fit."""


@pytest.fixture(scope="session")
def tiny_gguf_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(target, draft): tiny float32 GGUF files, as many ids as the tiny tokenizer has (`tiny_gguf.py`)."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the `llamacpp` extra)")
    from tiny_gguf import tiny_gguf_pair

    from exactspec.checking.tiny_hf import TinyHFSpec

    vocab = len(TOKENIZER_VOCAB)
    spec = TinyHFSpec(family="llama", vocab_size=vocab, eos_token_id=TOKENIZER_EOS_ID, hidden_size=32, seed=2)
    target, draft, _, _ = tiny_gguf_pair(spec, tmp_path_factory.mktemp("tiny-gguf"))
    return target, draft


@pytest.fixture
def tiny_llamacpp_backend(monkeypatch: pytest.MonkeyPatch, tiny_gguf_files: tuple[Path, Path]) -> Any:
    """The "llamacpp" backend, loading any --target / --draft as the tiny GGUF files with the tiny tokenizer
    (the GGUF files' made-up vocabulary has no tokenizer of its own): the CLI's `--backend llamacpp`
    paths, from the flag to llama.cpp's passes, on models that load in milliseconds."""
    from dataclasses import replace

    from exactspec.models.backends import registry
    from exactspec.models.llamacpp.model import LlamaCppModel
    from exactspec.models.pair import ModelPair

    target_path, draft_path = tiny_gguf_files

    def load(spec: Any) -> ModelPair:
        options = {"threads": spec.threads or 1, "context": TINY_GGUF_CONTEXT}
        options["eos_token_ids"] = {TOKENIZER_EOS_ID}
        target = LlamaCppModel(target_path, **options)
        draft = None if spec.draft is None else LlamaCppModel(draft_path, **options)
        pair = ModelPair(None, target, None, draft, tiny_tokenizer(), weights="gguf", backend="llamacpp")
        pair.source = {"backend": "llamacpp", "target": str(spec.target), "draft": str(spec.draft)}
        return pair

    real = registry.backend("llamacpp")
    monkeypatch.setitem(registry.BACKENDS._records, "llamacpp", replace(real, load=load))
    return real


@pytest.fixture(scope="session")
def ray_address() -> Any:
    """One local Ray instance for the test session (2 CPUs, no dashboard): its address, for drivers in
    other processes; this process stays connected. Skipped without Ray (the ray extra)."""
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[ray]')")
    import logging

    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


# --- trees of candidates (tests/models/test_tree_logits.py, test_llamacpp_tree.py) -------------------


def random_tree(rng: random.Random, vocab: int, max_nodes: int) -> tuple[list[int], list[int]]:
    """Random (tokens, parents) in topological order, no two siblings with the same token."""
    tokens: list[int] = []
    parents: list[int] = []
    for n in range(rng.randint(0, max_nodes)):
        parent = rng.randint(-1, n - 1)
        free = [t for t in range(vocab) if (t, parent) not in set(zip(tokens, parents, strict=True))]
        if free:
            tokens.append(rng.choice(free))
            parents.append(parent)
    return tokens, parents


def tree_batch(trees: list[tuple[list[int], list[int]]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """tokens [B, N], parents [B, N] (padding: token 1, parent -1), lengths [B] of per-row trees."""
    width = max(len(tokens) for tokens, _ in trees)
    tokens = torch.tensor([t + [1] * (width - len(t)) for t, _ in trees], dtype=torch.long)
    parents = torch.tensor([q + [-1] * (width - len(q)) for _, q in trees], dtype=torch.long)
    shape = (len(trees), width)
    return tokens.reshape(shape), parents.reshape(shape), torch.tensor([len(t) for t, _ in trees])


def place_logits(
    reference: Any, histories: list[list[int]], trees: list[tuple[list[int], list[int]]]
) -> list:
    """Per row, [lengths[b] + 1, V]: each place's history (root first) scored alone by `reference`."""
    from exactspec.foundations.trees import place_histories

    out = []
    for history, (tokens, parents) in zip(histories, trees, strict=True):
        places = place_histories(history, tokens, parents, len(tokens), len(tokens))
        out.append(torch.cat([reference.logits([place], 1)[:, 0] for place in places]))
    return out


def assert_place_logits(got: torch.Tensor, expected: list[torch.Tensor], atol: float) -> None:
    """got [B, N + 1, V] equals each row's expected places (padding places not compared)."""
    for b, row in enumerate(expected):
        torch.testing.assert_close(got[b, : row.shape[0]], row.to(got.dtype), atol=atol, rtol=0)


def tree_rounds(
    model: Any, reference: Any, scorer: Any, vocab: int, rounds: int, seed: int, atol: float
) -> None:
    """Rounds of random trees on 3 rows: score with `scorer` (tree_logits' signature), compare with
    `reference` place by place, keep a random root-to-node path plus one token; now and then a row
    leaves and a new row id joins with a fresh prompt."""
    from exactspec.foundations.trees import node_paths

    rng = random.Random(seed)
    histories = {row: [rng.randrange(vocab) for _ in range(rng.randint(1, 6))] for row in range(3)}
    next_row = 3
    for _ in range(rounds):
        rows = sorted(histories)
        trees = [random_tree(rng, vocab, 6) for _ in rows]
        tokens, parents, lengths = tree_batch(trees)
        got = scorer(model, [histories[r] for r in rows], tokens, parents, lengths, rows)
        assert_place_logits(got, place_logits(reference, [histories[r] for r in rows], trees), atol)
        for row, (row_tokens, row_parents) in zip(rows, trees, strict=True):
            kept = rng.choice([[], *node_paths(row_parents, len(row_tokens))])  # the accepted path, or none
            histories[row] += [row_tokens[n] for n in kept] + [rng.randrange(vocab)]
        if rng.random() < 0.3:  # a row leaves, another joins
            gone = rng.choice(rows)
            model.release_rows([gone])
            del histories[gone]
            histories[next_row] = [rng.randrange(vocab) for _ in range(rng.randint(1, 6))]
            next_row += 1


# --- which test module runs which case of the exact grid (exactspec.checking.grid) ------------

GRID_OWNERS = {
    "llamacpp": "checking/test_llamacpp_grid.py",
    "onnx": "checking/test_onnx_grid.py",
    "native": "checking/test_native_grid.py",
    "hf tree": "checking/test_adapter_grid.py",
    "hf": "checking/test_adapter_grid.py",
    "tree": "verifiers/test_tree.py",
    "suffix trees": "verifiers/test_tree.py",
    "planner": "decoding/test_planner.py",
    "adaptive": "decoding/test_gamma.py",
    "lookup": "drafters/test_ngram.py",
    "registered": "drafters/test_registry.py",
    "block": "verifiers/test_block.py",
    "quick": "checking/test_grid.py",
    "grammar": "checking/test_grammar_grid.py",
    "positioned": "checking/test_positioned.py",
}
"""Owner -> the test module (under tests/) that runs its cases with `grid_cases(owner)`."""


def grid_owner(case: ExactCase) -> str | None:
    """The one owner of a case (None: only the full `exactspec verify` runs it).

    The first rule that matches wins: the checks of the positioned draws, the backend (llama.cpp, the HF
    adapter with trees or chains), trees of candidates (toy tables, the suffix drafter's), the cost-aware
    scheduler case, adaptive
    gamma, the drafter (lookup and hybrid; the registry's other drafters), the verifier. What is left
    (token verification of a draft model, and the scheduler cases) is the quick grid's: the cases
    `exactspec verify --quick` runs (`ExactCase.quick`), which tests/cli/test_cli.py used to run
    through the command line.
    """
    from exactspec.checking.grid import (
        BackendCase,
        BackendTreeCase,
        PointMassCase,
        PositionedLawCase,
        TreeCase,
    )

    if isinstance(case, PositionedLawCase | PointMassCase):
        return "positioned"
    if isinstance(case, BackendCase):  # a backend's own cases: its trees apart where a module owns them
        tree_owner = f"{case.backend} tree"
        return tree_owner if isinstance(case, BackendTreeCase) and tree_owner in GRID_OWNERS else case.backend
    if isinstance(case, TreeCase):
        return "tree"
    if case.name.startswith("grammar"):
        return "grammar"
    if case.name.startswith("suffix trees"):
        return "suffix trees"
    if case.planned and case.schedule:
        return "planner"
    if case.strategy.adaptive_gamma:
        return "adaptive"
    if case.strategy.drafter in ("ngram", "hybrid"):
        return "lookup"
    if case.strategy.drafter != "model":
        return "registered"
    if case.strategy.verifier == "block":
        return "block"
    return "quick" if case.quick else None


def grid_cases(owner: str) -> list[ExactCase]:
    """The cases of `exact_grid()` that the test module `GRID_OWNERS[owner]` runs."""
    from exactspec.checking.grid import exact_grid

    if owner not in GRID_OWNERS:
        raise ValueError(f"unknown grid owner {owner!r}; one of {sorted(GRID_OWNERS)}")
    return [case for case in exact_grid() if grid_owner(case) == owner]


# --- protocols (what `isinstance` against a runtime-checkable protocol does not check) ------------


def assert_implements(instance: Any, protocol: type) -> None:
    """`instance` can stand wherever `protocol` is expected: every public member of the protocol (and of
    the protocols it extends) is there, and each method takes the protocol's parameters by the same
    names, kinds and positional order, optional where the protocol's are, with nothing else required.

    `isinstance(instance, protocol)` on a runtime-checkable protocol checks only that the names exist.
    """
    import inspect

    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    for base in protocol.__mro__:
        if not getattr(base, "_is_protocol", False) or base.__module__ == "typing":
            continue
        for name in {*vars(base), *getattr(base, "__annotations__", {})}:
            if name.startswith("_"):
                continue
            where = f"{type(instance).__name__}.{name} ({base.__name__})"
            assert hasattr(instance, name), f"{where} is missing"
            expected = inspect.getattr_static(base, name, None)
            if not inspect.isfunction(expected):
                continue  # an attribute or a property: being there is the contract
            wanted = list(inspect.signature(expected).parameters.values())[1:]  # without self
            got = inspect.signature(getattr(instance, name)).parameters
            for parameter in wanted:
                assert parameter.name in got, f"{where} takes no {parameter.name!r}"
                assert got[parameter.name].kind == parameter.kind, f"{where}: {parameter.name!r} kind"
                if parameter.default is not inspect.Parameter.empty:
                    assert got[parameter.name].default is not inspect.Parameter.empty, (
                        f"{where}: {parameter.name!r} must stay optional"
                    )
            names = [p.name for p in wanted if p.kind in positional]
            assert [p.name for p in got.values() if p.kind in positional][: len(names)] == names, where
            known = {p.name for p in wanted}
            extra = [p for n, p in got.items() if n not in known and p.kind not in variadic]
            assert all(p.default is not inspect.Parameter.empty for p in extra), f"{where} requires more"


# --- signals -----------------------------------------------------------------------------------------


@pytest.fixture
def sigint_not_ignored() -> Iterator[None]:
    """Children start with Ctrl-C's default action even when this process ignores SIGINT.

    A command started in the background by a non-interactive shell (`make test &`, `nohup`) ignores
    SIGINT, and an ignored signal stays ignored across exec: Python then installs no KeyboardInterrupt
    handler and the children below never see the interrupt (a test that ran the whole quick grid and
    failed). A handled signal is reset to its default by exec, so this process handles it meanwhile.
    """
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def shared_prefix_schedule(
    rng: random.Random, prefixes: list[list[int]], vocab: int, calls: int, max_rows: int = 4
) -> Iterator[tuple[str, Any]]:
    """Random work for an adapter's per-row cache over prompts that share prefixes: yields ("leave", row),
    ("join", (row, prompt)) and ("call", (rows, k, histories)), histories being every live row's tokens
    (rows join with a random cut of a prefix plus one token, grow by k to k + 1 tokens a call, and are
    rolled back 2 tokens now and then). The caller releases, adds and scores as told."""
    histories: dict[int, list[int]] = {}
    next_row = 0
    for _ in range(calls):
        if len(histories) >= max_rows or (histories and rng.random() < 0.25):
            gone = rng.choice(sorted(histories))
            del histories[gone]
            yield "leave", gone
        while len(histories) < 2 or (len(histories) < max_rows and rng.random() < 0.35):
            histories[next_row] = rng.choice(prefixes)[: rng.randint(3, 12)] + [rng.randrange(1, vocab)]
            yield "join", (next_row, list(histories[next_row]))
            next_row += 1
        rows = rng.sample(sorted(histories), rng.randint(1, len(histories)))
        k = rng.choice([1, 1, 2])
        for row in rows:
            if len(histories[row]) > 4 and rng.random() < 0.3:
                histories[row] = histories[row][:-2]
            histories[row] += [rng.randrange(1, vocab) for _ in range(rng.randint(k, k + 1))]
        yield "call", (rows, k, histories)
