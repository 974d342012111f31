"""What ``eyas providers`` and ``eyas plan`` do, behind the thin CLI: gather inputs, print, apply."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from pathlib import Path

import yaml

from eyas.config import ConfigError, GenerateConfig, RunConfig, load_config, resolve_api_key
from eyas.console import console
from eyas.generate.http.budget import Pricing, estimate_prompt_tokens, replay
from eyas.generate.http.errors import RequestFailure
from eyas.generate.http.plan import DatasetInputs, Plan, make_plan, plan_table
from eyas.generate.http.providers import (
    OPENROUTER_BASE_URL,
    Endpoint,
    endpoint_json,
    endpoints_table,
    endpoints_url,
    parse_endpoints,
    provider_object,
)
from eyas.generate.store import read_records
from eyas.generate.wanted import wanted
from eyas.paths import RunPaths


async def _fetch(base_url: str, model: str, api_key: str | None) -> list[Endpoint]:
    from eyas.generate.http.client import Transport

    url = endpoints_url(base_url, model)
    async with Transport(concurrency=1, api_key=api_key, read_timeout_s=60.0, request_timeout_s=120.0) as t:
        try:
            data = await t.get_json(url)
        except RequestFailure as e:
            raise ConfigError(f"cannot list the endpoints of {model}: {e}") from None
    try:
        return parse_endpoints(data)
    except ValueError as e:
        raise ConfigError(f"{url}: {e}") from None


def fetch_endpoints(g: GenerateConfig, model: str | None = None, base_url: str | None = None) -> list[Endpoint]:
    base = base_url or g.http.base_url or (g.http.base_urls[0] if g.http.base_urls else OPENROUTER_BASE_URL)
    key = resolve_api_key(g.http.api_key_env, g.http.api_key_file)
    return asyncio.run(_fetch(base, model or g.http.model, key))


def providers_command(model: str, config: Path | None, base_url: str | None, as_json: bool) -> None:
    g = load_config(config).generate if config else GenerateConfig()
    endpoints = fetch_endpoints(g, model, base_url)
    provider = provider_object(g)
    if as_json:
        sys.stdout.write(json.dumps([endpoint_json(e, provider) for e in endpoints], indent=2) + "\n")
        return
    console.print(endpoints_table(model, endpoints, provider))
    if provider:
        console.print(f"request provider object: {json.dumps(provider)}", highlight=False)


def plan_inputs(config: RunConfig) -> list[DatasetInputs]:
    """Per dataset: prompt count and mean prompt/output tokens, measured from records when there are any."""
    paths = RunPaths.of(config)
    g = config.generate
    out = []
    for d in config.regenerated:
        prompts, estimated = 0, 0
        for p in wanted(d, g.samples_per_prompt):
            prompts += 1
            estimated += estimate_prompt_tokens(p.messages, p.tools)
        seen, prompt_tokens, output_tokens = 0, 0, 0
        for r in read_records(paths.generations(d.name)):
            if r.usage.completion_tokens:
                seen += 1
                prompt_tokens += r.usage.prompt_tokens
                output_tokens += r.usage.completion_tokens
        mean_prompt = prompt_tokens / seen if seen else estimated / prompts
        mean_output = output_tokens / seen if seen else float(g.max_tokens)
        out.append(DatasetInputs(d.name, prompts, mean_prompt, mean_output, bool(seen), d.output_token_target))
    return out


def plan_pricing(config: RunConfig) -> Pricing:
    from eyas.generate.http.providers import worst_case_pricing

    g = config.generate
    if g.http.prices is not None:
        return Pricing.per_million(g.http.prices.prompt, g.http.prices.completion)
    if g.backend != "openai":
        raise ConfigError(
            "generate.backend is not 'openai': nothing to price (set generate.http.prices to plan anyway)"
        )
    pricing = worst_case_pricing(fetch_endpoints(g), provider_object(g))
    if pricing is None:
        raise ConfigError(
            f"generate.http.provider_policy: no endpoint of {g.http.model} passes the policy, nothing to price"
        )
    return pricing


def spent_so_far(config: RunConfig) -> float:
    """Spent and possibly spent by earlier runs (read-only: a run may be appending to the ledger)."""
    spending, in_flight = replay(RunPaths.of(config).ledger)
    return spending.spent + spending.possibly_spent + sum(in_flight.values())


def apply_targets(config_path: Path, plan: Plan) -> None:
    """Write the proposed targets into the config file (the original is kept as ``.bak``)."""
    data = yaml.safe_load(config_path.read_text())
    proposed = {p.inputs.name: p.proposed_target for p in plan.datasets if p.proposed_target is not None}
    for d in data.get("datasets") or []:
        if d.get("name") in proposed:
            d["output_token_target"] = proposed[d["name"]]
    shutil.copyfile(config_path, config_path.with_suffix(config_path.suffix + ".bak"))
    config_path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))


def plan_command(config_path: Path, apply: bool) -> None:
    config = load_config(config_path)
    pricing = plan_pricing(config)
    plan = make_plan(plan_inputs(config), pricing, config.generate.http.budget_usd, spent_so_far(config))
    console.print(plan_table(plan, pricing))
    if not plan.over_budget:
        return
    if apply:
        apply_targets(config_path, plan)
        console.print(
            f"wrote the proposed output_token_target values into {config_path} (previous version: {config_path}.bak)"
        )
    else:
        console.print(
            "over budget: rerun with --apply to write the proposed output_token_target values into the config"
        )
