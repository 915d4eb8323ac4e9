"""Load test of `exactspec serve`: N concurrent streaming clients with mixed settings, speculative vs plain.

For each output length (--max-tokens, default 32 and 128), each concurrency level (default 1, 2, 4,
8, 16) and each mode (speculative: requests leave gamma to the server; plain: `"gamma": 0` per
request, the same server decoding with the target alone), it sends `max(concurrency,
--min-requests)` streaming requests (default 8: each coding prompt once, so every level sends the same
mix of prompt lengths), at most `concurrency` in flight, and reports p50 / p95 time
to first token, tokens/s per request (completion tokens / request wall time) and in total (all
completion tokens / wall time of the level), and the inter-token latency of the requests already
streaming while another one waits for its first token (p95: what a joining prompt costs them).
Prompts are the built-in coding benchmark prompts (chat ones through /v1/chat/completions,
completion prefixes through /v1/completions); settings rotate through greedy, T=0.7 top-p 0.9,
T=1 top-k 40 and T=0.8 with a repetition penalty, every sampled request seeded.

The server it starts is `exactspec serve`'s: the same defaults (the built-in pair, the backend
auto, the suffix drafter, adaptive gamma planned per round up to --gamma, --prefill-chunk),
--fixed-gamma as in serve.

    # the built-in pair, started in this process (what docs/bench/serve/ was made with):
    python scripts/serve_load.py --out docs/bench/serve
    # or drive a server that is already running:
    python scripts/serve_load.py --url http://127.0.0.1:8000 --out load-out

With `--peer llamacpp`, a third mode drives llama-cpp-python's own OpenAI server (`python -m
llama_cpp.server`, the `llamacpp` extra's [server] part) on the same GGUF target with the same threads
and the same requests (top_k and the repetition penalty under its own names; no gamma), started as a
subprocess beside ours; only one of the two servers is under load at a time. Its server handles one
request at a time (a lock around its one `Llama`), so concurrent requests queue there.

Each request's prompt starts with its own number (a chat message "Request N: ...", a completion
"# request N" line), so requests share no more than the chat template's system prompt. With
`--same-prompts` the eight prompts repeat as they are (what load tests before 2026-12-06 sent), and a
server that shares prompt prefixes (ONNX Runtime and llama.cpp backends: `share_prefixes`) then finds
most of a repeated prompt in the cells of an earlier request (on llama.cpp, of one still running).
The table's "prompt tokens shared" column is the server's own count (/health `shared_prompt_tokens`)
over the level's prompt tokens.

Before the first level each mode gets `--warmup-requests` unrecorded requests (16 tokens, 2 at a
time), so that what a server pays for its first requests falls on no level; then (`warm_buffers`) as
many requests at once as the highest level sends, one of them longer than any level's prompt and
answer together, so that the server's KV buffers already hold the rows and positions every level
needs. They grow on demand and never shrink, so a growth is a one-time cost that fell on whichever
mode first needed it: on 2026-12-06 (ONNX backend, Zen 4, 32-token prefill chunks) speculative
decoding, the first mode at each level, ran 16 requests of 128 tokens at 0.92x of plain in two runs
of two, and in one process the first of four alternated runs of that level (speculative) took 42.3 s,
the three after it 39.7 to 40.4 s whatever their mode. With `--repeats N` each
level runs N times, the modes in the given order and then reversed, alternately; a mode's figures pool
its repeats (total tokens/s: all their tokens over all their time) and the table also gives each
repeat's speculative / plain ratio.

Writes `results.json`, `table.md` and `serve.png` into --out, after every level.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from exactspec.foundations.defaults import DEFAULTS
from exactspec.foundations.metrics import ROUND_COUNTS, round_shares

SETTINGS_MIX: list[dict[str, Any]] = [
    {"temperature": 0.0},
    {"temperature": 0.7, "top_p": 0.9},
    {"temperature": 1.0, "extra_body": {"top_k": 40}},
    {"temperature": 0.8, "extra_body": {"repetition_penalty": 1.1}},
]


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def start_server(args: argparse.Namespace) -> str:
    """Load the pair and serve it from a thread of this process; returns the base URL."""
    import uvicorn

    from exactspec.cli.common import workload
    from exactspec.decoding.strategy import Strategy
    from exactspec.models.pair import ModelPair
    from exactspec.server.app import create_app
    from exactspec.server.service import Service

    strategy = Strategy(drafter=args.drafter, adaptive_gamma=not args.fixed_gamma)
    pair = ModelPair.from_pretrained(
        args.target,
        args.draft if strategy.needs_draft_model else None,
        dtype=args.dtype,
        device=args.device,
        weights=args.weights,
        backend=args.backend,
        # As exactspec serve: "auto" chooses for this drafter on a batch of --max-batch rows.
        workload=workload(args, strategy, plain=False, rows=args.max_batch),
        report=lambda line: print(f"[load test] {line}", file=sys.stderr, flush=True),
    )
    print(f"[load test] {pair.describe_backend()}", file=sys.stderr, flush=True)
    args.backend_ran = pair.backend
    gamma = args.gamma
    if gamma is None:  # as exactspec serve chooses it
        gamma = args.gamma = strategy.default_gamma(pair.weights)
    service = Service(
        pair,
        gamma=gamma,
        max_batch=args.max_batch,
        max_waiting=1024,
        strategy=strategy,
        prefill_chunk=args.prefill_chunk,
        progress=lambda line: print(f"[load test] {line}", file=sys.stderr, flush=True),
    )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(create_app(service), host="127.0.0.1", port=port, log_level="warning")
    )
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return f"http://127.0.0.1:{port}"


UNIQUE_PROMPTS: itertools.count | None = None
"""The numbers that make each request's prompt its own (`one_request`; None with --same-prompts)."""

PEER_NAMES = {"repetition_penalty": "repeat_penalty"}
"""vLLM-style extra fields under the names llama-cpp-python's server reads."""


def start_llamacpp_server(args: argparse.Namespace) -> tuple[str, subprocess.Popen]:
    """llama-cpp-python's OpenAI server on the target's GGUF file, in a subprocess; (base URL, process)."""
    import httpx

    from exactspec.models.loading import gguf_path

    path = gguf_path(args.target, progress=False)
    if path is None:
        raise SystemExit(f"--peer llamacpp needs a GGUF target; {args.target} is not one")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [
        sys.executable, "-m", "llama_cpp.server", "--model", str(path), "--model_alias", "exactspec",
        "--n_threads", str(args.threads), "--n_threads_batch", str(args.threads), "--n_ctx", "4096",
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    log = open(Path(args.out) / "llamacpp-server.log", "w")  # noqa: SIM115 (kept open with the process)
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"llama_cpp.server exited ({process.returncode}); see {log.name}")
        try:
            if httpx.get(base + "/v1/models", timeout=2).status_code == 200:
                return base, process
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    process.kill()
    raise SystemExit("llama_cpp.server did not start within 600 s")


def completion_tokens(text: str) -> int:
    """Tokens of a completion's text, for a server that reports no usage while streaming."""
    from exactspec.models.loading import load_tokenizer

    global _TOKENIZER
    if _TOKENIZER is None:
        _TOKENIZER = load_tokenizer("default-target", progress=False)
    return len(_TOKENIZER(text, add_special_tokens=False)["input_ids"])


_TOKENIZER: Any = None


def coding_prompts() -> list[Any]:
    """The built-in coding benchmark prompts, the load test's requests (`BenchPrompt`s)."""
    from exactspec.bench.prompts import PROMPTS

    return [p for p in PROMPTS if p.category == "coding"]


async def one_request(
    client: Any, index: int, gamma: int | None, max_tokens: int, peer: bool = False
) -> dict[str, Any]:
    coding = coding_prompts()
    prompt = coding[index % len(coding)]
    text = prompt.text
    if UNIQUE_PROMPTS is not None:  # no two requests of the run share their text (unless --same-prompts)
        number = next(UNIQUE_PROMPTS)
        text = f"Request {number}: {text}" if prompt.chat else f"# request {number}\n{text}"
    options = dict(SETTINGS_MIX[index % len(SETTINGS_MIX)])
    extra = dict(options.pop("extra_body", {}))
    if peer:
        extra = {PEER_NAMES.get(key, key): value for key, value in extra.items()}
    if gamma is not None:
        extra["gamma"] = gamma
    if options["temperature"] > 0:
        options["seed"] = index
    common = dict(
        model="exactspec",
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=extra,
        **options,
    )
    started = time.perf_counter()
    first = None
    usage = None
    stats = None
    arrivals: list[float] = []  # when each streamed piece of text arrived
    answer = ""
    if prompt.chat:
        stream = await client.chat.completions.create(messages=[{"role": "user", "content": text}], **common)
    else:
        stream = await client.completions.create(prompt=text, **common)
    async for chunk in stream:
        if chunk.choices:
            piece = chunk.choices[0].delta.content if prompt.chat else chunk.choices[0].text
            if piece:
                arrivals.append(time.perf_counter())
                first = first or arrivals[-1]
                answer += piece
        if chunk.usage is not None:
            usage = chunk.usage
            stats = (chunk.model_extra or {}).get("exactspec")
    ended = time.perf_counter()
    tokens = usage.completion_tokens if usage is not None else completion_tokens(answer)
    return {
        "prompt": prompt.name,
        "settings": SETTINGS_MIX[index % len(SETTINGS_MIX)],
        "started": started,
        "first_token_at": first or ended,
        "arrivals": arrivals,
        "ttft": (first or ended) - started,
        "seconds": ended - started,
        "tokens": tokens,
        "prompt_tokens": usage.prompt_tokens if usage is not None else None,
        "tokens_per_second": tokens / (ended - started),
        "acceptance_rate": (stats or {}).get("acceptance_rate"),
        "tokens_per_round": (stats or {}).get("tokens_per_round"),
    }


async def send_level(
    base: str, concurrency: int, requests: int, gamma: int | None, max_tokens: int, peer: bool = False
) -> tuple[list[dict[str, Any]], float]:
    """Send `requests` requests, at most `concurrency` in flight; their results and the level's wall time."""
    import openai

    limit = asyncio.Semaphore(concurrency)
    async with openai.AsyncOpenAI(
        base_url=base + "/v1", api_key="none", max_retries=0, timeout=3600
    ) as client:

        async def bounded(index: int) -> dict[str, Any]:
            async with limit:
                return await one_request(client, index, gamma, max_tokens, peer)

        started = time.perf_counter()
        results = await asyncio.gather(*(bounded(i) for i in range(requests)))
        return list(results), time.perf_counter() - started


async def warm_buffers(base: str, rows: int, max_tokens: int, args: argparse.Namespace) -> None:
    """Grow the server's KV buffers to what the levels need before the first one: `rows` requests at
    once (the most a level runs together), plain, of `max_tokens` tokens each (the longest level's: rows
    that join while the first ones still decode, as at that level, so that `rows` rows are cached at
    once), one of them with a prompt longer than any coding prompt plus `max_tokens` plus a draft block
    (the longest prompt's text repeated; 4 tokens of answer). Nothing is recorded."""
    import openai

    coding = coding_prompts()
    tokens = {p.text: completion_tokens(p.text) for p in coding}
    longest = max(tokens, key=tokens.__getitem__)
    block = (args.gamma if args.gamma is not None else 8) + 1  # a draft block, at the server's gamma
    copies = (tokens[longest] + max_tokens + block) // tokens[longest] + 1
    long_text = "\n\n".join([longest] * copies)
    async with openai.AsyncOpenAI(
        base_url=base + "/v1", api_key="none", max_retries=0, timeout=3600
    ) as client:

        async def one(index: int) -> None:
            text = long_text if index == 0 else f"Warm-up {index}: {coding[index % len(coding)].text}"
            plain = {"gamma": 0}
            length = 4 if index == 0 else max_tokens  # the long prompt alone reaches the positions needed
            try:
                await client.completions.create(
                    model="exactspec", prompt=text, max_tokens=length, temperature=0.0, extra_body=plain
                )
            except openai.APIStatusError as error:  # a server with a shorter context refuses the long one
                print(
                    f"[load test] a warm-up request was refused, its buffers not grown: {error}",
                    file=sys.stderr,
                )

        await asyncio.gather(*(one(i) for i in range(rows)))


def summarize(concurrency: int, runs: list[tuple[list[dict[str, Any]], float]]) -> dict:
    """One level's figures over its repeats (`send_level`'s results and wall time, each), pooled: total
    tokens/s is all their tokens over all their wall time; each repeat's own is kept too."""
    results = [r for run, _ in runs for r in run]
    wall = sum(seconds for _, seconds in runs)
    ttfts = [r["ttft"] for r in results]
    per_request = [r["tokens_per_second"] for r in results]
    accept = [r["acceptance_rate"] for r in results if r["acceptance_rate"] is not None]
    rounds = [r["tokens_per_round"] for r in results if r["tokens_per_round"] is not None]
    total_tokens = sum(r["tokens"] for r in results)
    gaps = [b - a for r in results for a, b in itertools.pairwise(r["arrivals"])]
    while_joining: list[float] = []
    for run, _ in runs:  # clock readings compare only within one repeat
        joining = [(r["started"], r["first_token_at"]) for r in run]
        # Gaps of a streaming request that overlap another request's wait for its first token.
        while_joining += [
            later - earlier
            for r in run
            for earlier, later in itertools.pairwise(r["arrivals"])
            if any(
                begin < later and earlier < end
                for begin, end in joining
                if (begin, end) != (r["started"], r["first_token_at"])
            )
        ]
    for r in results:  # absolute clock readings mean nothing outside this process
        del r["started"], r["first_token_at"], r["arrivals"]
    return {
        "concurrency": concurrency,
        "requests": len(results),
        "repeats": len(runs),
        "wall_seconds": wall,
        "completion_tokens": total_tokens,
        "prompt_tokens": sum(r["prompt_tokens"] or 0 for r in results),
        "ttft_p50": percentile(ttfts, 0.5),
        "ttft_p95": percentile(ttfts, 0.95),
        "tokens_per_second_per_request_p50": percentile(per_request, 0.5),
        "tokens_per_second_total": total_tokens / wall,
        "repeat_tokens_per_second_total": [sum(r["tokens"] for r in run) / seconds for run, seconds in runs],
        "inter_token_p95": percentile(gaps, 0.95),
        "inter_token_p95_while_joining": percentile(while_joining, 0.95),
        "acceptance_rate_mean": statistics.fmean(accept) if accept else None,
        "tokens_per_round_mean": statistics.fmean(rounds) if rounds else None,
        "results": results,
    }


def run_level(
    base: str, concurrency: int, requests: int, gamma: int | None, max_tokens: int, peer: bool = False
) -> dict:
    """One level sent once (`send_level`) and summarized."""
    sent = asyncio.run(send_level(base, concurrency, requests, gamma, max_tokens, peer))
    return summarize(concurrency, [sent])


def table(levels: dict[str, list[dict]]) -> str:
    """One row per (output length, concurrency): speculative and plain side by side."""
    lines = [
        "| max tokens | concurrent | requests | speculative tokens/s total | plain tokens/s total "
        "| speculative / plain (each repeat) | llama_cpp.server tokens/s total "
        "| speculative / llama_cpp.server "
        "| TTFT p50 spec / plain (s) | TTFT p95 spec / plain (s) "
        "| inter-token p95 while a request joins, spec / plain (s) | acceptance | tokens/round "
        "| predicted / measured round time, median error | tokens / drafted per row-round | plain rounds "
        "| prompt tokens shared, spec / plain |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    keys = sorted({(level["max_tokens"], level["concurrency"]) for rows in levels.values() for level in rows})
    by = {mode: {(lv["max_tokens"], lv["concurrency"]): lv for lv in rows} for mode, rows in levels.items()}

    def pair(field: str, key: tuple[int, int]) -> str:
        spec, plain = by.get("speculative", {}).get(key), by.get("plain", {}).get(key)
        return " / ".join("-" if lv is None else f"{lv[field]:.2f}" for lv in (spec, plain))

    for key in keys:
        spec, plain = by.get("speculative", {}).get(key), by.get("plain", {}).get(key)
        peer = by.get("llamacpp-server", {}).get(key)
        ratio = ""
        if spec and plain:
            ratio = f"{spec['tokens_per_second_total'] / plain['tokens_per_second_total']:.2f}x"
            each = "repeat_tokens_per_second_total"
            repeats = list(zip(spec.get(each, []), plain.get(each, []), strict=True))
            if len(repeats) > 1:  # each repeat's own ratio, to show the spread
                ratio += " (" + ", ".join(f"{a / b:.2f}" for a, b in repeats) + ")"
        peer_total = "-" if peer is None else f"{peer['tokens_per_second_total']:.2f}"
        peer_ratio = ""
        if spec and peer:
            peer_ratio = f"{spec['tokens_per_second_total'] / peer['tokens_per_second_total']:.2f}x"
        error = (spec or {}).get("round_time_error")
        accept = spec["acceptance_rate_mean"] if spec else None
        per_round = spec["tokens_per_round_mean"] if spec else None
        requests = (spec or plain)["requests"]
        totals = ["-" if lv is None else f"{lv['tokens_per_second_total']:.2f}" for lv in (spec, plain)]
        lines.append(
            f"| {key[0]} | {key[1]} | {requests} | {totals[0]} | {totals[1]} | {ratio} | {peer_total} | "
            f"{peer_ratio} | {pair('ttft_p50', key)} | {pair('ttft_p95', key)} | "
            f"{pair('inter_token_p95_while_joining', key)} | "
            f"{'' if accept is None else f'{accept:.2f}'} | "
            f"{'' if per_round is None else f'{per_round:.2f}'} | "
            f"{'' if error is None else f'{error:.1%}'} | {_per_round_cells(spec)} | "
            f"{' / '.join(_shared_cell(lv) for lv in (spec, plain))} |"
        )
    return "\n".join(lines) + "\n"


def _shared_cell(level: dict | None) -> str:
    """The share of a level's prompt tokens the server copied rather than computed ('-': not reported)."""
    if level is None or level.get("shared_prompt_tokens") is None or not level.get("prompt_tokens"):
        return "-"
    return f"{level['shared_prompt_tokens'] / level['prompt_tokens']:.0%}"


def _per_round_cells(level: dict | None) -> str:
    """'tokens / drafted | plain share' of a level's rounds (`round_shares`; blank where none was given)."""
    names = ("tokens_per_row_round", "drafted_per_row_round", "plain_round_share")
    tokens, drafted, share = ((level or {}).get(name) for name in names)
    first = "" if tokens is None or drafted is None else f"{tokens:.2f} / {drafted:.2f}"
    return f"{first} | {'' if share is None else f'{share:.0%}'}"


def plot(levels: dict[str, list[dict]], path: Path) -> None:
    """Throughput and TTFT p95 by concurrency, one panel pair per output length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = sorted({level["max_tokens"] for rows in levels.values() for level in rows})
    figure, axes = plt.subplots(len(lengths), 2, figsize=(10, 3.6 * len(lengths)), squeeze=False)
    for (left, right), length in zip(axes, lengths, strict=True):
        for mode, rows in levels.items():
            chosen = [level for level in rows if level["max_tokens"] == length]
            xs = [level["concurrency"] for level in chosen]
            left.plot(xs, [level["tokens_per_second_total"] for level in chosen], marker="o", label=mode)
            right.plot(xs, [level["ttft_p95"] for level in chosen], marker="x", label=f"{mode} p95")
        left.set(
            xlabel="concurrent requests",
            ylabel="tokens/s (all requests)",
            xscale="log",
            title=f"throughput, {length}-token outputs",
        )
        right.set(
            xlabel="concurrent requests",
            ylabel="seconds",
            xscale="log",
            title=f"time to first token, {length}-token outputs",
        )
        for axis in (left, right):
            ticks = sorted({level["concurrency"] for rows in levels.values() for level in rows})
            axis.set_xticks(ticks, [str(t) for t in ticks])
            axis.legend()
            axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def write(out: Path, levels: dict[str, list[dict]], args: argparse.Namespace, argv, seconds: float) -> None:
    conditions = {
        "command": " ".join(["python scripts/serve_load.py", *(argv if argv is not None else sys.argv[1:])]),
        "target": args.target,
        "draft": args.draft,
        "dtype": args.dtype,
        "device": args.device,
        "weights": args.weights,
        "backend": args.backend,
        "backend_ran": getattr(args, "backend_ran", None),  # what "auto" chose (None with --url)
        "drafter": args.drafter,
        "peer": args.peer,
        "threads": args.threads,
        "gamma": args.gamma,
        "adaptive_gamma": not args.fixed_gamma,
        "prefill_chunk": args.prefill_chunk,
        "max_batch": args.max_batch,
        "max_tokens": args.max_tokens,
        "same_prompts": args.same_prompts,
        "settings_mix": SETTINGS_MIX,
        "total_seconds": seconds,
    }
    (out / "results.json").write_text(json.dumps({"conditions": conditions, "levels": levels}, indent=2))
    (out / "table.md").write_text(table(levels))
    plot(levels, out / "serve.png")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="drive this running server instead of starting one")
    parser.add_argument("--target", default="default-target")
    parser.add_argument("--draft", default="default-draft")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--weights", default="auto")
    parser.add_argument(
        "--gamma",
        type=int,
        default=None,
        help="the server's gamma (default: exactspec serve's for the drafter and weights)",
    )
    parser.add_argument("--fixed-gamma", action="store_true", help="as exactspec serve --fixed-gamma")
    parser.add_argument("--prefill-chunk", type=int, default=DEFAULTS.prefill_chunk)
    parser.add_argument("--max-batch", type=int, default=16, help="server batch rows (default 16)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument(
        "--min-requests",
        type=int,
        default=8,
        help="requests per level at least (default 8: every coding prompt once, so that each level's prompts "
        "are the same mix and levels compare)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs of each level, the modes' order reversed every other run, pooled (default 1)",
    )
    parser.add_argument(
        "--max-tokens", type=int, nargs="+", default=[32, 128], help="completion tokens per request"
    )
    parser.add_argument(
        "--modes",
        nargs="+",
        default=["speculative", "plain"],
        choices=["speculative", "plain", "llamacpp-server"],
        help="llamacpp-server: llama-cpp-python's own OpenAI server (also added by --peer llamacpp)",
    )
    parser.add_argument("--peer", choices=["llamacpp"], help="also drive llama-cpp-python's OpenAI server")
    parser.add_argument("--threads", type=int, default=2, help="the peer server's threads (default 2)")
    parser.add_argument(
        "--backend", default=DEFAULTS.backend, help=f"the server's backend (default {DEFAULTS.backend})"
    )
    parser.add_argument(
        "--drafter", default=DEFAULTS.drafter, help=f"the server's drafter (default {DEFAULTS.drafter})"
    )
    parser.add_argument(
        "--warmup-requests",
        type=int,
        default=2,
        help="unrecorded 16-token requests per mode (2 at a time) before the levels, then the buffers' "
        "warm-up (`warm_buffers`; default 2; 0: neither)",
    )
    parser.add_argument(
        "--same-prompts",
        action="store_true",
        help="send the eight prompts as they are (default: each numbered, so that requests share no more "
        "than the chat template)",
    )
    parser.add_argument("--out", default="load-out", help="output folder (default load-out)")
    args = parser.parse_args(argv)
    global UNIQUE_PROMPTS
    UNIQUE_PROMPTS = None if args.same_prompts else itertools.count()
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    if args.peer == "llamacpp" and "llamacpp-server" not in args.modes:
        args.modes.append("llamacpp-server")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = args.url or start_server(args)
    peer_base, peer_process = start_llamacpp_server(args) if "llamacpp-server" in args.modes else (None, None)
    levels: dict[str, list[dict]] = {}
    started = time.perf_counter()
    # The first requests a server runs pay its start (buffers growing, first passes): without a warm-up
    # that cost fell on the first level only, speculative at 1 request (0.90x to 0.97x of plain in three
    # runs of 2026-12-05 on the Zen 3, where the same level of 128 tokens, run later, gave 0.97x to 1.13x).
    for mode in args.modes if args.warmup_requests > 0 else []:
        peer = mode == "llamacpp-server"
        gamma = 0 if mode == "plain" else None
        target = peer_base if peer else base
        run_level(target, min(2, args.warmup_requests), args.warmup_requests, gamma, 16, peer)
    if args.warmup_requests > 0:
        rows = min(max(args.concurrency), args.max_batch)
        asyncio.run(warm_buffers(base, rows, max(args.max_tokens), args))
    # Every mode at each level, back to back, so that a run cut short still compares them; with --repeats
    # the level runs again with the modes in the reverse order (a slow stretch of the machine, or a
    # mode's first-run costs, falls on each mode alike), and each mode's repeats are pooled.
    for max_tokens in args.max_tokens:
        for concurrency in args.concurrency:
            requests = max(concurrency, args.min_requests)
            runs: dict[str, list[tuple[list[dict[str, Any]], float]]] = {mode: [] for mode in args.modes}
            zero = dict.fromkeys(ROUND_COUNTS, 0)
            counts: dict[str, dict[str, int] | None] = dict.fromkeys(args.modes, zero)
            shared: dict[str, int | None] = dict.fromkeys(args.modes, 0)  # prompt tokens the server shared
            for repeat in range(args.repeats):
                for mode in args.modes if repeat % 2 == 0 else args.modes[::-1]:
                    gamma = 0 if mode == "plain" else None
                    peer = mode == "llamacpp-server"
                    target = peer_base if peer else base
                    before = _round_counts(base) if not peer else None
                    shared_before = _health_value(base, "shared_prompt_tokens") if not peer else None
                    runs[mode].append(
                        asyncio.run(send_level(target, concurrency, requests, gamma, max_tokens, peer))
                    )
                    after = _round_counts(base) if before is not None else None
                    shared_after = _health_value(base, "shared_prompt_tokens") if not peer else None
                    if shared[mode] is not None and shared_before is not None and shared_after is not None:
                        shared[mode] += shared_after - shared_before
                    else:
                        shared[mode] = None
                    held = counts[mode]
                    counts[mode] = (
                        None
                        if held is None or before is None or after is None
                        else {name: held[name] + after[name] - before[name] for name in ROUND_COUNTS}
                    )
            for mode in args.modes:
                level = summarize(concurrency, runs[mode])
                if mode == "speculative":
                    level["round_time_error"] = _round_times(base)
                if (mode_counts := counts[mode]) is not None:
                    # tokens, drafts and plain rounds of the level
                    level.update(round_shares(dict.fromkeys(ROUND_COUNTS, 0), mode_counts))
                level["max_tokens"] = max_tokens
                level["shared_prompt_tokens"] = shared[mode]
                levels.setdefault(mode, []).append(level)
                report(mode, level)
            write(out, levels, args, argv, time.perf_counter() - started)  # after every level
    print(table(levels))
    if peer_process is not None:
        peer_process.terminate()
        peer_process.wait(30)
    return 0


def _round_times(base: str) -> float | None:
    """The server's median |predicted / measured - 1| of round times so far (its /health), if it says."""
    import httpx

    try:
        return httpx.get(base + "/health", timeout=10).json().get("round_time_error")
    except (httpx.HTTPError, ValueError):
        return None


def _health_value(base: str, name: str) -> int | None:
    """One count from the server's /health (None: no server, or one that does not give it)."""
    import httpx

    try:
        value = httpx.get(base + "/health", timeout=10).json().get(name)
    except (httpx.HTTPError, ValueError):
        return None
    return None if value is None else int(value)


def _round_counts(base: str) -> dict[str, int] | None:
    """The server's round counts since it started (its /health: `DecodeMetrics.round_counts`), if it says."""
    import httpx

    try:
        health = httpx.get(base + "/health", timeout=10).json()
        return {name: int(health[name]) for name in ROUND_COUNTS}
    except (httpx.HTTPError, ValueError, KeyError, TypeError):  # no server, or one without the counts
        return None


def report(mode: str, level: dict) -> None:
    concurrency = level["concurrency"]
    print(
        f"{mode:>11} n={level['max_tokens']:<4} c={concurrency:<3} ttft p50 {level['ttft_p50']:.2f}s "
        f"p95 {level['ttft_p95']:.2f}s, {level['tokens_per_second_total']:.2f} tokens/s total, "
        f"{level['tokens_per_second_per_request_p50']:.2f} per request "
        f"({level['wall_seconds']:.0f} s)",
        file=sys.stderr,
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
