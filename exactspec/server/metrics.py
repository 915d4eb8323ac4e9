"""The server's Prometheus metrics (GET /metrics), in a registry of their own so that several apps can live
in one process, and how each row event counts in them (`ServerMetrics.observe`, on the round thread)."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from exactspec.api.session import Choice
from exactspec.decoding.records import MAX_GAMMA, RowEvent
from exactspec.decoding.scheduler import Scheduler


class ServerMetrics:
    """The Prometheus metrics of one server (its own registry, so several apps can live in one process)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        Gauge("exactspec_requests_running", "Rows in the running batch", registry=r).set_function(
            lambda: scheduler.running
        )
        Gauge("exactspec_requests_waiting", "Rows waiting for a free batch row", registry=r).set_function(
            lambda: scheduler.waiting
        )
        self.requests = Counter(
            "exactspec_requests", "Finished rows by outcome", ["outcome"], registry=r
        )  # exported as exactspec_requests_total
        self.rejected = Counter("exactspec_rejected_requests", "Requests refused (4xx)", ["code"], registry=r)
        self.generated = Counter("exactspec_generated_tokens", "Tokens generated", registry=r)
        self.proposed = Counter("exactspec_proposed_tokens", "Draft tokens proposed", registry=r)
        self.accepted = Counter("exactspec_accepted_tokens", "Draft tokens accepted", registry=r)
        Gauge(
            "exactspec_acceptance_rate",
            "Accepted / proposed draft tokens since start (NaN before any)",
            registry=r,
        ).set_function(lambda: scheduler.metrics.acceptance_rate)
        Gauge(
            "exactspec_forced_tokens",
            "Draft tokens that rows' structures forced (drafted at q = 1), since start",
            registry=r,
        ).set_function(lambda: scheduler.metrics.forced_tokens)
        Gauge(
            "exactspec_forced_accepted_tokens",
            "Forced draft tokens accepted, since start",
            registry=r,
        ).set_function(lambda: scheduler.metrics.forced_accepted)
        Gauge(
            "exactspec_round_time_error",
            "Median |predicted / measured - 1| of the planner's round times (NaN before any)",
            registry=r,
        ).set_function(lambda: scheduler.metrics.round_time_error)
        self.tokens_per_round = Histogram(
            "exactspec_tokens_per_round",
            "Tokens a row emitted in one round",
            buckets=[1, 2, 3, 4, 5, 6, 8, 12, 16, MAX_GAMMA + 1],
            registry=r,
        )
        latency = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60]
        self.ttft = Histogram(
            "exactspec_time_to_first_token_seconds",
            "From request arrival to its first generated token",
            buckets=latency,
            registry=r,
        )
        self.itl = Histogram(
            "exactspec_inter_token_latency_seconds",
            "Time between generated tokens (a round's tokens share the gap since the previous round)",
            buckets=latency,
            registry=r,
        )

    def text(self) -> bytes:
        return generate_latest(self.registry)

    def observe(self, choice: Choice, event: RowEvent) -> None:
        """Count one row event (runs on the round thread): tokens, drafts, time to the first token and
        between tokens, and the row's outcome when it finishes."""
        now = time.perf_counter()
        self.proposed.inc(event.proposed)
        self.accepted.inc(event.accepted)
        if event.finish_reason not in ("cancelled", "error") or event.tokens:
            self.tokens_per_round.observe(len(event.tokens))
        if event.tokens:
            self.generated.inc(len(event.tokens))
            assert choice.handle is not None
            if choice.last_event_at is None:
                self.ttft.observe(now - choice.handle.submitted_at)
                gaps = len(event.tokens) - 1
                gap = 0.0
            else:
                gaps = len(event.tokens)
                gap = (now - choice.last_event_at) / gaps
            for _ in range(gaps):
                self.itl.observe(gap)
            choice.last_event_at = now
        if event.finish_reason is not None:
            self.requests.labels(event.finish_reason).inc()
