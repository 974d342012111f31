"""eyas's own cache (``$EYAS_CACHE``): targets converted from GGUF, and GGUF conversions of targets
and drafters for llama.cpp. Each is made once per content and reused; without a bound they would
pile up with every drafter trained and every target tried. Past ``$EYAS_CACHE_MAX_GB`` (default
:data:`DEFAULT_LIMIT_GB`) the entries used longest ago are removed after each new one is
written; an entry is "used" when it is made or reused (its modification time is set then, so a
file system mounted ``noatime`` does not matter). What is removed is only ever remade from its
source on the next use.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from eyas.space import tree_bytes

log = logging.getLogger(__name__)

LIMIT_ENV = "EYAS_CACHE_MAX_GB"
DEFAULT_LIMIT_GB = 64.0
KINDS = ("targets", "gguf")
"""The cache's folders of entries: converted targets (directories) and GGUF files."""


def limit_bytes() -> int:
    from eyas.config import ConfigError

    raw = os.environ.get(LIMIT_ENV)
    try:
        return int(float(raw) * 1e9) if raw else int(DEFAULT_LIMIT_GB * 1e9)
    except ValueError:
        raise ConfigError(f"${LIMIT_ENV}: {raw!r} is not a number of gigabytes") from None


def entries(root: Path) -> list[Path]:
    """Every entry (a converted target's directory, a GGUF file with its converter log beside it
    counted with it), least recently used first; files being written (``.tmp``) are not entries."""
    found = [
        p
        for kind in KINDS
        if (root / kind).is_dir()
        for p in (root / kind).iterdir()
        if not p.name.endswith(".log") and ".tmp" not in p.name
    ]
    return sorted(found, key=lambda p: p.stat().st_mtime)


def size(root: Path) -> int:
    """Bytes the cache's entries hold."""
    return sum(tree_bytes(p) for kind in KINDS if (root / kind).is_dir() for p in (root / kind).iterdir())


def use(entry: Path, root: Path) -> Path:
    """Mark ``entry`` used now, then remove the entries used longest ago until the cache is
    within its limit (never ``entry`` itself); returns ``entry``."""
    os.utime(entry)
    limit, held = limit_bytes(), size(root)
    for old in entries(root):
        if held <= limit:
            break
        if old == entry:
            continue
        freed = tree_bytes(old) + tree_bytes(old.with_name(old.name + ".log"))
        log.info("cache over %.1f GB ($%s): removing %s, used longest ago", limit / 1e9, LIMIT_ENV, old)
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)
        old.with_name(old.name + ".log").unlink(missing_ok=True)
        held -= freed
    return entry
