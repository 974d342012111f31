"""The eval table: τ per source dataset beside the overall τ when the prompts come from several."""

from rich.console import Console

from eyas.eval.report import table


def report(datasets: list[str]) -> dict:
    method = {
        "tau": 1.5,
        "tau_per_dataset": {d: 1.25 + i for i, d in enumerate(datasets)},
        "per_position": [0.4, 0.1],
        "tokens_per_s": 10.0,
        "speedup": 1.1,
        "lossless": {"checked": 2, "identical": 2, "mismatched": []},
    }
    return {
        "config": {"num_draft_tokens": 2},
        "prompts": 2,
        "datasets": datasets,
        "plain": {"tokens_per_s": 9.0},
        "methods": {"eagle3": method},
    }


def rendered(data: dict) -> str:
    console = Console(width=200, record=True)
    console.print(table(data))
    return console.export_text()


def test_each_source_dataset_gets_its_own_tau_column():
    text = rendered(report(["chat", "logs"]))
    assert "τ chat" in text and "τ logs" in text
    row = next(line for line in text.splitlines() if "eagle3" in line)
    assert [cell.strip() for cell in row.split("│")[2:5]] == ["1.50", "1.25", "2.25"]


def test_one_dataset_has_no_column_of_its_own():
    assert "τ synth" not in rendered(report(["synth"]))
