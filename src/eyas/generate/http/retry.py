"""Pure retry policy: classify a failed attempt, then decide how long to wait before the next.

No I/O here, so every rule is a unit test: ``classify_status`` turns an HTTP status and
error body into a :class:`~eyas.generate.http.errors.Failure`; ``RetryPolicy.next_delay``
answers "retry after how many seconds, or give up" with exponential backoff and full jitter
(a uniformly random wait up to the exponential cap, so 2,000 requests that failed together
do not come back together), never shorter than the server's ``Retry-After``.
"""

from __future__ import annotations

import email.utils
import time
from dataclasses import dataclass
from typing import Any

from eyas.generate.http.errors import Cause, Failure

RETRYABLE_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
FINAL_CAUSES = frozenset({Cause.CREDITS, Cause.REJECTED, Cause.PROMPT})
MAX_RETRY_AFTER_S = 600.0
"""A Retry-After longer than this is treated as this: a job should not sleep for hours on one header."""

_PROMPT_MARKERS = ("context_length", "context length", "maximum context", "too many tokens", "moderation", "flagged")


def error_text(body: Any) -> tuple[str, str]:
    """The (message, error type) of an OpenAI/OpenRouter error body, whatever its shape."""
    error = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(error, dict):
        message = str(error.get("message") or error.get("code") or "")
        metadata = error.get("metadata") if isinstance(error.get("metadata"), dict) else {}
        kind = str(metadata.get("error_type") or error.get("type") or "")
        return message, kind
    return (str(error) if error else ""), ""


def classify_status(status: int, body: Any = None, retry_after: str | None = None) -> Failure:
    """Classify an HTTP error status (or an error code inside a 200 body)."""
    message, kind = error_text(body)
    detail = f"HTTP {status}" + (f": {message}" if message else "") + (f" ({kind})" if kind else "")
    wait = parse_retry_after(retry_after)
    lowered = f"{message} {kind}".lower()
    if status == 402:
        cause = Cause.IN_FLIGHT_BUDGET if "in_flight" in lowered or "in-flight" in lowered else Cause.CREDITS
    elif status == 429:
        cause = Cause.RATE_LIMITED
    elif status in RETRYABLE_STATUSES or status >= 500:
        cause = Cause.SERVER
    elif status in (400, 403, 413) and any(m in lowered for m in _PROMPT_MARKERS):
        cause = Cause.PROMPT
    else:
        cause = Cause.REJECTED
    return Failure(cause, detail, status, wait)


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: a number of seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value).timestamp()
        except (TypeError, ValueError):
            return None
        seconds = when - (time.time() if now is None else now)
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int
    base_s: float = 1.0
    """Backoff cap of the first retry; doubles each attempt."""
    max_s: float = 60.0
    """Largest backoff cap."""

    def next_delay(self, attempt: int, failure: Failure, rand: float) -> float | None:
        """Seconds to wait before attempt ``attempt + 1``, or None to give up.

        ``attempt`` counts from 1; ``rand`` is uniform in [0, 1) (injected so tests are exact).
        """
        if failure.cause in FINAL_CAUSES or attempt >= self.max_attempts:
            return None
        backoff = rand * min(self.max_s, self.base_s * 2 ** (attempt - 1))
        if failure.retry_after_s is not None:
            return max(failure.retry_after_s, backoff)
        return backoff
