"""A peer trainer on eyas's data: vLLM's speculators trains an EAGLE-3 drafter with its own default
recipe on the demo's exact train split, and eyas's evaluator scores it on the same held-out prompts.

Issue 38, item 6. What is matched to the demo (``runs/demo/demo.yaml``) and what is speculators' own:

- matched: the samples (the merge's 176 train rows, ids and loss masks as eyas trains on them,
  ``train.max_seq_len`` 512 applied as eyas applies it); the target's hidden states, computed by
  eyas's own capture (:func:`eyas.target.capture.capture`, one sample at a time, as the demo's
  ``train.cache_states`` does); the aux layers (eyas's ``extract.aux_layers`` default for the
  target, [1, 14, 26] as decoder outputs = speculators' ``target_layer_ids`` [2, 15, 27]); the draft
  vocabulary (eyas's own :func:`~eyas.drafter.vocab.count_answer_tokens` and
  :func:`~eyas.drafter.vocab.build_vocab`, written as speculators' ``d2t-4096.npy`` / ``t2d-4096.npy``:
  d2t int64 offsets, target id = draft id + d2t, and t2d a bool mask over the 49,152 target ids, the
  same convention); ``ttt_steps`` 3; 240 optimizer steps; about 8 samples a step (below).
- speculators' own, left at its defaults: everything else, i.e. its recipe: the draft decoder built
  from the verifier (1 Llama layer of the target's sizes, sliding window 2048, which no sample here
  reaches, EAGLE-3.1's ``norm_before_fc`` and ``norm_output``, ``norm_before_residual``),
  ``lm_head`` initialised from the target's rows of the draft vocabulary and frozen, the embedding
  frozen, Muon (lr 1e-3, momentum 0.95, weight decay 0.1) on the layer's eight matrices and AdamW
  (lr 1e-3, weight decay 0.01) on its five norms, linear schedule with 1% warmup (2 steps) to 0 at
  ``max_steps``, ``kl_div`` against the target's distribution over the draft vocabulary with no
  per-step decay, gradient clipping at 1, seed 42.
- the states' convention: speculators' hidden-state file holds the aux layers then the target's
  last layer, and its trainer applies the target's final norm to that last state itself
  (``verifier_norm``), so the last state is the last decoder layer's output *before* the final norm
  (vLLM's capture, which speculators' data generation uses, takes it there too). eyas's capture
  returns it after the norm; the bench hooks the last layer as well and checks, per sample, that
  the target's norm of it is eyas's final state.

Batch: speculators has no per-step sample count. Its sampler (``MultipackDistributedBatchSamplerV2``)
packs whole samples into one row of ``data.total_seq_len`` tokens. The bench runs that sampler
(same seed, same per-epoch reshuffle) over the train split's lengths and takes the
``total_seq_len`` whose 240 steps hold 8.0 samples on average, as the demo's 240 × 8 = 1,920 sample
visits do (on the demo's corpus about 1,400 tokens: mean sample 167.6 tokens, plus the tail each
packed row leaves empty; 1,427 tokens, 22 steps an epoch). ``trainer.epochs`` (default 20; with
``max_steps`` set it only bounds the loop) is set to the number of epochs those 240 steps need:
speculators stops an epoch at ``max_steps`` but then starts the next, and each later epoch runs one
more step before it stops again, so a larger ``epochs`` would train past 240. ``train_data_ratio``
must lie strictly inside (0, 1), so the dataset is the 176 train rows followed by the merge's 16
held-out rows, with a ratio that puts exactly the 176 in speculators' train split; the held-out
rows only feed its validation metrics (``save_best`` is off, so they choose nothing). Checkpoints
are written at epoch 0 and at the last epoch only (``checkpoint_freq`` = epochs); checkpointing
does not touch training.

Installation, in an environment of its own (``.venv-speculators``, ignored by git), so that nothing
there changes eyas's ``.venv``::

    python3 -m venv .venv-speculators
    .venv-speculators/bin/pip install -q --upgrade pip
    # torch first, the CPU build (this machine's index has it as torch 2.13.0+cpu):
    .venv-speculators/bin/pip install -q torch==2.13.0
    # speculators' requirements without torch, torchvision and torchaudio: a plain `pip install
    # speculators==0.9.0` resolves torchvision/torchaudio against PyPI, which pulls torch 2.14.1
    # with CUDA 13 (several GB), and PyPI's torchvision does not load beside a +cpu torch anyway;
    # speculators never imports either.
    .venv-speculators/bin/pip install -q "torch==2.13.0" aiohttp click "datasets>=4.0.0,<=5.1.0" httpx \\
        huggingface-hub "loguru>=0.7.2,<=0.7.3" "numpy>=2.0.0,<=2.5.4" "openai>=2.0.0" protobuf psutil \\
        "pydantic>=2.0.0" "pydantic-settings>=2.0.0" rich safetensors "tqdm>=4.66.3,<=4.70.1" \\
        "transformers>=5.0.0,<=5.19.0" "typer>=0.12.0" "hs-connectors==0.9.0"
    .venv-speculators/bin/pip install -q --no-deps speculators==0.9.0

(2026-12: datasets 5.1.0, transformers 5.19.0, hs-connectors 0.9.0; ``pip check`` then names only
the missing torchvision and torchaudio.)

What runs on a CPU. speculators' trainer is written for GPUs; these are every change the bench
makes, all at run time (the installed package is never edited):

1. ``data.hidden_states_dtype: float32`` (config). The default bfloat16 means bf16 states and bf16
   autocast. Without an accelerator the trainer asks for CUDA autocast, which torch disables on a
   CPU, so the default would round the states to bf16 and still compute in float32; CPU autocast
   instead would run bf16 matmuls, which these cores emulate (see 8). States and compute stay in
   float32, as eyas trains on a CPU; speculators still saves its checkpoints in bfloat16.
2. ``draft.draft_attn_impl: sdpa`` (config). The default ``simple_flex_attention`` needs compiled
   flex-attention kernels. With ``sdpa`` speculators builds the same document/causal/TTT-diagonal
   mask densely (``create_mask``) and transformers' SDPA applies it.
3. ``loss.loss_implementation: eager`` (config). ``fused`` is a Triton kernel (GPU only). Same
   ``kl_div``, in plain torch.
4. ``data.num_workers: 0`` (config). The default 12 spawn processes, each importing torch, on 2
   cores; data loading moves into the training process and changes no numbers.
5. ``generation.on_missing: raise`` (config). Every sample's states are on disk; the default
   ``generate`` would call a vLLM server for a missing one.
6. Patch: ``speculators.train.trainer.get_local_rank`` returns ``torch.device("cpu")``. The trainer
   uses the local rank (0) as the device, so ``model.to(0)`` and ``batch.to(0)`` mean ``cuda:0``.
   The trainer's autocast device type is set to ``cpu`` as well (autocast is off either way at float32).
7. Patch: ``speculators.train.checkpointer.get_current_device`` returns ``"cpu"`` (it says
   ``cuda:0`` when there is no accelerator); used only when an interrupted run resumes.
8. Patch: ``torch.optim._muon._zeropower_via_newtonschulz`` runs in float32 (torch's Newton–Schulz
   iteration, same coefficients, steps and scaling, as eyas's ``Float32Muon``). torch runs it in
   bfloat16, which these CPUs emulate: eyas measured 74× slower than float32 here (21.5 s for one
   4,096 × 576 matrix); at that rate the drafter's eight matrices would take some 50 s a step.
9. Patch: ``torch.accelerator.synchronize`` (in the training process only) does nothing when there
   is no accelerator. The trainer's step timer calls it at every logged step (``log_freq`` 1: every
   step), and without an accelerator it raises "Cannot access accelerator device when none is
   available".

Nothing else, as the trainer's code reads (2026-12-07: everything up to the first training step
has run on this machine, through ``Trainer.__init__``, not a step itself): ``torch.compile`` is
applied only when CUDA is available, the distributed set-up only under ``torchrun``, and
``pin_memory`` without an accelerator only warns.

Scoring: eyas's evaluator (``eyas eval`` with ``eval.engine: eyas``: speculative decoding in this
process with the target loaded through transformers, greedy, lossless check, prompt lookup and the
broken-aux-order control beside) on the demo's 16 held-out prompts with the demo's eval settings
(3 draft tokens, 64 new tokens), in a run directory of the bench's own whose merge, tokenize and
generate are links to the demo's, so ``runs/demo`` is only read. eyas reads the checkpoint as
speculators saved it (``config.json`` + ``model.safetensors``: ``layers.0.*`` as ``midlayer.*``,
``fc``, ``input_norm``, ``norm``, ``lm_head``, ``d2t``, ``t2d``; the saved ``embed_tokens.weight``
dropped; ``eagle_aux_hidden_state_layer_ids`` [2, 15, 27] read as [1, 14, 26]). Three gaps this
bench found were closed in eyas itself: the trainer's architecture name ``Eagle3DraftModel`` was
refused; RoPE written only as transformers 5's ``rope_parameters`` was read as base 10,000 instead
of the target's 100,000; and ``norm_before_residual`` (speculators' default: the attention's
residual is the normed hidden state) was ignored, which would have scored another function.

Before the eval, a parity check (``--skip-parity`` leaves it out) runs speculators' own model on
the first two train rows, packed as its trainer packs them (its masks, positions, shift), and eyas's
drafter read from the checkpoint, and requires the same draft token at 99% of the (row, TTT step)
pairs: a gap in how eyas reads the layout shows there, not as a quietly lower τ.

Usage (2 cores; ``make demo`` first; the bench writes only under ``--work``, default
``runs/speculators-peer``)::

    OMP_NUM_THREADS=2 .venv/bin/python bench/speculators_peer.py --run runs/demo/demo.yaml
    OMP_NUM_THREADS=1 .venv/bin/python bench/speculators_peer.py --run runs/demo/demo.yaml --check 2

Stages ``prepare`` (the target's states for the 192 rows, the vocabulary, speculators' dataset),
``train`` (speculators, in ``.venv-speculators``: what ``speculators train --config
<work>/speculators-train.yaml`` runs, after the patches) and ``eval``; ``--stages`` picks some, and
each reuses what an earlier invocation finished (an interrupted training resumes from its last
checkpoint). Outputs: ``speculators-train.yaml``, ``checkpoints/<last epoch>/`` (speculators' own
layout, bfloat16), ``metrics.jsonl`` (speculators' per-step train and per-epoch validation
metrics), ``train-time.json``, ``run/eval/report.json`` (eyas's report) and
``summary.json``, with the table printed beside the demo drafter's τ from ``runs/demo``'s report.

``--check N`` is the cheap check: N train rows and one held-out row with placeholder states (no
target forward pass), read back through speculators' own ``ArrowDataset`` + ``FileTransfer`` +
``CollateFn``, speculators' vocabulary builder on eyas's counts against eyas's vocabulary, the
trainer's config through its own CLI with ``--dry-run`` (builds and saves an untrained drafter),
and that checkpoint read by eyas's loader; ``--parity`` adds the parity check on it (a forward pass
of both drafters over two rows, a few seconds). About a minute.

Estimated time of the full bench on 2 idle cores: 2 to 4 minutes of states (192 forward passes of
the target), 10 to 20 minutes of training (240 steps of ~1,430 packed tokens, SDPA over the dense
TTT mask, float32 Muon), under a minute of parity, 3 to 5 minutes of eval: 15 to 30 minutes.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPECULATORS_PYTHON = ROOT / ".venv-speculators" / "bin" / "python"
SEED = 42
"""speculators' default ``seed``: its sampler's order, which the batch plan must reproduce."""
DONE = "done.json"


# --- speculators' side: runs in .venv-speculators (``--speculators-child``); of eyas it imports only
# the float32 orthogonalisation (a torch-only module, from the source tree) ---


def apply_cpu_patches() -> None:
    """Patches 6–9 of the module docstring."""
    import torch
    import torch.optim._muon as muon
    from speculators.train import checkpointer, trainer

    trainer.get_local_rank = lambda: torch.device("cpu")
    own_init = trainer.Trainer.__init__

    def init(self, *args, **kwargs):
        own_init(self, *args, **kwargs)
        self.device_type = "cpu"

    trainer.Trainer.__init__ = init
    checkpointer.get_current_device = lambda: "cpu"
    sys.path.insert(0, str(ROOT / "src"))
    from eyas.train.optimizer import newton_schulz_float32

    muon._zeropower_via_newtonschulz = newton_schulz_float32
    own_synchronize = torch.accelerator.synchronize

    def synchronize(device=None):
        if torch.accelerator.is_available():
            own_synchronize(device)

    torch.accelerator.synchronize = synchronize


class MetricsFile(logging.Handler):
    """speculators' metric records (dicts on ``speculators.metrics``) as JSON lines."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def emit(self, record: logging.LogRecord) -> None:
        if isinstance(record.msg, dict):
            with self.path.open("a") as f:
                f.write(json.dumps(record.msg, default=float) + "\n")


def samples_per_step(lengths: list[int], total_seq_len: int, steps: int, seed: int) -> tuple[float, int]:
    """Mean samples a step over the first ``steps`` steps of speculators' own sampler, and the
    epochs they span."""
    from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2

    sampler = MultipackDistributedBatchSamplerV2(total_seq_len, lengths, num_replicas=1, rank=0, seed=seed)
    seen, taken, epoch = 0, 0, 0
    while taken < steps:
        sampler.set_epoch(epoch)
        for batch in sampler:
            seen += len(batch)
            taken += 1
            if taken == steps:
                break
        epoch += 1
    return seen / steps, epoch


def greedy_samples_per_step(lengths: list[int], total_seq_len: int, steps: int, seed: int) -> float:
    """:func:`samples_per_step` in a few milliseconds: on one replica the sampler's binary search
    over LPT packings takes the longest run of the epoch's permutation that fits (checked below)."""
    import numpy as np

    lengths_ = np.asarray(lengths)
    seen, taken, epoch = 0, 0, 0
    while taken < steps:
        order = lengths_[np.random.default_rng(seed=seed + epoch).permutation(len(lengths_))]
        start = 0
        while start < len(order) and taken < steps:
            fits = int(np.searchsorted(np.cumsum(order[start:]), total_seq_len, side="right"))
            start += max(1, fits)
            seen += max(1, fits)
            taken += 1
        epoch += 1
    return seen / steps


def child_plan(work: Path, args: argparse.Namespace) -> None:
    """``total_seq_len`` giving ``--batch`` samples a step on average over ``--steps`` steps."""
    import warnings

    warnings.filterwarnings("ignore")
    lengths = json.loads((work / "data" / "rows.json").read_text())["train_lengths"]
    # Up to twice the tokens the batch holds on average: far past the best.
    candidates = range(max(lengths), min(sum(lengths), 2 * args.batch * (sum(lengths) // len(lengths) + 1)) + 1)
    best = min(
        candidates,
        key=lambda t: (abs(greedy_samples_per_step(lengths, t, args.steps, SEED) - args.batch), t),
    )
    mean, epochs = samples_per_step(lengths, best, args.steps, SEED)
    if abs(mean - greedy_samples_per_step(lengths, best, args.steps, SEED)) > 1e-9:
        raise SystemExit(f"speculators' sampler packs otherwise than the bench's model of it at {best} tokens")
    plan = {"total_seq_len": best, "epochs": epochs, "samples_per_step": mean, "steps": args.steps}
    (work / "plan.json").write_text(json.dumps(plan, indent=2) + "\n")
    print(json.dumps(plan))


def child_dataset(work: Path) -> None:
    """speculators' dataset (``load_from_disk``: input_ids, loss_mask, seq_len, torch format), as its
    ``prepare_data`` writes speculator-format rows, into ``data/`` beside the hidden states."""
    from datasets import Dataset, Features, Sequence, Value

    data = work / "data"
    rows = json.loads((data / "rows.json").read_text())
    features = Features(
        {"input_ids": Sequence(Value("int64")), "loss_mask": Sequence(Value("int64")), "seq_len": Value("int64")}
    )
    dataset = Dataset.from_dict(
        {
            "input_ids": rows["input_ids"],
            "loss_mask": rows["loss_mask"],
            "seq_len": [len(ids) for ids in rows["input_ids"]],
        },
        features=features,
    )
    dataset.set_format(type="torch")
    staging = data / "dataset.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    dataset.save_to_disk(str(staging))
    for f in staging.iterdir():
        f.replace(data / f.name)
    staging.rmdir()
    print(f"dataset: {len(dataset)} rows in {data}")


def child_check(work: Path) -> None:
    """Read the data back through speculators' own classes; its vocabulary builder on eyas's counts."""
    import numpy as np
    import torch
    from hs_connectors import FileTransfer
    from speculators.models.eagle3.data import shift_batch
    from speculators.train.data import ArrowDataset, CollateFn
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    data, meta = work / "data", json.loads((work / "data" / DONE).read_text())
    plan = json.loads((work / "plan.json").read_text())
    hidden, aux = meta["hidden_size"], len(meta["target_layer_ids"])
    common = dict(
        max_len=plan["total_seq_len"],
        datapath=str(data),
        transfer=FileTransfer(data / "hidden_states"),
        on_missing="raise",
        train_ratio=meta["train_data_ratio"],
        hidden_states_dtype=torch.float32,
    )
    train, val = ArrowDataset(split="train", **common), ArrowDataset(split="val", **common)
    if (len(train), len(val)) != (meta["train_rows"], meta["eval_rows"]):
        raise SystemExit(f"split {len(train)}/{len(val)}, expected {meta['train_rows']}/{meta['eval_rows']}")
    rows = json.loads((data / "rows.json").read_text())
    for dataset, offset in ((train, 0), (val, meta["train_rows"])):
        for i in range(len(dataset)):
            item = dataset[i]
            if not isinstance(item, dict):
                raise SystemExit(f"row {offset + i}: speculators found no usable states ({item})")
            n = len(rows["input_ids"][offset + i])
            expected = {
                "hidden_states": (n, aux * hidden),
                "verifier_last_hidden_states": (n, hidden),
                "input_ids": (n,),
                "loss_mask": (n,),
            }
            got = {k: tuple(item[k].shape) for k in expected}
            if got != expected or item["input_ids"].tolist() != rows["input_ids"][offset + i]:
                raise SystemExit(f"row {offset + i}: got {got}, expected {expected} and the row's ids")
    batch = CollateFn(plan["total_seq_len"], hidden, aux, torch.float32, shift_batch)([train[i] for i in range(2)])
    shapes = {k: tuple(v.shape) for k, v in batch.items() if isinstance(v, torch.Tensor)}
    print(f"speculators reads {len(train)} train + {len(val)} validation rows; one packed batch: {shapes}")
    freq = torch.load(data / "token_freq.pt", weights_only=True)
    size = meta["draft_vocab_size"]
    d2t, t2d = build_vocab_mappings_from_distribution(freq, size, meta["vocab_size"])
    same = np.array_equal(d2t.numpy(), np.load(data / f"d2t-{size}.npy")) and np.array_equal(
        t2d.numpy(), np.load(data / f"t2d-{size}.npy")
    )
    print(f"speculators' vocabulary builder on eyas's answer-token counts gives eyas's {size} ids: {same}")
    if not same:
        raise SystemExit("vocabulary mismatch")


PARITY_ROWS = 2
"""Train rows the parity check packs into one of speculators' rows."""


def child_parity(work: Path, args: argparse.Namespace) -> None:
    """speculators' own forward (no loss) of the first train rows, packed as its trainer packs them:
    each TTT step's draft ids (argmax over the draft vocabulary), for :func:`parity`."""
    import numpy as np
    import torch
    from hs_connectors import FileTransfer
    from speculators.models.eagle3 import Eagle3DraftModel, shift_batch
    from speculators.train.data import ArrowDataset, CollateFn

    data, meta = work / "data", json.loads((work / "data" / DONE).read_text())
    size = meta["draft_vocab_size"]
    d2t = torch.from_numpy(np.load(data / f"d2t-{size}.npy"))
    t2d = torch.from_numpy(np.load(data / f"t2d-{size}.npy"))
    # As the trainer's --from-pretrained builds it (cli.build_draft_model).
    config = Eagle3DraftModel.config_class.from_pretrained(args.checkpoint)
    config.transformer_layer_config._attn_implementation = "sdpa"
    model = Eagle3DraftModel.from_pretrained(
        args.checkpoint, config=config, t2d=t2d, d2t=d2t, verifier=meta["verifier"]
    )
    model = model.float().eval()
    dataset = ArrowDataset(
        max_len=1 << 20,
        datapath=str(data),
        transfer=FileTransfer(data / "hidden_states"),
        on_missing="raise",
        train_ratio=meta["train_data_ratio"],
        split="train",
        hidden_states_dtype=torch.float32,
    )
    items = [dataset[i] for i in range(PARITY_ROWS)]
    total = sum(len(item["input_ids"]) for item in items)
    hidden, aux = meta["hidden_size"], len(meta["target_layer_ids"])
    batch = CollateFn(total, hidden, aux, torch.float32, shift_batch)(items)
    with torch.no_grad():
        draft = model(
            hidden_states=batch["hidden_states"],
            input_ids=batch["input_ids"],
            document_ids=batch["document_ids"],
            position_ids=batch["position_ids"],
            ttt_steps=args.steps,
        )
    torch.save({"draft_ids": torch.stack([d[0] for d in draft])}, args.out)


def child_train(work: Path, argv: list[str]) -> None:
    """speculators' own ``speculators train`` entry point, after the CPU patches."""
    apply_cpu_patches()
    from speculators.train import cli
    from speculators.train.config import TrainConfig

    own_setup = cli.setup_metric_logger

    def setup_metric_logger(*args, **kwargs):
        own_setup(*args, **kwargs)
        logging.getLogger("speculators.metrics").addHandler(MetricsFile(work / "metrics.jsonl"))

    cli.setup_metric_logger = setup_metric_logger
    started, cpu_started = time.monotonic(), time.process_time()
    cli.main(TrainConfig.resolve(argv))
    if "--dry-run" not in argv:
        seconds = {"wall_s": time.monotonic() - started, "cpu_s": time.process_time() - cpu_started}
        (work / "train-time.json").write_text(json.dumps(seconds, indent=2) + "\n")


def child_main(mode: str, work: Path, args: argparse.Namespace, rest: list[str]) -> None:
    logging.basicConfig(level=logging.WARNING)
    if mode == "plan":
        child_plan(work, args)
    elif mode == "dataset":
        child_dataset(work)
    elif mode == "check":
        child_check(work)
    elif mode == "train":
        child_train(work, rest)
    elif mode == "parity":
        child_parity(work, args)
    else:
        raise SystemExit(f"unknown child mode {mode}")


# --- eyas's side: runs in .venv ---


def in_speculators(mode: str, work: Path, *extra: str) -> None:
    if not SPECULATORS_PYTHON.is_file():
        raise SystemExit(f"{SPECULATORS_PYTHON} is missing: install it as this file's docstring says")
    command = [str(SPECULATORS_PYTHON), str(Path(__file__).resolve()), "--speculators-child", mode]
    subprocess.run([*command, "--work", str(work), *extra], check=True)


def prepare(config, work: Path, check: int | None) -> dict:
    """``data/``: the train rows then the held-out rows with their states (``hidden_states/hs_<row>``:
    ``hidden_states`` [T, 4, H] = the three aux layers' outputs then the last layer's output before
    the final norm, and ``token_ids``), eyas's vocabulary as speculators' ``.npy`` pair, the answer
    token counts as speculators' ``token_freq.pt``, and ``rows.json`` for the dataset."""
    import numpy as np
    import torch
    from safetensors.torch import save_file

    from eyas.drafter.vocab import build_vocab, count_answer_tokens, draft_vocab_size, load_vocab
    from eyas.merge.reader import iter_split
    from eyas.paths import RunPaths
    from eyas.target import aux_layers, load_model_config, resolve_target, text_config
    from eyas.target.capture import check_aux_layers, hf_hidden_state_indices
    from eyas.train.data import read_split

    data = work / "data"
    if (data / DONE).is_file():
        return json.loads((data / DONE).read_text())
    shutil.rmtree(data, ignore_errors=True)
    (data / "hidden_states").mkdir(parents=True)
    paths = RunPaths.of(config)
    text = text_config(load_model_config(config.target))
    layers = check_aux_layers(aux_layers(config.target, config.extract.aux_layers), text.num_hidden_layers)
    vocab = text.vocab_size
    size = draft_vocab_size(config.train.draft_vocab_size, vocab)
    counts = count_answer_tokens(iter_split(paths, "train", ["input_ids", "loss_mask"]), vocab)
    d2t, t2d = build_vocab(counts, size)
    np.save(data / f"d2t-{size}.npy", d2t.numpy())
    np.save(data / f"t2d-{size}.npy", t2d.numpy())
    torch.save({int(i): int(counts[i]) for i in np.flatnonzero(counts)}, data / "token_freq.pt")
    same_as_demo = None
    if paths.train_vocab.is_file():
        demo_d2t, demo_t2d = load_vocab(paths.train_vocab)
        same_as_demo = bool(torch.equal(demo_d2t, d2t) and torch.equal(demo_t2d, t2d))

    train = read_split(paths, "train", config.train.max_seq_len)
    held_out = read_split(paths, "eval", config.train.max_seq_len)
    train_lengths = [len(s.input_ids) for s in train]
    if check is not None:
        train, held_out = train[:check], held_out[:1]
    unsupervised = [i for i, s in enumerate(train) if not s.loss_mask.any()]
    if unsupervised:
        raise SystemExit(f"train rows {unsupervised} have no answer tokens; speculators' prepare_data drops such rows")
    samples = train + held_out
    (data / "rows.json").write_text(
        json.dumps(
            {
                "input_ids": [s.input_ids.tolist() for s in samples],
                "loss_mask": [s.loss_mask.astype(np.int64).tolist() for s in samples],
                "train_lengths": train_lengths,
            }
        )
    )
    hidden = text.hidden_size
    if check is None:
        capture_states(config, samples, layers, data / "hidden_states")
    else:
        # The cheap check runs no forward pass: placeholder states of the real shape.
        generator = torch.Generator().manual_seed(0)
        for row, s in enumerate(samples):
            states = torch.randn(len(s.input_ids), len(layers) + 1, hidden, generator=generator)
            ids = torch.from_numpy(s.input_ids).long()
            save_file(
                {"hidden_states": states, "token_ids": ids}, str(data / "hidden_states" / f"hs_{row}.safetensors")
            )
    # speculators' split boundary is int(rows × ratio): a ratio half a row past the train rows.
    ratio = (len(train) + 0.5) / len(samples)
    if int(len(samples) * ratio) != len(train):
        raise SystemExit(f"train_data_ratio {ratio} does not split {len(samples)} rows at {len(train)}")
    meta = {
        "verifier": resolve_target(config.target).name_or_path,
        "aux_layers": layers,
        "target_layer_ids": hf_hidden_state_indices(layers),
        "hidden_size": hidden,
        "vocab_size": vocab,
        "draft_vocab_size": size,
        "vocab_same_as_demo_run": same_as_demo,
        "train_rows": len(train),
        "eval_rows": len(held_out),
        "train_data_ratio": ratio,
        "placeholder_states": check is not None,
    }
    (data / DONE).write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def capture_states(config, samples, layers: list[int], out: Path) -> None:
    """Each sample alone through eyas's capture (as ``train.cache_states`` computes them), hooking the
    last decoder layer too: its output, before the final norm, is speculators' last state (it
    applies the verifier's norm itself). Checked against eyas's final state, which is after it."""
    import torch
    from safetensors.torch import save_file

    from eyas.target import load_model
    from eyas.target.capture import capture, decoder_layers

    model = load_model(config.target)
    last = len(decoder_layers(model)) - 1
    norm = (model.get_decoder() if hasattr(model, "get_decoder") else model.model).norm
    started = time.monotonic()
    for row, s in enumerate(samples):
        ids = torch.from_numpy(s.input_ids)[None].to(next(model.parameters()).device)
        got = capture(model, ids, aux_layers=[*layers, last])
        states = got.aux[0].reshape(ids.shape[1], len(layers) + 1, -1).float().cpu().clone()
        with torch.inference_mode():
            renormed = norm(states[:, -1].to(got.final.dtype).to(got.final.device))
        if not torch.allclose(renormed.float().cpu(), got.final[0].float().cpu(), atol=1e-4, rtol=1e-4):
            raise SystemExit(f"row {row}: the last layer's output, normed, is not eyas's final state")
        save_file(
            {"hidden_states": states.contiguous(), "token_ids": ids[0].cpu().long().clone()},
            str(out / f"hs_{row}.safetensors"),
        )
    print(f"states of {len(samples)} samples in {time.monotonic() - started:.0f} s")


def speculators_config(config, work: Path, meta: dict, plan: dict, steps: int) -> Path:
    """The trainer's ``--config``: what is matched to the demo and the CPU settings; nothing else."""
    import yaml

    data = work / "data"
    size = meta["draft_vocab_size"]
    train = {
        "speculator_type": "eagle3",
        "verifier": {"verifier_name_or_path": meta["verifier"]},
        "draft": {
            "target_layer_ids": meta["target_layer_ids"],
            "draft_vocab_size": size,
            "d2t_path": str(data / f"d2t-{size}.npy"),
            "t2d_path": str(data / f"t2d-{size}.npy"),
            "draft_attn_impl": "sdpa",
        },
        "data": {
            "data_path": str(data),
            "total_seq_len": plan["total_seq_len"],
            "train_data_ratio": meta["train_data_ratio"],
            "hidden_states_dtype": "float32",
            "num_workers": 0,
        },
        "generation": {"on_missing": "raise"},
        "loss": {"loss_implementation": "eager", "ttt_steps": config.train.ttt_steps},
        "trainer": {
            "epochs": plan["epochs"],
            "max_steps": steps,
            "checkpoint_freq": plan["epochs"],
            "save_path": str(work / "checkpoints"),
        },
        "logging": {"log_dir": str(work / "logs")},
    }
    path = work / "speculators-train.yaml"
    path.write_text(yaml.safe_dump({"train": train}, sort_keys=False))
    return path


def plan_batches(config, work: Path, meta: dict) -> dict:
    batch, steps = config.train.batch_size, config.train.max_steps
    if not (work / "plan.json").is_file():
        in_speculators("plan", work, "--batch", str(batch), "--steps", str(steps))
    return json.loads((work / "plan.json").read_text())


def final_checkpoint(save_path: Path) -> Path | None:
    epochs = [int(d.name) for d in save_path.iterdir() if d.is_dir() and not d.is_symlink() and d.name.isdigit()]
    return save_path / str(max(epochs)) if epochs else None


def check_eyas_reads(checkpoint: Path, meta: dict) -> None:
    """eyas's loader on speculators' checkpoint as saved: spec, weight names and shapes (no forward pass)."""
    from eyas.drafter.families import read_drafter
    from eyas.drafter.families.eagle3 import Eagle3Drafter

    spec, weights = read_drafter(checkpoint, None)
    drafter = Eagle3Drafter(spec)
    drafter.load_weights(weights, str(checkpoint))
    switches = {k: getattr(spec, k) for k in ("norm_before_fc", "norm_output", "norm_before_residual")}
    print(
        f"eyas on {checkpoint}: aux layers {list(spec.aux_layers)} (run: {meta['aux_layers']}), draft vocab "
        f"{spec.draft_vocab_size}, RoPE theta {spec.rope_parameters['rope_theta']}, {switches}; all "
        f"{len(weights)} tensors load by name and shape"
    )
    if list(spec.aux_layers) != meta["aux_layers"] or spec.draft_vocab_size != meta["draft_vocab_size"]:
        raise SystemExit("eyas reads other layers or another vocabulary than the run's")


def parity(config, work: Path, checkpoint: Path, meta: dict) -> float:
    """The scoring path checked against speculators' own model: for the first train rows, each TTT
    step's draft token by speculators' forward (its packing, masks and positions) and by eyas's
    drafter read from the checkpoint (its own unroll, each row alone). Rows
    where either side runs past a sample's end are left out. Returns the share that agree."""
    import torch
    from safetensors.torch import load_file

    from eyas.drafter.families import read_drafter
    from eyas.drafter.families.eagle3 import Eagle3Drafter
    from eyas.target.heads import from_files

    steps = config.train.ttt_steps
    out = work / "parity.pt"
    in_speculators("parity", work, "--checkpoint", str(checkpoint), "--out", str(out), "--steps", str(steps))
    theirs = torch.load(out, weights_only=True)["draft_ids"]
    spec, weights = read_drafter(checkpoint, None)
    drafter = Eagle3Drafter(spec, from_files(config.target, torch.device("cpu")).embedding)
    drafter.load_weights(weights, str(checkpoint))
    drafter.eval()
    rows = json.loads((work / "data" / "rows.json").read_text())["input_ids"]
    agree = compared = offset = 0
    for row in range(PARITY_ROWS):
        states = load_file(str(work / "data" / "hidden_states" / f"hs_{row}.safetensors"))["hidden_states"]
        n = states.shape[0]
        aux = states[:, :-1].reshape(n, -1)[None]
        with torch.no_grad():
            logits = list(drafter.unroll(aux, torch.tensor(rows[row])[None], steps))
        for k, step_logits in enumerate(logits):
            # speculators' row j (after its shift) is eyas's row j; both feed x_{j+1+k} at step k.
            valid = n - 1 - k
            mine = step_logits[0, :valid].argmax(-1)
            agree += int((mine == theirs[k, offset : offset + valid]).sum())
            compared += valid
        offset += n - 1
    share = agree / compared
    print(f"parity: eyas's drafter and speculators' model draft the same token at {agree}/{compared} ({share:.4f})")
    if share < 0.99:
        raise SystemExit("eyas would score another function than speculators trained: not evaluating")
    return share


def evaluate(config, work: Path, checkpoint: Path) -> dict:
    """``eyas eval`` (engine eyas) of the checkpoint, in a run directory linked to the demo's stages."""
    from eyas import eval as evaluation
    from eyas.paths import RunPaths

    run_dir = work / "run"
    run_dir.mkdir(exist_ok=True)
    for stage in ("merge", "tokenize", "generate"):
        if not (run_dir / stage).exists():
            os.symlink(RunPaths.of(config).root / stage, run_dir / stage)
    eval_cfg = config.eval.model_copy(update={"engine": "eyas", "draft": str(checkpoint)})
    return evaluation.run(config.model_copy(update={"run_dir": str(run_dir), "eval": eval_cfg}))


def summary(config, work: Path, report: dict) -> dict:
    from eyas.paths import RunPaths

    methods = report["methods"]
    times = json.loads((work / "train-time.json").read_text()) if (work / "train-time.json").is_file() else {}
    demo_report = RunPaths.of(config).eval_report
    demo = json.loads(demo_report.read_text())["methods"] if demo_report.is_file() else {}
    plan = json.loads((work / "plan.json").read_text())
    result = {
        "speculators_tau": methods["eagle3"]["tau"],
        "prompt_lookup_tau": methods["prompt_lookup"]["tau"],
        "broken_control_tau": methods.get("eagle3_broken_aux_order", {}).get("tau"),
        "demo_eyas_tau": demo.get("eagle3", {}).get("tau"),
        "train_wall_s": times.get("wall_s"),
        "train_cpu_s": times.get("cpu_s"),
        "plan": plan,
    }
    (work / "summary.json").write_text(json.dumps(result, indent=2) + "\n")
    print(
        "\n| trainer | samples / step (total_seq_len) | steps | train wall s | train CPU s | τ held out | "
        "prompt lookup τ | broken control τ |\n|---|---|---|---|---|---|---|---|"
    )
    wall, cpu = result["train_wall_s"], result["train_cpu_s"]
    print(
        f"| speculators 0.9.0, its default recipe | {plan['samples_per_step']:.2f} ({plan['total_seq_len']}) | "
        f"{plan['steps']} | {wall or float('nan'):.0f} | {cpu or float('nan'):.0f} | {result['speculators_tau']:.3f} | "
        f"{result['prompt_lookup_tau']:.3f} | {result['broken_control_tau'] or float('nan'):.3f} |"
    )
    if result["demo_eyas_tau"] is not None:
        demo_row = [f"{config.train.batch_size}", f"{config.train.max_steps}", "", "", f"{result['demo_eyas_tau']:.3f}"]
        print(f"| eyas, the demo's drafter ({demo_report}) | " + " | ".join(demo_row) + " | | |")
    return result


def run_check(config, work: Path, n: int, with_parity: bool) -> None:
    """``--check N``: everything but the target's forward pass, training and eval."""
    if with_parity and n < PARITY_ROWS:
        raise SystemExit(f"--parity packs {PARITY_ROWS} rows: --check {PARITY_ROWS} at least")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    meta = prepare(config, work, n)
    print(f"prepared {meta['train_rows']} + {meta['eval_rows']} rows (placeholder states) in {work / 'data'}")
    in_speculators("dataset", work)
    plan = plan_batches(config, work, meta)
    print(f"batch plan: {plan}")
    in_speculators("check", work)
    yaml_path = speculators_config(config, work, meta, plan, config.train.max_steps)
    dry = work / "dry-run"
    in_speculators("train", work, "--config", str(yaml_path), "--dry-run", "--save-path", str(dry))
    check_eyas_reads(dry, meta)
    if with_parity:
        parity(config, work, dry, meta)
    print(f"check passed; the trainer's resolved config: {dry / 'run.yaml'}")


def main() -> None:
    # No abbreviations: the training child passes speculators' own flags through untouched.
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--run", help="config of a run whose merge is done (runs/demo/demo.yaml)")
    parser.add_argument("--work", type=Path, help="where the bench writes (default runs/speculators-peer)")
    parser.add_argument("--stages", nargs="*", default=["prepare", "train", "eval"])
    parser.add_argument("--check", type=int, metavar="N", help="the cheap check on N train rows (see the docstring)")
    parser.add_argument(
        "--parity", action="store_true", help="with --check: also the parity check (a forward pass of both drafters)"
    )
    parser.add_argument("--skip-parity", action="store_true", help="eval without the parity check")
    parser.add_argument("--speculators-child", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.speculators_child:
        child_main(args.speculators_child, args.work, args, rest)
        return
    if rest or not args.run:
        parser.error(f"unknown arguments {rest}" if rest else "--run is required")
    from eyas.config import load_config

    logging.basicConfig(level=logging.WARNING)
    config = load_config(Path(args.run))
    if config.train.families != ["eagle3"]:
        raise SystemExit(f"{args.run}: the bench compares EAGLE-3 runs")
    work = (args.work or ROOT / "runs" / "speculators-peer").resolve()
    if args.check is not None:
        run_check(config, work / "check", args.check, args.parity)
        return
    work.mkdir(parents=True, exist_ok=True)
    meta = prepare(config, work, None) if "prepare" in args.stages else json.loads((work / "data" / DONE).read_text())
    if not (work / "data" / "state.json").is_file():
        in_speculators("dataset", work)
    plan = plan_batches(config, work, meta)
    print(f"data: {meta}\nbatch plan: {plan}")
    save_path = work / "checkpoints"
    if "train" in args.stages and (work / "train-time.json").is_file():
        print(f"{save_path}: trained already ({work / 'train-time.json'}); delete both to train again")
    elif "train" in args.stages:
        in_speculators("check", work)
        yaml_path = speculators_config(config, work, meta, plan, config.train.max_steps)
        # An interrupted run resumes from its last checkpoint (epoch 0's, or the last epoch's).
        in_speculators("train", work, "--config", str(yaml_path))
    if "eval" in args.stages:
        checkpoint = final_checkpoint(save_path) if save_path.is_dir() else None
        if checkpoint is None:
            raise SystemExit(f"{save_path}: no checkpoint; run the train stage first")
        check_eyas_reads(checkpoint, meta)
        if not args.skip_parity:
            parity(config, work, checkpoint, meta)
        summary(config, work, evaluate(config, work, checkpoint))


if __name__ == "__main__":
    main()
