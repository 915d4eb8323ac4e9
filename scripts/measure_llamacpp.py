"""Costs and plain-decoding speed of the llama.cpp backend on the built-in pair; writes results.json here.

    PYTHONPATH=. python scripts/measure_llamacpp.py [--quick]

1. c and v(1..9) through `LlamaCppModel` (`models.costs.measure_cost_model`, 300 cached tokens, min of 5).
2. 64 greedy tokens per coding prompt: exactspec plain (gamma 0) on the llama.cpp backend against
   llama.cpp's own plain decoding (`peers.llamacpp`, the high-level `Llama.generate`), same token ids.
3. Prompt lookup (drafter ngram, gamma 8) on the grounded prompts against the same two.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from exactspec.api.decoder import SpeculativeDecoder
from exactspec.bench.prompts import select_prompts
from exactspec.foundations.provenance import Provenance
from exactspec.foundations.settings import SamplingSettings
from exactspec.models.costs import measure_cost_model
from exactspec.models.pair import ModelPair
from exactspec.peers import llamacpp as peer

HERE = Path(__file__).resolve().parent.parent / "docs" / "bench" / "llamacpp-costs"
GREEDY = SamplingSettings(temperature=0.0)


def timed(decoder: SpeculativeDecoder, ids: list[int], tokens: int, **options: object) -> dict:
    started = time.perf_counter()
    out = decoder.generate([ids], max_new_tokens=tokens, settings=GREEDY, **options)
    seconds = time.perf_counter() - started
    made = len(out.completions[0].token_ids)
    return {"tokens": made, "seconds": seconds, "tok_s": made / seconds, "ids": out.completions[0].token_ids}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    provenance = Provenance.collect()
    pair = ModelPair.from_pretrained(backend="llamacpp", progress=False)
    costs = measure_cost_model(pair.target, pair.draft, 8, repeats=5, context_tokens=300)
    # One-token step in ms, timed alone (measure_cost_model gives ratios only).
    history = list(range(1000, 1300))
    pair.target.logits([history], 1)
    steps = []
    for _ in range(7):
        started = time.perf_counter()
        pair.target.logits([history], 1)
        steps.append(time.perf_counter() - started)
    pair.draft.logits([history], 1)
    draft_steps = []
    for _ in range(7):
        started = time.perf_counter()
        pair.draft.logits([history], 1)
        draft_steps.append(time.perf_counter() - started)
    pair.clear_caches()
    decoder = SpeculativeDecoder.from_pair(pair)
    llm = peer.load(pair.target.path)
    rows = []
    for category in ("coding", "grounded"):
        prompts = select_prompts(category, quick=args.quick)
        for prompt in prompts:
            ids = decoder.encode([prompt.text], chat=prompt.chat)[0]
            ours = timed(decoder, ids, args.tokens, gamma=0)
            started = time.perf_counter()
            theirs = peer.generate(llm, ids, GREEDY, args.tokens, seed=0, eos_token_ids=pair.eos_token_ids)
            peer_seconds = time.perf_counter() - started
            row = {
                "prompt": prompt.name,
                "category": category,
                "exactspec_plain_tok_s": ours["tok_s"],
                "llamacpp_plain_tok_s": len(theirs["tokens"]) / peer_seconds,
                "tokens": ours["tokens"],
                "same_tokens": ours["ids"] == theirs["tokens"],
            }
            if category == "grounded":
                lookup = timed(decoder, ids, args.tokens, gamma=8, drafter="ngram")
                row["exactspec_lookup_gamma8_tok_s"] = lookup["tok_s"]
                row["lookup_same_tokens_as_plain"] = lookup["ids"] == ours["ids"]
            print(json.dumps(row), flush=True)
            rows.append(row)
    result = {
        "provenance": provenance.to_json(),
        "threads": 2,  # LlamaCppModel and the peer both default to 2 threads
        "target_step_ms": 1000 * min(steps),
        "draft_step_ms": 1000 * min(draft_steps),
        "c": costs.draft_cost,
        "v": {str(k + 1): v for k, v in enumerate(costs.verify_costs)},
        "runs": rows,
    }
    (HERE / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1))


if __name__ == "__main__":
    main()
