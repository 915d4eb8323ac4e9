"""The defaults' speed against plain decoding on the built-in pair, settings in fresh processes, alternated.

Settings (`--settings`, each in `--processes` fresh processes, the order reversed every other round by
`_alternated.run_alternated`, so drift in the machine's speed falls on all of them):
- plain: gamma 0 (plain decoding through the same engine and backend);
- defaults: what `exactspec generate` does with no flag (the default drafter, planned gamma);
- model, hybrid, suffix: that drafter (`--drafter NAME`, planned gamma), the draft model loaded beside
  the target where the drafter runs it.

Each process loads the pair once (`--backend`, default auto: what a user gets) and decodes, timing each
request from submission to its last token (prefill included, as a user waits for it):
- coding+grounded: the bench's 8 coding and 6 grounded prompts, at T = 0 and at T = 0.7 (seed 11);
- edits: the 8 repetitive edit requests, in order, at T = 0;
- first-run: `make run`'s prompt (scripts/first-run-prompt.txt), at T = 0.
EOS is masked so that every run of a prompt makes `--max-new-tokens` tokens in every setting. The report
gives tokens/s per prompt (median over processes) and, per workload, the median and lowest ratio of each
setting to plain decoding, twice: end to end (the prefill included: what a user waits for) and after the
first streamed event (decoding alone, as `exactspec bench` reports it).

    python scripts/defaults_speed.py --processes 2 --out docs/bench/defaults-speed
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from _alternated import machine_before, run_alternated, write_report

SETTINGS = ("plain", "defaults", "model", "hybrid", "suffix")
SEED = 11
FIRST_RUN_PROMPT = Path(__file__).with_name("first-run-prompt.txt")


def workloads() -> dict[str, list[tuple[str, str, bool, float]]]:
    """workload -> (name, text, chat, temperature) of each request, in the order they are sent."""
    from exactspec.bench.prompts import GROUNDED_PROMPTS, PROMPTS
    from exactspec.bench.workloads import edit_prompts

    coding = [p for p in PROMPTS if p.category == "coding"] + list(GROUNDED_PROMPTS)
    return {
        "coding+grounded": [(f"{p.name} T=0", p.text, p.chat, 0.0) for p in coding]
        + [(f"{p.name} T=0.7", p.text, p.chat, 0.7) for p in coding],
        "edits": [(p.name, p.text, p.chat, 0.0) for p in edit_prompts()],
        "first-run": [("first-run-prompt", FIRST_RUN_PROMPT.read_text(), True, 0.0)],
    }


def one(setting: str, backend: str, max_new_tokens: int, only: list[str] | None) -> dict:
    """A child: decode every request with one setting; returns its record."""
    from exactspec.api.decoder import SpeculativeDecoder
    from exactspec.decoding.strategy import Strategy
    from exactspec.foundations.defaults import DEFAULTS
    from exactspec.foundations.settings import SamplingSettings
    from exactspec.models.backends.registry import Workload

    drafter = DEFAULTS.drafter if setting in ("plain", "defaults") else setting
    strategy = Strategy(drafter)
    gamma = 0 if setting == "plain" else None  # None: the drafter's default cap
    cap = strategy.default_gamma(DEFAULTS.weights)  # what `exactspec generate` loads the pair for
    workload = Workload.plain() if setting == "plain" else Workload(drafter, strategy.needs_draft_model, cap)
    started = time.perf_counter()
    decoder = SpeculativeDecoder.from_pretrained(
        draft=DEFAULTS.draft if workload.draft_model else None,
        backend=backend,
        progress=False,
        workload=workload,
    )
    loaded = time.perf_counter() - started
    eos = {token: float("-inf") for token in decoder.target.eos_token_ids}
    warm = SamplingSettings(temperature=0.0, logit_bias=eos)
    decoder.generate("def warm_up():", gamma=gamma, max_new_tokens=16, settings=warm, drafter=drafter)
    rates: dict[str, dict[str, float]] = {}  # tokens / seconds from submission to the last token
    decode_rates: dict[str, dict[str, float]] = {}  # tokens after the first event / seconds after it
    token_ids: dict[str, dict[str, list[int]]] = {}  # what each request generated (seeded: comparable)
    for workload_name, requests in workloads().items():
        if only and workload_name not in only:
            continue
        rates[workload_name], decode_rates[workload_name], token_ids[workload_name] = {}, {}, {}
        for name, text, chat, temperature in requests:
            settings = SamplingSettings(temperature=temperature, logit_bias=eos)
            begun = time.perf_counter()
            first_at, first_tokens, ids = None, 0, []
            for event in decoder.stream(
                text,
                gamma=gamma,
                max_new_tokens=max_new_tokens,
                settings=settings,
                seed=SEED,
                chat=chat,
                drafter=drafter,
            ):
                if first_at is None:
                    first_at, first_tokens = time.perf_counter(), len(event.token_ids)
                ids += event.token_ids
            ended = time.perf_counter()
            assert first_at is not None
            tokens = len(ids)
            token_ids[workload_name][name] = ids
            rates[workload_name][name] = tokens / (ended - begun)
            decode_rates[workload_name][name] = (tokens - first_tokens) / max(ended - first_at, 1e-9)
    return {
        "setting": setting,
        "backend": decoder.pair.describe_backend(),
        "load_seconds": loaded,
        "rates": rates,
        "decode_rates": decode_rates,
        "token_ids": token_ids,
    }


def report(records: dict[str, list[dict]], max_new_tokens: int, field: str = "rates") -> tuple[str, dict]:
    """The tables of `field`: "rates" (from submission) or "decode_rates" (after the first event)."""

    def rate(setting: str, workload: str, prompt: str) -> float:
        return statistics.median(r[field][workload][prompt] for r in records[setting])

    others = [s for s in records if s != "plain"]
    backends = {s: runs[0]["backend"] for s, runs in records.items()}
    measured = {
        "rates": "tokens/s from submission to the last token (the prompt's prefill included)",
        "decode_rates": "tokens/s after the first streamed event (the prefill and first round left out)",
    }[field]
    lines = [
        f"{max_new_tokens} tokens a request (EOS masked), {measured}, median over processes; backends: "
        + "; ".join(f"{s}: {b}" for s, b in backends.items()),
        "",
    ]
    summary: dict = {"backends": backends}
    for workload in records["plain"][0]["rates"]:
        prompts = list(records["plain"][0]["rates"][workload])
        ratios = {s: [rate(s, workload, p) / rate("plain", workload, p) for p in prompts] for s in others}
        summary[workload] = {
            s: {"median_ratio": statistics.median(r), "min_ratio": min(r)} for s, r in ratios.items()
        }
        heading = ", ".join(
            f"{s} / plain median {statistics.median(r):.2f}x (lowest {min(r):.2f}x)"
            for s, r in ratios.items()
        )
        lines += [
            f"### {workload}: {heading}",
            "",
            "| request | " + " | ".join(records) + " | " + " | ".join(f"{s} / plain" for s in others) + " |",
            "|---|" + "---:|" * (len(records) + len(others)),
        ]
        for index, prompt in enumerate(prompts):
            values = [f"{rate(s, workload, prompt):.1f}" for s in records]
            shown = [f"{ratios[s][index]:.2f}x" for s in others]
            lines.append(f"| {prompt} | " + " | ".join(values + shown) + " |")
        lines += ["", same_tokens(records, workload, prompts), ""]
    return "\n".join(lines), summary


def same_tokens(records: dict[str, list[dict]], workload: str, prompts: list[str]) -> str:
    """How many of each setting's (process, request) runs generated plain decoding's token ids (seeded)."""
    plain = {prompt: records["plain"][0]["token_ids"][workload][prompt] for prompt in prompts}
    counts = []
    for setting, runs in records.items():
        if setting == "plain":
            continue
        same = sum(run["token_ids"][workload][prompt] == plain[prompt] for run in runs for prompt in prompts)
        counts.append(f"{setting} {same} of {len(runs) * len(prompts)}")
    return "Token ids identical to plain decoding's (same seed): " + ", ".join(counts) + "."


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one", choices=SETTINGS, help=argparse.SUPPRESS)
    parser.add_argument("--settings", default="plain,defaults", help="comma-separated: " + ",".join(SETTINGS))
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--workloads", default="", help="comma-separated subset (default: all)")
    parser.add_argument("--out", type=Path, default=Path("defaults-speed-out"))
    args = parser.parse_args()
    only = [w for w in args.workloads.split(",") if w] or None
    if args.one:
        print(json.dumps(one(args.one, args.backend, args.max_new_tokens, only)))
        return 0
    settings = [s for s in args.settings.split(",") if s]
    if "plain" not in settings or any(s not in SETTINGS for s in settings):
        parser.error(f"--settings: plain and any of {', '.join(SETTINGS)}, got {args.settings!r}")
    before = machine_before()
    passed = ["--backend", args.backend, "--max-new-tokens", str(args.max_new_tokens)]
    if only:
        passed += ["--workloads", ",".join(only)]
    records = run_alternated(__file__, settings, args.processes, passed)
    text, summary = report(records, args.max_new_tokens)
    decode_text, decode_summary = report(records, args.max_new_tokens, "decode_rates")
    text = f"## End to end\n\n{text}\n## Decoding after the first event\n\n{decode_text}"
    summary = {"end_to_end": summary, "decoding": decode_summary}
    command = " ".join(["python", *sys.argv])
    write_report(
        args.out, f"`{command}`\n\n{text}", before, {"command": command, "summary": summary, "runs": records}
    )
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
