"""Small real corpora for tests of the stages after tokenize.

Completions come from the real embedded model (greedy, a few tokens) and are laid out as
tokenize writes them (``records.TOKENIZED_COLUMNS``): prompt and template tokens carry loss 0,
the completion and its end-of-turn token loss 1.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from eyas.records import tokenized_arrow_schema

PROMPTS = (
    "Name three primary colors.",
    "What is two plus two?",
    "Write a haiku about the sea.",
    "Why is the sky blue?",
    "List the days of the week.",
    "What is the capital of Italy?",
    "Give me a synonym for happy.",
    "How many legs does a spider have?",
)


@torch.inference_mode()
def tokenized_rows(tokenizer, model, dataset: str, prompts=PROMPTS, max_new_tokens: int = 16) -> list[dict]:
    """One row per prompt with the model's own greedy completion."""
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    rows = []
    for i, text in enumerate(prompts):
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        prompt = list(prompt["input_ids"] if isinstance(prompt, dict) or hasattr(prompt, "keys") else prompt)
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=end, pad_token_id=end
        )
        completion = out[0, len(prompt) :].tolist()
        finish = "stop" if completion and completion[-1] == end else "length"
        ids = prompt + completion
        rows.append(
            {
                "id": f"{dataset}/p{i}",
                "dataset": dataset,
                "input_ids": ids,
                "loss_mask": [0] * len(prompt) + [1] * len(completion),
                "num_tokens": len(ids),
                "completion_tokens": len(completion),
                "billed_completion_tokens": len(completion),
                "finish_reason": finish,
                "format": "chatml",
                "flags": [],
            }
        )
    return rows


def write_tokenized(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=tokenized_arrow_schema()), path)
    return path
