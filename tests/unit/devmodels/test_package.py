"""app/devmodels is a fixture factory: only the composition root (the lifespan) and the CLI import it (no torch)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
ALLOWED = {"app/lifespan.py", "app/cli.py"}  # tests and bench/ may import it too


def _imports_devmodels(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        if any(name == "app.devmodels" or name.startswith("app.devmodels.") for name in names):
            return True
    return False


def test_only_the_lifespan_and_the_cli_import_devmodels():
    importers = {
        str(path.relative_to(ROOT))
        for path in (ROOT / "app").rglob("*.py")
        if "devmodels" not in path.relative_to(ROOT / "app").parts and _imports_devmodels(path)
    }
    assert importers <= ALLOWED, f"{sorted(importers - ALLOWED)} import app.devmodels: shared facts go to layout.py"
    assert importers, "the lifespan or the CLI should build the tiny default model through app.devmodels"


def test_the_check_sees_every_import_form(tmp_path):
    for code in ("import app.devmodels.tiny", "from app.devmodels import tiny",
                 "from app.devmodels.tiny import ensure_tiny_model", "def f():\n    from app import devmodels\n"):
        path = tmp_path / "m.py"
        path.write_text(code + "\n")
        assert _imports_devmodels(path), code
    (tmp_path / "m.py").write_text("from app.engines.cosyvoice import layout\nimport app.devmodelsx\n")
    assert not _imports_devmodels(tmp_path / "m.py")
