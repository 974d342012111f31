"""Capture the hidden states a drafter trains on (EAGLE-3's three aux layers, DFlash's context
layers, and the final state), with forward hooks.

Layer convention (off-by-one here silently ruins a drafter, so it is fixed in one place):
``aux_layers`` are 0-based decoder layer indices whose *outputs* are captured. The default
``[1, L//2 - 1, L - 4]`` equals HF ``output_hidden_states`` indices ``[2, L//2, L - 3]``
(entry 0 there is the embedding output) and the *inputs* of layers ``(2, L//2, L-3)`` that
SGLang and vLLM capture. The final state is the base model's output after the final norm —
what ``lm_head`` consumes — so target logits are ``lm_head(final)``.

Only the hooked layers are kept (not every layer's states), and ``lm_head`` is never run
over the full vocabulary here. Used by offline extraction and by online training alike.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)


def default_aux_layers(num_layers: int) -> list[int]:
    """0-based decoder layers whose outputs EAGLE-3 uses by default: [1, L//2-1, L-4]."""
    if num_layers < 7:
        # Below 7 the three default layers are not distinct (6 layers give [1, 2, 2]).
        raise ValueError(f"EAGLE-3's default layers need a target with at least 7 decoder layers, got {num_layers}")
    return [1, num_layers // 2 - 1, num_layers - 4]


def check_aux_layers(
    aux_layers: list[int], num_layers: int, where: str = "extract.aux_layers", count: int | None = 3
) -> list[int]:
    """``aux_layers`` if a serving engine can capture them from a ``num_layers``-layer target.

    ``count`` distinct ids (EAGLE-3's three; None: any number, as DFlash takes) in ascending
    order (engines concatenate the captured states in layer order, so any other order trains a
    drafter no server feeds correctly), each at most L-2: engines capture a layer's output as
    the input of the next layer, and the last layer has none. Raises ValueError naming
    ``where`` and the reason.
    """
    ids = list(aux_layers)
    if count is not None and len(ids) != count:
        raise ValueError(f"{where}: EAGLE-3 takes exactly {count} layers, got {ids}")
    if not ids:
        raise ValueError(f"{where}: no layers given")
    if any(b <= a for a, b in zip(ids, ids[1:])):
        raise ValueError(
            f"{where}: {ids} must be distinct and strictly ascending; serving engines concatenate the "
            "captured states in layer order, so a drafter trained on another order gets its inputs swapped"
        )
    if ids[0] < 0 or ids[-1] > num_layers - 2:
        raise ValueError(
            f"{where}: {ids} must lie in 0..{num_layers - 2} for a {num_layers}-layer target; engines capture "
            "the output of layer i as the input of layer i+1, and the last layer has no next"
        )
    if ids[0] != 1 and count is not None:
        log.warning(
            "%s: %s starts at %d, not 1; some SGLang versions shift the ids by one only when the first is 1, "
            "so check acceptance under SGLang before serving",
            where,
            ids,
            ids[0],
        )
    return ids


def hf_hidden_state_indices(aux_layers: list[int]) -> list[int]:
    """The same layers as indices into HF ``output_hidden_states`` (shifted by the embedding)."""
    return [i + 1 for i in aux_layers]


def decoder_layers(model) -> torch.nn.ModuleList:
    base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    return base.layers


def num_decoder_layers(model) -> int:
    return len(decoder_layers(model))


@dataclass
class Captured:
    aux: torch.Tensor
    """[batch, seq, 3 * hidden]: the aux layers' outputs, concatenated in layer order."""
    final: torch.Tensor
    """[batch, seq, hidden]: after the final norm."""


class AuxHooks:
    """Forward hooks that keep the outputs of the aux layers, for whoever runs the model.

    Only those layers' outputs are held (not every layer's, as ``output_hidden_states`` would),
    and only until :meth:`take`. Used by :func:`capture` and by eval's decoding loop alike, so
    the layers a drafter is fed during eval are the ones it was trained on. A context manager
    that removes the hooks.
    """

    def __init__(self, model, aux_layers: list[int]):
        layers = decoder_layers(model)
        for i in aux_layers:
            if not 0 <= i < len(layers):
                raise ValueError(f"extract.aux_layers: layer {i} is outside 0..{len(layers) - 1}")
        self.aux_layers = list(aux_layers)
        self._grabbed: dict[int, torch.Tensor] = {}
        self._handles = [layers[i].register_forward_hook(self._hook(i)) for i in sorted(set(aux_layers))]

    def _hook(self, index: int):
        def hook(_module, _inputs, output):
            self._grabbed[index] = output[0] if isinstance(output, tuple) else output

        return hook

    def take(self) -> torch.Tensor:
        """[batch, seq, 3 * hidden]: the last forward's aux outputs, concatenated in layer order."""
        aux = torch.cat([self._grabbed[i] for i in self.aux_layers], dim=-1)
        self._grabbed.clear()
        return aux

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def __enter__(self) -> AuxHooks:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@torch.inference_mode()
def capture(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    aux_layers: list[int] | None = None,
    position_ids: torch.Tensor | None = None,
) -> Captured:
    """Run the target's decoder once and return the aux and final hidden states."""
    aux_layers = aux_layers if aux_layers is not None else default_aux_layers(num_decoder_layers(model))
    with AuxHooks(model, aux_layers) as hooks:
        base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
        out = base(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
        return Captured(aux=hooks.take(), final=out.last_hidden_state)


FLASH_KERNELS = ("flash_attention_2", "flash_attention_3", "flash_attention_4")


def use_packing(model, packing: str) -> bool:
    """Whether ``forward`` packs a batch into one pad-free row (positions restart per sample).

    transformers then confines attention to each sample. With flash-attention kernels that is
    truly pad-free; with SDPA or eager attention it materialises a tokens × tokens mask, so
    ``auto`` packs only under flash attention and pads otherwise — after sorting by length,
    padding wastes little.
    """
    if packing == "auto":
        return getattr(model.config, "_attn_implementation", None) in FLASH_KERNELS
    return packing == "packed"


def forward(
    model, samples: list[list[int]], aux_layers: list[int], packed: bool
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The (aux [T, 3H], final [T, H]) of every sample in one batch, on the model's device."""
    device = next(model.parameters()).device
    lengths = [len(s) for s in samples]
    if packed:
        ids = torch.tensor([t for s in samples for t in s], device=device)[None]
        positions = torch.cat([torch.arange(n, device=device) for n in lengths])[None]
        got = capture(model, ids, None, aux_layers, positions)
        return list(zip(got.aux[0].split(lengths), got.final[0].split(lengths), strict=True))
    ids = torch.zeros(len(samples), max(lengths), dtype=torch.long)
    for row, s in enumerate(samples):
        ids[row, : len(s)] = torch.tensor(s)
    # Right padding needs no attention mask: under causal attention a real token never sees the
    # padding after it, and the states at padded positions are discarded. Without a mask SDPA
    # takes its causal kernel instead of materialising a padding mask (~20% faster on CPU).
    got = capture(model, ids.to(device), None, aux_layers)
    return [(got.aux[row, :n], got.final[row, :n]) for row, n in enumerate(lengths)]
