"""The core on the models' device: `--device auto|cpu|cuda`, and a CUDA run where one exists.

The tests marked `gpu` are skipped where torch sees no CUDA device (the development machine
has none); on a GPU machine they run the engine, the scheduler and the exact greedy check there.
"""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_causal_lm

from exactspec.cli.main import main
from exactspec.decoding.engine import DecodeConfig, SpeculativeEngine
from exactspec.decoding.scheduler import Request, Scheduler
from exactspec.drafters.model import ModelDrafter
from exactspec.foundations.sampler import SeededSampler
from exactspec.foundations.settings import SamplingSettings
from exactspec.foundations.transforms import probabilities_per_row
from exactspec.models.device import resolve_device
from exactspec.models.hf.auto_options import auto_dtype
from exactspec.models.hf.model import HFLanguageModel

CUDA = torch.cuda.is_available()
needs_gpu = [pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="no CUDA device here")]


def test_resolve_device() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cuda" if CUDA else "cpu")
    assert auto_dtype(torch.device("cpu")) == torch.bfloat16
    assert auto_dtype(torch.device("cuda")) == torch.bfloat16
    with pytest.raises(ValueError, match="unknown device"):
        resolve_device("tpu")


@pytest.mark.skipif(CUDA, reason="checks the message where CUDA is absent")
def test_cuda_without_a_gpu_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--device", "cuda", "def f():"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_per_row_transforms_equal_each_row_alone() -> None:
    torch.manual_seed(0)
    logits = torch.randn(6, 11, dtype=torch.float64)
    settings = [
        SamplingSettings(),
        SamplingSettings(temperature=0),
        SamplingSettings(temperature=0.5, top_k=3),
        SamplingSettings(),
        SamplingSettings(top_p=0.6, repetition_penalty=1.3, logit_bias={2: 1.0}),
        SamplingSettings(min_p=0.2),
    ]
    histories = [[1, 2], [3], [4, 4], [5], [2, 7, 9], [0]]
    batched = probabilities_per_row(logits, settings, histories)
    from exactspec.foundations.transforms import probabilities

    for n in range(6):
        assert torch.equal(batched[n], probabilities(logits[n : n + 1], settings[n], histories[n : n + 1])[0])


def _pair(device: str) -> tuple[HFLanguageModel, HFLanguageModel]:
    target = tiny_causal_lm(vocab_size=64, seed=0, initializer_range=0.2, eos_token_id=3).to(device)
    draft = tiny_causal_lm(vocab_size=64, seed=1, initializer_range=0.2, eos_token_id=3).to(device)
    return HFLanguageModel(target), HFLanguageModel(draft)


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=needs_gpu)])
def test_greedy_speculative_equals_plain_on_the_device(device: str) -> None:
    target, draft = _pair(device)
    config = DecodeConfig(gamma=3, max_new_tokens=12, settings=SamplingSettings(temperature=0))
    prompts = [[5, 9, 11], [7, 8]]
    spec = SpeculativeEngine(target, ModelDrafter(draft, 64)).generate(
        prompts, config, SeededSampler(0, 2, device=device)
    )
    plain = SpeculativeEngine(target).generate(
        prompts,
        DecodeConfig(gamma=0, max_new_tokens=12, settings=config.settings),
        SeededSampler(0, 2, device=device),
    )
    assert [s.generated for s in spec] == [s.generated for s in plain]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_gpu)])
def test_scheduler_with_mixed_settings_runs_on_the_device(device: str) -> None:
    target, draft = _pair(device)
    scheduler = Scheduler(SpeculativeEngine(target, ModelDrafter(draft, 64)), gamma=3)
    assert scheduler.sampler.device.type == device
    handles = [
        scheduler.submit(
            Request(
                [5, 9, 11],
                SamplingSettings(temperature=t, top_p=0.9, repetition_penalty=1.2, logit_bias={4: 1.0}),
                8,
                seed=i,
            )
        )
        for i, t in enumerate((0.0, 0.7, 1.0))
    ]
    scheduler.run_until_idle()
    assert all(h.finish_reason in ("eos", "length") and h.generated for h in handles)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_gpu)])
def test_block_verifier_and_lookup_drafts_run_on_the_device(device: str) -> None:
    from exactspec.drafters.hybrid import HybridDrafter
    from exactspec.drafters.ngram import NgramDrafter
    from exactspec.verifiers.block import verify_block

    target, draft = _pair(device)
    drafter = HybridDrafter(NgramDrafter(target.eos_token_ids), ModelDrafter(draft, 64), 64)
    engine = SpeculativeEngine(target, drafter, verifier=verify_block)
    config = DecodeConfig(gamma=3, max_new_tokens=10, settings=SamplingSettings(temperature=0.8))
    rows = engine.generate([[5, 9, 5, 9, 5], [7, 8]], config, SeededSampler(0, 2, device=device))
    assert all(row.finish_reason is not None and row.generated for row in rows)
