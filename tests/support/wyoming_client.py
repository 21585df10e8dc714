"""The ``wyoming`` package's own client against a server's Wyoming port: what Home Assistant sends."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.tts import SynthesizeStopped

TIMEOUT_S = 60.0


@dataclass
class Reply:
    """The events answering one request, up to its last (audio-stop, synthesize-stopped or error)."""

    events: list[Event] = field(default_factory=list)

    @property
    def types(self) -> list[str]:
        return [e.type for e in self.events]

    @property
    def start(self) -> AudioStart:
        return AudioStart.from_event(next(e for e in self.events if AudioStart.is_type(e.type)))

    @property
    def chunks(self) -> list[AudioChunk]:
        return [AudioChunk.from_event(e) for e in self.events if AudioChunk.is_type(e.type)]

    @property
    def pcm(self) -> bytes:
        return b"".join(c.audio for c in self.chunks)

    @property
    def error(self) -> Error | None:
        found = [Error.from_event(e) for e in self.events if Error.is_type(e.type)]
        return found[0] if found else None


async def next_event(client: AsyncTcpClient, timeout_s: float = TIMEOUT_S) -> Event:
    event = await asyncio.wait_for(client.read_event(), timeout_s)
    assert event is not None, "the server closed the connection"
    return event


async def read_reply(client: AsyncTcpClient, streamed: bool = False, reply: Reply | None = None) -> Reply:
    """Events until the request's last: audio-stop (or synthesize-stopped when ``streamed``), or an error
    (then, when ``streamed``, synthesize-stopped too)."""
    reply = reply or Reply()
    while True:
        event = await next_event(client)
        reply.events.append(event)
        if SynthesizeStopped.is_type(event.type):
            return reply
        if not streamed and (AudioStop.is_type(event.type) or Error.is_type(event.type)):
            return reply
