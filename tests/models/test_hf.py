"""HFLanguageModel: cached, batched, rolled-back logits equal a plain full forward pass.

Every check compares the adapter with the simplest thing that is obviously
right: one no-cache forward over the whole history of one row.
"""

from __future__ import annotations

import contextlib
import functools
import random
from collections.abc import Iterator

import pytest
import torch

transformers = pytest.importorskip("transformers")

from conftest import tiny_causal_lm  # noqa: E402

from exactspec.models.base import LanguageModel  # noqa: E402
from exactspec.models.hf.model import HFLanguageModel  # noqa: E402

VOCAB = 97
EOS = 3
# fp32 on CPU: a cached k-token forward and a full forward agree to ~1e-7.
ATOL = 1e-5


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """Tiny matmuls run fastest on one thread; on a busy machine more threads only contend."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@functools.cache
def tiny_model(
    family: str = "qwen2", attn: str = "sdpa", dtype: torch.dtype = torch.float32, eos: int | None = EOS
) -> transformers.PreTrainedModel:
    """A random 2-layer model with grouped-query attention (4 query heads, 2 KV heads)."""
    model = tiny_causal_lm(family, vocab_size=VOCAB, seed=0, eos_token_id=eos, attn_implementation=attn)
    return model.to(dtype)


def reference(model: transformers.PreTrainedModel, history: list[int], k: int) -> torch.Tensor:
    """[k, V] logits of a no-cache forward over the whole history."""
    with torch.inference_mode():
        return model(input_ids=torch.tensor([history])).logits[0, -k:].float()


@contextlib.contextmanager
def fed_shapes(model: transformers.PreTrainedModel) -> Iterator[list[tuple[int, ...]]]:
    """Record the [B, W] shape of input_ids of every forward call (to see what was recomputed)."""
    shapes: list[tuple[int, ...]] = []
    handle = model.register_forward_pre_hook(
        lambda module, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    try:
        yield shapes
    finally:
        handle.remove()


def test_protocol_and_defaults():
    model = tiny_model()
    lm = HFLanguageModel(model)
    assert isinstance(lm, LanguageModel)
    assert lm.vocab_size == VOCAB
    assert lm.eos_token_ids == frozenset({EOS})
    assert HFLanguageModel(model, eos_token_ids=[1, 2], vocab_size=50).eos_token_ids == frozenset({1, 2})


@pytest.mark.parametrize(
    ("family", "attn", "max_hole_fraction"),
    [("qwen2", "sdpa", 0.5), ("qwen2", "eager", 0.0), ("llama", "sdpa", 1.0)],
)
def test_random_extend_and_rollback_matches_full_forward(family, attn, max_hole_fraction):
    """Draft-like traffic: extend rows by 0..5 tokens, roll back by 0..5, score k = 1..4 positions."""
    model = tiny_model(family, attn)
    lm = HFLanguageModel(model, max_hole_fraction=max_hole_fraction)
    rng = random.Random(1)
    histories = [[rng.randrange(VOCAB) for _ in range(rng.randint(1, 9))] for _ in range(3)]
    for _ in range(25):
        for h in histories:
            rollback = rng.randint(0, min(5, len(h) - 1))
            del h[len(h) - rollback :]
            h.extend(rng.randrange(VOCAB) for _ in range(rng.randint(0, 5)))
        k = rng.randint(1, min(4, *(len(h) for h in histories)))
        out = lm.logits(histories, num_positions=k)
        assert out.shape == (3, k, VOCAB) and out.dtype == torch.float32
        for b, h in enumerate(histories):
            torch.testing.assert_close(out[b], reference(model, h, k), atol=ATOL, rtol=0)


def test_single_row_never_has_holes_and_never_recomputes_the_prompt():
    model = tiny_model()
    lm = HFLanguageModel(model)
    rng = random.Random(2)
    history = [rng.randrange(VOCAB) for _ in range(12)]
    with fed_shapes(lm.module) as shapes:  # the adapter runs its own copy of the module
        lm.logits([history])
        for _ in range(15):
            rollback = rng.randint(0, 4)
            extend = rng.randint(1, 4)
            del history[len(history) - rollback :]
            history.extend(rng.randrange(VOCAB) for _ in range(extend))
            k = rng.randint(1, 3)
            out = lm.logits([history], num_positions=k)
            # Only the new tokens (or the k requested ones) were fed, never the prompt.
            assert shapes[-1] == (1, max(extend, k))
            # Rollback is a crop: the cache holds exactly the history, every slot real.
            assert lm._valid.shape == (1, len(history)) and bool(lm._valid.all())
            torch.testing.assert_close(out[0], reference(model, history, k), atol=ATOL, rtol=0)


def test_batch_rows_equal_each_row_alone():
    model = tiny_model()
    rng = random.Random(3)
    histories = [[rng.randrange(VOCAB) for _ in range(n)] for n in (4, 11, 7)]
    batched = HFLanguageModel(model)
    alone = [HFLanguageModel(model) for _ in histories]
    for extend in [(0, 0, 0), (3, 1, 5), (1, 4, 2)]:
        for h, e in zip(histories, extend, strict=True):
            h.extend(rng.randrange(VOCAB) for _ in range(e))
        out = batched.logits(histories, num_positions=2)
        for b, h in enumerate(histories):
            single = alone[b].logits([h], num_positions=2)[0]
            torch.testing.assert_close(out[b], single, atol=ATOL, rtol=0)
            assert torch.equal(out[b].argmax(-1), single.argmax(-1))
        # Left-padding queries attend to nothing; what they leave in the masked slots must stay finite
        # (a NaN there would turn into NaN for the row: 0 attention weight times NaN is NaN).
        assert all(torch.isfinite(t).all() for keys, values, *_ in batched._cache for t in (keys, values))


def test_subset_of_rows_after_a_row_finishes():
    model = tiny_model()
    lm = HFLanguageModel(model)
    rng = random.Random(4)
    histories = {r: [rng.randrange(VOCAB) for _ in range(n)] for r, n in [(0, 5), (1, 9), (2, 3)]}
    with fed_shapes(lm.module) as shapes:  # the adapter runs its own copy of the module
        lm.logits(list(histories.values()))
        for live in ([0, 1, 2], [0, 2], [0, 2], [2], [2]):
            lm.release_rows(set(lm.cached_rows) - set(live))  # rows that finished leave the cache
            for r in live:
                histories[r].append(rng.randrange(VOCAB))
            out = lm.logits([histories[r] for r in live], rows=live)
            # Finished rows cost nothing: only the live rows' new tokens are fed.
            assert shapes[-1] == (len(live), 1)
            assert lm.cached_rows == live
            for b, r in enumerate(live):
                torch.testing.assert_close(out[b, 0], reference(model, histories[r], 1)[0], atol=ATOL, rtol=0)
        # A row id the cache does not hold joins beside row 2: row 2 is not recomputed.
        before = [kv[0].clone() for kv in lm.cached_kv(2)]
        histories[7] = [5, 6, 7]
        histories[2].append(9)
        out = lm.logits([histories[2], histories[7]], rows=[2, 7])
        # Row 7's prompt is prefilled on its own, then row 2 feeds its one new token: nobody is padded.
        assert shapes[-2:] == [(1, 3), (1, 1)]
        assert sorted(lm.cached_rows) == [2, 7]
        for b, r in enumerate([2, 7]):
            torch.testing.assert_close(out[b, 0], reference(model, histories[r], 1)[0], atol=ATOL, rtol=0)
        for old_keys, (keys, _) in zip(before, lm.cached_kv(2), strict=True):
            assert torch.equal(keys[:, : old_keys.shape[1]], old_keys)
        for r in (2, 7):
            fresh = HFLanguageModel(model)
            fresh.logits([histories[r]])
            for (keys, values), (fresh_keys, fresh_values) in zip(
                lm.cached_kv(r), fresh.cached_kv(0), strict=True
            ):
                torch.testing.assert_close(keys, fresh_keys, atol=1e-6, rtol=0)
                torch.testing.assert_close(values, fresh_values, atol=1e-6, rtol=0)
        histories[2].append(10)
        histories[7].append(11)
        out = lm.logits([histories[7], histories[2]], rows=[7, 2])
        assert shapes[-1] == (2, 1)
        for b, r in enumerate([7, 2]):
            torch.testing.assert_close(out[b, 0], reference(model, histories[r], 1)[0], atol=ATOL, rtol=0)


def test_rows_released_one_by_one_leave_the_cache_in_one_copy(monkeypatch: pytest.MonkeyPatch):
    """A scheduler releases the rows that finished in a round one call each. Before, each call copied
    the whole cache (and scanned every row): quadratic, 70 s for 3000 rows of tests/models/test_hf_engine.py.
    The rows are gone from `cached_rows` at once and leave the cache in one copy at the next call."""
    model = tiny_model()
    lm = HFLanguageModel(model)
    rng = random.Random(5)
    histories = [[rng.randrange(VOCAB) for _ in range(2 + r % 5)] for r in range(40)]
    lm.logits(histories)
    copies = []
    select = transformers.DynamicCache.batch_select_indices
    monkeypatch.setattr(
        transformers.DynamicCache,
        "batch_select_indices",
        lambda cache, indices: copies.append(len(indices)) or select(cache, indices),
    )
    live = [3, 17, 30]
    for row in range(40):
        if row not in live:
            lm.release_rows([row])
            assert row not in lm.cached_rows
            with pytest.raises(KeyError):
                lm.cached_kv(row)
    assert lm.cached_rows == live and copies == []
    for r in live:
        histories[r].append(rng.randrange(VOCAB))
    with fed_shapes(lm.module) as shapes:
        out = lm.logits([histories[r] for r in live], rows=live)
    assert copies == [len(live)] and shapes == [(len(live), 1)]
    for b, r in enumerate(live):
        torch.testing.assert_close(out[b, 0], reference(model, histories[r], 1)[0], atol=ATOL, rtol=0)
    lm.release_rows(live)
    assert lm.cached_rows == [] and lm._cache is None  # the last rows out free the cache at once


def test_rows_that_are_not_named_keep_their_cache_and_are_not_computed():
    """A call naming some of the cached rows (a drafter whose other rows stopped early, a prefill chunk)
    feeds only those; the others are set aside and keep their cache."""
    model = tiny_model()
    lm = HFLanguageModel(model)
    histories = [[1, 2, 3, 4], [5, 6], [7, 8, 9]]
    lm.logits(histories)
    histories[1] = histories[1] + [10, 12, 13]
    with fed_shapes(lm.module) as shapes:
        out = lm.logits([histories[1]], num_positions=3, rows=[1])
    assert shapes == [(1, 3)]  # row 1 alone: rows 0 and 2 were not fed padding
    torch.testing.assert_close(out[0, 2], reference(model, histories[1], 1)[0], atol=ATOL, rtol=0)
    assert sorted(lm.cached_rows) == [0, 1, 2]
    with fed_shapes(lm.module) as shapes:  # the adapter runs its own copy of the module
        histories = [h + [11] for h in histories]
        order = [2, 0, 1]  # any order
        out = lm.logits([histories[r] for r in order], rows=order)
        assert shapes[-1] == (3, 1)  # nobody was recomputed
    for j, r in enumerate(order):
        torch.testing.assert_close(out[j, 0], reference(model, histories[r], 1)[0], atol=ATOL, rtol=0)
    lm.release_rows([0, 1, 2])
    assert lm.cached_rows == [] and lm._cache is None


def test_rollback_leaves_the_cache_as_if_built_from_accepted_tokens():
    model = tiny_model()
    prompts = [[11, 12, 13, 14, 15, 16], [21, 22, 23]]
    drafts = [[31, 32, 33, 34], [41, 42, 43, 44]]
    accepted = [1, 3]  # row 0 rejects its 2nd draft token, row 1 its 4th
    corrections = [51, 52]
    lm = HFLanguageModel(model, max_hole_fraction=1.0)  # keep the holes: no compaction
    lm.logits([p + d for p, d in zip(prompts, drafts, strict=True)], num_positions=5)
    final = [p + d[:a] + [c] for p, d, a, c in zip(prompts, drafts, accepted, corrections, strict=True)]
    lm.logits(final)
    assert not bool(lm._valid.all())  # the rejected drafts left holes
    for b, history in enumerate(final):
        fresh = HFLanguageModel(model)
        fresh.logits([history])
        layers = zip(lm.cached_kv(b), fresh.cached_kv(0), strict=True)
        for (keys, values), (fresh_keys, fresh_values) in layers:
            assert keys.shape == fresh_keys.shape == (2, len(history), 8)  # [H_kv, n, D]
            torch.testing.assert_close(keys, fresh_keys, atol=1e-6, rtol=0)
            torch.testing.assert_close(values, fresh_values, atol=1e-6, rtol=0)


def test_compaction_frees_holes_and_keeps_results():
    model = tiny_model()
    lm = HFLanguageModel(model, max_hole_fraction=0.0)
    histories = [[1, 2, 3, 4, 5, 6, 7, 8], [9, 10]]
    lm.logits(histories)
    histories[0] = histories[0][:3] + [20]  # roll row 0 back far: its tail becomes holes
    histories[1] = histories[1] + [21, 22, 23]  # row 1 grows
    out = lm.logits(histories)
    # Compaction ran before the forward: the cache is as long as the longest kept row plus the new block.
    assert lm._valid.shape[1] <= max(len(h) for h in histories) + 3
    for b, h in enumerate(histories):
        torch.testing.assert_close(out[b, 0], reference(model, h, 1)[0], atol=ATOL, rtol=0)
    assert all(torch.isfinite(t).all() for kv in lm.cached_kv(0) for t in kv)


def test_greedy_loop_equals_generate():
    model = tiny_model("llama")
    lm = HFLanguageModel(model)
    prompt = [5, 17, 42, 8, 60]
    history = list(prompt)
    for _ in range(24):
        token = int(lm.logits([history])[0, -1].argmax())
        history.append(token)
        if token in lm.eos_token_ids:
            break
    with torch.inference_mode():
        expected = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False,
            max_new_tokens=24,
            eos_token_id=EOS,
            pad_token_id=0,
        )[0].tolist()
    assert history == expected


def test_bfloat16_model_returns_float32_and_vocab_prefix():
    model = tiny_model()
    lm = HFLanguageModel(model, vocab_size=90)
    out = lm.logits([[1, 2, 3]], num_positions=2)
    assert out.shape == (1, 2, 90) and out.dtype == torch.float32
    torch.testing.assert_close(out[0], reference(model, [1, 2, 3], 2)[:, :90], atol=ATOL, rtol=0)
    bf16 = tiny_model("llama", dtype=torch.bfloat16)
    assert HFLanguageModel(bf16).logits([[1, 2]]).dtype == torch.float32


@pytest.mark.parametrize(
    ("histories", "kwargs", "match"),
    [
        ([], {}, "histories is empty"),
        ([[1], []], {}, "history 1 is empty"),
        ([[1, 2]], {"num_positions": 0}, "num_positions"),
        ([[1, 2]], {"num_positions": 3}, "cannot give 3 positions"),
        ([[1, -1]], {}, "outside 0..96"),
        ([[1, VOCAB]], {}, "outside 0..96"),
        ([[1], [2]], {"rows": [0]}, "1 row ids for 2 histories"),
        ([[1], [2]], {"rows": [4, 4]}, "distinct"),
    ],
)
def test_bad_inputs(histories, kwargs, match):
    lm = HFLanguageModel(tiny_model())
    with pytest.raises(ValueError, match=match):
        lm.logits(histories, **kwargs)


def test_bad_construction():
    model = tiny_model()
    with pytest.raises(ValueError, match="vocab_size"):
        HFLanguageModel(model, vocab_size=VOCAB + 1)
    with pytest.raises(ValueError, match="EOS ids"):
        HFLanguageModel(model, eos_token_ids=[VOCAB])
    with pytest.raises(ValueError, match="no EOS id"):
        HFLanguageModel(model, eos_token_ids=[])
    with pytest.raises(ValueError, match="no EOS id"):
        HFLanguageModel(tiny_model(eos=None))
    with pytest.raises(ValueError, match="max_hole_fraction"):
        HFLanguageModel(model, max_hole_fraction=1.5)


def test_sliding_window_layers_are_refused():
    """Sliding-window layers index by slot; holes would silently shift their window."""
    config = transformers.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        eos_token_id=EOS,
        use_sliding_window=True,
        sliding_window=8,
        max_window_layers=0,
    )
    with pytest.raises(NotImplementedError, match="DynamicSlidingWindowLayer"):
        HFLanguageModel(transformers.Qwen2ForCausalLM(config))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_wrapping_a_transformers_model_leaves_it_unchanged(dtype: torch.dtype) -> None:
    """The adapter wraps, it does not patch: the caller's module keeps its attention implementation, its
    linear layers' classes, its training flag and its config; the adapter's copy shares the weights."""
    model = tiny_model().to(dtype).train()
    before_classes = [type(module) for module in model.modules()]
    before_config = model.config.to_dict()
    lm = HFLanguageModel(model)
    assert model.config._attn_implementation == "sdpa"
    assert [type(module) for module in model.modules()] == before_classes
    assert all(type(m) is torch.nn.Linear for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert model.training and model.config.to_dict() == before_config
    # the adapter's own copy carries the switches, over the very same tensors
    assert lm.module is not model and not lm.module.training
    assert lm.module.config._attn_implementation == "exactspec_grouped"
    if dtype == torch.bfloat16:
        assert any(type(m).__name__ == "TwoRowLinear" for m in lm.module.modules())
    assert all(a is b for a, b in zip(model.parameters(), lm.module.parameters(), strict=True))
    # and the stock module still computes what it computed before the adapter existed
    with torch.inference_mode():
        ids = torch.tensor([[1, 2, 3]])
        stock = model.eval()(input_ids=ids).logits
        fresh = tiny_model().to(dtype).eval()(input_ids=ids).logits
    torch.testing.assert_close(stock, fresh, atol=0, rtol=0)
