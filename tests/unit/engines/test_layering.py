"""The CosyVoice engine's stage packages (llm, flow, token2wav) import one way only.

Read with ``ast`` (nothing is imported, so no torch): a stage module may import its own
package, another stage, or a top-level ``app.engines.cosyvoice`` module that imports no stage
(``device``, ``layout``); never a module above the stages (``batched``, ``engine``, ``levers``,
...), and the stages' imports of each other form no cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

from app.engines import cosyvoice

PACKAGE = "app.engines.cosyvoice"
STAGES = ("llm", "flow", "token2wav")
ROOT = Path(cosyvoice.__file__).parent


def module_files() -> dict[str, Path]:
    """Every module of the adapter: dotted name -> file (a package is its ``__init__``)."""
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join((PACKAGE, *parts))] = path
    return found


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The adapter's modules ``name`` imports, at module level or inside functions."""
    base = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                anchor = base.rsplit(".", node.level - 1)[0] if node.level > 1 else base
                module = f"{anchor}.{module}" if module else anchor
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in known else module for a in node.names]
        else:
            continue
        out.update(t for t in targets if t in known and t != PACKAGE)
    return out


def unit_of(module: str) -> str:
    """The stage a module belongs to, or its own name for a top-level module."""
    return module.removeprefix(PACKAGE + ".").split(".")[0]


def graph() -> dict[str, set[str]]:
    files = module_files()
    return {name: imports_of(name, path, set(files)) for name, path in files.items()}


def above_stages(edges: dict[str, set[str]]) -> set[str]:
    """Top-level modules that import a stage, directly or through other top-level modules."""
    above = {m for m, deps in edges.items() if unit_of(m) not in STAGES and any(unit_of(d) in STAGES for d in deps)}
    grew = True
    while grew:
        grew = False
        for m, deps in edges.items():
            if unit_of(m) not in STAGES and m not in above and deps & above:
                above.add(m)
                grew = True
    return above


def upward_imports(edges: dict[str, set[str]]) -> list[str]:
    above = above_stages(edges)
    return sorted(f"{m} -> {d}" for m, deps in edges.items() if unit_of(m) in STAGES for d in deps if d in above)


def stage_cycle(edges: dict[str, set[str]]) -> list[str]:
    """One cycle among the stage packages (as a path), or [] when their imports form a DAG."""
    deps: dict[str, set[str]] = {s: set() for s in STAGES}
    for m, targets in edges.items():
        for d in targets:
            if unit_of(m) in STAGES and unit_of(d) in STAGES and unit_of(m) != unit_of(d):
                deps[unit_of(m)].add(unit_of(d))
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(stage: str, path: list[str]) -> list[str]:
        state[stage] = 1
        for nxt in sorted(deps[stage]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt] if nxt in path else [*path, nxt]
            if nxt not in state and (found := visit(nxt, [*path, nxt])):
                return found
        state[stage] = 2
        return []

    for stage in STAGES:
        if stage not in state and (found := visit(stage, [stage])):
            return found
    return []


def test_every_stage_is_a_package_with_modules():
    edges = graph()
    for stage in STAGES:
        assert f"{PACKAGE}.{stage}" in edges
        assert any(m.startswith(f"{PACKAGE}.{stage}.") for m in edges)
    assert not (ROOT / "batching").exists()


def test_no_stage_imports_upward():
    edges = graph()
    assert f"{PACKAGE}.batched" in above_stages(edges)  # the check sees the composer
    assert upward_imports(edges) == []


def test_no_import_cycle_between_stages():
    assert stage_cycle(graph()) == []


def test_the_checks_catch_what_they_are_for():
    a, b = f"{PACKAGE}.flow.cache", f"{PACKAGE}.llm.kv"
    top, mid = f"{PACKAGE}.batched", f"{PACKAGE}.helpers"
    edges = {a: {mid}, b: {a}, mid: set(), top: {b}, f"{PACKAGE}.below": set()}
    assert upward_imports(edges) == []
    edges[mid] = {top}  # mid now imports the composer, so flow -> mid is upward
    assert upward_imports(edges) == [f"{a} -> {mid}"]
    assert stage_cycle({a: {b}, b: set()}) == []
    assert stage_cycle({a: {b}, b: {a}}) in (["flow", "llm", "flow"], ["llm", "flow", "llm"])
