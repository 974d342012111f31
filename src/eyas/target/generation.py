"""The local backend: the target runs in-process with transformers (CPU or GPU).

Prompts are sorted by length and generated in left-padded batches of ``generate.batch_size``
— on 2 CPU cores batching is several times faster than one prompt at a time (see
``bench/generate_local.py``). Each record keeps the completion's true ``token_ids``, the
ground truth that later proves the token rebuild from text.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from eyas.records import Usage
from eyas.target.settings import Sampling

log = logging.getLogger(__name__)


@dataclass
class Completion:
    token_ids: list[int]
    """Generated ids up to and including the end-of-turn token when it was produced."""
    text: str
    """The decoded completion without the end-of-turn token."""
    finish_reason: str
    prompt_tokens: int


class ChatCodec:
    """The tokenizer side every in-house generator shares: prompts to ids, ids to completions."""

    def __init__(self, tokenizer, end_of_turn: int, settings: Sampling):
        self.tokenizer = tokenizer
        self.end_of_turn = end_of_turn
        self.settings = settings

    def encode_prompt(self, messages: list[dict], tools: list | None = None) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _completion(self, new_ids: list[int], prompt_tokens: int, max_tokens: int) -> Completion:
        if self.end_of_turn in new_ids:
            ids = new_ids[: new_ids.index(self.end_of_turn) + 1]
            body, reason = ids[:-1], "stop"
        else:
            ids = body = _strip_padding(new_ids, self.tokenizer.pad_token_id)
            # Shorter than max_tokens without an end of turn: a configured stop string ended it.
            reason = "length" if len(ids) >= max_tokens else "stop"
        text = self.tokenizer.decode(body, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        return Completion(ids, text, reason, prompt_tokens)


class LocalGenerator(ChatCodec):
    """Batched generation with a loaded model and tokenizer."""

    def __init__(self, model, tokenizer, end_of_turn: int, settings: Sampling):
        super().__init__(tokenizer, end_of_turn, settings)
        self.model = model
        self.device = next(model.parameters()).device

    @torch.inference_mode()
    def generate_batch(
        self, prompts: Sequence[list[int]], seed: int, max_tokens: int | None = None
    ) -> list[Completion]:
        """Generate for prompts of any lengths at once (left-padded to the longest)."""
        s = self.settings
        width = max(len(p) for p in prompts)
        pad = self.tokenizer.pad_token_id
        ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, p in enumerate(prompts):
            ids[row, width - len(p) :] = torch.tensor(p)
            mask[row, width - len(p) :] = 1
        torch.manual_seed(seed)
        sampling = (
            {"do_sample": True, "temperature": s.temperature, "top_p": s.top_p}
            if s.temperature > 0
            else {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
        )
        out = self.model.generate(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            max_new_tokens=max_tokens or s.max_tokens,
            eos_token_id=self.end_of_turn,
            pad_token_id=pad,
            stop_strings=list(s.stop) or None,
            tokenizer=self.tokenizer if s.stop else None,
            **sampling,
        )
        return [
            self._completion(row[width:].tolist(), len(p), max_tokens or s.max_tokens)
            for row, p in zip(out, prompts, strict=True)
        ]


def _strip_padding(ids: list[int], pad: int) -> list[int]:
    end = len(ids)
    while end > 0 and ids[end - 1] == pad:
        end -= 1
    return ids[:end]


@dataclass
class Job:
    """One prompt ready to generate: its record key, the messages to send and their ids."""

    key: object
    messages: list[dict]
    prompt_ids: list[int]
    salt: int = 0
    """Tells apart jobs with the same ids (several answers to one prompt) in the sampling seed."""


class BatchGenerator(Protocol):
    """What :func:`run_jobs` drives: the transformers generator here, or the vLLM one."""

    settings: Sampling

    def generate_batch(
        self, prompts: Sequence[list[int]], seed: int, max_tokens: int | None = None
    ) -> list[Completion]: ...


def run_jobs(
    generator: BatchGenerator,
    jobs: list[Job],
    on_done: Callable[[Job, Completion], None],
    *,
    seed: int,
    should_stop: Callable[[], bool] = lambda: False,
) -> None:
    """Generate every job in length-sorted batches, reporting each completion as its batch ends."""
    ordered = sorted(jobs, key=lambda j: len(j.prompt_ids))
    size = generator.settings.batch_size
    for start in range(0, len(ordered), size):
        if should_stop():
            return
        batch = ordered[start : start + size]
        # The seed depends on the batch's content, not its position, so a resumed run samples alike.
        batch_seed = seed + sum(
            hash((tuple(j.prompt_ids), j.salt) if j.salt else tuple(j.prompt_ids)) & 0xFFFF for j in batch
        )
        completions = generator.generate_batch([j.prompt_ids for j in batch], batch_seed)
        for job, completion in zip(batch, completions, strict=True):
            on_done(job, completion)


def usage_of(completion: Completion) -> Usage:
    return Usage(prompt_tokens=completion.prompt_tokens, completion_tokens=len(completion.token_ids))
