"""Pass costs of the ONNX Runtime backend beside llama.cpp's on the built-in target, interleaved in one run.

    PYTHONPATH=. python scripts/measure_onnx.py [--blocks 128,32] [--repeats 7] [--quality]

Each candidate is a `LanguageModel` on the built-in target (Qwen2.5-Coder-1.5B-Instruct): llama.cpp on
the Q4_K_M GGUF (`LlamaCppModel`, when llama-cpp-python is installed), and the GGUF exported to int4
ONNX for each block size (`OnnxModel`, spinning threads on; block 128 also with spinning off). Timed,
fastest of `--repeats`, every candidate in turn inside each repeat so that other work on the machine
spreads over all of them:

- t(k): one `logits(history, k)` call of k new tokens over a warm cache of `--context` tokens (the
  adapter rolls the last k back and feeds them again), k = 1..8; v(k) = t(k) / t(1);
- 16 rows x 1 token: one call over 16 rows of `--rows-context` tokens each, in steps of t(1).

`--quality`: teacher-forced over the text of the bench's quick coding and grounded prompts (300
positions), each ONNX export against llama.cpp's logits on the GGUF (the file exactspec calls the
built-in target): argmax agreement, total variation at T = 1, mean NLL of the next token.

Writes results.json and table.md to docs/bench/onnx-costs/ (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from exactspec.foundations.provenance import Provenance
from exactspec.models.base import LanguageModel

OUT = Path(__file__).resolve().parent.parent / "docs" / "bench" / "onnx-costs"
ROWS = 16


def candidates(
    blocks: list[int],
    threads: int,
    cache_dir: str | None,
    extra: list[str] = (),  # type: ignore[assignment]
) -> dict[str, LanguageModel]:
    from exactspec.models.loading import gguf_path
    from exactspec.models.onnx.export import ExportRecipe, exported_model
    from exactspec.models.onnx.model import OnnxModel

    gguf = gguf_path("default-target", cache_dir, progress=False)
    assert gguf is not None
    models: dict[str, LanguageModel] = {}
    try:
        from exactspec.models.llamacpp.model import LlamaCppModel, available

        if available():
            models["llama.cpp Q4_K_M"] = LlamaCppModel(gguf, threads=threads, max_rows=ROWS + 1)
    except ImportError:
        pass
    for block in blocks:
        folder = exported_model(gguf, ExportRecipe(block_size=block), cache_dir=cache_dir, progress=print)
        models[f"onnx int4 b{block}"] = OnnxModel(folder, threads=threads, max_rows=ROWS + 1, spinning=True)
        if block == blocks[0]:
            models[f"onnx int4 b{block}, no spin"] = OnnxModel(
                folder, threads=threads, max_rows=ROWS + 1, spinning=False
            )
    for text in extra:  # "BLOCK:ALGO[:MIXED]", e.g. "128:k_quant:last_matmul:int8"
        block, algo, *mixed = text.split(":", 2)
        recipe = ExportRecipe(block_size=int(block), algo=algo, mixed_precision=mixed[0] if mixed else "")
        folder = exported_model(gguf, recipe, cache_dir=cache_dir, progress=print)
        models[f"onnx {recipe.name}"] = OnnxModel(folder, threads=threads, max_rows=ROWS + 1, spinning=True)
    return models


def measure(
    models: dict[str, LanguageModel], context: int, rows_context: int, max_k: int, repeats: int
) -> dict[str, Any]:
    vocab = min(m.vocab_size for m in models.values())
    generator = torch.Generator().manual_seed(0)
    history = torch.randint(0, vocab, (context,), generator=generator).tolist()
    rows = [torch.randint(0, vocab, (rows_context,), generator=generator).tolist() for _ in range(ROWS)]
    times: dict[str, dict[str, list[float]]] = {name: {} for name in models}
    for model in models.values():  # untimed: prefill, first-call allocations
        model.logits([history], 2, rows=[ROWS])
        model.logits(rows, 1, rows=list(range(ROWS)))
    for repeat in range(repeats):
        for name, model in models.items():
            for k in range(1, max_k + 1):
                started = time.perf_counter()
                model.logits([history], k, rows=[ROWS])
                times[name].setdefault(f"k{k}", []).append(time.perf_counter() - started)
            started = time.perf_counter()
            model.logits(rows, 1, rows=list(range(ROWS)))
            times[name].setdefault(f"rows{ROWS}", []).append(time.perf_counter() - started)
        print(f"repeat {repeat + 1}/{repeats} done, load average {os.getloadavg()[0]:.1f}", flush=True)
    return times


def table(times: dict[str, dict[str, list[float]]], max_k: int) -> str:
    head = "| backend | step (ms) | " + " | ".join(f"v({k})" for k in range(2, max_k + 1))
    head += f" | {ROWS} rows x 1 (steps) |"
    lines = [head, "|---|" + "---:|" * (max_k + 1)]
    llama = times.get("llama.cpp Q4_K_M")
    for name, cells in times.items():
        step = min(cells["k1"])
        values = [min(cells[f"k{k}"]) / step for k in range(2, max_k + 1)]
        line = f"| {name} | {step * 1000:.1f} | " + " | ".join(f"{v:.2f}" for v in values)
        lines.append(line + f" | {min(cells[f'rows{ROWS}']) / step:.2f} |")
    if llama is not None:
        lines.append("")
        base = min(llama["k1"])
        for name, cells in times.items():
            if name != "llama.cpp Q4_K_M":
                lines.append(f"- {name}: one-token step {min(cells['k1']) / base:.2f}x llama.cpp's")
    return "\n".join(lines)


def quality(models: dict[str, LanguageModel], tokens: int) -> dict[str, Any]:
    """Teacher-forced agreement of each ONNX model with llama.cpp on the GGUF, over the text of the bench's
    quick coding and grounded prompts (real code and prose, not a model's own output), `tokens` scored
    positions at most: argmax agreement, total variation at T = 1, mean NLL of the next token."""
    from exactspec.bench.prompts import select_prompts
    from exactspec.models.loading import load_tokenizer

    reference = models.get("llama.cpp Q4_K_M")
    if reference is None:
        return {}
    tokenizer = load_tokenizer("default-target")
    sequences, budget = [], tokens
    for prompt in select_prompts("all+grounded", quick=True):
        ids = tokenizer(prompt.text)["input_ids"][: budget + 1]
        if len(ids) > 1 and budget > 0:
            sequences.append(ids)
            budget -= len(ids) - 1
    out: dict[str, Any] = {}
    reference_logprobs = [_logprobs(reference, ids) for ids in sequences]  # [n - 1, V] each
    for name, model in models.items():
        if name == "llama.cpp Q4_K_M" or "no spin" in name:
            continue
        agree = positions = 0
        tvs: list[float] = []
        nll = nll_gguf = 0.0
        for ids, q in zip(sequences, reference_logprobs, strict=True):
            p = _logprobs(model, ids)
            following = torch.tensor(ids[1:])  # the token each position predicts
            agree += int((p.argmax(-1) == q.argmax(-1)).sum())
            positions += len(following)
            tvs += (0.5 * (p.exp() - q.exp()).abs().sum(-1)).tolist()
            nll -= float(p[torch.arange(len(following)), following].sum())
            nll_gguf -= float(q[torch.arange(len(following)), following].sum())
        tvs.sort()
        out[name] = {
            "positions": positions,
            "argmax_agreement": agree / positions,
            "tv_median": tvs[len(tvs) // 2],
            "tv_p99": tvs[int(0.99 * (len(tvs) - 1))],
            "tv_max": tvs[-1],
            "nll_mean": nll / positions,
            "nll_mean_gguf": nll_gguf / positions,
        }
    return out


def _logprobs(model: LanguageModel, ids: list[int]) -> torch.Tensor:
    """[n - 1, V] float64 log-probabilities after each prefix ids[:1] .. ids[:n - 1] (row j predicts
    ids[j + 1]), in one pass on a fresh cache."""
    model.clear_cache()  # type: ignore[attr-defined]
    logits = model.logits([ids], len(ids))[0, :-1]  # [n - 1, V]: the last position predicts nothing here
    model.clear_cache()  # type: ignore[attr-defined]
    return torch.log_softmax(logits.double(), -1)


def generation(
    backends: list[str], tokens: int, repeats: int, threads: int, cache_dir: str | None
) -> dict[str, Any]:
    """tokens/s of `exactspec generate`'s path (plain, and the defaults: suffix drafter, adaptive gamma),
    greedy, on each backend's target, over the bench's quick coding and grounded prompts; backends,
    modes and prompts interleaved in each repeat, fastest kept; a fresh decoder (and suffix tree) for
    each run, so no run drafts from another's output."""
    from exactspec.api.decoder import SpeculativeDecoder
    from exactspec.bench.prompts import select_prompts
    from exactspec.foundations.settings import SamplingSettings
    from exactspec.models.pair import ModelPair

    greedy = SamplingSettings(temperature=0.0)
    pairs = {
        name: ModelPair.from_pretrained(
            "default-target", None, backend=name, threads=threads, cache_dir=cache_dir, progress=False
        )
        for name in backends
    }
    prompts = select_prompts("all+grounded", quick=True)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for repeat in range(repeats):
        for prompt in prompts:
            for name, pair in pairs.items():
                for mode, options in (("plain", {"gamma": 0}), ("defaults", {})):
                    decoder = SpeculativeDecoder.from_pair(pair)
                    started = time.perf_counter()
                    out = decoder.generate(
                        prompt.text, max_new_tokens=tokens, settings=greedy, chat=prompt.chat, **options
                    )
                    seconds = time.perf_counter() - started
                    made = len(out.completions[0].token_ids)
                    record = {"tokens": made, "seconds": seconds, "tokens_per_second": made / seconds}
                    runs.setdefault(prompt.name, {}).setdefault(f"{name} {mode}", []).append(record)
                    print(f"{prompt.name} {name} {mode}: {made / seconds:.2f} tokens/s", flush=True)
        print(f"repeat {repeat + 1}/{repeats} done, load average {os.getloadavg()[0]:.1f}", flush=True)
    return runs


def generation_table(runs: dict[str, dict[str, list[dict[str, Any]]]]) -> str:
    """Fastest tokens/s per prompt and method, and each method over llama.cpp plain."""
    methods = list(next(iter(runs.values())))
    lines = ["| prompt | " + " | ".join(methods) + " |", "|---|" + "---:|" * len(methods)]
    for prompt, by_method in runs.items():
        best = {m: max(r["tokens_per_second"] for r in by_method[m]) for m in methods}
        base = best.get("llamacpp plain", best[methods[0]])  # llama.cpp plain if it ran, else the first
        cells = [f"{best[m]:.2f} ({best[m] / base:.2f}x)" for m in methods]
        lines.append(f"| {prompt} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", default="128,32", help="int4 block sizes to export and measure")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--recipe",
        action="append",
        default=[],
        help="another int4 export to measure, BLOCK:ALGO[:MIXED] (e.g. 128:k_quant:last_matmul:int8)",
    )
    parser.add_argument("--context", type=int, default=300, help="cached tokens of the one-row passes")
    parser.add_argument(
        "--rows-context", type=int, default=64, help=f"cached tokens of each of the {ROWS} rows"
    )
    parser.add_argument("--max-k", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--quality", action="store_true", help="also the teacher-forced quality check")
    parser.add_argument("--quality-tokens", type=int, default=300)
    parser.add_argument("--quality-only", action="store_true", help="print the quality check alone")
    parser.add_argument(
        "--generate-only", action="store_true", help="time plain and default generation on both backends"
    )
    parser.add_argument("--generate-tokens", type=int, default=128)
    parser.add_argument("--generate-backends", default="onnx,llamacpp", help="backends --generate-only runs")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    provenance = Provenance.collect()
    load_before = os.getloadavg()
    if args.generate_only:
        backends = args.generate_backends.split(",")
        runs = generation(backends, args.generate_tokens, args.repeats, args.threads, args.cache_dir)
        text = generation_table(runs)
        print(text)
        args.out.mkdir(parents=True, exist_ok=True)
        record = {"provenance": provenance.to_json(), "load_average_before": load_before}
        record |= {"load_average_after": os.getloadavg(), "tokens": args.generate_tokens, "runs": runs}
        (args.out / "generate.json").write_text(json.dumps(record, indent=2) + "\n")
        (args.out / "generate.md").write_text(text + "\n")
        return
    blocks = [int(b) for b in args.blocks.split(",")]
    models = candidates(blocks, args.threads, args.cache_dir, args.recipe)
    if args.quality_only:
        print(json.dumps(quality(models, args.quality_tokens), indent=2))
        return
    times = measure(models, args.context, args.rows_context, args.max_k, args.repeats)
    text = table(times, args.max_k)
    print(text)
    results: dict[str, Any] = {
        "provenance": provenance.to_json(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "threads": args.threads,
        "context": args.context,
        "rows_context": args.rows_context,
        "repeats": args.repeats,
        "times": times,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table.md").write_text(text + "\n")
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    if args.quality:
        results["quality"] = quality(models, args.quality_tokens)
        print(json.dumps(results["quality"], indent=2))
        (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
