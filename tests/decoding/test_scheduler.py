"""The scheduler: rows with their own settings join and leave between rounds, and never affect each other."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from conftest import tiny_causal_lm

from exactspec.checking import grid
from exactspec.checking.toy import random_tabular_model
from exactspec.decoding import engine as engine_module
from exactspec.decoding.engine import SpeculativeEngine
from exactspec.decoding.scheduler import QueueFull, Request, Scheduler
from exactspec.drafters.model import ModelDrafter
from exactspec.foundations.sampler import SeededSampler
from exactspec.foundations.settings import SamplingSettings
from exactspec.models.hf import HFLanguageModel

VOCAB = 6
SETTINGS = [
    SamplingSettings(),
    SamplingSettings(temperature=0.0),
    SamplingSettings(temperature=0.7, top_k=3),
    SamplingSettings(temperature=1.3, top_p=0.8, repetition_penalty=1.4),
    SamplingSettings(min_p=0.2, logit_bias={2: 1.0}),
]


def toy_scheduler(**kwargs: object) -> Scheduler:
    target, draft = random_tabular_model(VOCAB, seed=1), random_tabular_model(VOCAB, seed=2)
    return Scheduler(SpeculativeEngine(target, ModelDrafter(draft, VOCAB)), **kwargs)


def requests() -> list[Request]:
    return [
        Request([1 + i % 4, 2], SETTINGS[i % len(SETTINGS)], max_new_tokens=3 + i, gamma=i % 4, seed=100 + i)
        for i in range(8)
    ]


def run_alone(make, request: Request) -> list[int]:
    scheduler = make()
    handle = scheduler.submit(request)
    scheduler.run_until_idle()
    assert handle.finish_reason in ("eos", "length")
    return handle.generated


def run_staggered(make, batch: list[Request], max_batch: int = 8) -> list[list[int]]:
    """Submit one request per round, so every row joins a batch that is already running."""
    scheduler = make(max_batch=max_batch)
    handles = []
    pending = list(batch)
    while pending or scheduler.running or scheduler.waiting:
        if pending:
            handles.append(scheduler.submit(pending.pop(0)))
        scheduler.step()
    assert all(h.finish_reason in ("eos", "length") for h in handles)
    return [h.generated for h in handles]


@pytest.mark.parametrize("max_batch", [1, 3, 8])
def test_a_seeded_row_gives_the_same_tokens_whoever_shares_the_batch_and_whenever_it_joins(max_batch: int):
    batch = requests()
    alone = [run_alone(toy_scheduler, request) for request in batch]
    assert run_staggered(toy_scheduler, batch, max_batch) == alone
    assert len({tuple(tokens) for tokens in alone}) > 4  # the rows really differ


def test_hf_rows_joining_a_running_batch_equal_each_row_alone_in_float32():
    target_model = tiny_causal_lm(vocab_size=64, seed=0, initializer_range=0.2, eos_token_id=3)
    draft_model = tiny_causal_lm(vocab_size=64, seed=1, initializer_range=0.2, eos_token_id=3)

    def make(max_batch: int = 8) -> Scheduler:
        drafter = ModelDrafter(HFLanguageModel(draft_model), 64)
        engine = SpeculativeEngine(HFLanguageModel(target_model), drafter)
        return Scheduler(engine, max_batch=max_batch)

    batch = [
        Request([5 + i, 9, 11, 2][: 2 + i % 3], SETTINGS[i % len(SETTINGS)], 6 + i, gamma=1 + i % 4, seed=i)
        for i in range(6)
    ]
    alone = [run_alone(make, request) for request in batch]
    assert run_staggered(make, batch, max_batch=4) == alone


def test_cancelled_and_finished_rows_leave_and_free_their_cache():
    target = HFLanguageModel(tiny_causal_lm(vocab_size=64, seed=0, eos_token_id=3))
    draft = HFLanguageModel(tiny_causal_lm(vocab_size=64, seed=1, eos_token_id=3))
    scheduler = Scheduler(SpeculativeEngine(target, ModelDrafter(draft, 64)), gamma=2)
    short = scheduler.submit(Request([5, 6], max_new_tokens=1, seed=0))
    long = scheduler.submit(Request([7, 8, 9], max_new_tokens=50, seed=1))
    scheduler.step()
    assert short.finish_reason == "length" and target.cached_rows == [long.row]
    assert draft.cached_rows in ([long.row], [])
    long.cancel()
    assert scheduler.step() is False
    assert long.finish_reason == "cancelled" and target.cached_rows == [] and draft.cached_rows == []
    assert scheduler.running == 0
    events = []
    while not long.events.empty():
        events.append(long.events.get())
    assert events[-1].finish_reason == "cancelled"


def test_admission_by_free_capacity_and_a_bounded_queue():
    scheduler = toy_scheduler(max_batch=2, max_waiting=1)
    handles = [scheduler.submit(Request([1], max_new_tokens=20, seed=i)) for i in range(3)]
    with pytest.raises(QueueFull):
        scheduler.submit(Request([1], max_new_tokens=2))
    scheduler.step()
    assert scheduler.waiting == 1 and handles[0].rounds == handles[1].rounds == 1 and handles[2].rounds == 0
    scheduler.run_until_idle()
    assert all(h.done.is_set() for h in handles)


def test_invalid_requests_are_refused_at_submit():
    scheduler = toy_scheduler()
    for bad in (
        Request([]),
        Request([VOCAB]),
        Request([1], max_new_tokens=0),
        Request([1], gamma=-1),
        Request([1], SamplingSettings(logit_bias={VOCAB: 1.0})),
    ):
        with pytest.raises(ValueError):
            scheduler.submit(bad)
    assert scheduler.waiting == 0


def test_background_thread_serves_requests_from_other_threads():
    scheduler = toy_scheduler(max_batch=3)
    scheduler.start()
    try:
        batch = requests()
        handles: list = [None] * len(batch)

        def submit(i: int) -> None:
            handles[i] = scheduler.submit(batch[i])

        threads = [threading.Thread(target=submit, args=(i,)) for i in range(len(batch))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for handle in handles:
            assert handle.done.wait(30)
        assert [h.generated for h in handles] == [run_alone(toy_scheduler, r) for r in batch]
    finally:
        scheduler.stop()


def test_a_failing_round_ends_its_rows_with_an_error_and_the_scheduler_goes_on(monkeypatch):
    scheduler = toy_scheduler()
    first = scheduler.submit(Request([1], max_new_tokens=3, seed=0))
    original = scheduler.engine.round
    monkeypatch.setattr(
        scheduler.engine, "round", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom"))
    )
    scheduler.step()
    assert first.finish_reason == "error"
    monkeypatch.setattr(scheduler.engine, "round", original)
    second = scheduler.submit(Request([1], max_new_tokens=3, seed=0))
    scheduler.run_until_idle()
    assert second.finish_reason in ("eos", "length")


def test_the_scheduler_grid_catches_an_engine_that_ignores_per_row_settings(monkeypatch):
    case = next(c for c in grid.exact_grid() if c.name == "scheduler: rows with own settings")
    assert grid.run_exact_case(case).passed
    # A broken engine: every row samples with the batch's settings, not its own.
    original = engine_module.SpeculativeEngine.round

    def shared_settings(self, states, active, config, sampler, stop=None):
        for row in active:
            states[row].settings = states[active[0]].settings
        return original(self, states, active, config, sampler, stop)

    monkeypatch.setattr(engine_module.SpeculativeEngine, "round", shared_settings)
    assert not grid.run_exact_case(case).passed


def test_scheduler_rows_draw_on_the_models_device():
    scheduler = toy_scheduler()
    assert scheduler.sampler.device == torch.device("cpu")


def test_joining_prompts_are_prefilled_in_chunks_while_running_rows_keep_decoding():
    target = HFLanguageModel(tiny_causal_lm(vocab_size=64, seed=0).double(), eos_token_ids=[63])
    fed: list[tuple[int, ...]] = []
    hook = target.module.register_forward_pre_hook(
        lambda module, args, kwargs: fed.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    try:
        scheduler = Scheduler(SpeculativeEngine(target), gamma=0, prefill_chunk=4, sampler=SeededSampler(0))
        running = scheduler.submit(
            Request([5, 6], SamplingSettings(temperature=0), max_new_tokens=30, seed=0)
        )
        scheduler.step()  # a 2-token prompt: its 1 token ahead of the last is fed, then its first round
        assert running.rounds == 1
        long_prompt = list(range(10, 21))  # 11 tokens: 10 to prefill, in chunks of at most 4
        joining = scheduler.submit(
            Request(long_prompt, SamplingSettings(temperature=0), max_new_tokens=3, seed=1)
        )
        fed.clear()
        steps = 0
        while joining.rounds == 0:
            before = running.rounds
            scheduler.step()
            steps += 1
            assert running.rounds == before + 1  # the running row decodes at every step meanwhile
        assert steps == 3  # chunks of 4, 4 and 2 tokens; the step of the last one also runs its first round
        assert [shape for shape in fed if shape[0] == 1 and shape[1] > 1][:3] == [(1, 4), (1, 4), (1, 2)]
        scheduler.run_until_idle()
    finally:
        hook.remove()
    # float64: what a chunked prefill computes is what one pass computes, so the tokens are those of
    # the same request served without chunks
    alone_target = HFLanguageModel(target.module, eos_token_ids=[63])
    alone = Scheduler(SpeculativeEngine(alone_target), gamma=0, sampler=SeededSampler(0))
    handle = alone.submit(Request(long_prompt, SamplingSettings(temperature=0), max_new_tokens=3, seed=1))
    alone.run_until_idle()
    assert joining.generated == handle.generated and len(joining.generated) == 3


def fed_prefixes(scheduler: Scheduler) -> list[tuple[int, int]]:
    """Record (row, prompt tokens in the target's cache after it) for every prefill the scheduler runs."""
    fed: list[tuple[int, int]] = []
    original = scheduler.engine.prefill

    def recording(row: int, tokens) -> None:  # type: ignore[no-untyped-def]
        fed.append((row, len(tokens)))
        original(row, tokens)

    scheduler.engine.prefill = recording  # type: ignore[method-assign]
    return fed


def test_joining_prompts_are_prefilled_least_left_first_and_a_long_one_is_not_passed_over_for_ever():
    scheduler = toy_scheduler(gamma=0, prefill_chunk=4, max_batch=64, sampler=SeededSampler(0))
    fed = fed_prefixes(scheduler)
    settings = SamplingSettings(temperature=0)
    # 20 and 5 prompt tokens to feed (all but the last, which the first round scores)
    long = scheduler.submit(Request([1, 2, 3, 4, 5] * 4 + [1], settings, max_new_tokens=2, seed=0))
    short = scheduler.submit(Request([2, 3, 4, 5, 1, 2], settings, max_new_tokens=2, seed=1))
    scheduler.step()
    scheduler.step()
    # Arriving together: the short prompt first (4 + 1 of its 5 tokens), then the long one's first 3.
    assert fed[:3] == [(short.row, 4), (short.row, 5), (long.row, 3)]
    assert short.rounds == 1 and long.rounds == 0
    # Short prompts that keep arriving (one a step, 8 tokens each: more than a 4-token chunk a step can
    # feed) pass the long one over only until it has waited its length in chunks.
    arrivals = []
    for step in range(40):
        arrivals.append(scheduler.submit(Request([3, 4, 5, 1, 2, 3, 4, 5, 1], settings, 2, seed=10 + step)))
        scheduler.step()
        if long.rounds:
            break
    assert long.rounds == 1, "the long prompt waited for ever"
    first_of_long = next(i for i, (row, _) in enumerate(fed) if row == long.row)
    served_before = {row for row, _ in fed[:first_of_long]}
    assert short.row in served_before  # it was passed over for a while ...
    assert any(h.rounds == 0 for h in arrivals)  # ... but not until every later short prompt was served


def test_prefill_budget_is_spent_only_on_the_prompt_tokens_the_target_cannot_reuse():
    """A target that can copy a prompt's first tokens from another row (`reusable_prefix`: the ONNX
    adapter's shared prefixes) costs no chunk budget for them: the rest is fed at once, and a prompt it
    holds whole joins its first round without a prefill."""
    target = random_tabular_model(VOCAB, seed=1)
    reusable = {0: 0, 1: 6, 2: 9}  # row -> leading prompt tokens the target says it has
    target.reusable_prefix = lambda row, tokens: min(reusable[row], len(tokens))  # type: ignore[attr-defined]
    scheduler = Scheduler(
        SpeculativeEngine(target), gamma=0, prefill_chunk=4, max_batch=8, sampler=SeededSampler(0)
    )
    fed = fed_prefixes(scheduler)
    settings = SamplingSettings(temperature=0)
    prompt = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5]  # 9 tokens to prefill
    handles = [scheduler.submit(Request(prompt, settings, max_new_tokens=2, seed=row)) for row in range(3)]
    scheduler.step()
    # One step's budget of 4: row 2 needs none, row 1 its last 3 (6 reused), row 0 gets the 1 left.
    assert fed == [(1, 9), (0, 1)]
    assert handles[2].rounds == 1 and handles[1].rounds == 1 and handles[0].rounds == 0
    scheduler.run_until_idle()
    assert [h.generated for h in handles[1:]] == [handles[0].generated] * 2  # greedy: the same answer


class _IdleTarget:
    """A toy target that counts `release_memory` calls (1000 bytes each)."""

    def __init__(self) -> None:
        self.model = random_tabular_model(4, seed=0)
        self.releases = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.model, name)

    def release_memory(self) -> int:
        self.releases += 1
        return 1000


def test_the_background_thread_releases_the_models_memory_once_idle_then_waits() -> None:
    from exactspec.decoding.builder import build_engine
    from exactspec.decoding.strategy import Strategy

    target = _IdleTarget()
    scheduler = Scheduler(build_engine(target, None, Strategy(), 0), idle_release_seconds=0.05)
    scheduler.start()
    try:
        deadline = time.monotonic() + 5
        while target.releases == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # several timeouts' worth: released once until a round runs
        assert target.releases == 1 and scheduler.released_bytes == 1000
    finally:
        scheduler.stop()
