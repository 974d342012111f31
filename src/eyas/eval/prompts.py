"""The prompts eval decodes: the merge's held-out split, or any prompt file stage 1 reads.

A held-out row's prompt is its tokens before the first trainable one
(:func:`eyas.merge.reader.held_out_prompts`), so eval feeds the target exactly the ids the
drafter would see in training, template included. A prompt file is rendered with the target's
chat template and the generation prompt.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from eyas.config import ConfigError, DatasetConfig, RunConfig
from eyas.paths import RunPaths
from eyas.stage import StageError


@dataclass(frozen=True)
class EvalPrompt:
    id: str
    dataset: str
    input_ids: list[int]


def load_eval_prompts(config: RunConfig, tokenizer) -> list[EvalPrompt]:
    """At most ``eval.max_prompts`` prompts from ``eval.prompts`` or the eval split."""
    source = config.eval.prompts
    prompts = _from_file(Path(source), tokenizer, config.eval.max_prompts) if source else _from_split(config)
    if not prompts:
        where = source or f"{RunPaths.of(config).merge_dir} (eval split)"
        raise StageError(
            f"eval: no prompts in {where}; set merge.eval_fraction or merge.eval_count above 0 and rerun merge, "
            "or give eval.prompts / --prompts FILE"
        )
    return prompts


def _from_split(config: RunConfig) -> list[EvalPrompt]:
    from eyas.merge.reader import held_out_prompts

    return [EvalPrompt(*row) for row in held_out_prompts(RunPaths.of(config), config.eval.max_prompts)]


def _from_file(path: Path, tokenizer, limit: int | None) -> list[EvalPrompt]:
    from eyas.prompts import iter_prompts

    if not path.exists():
        raise ConfigError(f"eval.prompts: {path} does not exist")
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", path.stem) or "prompts"
    dataset = DatasetConfig(name=name, source=str(path), max_prompts=limit)
    prompts = []
    for record in iter_prompts(dataset):
        encoded = tokenizer.apply_chat_template(
            record.messages, tools=record.tools, add_generation_prompt=True, return_dict=True
        )
        prompts.append(EvalPrompt(record.record_id, name, list(encoded["input_ids"])))
    return prompts
