"""Soak test of `exactspec serve`: hours of mixed traffic against one server process, and how it holds up.

Starts `python -m exactspec serve` as a subprocess on 127.0.0.1 (the built-in pair by default;
`--target/--draft` name others, `--tiny` serves the test suite's tiny float32 target, built in a
temporary folder, with the default drafter), then keeps `--concurrency` clients busy for
`--duration` seconds. Each client sends one request after another, drawn from a seeded mix:
completions or chat, streaming or not, greedy or sampled with top-p, top-k, min-p, a repetition
penalty or OpenAI's presence and frequency penalties, one or two choices, a `--structured-share` under a
JSON schema (`response_format`), a `--logprobs-share` asking for logprobs with 3 alternatives, and a
length in `--max-tokens`; a `--disconnect-share` of the streaming requests close their connection after
a few chunks (the server must cancel their rows and keep serving).

Measured and written to `--out` (soak.json, soak.md):
- errors by kind: HTTP status (429, 5xx, ...), an error event inside a stream, or a transport error;
- per `--window` (default a minute): finished requests, completion tokens/s produced in the window
  (each request's tokens spread over the time it was decoding them: `produced_per_s`), TTFT percentiles of
  the streaming requests (time to the first chunk of text), the longest gap between two chunks of a
  stream (client-side stalls: the shared suffix tree's pauses, prefills of joining requests and the
  like all show here);
- every `--sample-interval` seconds: the server's resident memory (VmRSS of /proc/PID/status), the
  shared suffix tree's size (GET /health `suffix_global_tokens`), rows running and waiting, the tokens
  generated so far (GET /metrics `exactspec_generated_tokens_total`);
- after a drain: rows still running or waiting (leaked rows), the server's inter-token latency histogram;
- the soak criteria: throughput of the last span against the first span after `--warmup` (from the
  server's generated-token counter in the samples; the clients' view is reported beside it),
  resident-memory growth after the first span, the tree's largest size against its budget.

Loopback only, and bounded: the duration is capped at MAX_DURATION, clients stop starting requests
at the deadline and in-flight ones get `--drain` seconds, then the server is stopped.

    # the built-in pair, 30 minutes, 16 clients, 10% disconnecting mid-stream:
    python scripts/soak.py --duration 1800 --concurrency 16 --disconnect-share 0.1 --out docs/bench/soak
    # a quick look on the tiny target:
    python scripts/soak.py --tiny --duration 60 --concurrency 4 --window 10 --warmup 5 --out /tmp/soak
    # the criteria of a finished soak again, with another warm-up or span (no server is started):
    python scripts/soak.py --from-json docs/bench/soak/soak.json --warmup 300 --out /tmp/again
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MAX_DURATION = 6 * 3600  # the longest soak this script runs (seconds)
# Request settings, drawn uniformly; sampled requests get a seed.
SETTINGS_MIX: list[dict[str, Any]] = [
    {"temperature": 0.0},
    {"temperature": 0.7, "top_p": 0.9},
    {"temperature": 1.0, "top_k": 40},
    {"temperature": 0.8, "repetition_penalty": 1.1},
    {"temperature": 0.9, "min_p": 0.05, "n": 2},
    {"temperature": 0.7, "presence_penalty": 0.5, "frequency_penalty": 0.3},
]
SOAK_SCHEMA = {
    "type": "object",
    "properties": {
        "summary": {"type": "string"},
        "language": {"enum": ["python", "javascript", "rust", "sql", "other"]},
        "lines": {"type": "integer"},
    },
    "required": ["summary", "language", "lines"],
    "additionalProperties": False,
}
"""The JSON schema a `--structured-share` of the requests answer under (`response_format`)."""


@dataclass
class Outcome:
    """One request, seen by its client (times in seconds from the soak's start)."""

    started: float
    ended: float
    route: str
    stream: bool
    error: str | None  # None, "HTTP 500", "stream error", or a transport error's type
    tokens: int  # completion tokens (the server's usage; chunks for a client that disconnected)
    ttft: float | None  # streaming: to the first chunk of text
    max_gap: float | None  # streaming: longest wait between two chunks
    max_gap_at: float | None  # when that wait ended
    disconnected: bool


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="folder for soak.json and soak.md")
    parser.add_argument("--duration", type=float, default=1800.0, help="seconds of traffic (default 1800)")
    parser.add_argument("--concurrency", type=int, default=16, help="clients (default 16)")
    parser.add_argument("--stream-share", type=float, default=0.5, help="share of streaming requests")
    parser.add_argument("--chat-share", type=float, default=0.5, help="share of chat requests")
    parser.add_argument("--structured-share", type=float, default=0.2, help="share under a JSON schema")
    parser.add_argument("--logprobs-share", type=float, default=0.2, help="share asking for logprobs")
    parser.add_argument("--disconnect-share", type=float, default=0.1, help="share of streams cut short")
    parser.add_argument("--max-tokens", default=None, help="MIN,MAX completion length (default 32,160)")
    parser.add_argument("--window", type=float, default=60.0, help="seconds per throughput window")
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds left out of the criteria")
    parser.add_argument("--span", type=float, default=300.0, help="first/last span compared (seconds)")
    parser.add_argument("--sample-interval", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--drain", type=float, default=60.0, help="seconds for in-flight requests at the end")
    parser.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request")
    parser.add_argument("--start-timeout", type=float, default=1800.0, help="seconds for the server to start")
    parser.add_argument("--seed", type=int, default=0, help="seeds the request mix")
    parser.add_argument(
        "--from-json",
        default=None,
        help="summarise this soak.json again with this command's --warmup, --span and --window (no traffic)",
    )
    models = parser.add_argument_group("the server")
    models.add_argument("--target", default=None, help="exactspec serve --target (default the built-in)")
    models.add_argument("--draft", default=None, help="exactspec serve --draft")
    models.add_argument("--tiny", action="store_true", help="the test suite's tiny float32 target")
    models.add_argument(
        "--serve-arg", action="append", default=[], help="one more argument for exactspec serve (repeatable)"
    )
    args = parser.parse_args(argv)
    if not 0 < args.duration <= MAX_DURATION:
        parser.error(f"--duration must be in (0, {MAX_DURATION}] seconds")
    if args.concurrency < 1 or not all(0 <= v <= 1 for v in (args.stream_share, args.chat_share)):
        parser.error("--concurrency must be >= 1 and the shares in [0, 1]")
    if not 0 <= args.disconnect_share <= 1:
        parser.error("--disconnect-share must be in [0, 1]")
    low, high = (8, 48) if args.tiny else (32, 160)
    if args.max_tokens:
        try:
            low, high = (int(part) for part in args.max_tokens.split(","))
        except ValueError:
            parser.error("--max-tokens takes MIN,MAX, e.g. 32,160")
    if not 1 <= low <= high:
        parser.error("--max-tokens takes MIN,MAX with 1 <= MIN <= MAX")
    args.token_range = (low, high)
    return args


def tiny_target(folder: Path) -> str:
    """The test suite's tiny float32 target (tests/conftest.py) saved as a model folder."""
    sys.path.insert(0, str(REPO / "tests"))
    from conftest import save_tiny_model

    return str(save_tiny_model(folder / "target", 0))


def start_server(args: argparse.Namespace, log_path: Path) -> tuple[subprocess.Popen, str]:
    """`python -m exactspec serve` on a free loopback port; (process, base URL) once /health answers."""
    import httpx

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "exactspec", "serve", "--host", "127.0.0.1", "--port", str(port)]
    command.append("--no-progress")
    if args.target:
        command += ["--target", args.target]
    if args.draft:
        command += ["--draft", args.draft]
    command += args.serve_arg
    log = open(log_path, "w")  # noqa: SIM115 (kept open with the process)
    env = dict(os.environ)
    if args.tiny:
        # A model this small gains nothing from intra-op threads, and on a busy machine every tiny op
        # would wait for the other thread to wake (milliseconds each).
        env["OMP_NUM_THREADS"] = "1"
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + args.start_timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"exactspec serve exited ({process.returncode}); see {log_path}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(base + "/health", timeout=5).status_code == 200:
                return process, base
        time.sleep(0.5)
    process.kill()
    raise SystemExit(f"exactspec serve did not start within {args.start_timeout:g} s; see {log_path}")


def stop_server(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(30)


def prompts(tiny: bool) -> list[str]:
    """The bench's prompts (the tiny pair's context holds their first 100 characters)."""
    from exactspec.bench.prompts import PROMPTS

    return [prompt.text[:100] if tiny else prompt.text for prompt in PROMPTS]


def resident_kib(pid: int) -> int | None:
    """VmRSS of a process in KiB (None once it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    return int(match.group(1)) if match else None


async def sample_server(
    client: Any, pid: int, t0: float, interval: float, samples: list, stop: asyncio.Event
):
    """Every `interval` seconds: resident memory, the shared tree's size, rows running and waiting, and the
    tokens the server has generated so far (its `exactspec_generated_tokens_total` counter)."""
    while not stop.is_set():
        sample: dict[str, Any] = {"t": round(time.monotonic() - t0, 2), "rss_kib": resident_kib(pid)}
        try:
            health = (await client.get("/health", timeout=30)).json()
            sample.update({k: health.get(k) for k in ("suffix_global_tokens", "running", "waiting")})
            sample["generated_tokens"] = generated_tokens((await client.get("/metrics", timeout=30)).text)
        except Exception as error:  # noqa: BLE001 (a failed poll is recorded, the soak goes on)
            sample["health_error"] = type(error).__name__
        samples.append(sample)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)


def request_body(rng: random.Random, args: argparse.Namespace, texts: list[str]) -> tuple[str, dict, bool]:
    """(route, body, disconnect early) of the next request."""
    chat = rng.random() < args.chat_share
    stream = rng.random() < args.stream_share
    settings = dict(rng.choice(SETTINGS_MIX))
    if settings["temperature"] > 0:
        settings["seed"] = rng.randrange(2**31)
    body: dict[str, Any] = {"model": "exactspec", "max_tokens": rng.randint(*args.token_range), **settings}
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    text = rng.choice(texts)
    if chat:
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    if rng.random() < args.structured_share:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "soak", "schema": SOAK_SCHEMA},
        }
    if rng.random() < args.logprobs_share:
        body.update({"logprobs": True, "top_logprobs": 3} if chat else {"logprobs": 3})
    route = "/v1/chat/completions" if chat else "/v1/completions"
    return route, body, stream and rng.random() < args.disconnect_share


async def one_request(
    client: Any, route: str, body: dict, disconnect: bool, rng: random.Random, t0: float
) -> Outcome:
    started = time.monotonic()
    outcome = Outcome(started - t0, 0.0, route, bool(body.get("stream")), None, 0, None, None, None, False)
    try:
        if not outcome.stream:
            response = await client.post(route, json=body)
            if response.status_code != 200:
                outcome.error = f"HTTP {response.status_code}"
            else:
                outcome.tokens = response.json()["usage"]["completion_tokens"]
        else:
            leave_after = rng.randint(1, 3) if disconnect else None
            chunks, last = 0, started
            async with client.stream("POST", route, json=body) as response:
                if response.status_code != 200:
                    outcome.error = f"HTTP {response.status_code}"
                else:
                    async for line in response.aiter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        data = json.loads(line[6:])
                        if "error" in data:
                            outcome.error = "stream error"
                            break
                        if data.get("usage"):
                            outcome.tokens = data["usage"]["completion_tokens"]
                        pieces = [
                            c.get("text") or (c.get("delta") or {}).get("content") for c in data["choices"]
                        ]
                        if not any(pieces):
                            continue
                        now = time.monotonic()
                        if outcome.ttft is None:
                            outcome.ttft = now - started
                        elif outcome.max_gap is None or now - last > outcome.max_gap:
                            outcome.max_gap, outcome.max_gap_at = now - last, now - t0
                        chunks, last = chunks + 1, now
                        if leave_after is not None and chunks >= leave_after:
                            outcome.disconnected, outcome.tokens = True, chunks
                            break  # leaving the block closes the connection mid-stream
    except Exception as error:  # noqa: BLE001 (every failure is counted by kind)
        outcome.error = type(error).__name__
    outcome.ended = time.monotonic() - t0
    return outcome


async def run_clients(
    args: argparse.Namespace, base: str, pid: int
) -> tuple[list[Outcome], list[dict], dict]:
    import httpx

    texts = prompts(args.tiny)
    outcomes: list[Outcome] = []
    samples: list[dict] = []
    limits = httpx.Limits(
        max_connections=args.concurrency + 4, max_keepalive_connections=args.concurrency + 4
    )
    async with httpx.AsyncClient(base_url=base, timeout=args.request_timeout, limits=limits) as client:
        t0 = time.monotonic()
        deadline = t0 + args.duration
        stop = asyncio.Event()
        sampler = asyncio.create_task(sample_server(client, pid, t0, args.sample_interval, samples, stop))

        async def worker(index: int) -> None:
            rng = random.Random(args.seed * 100_003 + index)
            while time.monotonic() < deadline:
                route, body, disconnect = request_body(rng, args, texts)
                outcomes.append(await one_request(client, route, body, disconnect, rng, t0))

        workers = [asyncio.create_task(worker(i)) for i in range(args.concurrency)]
        _, late = await asyncio.wait(workers, timeout=args.duration + args.drain)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
        stop.set()
        await sampler
        after: dict[str, Any] = {"unfinished_at_drain": len(late)}
        # Cancelled rows leave the batch before the next round: give them a few seconds to go.
        settle = time.monotonic() + 5.0
        while True:
            with contextlib.suppress(Exception):
                health = (await client.get("/health", timeout=30)).json()
                after.update(running=health.get("running"), waiting=health.get("waiting"))
            if not (after.get("running") or after.get("waiting")) or time.monotonic() > settle:
                break
            await asyncio.sleep(0.2)
        with contextlib.suppress(Exception):
            after["itl_histogram"] = itl_histogram((await client.get("/metrics", timeout=30)).text)
    return outcomes, samples, after


def generated_tokens(metrics: str) -> float | None:
    """The server's count of tokens generated since it started (every row's, cancelled ones included)."""
    match = re.search(r"^exactspec_generated_tokens_total (\S+)$", metrics, re.MULTILINE)
    return float(match.group(1)) if match else None


def server_tokens_per_s(samples: list[dict], low: float, high: float) -> float | None:
    """Tokens per second the server generated between the samples nearest `low` and `high` (its own counter:
    what it decoded in the span, whether or not a client saw the request end)."""
    counted = [(s["t"], s["generated_tokens"]) for s in samples if s.get("generated_tokens") is not None]
    if len(counted) < 2 or high <= low:
        return None
    first = min(counted, key=lambda point: abs(point[0] - low))
    last = min(counted, key=lambda point: abs(point[0] - high))
    return (last[1] - first[1]) / (last[0] - first[0]) if last[0] > first[0] else None


def itl_histogram(metrics: str) -> dict[str, float]:
    """The server's inter-token latency histogram: cumulative counts by upper bound (seconds)."""
    pattern = r'^exactspec_inter_token_latency_seconds_bucket\{le="([^"]+)"\} (\S+)$'
    return {le: float(count) for le, count in re.findall(pattern, metrics, re.MULTILINE)}


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def produced_per_s(outcomes: list[Outcome], low: float, high: float) -> float | None:
    """Completion tokens the server produced per second in [low, high): each request's tokens spread evenly
    over the time it was producing them (from its first chunk, or its start when not streaming, to its end),
    disconnected requests' chunks included. Counting a request's tokens only when it ends would put a
    160-token answer in one window and none in the windows it was decoded in: minute-to-minute swings
    of 2x that say nothing about the server."""
    if high <= low:
        return None
    produced = 0.0
    for outcome in outcomes:
        if outcome.error or not outcome.tokens:
            continue
        begin = outcome.started + (outcome.ttft or 0.0)
        if outcome.ended <= begin:
            produced += outcome.tokens if low <= outcome.ended < high else 0
            continue
        overlap = max(0.0, min(outcome.ended, high) - max(begin, low))
        produced += outcome.tokens * overlap / (outcome.ended - begin)
    return produced / (high - low)


def summarise(args: argparse.Namespace, outcomes: list[Outcome], samples: list[dict], after: dict) -> dict:
    from exactspec.drafters.suffix import DEFAULT_GLOBAL_BUDGET_TOKENS

    errors: dict[str, int] = {}
    for outcome in outcomes:
        if outcome.error:
            errors[outcome.error] = errors.get(outcome.error, 0) + 1
    windows = []
    start = 0.0
    while start < args.duration:
        end = min(start + args.window, args.duration)
        inside = [o for o in outcomes if start <= o.ended < end]
        done = [o for o in inside if not o.error and not o.disconnected]
        ttfts = [o.ttft for o in inside if o.ttft is not None]
        gaps = [o.max_gap for o in inside if o.max_gap is not None]
        windows.append(
            {
                "start": start,
                "end": end,
                "requests": len(done),
                "errors": sum(1 for o in inside if o.error),
                "disconnected": sum(1 for o in inside if o.disconnected),
                "tokens_per_s": produced_per_s(outcomes, start, end),
                "ttft_p50": percentile(ttfts, 0.5),
                "ttft_p99": percentile(ttfts, 0.99),
                "longest_gap": max(gaps) if gaps else None,
            }
        )
        start = end

    span = min(args.span, max(0.0, (args.duration - args.warmup) / 2))
    first_seen = produced_per_s(outcomes, args.warmup, args.warmup + span)
    last_seen = produced_per_s(outcomes, args.duration - span, args.duration)
    # The criterion reads the server's own counter where the samples have it: the clients' view loses
    # the requests still running when the drain ends (cancelled, never reported), all in the last span.
    first = server_tokens_per_s(samples, args.warmup, args.warmup + span)
    last = server_tokens_per_s(samples, args.duration - span, args.duration)
    measured_by = "server" if first is not None and last is not None else "clients"
    if measured_by == "clients":
        first, last = first_seen, last_seen
    rss = [(s["t"], s["rss_kib"]) for s in samples if s.get("rss_kib")]
    rss_base = next((kib for t, kib in rss if t >= args.warmup + span), None)
    rss_end = rss[-1][1] if rss else None
    tree = [s["suffix_global_tokens"] for s in samples if s.get("suffix_global_tokens") is not None]
    ttfts = [o.ttft for o in outcomes if o.ttft is not None]
    stalls = sorted((o for o in outcomes if o.max_gap is not None), key=lambda o: -o.max_gap)[:10]
    server_errors = sum(count for kind, count in errors.items() if not kind.startswith("HTTP 4"))
    return {
        "settings": {k: v for k, v in vars(args).items() if k not in ("serve_arg",)}
        | {"serve_args": args.serve_arg},
        "requests": len(outcomes),
        "finished": sum(1 for o in outcomes if not o.error and not o.disconnected),
        "disconnected": sum(1 for o in outcomes if o.disconnected),
        "errors": errors,
        "server_errors": server_errors,
        "completion_tokens": sum(o.tokens for o in outcomes if not o.error and not o.disconnected),
        "ttft": {q: percentile(ttfts, v) for q, v in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))},
        "windows": windows,
        "samples": samples,
        "stalls": [{"at": o.max_gap_at, "gap": o.max_gap, "route": o.route} for o in stalls],
        "after_drain": after,
        "criteria": {
            "span_seconds": span,
            "tokens_per_s_first_span": first,
            "tokens_per_s_last_span": last,
            "tokens_per_s_measured_by": measured_by,
            "tokens_per_s_seen_by_clients": [first_seen, last_seen],
            "throughput_change": (last / first - 1) if first and last is not None else None,
            "rss_kib_after_first_span": rss_base,
            "rss_kib_end": rss_end,
            "rss_growth": (rss_end / rss_base - 1) if rss_base and rss_end else None,
            "suffix_tree_max_tokens": max(tree) if tree else None,
            "suffix_tree_budget_tokens": DEFAULT_GLOBAL_BUDGET_TOKENS,
            "leaked_rows": (after.get("running") or 0) + (after.get("waiting") or 0),
        },
    }


def _num(value: Any, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)] + [
        "| " + " | ".join(row) + " |" for row in rows
    ]


def markdown(report: dict) -> str:
    num = _num
    s, c = report["settings"], report["criteria"]
    server = "tiny target" if s["tiny"] else (s["target"] or "built-in pair")
    ttft = " / ".join(f"{num(report['ttft'][q], 3)} s" for q in ("p50", "p90", "p99"))
    lines = [
        "# Soak of exactspec serve",
        "",
        f"{num(s['duration'], 0)} s, {s['concurrency']} clients, streaming share {s['stream_share']}, "
        f"chat share {s['chat_share']}, disconnecting share {s['disconnect_share']}, max_tokens "
        f"{s['token_range'][0]}..{s['token_range'][1]}; server: {server} {' '.join(s['serve_args'])}",
        "",
        f"- requests: {report['requests']} ({report['finished']} finished, {report['disconnected']} "
        f"disconnected on purpose); errors: {report['errors'] or 'none'}; server errors: "
        f"{report['server_errors']}",
        f"- completion tokens: {report['completion_tokens']}; TTFT p50 / p90 / p99: {ttft}",
        f"- tokens/s, first {num(c['span_seconds'], 0)} s after warm-up: "
        f"{num(c['tokens_per_s_first_span'])}; last: {num(c['tokens_per_s_last_span'])}; change: "
        f"{num(c['throughput_change'], 3)} (counted by the {c.get('tokens_per_s_measured_by', 'clients')}; "
        "the clients saw "
        + " and ".join(num(v) for v in c.get("tokens_per_s_seen_by_clients", [None, None]))
        + ")",
        f"- resident memory after the first span: {num(c['rss_kib_after_first_span'])} KiB; at the end: "
        f"{num(c['rss_kib_end'])} KiB; growth: {num(c['rss_growth'], 4)}",
        f"- shared suffix tree: at most {num(c['suffix_tree_max_tokens'])} tokens (budget "
        f"{c['suffix_tree_budget_tokens']}); rows left after the drain: {c['leaked_rows']}",
        "",
    ]
    header = ["window (s)", "requests", "errors", "disconnected", "tokens/s", "TTFT p50 (s)", "TTFT p99 (s)"]
    rows = [
        [
            f"{num(w['start'], 0)}-{num(w['end'], 0)}",
            *(str(w[k]) for k in ("requests", "errors", "disconnected")),
            num(w["tokens_per_s"], 1),
            *(num(w[k], 3) for k in ("ttft_p50", "ttft_p99", "longest_gap")),
        ]
        for w in report["windows"]
    ]
    lines += _table([*header, "longest gap (s)"], rows) + [""]
    rows = [
        [
            str(sample["t"]),
            num(sample["rss_kib"] / 1024 if sample.get("rss_kib") else None, 1),
            *(num(sample.get(k)) for k in ("suffix_global_tokens", "running", "waiting")),
        ]
        for sample in report["samples"]
    ]
    lines += _table(["t (s)", "RSS (MiB)", "suffix tree tokens", "running", "waiting"], rows)
    lines += ["", "Longest client-side gaps between two chunks of a stream:", ""]
    lines += [
        f"- {num(x['gap'], 3)} s, ending at {num(x['at'], 1)} s ({x['route']})" for x in report["stalls"]
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.from_json:
        return resummarise(args, out)
    with tempfile.TemporaryDirectory(prefix="exactspec-soak-") as scratch:
        if args.tiny:
            # The target alone (a --target of ours, no --draft): the default drafter is then the suffix
            # drafter, and its shared tree is what GET /health reports. Named weights and dtype: no backend
            # timing on a model this small.
            args.target = tiny_target(Path(scratch))
            args.serve_arg = ["--weights", "bf16", "--dtype", "float32", *args.serve_arg]
        process, base = start_server(args, out / "server.log")
        try:
            print(
                f"[soak] serving at {base} (pid {process.pid}); {args.duration:g} s of traffic",
                file=sys.stderr,
            )
            outcomes, samples, after = asyncio.run(run_clients(args, base, process.pid))
        finally:
            stop_server(process)
    return write_report(args, out, outcomes, samples, after)


def write_report(
    args: argparse.Namespace, out: Path, outcomes: list[Outcome], samples: list[dict], after: dict
) -> int:
    report = summarise(args, outcomes, samples, after)
    report["outcomes"] = [asdict(o) for o in outcomes]
    (out / "soak.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "soak.md").write_text(markdown(report))
    print(markdown(report).split("\n\n|")[0], file=sys.stderr)
    return 0 if report["server_errors"] == 0 else 1


def resummarise(args: argparse.Namespace, out: Path) -> int:
    """--from-json: the report of a finished soak, summarised again (its traffic settings, this command's
    --warmup, --span and --window)."""
    try:
        old = json.loads(Path(args.from_json).read_text())
        outcomes = [Outcome(**o) for o in old["outcomes"]]
    except (OSError, ValueError, KeyError, TypeError) as error:
        print(f"[soak] cannot read {args.from_json} as a soak.json: {error}", file=sys.stderr)
        return 2
    kept = ("warmup", "span", "window", "out", "from_json")
    for name, value in old["settings"].items():
        if name not in kept and name != "serve_args":
            setattr(args, name, tuple(value) if name == "token_range" else value)
    args.serve_arg = old["settings"].get("serve_args", [])
    return write_report(args, out, outcomes, old["samples"], old["after_drain"])


if __name__ == "__main__":
    sys.exit(main())
