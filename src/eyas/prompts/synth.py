"""Synthesize prompts from the target itself (Magpie-style) for users with no prompt data.

The model is given only the chat template's opening of a user turn and writes the user's
message; sampling stops at the end-of-turn token. Empty, truncated (no end of turn) and
duplicate messages are dropped. A topic hint in the system turn varies what users ask about.
The output is a JSONL file of ``{"id", "messages"}`` rows that any dataset entry can name.
Appends and resumes: rerunning with the same ``--out`` tops the file up to ``count``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from eyas.config import ConfigError, RunConfig
from eyas.console import progress
from eyas.jsonl import DurableAppender, read_jsonl, recover
from eyas.records import content_hash

log = logging.getLogger(__name__)

SENTINEL = "\x00EYAS_USER_TURN\x00"
TOPICS = (
    "cooking",
    "programming in Python",
    "world history",
    "personal finance",
    "physics",
    "travel planning",
    "writing emails",
    "health and fitness",
    "mathematics",
    "gardening",
    "music",
    "learning a language",
    "job interviews",
    "biology",
    "movies and books",
    "home repair",
    "climate and weather",
    "philosophy",
    "small business",
    "pets",
    "chemistry",
    "geography",
    "productivity",
    "poetry",
)


def user_turn_opening(tokenizer, topic: str) -> str:
    """The rendered conversation up to where the user's own words begin."""
    system = f"You are a helpful assistant. The user asks about {topic}."
    rendered = tokenizer.apply_chat_template(
        [{"role": "system", "content": system}, {"role": "user", "content": SENTINEL}],
        tokenize=False,
    )
    if SENTINEL not in rendered:
        raise ConfigError("target: the chat template does not render user content verbatim; cannot synthesize prompts")
    return rendered.split(SENTINEL, 1)[0]


def _normalise(text: str) -> str:
    return " ".join(text.lower().split())


def synthesize(
    config: RunConfig, count: int, out: Path, quiet: bool = False, *, batch_size: int = 32, max_tokens: int = 48
) -> int:
    """Write up to ``count`` prompt rows to ``out``; return how many it holds.

    Sampling is fixed at temperature 1.0, top-p 0.95: diversity matters more here than
    the run's own generation settings, which are usually greedy.
    """
    from eyas.target import end_of_turn_id, load_model, load_tokenizer
    from eyas.target.generation import LocalGenerator
    from eyas.target.settings import Sampling

    recover(out)
    seen = {_normalise(r["messages"][0]["content"]) for _, r in read_jsonl(out)} if out.exists() else set()
    if len(seen) >= count:
        log.info("%s already holds %d prompts", out, len(seen))
        return len(seen)
    tokenizer = load_tokenizer(config.target)
    model = load_model(config.target)
    settings = Sampling(
        temperature=1.0, top_p=0.95, max_tokens=max_tokens, batch_size=batch_size, seed=config.generate.seed
    )
    generator = LocalGenerator(model, tokenizer, end_of_turn_id(tokenizer), settings)
    stats = {"sampled": 0, "truncated": 0, "empty": 0, "duplicate": 0}
    max_rounds = 8 * max(1, -(-count // settings.batch_size))
    with DurableAppender(out) as writer, progress(quiet, unit="prompt") as bar:
        task = bar.add_task("synthesize prompts", total=count, completed=len(seen), rate=0.0)
        started = time.monotonic()
        for round_index in range(max_rounds):
            if len(seen) >= count:
                break
            topics = [TOPICS[(round_index * settings.batch_size + i) % len(TOPICS)] for i in range(settings.batch_size)]
            prompts = [tokenizer.encode(user_turn_opening(tokenizer, t), add_special_tokens=False) for t in topics]
            for completion in generator.generate_batch(prompts, seed=settings.seed + len(seen) * 7919 + round_index):
                stats["sampled"] += 1
                text = completion.text.strip()
                key = _normalise(text)
                if completion.finish_reason != "stop":
                    stats["truncated"] += 1
                elif len(text) < 8:
                    stats["empty"] += 1
                elif key in seen:
                    stats["duplicate"] += 1
                elif len(seen) < count:
                    seen.add(key)
                    messages = [{"role": "user", "content": text}]
                    writer.write_json({"id": content_hash(messages), "messages": messages})
                    bar.update(task, advance=1, rate=len(seen) / max(time.monotonic() - started, 1e-9))
    log.info(
        "synthesized %d prompts into %s (sampled %d; dropped %d truncated, %d empty, %d duplicate)",
        len(seen),
        out,
        stats["sampled"],
        stats["truncated"],
        stats["empty"],
        stats["duplicate"],
    )
    if len(seen) < count:
        log.warning("only %d of %d prompts after %d rounds; rerun to top up", len(seen), count, max_rounds)
    return len(seen)
