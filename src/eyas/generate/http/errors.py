"""What can go wrong when generating through an OpenAI-compatible API.

    Exception
    ├── RequestFailure            one attempt of one request failed; carries the `Failure`
    │                             the retry policy decides on (retry, wait, or give up)
    └── RunStopped                the run cannot go on; in-flight requests are finished and
        │                         saved first, and the CLI exits with the class's exit code
        ├── CreditsExhausted      402 insufficient credits / key limit: add credits, rerun (3)
        ├── BudgetReached         generate.http.budget_usd would be passed: raise it, rerun (4)
        └── RequestRejected       400/401/403/404 for the whole run: bad key, model, or
                                  request shape; fix the config, rerun (5)

``RequestFailure`` never leaves the engine: a request that exhausts its attempts becomes a
line in ``<dataset>.errors.jsonl`` and is retried on the next run. Only ``RunStopped`` and
its subclasses reach the command line. Kept free of aiohttp so the CLI can import it cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

EXIT_CREDITS_EXHAUSTED = 3
EXIT_BUDGET_REACHED = 4
EXIT_REQUEST_REJECTED = 5


class Cause(str, Enum):
    """Why an attempt failed; the retry policy and the progress counters key on it."""

    RATE_LIMITED = "rate_limited"
    """429: the provider or OpenRouter asks us to slow down."""
    SERVER = "server"
    """408/409/425/5xx: the server or its upstream provider failed."""
    CONNECTION = "connection"
    """Reset, refused, or the connection closed early."""
    TIMEOUT = "timeout"
    """No bytes for `generate.http.timeouts.read_s`, or `timeouts.total_s` passed."""
    BAD_RESPONSE = "bad_response"
    """HTTP 200 whose body is malformed JSON, empty, or carries an error."""
    IN_FLIGHT_BUDGET = "in_flight_budget"
    """402 in_flight_budget_exhausted: too much estimated cost in flight; wait and shrink."""
    CREDITS = "credits"
    """402 insufficient credits or key limit: stop the run."""
    REJECTED = "rejected"
    """400/401/403/404: retrying cannot help."""
    PROMPT = "prompt"
    """The prompt itself is refused (context length, moderation): record it, do not retry."""


@dataclass(frozen=True)
class Failure:
    """One failed attempt, classified."""

    cause: Cause
    message: str
    status: int | None = None
    retry_after_s: float | None = None


class RequestFailure(Exception):
    """An attempt failed; ``failure`` says why."""

    def __init__(self, failure: Failure):
        super().__init__(failure.message)
        self.failure = failure


class RunStopped(Exception):
    """The run stopped early; finished records are saved and a rerun resumes."""

    exit_code = 1


class CreditsExhausted(RunStopped):
    """The account or key has no credits left (HTTP 402)."""

    exit_code = EXIT_CREDITS_EXHAUSTED


class BudgetReached(RunStopped):
    """Spent plus reserved would pass ``generate.http.budget_usd``."""

    exit_code = EXIT_BUDGET_REACHED


class RequestRejected(RunStopped):
    """The server refuses the run's requests (bad key, unknown model, bad parameter)."""

    exit_code = EXIT_REQUEST_REJECTED
