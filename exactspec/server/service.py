"""The server's transport around one `Session`: OpenAI request bodies in, rows out (`Service.submit`), its
metrics (`metrics.ServerMetrics`) and its health (`Service.health`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from exactspec.api.session import EventCallback, QueueFull, RequestError, Session, SessionConfig, Submission
from exactspec.decoding.scheduler import Scheduler
from exactspec.decoding.strategy import Strategy
from exactspec.drafters.base import shared_state
from exactspec.foundations.costs import BatchCosts
from exactspec.foundations.defaults import DEFAULTS
from exactspec.foundations.errors import InvalidArgument
from exactspec.models.base import shared_prompt_tokens
from exactspec.models.pair import ModelPair
from exactspec.server.errors import ApiError
from exactspec.server.metrics import ServerMetrics
from exactspec.server.requests import check_body, text_requests
from exactspec.server.schemas import SamplingFields

DEFAULT_MODEL_NAME = "exactspec"


class Service:
    """The transport around one `Session`: OpenAI request bodies in, rows out, metrics by the way."""

    def __init__(
        self,
        pair: ModelPair,
        *,
        model_name: str = DEFAULT_MODEL_NAME,
        gamma: int | None = None,
        max_batch: int = DEFAULTS.max_batch,
        max_waiting: int = DEFAULTS.max_waiting,
        default_max_tokens: int = DEFAULTS.max_tokens,
        strategy: Strategy | None = None,
        batch_costs: BatchCosts | None = None,
        prefill_chunk: int | None = DEFAULTS.prefill_chunk,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        """The session's settings (`exactspec.api.session.SessionConfig`): `strategy` (default
        `DEFAULTS.drafter_for` the pair: the hybrid with a draft model, the suffix drafter without;
        token verification, planned gamma), `gamma` (a
        request's draft length when it names none, the cap with adaptive gamma; default
        `DEFAULTS.gamma`), `max_batch`, `max_waiting`, `prefill_chunk`, `default_max_tokens`. With
        adaptive gamma every round's draft lengths are planned for the whole batch
        from `batch_costs` (default `ModelPair.batch_costs`, measured once per pair and machine;
        `progress` hears what it does)."""
        config = SessionConfig(
            strategy=strategy,
            gamma=gamma,
            max_batch=max_batch,
            max_waiting=max_waiting,
            prefill_chunk=prefill_chunk,
            max_tokens=default_max_tokens,
            plan_batch=True,
        )
        self.session = Session(pair, config, batch_costs=batch_costs, progress=progress)
        # The tokenizer's matcher form now (about 2 s for a 150k-token vocabulary), not on the first
        # structured request; without llguidance or a tokenizer those requests are refused with why.
        self.structured_output = self.session.grammars.warm()
        self.pair = pair
        self.model_name = model_name
        self.metrics = ServerMetrics(self.session.scheduler)
        self.created = int(time.time())

    @property
    def scheduler(self) -> Scheduler:
        return self.session.scheduler

    @property
    def strategy(self) -> Strategy:
        return self.session.strategy

    @property
    def gamma(self) -> int:
        """The draft length of a request that names none (the most the planner gives it, when adaptive)."""
        return self.session.gamma

    @property
    def batch_costs(self) -> BatchCosts | None:
        return self.session.batch_costs

    # -------------------------------------------------------------- request -> rows

    def check(self, body: SamplingFields) -> None:
        """A 404 unless the body names this server's model; a 400 for a field exactspec does not do."""
        check_body(body, self.model_name)

    def submit(self, body: SamplingFields, on_event: EventCallback) -> Submission:
        """Submit every row of the body; all or nothing, errors in OpenAI's shape."""
        requests = text_requests(body)
        try:
            return self.session.submit(requests, on_event)
        except QueueFull as error:
            raise ApiError(
                429, f"the server is busy: {error}; retry later", type="rate_limit_error", code="queue_full"
            ) from None
        except RequestError as error:
            raise ApiError(400, str(error), param=error.param, code=error.code) from None
        except InvalidArgument as error:
            raise ApiError(400, str(error), param=error.param) from None
        except ValueError as error:  # a check that does not know the field
            raise ApiError(400, str(error)) from None

    def health(self) -> dict[str, Any]:
        """GET /health: the batch, the backend, the drafter and what it holds across requests, and how well
        the planner predicts the time of a round here (median |predicted / measured - 1|)."""
        metrics = self.scheduler.metrics
        error = metrics.round_time_error
        return {
            "status": "ok",
            "running": self.scheduler.running,
            "waiting": self.scheduler.waiting,
            "backend": self.pair.backend,
            "drafter": self.strategy.drafter if self.gamma else None,
            # A drafter that learns from finished requests (suffix) holds them here, in this process only.
            **shared_state(self.scheduler.engine.drafter),
            # Prompt tokens copied from cells other requests computed (backends that share prefixes).
            "shared_prompt_tokens": shared_prompt_tokens(self.scheduler.engine.target),
            "predicted_rounds": len(metrics.round_times),
            "round_time_error": None if error != error else error,
            # Round counts since start (a load test takes differences: foundations.metrics.round_shares).
            **metrics.round_counts(),
            # Draft tokens that rows' structures forced (grammar-forced drafts), and of them accepted.
            "forced_tokens": metrics.forced_tokens,
            "forced_accepted": metrics.forced_accepted,
            "structured_output": self.structured_output,
        }
