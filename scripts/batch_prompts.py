"""Writes an input file for `exactspec batch` from the bench prompts (coding, prose, grounded), cycled.

    python scripts/batch_prompts.py 32 --max-tokens 64 > prompts.jsonl
    exactspec batch prompts.jsonl --out answers.jsonl

Record k is bench prompt k mod 22 (ids "py-fibonacci-0", ...), with the prompt's own chat flag, so a
measured records/s names a reproducible input.
"""

from __future__ import annotations

import argparse
import json
import sys

from exactspec.bench.prompts import select_prompts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("count", type=int, help="records to write")
    parser.add_argument("--max-tokens", type=int, default=64, help="each record's max_tokens (default 64)")
    args = parser.parse_args()
    prompts = select_prompts("all+grounded")
    for k in range(args.count):
        prompt = prompts[k % len(prompts)]
        record = {"id": f"{prompt.name}-{k}", "prompt": prompt.text, "chat": prompt.chat}
        print(json.dumps({**record, "max_tokens": args.max_tokens}), file=sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
