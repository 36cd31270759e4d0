"""docs/model-families.md shows the table the family tests assert (tests/family_support.py)."""

from __future__ import annotations

from pathlib import Path

from family_support import FAMILY_ROWS, table

DOC = Path(__file__).resolve().parents[2] / "docs" / "model-families.md"


def test_the_docs_table_is_the_one_the_family_tests_assert():
    assert table() in DOC.read_text(encoding="utf-8")


def test_every_family_the_tests_build_has_a_row():
    import ast

    src = (Path(__file__).resolve().parents[1] / "families.py").read_text()
    tree = ast.parse(src)
    families = next(
        node.value
        for node in tree.body
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "FAMILIES"
    )
    assert isinstance(families, ast.Dict)
    built = {k.value for k in families.keys if isinstance(k, ast.Constant)}
    assert built == set(FAMILY_ROWS)
