"""The llama.cpp adapter (`LlamaCppModel`) on tiny float32 GGUF models written by `tests/tiny_gguf.py`.

Three references: the same GGUF scored from scratch (one no-cache pass per history through a
fresh sequence), the float64 Hugging Face model the GGUF was written from (an independent
implementation), and plain greedy decoding against speculative greedy on the llama.cpp target.
"""

from __future__ import annotations

import builtins
import random
from pathlib import Path

import pytest
import torch
from conftest import shared_prefix_schedule

from exactspec.foundations.rows import RowStart
from exactspec.models.llamacpp import model as llamacpp_module

SAME_MODEL_TOLERANCE = 1e-5
"""|cached block logits - from-scratch logits| on the same GGUF. llama.cpp's CPU kernels sum in an order
that may depend on the pass's token count and on the number of KV cells it spans (padded to 256),
so agreement is to float32 rounding of logits of size ~10 (a few 1e-6), not guaranteed bit for bit;
`test_block_logits_equal_from_scratch_logits` reports whether it was bitwise here."""

HF_TOLERANCE = 1e-4
"""|llama.cpp float32 logits - float64 HF logits| for the same weights: float32 rounding of every weight
and every sum over 2 layers (measured about 1e-6 .. 1e-5); a wrong rotary layout or position is > 1e-1."""


def test_missing_llama_cpp_names_the_extra_and_the_build_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_llama_cpp(name: str, *args: object, **kwargs: object) -> object:
        if name == "llama_cpp" or name.startswith("llama_cpp."):
            raise ImportError("No module named 'llama_cpp'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_llama_cpp)
    with pytest.raises(llamacpp_module.LlamaCppUnavailable, match=r"GGML_NATIVE=OFF.*exactspec\[llamacpp\]"):
        llamacpp_module.LlamaCppModel("/nonexistent.gguf")


pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the `llamacpp` extra)")
pytest.importorskip("transformers")

from tiny_gguf import tiny_gguf_pair, token_texts  # noqa: E402

from exactspec.checking.tiny_hf import FullForwardModel, TinyHFSpec  # noqa: E402
from exactspec.decoding.builder import build_engine  # noqa: E402
from exactspec.decoding.engine import DecodeConfig  # noqa: E402
from exactspec.decoding.strategy import Strategy  # noqa: E402
from exactspec.foundations.sampler import SeededSampler  # noqa: E402
from exactspec.foundations.settings import SamplingSettings  # noqa: E402
from exactspec.models.llamacpp.model import LlamaCppModel, check_vocabulary  # noqa: E402

SPEC = TinyHFSpec(family="llama", vocab_size=32, hidden_size=32, layers=2, init_std=0.2, seed=3)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, object, object]:
    return tiny_gguf_pair(SPEC, tmp_path_factory.mktemp("gguf"))


def open_model(path: Path, **options: object) -> LlamaCppModel:
    # float32 KV cells and no flash attention: llama.cpp's CPU flash attention rounds through float16
    # (2e-3 off the float64 model here, against 1e-6 without it).
    settings = {
        "eos_token_ids": {SPEC.eos_token_id},
        "kv_type": "f32",
        "flash_attention": False,
        "threads": 1,
        "context": 256,
    }
    return LlamaCppModel(path, **{**settings, **options})


def from_scratch(model: LlamaCppModel, history: list[int], k: int) -> torch.Tensor:
    """[k, V] logits of one no-cache pass over the whole history (a fresh sequence, freed after)."""
    model.clear_cache()
    logits = model.logits([history], k, rows=[999])[0]
    model.clear_cache()
    return logits


def history(seed: int, length: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(1, SPEC.vocab_size, (length,), generator=generator).tolist()


def test_logits_shape_dtype_and_vocabulary(files: tuple) -> None:
    target = open_model(files[0])
    assert target.vocab_size == SPEC.vocab_size and target.eos_token_ids == {SPEC.eos_token_id}
    out = target.logits([[1, 2, 3], [4, 5]], 2, rows=[7, 3])
    assert out.shape == (2, 2, SPEC.vocab_size) and out.dtype == torch.float32
    assert target.cached_rows == [7, 3] and target.cached_tokens(3) == [4, 5]
    assert [target.token_text(i) for i in range(SPEC.vocab_size)] == token_texts(SPEC.vocab_size, 0)


def test_block_logits_equal_from_scratch_logits(files: tuple) -> None:
    """Rollbacks, rows joining and leaving, a reused sequence id and a row the call does not name."""
    cached, scratch = open_model(files[0], max_rows=3), open_model(files[0])
    a, b, c = history(1, 20), history(2, 9), history(3, 14)
    calls = [  # (histories, k, rows)
        ([a[:12]], 1, [0]),  # prefill row 0
        ([a[:16]], 4, [0]),  # a block of 4 drafts
        ([a[:14] + [5, 6]], 3, [0]),  # two rejected: roll back to 14, feed 2, score 3
        ([a[:14] + [5, 6], b], 2, [0, 1]),  # row 1 joins with its prompt
        ([b + [7]], 1, [1]),  # only row 1: row 0's cells untouched
        ([a[:14] + [5, 6, 8, 9], b + [7, 1, 2]], 3, [0, 1]),
        ([a[:10]], 2, [0]),  # a deep rollback inside the prompt
        ("release", 0, [0]),
        ([c], 5, [2]),  # row 2 takes the freed sequence id
        ([c + [3], b + [7, 1, 2, 4]], 2, [2, 1]),
    ]
    worst, bitwise = 0.0, True
    for histories, k, rows in calls:
        if histories == "release":
            cached.release_rows(rows)
            assert rows[0] not in cached.cached_rows
            continue
        got = cached.logits(histories, k, rows=rows)  # [B, k, V]
        for row, h in enumerate(histories):
            want = from_scratch(scratch, h, k)
            worst = max(worst, float((got[row] - want).abs().max()))
            bitwise &= torch.equal(got[row], want)
    print(f"llama.cpp cached vs from scratch: max |diff| {worst:.3g}, bitwise {bitwise}")
    assert worst <= SAME_MODEL_TOLERANCE


def test_logits_match_the_float64_hf_model(files: tuple) -> None:
    """llama.cpp over the GGUF computes the HF model it was written from (layout, rotary, positions)."""
    target_path, _, hf_target, _ = files
    model = open_model(target_path)
    reference = FullForwardModel(hf_target, frozenset({0}), SPEC.vocab_size)
    h = history(4, 30)
    for k, h_used in ((6, h[:20]), (1, h[:21]), (3, h[:19] + [2, 2])):
        got = model.logits([h_used], k, rows=[0]).double()
        want = reference.logits([h_used], k)
        assert float((got - want).abs().max()) <= HF_TOLERANCE


def test_add_rows_starts_a_known_row_over(files: tuple) -> None:
    model = open_model(files[0])
    model.logits([history(5, 8)], 1, rows=[4])
    model.add_rows([RowStart(4)])
    assert model.cached_tokens(4) == []
    model.clear_cache()
    assert model.cached_rows == []


def test_too_many_rows_and_bad_ids_are_clear_errors(files: tuple) -> None:
    model = open_model(files[0], max_rows=2)
    with pytest.raises(RuntimeError, match="at most 2 rows"):
        model.logits([[1], [2], [3]], 1, rows=[0, 1, 2])
    with pytest.raises(ValueError, match="outside"):
        model.logits([[SPEC.vocab_size]], 1)


def test_vocabulary_check(files: tuple) -> None:
    model = open_model(files[0])

    class Tokenizer:
        def __init__(self, vocab: dict[str, int]) -> None:
            self.vocab = vocab

        def get_vocab(self) -> dict[str, int]:
            return self.vocab

    same = {text: i for i, text in enumerate(token_texts(SPEC.vocab_size, 0))}
    check_vocabulary(Tokenizer(same), model)
    swapped = {**same, "t1": 2, "t2": 1}
    with pytest.raises(ValueError, match="disagree on id 1"):
        check_vocabulary(Tokenizer(swapped), model)


FIXED = [  # a fixed gamma 4 (the planner may choose plain rounds)
    Strategy(adaptive_gamma=False),
    Strategy(verifier="block", adaptive_gamma=False),
    Strategy(drafter="ngram", adaptive_gamma=False),
]


@pytest.mark.parametrize("strategy", FIXED)
def test_speculative_greedy_equals_plain_greedy(files: tuple, strategy: Strategy) -> None:
    target_path, draft_path, _, _ = files
    target, draft = open_model(target_path), open_model(draft_path)
    prompts = [history(6, 5), history(7, 11), [1, 2, 1, 2, 1]]
    config = DecodeConfig(gamma=0, max_new_tokens=24, settings=SamplingSettings(temperature=0.0))
    plain = build_engine(target, draft, strategy, 0).generate(prompts, config, SeededSampler(seed=0))
    config = DecodeConfig(gamma=4, max_new_tokens=24, settings=SamplingSettings(temperature=0.0))
    fast = build_engine(target, draft, strategy, 4).generate(prompts, config, SeededSampler(seed=0))
    assert [s.generated for s in fast] == [s.generated for s in plain]
    assert sum(len(s.generated) for s in plain) > 24  # EOS did not end every row at once


def fed_tokens(model: LlamaCppModel, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that gets the number of tokens each of the model's `llama_decode` batches of feeds took."""
    counts: list[int] = []
    original = model._decode

    def counting(feeds, k, out):  # type: ignore[no-untyped-def]
        counts.append(sum(len(tokens) for _, _, tokens in feeds))
        return original(feeds, k, out)

    monkeypatch.setattr(model, "_decode", counting)
    return counts


def test_a_row_takes_the_cells_of_a_prefix_a_live_row_holds(
    files: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shared prefixes: the second row feeds only what follows the first row's prompt, its logits are the
    from-scratch ones, and it keeps the cells when the first row leaves."""
    cached, scratch = open_model(files[0], max_rows=3), open_model(files[0])
    fed = fed_tokens(cached, monkeypatch)
    prompt = history(5, 12)
    first, second = prompt + [3, 4], prompt + [9, 9, 2]
    cached.logits([first], 1, rows=[0])
    assert cached.reusable_prefix(1, second) == len(prompt)
    got = cached.logits([second], 2, rows=[1])[0]
    assert fed[-1] == len(second) - len(prompt) and cached.shared_tokens == len(prompt)
    assert float((got - from_scratch(scratch, second, 2)).abs().max()) <= SAME_MODEL_TOLERANCE
    cached.release_rows([0])  # row 0's sequence is freed; the cells row 1 shares stay
    later = second + [5, 6]
    got = cached.logits([later], 1, rows=[1])[0]
    assert fed[-1] == 2 and float((got - from_scratch(scratch, later, 1)).abs().max()) <= SAME_MODEL_TOLERANCE


def test_rows_joining_in_one_call_share_their_common_prompt_and_sharing_can_be_off(
    files: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two rows joining in one call with one prompt: the first is filled with the prompt in a decode of its
    own, the second takes its cells, and the call's decode feeds one token each; with
    share_prefixes=False both prompts are computed, in the call's one decode, and so is a later row's."""
    scratch = open_model(files[0])
    prompt = history(6, 10)
    for share in (True, False):
        cached = open_model(files[0], max_rows=3, share_prefixes=share)
        fed = fed_tokens(cached, monkeypatch)
        histories = [prompt + [1], prompt + [2]]
        got = cached.logits(histories, 1, rows=[0, 1])
        assert fed == ([len(prompt), 2] if share else [2 * (len(prompt) + 1)])
        for row, h in enumerate(histories):
            assert float((got[row] - from_scratch(scratch, h, 1)).abs().max()) <= SAME_MODEL_TOLERANCE
        cached.logits([prompt + [3]], 1, rows=[2])
        assert fed[-1] == (1 if share else len(prompt) + 1)
        assert cached.shared_tokens == (2 * len(prompt) if share else 0)


def test_random_calls_over_rows_sharing_prompts_get_the_from_scratch_logits(files: tuple) -> None:
    """Rows join (several in one call), leave, roll back and decode at random over prompts drawn from
    three shared prefixes (`shared_prefix_schedule`): every call's logits are the from-scratch ones, and
    cells were shared."""
    cached, scratch = open_model(files[0], max_rows=4), open_model(files[0])
    prefixes = [history(7, 12), history(7, 6) + [2, 2], history(8, 9)]
    worst = 0.0
    for event, value in shared_prefix_schedule(random.Random(4), prefixes, SPEC.vocab_size, 30):
        if event == "leave":
            cached.release_rows([value])
        elif event == "call":  # a row joins at its first call
            rows, k, histories = value
            got = cached.logits([histories[r] for r in rows], k, rows=rows)
            for b, row in enumerate(rows):
                worst = max(worst, float((got[b] - from_scratch(scratch, histories[row], k)).abs().max()))
    assert worst <= SAME_MODEL_TOLERANCE
    assert cached.shared_tokens > 0
