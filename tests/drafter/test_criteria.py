"""The loss library and D-PACE: each divergence is its formula, a perfect drafter scores each one's
minimum, every family's objective sends each loss's gradient to every tensor it trains, and a
config naming a loss that does not exist is refused by key."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import get_args

import pytest
import torch

from eyas.config import ConfigError, LossName, parse_config
from eyas.drafter.criteria import DIVERGENCES, Criterion, dpace_weights
from eyas.drafter.families.dflash import BlockObjective
from eyas.drafter.families.dflash2 import SelectorObjective
from eyas.drafter.families.dspark import DSparkObjective
from eyas.drafter.families.eagle3 import TargetHead, TTTObjective
from eyas.target.capture import capture
from eyas.train.data import Batch
from tests.train.helpers import small_drafter
from tests.train.test_dflash import random_dflash
from tests.train.test_dflash2 import random_dflash2
from tests.train.test_dspark import DRAFT_VOCAB, random_dspark

LOSSES = get_args(LossName)


def test_every_loss_a_config_may_name_is_one_the_library_computes():
    assert set(DIVERGENCES) == set(LOSSES)


def test_each_divergence_is_its_formula():
    p, q = [0.5, 0.3, 0.2], [0.2, 0.2, 0.6]
    kl = sum(a * math.log(a / b) for a, b in zip(p, q))
    rkl = sum(b * math.log(b / a) for a, b in zip(p, q))
    m = [(a + b) / 2 for a, b in zip(p, q)]
    jsd = 0.5 * sum(a * math.log(a / c) for a, c in zip(p, m)) + 0.5 * sum(b * math.log(b / c) for b, c in zip(q, m))
    tv = 0.5 * sum(abs(a - b) for a, b in zip(p, q))
    alpha = sum(min(a, b) for a, b in zip(p, q))
    blend = math.exp(-3.0 * alpha)
    expected = {
        "kl_div": kl,
        "rkl": rkl,
        "jsd": jsd,
        "tv": tv,
        "nla": -math.log(alpha),
        "lk_hybrid": blend * kl + (1 - blend) * tv,
        "ce": -math.log(q[0]),
    }
    target_logp, logits = torch.tensor(p).log(), torch.tensor(q).log()
    for name, value in expected.items():
        assert Criterion(((name, 1.0),)).score(target_logp, logits)[0].item() == pytest.approx(value, rel=1e-5), name
    mix = Criterion((("ce", 0.1), ("tv", 0.9))).score(target_logp, logits)[0].item()
    assert mix == pytest.approx(0.1 * expected["ce"] + 0.9 * tv, rel=1e-5)
    assert jsd <= math.log(2)


@pytest.mark.parametrize("name", LOSSES)
def test_a_perfect_drafter_scores_the_minimum_and_any_other_scores_more(name):
    """q = p is every divergence's minimum, 0; cross-entropy's is all the mass on the target's
    greedy token (0 in the limit). Any drafter that moves mass off it scores more."""
    torch.manual_seed(0)
    target_logits = torch.randn(6, 12) * 2
    target_logp = torch.log_softmax(target_logits, -1)
    greedy = torch.nn.functional.one_hot(target_logits.argmax(-1), 12).bool()
    perfect = 12.0 * greedy.float() if name == "ce" else target_logits
    criterion = Criterion(((name, 1.0),))
    best, _ = criterion.score(target_logp, perfect)
    assert best.abs().max() < 1e-4
    for _ in range(20):
        worse, _ = criterion.score(target_logp, perfect + torch.randn(6, 12).abs().masked_fill(greedy, 0.0))
        assert (worse > best).all()


def test_dpace_weighs_a_position_by_what_it_adds_to_the_expected_acceptance_length():
    """Weight k = Σ_{j ≥ k} Π_{i ≤ j} ((1 − α)·c_i + α); an untrained position weighs 0 and leaves
    the chain as it was."""
    sure = dpace_weights(torch.ones(1, 3), torch.ones(1, 3, dtype=torch.bool), 0.5)
    assert sure.tolist() == [[3.0, 2.0, 1.0]]
    half = dpace_weights(torch.tensor([[0.5, 0.5]]), torch.ones(1, 2, dtype=torch.bool), 0.5)
    assert half.tolist() == [[0.75 + 0.75**2, 0.75**2]]
    gap = dpace_weights(torch.tensor([[0.5, 0.0, 0.5]]), torch.tensor([[True, False, True]]), 0.5)
    assert gap.tolist() == [[0.75 + 0.75**2, 0.0, 0.75**2]]


@pytest.fixture(scope="module")
def batch(model, tokenizer) -> Batch:
    """One sample, its answer from the fifth token, with the states every family reads."""
    ids = torch.tensor([tokenizer("Speculative decoding drafts tokens that the target then checks.")["input_ids"]])
    captured = capture(model, ids, aux_layers=[1, 15, 26])
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[0, 4:] = True
    return Batch(ids, mask, captured.aux.clone(), captured.final.clone(), int(mask.sum()))


def drafter_and_objective(family: str, model, batch: Batch):
    """A random drafter of ``family`` on the embedded target and its objective;
    EAGLE-3's draft vocabulary holds the target's greedy tokens on ``batch``, so that it trains."""
    if family == "eagle3":
        drafter = small_drafter(model)
        vocab, size = model.config.vocab_size, drafter.spec.draft_vocab_size
        greedy = (batch.final @ model.lm_head.weight.T).argmax(-1).flatten().unique()
        used = torch.cat([greedy, torch.arange(vocab)[~torch.isin(torch.arange(vocab), greedy)][: size - len(greedy)]])
        used = used.sort().values
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[used] = True
        drafter.set_vocab(used - torch.arange(size), t2d)
        return drafter, TTTObjective(TargetHead(model.lm_head.weight, used, drafter.t2d), 3)
    if family == "dflash":
        return random_dflash(model), BlockObjective(4, 4)
    if family == "dflash2":
        return random_dflash2(model), SelectorObjective(4, 4, selector_weight=1.0)
    drafter = random_dspark(model)
    draft_ids = torch.arange(DRAFT_VOCAB) + drafter.d2t
    return drafter, DSparkObjective(4, 4, draft_ids, drafter.t2d, 1.0)


@pytest.mark.parametrize("family", ["eagle3", "dflash", "dflash2", "dspark"])
def test_every_loss_reaches_every_tensor_a_family_trains(family, model, batch):
    """Each loss alone under the family's fixed decay, then all of them summed under it and under D-PACE."""
    every = tuple((name, 1.0) for name in LOSSES)
    criteria = [Criterion(((name, 1.0),)) for name in LOSSES] + [Criterion(every), Criterion(every, dpace_alpha=0.5)]
    drafter, objective = drafter_and_objective(family, model, batch)
    drafter.train()
    for criterion in criteria:
        drafter.zero_grad(set_to_none=True)
        stats = replace(objective, criterion=criterion).stats(drafter, drafter, batch, [0])
        loss = sum(s.loss_sum / s.loss_count.clamp(min=1) for s in stats)
        assert torch.isfinite(loss) and loss > 0, criterion
        loss.backward()
        unreached = [n for n, p in drafter.named_parameters() if p.requires_grad and not p.grad.abs().sum() > 0]
        assert not unreached, (criterion, unreached)


def test_a_loss_nobody_computes_is_refused_naming_the_key(tmp_path):
    base = {"run_dir": str(tmp_path), "target": {"device": "cpu"}}
    for loss in ("kl", {"ce": 0.1, "tvd": 0.9}, {"ce": -1.0, "tv": 1.0}, {"ce": 0}):
        with pytest.raises(ConfigError, match=r"train\.loss: .*one of kl_div, rkl, jsd, tv, nla, lk_hybrid, ce"):
            parse_config({**base, "train": {"loss": loss}})
    assert parse_config({**base, "train": {"loss": {"ce": 1, "tv": 9}}}).train.loss_terms == {"ce": 1.0, "tv": 9.0}


def test_a_mix_is_one_sum_whichever_order_the_config_lists_it(tmp_path):
    """A resumed run whose config was rewritten (YAML sorts keys) summed lk_hybrid, kl and ce's
    gradients in another order and drifted from the run it continued by a float rounding."""
    from eyas.train import fingerprint

    base = {"run_dir": str(tmp_path), "target": {"device": "cpu"}}
    listed = [
        parse_config({**base, "train": {"loss": loss}})
        for loss in ({"lk_hybrid": 1, "ce": 0.1}, {"ce": 0.1, "lk_hybrid": 1})
    ]
    assert [list(c.train.loss_terms) for c in listed] == [["ce", "lk_hybrid"]] * 2
    assert fingerprint(listed[0]) == fingerprint(listed[1])
