"""Docs a newcomer can walk: every relative markdown link resolves, every doc is reachable from
docs/README.md (the index), and doc files share one naming style (lowercase, hyphens).

Anchors (`file.md#part`) are not checked, only that the file exists; links inside code (fenced
blocks, `inline`) are not links. External links (a scheme: https:, mailto:) are not fetched.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
INDEX = DOCS / "README.md"
TOP = [ROOT / "README.md", ROOT / "CONTRIBUTING.md"]
NAME = re.compile(r"^(README|[a-z0-9]+(-[a-z0-9]+)*)\.md$")

FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def docs() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def links(path: Path) -> list[tuple[str, Path]]:
    """(as written, the file or folder it names) for each relative link in a markdown file."""
    text = CODE.sub("", FENCE.sub("", path.read_text(encoding="utf-8")))
    out = []
    for target in LINK.findall(text):
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("#"):
            continue
        out.append((target, (path.parent / target.split("#", 1)[0]).resolve()))
    return out


def test_every_relative_link_resolves():
    broken = [f"{md.relative_to(ROOT)}: {target}" for md in TOP + docs() for target, dest in links(md)
              if not dest.exists()]
    assert not broken, "links to nothing:\n" + "\n".join(broken)


def test_every_doc_is_reachable_from_the_index():
    seen, todo = {INDEX.resolve()}, [INDEX.resolve()]
    while todo:
        for _, dest in links(todo.pop()):
            if dest.suffix == ".md" and dest.is_file() and dest not in seen:
                seen.add(dest)
                todo.append(dest)
    lost = [str(md.relative_to(ROOT)) for md in docs() if md.resolve() not in seen]
    assert not lost, "docs that docs/README.md does not lead to:\n" + "\n".join(lost)


def test_the_readme_links_the_index():
    assert INDEX.resolve() in {dest for _, dest in links(ROOT / "README.md")}


def test_doc_names_are_lowercase_with_hyphens():
    bad = [str(md.relative_to(DOCS)) for md in docs() if not NAME.match(md.name)]
    assert not bad, "rename (git mv) to lowercase-with-hyphens.md and fix the links:\n" + "\n".join(bad)


def test_the_readme_front_door_reaches_the_two_commands_within_40_lines():
    """What cosyserve is, in short bullets, then the two commands: the first `make run` by line 40, and no
    bullet of the front door longer than one line (details live in docs/features.md)."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    first_run = next(i for i, line in enumerate(lines, 1) if line.startswith("make run"))
    assert first_run <= 40, f"the first `make run` is on README line {first_run}"
    front = lines[:lines.index("## Two commands")]
    bullets = [line for line in front if line.startswith("- ")]
    assert 5 <= len(bullets) <= 12 and all(len(b) <= 120 for b in bullets), bullets
    assert not [line for line in front if line.startswith("  ")], "a front-door bullet runs over one line"
    assert "docs/features.md" in "\n".join(front)
