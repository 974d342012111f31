"""``train.optimizer``: Muon takes the drafter's linear weight matrices and AdamW the rest, every
trained tensor exactly once. (A run with Muon, LK losses and D-PACE resuming bit for bit is
``tests/train/test_loop.py``'s fresh-process resume.)"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from eyas.config import TrainConfig
from eyas.train.optimizer import build_optimizers
from tests.train.test_dspark import random_dspark


def test_muon_takes_the_linear_weights_and_adamw_the_norms_and_lookup_tables(model):
    drafter = random_dspark(model).train()
    muon, adamw = build_optimizers(drafter, TrainConfig(optimizer="muon"), 1e-3, total=10).optimizers
    assert isinstance(muon, torch.optim.Muon) and isinstance(adamw, torch.optim.AdamW)
    names = {id(p): n for n, p in drafter.named_parameters() if p.requires_grad}
    on_muon = {names[id(p)] for group in muon.param_groups for p in group["params"]}
    on_adamw = {names[id(p)] for group in adamw.param_groups for p in group["params"]}
    assert not on_muon & on_adamw and on_muon | on_adamw == set(names.values())
    linear = {f"{n}.weight" for n, m in drafter.named_modules() if isinstance(m, torch.nn.Linear)}
    assert on_muon and on_muon <= linear
    assert "markov_head.markov_w1.weight" in on_adamw, "a lookup table is no matrix Muon orthogonalises"
    assert any(n.endswith("norm.weight") for n in on_adamw)
    assert muon.param_groups[0]["lr"] == pytest.approx(1e-2) and adamw.param_groups[0]["lr"] == pytest.approx(1e-3)


@pytest.mark.parametrize("shape", [(48, 24), (24, 48)])
def test_the_cpu_muon_steps_as_torchs_up_to_bfloat16_rounding(shape):
    """On a CPU the orthogonalisation runs in float32 (bfloat16 is emulated there, 74× slower);
    the step is otherwise torch's: two optimizers from one start take the same step."""
    from torch.optim import _muon

    from eyas.train.optimizer import Float32Muon

    torch_own = _muon._zeropower_via_newtonschulz
    start = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    grad = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    moved = []
    for kind in (torch.optim.Muon, Float32Muon):
        weight = nn.Parameter(start.clone())
        optimizer = kind([weight], lr=0.02, adjust_lr_fn="match_rms_adamw")
        weight.grad = grad.clone()
        optimizer.step()
        moved.append(weight.detach() - start)
    assert _muon._zeropower_via_newtonschulz is torch_own, "torch's own is back after the step"
    # bfloat16 keeps 8 bits of mantissa through five iterations: about 1% of the step.
    assert (moved[1] - moved[0]).norm() < 0.03 * moved[0].norm()
    assert not torch.equal(moved[1], moved[0]), "the float32 step is not torch's bfloat16 one"
