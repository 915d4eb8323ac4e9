"""report.md: the header (provenance, models, prompts, durations), the recommendation, the tables
(`tables`, `comparison_tables`), the checks and how the run was measured, rendered from a `BenchResult`
and its `Summary` alone."""

from __future__ import annotations

from exactspec.bench.comparison_tables import (
    adaptive_table,
    block_table,
    hf_section,
    lookup_section,
    ngram_section,
    tree_table,
)
from exactspec.bench.config import BenchConfig
from exactspec.bench.estimates import FULL_RUN_NOTE
from exactspec.bench.formatting import count_text, duration_text, is_nan, name_title, num, setting_title
from exactspec.bench.methods import is_engine_method, label
from exactspec.bench.plots import ACCEPTANCE_PLOT, COSTS_PLOT, SPEEDUP_PLOT
from exactspec.bench.result import BenchResult, configured_methods, sampling_rows
from exactspec.bench.summary import summarize
from exactspec.bench.summary_records import PREDICTION_NOTE, Summary
from exactspec.bench.tables import (
    costs_in_run_table,
    costs_table,
    per_prompt_tables,
    predicted_table,
    results_table,
)
from exactspec.models.backends.registry import backend as backend_named


def render_markdown(result: BenchResult, summary: Summary | None = None, *, plots: bool = True) -> str:
    summary = summary or summarize(result)
    lines = ["# exactspec bench", ""]
    lines += _header(result, summary)
    lines += _recommendation(summary)
    lines += costs_in_run_table(summary)
    lines += costs_table(summary)
    for sampling in sampling_rows(result):
        lines += results_table(summary, sampling)
        lines += predicted_table(summary, sampling)
    for sampling in sampling_rows(result):
        lines += per_prompt_tables(result, summary, sampling)
    lines += block_table(summary)
    lines += tree_table(summary)
    lines += adaptive_table(summary)
    if result.config.hf_assisted:
        lines += hf_section(result, summary)
    if result.config.llamacpp_lookup:
        lines += lookup_section(summary)
    if result.config.ortgenai_ngram:
        lines += ngram_section(summary)
    lines += _greedy_check(summary)
    if result.errors:
        lines += ["## Errors", ""] + [f"- {e}" for e in result.errors] + [""]
    lines += _method_notes(result.config)[:-1] + _trials_check(result, summary) + [""]
    if plots:
        lines += [
            "## Plots",
            "",
            f"![speedup versus gamma]({SPEEDUP_PLOT})",
            "",
            f"![acceptance by position]({ACCEPTANCE_PLOT})",
            "",
            f"![cost ratios]({COSTS_PLOT})",
            "",
        ]
    return "\n".join(lines).rstrip() + "\n"


def _provenance(result: BenchResult) -> list[str]:
    """Code, command, machine and date of the run (the machine line with transformers and the load)."""
    env = result.environment
    start, end = env.load_average_start, env.load_average_end
    load = (
        f"; load average (1 min) {start[0]:.2f} at the start, {end[0]:.2f} at the end"
        if start and end
        else ""
    )
    llama = f", llama-cpp-python {env.llama_cpp}" if env.llama_cpp else ""
    extra = f"; transformers {env.transformers}{llama}{load}"
    if result.provenance is None:
        return [f"- provenance: not recorded (bench.json schema {result.schema}){extra}"]
    return [line + extra if line.startswith("- machine:") else line for line in result.provenance.markdown()]


def _header(result: BenchResult, summary: Summary) -> list[str]:
    config, models, prompts = result.config, result.models, result.prompts

    def model_line(role: str) -> str:
        m = models.target if role == "target" else models.draft
        spec = models.target_spec if role == "target" else models.draft_spec
        name = f"`{spec}` " if spec else ""
        packed = f" ({m.weights} packed linear weights)" if m.weights != "dense" else ""
        if m.weights.startswith("gguf"):
            packed = f" ({m.weights} weights, llama.cpp)"
        return (
            f"- {role}: {name}{m.class_name}, {count_text(m.parameters)} parameters, {m.dtype}{packed}, "
            f"{m.layers} layers, vocabulary {m.vocab_size}"
        )

    categories: dict[str, int] = {}
    for p in prompts:
        categories[p.category] = categories.get(p.category, 0) + 1
    mix = ", ".join(f"{n} {c}" for c, n in sorted(categories.items()))
    estimate = summary.estimated_full_run_seconds
    methods = ", ".join(label(m, g) for m, g in configured_methods(result) if is_engine_method(m))
    backend = models.ran_on
    lines = [
        *_provenance(result),
        f"- backend of our engine: `{backend}` (every method of ours ran its passes there)",
        model_line("target"),
        model_line("draft"),
        f"- prompts: {len(prompts)} ({mix}): {', '.join(p.name for p in prompts)}",
        f"- {config.max_new_tokens} new tokens per run"
        + (" (EOS ignored by every side, so every run makes exactly that many)" if config.ignore_eos else "")
        + f"; methods {methods}"
        f"; sampling rows {', '.join(setting_title(s) for s in sampling_rows(result))}; "
        f"seed {config.seed} "
        "(+ prompt index)"
        + (
            f"; each method run {config.trials} times in turn with that seed, its fastest run kept"
            if config.trials > 1
            else ""
        ),
        f"- duration: {duration_text(result.duration_seconds)} (cost measurement "
        f"{duration_text(result.costs.seconds)}, warm-up {duration_text(result.warmup_seconds)})",
    ]
    if not is_nan(estimate):
        lines.append(
            "- estimated duration of the full default run at the speeds seen here: "
            f"{duration_text(estimate)}. " + FULL_RUN_NOTE
        )
    machine = result.provenance.machine if result.provenance else None
    cpus = (machine.cores if machine else None) or 0
    # The end figure counts the bench's own threads; what is left of it is other work.
    own = min(_own_threads(result, machine.torch_threads if machine else 0, cpus), cpus)
    load_start, load_end = result.environment.load_average_start, result.environment.load_average_end
    others = max(load_start[0] if load_start else 0.0, (load_end[0] - own) if load_end else 0.0)
    if load_start and cpus and others > 0.5 * cpus:
        lines.append(
            "- **the machine was loaded during this run** (load average, less the bench's own threads at "
            "the end, above half the CPU count): absolute timings are noisy and ratios less so, because "
            "every setting of a prompt ran back to back."
        )
    return lines + [""]


def _own_threads(result: BenchResult, torch_threads: int, cpus: int) -> int:
    """The threads the bench itself keeps busy: torch's, or every core where a pool of its own ran
    (our backend's when it has one, the llama.cpp and onnxruntime-genai peers'), since such pools are
    sized to the cores (--threads or their default of 2) and torch then keeps one thread."""
    name = result.models.backend
    try:
        pooled = bool(name) and backend_named(name).own_threads
    except ValueError:  # a bench.json from a backend this build does not register
        pooled = False
    if pooled or result.config.llamacpp or result.config.ortgenai:
        return cpus
    return torch_threads


def _recommendation(summary: Summary) -> list[str]:
    lines = ["## Recommendation (token-verified draft model)", ""]
    for name, rec in summary.recommendation.items():
        if rec.gamma is None:
            lines.append(f"- {name_title(name)}: no speculative runs")
            continue
        theory_part = ""
        if rec.theory_gamma is not None:
            theory_part = (
                f"; the theory, with pooled alpha {num(rec.pooled_alpha)} and the measured c and v(k), "
                f"predicts its best at gamma={rec.theory_gamma} (S = {num(rec.theory_speedup)})"
                if rec.theory_gamma
                else f"; the theory (pooled alpha {num(rec.pooled_alpha)}, measured c and v(k)) predicts "
                "no gamma beats plain decoding"
            )
        if rec.gamma:
            lines.append(
                f"- {name_title(name)}: **gamma = {rec.gamma}** (median steady-state speedup "
                f"{num(rec.speedup)}x over plain decoding){theory_part}."
            )
        else:
            lines.append(
                f"- {name_title(name)}: **plain decoding** - no gamma was faster (best: gamma="
                f"{rec.best_measured_gamma}, {num(rec.speedup)}x){theory_part}."
            )
    return lines + [""]


def _trials_check(result: BenchResult, summary: Summary) -> list[str]:
    trials = result.config.trials
    if trials <= 1:
        return []
    differing = summary.trials_differing
    verdict = (
        f"the trials of {len(differing)} runs emitted different tokens: {', '.join(differing)} (the kept "
        "run is the fastest, whatever it emitted)"
        if differing
        else "every method's trials emitted the same tokens, so they differ in timing only"
    )
    return [f"- Each method ran {trials} times per prompt and sampling row with the same seed; {verdict}."]


def _greedy_check(summary: Summary) -> list[str]:
    rows = [r for r in summary.rows if r.temperature == 0 and r.compared_with_plain is not None]
    if not rows:
        return []
    lines = [
        "## Greedy outputs against plain decoding",
        "",
        "At temperature 0 every method should emit the target's greedy tokens; differences can only come "
        "from the numerics of a k-token versus a 1-token forward pass (docs/algorithm.md sections 4 and 7), "
        "and are reported here rather than hidden.",
        "",
    ]
    for r in rows:
        lines.append(f"- {r.label}: {r.same_tokens_as_plain} of {r.compared_with_plain} runs identical")
    return lines + [""]


LLAMACPP_NOTE = (
    "- llama.cpp plain (and lookup): llama-cpp-python's `Llama.generate` on the target's GGUF file (its own "
    "Q4_K / Q6_K kernels), the same prompt token ids, every token timestamped as it comes out; they run "
    "after our methods. Their rounds are read from their proposals (lookup) or are one token each (plain)."
)


ORTGENAI_NOTE = (
    "- onnxruntime-genai plain (and ngram): onnxruntime-genai's own `Generator` on the ONNX model folder its "
    "model builder wrote (the onnx backend's export of the target, or the folder given to --ortgenai), the "
    "same prompt token ids, every token timestamped as it comes out of `generate_next_token`; they run "
    "last. The generator ends a sequence at EOS; when EOS is ignored the peer appends it and decodes on. "
    "Their rounds are read from the generator's statistics (ngram) or are one token each (plain); their "
    "passes are not timed apart, so no costs price them. Unless our engine runs on that same folder "
    "(--backend onnx) they decode another model than ours (an int4 re-quantization of the target), so "
    "their greedy tokens may differ from our plain decoding's."
)


def _method_notes(config: BenchConfig) -> list[str]:
    lines = [
        "## How this was measured",
        "",
        "- For each prompt and sampling row the methods run back to back (plain, each method and gamma, HF "
        "assisted, HF plain) after a warm-up of every method, each from empty KV caches and with the same "
        "seed. With --trials N the whole sequence runs N times in turn and each method keeps its fastest "
        "run (highest steady-state tokens/s; bench.json lists every trial's speed and whether the trials "
        "emitted the same tokens): on this shared machine noise only ever slows a run down, so the "
        "fastest of N is the least disturbed measurement, as timeit keeps the fastest repeat.",
        "- Methods of our engine (exactspec.decoding.strategy, as `generate` builds them): speculative = the "
        "draft model with token verification; speculative-block = the same drafts with block verification; "
        "ngram = prompt lookup (no draft model, c = 0); hybrid = lookup where the history matches, the draft "
        "model elsewhere; adaptive = the draft model with gamma chosen per round in 0..gamma from running "
        "acceptance and c, v(k) measured once per pair and machine (ModelPair.cost_model), before the "
        "timed runs; "
        "ngram-adaptive = prompt lookup with that rule (c = 0) kept per row and per match length "
        "(decoding.gamma.LookupGamma; results written before it, at code 6d4296c and older, kept one rule "
        "per row).",
        "- Steady-state tokens/s = tokens after the first round / time after the first round (round "
        "boundaries from the engine's rounds, and from HF's streamer, which receives one chunk per round).",
        "- alpha = accepted / proposed draft tokens, pooled over prompts; tokens/round = emitted tokens / "
        "rounds (it includes the last round, cut short by max_new_tokens).",
        "- " + _prediction_note(),
        "- measured / predicted below 1 is the cost the model leaves out: the per-token work outside the "
        "forward passes (transforms, sampling, verification, Python), which plain decoding pays once per "
        "token and speculative decoding once per draft token plus once per round.",
        "- " + FULL_RUN_NOTE,
        "",
    ]
    if config.llamacpp or config.llamacpp_lookup:
        lines.insert(-1, LLAMACPP_NOTE)
    if config.ortgenai or config.ortgenai_ngram:
        lines.insert(-1, ORTGENAI_NOTE)
    return lines


def _prediction_note() -> str:
    return PREDICTION_NOTE[0].upper() + PREDICTION_NOTE[1:]
