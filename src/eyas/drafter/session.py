"""Incremental drafting for one sequence, the way SGLang and vLLM run EAGLE-3 with top-k 1.

The session keeps the drafter's key/value cache of *verified* positions only: each entry
was computed from the target's own aux state at that position and the verified next token,
exactly like step 0 of training. ``propose`` extends a scratch copy with the drafter's own
hidden outputs and tokens (training steps 1..k); the next ``append`` throws that scratch away.

Positions line up with :meth:`Eagle3Drafter.unroll`: the entry for position p sees aux h_p
and token x_{p+1} at RoPE position p, and a speculative step j after it sits at p+j.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from eyas.drafter.model import Eagle3Drafter, expand_kv


class DraftSession:
    """Chain drafting for one sequence (batch 1), as SGLang/vLLM run EAGLE-3 with top-k 1."""

    def __init__(self, drafter: Eagle3Drafter) -> None:
        self.drafter = drafter
        self.length = 0
        """Verified positions in the cache."""
        self._keys: Tensor | None = None
        self._values: Tensor | None = None
        self._hidden: Tensor | None = None
        """[1,1,H] state fed back from the last verified position (:meth:`Eagle3Drafter.fed_back`):
        feeds the first proposal."""

    def _attend(self, embeds: Tensor, hidden: Tensor, start: int, keys: Tensor | None, values: Tensor | None):
        """Run the layer for new rows at positions start.. given earlier keys/values (all visible)."""
        layer = self.drafter.midlayer
        n = embeds.shape[1]
        positions = torch.arange(start, start + n, device=embeds.device)[None]
        cos, sin = self.drafter.rope(embeds, positions)
        q, k, v = layer.project(embeds, hidden, cos, sin)
        all_k = k if keys is None else torch.cat([keys, k], dim=2)
        all_v = v if values is None else torch.cat([values, v], dim=2)
        past = all_k.shape[2] - n
        mask = torch.ones(n, past + n, dtype=torch.bool, device=q.device).tril(diagonal=past)
        heads = q.shape[1]
        attended = F.scaled_dot_product_attention(q, expand_kv(all_k, heads), expand_kv(all_v, heads), attn_mask=mask)
        return self.drafter.fed_back(layer.finish(hidden, attended)), all_k, all_v

    @torch.no_grad()
    def append(self, aux: Tensor, next_tokens: Tensor) -> None:
        """Commit n verified positions p..p+n-1: ``aux[j]`` is the target's aux state [3·H_target]
        at p+j, ``next_tokens[j]`` the verified token at p+j+1. Drops the last proposal's scratch."""
        if aux.ndim != 2 or next_tokens.ndim != 1 or aux.shape[0] != next_tokens.shape[0]:
            raise ValueError(
                f"append needs aux [n, 3H] and next_tokens [n]; got {tuple(aux.shape)} and {tuple(next_tokens.shape)}"
            )
        if aux.shape[0] == 0:
            return
        d = self.drafter
        hidden = d.fuse(aux.to(d.fc.weight.device))[None]
        embeds = d.embed_tokens(next_tokens.to(d.fc.weight.device)[None]).to(hidden.dtype)
        out, self._keys, self._values = self._attend(embeds, hidden, self.length, self._keys, self._values)
        self.length += aux.shape[0]
        self._hidden = out[:, -1:]

    @torch.no_grad()
    def propose(self, k: int, temperature: float = 0.0) -> tuple[list[int], list[Tensor] | None]:
        """k target-vocabulary ids continuing the sequence after the last appended token, each
        step feeding the drafter's own hidden output; with temperature > 0 the tokens are
        sampled and each step's distribution over the target vocabulary (zero outside the
        draft vocabulary) comes back for speculative rejection sampling."""
        if self._hidden is None:
            raise RuntimeError("propose() needs at least one append() first")
        d = self.drafter
        hidden, keys, values = self._hidden, self._keys, self._values
        tokens: list[int] = []
        probs: list[Tensor] = []
        for step in range(k):
            logits = d.logits(hidden)[0, -1].float()
            if temperature > 0:
                draft_probs = torch.softmax(logits / temperature, dim=-1)
                draft_id = torch.multinomial(draft_probs, 1)[0]
                full = torch.zeros(d.spec.vocab_size, device=logits.device)
                full[d.to_target_ids(torch.arange(draft_probs.shape[0], device=logits.device))] = draft_probs
                probs.append(full)
            else:
                draft_id = logits.argmax()
            token = d.to_target_ids(draft_id)
            tokens.append(int(token))
            if step + 1 < k:
                embeds = d.embed_tokens(token.view(1, 1)).to(hidden.dtype)
                hidden, keys, values = self._attend(embeds, hidden, self.length + step, keys, values)
        return tokens, (probs if temperature > 0 else None)
