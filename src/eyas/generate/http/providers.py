"""A model's endpoints on OpenRouter, and the run's provider policy — derived in one place.

``provider_object`` merges ``generate.http.provider`` (OpenRouter's routing object, as given)
with ``generate.http.provider_policy`` (which quantizations and providers the run accepts) into
the ``provider`` object every request sends. ``rejection`` judges a listed endpoint against
that same object, so what ``eyas providers`` marks as allowed is exactly what requests ask
OpenRouter for, and the budget prices with the dearest endpoint that can serve them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.table import Table

from eyas.config import ConfigError, GenerateConfig
from eyas.generate.http.budget import Pricing

OPENROUTER_BASE_URL = "https://openrouter.ai/api/v1"


@dataclass(frozen=True)
class Endpoint:
    provider: str
    tag: str
    quantization: str
    prompt_usd_per_m: float
    completion_usd_per_m: float
    context_length: int | None
    max_completion_tokens: int | None
    uptime: float | None
    """Share of successful requests over the last 30 minutes, in percent."""
    throughput_p50: float | None
    """Tokens per second, median over the last 30 minutes."""


def endpoints_url(base_url: str, model: str) -> str:
    return f"{base_url.rstrip('/')}/models/{model}/endpoints"


def _price(pricing: dict, key: str) -> float:
    # OpenRouter prices are USD per token as decimal strings.
    return float(pricing.get(key) or 0.0) * 1e6


def _p50(value: Any) -> float | None:
    if isinstance(value, dict):
        value = value.get("p50")
    return float(value) if isinstance(value, (int, float)) else None


def parse_endpoints(data: Any) -> list[Endpoint]:
    """The endpoints of a ``GET /models/{author}/{slug}/endpoints`` answer."""
    items = (data.get("data") or {}).get("endpoints") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise ValueError("not an endpoints listing (expected data.endpoints to be a list)")
    out = []
    for e in items:
        pricing = e.get("pricing") or {}
        uptime = e.get("uptime_last_30m")
        out.append(
            Endpoint(
                provider=str(e.get("provider_name") or e.get("name") or "?"),
                tag=str(e.get("tag") or e.get("provider_name") or "?").lower(),
                quantization=str(e.get("quantization") or "unknown").lower(),
                prompt_usd_per_m=_price(pricing, "prompt"),
                completion_usd_per_m=_price(pricing, "completion"),
                context_length=e.get("context_length"),
                max_completion_tokens=e.get("max_completion_tokens"),
                uptime=float(uptime) if isinstance(uptime, (int, float)) else None,
                throughput_p50=_p50(e.get("throughput_last_30m")),
            )
        )
    return out


def provider_object(g: GenerateConfig) -> dict[str, Any] | None:
    """The request's ``provider`` object: the routing as given, narrowed by the policy."""
    routing = g.http.provider.model_dump(exclude_none=True) if g.http.provider else {}
    policy = g.http.provider_policy
    if policy is not None:
        if policy.quantizations is not None:
            allowed = [q.lower() for q in policy.quantizations]
            if policy.unknown_quantization == "allow" and "unknown" not in allowed:
                allowed.append("unknown")
            given = routing.get("quantizations")
            routing["quantizations"] = [q for q in allowed if given is None or q in {x.lower() for x in given}]
            if not routing["quantizations"]:
                raise ConfigError(
                    "generate.http.provider.quantizations and generate.http.provider_policy.quantizations have no level in common"
                )
        if policy.ignore:
            routing["ignore"] = sorted(set(routing.get("ignore", [])) | set(policy.ignore))
    return routing or None


def _matches(slug: str, ep: Endpoint) -> bool:
    slug = slug.lower()
    # A base slug (`deepinfra`) also names its variants (`deepinfra/turbo`).
    return ep.tag == slug or ep.tag.split("/")[0] == slug or ep.provider.lower() == slug


def rejection(ep: Endpoint, provider: dict[str, Any] | None) -> str | None:
    """Why the request's provider object excludes this endpoint; None when it may serve."""
    provider = provider or {}
    if provider.get("only") and not any(_matches(s, ep) for s in provider["only"]):
        return "not in only"
    if any(_matches(s, ep) for s in provider.get("ignore", [])):
        return "ignored"
    quants = provider.get("quantizations")
    if quants is not None and ep.quantization not in {q.lower() for q in quants}:
        return f"quantization {ep.quantization}"
    cap = provider.get("max_price") or {}
    if "prompt" in cap and ep.prompt_usd_per_m > cap["prompt"]:
        return "prompt price over max_price"
    if "completion" in cap and ep.completion_usd_per_m > cap["completion"]:
        return "completion price over max_price"
    return None


def allowed(endpoints: list[Endpoint], provider: dict[str, Any] | None) -> list[Endpoint]:
    return [e for e in endpoints if rejection(e, provider) is None]


def worst_case_pricing(endpoints: list[Endpoint], provider: dict[str, Any] | None) -> Pricing | None:
    """The dearest prompt and completion prices among endpoints the policy allows."""
    ok = allowed(endpoints, provider)
    if not ok:
        return None
    return Pricing.per_million(max(e.prompt_usd_per_m for e in ok), max(e.completion_usd_per_m for e in ok))


def _opt(value: float | int | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def endpoints_table(model: str, endpoints: list[Endpoint], provider: dict[str, Any] | None) -> Table:
    t = Table(title=f"{model}: {len(endpoints)} endpoints, {len(allowed(endpoints, provider))} allowed by the policy")
    for col in (
        "provider",
        "tag",
        "quant",
        "$/M in",
        "$/M out",
        "context",
        "max out",
        "uptime %",
        "p50 tok/s",
        "policy",
    ):
        t.add_column(col, justify="left" if col in ("provider", "tag", "quant", "policy") else "right")
    for e in sorted(endpoints, key=lambda e: (e.completion_usd_per_m, e.tag)):
        why = rejection(e, provider)
        t.add_row(
            e.provider,
            e.tag,
            e.quantization,
            f"{e.prompt_usd_per_m:.3f}",
            f"{e.completion_usd_per_m:.3f}",
            _opt(e.context_length, ","),
            _opt(e.max_completion_tokens, ","),
            _opt(e.uptime, ".1f"),
            _opt(e.throughput_p50, ".1f"),
            "[green]allowed[/]" if why is None else f"[red]excluded[/]: {why}",
        )
    return t


def endpoint_json(e: Endpoint, provider: dict[str, Any] | None) -> dict[str, Any]:
    why = rejection(e, provider)
    return {**e.__dict__, "allowed": why is None, "excluded_because": why}
