"""A drafter trained just enough to be accepted: overfit on the few sequences it is evaluated on.

The broken-drafter test needs a drafter that really uses its aux states, in seconds, so it is
trained here for a few seconds on the target's own greedy continuations of the eval prompts (hard labels, the
target's argmax at every TTT step) with the drafter's training unroll.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from eyas.config import TrainConfig
from eyas.drafter.families import save_drafter
from eyas.drafter.families.eagle3 import Eagle3Drafter, Eagle3Spec
from eyas.drafter.spec import spec_for_target
from eyas.target.capture import capture, default_aux_layers, num_decoder_layers
from tests.conftest import write_jsonl

TEXTS = ("What is the capital of France?", "Name three primary colors.", "Why is the sky blue?")
OVERFIT_NEW = 16
"""Tokens generated per prompt, in training and in the tests that evaluate the drafter."""


def overfit_drafter(
    model, sequences: list[list[int]], steps: int = 40, ttt_steps: int = 3, seed: int = 0, eagle3: dict | None = None
) -> Eagle3Drafter:
    torch.manual_seed(seed)
    aux_layers = default_aux_layers(num_decoder_layers(model))
    length = min(len(s) for s in sequences)
    ids = torch.tensor([s[:length] for s in sequences])
    captured = capture(model, ids, aux_layers=aux_layers)
    # capture runs in inference mode; a plain copy can feed a graph that is differentiated.
    aux = captured.aux.clone()
    with torch.no_grad():
        target_next = model.lm_head(captured.final).argmax(-1)  # [B, T]: greedy token after each position
    used = torch.unique(torch.cat([ids.flatten(), target_next.flatten()]))
    vocab = len(used)
    train = TrainConfig(intermediate_size=512, eagle3=eagle3 or {})
    spec = Eagle3Spec(**spec_for_target(model.config, train, aux_layers, vocab).sizes(), **train.eagle3.model_dump())
    drafter = Eagle3Drafter(spec, model.get_input_embeddings().weight)
    t2d = torch.zeros(spec.vocab_size, dtype=torch.bool)
    t2d[used] = True
    drafter.set_vocab(used - torch.arange(vocab), t2d)
    to_draft = torch.full((spec.vocab_size,), -1, dtype=torch.long)
    to_draft[used] = torch.arange(vocab)
    optimizer = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=2e-3)
    drafter.train()
    for _ in range(steps):
        loss = 0.0
        for k, logits in enumerate(drafter.unroll(aux, ids, ttt_steps)):
            # Step k, row t predicts the target's choice at position t+1+k.
            labels = to_draft[target_next[:, 1 + k :]]
            loss = loss + F.cross_entropy(logits[:, : length - 1 - k].flatten(0, 1), labels.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return drafter.eval().requires_grad_(False)


def distinct_layers_target(vocab_size: int, **config):
    """A small random target whose layers each move the residual stream a lot (init std 1.0), so
    a drafter fed the wrong layers loses plainly — on SmolLM2 adjacent layers are so alike that a
    drafter overfit on three prompts barely notices."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    sizes = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 8, "num_attention_heads": 4}
    llama = LlamaConfig(
        **sizes,
        num_key_value_heads=2,
        vocab_size=vocab_size,
        initializer_range=1.0,
        tie_word_embeddings=False,
        **config,
    )
    return LlamaForCausalLM(llama).eval().requires_grad_(False)


def engine_eval_config(root: Path, drafter, eval_settings: str, num_draft_tokens: int = 3) -> Path:
    """A run that evaluates ``drafter`` (either family, saved under ``root``) on :data:`TEXTS` in another engine:
    ``eval_settings`` are the flow-mapping keys that name the engine and its own settings."""
    save_drafter(drafter, root / "draft")
    write_jsonl(root / "prompts.jsonl", [{"prompt": t} for t in TEXTS])
    (root / "run.yaml").write_text(
        "run_dir: run\n"
        "target: {model: embedded, device: cpu}\n"
        f"eval: {{{eval_settings}, num_draft_tokens: {num_draft_tokens}, max_new_tokens: {OVERFIT_NEW},"
        " prompts: prompts.jsonl, draft: draft, broken_control: false}\n"
    )
    return root / "run.yaml"


def overfit_dflash(
    model,
    prompts: list[list[int]],
    answers: list[list[int]],
    steps: int = 100,
    block_size: int = 4,
    seed: int = 0,
    family: str = "dflash",
):
    """A block drafter of ``family`` — DFlash; DSpark over a draft vocabulary of the tokens the
    sequences and the target's greedy choices use, with the confidence head; DFlash2 with its
    convolutions and selector — overfit on ``answers`` to ``prompts`` with training's own
    objective (blocks anchored inside the answers), for tests that need one that is accepted."""
    from eyas.drafter.families.dflash import BlockObjective, DFlashDrafter, dflash_spec
    from eyas.drafter.families.dflash2 import DFlash2Drafter, DFlash2Spec, SelectorObjective
    from eyas.drafter.families.dspark import DSparkDrafter, DSparkObjective, DSparkSpec
    from eyas.train.data import Batch

    torch.manual_seed(seed)
    aux_layers = default_aux_layers(num_decoder_layers(model))
    length = max(len(p) + len(a) for p, a in zip(prompts, answers))
    ids = torch.tensor([p + a + [0] * (length - len(p) - len(a)) for p, a in zip(prompts, answers)])
    loss_mask = torch.zeros_like(ids, dtype=torch.bool)
    for row, (p, a) in enumerate(zip(prompts, answers)):
        loss_mask[row, len(p) : len(p) + len(a)] = True
    captured = capture(model, ids, aux_layers=aux_layers)
    batch = Batch(ids, loss_mask, captured.aux.clone(), captured.final.clone(), int(loss_mask.sum()))
    train = TrainConfig(intermediate_size=512, dflash={"block_size": block_size})
    vocab = model.config.vocab_size
    base = spec_for_target(model.config, train, aux_layers, vocab)
    spec = dflash_spec(base, train.dflash, 16)
    embedding, head = model.get_input_embeddings().weight, model.lm_head.weight
    if family == "dspark":
        with torch.no_grad():
            greedy = model.lm_head(captured.final).argmax(-1)
        used = torch.unique(torch.cat([ids.flatten(), greedy.flatten()]))
        spec = DSparkSpec(
            **(spec.sizes() | {"draft_vocab_size": len(used)}), block_size=block_size, mask_token_id=16, markov_rank=32
        )
        drafter = DSparkDrafter(spec, embedding, head)
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[used] = True
        drafter.set_vocab(used - torch.arange(len(used)), t2d)
        objective = DSparkObjective(OVERFIT_NEW, block_size, used, t2d, 1.0)
    elif family == "dflash2":
        spec = DFlash2Spec(**vars(spec), selector_rank=32, selector_top_k=8)
        drafter = DFlash2Drafter(spec, embedding, head)
        objective = SelectorObjective(anchors=OVERFIT_NEW, block_size=block_size, selector_weight=1.0)
    else:
        drafter = DFlashDrafter(spec, embedding, head)
        objective = BlockObjective(anchors=OVERFIT_NEW, block_size=block_size)
    optimizer = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=2e-3)
    drafter.train()
    for step in range(steps):
        stats = objective.stats(drafter, drafter, batch, [hash((seed, step, row)) for row in range(len(prompts))])
        loss = sum(s.loss_sum / s.loss_count.clamp(min=1) for s in stats)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return drafter.eval().requires_grad_(False)
