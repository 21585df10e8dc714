"""A request's context is built once at the edge and handed down (issue 52); serving/ never calls up into api/.

Read with ``ast`` (nothing is imported): ``context_of`` (the scope's context) is called only by the
ASGI layer, which creates and fills it on the scope, and by the one lookup each handler gets
(``deps.get_context``) or, for an error answer, its handler's wrapper; everything a handler calls
is given the context. No module of ``app/serving`` imports ``app.api``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "app"
ACCESSOR = "context_of"
# the modules that may look the context up from the scope: the ASGI layer and the handlers' entry points
ENTRY_POINTS = {
    "app/middleware.py",  # creates it
    "app/api/admission.py",  # ASGI: the route, the class, the permit
    "app/api/auth.py",  # ASGI: the key's id and default class
    "app/api/errors.py",  # render_scope (the ASGI layer's error answers), and the exception handlers' wrapper
    "app/api/deps.py",  # ContextDep: a handler's one lookup
}


def callers(path: Path) -> list[int]:
    """The lines of ``path`` that call ``context_of`` (by name or as an attribute)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            if name == ACCESSOR:
                lines.append(node.lineno)
    return lines


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports (absolute imports; the app uses no relative ones), at any depth."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def test_only_the_edge_and_the_entry_points_look_the_context_up():
    wrong = []
    for path in sorted(APP.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "app/api/context.py" or rel in ENTRY_POINTS:
            continue
        wrong += [f"{rel}:{line}" for line in callers(path)]
    assert not wrong, "take the context as a parameter from the handler (deps.ContextDep):\n" + "\n".join(wrong)
    assert all(callers(ROOT / rel) for rel in ENTRY_POINTS), "an entry point no longer looks it up: drop it here"


def test_serving_never_imports_the_api():
    wrong = [f"{path.relative_to(ROOT).as_posix()} imports {m}" for path in sorted((APP / "serving").rglob("*.py"))
             for m in sorted(imports(path)) if m == "app.api" or m.startswith("app.api.")]
    assert not wrong, "\n".join(wrong)


def test_the_checks_see_what_they_are_for(tmp_path):
    path = tmp_path / "x.py"
    path.write_text("from app.api import context\n\ndef f(scope):\n    import app.api.errors\n"
                    "    return context.context_of(scope), context_of(scope)\n")
    assert callers(path) == [5, 5]
    assert {"app.api", "app.api.errors"} <= imports(path)
