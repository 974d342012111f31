"""The directory swap every stage commits its redo with: whole outputs at the name, whatever the crash."""

from pathlib import Path

from eyas.files import recover_dir, replace_dir


def tree(path: Path, text: str) -> Path:
    path.mkdir()
    (path / "part").write_text(text)
    return path


def test_a_swap_puts_the_new_outputs_at_the_old_name_and_leaves_nothing_beside_them(tmp_path):
    old, new = tree(tmp_path / "hidden", "old"), tree(tmp_path / "hidden.redo", "new")
    replace_dir(new, old)
    assert (old / "part").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hidden"]


def test_outputs_swapped_out_but_not_yet_deleted_are_deleted_by_the_next_start(tmp_path):
    current, swapped_out = tree(tmp_path / "hidden", "new"), tree(tmp_path / "hidden.old", "old")
    recover_dir(current)
    assert (current / "part").read_text() == "new" and not swapped_out.exists()


def test_a_swap_cut_between_its_two_renames_gets_the_old_outputs_back(tmp_path):
    tree(tmp_path / "hidden.old", "old")
    recover_dir(tmp_path / "hidden")
    assert (tmp_path / "hidden" / "part").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hidden"]
