"""Every COSYSERVE_SECTION__KEY the repository writes (images, manifests, docs, scripts) names a real setting.

A renamed setting leaves stale names behind that only fail where they are used (an image test, a pod
start); this walks the text once and checks each name against ``Settings``.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from app.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"COSYSERVE_([A-Z0-9]+)__([A-Z0-9_]+)")
PLACEHOLDER = ("section", "key")  # the pattern as help text writes it


def tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, text=True,
                         capture_output=True, check=True).stdout.split()
    return [ROOT / p for p in out if (ROOT / p).is_file() and not p.startswith(("tests/unit/test_env_names.py",))]


def written_names() -> dict[tuple[str, str], str]:
    found: dict[tuple[str, str], str] = {}
    for path in tracked_text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for m in NAME.finditer(text):
            if (m.group(1).lower(), m.group(2).lower()) != PLACEHOLDER:
                found.setdefault((m.group(1).lower(), m.group(2).lower()), str(path.relative_to(ROOT)))
    return found


def test_every_written_env_name_is_a_setting():
    names = written_names()
    assert len(names) > 10, names  # the walk found the names the images and manifests set
    sections = Settings.model_fields
    unknown = [f"COSYSERVE_{s.upper()}__{k.upper()} ({where})" for (s, k), where in sorted(names.items())
               if s not in sections or k not in sections[s].annotation.model_fields]
    assert not unknown, unknown


def test_the_image_test_sets_the_dev_cache_dir():
    names = written_names()
    assert names[("dev", "tiny_cache_dir")]
    assert ("engine", "tiny_cache_dir") not in names
