"""The bench's raw measurements as typed records, each written to bench.json under its field names.

From the smallest up:

* `SteadyState`: the round timestamps of one generation and its steady-state speed (`timing`);
* `Measurement`: everything one timed generation measured (`runs`: ours, transformers' or
  llama.cpp's): its steady state plus wall time, tokens, forward passes, and per side
  `RunMetrics` (our engine's counters), `ExpectedAccepted` (both verification rules scored on
  its rounds), `PolicyCosts` (what adaptive gamma optimised with), `AssistedRounds` (HF's rounds);
* `Run`: a measurement with where it ran (prompt, sampling row, method, gamma, seed) and how it
  compares with plain decoding and with its other trials (`runner`);
* `PromptRecord`, `ModelRecord`, `Models`, `Environment`, `HfPolicy`: what the run was given.

The whole result (`result.BenchResult`) and the summary (`summary_records.Summary`) are built of these.
Each record's `to_json()` / `from_json()` is `foundations.records.JsonRecord`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from exactspec.foundations.metrics import DecodeMetrics
from exactspec.foundations.records import JsonRecord, json_key

Forward = tuple[int, float]
"""One timed forward pass: (tokens fed, seconds)."""


@dataclass(frozen=True, kw_only=True)
class SteadyState(JsonRecord):
    """Round times (seconds from the start) and tokens, and tokens/s after the first round.

    The first round holds the prefill, which no decoding method speeds up, so the steady state
    starts after it: steady_tokens = new_tokens - first_round_tokens over steady_seconds = the
    last round's time - the first round's.
    """

    round_times: tuple[float, ...]
    round_tokens: tuple[int, ...]
    new_tokens: int
    first_round_seconds: float
    first_round_tokens: int
    steady_tokens: int
    steady_seconds: float
    steady_tokens_per_second: float


@dataclass(frozen=True, kw_only=True)
class RunMetrics(JsonRecord):
    """Our engine's `DecodeMetrics` of one generation, with its derived rates (bench.json "metrics")."""

    rounds: int
    emitted_tokens: int
    proposed_tokens: int
    accepted_tokens: int
    acceptance_rate: float
    tokens_per_round: float
    acceptance_by_position: tuple[float, ...]
    target_calls: int
    draft_calls: int
    draft_seconds: float
    target_seconds: float
    verify_seconds: float
    draft_forward_seconds: float
    target_forward_seconds: float
    overhead_seconds: float
    overhead_fraction: float
    other_seconds: float
    total_seconds: float
    tokens_per_second: float
    proposed_by_position: tuple[int, ...]  # [gamma]: rounds that reached draft position i
    accepted_by_position: tuple[int, ...]  # [gamma]: of those, rounds that accepted it
    # The planner's predicted round times against the measured ones (`decoding.round_times`): rounds
    # predicted, and the median |predicted / measured - 1| (None: no planned rounds, or older results).
    predicted_rounds: int = 0
    round_time_error: float | None = None

    @classmethod
    def of(cls, metrics: DecodeMetrics) -> RunMetrics:
        """A snapshot of `metrics` (its counters, times and the rates computed from them)."""
        return cls(
            rounds=metrics.rounds,
            emitted_tokens=metrics.emitted_tokens,
            proposed_tokens=metrics.proposed_tokens,
            accepted_tokens=metrics.accepted_tokens,
            acceptance_rate=metrics.acceptance_rate,
            tokens_per_round=metrics.tokens_per_round,
            acceptance_by_position=tuple(metrics.acceptance_by_position()),
            target_calls=metrics.target_calls,
            draft_calls=metrics.draft_calls,
            draft_seconds=metrics.draft_seconds,
            target_seconds=metrics.target_seconds,
            verify_seconds=metrics.verify_seconds,
            draft_forward_seconds=metrics.draft_forward_seconds,
            target_forward_seconds=metrics.target_forward_seconds,
            overhead_seconds=metrics.overhead_seconds,
            overhead_fraction=metrics.overhead_fraction,
            other_seconds=metrics.other_seconds,
            total_seconds=metrics.total_seconds,
            tokens_per_second=metrics.tokens_per_second,
            proposed_by_position=tuple(metrics.proposed_by_position),
            accepted_by_position=tuple(metrics.accepted_by_position),
            predicted_rounds=len(metrics.round_times),
            round_time_error=metrics.round_time_error if metrics.round_times else None,
        )


@dataclass(frozen=True)
class ExpectedAccepted(JsonRecord):
    """E[kept draft tokens | drafts] summed over a run's row-rounds under each rule, on identical inputs.

    `block_weights`: block verification's weights summed (`verifiers.expected.block_weight_sum`),
    whose mean over drafts is its expectation too; None in results from before it was kept.
    `tree`, `tree_first_branch`: over the row-rounds that verified a tree of candidates
    (`tree_rounds` of them; chains count in `rounds`), E[accepted candidates | tree] under tree
    verification and on the tree's first branch alone, the chain its drafter proposes with one
    branch (`verifiers.expected.expected_accepted_tree`); None in results from before they were kept.
    """

    token: float
    block: float
    rounds: int
    block_weights: float | None = None
    tree: float | None = None
    tree_first_branch: float | None = None
    tree_rounds: int | None = None


@dataclass(frozen=True)
class PolicyCosts(JsonRecord):
    """The c and v(1..gamma + 1) adaptive gamma optimised with: one row's of the pass costs the rounds
    were planned from (`ModelPair.batch_costs`, as `generate` plans), else `ModelPair.cost_model`."""

    c: float
    v: tuple[float, ...]


@dataclass(frozen=True)
class AssistedRounds(JsonRecord):
    """A peer's speculative rounds (transformers' assisted generation, llama-cpp-python's prompt lookup,
    onnxruntime-genai's n-gram decoding): how many candidates each round drafted and kept."""

    generator: str  # "AssistedCandidateGenerator" (or the universal one), "LlamaPromptLookupDecoding(...)",
    # "onnxruntime-genai NGramDecodingStrategy(...)"
    candidate_lengths: tuple[int, ...]
    accepted_per_round: tuple[int, ...]
    proposed_tokens: int
    accepted_tokens: int


@dataclass(frozen=True, kw_only=True)
class Measurement(SteadyState):
    """What one timed generation measured, on any side (ours, transformers', llama.cpp's).

    `target_forwards`, `draft_forwards`: every forward pass of each model, timed by hooks on
    transformers modules (ours on the hf backend, and the transformers peers); on a backend without
    them, every call of the engine's adapters (positions scored, seconds) instead; none for
    llama-cpp-python, whose `model_seconds` is its whole wall time. `round_passes`: per round, the
    draft model steps it took, then the tokens of each target pass it made (the first round holds
    the prefill): what `theory.speedup_from_rounds` prices with the costs measured in the run; our
    engine's and llama-cpp-python's rounds (None for the transformers peers and older results). The
    optional parts belong to one side: `metrics` and `expected_accepted` to our engine,
    `gamma_policy_costs` to adaptive gamma, `hf` to transformers' assisted generation, `llamacpp` to
    llama-cpp-python's prompt lookup decoding, `ortgenai` to onnxruntime-genai's n-gram decoding (its
    rounds and its lookup misses' standard steps, as 0-token proposals).
    """

    wall_seconds: float
    tokens: tuple[int, ...]
    finish_reason: str | None
    target_forwards: tuple[Forward, ...]
    draft_forwards: tuple[Forward, ...]
    model_seconds: float
    metrics: RunMetrics | None = None
    expected_accepted: ExpectedAccepted | None = None
    gamma_policy_costs: PolicyCosts | None = None
    hf: AssistedRounds | None = None
    llamacpp: AssistedRounds | None = None
    ortgenai: AssistedRounds | None = None
    round_passes: tuple[tuple[int, ...], ...] | None = None


@dataclass(frozen=True, kw_only=True)
class Run(Measurement):
    """One kept generation of the bench: a measurement and where it ran (one entry of bench.json "runs").

    `same_tokens_as_plain`, `first_difference`: against plain decoding of the same prompt and
    sampling row (None for plain decoding itself). `trial_tokens_per_second`, `trials_same_tokens`:
    with several trials, each trial's steady-state speed in run order and whether they all
    emitted the same tokens (None with one trial).
    """

    prompt: str
    category: str
    prompt_tokens: int
    setting: str  # the sampling row's name: "0", "0.7", "realistic"
    temperature: float
    method: str
    gamma: int
    seed: int
    same_tokens_as_plain: bool | None = None
    first_difference: int | None = None
    trial_tokens_per_second: tuple[float, ...] | None = None
    trials_same_tokens: bool | None = None

    def to_json(self) -> dict[str, Any]:
        # Where the run ran first, as a reader of bench.json looks for it; then the measurement.
        data = super().to_json()
        where = ("prompt", "category", "prompt_tokens", "setting", "temperature", "method", "gamma", "seed")
        return {**{key: data[key] for key in where}, **data}

    @classmethod
    def from_json(cls, data: Any) -> Run:
        if "setting" not in data:  # written before sampling rows had names: the row is the temperature
            data = {**data, "setting": f"{data['temperature']:g}"}
        return super().from_json(data)


@dataclass(frozen=True)
class PromptRecord(JsonRecord):
    """A prompt as the run used it: its name, category, token count, and text (None: given as ids)."""

    name: str
    category: str
    tokens: int
    chat: bool = False
    text: str | None = None


@dataclass(frozen=True)
class ModelRecord(JsonRecord):
    """What a loaded model is: class, size, dtype, weight format, vocabulary, layers."""

    class_name: str = field(metadata=json_key("class"))
    parameters: int
    dtype: str
    vocab_size: int | None
    layers: int | None
    hidden_size: int | None
    weights: str = "dense"  # or the weight format its backend names (`Backend.describe`)


@dataclass(frozen=True)
class ModelSpecs(JsonRecord):
    """How the models were asked for (the command line's specs, the weights chosen, the load time) and the
    backend that ran our engine's passes (None in results from before it was kept: `ran_on` says which)."""

    target_spec: str | None = None
    draft_spec: str | None = None
    weights: str | None = None
    load_seconds: float | None = None
    backend: str | None = None

    @property
    def ran_on(self) -> str:
        """The backend that ran our engine's passes; for results that name none, the one backend there
        was before it was kept (`models.backends.registry.unnamed_results_backend`)."""
        from exactspec.models.backends.registry import unnamed_results_backend

        return self.backend or unnamed_results_backend()


@dataclass(frozen=True, kw_only=True)
class Models(ModelSpecs):
    """The models as asked for and as loaded."""

    target: ModelRecord
    draft: ModelRecord


@dataclass(frozen=True)
class Environment(JsonRecord):
    """What the bench adds to the run's provenance: transformers', llama-cpp-python's and onnxruntime-genai's
    versions (None: not installed, or not recorded) and the machine's load.

    Load averages (1, 5, 15 minutes) at the start and the end; None where the OS has none.
    """

    transformers: str
    load_average_start: tuple[float, ...] | None = None
    load_average_end: tuple[float, ...] | None = None
    llama_cpp: str | None = None
    onnxruntime_genai: str | None = None


@dataclass(frozen=True)
class HfPolicy(JsonRecord):
    """transformers' draft-length policy for the draft (`peers.hf.draft_policy`)."""

    num_assistant_tokens: int | None
    num_assistant_tokens_schedule: str | None
    assistant_confidence_threshold: float | None
    adaptive_confidence_threshold: bool
