"""The figures eyas writes (eval's acceptance, training curves, tune's speed-ups, scaling's
curve): drawn with matplotlib's non-interactive Agg backend, so they work on a headless box,
and saved alike."""

from __future__ import annotations

from pathlib import Path


def subplots(*args, **kwargs):
    """``matplotlib.pyplot.subplots`` on the Agg backend (matplotlib imported only when drawing)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)


def save(fig, path: Path) -> Path:
    """Lay ``fig`` out, write it to ``path`` (its folder made if needed) and free it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
