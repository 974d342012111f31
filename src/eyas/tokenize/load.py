"""Pick the tokenizer back-end and the output format named by the config, and check them.

Kimi formats build a ``tiktoken.Encoding`` from the model's ``tiktoken.model`` (never an
automatic fast-tokenizer conversion, which has shifted special ids); every other format uses
the target's Hugging Face fast tokenizer. The format checks its special ids at construction.
"""

from __future__ import annotations

from pathlib import Path

from eyas.config import ConfigError, RunConfig
from eyas.tokenize.encoders import HFEncoder, TiktokenEncoder
from eyas.tokenize.formats import FORMATS, KIMI_FORMATS, Format


def load_format(config: RunConfig) -> Format:
    name = config.tokenize.format
    if name in KIMI_FORMATS:
        encoder = TiktokenEncoder(_kimi_encoding(config))
        return FORMATS[name](encoder, config.tokenize.system_prompt)
    from eyas.target import load_tokenizer, resolve_target

    source = Path(config.target.tokenizer or resolve_target(config.target).name_or_path)
    if (source / "tiktoken.model").is_file() and not (source / "tokenizer.json").is_file():
        raise ConfigError(
            f"tokenize.format: {source} ships a tiktoken tokenizer (Kimi); use kimi-k2.5 or kimi-k2-thinking, "
            "never an automatic fast-tokenizer conversion (it has shifted special ids)"
        )
    encoder = HFEncoder(load_tokenizer(config.target))
    if name == "auto":
        from eyas.tokenize.auto import AutoFormat

        return check_end_of_turn(AutoFormat(encoder))
    return check_end_of_turn(FORMATS[name](encoder))


def check_end_of_turn(fmt: Format) -> Format:
    """The format must end turns with the token generation stops on, or it is the wrong format."""
    from eyas.target import end_of_turn_id

    stop = end_of_turn_id(fmt.encoder.tokenizer)
    if fmt.end_of_turn_id != stop:
        raise ConfigError(
            f"tokenize.format {fmt.name}: the format ends a turn with {fmt.end_of_turn} (id {fmt.end_of_turn_id}) "
            f"but the target stops on {fmt.encoder.token_str(stop)} (id {stop}); pick the target's format"
        )
    return fmt


def _kimi_encoding(config: RunConfig):
    from eyas.target import resolve_target
    from eyas.tokenize.kimi import load_kimi_encoding

    source = resolve_target(config.target)
    where = config.target.tokenizer or source.name_or_path
    path = Path(where).expanduser()
    if path.is_dir():
        return load_kimi_encoding(path)
    if where.startswith((".", "/", "~")):
        raise ConfigError(f"target.tokenizer: {where} does not exist")
    from huggingface_hub import hf_hub_download

    try:
        rank_file = hf_hub_download(where, "tiktoken.model", revision=source.revision)
    except Exception as e:  # hub errors come in many types; all mean the file is not reachable
        raise ConfigError(f"target.model: cannot fetch tiktoken.model of {where} ({e})") from None
    return load_kimi_encoding(Path(rank_file).parent)
