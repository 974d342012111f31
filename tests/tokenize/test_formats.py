"""qwen3, llama3 and deepseek-r1 on the real SmolLM2 BPE given each family's special tokens and a
chat template in that family's layout (their own tokenizers cannot be downloaded here). Each
format's completion is checked as text and ids, and `auto`, probing the same template, must
agree with the explicit format."""

import pytest
from tokenizers import AddedToken

from eyas.config import ConfigError
from eyas.records import GenerationRecord, Usage
from eyas.tokenize.auto import AutoFormat
from eyas.tokenize.encoders import HFEncoder
from eyas.tokenize.formats import FORMATS
from eyas.tokenize.rebuild import Rebuilder

QWEN3_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' and m.reasoning_content %}<think>\n{{ m.reasoning_content.strip('\\n') }}\n</think>\n\n{% endif %}"
    "{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA3_TEMPLATE = (
    "<|begin_of_text|>{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>"
    "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
R1_TEMPLATE = (
    "<｜begin▁of▁sentence｜>{% for m in messages %}{% if m.role == 'user' %}<｜User｜>{{ m.content }}"
    "{% else %}<｜Assistant｜>{{ m.content }}<｜end▁of▁sentence｜>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<｜Assistant｜><think>\n{% endif %}"
)
FAMILIES = {
    "qwen3": (QWEN3_TEMPLATE, ["<think>", "</think>", "<tool_call>", "</tool_call>"], []),
    "llama3": (LLAMA3_TEMPLATE, [], ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]),
    "deepseek-r1": (
        R1_TEMPLATE,
        ["<think>", "</think>"],
        [
            "<｜begin▁of▁sentence｜>",
            "<｜User｜>",
            "<｜Assistant｜>",
            "<｜end▁of▁sentence｜>",
            "<｜tool▁calls▁begin｜>",
            "<｜tool▁calls▁end｜>",
            "<｜tool▁call▁begin｜>",
            "<｜tool▁sep｜>",
            "<｜tool▁call▁end｜>",
        ],
    ),
}


def family_encoder(target_config, name: str) -> HFEncoder:
    from eyas.target import load_tokenizer

    template, added, special = FAMILIES[name]
    tok = load_tokenizer(target_config)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in special], special_tokens=True)
    tok.chat_template = template
    return HFEncoder(tok)


def record(content, reasoning=None, finish="stop", **extra) -> GenerationRecord:
    return GenerationRecord(
        id="f/1",
        dataset="f",
        prompt_id="1",
        messages=[{"role": "user", "content": "What is 2+2?"}],
        content=content,
        reasoning=reasoning,
        finish_reason=finish,
        usage=Usage(),
        model="m",
        provider="p",
        created=0.0,
        **extra,
    )


def completion_text(encoder, fmt, rec) -> tuple[str, list[int]]:
    (sample,), dropped = Rebuilder(fmt).rebuild([rec])
    assert dropped == []
    return encoder.decode(sample.completion_ids), sample.completion_ids


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, target_config):
    encoder = family_encoder(target_config, request.param)
    return request.param, encoder, FORMATS[request.param](encoder)


EXPECTED = {
    ("qwen3", "think"): "<think>\nAdd two and two.\n</think>\n\nIt is 4.<|im_end|>",
    ("qwen3", "cut"): "<think>\nAdd two and",
    ("llama3", "plain"): "It is 4.<|eot_id|>",
    ("llama3", "cut"): "It is",
    ("deepseek-r1", "think"): "Add two and two.</think>It is 4.<｜end▁of▁sentence｜>",
    ("deepseek-r1", "cut"): "Add two and",
}
CASES = {
    "think": record("It is 4.", "Add two and two."),
    "plain": record("It is 4."),
    "cut": None,
}


def test_completion_layout(family):
    name, encoder, fmt = family
    for (fam, case), want in EXPECTED.items():
        if fam != name:
            continue
        if case == "cut":
            rec = record("It is", finish="length") if name == "llama3" else record("", "Add two and", finish="length")
        else:
            rec = CASES[case]
        text, ids = completion_text(encoder, fmt, rec)
        assert text == want
        assert (ids[-1] == fmt.end_of_turn_id) == (case != "cut")


def test_specials_are_ids_and_text_stays_text(family):
    name, encoder, fmt = family
    _, ids = completion_text(encoder, fmt, record("Say </think> or <|eot_id|> please.", "Hmm."))
    if fmt.think_close:
        assert ids.count(encoder.token_id(fmt.think_close)) == 1 + ("</think>" in fmt.emitted)
    assert ids.count(fmt.end_of_turn_id) == 1


def test_auto_agrees_with_the_explicit_format(family):
    name, encoder, fmt = family
    rec = CASES["think"] if name != "llama3" else CASES["plain"]
    if name == "deepseek-r1":
        # R1's generation prompt ends `<think>\n`, which its rendered history never has: refused.
        with pytest.raises(ConfigError, match="not prefix-stable"):
            AutoFormat(encoder)
        return
    auto = AutoFormat(encoder)
    (a,), _ = Rebuilder(auto).rebuild([rec])
    (b,), _ = Rebuilder(fmt).rebuild([rec])
    assert (a.prompt_ids, a.completion_ids) == (b.prompt_ids, b.completion_ids)


def test_qwen3_tool_calls_and_deepseek_tool_markers(target_config):
    call = {"id": "c", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 2}'}}
    qwen = family_encoder(target_config, "qwen3")
    text, _ = completion_text(
        qwen, FORMATS["qwen3"](qwen), record("", "Use the tool.", finish="tool_calls", tool_calls=[call])
    )
    assert (
        text
        == '<think>\nUse the tool.\n</think>\n\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 2}}\n</tool_call><|im_end|>'
    )
    r1 = family_encoder(target_config, "deepseek-r1")
    fmt = FORMATS["deepseek-r1"](r1)
    text, ids = completion_text(r1, fmt, record("", "Use the tool.", finish="tool_calls", tool_calls=[call]))
    assert text == (
        "Use the tool.</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n"
        '{"a": 2, "b": 2}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>'
    )
    assert r1.token_id("<｜tool▁sep｜>") in ids


def test_qwen3_raw_output_without_a_reasoning_parser(target_config):
    """A server with no reasoning parser returns the think block inside content."""
    encoder = family_encoder(target_config, "qwen3")
    fmt = FORMATS["qwen3"](encoder)
    raw = record("<think>\nAdd two and two.\n</think>\n\nIt is 4.")
    assert completion_text(encoder, fmt, raw) == completion_text(encoder, fmt, CASES["think"])


def test_qwen3_thinking_off_prompt_closes_the_think_block(target_config):
    """With `enable_thinking=False` Qwen3's prompt ends `<think>\\n\\n</think>\\n\\n`: the model writes only the answer."""
    encoder = family_encoder(target_config, "qwen3")
    encoder.tokenizer.chat_template = QWEN3_TEMPLATE.replace(
        "<|im_start|>assistant\n{% endif %}", "<|im_start|>assistant\n<think>\n\n</think>\n\n{% endif %}"
    )
    text, _ = completion_text(encoder, FORMATS["qwen3"](encoder), record("It is 4."))
    assert text == "It is 4.<|im_end|>"


def test_a_format_whose_end_of_turn_is_not_the_targets_stop_token_is_refused(target_config):
    """SmolLM2 (plus Llama-3 specials) still stops on `<|im_end|>`: llama3's `<|eot_id|>` is the wrong format."""
    from eyas.tokenize.load import check_end_of_turn

    encoder = family_encoder(target_config, "llama3")
    with pytest.raises(ConfigError, match=r"ends a turn with <\|eot_id\|> .* stops on <\|im_end\|> \(id 2\)"):
        check_end_of_turn(FORMATS["llama3"](encoder))
    assert check_end_of_turn(FORMATS["chatml"](encoder)).name == "chatml"
