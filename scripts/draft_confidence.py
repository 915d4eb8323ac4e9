"""How often draft tokens are accepted, by the draft model's confidence in them (what ConfidenceGamma uses).

Runs fixed-gamma speculative decoding (token verification) on bench prompts and records, for every
draft token that verification tried (tokens 1..accepted + 1 of each round), the draft model's own
top probability when it drew that token (its softmax before the sampling transforms) and whether it
was accepted. Prints acceptance per confidence bin, per sampling row.

    python scripts/draft_confidence.py --weights bf16
    python scripts/draft_confidence.py --prompts py-fibonacci,explain-tcp --gamma 4 --max-new-tokens 64

Needs the built-in pair (or --target/--draft); about 3 minutes for the defaults on 2 CPU cores.
"""

from __future__ import annotations

import argparse

import torch

from exactspec.api.text import encode_text
from exactspec.bench.prompts import select_prompts
from exactspec.decoding.engine import DecodeConfig, SpeculativeEngine
from exactspec.decoding.gamma import CONFIDENCE_BINS, ConfidenceGamma
from exactspec.drafters.model import ModelDrafter
from exactspec.foundations.costs import CostModel
from exactspec.foundations.rows import RowStart
from exactspec.foundations.sampler import SeededSampler
from exactspec.foundations.settings import REALISTIC_CHAT_SETTINGS, SamplingSettings
from exactspec.models.pair import ModelPair

DEFAULT_PROMPTS = (
    "py-fibonacci,py-lru-cache,explain-tcp,grounded-edit-retry,grounded-qa-library,grounded-fix-bug-py"
)
ROWS = {"0": SamplingSettings(temperature=0.0), "realistic": REALISTIC_CHAT_SETTINGS}


class NeverStop:
    """A `DraftStop` that tells `ConfidenceGamma` every drafted token but never stops the draft.

    The calibration is then exactly what adaptive gamma would learn from these rounds, of drafts
    that always run to gamma.
    """

    def __init__(self, calibration: ConfidenceGamma) -> None:
        self.calibration = calibration

    def keep_drafting(self, row: int, drafted: int, confidence: float) -> bool:
        self.calibration.keep_drafting(row, drafted, confidence)
        return True


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--target", default="default-target")
    parser.add_argument("--draft", default="default-draft")
    parser.add_argument("--weights", default="bf16")
    parser.add_argument("--prompts", default=DEFAULT_PROMPTS, help="bench prompt names, comma-separated")
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pair = ModelPair.from_pretrained(args.target, args.draft, weights=args.weights, progress=False)
    wanted = args.prompts.split(",")
    prompts = [p for p in select_prompts("all+grounded") if p.name in wanted]
    if len(prompts) != len(wanted):
        known = {p.name for p in prompts}
        raise SystemExit(f"unknown prompts: {', '.join(n for n in wanted if n not in known)}")
    bins = CONFIDENCE_BINS
    print("| row | " + " | ".join(f"{b / bins:.1f}-{(b + 1) / bins:.1f}" for b in range(bins)) + " |")
    print("|---|" + "---:|" * bins)
    for row_name, settings in ROWS.items():
        # Only the calibration is read: the costs feed the stop rule, which NeverStop ignores.
        calibration = ConfidenceGamma(CostModel.linear(0.0, 0.0, args.gamma))
        calibration.add_rows([RowStart(0)])  # every prompt runs as row 0
        for prompt in prompts:
            drafter = ModelDrafter(pair.draft, pair.target.vocab_size, stop=NeverStop(calibration))
            engine = SpeculativeEngine(pair.target, drafter, validate=False)
            config = DecodeConfig(gamma=args.gamma, max_new_tokens=args.max_new_tokens, settings=settings)
            ids = encode_text(pair.tokenizer, prompt.text, prompt.chat)
            for event in engine.stream([ids], config, SeededSampler(0)):
                calibration.record(0, event.proposed, event.accepted)
            pair.clear_caches()
        cells = [f"{k / n:.2f} ({n})" if n else "-" for n, k in calibration.bin_counts()]
        print(f"| {row_name} | " + " | ".join(cells) + " |")
    print(
        f"\ncells: accepted / tried draft tokens whose draft top probability fell in the bin (tried); "
        f"gamma {args.gamma}, {args.max_new_tokens} tokens per prompt, prompts {args.prompts}"
    )


if __name__ == "__main__":
    main()
