"""Write a benchmark result: `bench.json` (every raw measurement plus the summary), `report.md`, PNG plots.

bench.json is `BenchResult.to_json()` with `Summary.to_json()` under "summary"; `load_result` reads
it back into the records, and the report renders from those alone (so a bench.json renders the
report it was written with, by `render_markdown(load_result(path))`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from exactspec.bench.records import PromptRecord
from exactspec.bench.runner import (
    HF_ASSISTED,
    HF_PLAIN,
    LLAMACPP_LOOKUP,
    PLAIN,
    SPECULATIVE,
    BenchConfig,
    BenchResult,
    SamplingRow,
    is_engine_method,
)
from exactspec.bench.summary import (
    BlockSummary,
    ExpectedTokensPerRound,
    SettingRow,
    Summary,
    configured_methods,
    label,
    sampling_rows,
    summarize,
    theory_curve,
)
from exactspec.bench.theory import Spread

JSON_FILE = "bench.json"
REPORT_FILE = "report.md"
SPEEDUP_PLOT = "speedup_vs_gamma.png"
ACCEPTANCE_PLOT = "acceptance_by_position.png"
COSTS_PLOT = "costs.png"

FULL_RUN_NOTE = (
    "The full run (16 prompts, gamma in 1,2,4,6,8, temperatures 0 and 0.7, 128 new tokens, HF assisted and "
    "HF plain) makes 16 x 2 x 8 = 256 generations of 128 tokens (plus a prefill each, up to ~400 prompt "
    "tokens); each report estimates its duration from the speeds that run measured. --prompts, --gammas and "
    "--max-new-tokens cut it down."
)


def write_outputs(result: BenchResult, out_dir: str | Path, *, plots: bool = True) -> dict[str, Path]:
    """Write bench.json, report.md and (with `plots`) the PNG plots; returns name -> path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(result)
    paths = {"json": out / JSON_FILE, "report": out / REPORT_FILE}
    with paths["json"].open("w", encoding="utf-8") as handle:
        json.dump({**result.to_json(), "summary": summary.to_json()}, handle, indent=1, allow_nan=False)
        handle.write("\n")
    if plots:
        paths.update(write_plots(result, summary, out))
    paths["report"].write_text(render_markdown(result, summary, plots=plots), encoding="utf-8")
    return paths


def load_result(path: str | Path) -> BenchResult:
    """Read a bench.json back; `write_outputs` or `render_markdown` renders it again (the summary is
    recomputed from the raw measurements, so the file's own "summary" is not read)."""
    with Path(path).open(encoding="utf-8") as handle:
        data = json.load(handle)
    data.pop("summary", None)
    return BenchResult.from_json(data)


# --------------------------------------------------------------------------- markdown


def render_markdown(result: BenchResult, summary: Summary | None = None, *, plots: bool = True) -> str:
    summary = summary or summarize(result)
    lines = ["# exactspec bench", ""]
    lines += _header(result, summary)
    lines += _recommendation(summary)
    lines += _costs_in_run(summary)
    lines += _costs(summary)
    for sampling in sampling_rows(result):
        lines += _results_table(summary, sampling)
        lines += _predicted_table(summary, sampling)
    for sampling in sampling_rows(result):
        lines += _per_prompt_tables(result, summary, sampling)
    lines += _block_table(summary)
    lines += _tree_table(summary)
    lines += _adaptive_table(summary)
    if result.config.hf_assisted:
        lines += _hf_section(result, summary)
    if result.config.llamacpp_lookup:
        lines += _lookup_section(summary)
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
            f"- {role}: {name}{m.class_name}, {_count(m.parameters)} parameters, {m.dtype}{packed}, "
            f"{m.layers} layers, vocabulary {m.vocab_size}"
        )

    categories: dict[str, int] = {}
    for p in prompts:
        categories[p.category] = categories.get(p.category, 0) + 1
    mix = ", ".join(f"{n} {c}" for c, n in sorted(categories.items()))
    estimate = summary.estimated_full_run_seconds
    methods = ", ".join(label(m, g) for m, g in configured_methods(result) if is_engine_method(m))
    backend = models.backend or "hf"
    lines = [
        *_provenance(result),
        f"- backend of our engine: `{backend}` (every method of ours ran its passes there)",
        model_line("target"),
        model_line("draft"),
        f"- prompts: {len(prompts)} ({mix}): {', '.join(p.name for p in prompts)}",
        f"- {config.max_new_tokens} new tokens per run"
        + (" (EOS ignored by every side, so every run makes exactly that many)" if config.ignore_eos else "")
        + f"; methods {methods}"
        f"; sampling rows {', '.join(_setting_title(s) for s in sampling_rows(result))}; "
        f"seed {config.seed} "
        "(+ prompt index)"
        + (
            f"; each method run {config.trials} times in turn with that seed, its fastest run kept"
            if config.trials > 1
            else ""
        ),
        f"- duration: {_duration(result.duration_seconds)} (cost measurement "
        f"{_duration(result.costs.seconds)}, warm-up {_duration(result.warmup_seconds)})",
    ]
    if not _nan(estimate):
        lines.append(
            f"- estimated duration of the full default run at the speeds seen here: {_duration(estimate)}. "
            + FULL_RUN_NOTE
        )
    machine = result.provenance.machine if result.provenance else None
    cpus = (machine.cores if machine else None) or 0
    # The end figure counts the bench's own threads; what is left of it is other work.
    own = min(machine.torch_threads if machine else 0, cpus)
    load_start, load_end = result.environment.load_average_start, result.environment.load_average_end
    others = max(load_start[0] if load_start else 0.0, (load_end[0] - own) if load_end else 0.0)
    if load_start and cpus and others > 0.5 * cpus:
        lines.append(
            "- **the machine was loaded during this run** (load average, less the bench's own threads at "
            "the end, above half the CPU count): absolute timings are noisy and ratios less so, because "
            "every setting of a prompt ran back to back."
        )
    return lines + [""]


def _setting_title(sampling: SamplingRow) -> str:
    """`T=0`, `T=0.7`, or a named row with its settings: `realistic (T=0.7 top_k=20 top_p=0.8 rep=1.05)`."""
    name = sampling.name
    if name == f"{sampling.settings.temperature:g}":
        return f"T={name}"
    return f"{name} ({sampling.settings.describe()})"


def _name_title(name: str) -> str:
    """A sampling row's name as a reader wants it: `T=0` for a temperature, the name otherwise."""
    try:
        float(name)
    except ValueError:
        return name
    return f"T={name}"


def _recommendation(summary: Summary) -> list[str]:
    lines = ["## Recommendation (token-verified draft model)", ""]
    for name, rec in summary.recommendation.items():
        if rec.gamma is None:
            lines.append(f"- {_name_title(name)}: no speculative runs")
            continue
        theory_part = ""
        if rec.theory_gamma is not None:
            theory_part = (
                f"; the theory, with pooled alpha {_f(rec.pooled_alpha)} and the measured c and v(k), "
                f"predicts its best at gamma={rec.theory_gamma} (S = {_f(rec.theory_speedup)})"
                if rec.theory_gamma
                else f"; the theory (pooled alpha {_f(rec.pooled_alpha)}, measured c and v(k)) predicts "
                "no gamma beats plain decoding"
            )
        if rec.gamma:
            lines.append(
                f"- {_name_title(name)}: **gamma = {rec.gamma}** (median steady-state speedup "
                f"{_f(rec.speedup)}x over plain decoding){theory_part}."
            )
        else:
            lines.append(
                f"- {_name_title(name)}: **plain decoding** - no gamma was faster (best: gamma="
                f"{rec.best_measured_gamma}, {_f(rec.speedup)}x){theory_part}."
            )
    return lines + [""]


def _costs(summary: Summary) -> list[str]:
    costs, forward = summary.costs, summary.forward_costs
    ks = sorted(costs.v)
    lines = [
        "## Cost ratios (timed forwards on a warm KV cache)",
        "",
        "| | target 1-token step | draft step | c | " + " | ".join(f"v({k})" for k in ks) + " |",
        "|---|---:|---:|---:|" + "---:|" * len(ks),
    ]
    for name, source in (("through the adapter", costs), ("forward pass only", forward)):
        if not source.v:  # no forward hooks on this backend: its adapter calls are the passes
            continue
        lines.append(
            f"| {name} | {_ms(source.target_step_seconds)} | {_ms(source.draft_step_seconds)} | "
            f"{_f(source.c, 3)} | " + " | ".join(_f(source.v.get(k), 2) for k in ks) + " |"
        )
    per_token = ", ".join(
        f"{_name_title(t)}: {_f(ms, 1)} ms" for t, ms in summary.transform_and_sample_ms.items()
    )
    lines += [
        "",
        "c = draft step / target 1-token step; v(k) = target k-token forward / target 1-token forward. "
        "A round costs gamma c + v(gamma+1) target steps. The adapter rows are what the engine pays per "
        "model call and are used for the predictions.",
        f"Work outside the models per emitted token (sampling transforms over the vocabulary plus one draw): "
        f"{per_token}.",
        "",
    ]
    policy = summary.gamma_policy_costs
    if policy:
        v = ", ".join(_f(x, 2) for x in policy.v)
        lines += [
            f"Adaptive gamma optimised with its own measurement (ModelPair.cost_model, once per pair, a "
            f"48-token cache): c = {_f(policy.c, 3)}, v(1..{len(policy.v)}) = {v}.",
            "",
        ]
    return lines


def _costs_in_run(summary: Summary) -> list[str]:
    """The one-token step, c and v(k) of each backend timed in this run: what the predictions price."""
    if not summary.costs_in_run:
        return []
    ks = sorted({k for item in summary.costs_in_run for k in item.costs.v})
    lines = [
        "## Costs measured in this run",
        "",
        "| passes of | how | one-token step | draft step | c | " + " | ".join(f"v({k})" for k in ks) + " |",
        "|---|---|---:|---:|---:|" + "---:|" * len(ks),
    ]
    for item in summary.costs_in_run:
        costs = item.costs
        lines.append(
            f"| {item.name} | {item.how} | {_ms(costs.target_step_seconds)} | "
            f"{_ms(costs.draft_step_seconds)} | {_f(costs.c, 3)} | "
            + " | ".join(_f(costs.v.get(k), 2) for k in ks)
            + " |"
        )
    first = summary.costs_in_run[0]
    lines += [
        "",
        f"Fastest of {first.repeats} timed passes each (exactspec.models.costs.measure_cost_model's rule: "
        f"other work only ever adds time), on a warm cache of {first.context_tokens} tokens: k new tokens "
        "scored in one pass, v(k) = its time over the one-token step's; c = one draft-model step over it "
        "(llama.cpp peer: the draft's GGUF file in llama-cpp-python, which runs no draft model itself). "
        "The tables \"predicted from the run's rounds\" price every run's own rounds with these.",
        "",
    ]
    return lines


def _predicted_table(summary: Summary, sampling: SamplingRow) -> list[str]:
    """Per method: its rounds priced with the costs measured in the run, beside its measured speed."""
    rows = [r for r in summary.rows_at(sampling.name) if r.costs_of or r.over_fastest_plain]
    if not rows:
        return []
    lines = [
        f"### Predicted from the run's rounds and costs, {_setting_title(sampling)}",
        "",
        "| method | costs of | draft steps/round | tokens scored/round | tokens/round | predicted speedup "
        "| predicted tokens/s | tokens/s | measured / predicted | over fastest plain | predicted over "
        "fastest plain | planner's round-time error |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        over = r.over_fastest_plain
        lines.append(
            f"| {r.label} | {r.costs_of or '-'} | {_f(r.draft_steps_per_round)} | {_f(r.scored_per_round)} | "
            f"{_f(r.tokens_per_round)} | {_f(r.predicted_from_rounds)} | "
            f"{_f(r.predicted_tokens_per_second)} | {_f(r.tokens_per_second.median)} | "
            f"{_f(r.over_predicted)} | {_spread(over) if over else '-'} | "
            f"{_f(r.predicted_over_fastest_plain)} | {_f(r.round_time_error)} |"
        )
    lines += [
        "",
        "Each run's steady rounds (after the first, which holds the prefill) priced with the costs measured "
        "in this run for what ran them (the table above): a round costs c per draft-model step plus v(k) per "
        "target pass of k tokens, in one-token steps; predicted speedup = steady tokens / those steps "
        "(over that backend's plain decoding, whose rounds cost 1 each); predicted tokens/s = that speedup "
        "/ the one-token step. measured / predicted below 1 is the time outside the passes (sampling, "
        "verification, Python, for llama-cpp-python its own loop). over fastest plain: tokens/s over the "
        "fastest plain decoding of the same prompt in this run (ours, llama.cpp's, HF's), median [min, "
        "max] over prompts; predicted over fastest plain: the same ratio of the predictions. planner's "
        "round-time error: for methods that plan (adaptive gamma), the median over the run's rounds of "
        "|predicted / measured - 1| for the planner's own round-time model (decoding.round_times), median "
        "over prompts. Medians over prompts; draft steps and tokens scored per round pooled.",
        "",
    ]
    return lines


def _results_table(summary: Summary, sampling: SamplingRow) -> list[str]:
    rows = summary.rows_at(sampling.name)
    if not rows:
        return []
    name, temperature = sampling.name, sampling.settings.temperature
    if name == f"{temperature:g}":
        title = f"## Temperature {name} ({'greedy' if temperature == 0 else 'sampling'})"
    else:
        title = f"## {name.capitalize()} settings ({sampling.settings.describe()})"
    lines = [
        title,
        "",
        "| setting | tokens/s | speedup: median [min, max] | end-to-end speedup | alpha | tokens/round "
        "| draft tokens/round | E(alpha) | c | v(gamma+1) | predicted S | S(tokens/round) "
        "| measured / predicted "
        "| overhead | outside models |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        predicted = r.gamma > 0 and not _nan(r.predicted_speedup)
        ours = is_engine_method(r.method)
        lines.append(
            "| "
            + " | ".join(
                [
                    r.label,
                    _f(r.tokens_per_second.median),
                    _spread(r.speedup),
                    _f(r.end_to_end_speedup.median),
                    _f(r.alpha, 3),
                    _f(r.tokens_per_round),
                    _f(r.mean_draft_length) if ours and r.gamma else "",
                    _f(r.expected_tokens_per_round) if predicted else "",
                    _f(r.c, 3) if predicted else "",
                    _f(r.v) if predicted else "",
                    _f(r.predicted_speedup) if predicted else "",
                    _f(r.predicted_speedup_from_tokens_per_round) if predicted else "",
                    _f(r.measured_over_predicted) if predicted else "",
                    _overhead(r) if ours else "",
                    _pct(r.outside_model_fraction),
                ]
            )
            + " |"
        )
    lines += [
        "",
        "tokens/s and speedups are steady state (after the first round, which holds the prefill); speedup is "
        "over our plain decoding of the same prompt, median and [min, max] over prompts; end-to-end speedup "
        "includes the prefill. draft tokens/round = proposed draft tokens / rounds (below gamma when "
        "adaptive gamma drafts less, or prompt lookup finds no match). The prediction columns are left "
        "empty where one fixed gamma and one c do not describe the method (adaptive gamma, hybrid). "
        "overhead = (verify + other) / total engine time (DecodeMetrics), and that "
        "time per round; outside models = share of wall time not spent in a forward pass of either model "
        "(timed by forward hooks, so HF is measured the same way).",
        "",
    ]
    speculative_rows = [r for r in rows if r.method == SPECULATIVE]
    if speculative_rows:
        lines.append(
            "In-run cost ratios (forward passes during the runs, prefill excluded): "
            + "; ".join(f"gamma={r.gamma}: c {_f(r.run_c, 3)}, v {_f(r.run_v)}" for r in speculative_rows)
            + "."
        )
        lines.append("")
    return lines


def _per_prompt_tables(result: BenchResult, summary: Summary, sampling: SamplingRow) -> list[str]:
    """Per prompt at one sampling row: tokens/s of every method, then speedup and tokens/round."""
    runs = [r for r in summary.per_prompt if r.setting == sampling.name]
    if not runs:
        return []
    methods = [
        (m, g) for m, g in configured_methods(result) if any(r.method == m and r.gamma == g for r in runs)
    ]
    prompts = list(dict.fromkeys(r.prompt for r in runs))
    cell = {(r.prompt, r.method, r.gamma): r for r in runs}
    header = "| prompt | category | " + " | ".join(label(m, g) for m, g in methods) + " |"
    rule = "|---|---|" + "---:|" * len(methods)
    lines = [f"### Per prompt, {_setting_title(sampling)}: tokens/s (steady state)", "", header, rule]
    for prompt in prompts:
        first = next(r for r in runs if r.prompt == prompt)
        values = [cell.get((prompt, m, g)) for m, g in methods]
        lines.append(
            f"| {prompt} | {first.category} | "
            + " | ".join(_f(v.tokens_per_second) if v else "" for v in values)
            + " |"
        )
    lines += [
        "",
        f"### Per prompt, {_setting_title(sampling)}: speedup over plain / tokens per round",
        "",
        header,
        rule,
    ]
    for prompt in prompts:
        first = next(r for r in runs if r.prompt == prompt)
        values = [cell.get((prompt, m, g)) for m, g in methods]
        lines.append(
            f"| {prompt} | {first.category} | "
            + " | ".join(f"{_f(v.speedup)}x / {_f(v.tokens_per_round)}" if v else "" for v in values)
            + " |"
        )
    return lines + [""]


def _tree_table(summary: Summary) -> list[str]:
    if not summary.tree_vs_chain:
        return []
    lines = [
        "## Several candidates against one chain (same drafts, same p)",
        "",
        "Expected tokens per round of each tree round, walking the whole tree (tree verification) and "
        "walking its first branch alone, which is the chain the drafter proposes with one branch; "
        "both from the same round's p, so chance is out of the comparison.",
        "",
        "| sampling | method | tree rounds | tokens/round, tree | tokens/round, its chain | gain "
        "| median gain over prompts |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for gain in summary.tree_vs_chain:
        lines.append(
            f"| {gain.setting} | {label(gain.method, gain.gamma)} | {gain.tree_rounds} "
            f"| {gain.tree_tokens_per_round:.3f} | {gain.chain_tokens_per_round:.3f} "
            f"| {gain.gain:.3f}x | {gain.median_gain:.3f}x |"
        )
    return lines + [""]


def _block_table(summary: Summary) -> list[str]:
    pairs = summary.block_vs_token
    if not pairs:
        return []
    lines = [
        "## Block against token verification (same drafts' model, same gamma, prompt and seed)",
        "",
        *_block_summary(summary.block_summary),
        "| sampling | prompt | gamma | tokens/round, token | tokens/round, block "
        "| expected, token run's rounds: token / block rule / block weights "
        "| expected, block run's rounds: token / block rule / block weights "
        "| tokens/s, token | tokens/s, block | wall-clock gain |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def scored(item: ExpectedTokensPerRound | None) -> str:
        if item is None:
            return "-"
        return f"{item.token:.3f} / {item.block:.3f} / {_f(item.block_weights, 3)}"

    for p in pairs:
        lines.append(
            f"| {_name_title(p.setting)} | {p.prompt} | {p.gamma} | "
            f"{_f(p.token_tokens_per_round)} | {_f(p.block_tokens_per_round)} | "
            f"{scored(p.expected_on_token_rounds)} | {scored(p.expected_on_block_rounds)} | "
            f"{_f(p.token_tokens_per_second)} | "
            f"{_f(p.block_tokens_per_second)} | {_f(p.wall_clock_gain, 3)}x |"
        )
    lines += [
        "",
        "tokens/round: what each run emitted (sampled). Both verifiers see the same target forward per "
        "round, but the drafts differ after the first round in which they emit different tokens (at T > 0 "
        "the random streams are then used differently), so sampled differences include chance. expected: "
        "1 + the "
        "expected kept draft tokens per round under each rule, both computed in closed form on the same "
        "rounds (exactspec.verifiers.expected; each run scores both rules on its own drafts and targets, "
        "untimed): the paired comparison, free of the verifiers' coin flips. Block verification's guarantee "
        "is in expectation over the drafts, so a run's rounds can still favour the token rule by chance in "
        "the drafts; at T=0 both rules keep the same tokens. block weights: 1 + the mean sum of block "
        "verification's weights w_1..w_L per round (exactspec.verifiers.expected.block_weight_sum), whose "
        "mean over drafts is the block rule's expected kept tokens as well: it shares the drafts' chance "
        "with the token rule's column and is never below it on any round, so the two measure the size of "
        "the gain with the drafts' noise taken out.",
        "",
    ]
    return lines


def _block_summary(block: BlockSummary | None) -> list[str]:
    """The block-vs-token pairs in a few numbers: sampled gains, the paired expectation, over the drafts."""
    if block is None:
        return []
    lines = [
        f"- {block.pairs} prompt x sampling x gamma pairs: median tokens/round gain "
        f"{_f(block.median_tokens_per_round_gain, 3)}x, median wall-clock gain "
        f"{_f(block.median_wall_clock_gain, 3)}x (block run / token run; two sampled runs, so chance "
        "is in both)."
    ]
    if block.scorings:
        below = block.expected_below
        lines.append(
            f"- Both rules scored on the same rounds ({block.scorings} scorings, each pair on both runs' "
            f"rounds): the block rule's expected tokens/round above the token rule's in "
            f"{block.expected_ahead}, equal in {block.expected_tied}, below in {len(below)}"
            + (f" ({', '.join(below)})" if below else "")
            + f"; median ratio {_f(block.median_expected_gain, 3)}x."
        )
    over = block.over_drafts
    if over:
        lines.append(
            "- Over the drafts (the sum of block verification's weights against the token rule's "
            f"expectation), at the sampled rows: above on {over.ahead_on} of {over.scorings} scorings, "
            f"ratio median {_f(over.median_gain, 4)}x [{_f(over.min_gain, 4)}, {_f(over.max_gain, 4)}]."
        )
    return lines + [""]


def _adaptive_table(summary: Summary) -> list[str]:
    """Adaptive gamma against the fixed gamma with the highest median speedup, per sampling row."""
    if not summary.adaptive_vs_fixed:
        return []
    lines = [
        "## Adaptive gamma against the best fixed gamma (draft model, token verification)",
        "",
        "| sampling | adaptive | median speedup | best fixed gamma | its median speedup "
        "| faster than it on (prompts) | median per-prompt ratio |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for item in summary.adaptive_vs_fixed:
        lines.append(
            f"| {_name_title(item.setting)} | {item.label} | {_f(item.median)}x | "
            f"{item.best_fixed_gamma} | {_f(item.best_fixed_median)}x | "
            f"{item.faster_on} of {item.paired_prompts} | {_f(item.median_ratio)}x |"
        )
    lines += [
        "",
        "Best fixed gamma: the speculative gamma with the highest median speedup at that sampling row. "
        "The two medians may come from different prompts; the last two columns compare the two methods "
        "prompt by prompt (ratio = adaptive speedup / fixed-gamma speedup on the same prompt).",
        "",
    ]
    return lines


def _hf_section(result: BenchResult, summary: Summary) -> list[str]:
    policy = result.hf_policy
    threshold = policy.assistant_confidence_threshold if policy else None
    adaptive = (
        "re-fitted from an ROC curve each round"
        if policy and policy.adaptive_confidence_threshold
        else "fixed: HF re-fits it only when scikit-learn is installed, and it is not"
    )
    lines = [
        "## Hugging Face assisted generation",
        "",
        f"Draft length policy (the assistant's generation config with HF defaults): num_assistant_tokens="
        f"{policy.num_assistant_tokens if policy else None}, schedule "
        f"`{policy.num_assistant_tokens_schedule if policy else None}`, "
        f"assistant_confidence_threshold={threshold} ({adaptive}): the draft stops early when its own "
        "probability of the token it drew falls below the threshold. It runs stock transformers, as its "
        "users run it: the loaded modules with their dense weights and transformers' own attention "
        "(our engine runs its own copies, packed when --weights says). Same prompts, seeds and number "
        "of new tokens; the same sampling settings as our runs of each row.",
        "",
        "| sampling | generator | rounds | mean draft length | draft lengths used (length: rounds) | alpha "
        "| tokens/round | tokens/s | speedup over our plain | speedup over HF plain |",
        "|---:|---|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in summary.rows:
        if r.method != HF_ASSISTED:
            continue
        histogram = ", ".join(f"{k}: {n}" for k, n in (r.hf_draft_lengths or {}).items())
        lines.append(
            f"| {_name_title(r.setting)} | {', '.join(r.hf_generator)} | "
            f"{'' if r.rounds is None else r.rounds} | "
            f"{_f(r.hf_mean_draft_length, 1)} | {histogram} | {_f(r.alpha, 3)} | "
            f"{_f(r.tokens_per_round)} | {_f(r.tokens_per_second.median)} | "
            f"{_spread(r.speedup)} | {_spread(r.speedup_over_hf_plain)} |"
        )
    for r in summary.rows:
        if r.method == HF_PLAIN:
            lines.append(
                f"\nHF plain `generate` at {_name_title(r.setting)}: {_f(r.tokens_per_second.median)} "
                f"tokens/s, {_spread(r.speedup)} x our plain decoding."
            )
    return lines + [""]


LOOKUP_NOTE = (
    "llama-cpp-python's prompt lookup decoding, run as its README shows it: `Llama(..., draft_model="
    "LlamaPromptLookupDecoding(num_pred_tokens=N))` with `Llama.generate`. Each round the draft model "
    "proposes up to N tokens that follow the first earlier occurrence of the last 2 (else 1) tokens "
    "(fewer when the history ends sooner), none when nothing matches; one `Llama.eval` scores the pending "
    "token and the proposal; llama.cpp's "
    "sampler chain then samples position by position and keeps a proposed token when the token it sampled "
    "there equals it; the first that differs is emitted in its place and ends the round. With a "
    "deterministic proposal every emitted token is the sampler's own draw from the target given the "
    "tokens before it, so this keeps plain sampling's law at every temperature (not only greedy; "
    "tests/audit/test_audit_llamacpp.py: with the same seed it emits plain decoding's very tokens, and "
    "`exactspec audit --backend llamacpp --generator llamacpp-lookup` tests it), up to the numerics of "
    "a k-token pass; a position's acceptance is p(proposed token). Its sampler chain is llama.cpp's "
    "(penalties over the generated tokens, top-k, top-p, min-p before the temperature), not ours."
)


def _lookup_section(summary: Summary) -> list[str]:
    """llama-cpp-python's prompt lookup decoding: how it drafts and keeps, its rounds and acceptance."""
    lines = [
        "## llama.cpp prompt lookup decoding (LlamaPromptLookupDecoding)",
        "",
        LOOKUP_NOTE,
        "",
        "| sampling | method | rounds | mean proposal | proposal lengths (length: rounds) | alpha "
        "| tokens/round | tokens/s | over fastest plain |",
        "|---:|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in summary.rows:
        if r.method != LLAMACPP_LOOKUP:
            continue
        histogram = ", ".join(f"{k}: {n}" for k, n in (r.hf_draft_lengths or {}).items())
        over = r.over_fastest_plain
        lines.append(
            f"| {_name_title(r.setting)} | {r.label} | {'' if r.rounds is None else r.rounds} | "
            f"{_f(r.hf_mean_draft_length, 1)} | {histogram} | {_f(r.alpha, 3)} | {_f(r.tokens_per_round)} | "
            f"{_f(r.tokens_per_second.median)} | {_spread(over) if over else '-'} |"
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
        "acceptance and c, v(k) measured once per pair (ModelPair.cost_model), before the timed runs; "
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
    return lines


def _prediction_note() -> str:
    from exactspec.bench.summary import PREDICTION_NOTE

    return PREDICTION_NOTE[0].upper() + PREDICTION_NOTE[1:]


# --------------------------------------------------------------------------- plots


def write_plots(result: BenchResult, summary: Summary, out: Path) -> dict[str, Path]:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.ticker import MaxNLocator

    settings = sampling_rows(result)
    paths = {}

    fig, axes = plt.subplots(1, len(settings), figsize=(5.5 * len(settings), 4.2), squeeze=False)
    for ax, sampling in zip(axes[0], settings, strict=True):
        rows = summary.rows_at(sampling.name)
        spec = [r for r in rows if r.method == SPECULATIVE]
        if spec:
            gammas = [r.gamma for r in spec]
            med = [_nan_to(r.speedup.median) for r in spec]
            low = [m - _nan_to(r.speedup.low, m) for m, r in zip(med, spec, strict=True)]
            high = [_nan_to(r.speedup.high, m) - m for m, r in zip(med, spec, strict=True)]
            ax.errorbar(
                gammas, med, yerr=[low, high], fmt="o-", capsize=4, label="measured (median, min-max)"
            )
            ax.plot(gammas, [r.predicted_speedup for r in spec], "s--", label="predicted S (alpha at gamma)")
            rec = summary.recommendation.get(sampling.name)
            alpha = rec.pooled_alpha if rec else None
            if alpha is not None and not _nan(alpha):
                curve = theory_curve(alpha, summary.costs)
                ax.plot(
                    [g for g, _ in curve],
                    [s for _, s in curve],
                    ":",
                    color="gray",
                    label=f"theory, pooled alpha={alpha:.2f}",
                )
        others = [r for r in rows if is_engine_method(r.method) and r.method not in (PLAIN, SPECULATIVE)]
        for r in others:
            if not _nan(r.speedup.median):
                ax.plot([r.gamma], [r.speedup.median], "D", label=r.label)
        for r in rows:
            if r.method == HF_ASSISTED and not _nan(r.speedup.median):
                ax.axhline(r.speedup.median, color="tab:red", linestyle="-.", label="HF assisted")
            if r.method == HF_PLAIN and not _nan(r.speedup.median):
                ax.axhline(r.speedup.median, color="tab:green", linestyle=(0, (1, 3)), label="HF plain")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("gamma (draft tokens per round)")
        ax.set_ylabel("speedup over plain decoding")
        ax.set_title(_setting_title(sampling))
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    paths["speedup_plot"] = _save_figure(plt, fig, out / SPEEDUP_PLOT)

    fig, axes = plt.subplots(1, len(settings), figsize=(5.5 * len(settings), 4.2), squeeze=False)
    for ax, sampling in zip(axes[0], settings, strict=True):
        for r in summary.rows_at(sampling.name):
            if r.method != SPECULATIVE:
                continue
            rates = r.acceptance_by_position
            ax.plot(range(1, len(rates) + 1), [_nan_to(x) for x in rates], "o-", label=f"gamma={r.gamma}")
        ax.set_ylim(0, 1.05)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("draft position i (given positions < i were accepted)")
        ax.set_ylabel("acceptance rate")
        ax.set_title(_setting_title(sampling))
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    paths["acceptance_plot"] = _save_figure(plt, fig, out / ACCEPTANCE_PLOT)

    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    for name, source, style in (
        ("v(k), adapter (median)", summary.costs, "o-"),
        ("v(k), forward only (median)", summary.forward_costs, "s--"),
    ):
        if not source.v:
            continue
        ks = sorted(source.v)
        ax.plot(ks, [source.v[k] for k in ks], style, label=name)
    for item in summary.costs_in_run:
        ks = sorted(item.costs.v)
        ax.plot(ks, [item.costs.v[k] for k in ks], ":", marker="^", label=f"v(k), {item.name} (fastest)")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("k (tokens in one target forward)")
    ax.set_ylabel("time / one-token time")
    ax.set_title(f"target cost ratios (c = {summary.costs.c:.3f})")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    paths["costs_plot"] = _save_figure(plt, fig, out / COSTS_PLOT)
    return paths


def _save_figure(plt: Any, fig: Any, path: Path) -> Path:
    """Lay out, write as PNG and free one figure; returns its path."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- formatting


def _nan(x: Any) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def _nan_to(x: Any, default: float = 0.0) -> float:
    return default if _nan(x) else float(x)


def _f(x: Any, digits: int = 2) -> str:
    return "-" if _nan(x) else f"{x:.{digits}f}"


def _pct(x: Any) -> str:
    return "-" if _nan(x) else f"{100 * x:.1f}%"


def _ms(seconds: Any) -> str:
    return "-" if _nan(seconds) else f"{1000 * seconds:.1f} ms"


def _overhead(row: SettingRow) -> str:
    """`3.5% (45 ms/round)`: share of engine time outside the forwards' callers, and its cost per round."""
    per_round = row.overhead_ms_per_round
    suffix = "" if _nan(per_round) else f" ({per_round:.0f} ms/round)"
    return _pct(row.overhead_fraction) + suffix


def _spread(spread: Spread) -> str:
    if _nan(spread.median):
        return "-"
    return f"{spread.median:.2f} [{spread.low:.2f}, {spread.high:.2f}]"


def _count(n: float) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e8 else f"{n / 1e6:.2f} M"


def _duration(seconds: Any) -> str:
    if _nan(seconds):
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def prompt_table(prompts: Sequence[PromptRecord]) -> str:
    """A small Markdown table of the prompts (name, category, tokens)."""
    lines = ["| prompt | category | tokens |", "|---|---|---:|"]
    lines += [f"| {p.name} | {p.category} | {p.tokens} |" for p in prompts]
    return "\n".join(lines)
