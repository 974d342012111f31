"""``eyas plan``: what the configured generation will cost, and targets that fit the budget.

Pure arithmetic on measured or assumed inputs. Per dataset the projected output is its
``output_token_target`` (capped by what its prompts can produce), or every prompt at the
mean output length; the cost is output × completion price + requests × mean prompt tokens
× prompt price, at the dearest endpoint the provider policy allows. Means come from the
records of an existing run when there are any, otherwise from estimates (``max_tokens``
for output). Over budget, every dataset's target is scaled by the same factor.

The reference case: 6 datasets × 10M output tokens at $2.20/M is $132 before input, over a
$100 budget, so each target becomes ~7M.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rich.table import Table

from eyas.generate.http.budget import Pricing


@dataclass(frozen=True)
class DatasetInputs:
    name: str
    prompts: int
    mean_prompt_tokens: float
    mean_output_tokens: float
    output_seen: bool
    """Whether the output mean was measured on records (else it is max_tokens)."""
    target: int | None


@dataclass(frozen=True)
class DatasetPlan:
    inputs: DatasetInputs
    output_tokens: int
    requests: int
    cost_usd: float
    proposed_target: int | None = None


@dataclass(frozen=True)
class Plan:
    datasets: list[DatasetPlan]
    budget_usd: float | None
    spent_usd: float

    @property
    def cost_usd(self) -> float:
        return sum(d.cost_usd for d in self.datasets)

    @property
    def over_budget(self) -> bool:
        return self.budget_usd is not None and self.cost_usd > self.budget_usd


def _round_down(x: float, digits: int = 3) -> int:
    """Round down to ``digits`` significant digits: 7_345_912 -> 7_340_000."""
    if x < 1:
        return 0
    scale = 10 ** max(0, int(math.floor(math.log10(x))) - digits + 1)
    return int(x // scale * scale)


def project_dataset(d: DatasetInputs, pricing: Pricing) -> DatasetPlan:
    most = d.prompts * d.mean_output_tokens
    output = min(d.target, most) if d.target is not None else most
    requests = min(d.prompts, math.ceil(output / d.mean_output_tokens)) if d.mean_output_tokens else d.prompts
    cost = output * pricing.completion + requests * d.mean_prompt_tokens * pricing.prompt
    return DatasetPlan(d, int(output), requests, cost)


def make_plan(inputs: list[DatasetInputs], pricing: Pricing, budget_usd: float | None, spent_usd: float = 0.0) -> Plan:
    """Project every dataset; when over budget, propose targets scaled to fit it."""
    plans = [project_dataset(d, pricing) for d in inputs]
    total = sum(p.cost_usd for p in plans)
    if budget_usd is None or total <= budget_usd or total == 0:
        return Plan(plans, budget_usd, spent_usd)
    # Cost is linear in each dataset's output (its requests scale with it), so one factor fits all.
    factor = budget_usd / total
    scaled = [
        DatasetPlan(p.inputs, p.output_tokens, p.requests, p.cost_usd, _round_down(p.output_tokens * factor))
        for p in plans
    ]
    return Plan(scaled, budget_usd, spent_usd)


def plan_table(plan: Plan, pricing: Pricing) -> Table:
    budget = f"${plan.budget_usd:,.2f}" if plan.budget_usd is not None else "no budget"
    verdict = "[red]over budget[/]" if plan.over_budget else "[green]fits[/]"
    t = Table(
        title=f"projected cost ${plan.cost_usd:,.2f} vs {budget} ({verdict}); spent so far ${plan.spent_usd:,.4f}",
        caption=f"priced at ${pricing.prompt * 1e6:.3f}/M input, ${pricing.completion * 1e6:.3f}/M output",
    )
    for col in (
        "dataset",
        "prompts",
        "prompt tok",
        "output tok/req",
        "target",
        "output tok",
        "requests",
        "cost $",
        "proposed target",
    ):
        t.add_column(col, justify="left" if col == "dataset" else "right")
    for p in plan.datasets:
        d = p.inputs
        t.add_row(
            d.name,
            f"{d.prompts:,}",
            f"{d.mean_prompt_tokens:,.0f}",
            f"{d.mean_output_tokens:,.0f}" + ("" if d.output_seen else " (max)"),
            f"{d.target:,}" if d.target else "-",
            f"{p.output_tokens:,}",
            f"{p.requests:,}",
            f"{p.cost_usd:,.2f}",
            f"{p.proposed_target:,}" if p.proposed_target is not None else "-",
        )
    return t
