"""The tests' own layout: shared helpers live in tests/support, no test module imports another.

A helper imported from a test module drags that module's fixtures and markers along and hides
what the helper belongs to; one imported from a conftest.py bypasses how pytest loads it.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at any depth (imports inside functions included)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{alias.name}" for alias in node.names)  # `from tests.x import test_y`
    return out


def test_no_test_module_or_conftest_is_imported():
    wrong = []
    for path in sorted(TESTS.rglob("*.py")):
        for module in imported_modules(path):
            parts = module.split(".")
            if parts[0] != "tests":
                continue
            last = parts[-1]
            if last.startswith("test_") or last == "conftest":
                wrong.append(f"{path.relative_to(TESTS.parent)} imports {module}")
    assert not wrong, "move the helper into tests/support/:\n" + "\n".join(wrong)


def test_the_check_sees_an_import_inside_a_function(tmp_path):
    path = tmp_path / "test_x.py"
    path.write_text("def test_a():\n    from tests.api.test_metrics import scrape\n")
    assert "tests.api.test_metrics" in imported_modules(path)
