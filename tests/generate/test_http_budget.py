"""Ledger persistence and reservations, provider policy, and the cost plan (pure)."""

from __future__ import annotations

import pytest

from eyas.config import ConfigError, GenerateConfig
from eyas.generate.http.budget import Ledger, Pricing, estimate_prompt_tokens, replay
from eyas.generate.http.plan import DatasetInputs, make_plan
from eyas.generate.http.providers import parse_endpoints, provider_object, rejection, worst_case_pricing
from tests.generate.fake_openai import endpoints_listing


def test_ledger_never_reserves_past_the_budget(tmp_path):
    ledger = Ledger(tmp_path / "ledger.jsonl", budget_usd=1.0)
    assert ledger.reserve("a", 0.6)
    assert not ledger.reserve("b", 0.5)
    assert ledger.committed == pytest.approx(0.6)
    ledger.spend("a", 0.1, "ds", "P")
    assert ledger.reserve("b", 0.5)
    assert ledger.committed == pytest.approx(0.6)
    ledger.release("b")
    assert ledger.committed == pytest.approx(0.1)
    ledger.close()


def test_ledger_survives_restarts_and_counts_crash_leftovers(tmp_path):
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path, budget_usd=1.0)
    ledger.reserve("a", 0.2)
    ledger.spend("a", 0.15, "ds1", "P")
    ledger.reserve("b", 0.3)  # in flight when the process dies: never closed
    ledger.reserve("c", 0.2)
    ledger.release("c")
    # What a SIGKILL leaves: every line written (each is one write to the file), no close.
    with path.open("a") as f:
        f.write('{"e": "spend", "id": "b", "us')  # and perhaps a torn last line
    seen, open_ = replay(path)  # read-only, as eyas plan reads it while a run may be appending
    assert (seen.spent, open_) == (pytest.approx(0.15), {"b": 0.3})

    again = Ledger(path, budget_usd=1.0)
    assert again.spent == pytest.approx(0.15)
    assert again.possibly_spent == pytest.approx(0.3)
    assert dict(again.spending.by_dataset) == {"ds1": pytest.approx(0.15)}
    assert dict(again.spending.by_provider) == {"P": pytest.approx(0.15)}
    assert not again.reserve("d", 0.6)  # 0.15 + 0.3 + 0.6 > 1.0
    assert again.reserve("d", 0.5)
    again.spend("d", 0.05, "ds2", "Q")
    again.close()
    third = Ledger(path, budget_usd=1.0)
    assert (third.spent, third.possibly_spent) == (pytest.approx(0.2), pytest.approx(0.3))
    assert path.read_text().count("\n") == 1  # compacted into one snapshot line
    third.close()


def test_prompt_estimate_is_at_least_a_token_per_four_bytes():
    messages = [{"role": "user", "content": "word " * 400}]
    assert estimate_prompt_tokens(messages) >= 2000 // 4


def _endpoints():
    return parse_endpoints(endpoints_listing("moonshotai/kimi-k2.5"))


def test_policy_and_request_provider_object_come_from_one_place():
    g = GenerateConfig.model_validate(
        {
            "http": {
                "provider": {"order": ["fakeai"], "ignore": ["mystery"]},
                "provider_policy": {
                    "quantizations": ["int4", "fp8", "bf16"],
                    "unknown_quantization": "deny",
                    "ignore": ["precise"],
                },
            }
        }
    )
    provider = provider_object(g)
    assert provider == {"order": ["fakeai"], "ignore": ["mystery", "precise"], "quantizations": ["int4", "fp8", "bf16"]}
    verdicts = {e.tag: rejection(e, provider) for e in _endpoints()}
    assert verdicts == {"fakeai": None, "cheapo/fp4": "quantization fp4", "precise": "ignored", "mystery": "ignored"}
    assert worst_case_pricing(_endpoints(), provider) == Pricing.per_million(1.0, 4.0)


def test_routing_and_policy_that_allow_no_quantization_are_a_config_error():
    g = GenerateConfig.model_validate(
        {"http": {"provider": {"quantizations": ["fp4"]}, "provider_policy": {"quantizations": ["int4"]}}}
    )
    with pytest.raises(ConfigError, match="no level in common"):
        provider_object(g)


def test_unknown_quantization_can_be_allowed_and_base_slugs_match_variants():
    g = GenerateConfig.model_validate(
        {"http": {"provider_policy": {"quantizations": ["int4"], "unknown_quantization": "allow"}}}
    )
    provider = provider_object(g)
    assert provider == {"quantizations": ["int4", "unknown"]}
    assert [e.tag for e in _endpoints() if rejection(e, provider) is None] == ["fakeai", "mystery"]
    only = {"only": ["cheapo"]}
    assert [e.tag for e in _endpoints() if rejection(e, only) is None] == ["cheapo/fp4"]
    assert rejection(_endpoints()[2], {"max_price": {"completion": 4.5}}) == "completion price over max_price"
    assert worst_case_pricing(_endpoints(), {"only": ["nobody"]}) is None


def test_reference_plan_scales_six_10m_targets_to_fit_100_dollars():
    pricing = Pricing.per_million(0.6, 2.2)
    inputs = [DatasetInputs(f"d{i}", 6000, 500.0, 2600.0, True, 10_000_000) for i in range(6)]
    plan = make_plan(inputs, pricing, budget_usd=100.0)
    assert plan.over_budget
    per = plan.datasets[0]
    assert per.output_tokens == 10_000_000
    assert per.requests == 3847
    assert per.cost_usd == pytest.approx(22.0 + 3847 * 500 * 0.6e-6)
    assert 6_900_000 <= per.proposed_target <= 7_300_000
    refit = make_plan(
        [
            DatasetInputs(d.name, d.prompts, d.mean_prompt_tokens, d.mean_output_tokens, True, p.proposed_target)
            for d, p in zip(inputs, plan.datasets)
        ],
        pricing,
        100.0,
    )
    assert not refit.over_budget and refit.cost_usd > 99.0


def test_plan_without_target_uses_every_prompt_and_fits():
    plan = make_plan(
        [DatasetInputs("a", 100, 50.0, 200.0, False, None)], Pricing.per_million(1.0, 2.0), budget_usd=10.0
    )
    assert (plan.datasets[0].output_tokens, plan.datasets[0].requests) == (20_000, 100)
    assert plan.cost_usd == pytest.approx(0.04 + 0.005)
    assert not plan.over_budget and plan.datasets[0].proposed_target is None


def test_free_servers_leave_no_journal_lines(tmp_path):
    ledger = Ledger(tmp_path / "ledger.jsonl", budget_usd=None)
    ledger.reserve("a", 0.0)
    ledger.spend("a", 0.0, "ds", "http://127.0.0.1:8000/v1")
    ledger.reserve("b", 0.0)
    ledger.release("b")
    ledger.close()
    assert (tmp_path / "ledger.jsonl").read_text().count("\n") == 1
    assert ledger.committed == 0.0
