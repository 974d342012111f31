"""The incremental DraftSession reproduces the training unroll exactly (the shifting rules), for
EAGLE-3, EAGLE-3.1 (norm before ``fc``, post-norm state fed back) and speculators' trainer's
default (EAGLE-3.1 with the normed state as the attention's residual)."""

from __future__ import annotations

import pytest
import torch

from eyas.drafter.families.eagle3 import DraftSession
from eyas.target.capture import capture
from tests.train.helpers import small_drafter

K = 3


@pytest.fixture(scope="module")
def sequence(tokenizer, model):
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Name three colors."}, {"role": "assistant", "content": "Red, green and blue."}],
        tokenize=False,
    )
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    return ids, capture(model, ids).aux


EAGLE3_1 = {"norm_before_fc": True, "norm_output": True}
SWITCHES = {
    "eagle3": {},
    "eagle3.1": EAGLE3_1,
    "eagle3.1 as vLLM serves it": {"fc_norm": True, "norm_output": True},
    "speculators": {**EAGLE3_1, "norm_before_residual": True},
}


@pytest.fixture(scope="module", params=list(SWITCHES))
def drafter(model, request):
    return small_drafter(model, eagle3=SWITCHES[request.param])


def training_probs(drafter, aux, ids, row):
    """Per-step target-vocabulary distributions of the unroll at ``row``."""
    with torch.no_grad():
        out = []
        for logits in drafter.unroll(aux, ids, K):
            full = torch.zeros(drafter.spec.vocab_size)
            full[drafter.to_target_ids(torch.arange(drafter.spec.draft_vocab_size))] = torch.softmax(logits[0, row], -1)
            out.append(full)
        return out


@pytest.mark.parametrize("n", [1, 7, 15])
def test_session_matches_training_unroll(drafter, sequence, n):
    ids, aux = sequence
    session = DraftSession(drafter)
    session.append(aux[0, :n], ids[0, 1 : n + 1])
    torch.manual_seed(1)
    drafts, probs = session.propose(K, temperature=1.0)
    # The training sequence continues with the drafts themselves, so step j sees d_j as its token.
    fed = torch.cat([ids[:, : n + 1], torch.tensor([drafts[:-1]])], dim=1)
    expected = training_probs(drafter, aux[:, : fed.shape[1]], fed, row=n - 1)
    for step in range(K):
        torch.testing.assert_close(probs[step], expected[step], atol=1e-5, rtol=1e-4)
        assert probs[step].sum().item() == pytest.approx(1.0, abs=1e-5)
        assert probs[step][drafts[step]] > 0
        assert drafter.t2d[drafts[step]]


def test_greedy_proposals_are_the_unroll_argmax(drafter, sequence):
    ids, aux = sequence
    n = 10
    session = DraftSession(drafter)
    session.append(aux[0, :n], ids[0, 1 : n + 1])
    drafts, probs = session.propose(K)
    assert probs is None
    fed = torch.cat([ids[:, : n + 1], torch.tensor([drafts[:-1]])], dim=1)
    expected = [int(p.argmax()) for p in training_probs(drafter, aux[:, : fed.shape[1]], fed, row=n - 1)]
    assert drafts == expected


def test_append_in_pieces_discards_speculation(drafter, sequence):
    ids, aux = sequence
    whole = DraftSession(drafter)
    whole.append(aux[0, :12], ids[0, 1:13])
    pieces = DraftSession(drafter)
    for start, stop in [(0, 5), (5, 6), (6, 12)]:
        pieces.append(aux[0, start:stop], ids[0, start + 1 : stop + 1])
        pieces.propose(K)
    torch.manual_seed(3)
    _, a = whole.propose(K, temperature=0.7)
    torch.manual_seed(3)
    _, b = pieces.propose(K, temperature=0.7)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-4)
    assert pieces.length == whole.length == 12


def test_append_rejects_mismatched_shapes(drafter, sequence):
    ids, aux = sequence
    with pytest.raises(ValueError, match="append needs"):
        DraftSession(drafter).append(aux[0, :3], ids[0, :4])
