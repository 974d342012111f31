"""Output grammars by name (``tokenize.format``); ``auto`` is derived from the chat template."""

from __future__ import annotations

from eyas.tokenize.formats.base import ENDS_TURN, Format, Markup, Piece, PlanError
from eyas.tokenize.formats.chatml import ChatML
from eyas.tokenize.formats.deepseek_r1 import DeepSeekR1
from eyas.tokenize.formats.kimi import KimiK2Thinking, KimiK25
from eyas.tokenize.formats.llama3 import Llama3
from eyas.tokenize.formats.qwen3 import Qwen3

FORMATS: dict[str, type[Format]] = {f.name: f for f in (ChatML, Qwen3, Llama3, DeepSeekR1, KimiK25, KimiK2Thinking)}
KIMI_FORMATS = ("kimi-k2.5", "kimi-k2-thinking")

__all__ = ["ENDS_TURN", "FORMATS", "KIMI_FORMATS", "Format", "Markup", "Piece", "PlanError"]
