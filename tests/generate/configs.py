"""Generate sections for the fake OpenAI-compatible server: small answers, fast retries."""

from __future__ import annotations

from eyas.config import GenerateConfig

SHARED_KEYS = set(GenerateConfig.model_fields) - {"http"}


def openai_generate(base_url: str | None, **overrides) -> dict:
    """``overrides`` go where they belong: shared keys (``max_tokens``) under ``generate``, the
    rest under ``generate.http``, with ``retry`` and ``timeouts`` merged into the defaults here."""
    http = {"model": "fake/model", "concurrency": 4, "retry": {"max_attempts": 3, "base_s": 0.005, "max_s": 0.02}}
    if base_url is not None:
        http["base_url"] = base_url
    generate = {"backend": "openai", "max_tokens": 64, "http": http}
    for key, value in overrides.items():
        if key in SHARED_KEYS:
            generate[key] = value
        elif key in ("retry", "timeouts"):
            http[key] = {**http.get(key, {}), **value}
        else:
            http[key] = value
    return generate
