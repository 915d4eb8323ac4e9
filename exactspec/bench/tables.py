"""The report's tables of one sampling row and of the costs: cost ratios, the costs measured in the run,
the results per setting, the predictions from each run's rounds, and per prompt."""

from __future__ import annotations

from exactspec.bench.formatting import (
    is_nan,
    millis,
    name_title,
    num,
    overhead_text,
    percent,
    setting_title,
    spread_text,
)
from exactspec.bench.methods import SPECULATIVE, SamplingRow, is_engine_method, label
from exactspec.bench.result import BenchResult, configured_methods
from exactspec.bench.summary_records import Summary


def costs_table(summary: Summary) -> list[str]:
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
            f"| {name} | {millis(source.target_step_seconds)} | {millis(source.draft_step_seconds)} | "
            f"{num(source.c, 3)} | " + " | ".join(num(source.v.get(k), 2) for k in ks) + " |"
        )
    per_token = ", ".join(
        f"{name_title(t)}: {num(ms, 1)} ms" for t, ms in summary.transform_and_sample_ms.items()
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
        v = ", ".join(num(x, 2) for x in policy.v)
        lines += [
            "Adaptive gamma optimised with its own measurement (ModelPair.cost_model, once per pair and "
            f"machine, a 48-token cache): c = {num(policy.c, 3)}, v(1..{len(policy.v)}) = {v}.",
            "",
        ]
    return lines


def costs_in_run_table(summary: Summary) -> list[str]:
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
            f"| {item.name} | {item.how} | {millis(costs.target_step_seconds)} | "
            f"{millis(costs.draft_step_seconds)} | {num(costs.c, 3)} | "
            + " | ".join(num(costs.v.get(k), 2) for k in ks)
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


def predicted_table(summary: Summary, sampling: SamplingRow) -> list[str]:
    """Per method: its rounds priced with the costs measured in the run, beside its measured speed."""
    rows = [r for r in summary.rows_at(sampling.name) if r.costs_of or r.over_fastest_plain]
    if not rows:
        return []
    lines = [
        f"### Predicted from the run's rounds and costs, {setting_title(sampling)}",
        "",
        "| method | costs of | draft steps/round | tokens scored/round | tokens/round | predicted speedup "
        "| predicted tokens/s | tokens/s | measured / predicted | over fastest plain | predicted over "
        "fastest plain | planner's round-time error |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        over = r.over_fastest_plain
        lines.append(
            f"| {r.label} | {r.costs_of or '-'} | {num(r.draft_steps_per_round)} | "
            f"{num(r.scored_per_round)} | {num(r.tokens_per_round)} | {num(r.predicted_from_rounds)} | "
            f"{num(r.predicted_tokens_per_second)} | {num(r.tokens_per_second.median)} | "
            f"{num(r.over_predicted)} | {spread_text(over) if over else '-'} | "
            f"{num(r.predicted_over_fastest_plain)} | {num(r.round_time_error)} |"
        )
    lines += [
        "",
        "Each run's steady rounds (after the first, which holds the prefill) priced with the costs measured "
        "in this run for what ran them (the table above): a round costs c per draft-model step plus v(k) per "
        "target pass of k tokens, in one-token steps; predicted speedup = steady tokens / those steps "
        "(over that backend's plain decoding, whose rounds cost 1 each); predicted tokens/s = that speedup "
        "/ the one-token step. measured / predicted below 1 is the time outside the passes (sampling, "
        "verification, Python, for llama-cpp-python its own loop). over fastest plain: tokens/s over the "
        "fastest plain decoding of the same prompt in this run (ours, llama.cpp's, HF's, "
        "onnxruntime-genai's), median [min, max] over prompts; predicted over fastest plain: the same ratio "
        "of the predictions. planner's "
        "round-time error: for methods that plan (adaptive gamma), the median over the run's rounds of "
        "|predicted / measured - 1| for the planner's own round-time model (decoding.round_times), median "
        "over prompts. Medians over prompts; draft steps and tokens scored per round pooled.",
        "",
    ]
    return lines


def results_table(summary: Summary, sampling: SamplingRow) -> list[str]:
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
        predicted = r.gamma > 0 and not is_nan(r.predicted_speedup)
        ours = is_engine_method(r.method)
        lines.append(
            "| "
            + " | ".join(
                [
                    r.label,
                    num(r.tokens_per_second.median),
                    spread_text(r.speedup),
                    num(r.end_to_end_speedup.median),
                    num(r.alpha, 3),
                    num(r.tokens_per_round),
                    num(r.mean_draft_length) if ours and r.gamma else "",
                    num(r.expected_tokens_per_round) if predicted else "",
                    num(r.c, 3) if predicted else "",
                    num(r.v) if predicted else "",
                    num(r.predicted_speedup) if predicted else "",
                    num(r.predicted_speedup_from_tokens_per_round) if predicted else "",
                    num(r.measured_over_predicted) if predicted else "",
                    overhead_text(r) if ours else "",
                    percent(r.outside_model_fraction),
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
            + "; ".join(f"gamma={r.gamma}: c {num(r.run_c, 3)}, v {num(r.run_v)}" for r in speculative_rows)
            + "."
        )
        lines.append("")
    return lines


def per_prompt_tables(result: BenchResult, summary: Summary, sampling: SamplingRow) -> list[str]:
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
    lines = [f"### Per prompt, {setting_title(sampling)}: tokens/s (steady state)", "", header, rule]
    for prompt in prompts:
        first = next(r for r in runs if r.prompt == prompt)
        values = [cell.get((prompt, m, g)) for m, g in methods]
        lines.append(
            f"| {prompt} | {first.category} | "
            + " | ".join(num(v.tokens_per_second) if v else "" for v in values)
            + " |"
        )
    lines += [
        "",
        f"### Per prompt, {setting_title(sampling)}: speedup over plain / tokens per round",
        "",
        header,
        rule,
    ]
    for prompt in prompts:
        first = next(r for r in runs if r.prompt == prompt)
        values = [cell.get((prompt, m, g)) for m, g in methods]
        lines.append(
            f"| {prompt} | {first.category} | "
            + " | ".join(f"{num(v.speedup)}x / {num(v.tokens_per_round)}" if v else "" for v in values)
            + " |"
        )
    return lines + [""]
