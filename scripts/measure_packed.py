"""Packed weights on the default pair: cost ratios v(k), c, step times, and the distribution gap to bf16.

For each weight format (`--weights` names, `exactspec.models.hf.packed`) the pair is loaded,
packed, and measured through the same adapters the engine uses (`exactspec.bench.costs`):
the target's k-token forward on a warm KV cache for k = 1..--max-k, and the draft's
1-token step. v(k) = target k-token time / 1-token time, c = draft step / target step.

The gap: on --prompts coding prompts, the bf16 target greedily continues each prompt by
--gap-tokens tokens; both the bf16 and the packed target then score the whole sequence in
one forward pass, and the per-position total variation distance between their next-token
distributions (T = 1, softmax of the logits) is summarised (mean, median, 90th percentile,
max) with the fraction of positions whose argmax agrees.

    python scripts/measure_packed.py --out docs/bench/packed-costs/report
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from exactspec.api.decoder import SpeculativeDecoder
from exactspec.bench.costs import cost_ratios, measure_costs
from exactspec.bench.prompts import select_prompts
from exactspec.models.hf.packed import WeightFormat, set_max_rows
from exactspec.models.pair import ModelPair


def encode_prompts(pair: ModelPair, count: int) -> list[list[int]]:
    decoder = SpeculativeDecoder.from_pair(pair)
    return [decoder.encode([p.text], chat=p.chat)[0] for p in select_prompts("coding")[:count]]


def greedy_sequences(pair: ModelPair, prompts: list[list[int]], tokens: int) -> list[list[int]]:
    out = []
    with torch.inference_mode():
        for ids in prompts:
            full = pair.target_model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                do_sample=False,
                max_new_tokens=tokens,
                pad_token_id=0,
            )
            out.append(full[0].tolist())
    return out


def next_token_probs(pair: ModelPair, sequence: list[int]) -> torch.Tensor:
    """[L, V] float32 softmax of the target's logits at every position of `sequence`."""
    with torch.inference_mode():
        logits = pair.target_model(torch.tensor([sequence])).logits[0].float()  # [L, V]
    return torch.softmax(logits[:, : pair.target.vocab_size], dim=-1)


def gap(reference: list[torch.Tensor], probs: list[torch.Tensor], starts: list[int]) -> dict[str, Any]:
    """Per-position TV (and argmax agreement) over all positions and over the generated ones."""
    tv_all, tv_gen, agree_all, agree_gen = [], [], [], []
    for ref, p, start in zip(reference, probs, starts, strict=True):
        tv = 0.5 * (ref - p).abs().sum(dim=-1)  # [L]
        agree = (ref.argmax(-1) == p.argmax(-1)).float()  # [L]
        tv_all += tv.tolist()
        agree_all += agree.tolist()
        tv_gen += tv[start - 1 : -1].tolist()  # positions that predict a generated token
        agree_gen += agree[start - 1 : -1].tolist()

    def spread(values: list[float]) -> dict[str, float]:
        ordered = sorted(values)
        return {
            "mean": statistics.fmean(values),
            "median": statistics.median(values),
            "p90": ordered[int(0.9 * (len(ordered) - 1))],
            "max": ordered[-1],
        }

    return {
        "positions": len(tv_all),
        "tv_all_positions": spread(tv_all),
        "tv_generated_positions": spread(tv_gen),
        "argmax_agreement_all": statistics.fmean(agree_all),
        "argmax_agreement_generated": statistics.fmean(agree_gen),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--weights", default="bf16,int4,int4-gguf,int4-g128,int8", help="comma-separated formats"
    )
    parser.add_argument("--max-k", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=3, help="coding prompts for the gap")
    parser.add_argument("--gap-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--splits",
        default="1,2,4",
        help="for the first int4 format: also time k-token blocks scored in pieces of this many rows",
    )
    parser.add_argument("--out", default="docs/bench/packed-costs/report", help="writes OUT.json and OUT.md")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    formats = [w.strip() for w in args.weights.split(",") if w.strip()]

    def say(message: str) -> None:
        print(f"[measure_packed] {message}", file=sys.stderr, flush=True)

    result: dict[str, Any] = {
        "torch": torch.__version__,
        "threads": args.threads,
        "max_k": args.max_k,
        "repeats": args.repeats,
        "gap_tokens": args.gap_tokens,
        "formats": {},
    }
    reference: list[torch.Tensor] = []
    sequences: list[list[int]] = []
    starts: list[int] = []
    for name in formats:
        started = time.perf_counter()
        pair = ModelPair.from_pretrained(weights=name, progress=False)
        load = time.perf_counter() - started
        say(f"{name}: loaded and packed in {load:.1f} s")
        if not sequences:
            prompts = encode_prompts(pair, args.prompts)
            starts = [len(p) for p in prompts]
            sequences = greedy_sequences(pair, prompts, args.gap_tokens)
            say(f"{name}: reference sequences of {[len(s) for s in sequences]} tokens")
        entry: dict[str, Any] = {"load_seconds": load}
        probs = [next_token_probs(pair, s) for s in sequences]
        if not reference:
            reference = probs
            entry["reference"] = True
        else:
            entry["gap_to_first"] = gap(reference, probs, starts)
            say(f"{name}: gap {json.dumps(entry['gap_to_first'])}")
        del probs
        context = sequences[0]
        costs = measure_costs(pair, context, args.max_k, args.repeats, [0.0])
        # The ratios as plain dicts with int k (json.dumps writes the keys as strings).
        ratios = dataclasses.asdict(cost_ratios(costs))
        entry["costs"] = costs.to_json()
        entry["ratios"] = ratios
        entry["forward_ratios"] = dataclasses.asdict(cost_ratios(costs, forward_only=True))
        say(
            f"{name}: target step {1000 * ratios['target_step_seconds']:.1f} ms, draft step "
            f"{1000 * ratios['draft_step_seconds']:.1f} ms, c {ratios['c']:.3f}, v "
            + " ".join(f"{k}:{v:.2f}" for k, v in ratios["v"].items())
        )
        if WeightFormat.parse(name).bits == 4 and not any("split" in e for e in result["formats"].values()):
            entry["split"] = {}
            for rows in [int(s) for s in args.splits.split(",") if s.strip()]:
                set_max_rows(pair.target_model, rows)
                split = dataclasses.asdict(
                    cost_ratios(measure_costs(pair, context, args.max_k, args.repeats, [0.0]))
                )
                entry["split"][str(rows)] = split
                say(f"{name} split {rows}: v " + " ".join(f"{k}:{v:.2f}" for k, v in split["v"].items()))
            set_max_rows(pair.target_model, None)
        result["formats"][name] = entry
        del pair
        gc.collect()
    result["reference_format"] = formats[0]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    out.with_suffix(".md").write_text(markdown(result))
    say(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")
    return 0


def markdown(result: dict[str, Any]) -> str:
    ks = range(1, result["max_k"] + 1)
    lines = [
        "# Packed weights on the default pair: v(k), c and the gap to the reference",
        "",
        f"`scripts/measure_packed.py`, torch {result['torch']}, {result['threads']} threads, warm KV cache, "
        f"medians of {result['repeats']} timed calls per k through `HFLanguageModel` (as in the engine). "
        f"Reference for the gap: {result['reference_format']}.",
        "",
        "| weights | target step ms | draft step ms | c | " + " | ".join(f"v({k})" for k in ks) + " |",
        "|---|---:|---:|---:|" + "---:|" * len(ks),
    ]
    for name, entry in result["formats"].items():
        r = entry["ratios"]
        lines.append(
            f"| {name} | {1000 * r['target_step_seconds']:.1f} | {1000 * r['draft_step_seconds']:.1f} | "
            f"{r['c']:.3f} | " + " | ".join(f"{r['v'][k]:.2f}" for k in ks) + " |"
        )
        for rows, split in entry.get("split", {}).items():
            lines.append(
                f"| {name}, blocks in pieces of {rows} rows | {1000 * split['target_step_seconds']:.1f} | "
                f"{1000 * split['draft_step_seconds']:.1f} | {split['c']:.3f} | "
                + " | ".join(f"{split['v'][k]:.2f}" for k in ks)
                + " |"
            )
    lines += [
        "",
        "Gap to the reference target (T = 1 next-token distributions, per position; generated = the "
        f"{result['gap_tokens']} greedy tokens after each prompt):",
        "",
        "| weights | positions | TV mean | TV median | TV p90 | TV max | TV mean (generated) "
        "| argmax agrees (generated) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, entry in result["formats"].items():
        g = entry.get("gap_to_first")
        if g is None:
            continue
        a, gen = g["tv_all_positions"], g["tv_generated_positions"]
        lines.append(
            f"| {name} | {g['positions']} | {a['mean']:.4f} | {a['median']:.4f} | {a['p90']:.4f} | "
            f"{a['max']:.4f} | {gen['mean']:.4f} | {g['argmax_agreement_generated']:.3f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
