"""The tests' own layout: shared helpers live in tests/support, no test module imports another.

A helper imported from a test module drags that module's fixtures and markers along and hides
what the helper belongs to; one imported from a conftest.py bypasses how pytest loads it.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at any depth (imports inside functions included), and every module
    imported by Python source held in its strings (a script a test runs in a subprocess)."""
    return _imports(ast.parse(path.read_text(), str(path)))


def _imports(tree: ast.AST) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{alias.name}" for alias in node.names)  # `from tests.x import test_y`
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "import" in node.value:
            try:
                script = ast.parse(textwrap.dedent(node.value))
            except (SyntaxError, ValueError):
                continue  # not Python
            out |= _imports(script)
    return out


def test_no_test_module_or_conftest_is_imported():
    wrong = []
    for path in sorted(TESTS.rglob("*.py")):
        if path == Path(__file__).resolve():
            continue  # its own examples below are strings of such imports
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


def test_the_check_sees_an_import_in_a_script_run_in_a_subprocess(tmp_path):
    path = tmp_path / "test_x.py"
    path.write_text('SCRIPT = """\nimport sys\nfrom tests.integration.flow.test_batch import item\n"""\n'
                    'NOT_CODE = "import this, and that: not Python"\n')
    found = imported_modules(path)
    assert "tests.integration.flow.test_batch" in found and "sys" in found
