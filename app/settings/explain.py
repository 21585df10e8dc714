"""``cosyserve config``: the effective settings, each with where its value came from.

A value comes from the environment (``COSYSERVE_SECTION__KEY``, or a whole section's JSON), the
config file, or the declared default; a default the settings resolve (``pool.workers``,
``engine.batching``) says so. Keys are never shown: ``server.api_keys`` prints how many.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from app.settings.load import Settings, config_path, env_keys, load_settings, read_yaml

SECRET = {("server", "api_keys")}
DEV = "dev"  # printed only where a value is not the default (tests' and benchmarks' knobs)


@dataclass(frozen=True)
class Row:
    key: str  # section.name
    value: Any
    source: str  # "default", "default, resolved", the file's path, or "env NAME"


def explain(path: str | os.PathLike | None = None, **overrides: Any) -> list[Row]:
    """Every setting's effective value and source (ConfigError as ``load_settings``)."""
    settings = load_settings(path, **overrides)
    chosen = config_path(path)
    data = read_yaml(chosen) if chosen else {}
    env = env_keys()
    rows = []
    for section, field in Settings.model_fields.items():
        declared = field.default_factory()  # type: ignore[misc]
        values = getattr(settings, section)
        for name in type(values).model_fields:
            value = getattr(values, name)
            source = _source(section, name, data, env, overrides, str(chosen) if chosen else "")
            if source == "default" and value != getattr(declared, name):
                source = "default, resolved"
            if section == DEV and source == "default":
                continue
            if (section, name) in SECRET:
                value = f"<{len(value)} key(s)>"
            rows.append(Row(f"{section}.{name}", value, source))
    return rows


def _source(section: str, name: str, data: dict, env: dict, overrides: dict, file: str) -> str:
    if name in overrides.get(section, {}):
        return "command line"
    for key in ((section, name), (section,)):
        if key in env:
            return f"env {env[key]}"
    if isinstance(data.get(section), dict) and name in data[section]:
        return file
    return "default"


def render(rows: list[Row]) -> str:
    """One line a setting: ``section.key = value  # source``, the values in one column."""
    width = max(len(r.key) for r in rows)
    shown = [f"{r.key:<{width}} = {json.dumps(r.value)}" for r in rows]
    col = min(max(len(s) for s in shown), width + 40)
    return "\n".join(f"{s:<{col}}  # {r.source}" for s, r in zip(shown, rows))
