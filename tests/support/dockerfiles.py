"""The Dockerfiles read as instructions: each stage's base, its ARG defaults, its RUN lines."""

from __future__ import annotations

import re

from tests.support.paths import ROOT

# What a model config's training part needs to import, as each image's build checks it.
CHECK_CONFIG = {"Dockerfile": "cosyserve check-config --version 1 --version 2",
                "Dockerfile.cuda": 'cosyserve check-config --cosyvoice-path "${COSYVOICE_PATH}" --version 1 --version 2 '
                                   "--version 3"}


def text(name: str) -> str:
    return (ROOT / name).read_text()


def instructions(name: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    lines = [line for line in text(name).splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    return [(m.group(1).upper(), m.group(2).strip()) for m in re.finditer(r"^\s*([A-Za-z]+)\s+(.*)$", joined, re.MULTILINE)]


def args(name: str) -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", text(name), re.MULTILINE))


def bases(name: str) -> list[str]:
    """Each stage's base image, ARG defaults filled in (``AS name`` dropped)."""
    values = args(name)
    return [re.sub(r"\$\{(\w+)\}", lambda m: values[m.group(1)], v.split()[0])
            for i, v in instructions(name) if i == "FROM"]


def runs(name: str) -> str:
    return "\n".join(a for i, a in instructions(name) if i == "RUN")
