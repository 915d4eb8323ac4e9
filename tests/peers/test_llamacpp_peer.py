"""The llama.cpp peer: the bench column with a stand-in model (always), the real package when installed.

`make test` never needs llama-cpp-python: the column's wiring is checked against an object
with the methods the peer calls (`reset`, `set_seed`, `generate`, `eval`); the real package is
exercised on tiny GGUF files if it imports (tests/bench/test_bench_llamacpp.py, and the built-in
draft GGUF when it is in the cache).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

from conftest import tiny_causal_lm  # noqa: E402

from exactspec.bench.config import BenchConfig, EncodedPrompt  # noqa: E402
from exactspec.bench.methods import LLAMACPP_PLAIN  # noqa: E402
from exactspec.bench.runner import LlamaCppPeer, run_bench  # noqa: E402
from exactspec.bench.summary import summarize  # noqa: E402
from exactspec.cli import bench as bench_cli  # noqa: E402
from exactspec.foundations.settings import SamplingSettings  # noqa: E402
from exactspec.models.pair import ModelPair  # noqa: E402
from exactspec.peers import llamacpp  # noqa: E402

VOCAB = 97
EOS = 3


class CountingLlama:
    """Stands in for `llama_cpp.Llama`: emits 10, 11, 12, ... after any prompt, EOS (3) as the 4th token."""

    def __init__(self) -> None:
        self.seeds: list[int] = []
        self.prompts: list[list[int]] = []
        self.n_tokens = 0
        self.evaluated: list[int] = []  # tokens per `eval` (the cost measurement's passes)

    def reset(self) -> None:
        self.n_tokens = 0

    def eval(self, tokens: Sequence[int]) -> None:
        self.evaluated.append(len(tokens))
        self.n_tokens += len(tokens)

    def set_seed(self, seed: int) -> None:
        self.seeds.append(seed)

    def generate(self, tokens: Sequence[int], **settings: object) -> Iterator[int]:
        self.prompts.append(list(tokens))
        assert settings["temp"] in (0.0, 0.7) and settings["top_k"] == 0 and settings["min_p"] == 0.0
        n = 0
        while True:
            yield EOS if n == 3 else 10 + n
            n += 1


def test_generate_stops_at_max_new_tokens_or_at_eos() -> None:
    llm = CountingLlama()
    out = llamacpp.generate(llm, [5, 6], SamplingSettings(temperature=0.0), 6, seed=4)
    assert out["tokens"] == [10, 11, 12, EOS, 14, 15] and out["finish_reason"] == "length"
    assert len(out["events"]) == 6 and llm.seeds == [4] and llm.prompts == [[5, 6]]
    out = llamacpp.generate(llm, [5], SamplingSettings(temperature=0.0), 6, seed=0, eos_token_ids={EOS})
    assert out["tokens"] == [10, 11, 12, EOS] and out["finish_reason"] == "eos"


def test_bench_runs_the_llamacpp_column_after_ours() -> None:
    target = tiny_causal_lm(vocab_size=VOCAB, seed=0, eos_token_id=EOS, pad_token_id=0)
    draft = tiny_causal_lm(vocab_size=VOCAB, layers=1, seed=1, eos_token_id=EOS, pad_token_id=0)
    pair = ModelPair.from_models(target, draft)
    config = BenchConfig(
        gammas=(2,),
        temperatures=(0.0,),
        max_new_tokens=6,
        cost_repeats=1,
        warmup_tokens=2,
        hf_assisted=False,
        hf_plain=False,
        llamacpp=True,
    )
    prompts = [EncodedPrompt("code", "coding", [5, 6, 7, 8, 9, 10])]
    with pytest.raises(ValueError, match="no plain llama.cpp Llama"):
        run_bench(pair, prompts, config, progress=False)
    llm = CountingLlama()
    result = run_bench(pair, prompts, config, progress=False, llamacpp=LlamaCppPeer(plain=llm))
    assert [(r.method, r.gamma) for r in result.runs] == [
        ("plain", 0),
        ("speculative", 2),
        (LLAMACPP_PLAIN, 0),
    ]
    run = result.runs[-1]
    assert run.tokens == (10, 11, 12, EOS, 14, 15) and run.new_tokens == 6  # EOS ignored
    assert run.round_passes == ((0, 6),) + ((0, 1),) * 5  # the prompt's pass, then one token per pass
    rows = {r.method: r for r in summarize(result).rows}
    assert rows[LLAMACPP_PLAIN].label == "llama.cpp plain"
    assert rows[LLAMACPP_PLAIN].tokens_per_second.median > 0
    # Its own passes were timed too (k = 1..9 over the cost context, first a prefill of it).
    assert result.peer_costs is not None and sorted(result.peer_costs.target_seconds) == list(range(1, 10))
    assert llm.evaluated[1:3] == [2, 1] and max(llm.evaluated[1:]) == 9


def test_bench_skips_the_column_with_a_message_when_the_package_is_absent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(llamacpp, "available", lambda: False)
    said: list[str] = []
    args = argparse.Namespace(target="default-target", cache_dir=None, no_progress=True, threads=None)
    assert bench_cli._load_llamacpp(args, said.append) is None
    assert said and "llama.cpp column skipped" in said[0] and "GGML_AVX512=ON" in said[0]


@pytest.mark.slow  # the built-in draft, from the user's cache (tests/conftest.py)
def test_real_llamacpp_decodes_the_default_draft_greedily() -> None:
    pytest.importorskip("llama_cpp")
    from exactspec.artefacts.cache import default_cache_dir

    path = Path(default_cache_dir()) / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    if not path.is_file():
        pytest.skip(f"{path} is not in the cache")
    llm = llamacpp.load(path, threads=1, context=256)
    ids = llm.tokenize(b"def fibonacci(n):\n", add_bos=False)
    first = llamacpp.generate(llm, ids, SamplingSettings(temperature=0.0), 8, seed=0)
    again = llamacpp.generate(llm, ids, SamplingSettings(temperature=0.0), 8, seed=1)
    assert len(first["tokens"]) == 8 and first["tokens"] == again["tokens"]  # greedy: seed-independent
