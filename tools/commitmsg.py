"""The commit convention (CONTRIBUTING.md), checked: ``check(message) -> list[str]`` problems.

A subject ``area: imperative summary`` of at most 72 characters, the area one of ``AREAS``, no
period at its end (a capital is fine: ``docs: README says ...``); a blank line before any body.
The commit-msg hook (.githooks/commit-msg) and the history test (tests/unit/test_commit_convention.py)
both call this; ``python tools/commitmsg.py FILE`` checks one message file (exit 1 with problems).
"""

from __future__ import annotations

import re
import sys

MAX_SUBJECT = 72

AREAS = {
    "api": "HTTP and WebSocket surfaces, the edge: app/api/, app/middleware.py",
    "serving": "admission, the limiter, the pool, jobs, streams: app/serving/",
    "engines": "the engine contract and the CosyVoice adapter: app/engines/, app/devmodels/",
    "text": "normalisation and splitting of input text: app/text/",
    "audio": "encoding and decoding of audio: app/audio/",
    "voices": "the persistent voice library: app/voices/",
    "bench": "benchmarks and probes: bench/, locustfiles/",
    "docs": "README.md, CONTRIBUTING.md, docs/",
    "deploy": "manifests, images and their scripts: deploy/, Dockerfile*",
    "tests": "tests/ and their fixtures",
    "build": "packaging, requirements, Makefile, CI, hooks and tools/",
}

SUBJECT = re.compile(r"^(?P<area>[a-z][a-z0-9-]*): (?P<summary>\S.*)$")
SCISSORS = "# ------------------------ >8 ------------------------"


def clean(message: str) -> list[str]:
    """The message's lines as git keeps them: no comment lines, nothing below the scissors (``commit -v``)."""
    lines = []
    for line in message.splitlines():
        if line.startswith(SCISSORS):
            break
        if not line.startswith("#"):
            lines.append(line.rstrip())
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return lines


def check(message: str) -> list[str]:
    """What is wrong with a commit message, as sentences; empty when it follows the convention."""
    lines = clean(message)
    if not lines:
        return ["empty message"]
    subject, problems = lines[0], []
    if subject.startswith(("Merge ", "fixup!", "squash!", "amend!")):
        problems.append(f"{subject.split()[0]!r} commit: main takes rebased commits, no merges or fixups")
    if len(subject) > MAX_SUBJECT:
        problems.append(f"subject is {len(subject)} characters, at most {MAX_SUBJECT}")
    m = SUBJECT.match(subject)
    if m is None:
        problems.append("subject is not 'area: imperative summary' (lowercase area, colon, one space)")
    else:
        if m["area"] not in AREAS:
            problems.append(f"unknown area {m['area']!r}; one of: {', '.join(AREAS)}")
        if m["summary"].endswith("."):
            problems.append("summary ends with a period")
    if len(lines) > 1 and lines[1]:
        problems.append("no blank line between the subject and the body")
    return problems


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: commitmsg.py MESSAGE_FILE", file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8", errors="replace") as f:
        problems = check(f.read())
    for p in problems:
        print(f"commit-msg: {p} (CONTRIBUTING.md)", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
