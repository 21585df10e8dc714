"""Server-sent events as the OpenAI-style stream sends them: parsed, and their audio joined."""

from __future__ import annotations

import base64
import json
from typing import Any


def parse_sse(text: str) -> list[dict[str, Any]]:
    events = []
    for block in text.split("\n\n"):
        if block.strip():
            assert block.startswith("data: "), block[:80]
            events.append(json.loads(block[len("data: "):]))
    return events


def sse_audio(events: list[dict[str, Any]]) -> bytes:
    assert events and events[-1]["type"] == "speech.audio.done"
    assert all(e["type"] == "speech.audio.delta" for e in events[:-1])
    return b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
