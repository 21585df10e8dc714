"""WS /v1/audio/speech/stream: capacity follows compute, and every message is bounded.

Sessions count against ``websocket.max_sessions``, not against synthesis permits; an
utterance holds a permit from its first text until its audio is done; the idle timeout
is reset only by text and produced audio; a session lives at most
``websocket.max_session_s``; a message that cannot be read, for any reason, is an
``invalid_message`` event and the session stays open. Over the real app and pool with
FakeEngines (tests/api/conftest.py).
"""

from __future__ import annotations

import json
import time

import pytest

from tests.support import configs
from tests.support.waiting import wait_until
from tests.support.ws import PATH, closed, error, in_flight, send, utterance


def series(client, name: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith((name + " ", name + "{")):
            return float(line.split()[-1])
    raise AssertionError(f"no {name} series")


def refused_total(client, reason: str) -> float:
    return series(client, f'tts_ws_sessions_refused_total{{reason="{reason}"}}')


def test_sessions_without_text_hold_no_synthesis_permit(open_client, behaviour):
    # admission allows 1 request at once; 6 sessions that only configure must not take it
    client = open_client(pool={"workers": 1, "max_queue": 0})
    sockets = [client.websocket_connect(PATH) for _ in range(6)]
    opened = [ws.__enter__() for ws in sockets]
    try:
        for ws in opened:
            send(ws, "session.config", voice="fake_male")
            send(ws, "input.done")  # nothing to speak: an error, no permit
            assert error(ws)["code"] == "empty_input"
        wait_until(lambda: len(client.app.state.runtime.sessions) == 6)
        assert in_flight(client) == 0
        r = client.post("/v1/tts", json={"text": "Plain request beside idle sessions."})
        assert r.status_code == 200 and r.content[:4] == b"RIFF"
    finally:
        for ws in sockets:
            ws.__exit__(None, None, None)


def test_an_utterance_holds_its_permit_from_its_first_text_until_its_audio_is_done(open_client, behaviour):
    client = open_client()
    with client.websocket_connect(PATH) as ws:
        assert in_flight(client) == 0  # connected: no permit
        send(ws, "input.text", text="Hello")
        wait_until(lambda: in_flight(client) == 1)  # text to speak: a permit
        send(ws, "input.text", text=" there.")
        send(ws, "input.done")
        utterance(ws)
        wait_until(lambda: in_flight(client) == 0)  # audio done: given back, the session still open
        send(ws, "input.text", text="Again.")
        send(ws, "input.done")
        start, _, _ = utterance(ws)
        assert start["utterance"] == 2
    assert behaviour.spoken == ["Hello there.", "Again."]


def test_sessions_beyond_max_sessions_are_refused_with_1013_and_counted(open_client):
    client = open_client(websocket={"max_sessions": 2})
    before = refused_total(client, "session_limit")
    with client.websocket_connect(PATH) as a, client.websocket_connect(PATH) as b:
        wait_until(lambda: len(client.app.state.runtime.sessions) == 2)
        with client.websocket_connect(PATH) as c:
            err = error(c)
            assert err["code"] == "session_limit" and err["retry_after_s"] >= 1
            assert "websocket.max_sessions" in err["message"]
            assert closed(c) == 1013
        assert refused_total(client, "session_limit") == before + 1
        assert series(client, "tts_ws_sessions") == 2  # the refused one never counted
        send(a, "nonsense")  # the open ones are untouched
        assert error(a)["code"] == "unknown_type"
        send(b, "session.close")
        assert b.receive_json()["type"] == "session.done"
    wait_until(lambda: len(client.app.state.runtime.sessions) == 0)
    assert series(client, "tts_ws_sessions") == 0
    with client.websocket_connect(PATH) as d:  # a place freed: accepted again
        send(d, "input.text", text="Room again.")
        send(d, "input.done")
        utterance(d)


def test_only_text_and_audio_reset_the_idle_timeout(open_client, behaviour):
    client = open_client(websocket={"idle_timeout_s": 0.6})
    with client.websocket_connect(PATH) as ws:
        started = time.monotonic()
        # messages that are not text: config, empty input.done, bad messages -> the timeout still runs
        for _ in range(5):
            send(ws, "session.config", voice="fake_male")
            send(ws, "input.done")
            ws.send_text("not json")
            time.sleep(0.1)
        events = []
        while True:
            event = ws.receive_json()
            events.append(event["error"]["code"])
            if event["error"]["code"] == "idle_timeout":
                break
        assert closed(ws) == 1000
        assert time.monotonic() - started < 3.0
        assert set(events) == {"empty_input", "invalid_message", "idle_timeout"}

    with client.websocket_connect(PATH) as ws:
        # pieces of text every 0.25 s for 1.5 s (2.5 x the timeout) keep it open
        for piece in ["Text ", "keeps ", "the ", "session ", "open ", "while ", "it "]:
            send(ws, "input.text", text=piece)
            time.sleep(0.25)
        send(ws, "input.text", text="arrives.")
        send(ws, "input.done")
        start, audio, _ = utterance(ws)  # not an idle_timeout error
        assert start["utterance"] == 1 and len(audio) > 0
        assert error(ws)["code"] == "idle_timeout"  # then, with nothing more, it ends
        assert closed(ws) == 1000
    assert behaviour.spoken == ["Text keeps the session open while it arrives."]


def test_a_session_ends_after_its_lifetime_even_while_busy_sending_text(open_client, behaviour):
    client = open_client(websocket={"max_session_s": 0.8, "idle_timeout_s": 30})
    with client.websocket_connect(PATH) as ws:
        started = time.monotonic()
        send(ws, "input.text", text="Never")
        for _ in range(20):
            send(ws, "input.text", text=" finished")
            time.sleep(0.05)
        err = error(ws)
        assert err["code"] == "session_expired" and "websocket.max_session_s" in err["message"]
        assert closed(ws) == 1000
        assert 0.8 <= time.monotonic() - started < 5.0
    wait_until(lambda: in_flight(client) == 0)  # the utterance's permit went back with it


@pytest.mark.parametrize("raw", [
    "[" * 50_000,  # nested too deep for the JSON parser (RecursionError)
    '{"type": "input.text", "text": ' + "[" * 20_000 + "]" * 20_000 + "}",
    '{"type": "session.config", "voice": {"a": ' * 5_000 + "1" + "}" * 10_000,
    json.dumps({"type": "input.text", "text": "x", "k" * 100_000: 1}),  # a giant unknown field name
    "\ufeff{}",
    "null",
    '{"type": null}',
])
def test_any_message_that_cannot_be_read_is_invalid_message_and_the_session_stays(open_client, behaviour, raw):
    client = open_client(websocket={"max_message_bytes": 1024 * 1024})
    with client.websocket_connect(PATH) as ws:
        ws.send_text(raw)
        err = error(ws)
        assert err["code"] == "invalid_message"
        assert len(json.dumps(err)) < 600  # says what is wrong without quoting the message back
        send(ws, "input.text", text="Still here.")
        send(ws, "input.done")
        utterance(ws)
    assert behaviour.spoken == ["Still here."]


def test_a_message_over_max_message_bytes_is_refused_and_changes_nothing(open_client, behaviour):
    client = open_client(websocket={"max_message_bytes": 2048})
    with client.websocket_connect(PATH) as ws:
        send(ws, "input.text", text="é" * 1500)  # 1500 characters, 3000 bytes
        err = error(ws)
        assert err["code"] == "invalid_message" and "2048 bytes" in err["message"]
        send(ws, "input.text", text="Short.")
        send(ws, "input.done")
        utterance(ws)
    assert behaviour.spoken == ["Short."]


def test_a_lone_surrogate_is_invalid_input_and_nothing_is_spoken(open_client, behaviour):
    client = open_client()
    with client.websocket_connect(PATH) as ws:
        ws.send_text('{"type": "input.text", "text": "broken \\ud800 text"}')
        err = error(ws)
        assert (err["code"], err["param"]) == ("invalid_input", "text")
        assert in_flight(client) == 0  # no utterance was opened
        ws.send_text('{"type": "session.config", "instructions": "calm \\udc00"}')
        assert error(ws)["code"] == "invalid_input"
        send(ws, "input.text", text="Fine text.")
        send(ws, "input.done")
        start, _, _ = utterance(ws)
        assert start["utterance"] == 1
    assert behaviour.spoken == ["Fine text."]


def test_giant_config_fields_are_refused_quoting_a_short_prefix(open_client):
    client = open_client(websocket={"max_message_bytes": 4 * 1024 * 1024})
    with client.websocket_connect(PATH) as ws:
        for field, size in (("voice", 100_000), ("model", 1_000_000), ("instructions", 100_000)):
            send(ws, "session.config", **{field: "v" * size})
            err = error(ws)
            assert err["code"] == "invalid_message" and err["param"] == field
            assert len(err["message"]) < 200
        send(ws, "session.config", model="m" * 100)  # within the cap, but unknown: 404 quoting a prefix
        err = error(ws)
        assert err["code"] == "model_not_found" and "(100 characters)" in err["message"]
        assert "m" * 41 not in err["message"]


def test_a_session_that_connects_while_the_server_drains_is_refused_with_1001(open_client):
    client = open_client()
    runtime = client.app.state.runtime
    before = refused_total(client, "draining")
    client.portal.call(runtime.pool.begin_drain)
    with client.websocket_connect(PATH) as ws:
        assert error(ws)["code"] == "draining"
        assert closed(ws) == 1001
    assert refused_total(client, "draining") == before + 1
    assert len(runtime.sessions) == 0


def test_a_client_that_reads_no_audio_is_dropped_after_the_idle_timeout():
    import asyncio
    from types import SimpleNamespace

    from app.api.ws_speech import Connection
    from app.serving.errors import ClientGone
    from app.serving.session import Utterance

    class NeverReads:  # the socket's send buffer is full: a send never completes
        def __init__(self) -> None:
            self.headers: dict = {}

        async def send_bytes(self, data: bytes) -> None:
            await asyncio.Event().wait()

    conn = Connection(NeverReads(), SimpleNamespace(session_limits=configs.session_limits(idle_timeout_s=0.3)))

    async def send() -> float:
        started = time.monotonic()
        with pytest.raises(ClientGone, match="read no audio for 0.3 s"):
            await conn.audio(Utterance(1), b"\x00\x01")
        return time.monotonic() - started

    assert 0.3 <= asyncio.run(send()) < 3.0
    assert conn._closed.is_set()  # nothing more is sent; the session ends
