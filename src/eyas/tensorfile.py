"""Safetensors files with the permissions the user's umask asks for.

safetensors creates its files with mode 0600 whatever the umask, so a drafter exported by one
account (or container) could not be read by a serving engine running as another, nor
hidden-state shards by a training job under a different user. Every tensor file eyas writes
goes through :func:`save_tensors`, which also reports a full disk as the ``OSError`` (ENOSPC)
it is: safetensors raises its own error type, with the OS error in its text.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file


def save_tensors(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> None:
    try:
        save_file(tensors, str(path), metadata=metadata)
    except SafetensorError as e:
        if f"os error {errno.ENOSPC})" in str(e):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from e
        raise
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, 0o666 & ~mask)
