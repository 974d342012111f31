"""Each drafter family is known in its own module only: the stages, the shared packages and the
top ask the family object (:class:`eyas.drafter.family.Family`) and never name one, so adding a
family is adding its module (and its settings in the config schema, which names them)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from eyas.drafter.families import FAMILIES

SRC = Path(__file__).resolve().parents[1] / "src" / "eyas"
KNOWING = {SRC / "config.py", *sorted((SRC / "drafter" / "families").glob("*.py"))}
"""The config schema (``train.drafter``'s values, each family's section) and the families' own modules."""


def family_names() -> set[str]:
    """Every string that says which family: names, architectures, engine method names."""
    names = set()
    for family in FAMILIES.values():
        names |= {family.name, family.vllm_method, family.llamacpp_arch, family.llamacpp_spec_type}
        names |= set(family.architectures)
    return names


def namings(path: Path, root: Path = SRC) -> list[str]:
    """Where a module names a family: a string constant equal to one or built on one
    (``eagle3_broken_aux_order``), or an import of a family's module."""
    names, found = family_names(), []
    built_on = re.compile("^(" + "|".join(map(re.escape, sorted(names, key=len, reverse=True))) + r")[_.\-]")
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and (node.value in names or built_on.match(str(node.value))):
            found.append(f"{path.relative_to(root)}:{node.lineno} names {node.value!r}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("eyas.drafter.families."):
            found.append(f"{path.relative_to(root)}:{node.lineno} imports {node.module}")
    return found


def test_no_module_outside_the_family_modules_names_a_family():
    assert [n for path in sorted(SRC.rglob("*.py")) if path not in KNOWING for n in namings(path)] == []


def test_the_check_sees_a_named_family(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        'from eyas.drafter.families.dflash import DFLASH\nif family == "dspark":\n    row = "eagle3_broken_aux_order"\n'
    )
    assert sorted(namings(bad, tmp_path)) == [
        "bad.py:1 imports eyas.drafter.families.dflash",
        "bad.py:2 names 'dspark'",
        "bad.py:3 names 'eagle3_broken_aux_order'",
    ]
