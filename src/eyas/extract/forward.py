"""One forward batch of extraction: padded (sorted lengths) or packed (pad-free).

Packed batches put every sample in one row with positions restarting at 0 per sample;
transformers then confines attention to each sample. With flash-attention kernels that is
truly pad-free. With SDPA or eager attention it materialises a tokens × tokens mask, so
``packing: auto`` packs only under flash attention and pads otherwise — after sorting by
length, padding wastes little.
"""

from __future__ import annotations

import torch

from eyas.extract.capture import capture

FLASH_KERNELS = ("flash_attention_2", "flash_attention_3", "flash_attention_4")


def use_packing(model, packing: str) -> bool:
    if packing == "auto":
        return getattr(model.config, "_attn_implementation", None) in FLASH_KERNELS
    return packing == "packed"


def forward(model, samples: list[list[int]], aux_layers: list[int], packed: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The (aux [T, 3H], final [T, H]) of every sample, on the model's device."""
    device = next(model.parameters()).device
    lengths = [len(s) for s in samples]
    if packed:
        ids = torch.tensor([t for s in samples for t in s], device=device)[None]
        positions = torch.cat([torch.arange(n, device=device) for n in lengths])[None]
        got = capture(model, ids, None, aux_layers, positions)
        return list(zip(got.aux[0].split(lengths), got.final[0].split(lengths)))
    ids = torch.zeros(len(samples), max(lengths), dtype=torch.long)
    for row, s in enumerate(samples):
        ids[row, : len(s)] = torch.tensor(s)
    # Right padding needs no attention mask: under causal attention a real token never sees the
    # padding after it, and the states at padded positions are discarded. Without a mask SDPA
    # takes its causal kernel instead of materialising a padding mask (~20% faster on CPU).
    got = capture(model, ids.to(device), None, aux_layers)
    return [(got.aux[row, :n], got.final[row, :n]) for row, n in enumerate(lengths)]
