"""WS /v1/audio/speech/stream: the protocol, over the real app and pool with FakeEngines.

The fake engine speaks streamed text sentence by sentence (as CosyVoice-300M does),
0.6 s of tone per sentence; the bistream path on real CosyVoice2 is tested in
tests/integration/api/test_ws_speech_e2e.py.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from tests.support.waiting import wait_until
from tests.support.ws import PATH, closed, error, in_flight, send, utterance


def test_pieces_of_any_size_are_spoken_as_sentences_and_the_wav_decodes(open_client, behaviour):
    client = open_client()
    with client.websocket_connect(PATH) as ws:
        send(ws, "session.config", response_format="wav", voice="fake_male")
        for piece in ["Hel", "lo wor", "ld. How a", "re you?", " Fine"]:
            send(ws, "input.text", text=piece)
        send(ws, "input.done")
        start, audio, done = utterance(ws)
    assert start == {"type": "audio.start", "utterance": 1, "format": "wav", "media_type": "audio/wav",
                     "sample_rate": 24000, "channels": 1, "sample_width": 2}
    assert behaviour.spoken == ["Hello world.", "How are you?", "Fine"]
    assert audio[:4] == b"RIFF" and audio[8:16] == b"WAVEfmt "
    channels, rate = struct.unpack("<HI", audio[22:28])
    assert (channels, rate) == (1, 24000)
    samples = np.frombuffer(audio[44:], dtype="<i2")
    assert len(samples) == 3 * 3 * int(0.2 * 24000)  # 3 sentences x 3 chunks x 0.2 s
    assert done["audio_seconds"] == pytest.approx(len(samples) / 24000, abs=1e-3)
    assert np.abs(samples).max() > 5000  # the tone, not silence
    assert done["time_to_first_audio_s"] > 0


def test_input_done_keeps_the_session_for_the_next_utterance_and_close_ends_it(open_client, behaviour):
    client = open_client()
    with client.websocket_connect(PATH) as ws:
        send(ws, "input.text", text="First one.")
        send(ws, "input.done")
        first = utterance(ws)
        send(ws, "input.text", text="Second")
        send(ws, "input.text", text=" one.")
        send(ws, "session.close")  # flushes what was sent, speaks it, then ends
        second = utterance(ws)
        assert ws.receive_json() == {"type": "session.done", "utterances": 2, "audio_seconds": 1.2}
        assert closed(ws) == 1000
    assert [first[0]["utterance"], second[0]["utterance"]] == [1, 2]
    assert first[0]["format"] == "pcm" and len(first[1]) == 2 * 3 * int(0.2 * 24000)  # pcm: no header
    assert behaviour.spoken == ["First one.", "Second one."]
    wait_until(lambda: in_flight(client) == 0)


def test_config_right_after_audio_done_is_accepted_while_the_job_still_closes(open_client, behaviour, monkeypatch):
    """audio.done is the client's "between utterances": a session.config sent at once is taken even when the
    finished utterance's job is still giving its slot back (here: a close that takes 0.5 s)."""
    import asyncio

    from app.serving.speech import SpeechResult

    real = SpeechResult.aclose

    async def slow_close(self):
        await asyncio.sleep(0.5)
        await real(self)

    monkeypatch.setattr(SpeechResult, "aclose", slow_close)
    client = open_client()
    with client.websocket_connect(PATH) as ws:
        send(ws, "input.text", text="First one.")
        send(ws, "input.done")
        utterance(ws)
        send(ws, "session.config", response_format="wav")
        send(ws, "input.text", text="Second one.")
        send(ws, "input.done")
        start, audio, _ = utterance(ws)
    assert start["format"] == "wav" and audio[:4] == b"RIFF"  # the config took effect, no session_busy


def test_bad_messages_get_an_error_and_change_nothing(open_client, behaviour):
    client = open_client()
    with client.websocket_connect(PATH) as ws:
        ws.send_text("not json")
        assert error(ws)["code"] == "invalid_message"
        ws.send_bytes(b"\x00\x01")
        assert error(ws)["code"] == "invalid_message"
        send(ws, "input.speak", text="x")
        assert error(ws)["code"] == "unknown_type"
        send(ws, "session.config", speed=9)
        assert error(ws)["param"] == "speed"
        send(ws, "session.config", response_format="mp3")
        assert error(ws)["param"] == "response_format"
        send(ws, "session.config", voice="nobody", response_format="wav")
        assert error(ws)["code"] == "unknown_voice"
        send(ws, "session.config", model="gpt-9")
        assert error(ws)["code"] == "model_not_found"
        send(ws, "input.text")
        assert error(ws)["param"] == "text"
        send(ws, "input.done")
        assert error(ws)["code"] == "empty_input"
        send(ws, "input.text", text="Still pcm at 24 kHz.")
        send(ws, "session.config", response_format="wav")  # not while an utterance is open
        assert error(ws)["code"] == "session_busy"
        send(ws, "input.done")
        start, _, _ = utterance(ws)
    assert (start["format"], start["sample_rate"]) == ("pcm", 24000)  # no rejected config took effect
    assert behaviour.spoken == ["Still pcm at 24 kHz."]


def test_a_full_server_refuses_the_utterance_and_the_session_goes_on(open_client, behaviour):
    client = open_client(pool={"workers": 1, "max_queue": 0})
    with client.websocket_connect(PATH) as first, client.websocket_connect(PATH) as second:
        send(first, "input.text", text="Holding the only permit.")
        wait_until(lambda: in_flight(client) == 1)  # the utterance with text holds it, not the connection
        r = client.post("/v1/tts", json={"text": "hi"})
        assert r.status_code == 503  # an utterance's permit counts like a request's
        send(second, "input.text", text="No room for me yet.")
        event = second.receive_json()
        assert event["type"] == "error" and event["utterance"] == 1
        assert event["error"]["code"] == "overloaded" and event["error"]["retry_after_s"] >= 1
        send(second, "input.done")  # ends the refused utterance; the session stays open
        send(first, "input.done")
        utterance(first)
        wait_until(lambda: in_flight(client) == 0)
        send(second, "input.text", text="Now there is.")
        send(second, "input.done")
        start, _, _ = utterance(second)
        assert start["utterance"] == 2
    assert behaviour.spoken == ["Holding the only permit.", "Now there is."]
    wait_until(lambda: in_flight(client) == 0)


def test_text_limits_per_utterance_and_per_session(open_client, behaviour):
    client = open_client(server={"max_text_chars": 20}, websocket={"max_session_chars": 40})
    with client.websocket_connect(PATH) as ws:
        send(ws, "input.text", text="Twelve chars")
        send(ws, "input.text", text=" and far too many more")
        assert error(ws)["code"] == "text_too_long"
        send(ws, "input.done")  # the refused piece changed nothing
        utterance(ws)
        send(ws, "input.text", text="Eighteen chars ok.")
        send(ws, "input.done")
        utterance(ws)
        send(ws, "input.text", text="Eleven char")  # 12 + 18 + 11 > 40
        assert error(ws)["code"] == "session_text_limit"
    assert behaviour.spoken == ["Twelve chars", "Eighteen chars ok."]


def test_an_idle_session_is_closed_and_its_permit_released(open_client):
    client = open_client(websocket={"idle_timeout_s": 0.3})
    with client.websocket_connect(PATH) as ws:
        assert error(ws)["code"] == "idle_timeout"
        assert closed(ws) == 1000
    wait_until(lambda: in_flight(client) == 0)


def test_client_disconnect_cancels_the_engine_job(open_client, behaviour):
    behaviour.chunks, behaviour.chunk_delay_s = 200, 0.05  # 10 s per sentence
    client = open_client()
    with client.websocket_connect(PATH) as ws:
        send(ws, "input.text", text="A very long sentence.")
        send(ws, "input.done")
        assert ws.receive_json()["type"] == "audio.start"
        assert len(ws.receive_bytes()) > 0
    wait_until(lambda: len(behaviour.cancelled) == 1, timeout=5)
    assert behaviour.finished == []
    wait_until(lambda: in_flight(client) == 0)


def test_audio_sent_before_a_failure_counts_in_the_session_and_its_access_line(open_client, behaviour, caplog):
    behaviour.fail_at_chunk = 2  # two 0.2 s chunks, then the engine fails mid-utterance
    client = open_client()
    with caplog.at_level("INFO", logger="cosyserve.ws"), client.websocket_connect(PATH) as ws:
        send(ws, "input.text", text="Cut short.")
        send(ws, "input.done")
        assert ws.receive_json()["type"] == "audio.start"
        got = [ws.receive_bytes(), ws.receive_bytes()]
        assert error(ws)["code"] == "engine_failure"
        send(ws, "session.close")
        done = ws.receive_json()
        assert closed(ws) == 1000
    assert sum(map(len, got)) == 2 * 2 * int(0.2 * 24000)
    assert done == {"type": "session.done", "utterances": 1, "audio_seconds": 0.4}
    wait_until(lambda: any(" WS " in r.getMessage() for r in caplog.records))
    line = next(r.getMessage() for r in caplog.records if " WS " in r.getMessage())
    assert "audio=0.40s" in line


def test_drain_closes_idle_sessions_at_once_and_busy_ones_after_their_utterance(open_client, behaviour):
    behaviour.chunks, behaviour.chunk_delay_s = 10, 0.05  # 0.5 s per sentence
    client = open_client()
    runtime = client.app.state.runtime
    with client.websocket_connect(PATH) as idle, client.websocket_connect(PATH) as busy:
        send(busy, "input.text", text="Finish me.")
        send(busy, "input.done")
        assert busy.receive_json()["type"] == "audio.start"
        wait_until(lambda: len(runtime.sessions) == 2)
        forced = client.portal.call(runtime.sessions.drain, 10.0)
        assert forced == 0
        assert error(idle)["code"] == "draining"
        assert closed(idle) == 1001
        audio = bytearray()
        while True:
            m = busy.receive()
            if m.get("bytes") is not None:
                audio += m["bytes"]
                continue
            event = json.loads(m["text"])
            if event["type"] == "audio.done":
                break
        assert len(audio) == 2 * 10 * int(0.2 * 24000)  # the whole utterance
        assert error(busy)["code"] == "draining"
        assert closed(busy) == 1001


def test_drain_timeout_force_closes_a_session_and_cancels_its_job(open_client, behaviour):
    behaviour.chunks, behaviour.chunk_delay_s = 200, 0.05
    client = open_client()
    runtime = client.app.state.runtime
    with client.websocket_connect(PATH) as ws:
        send(ws, "input.text", text="Too long to finish.")
        send(ws, "input.done")
        assert ws.receive_json()["type"] == "audio.start"
        assert client.portal.call(runtime.sessions.drain, 0.3) == 1
        wait_until(lambda: len(behaviour.cancelled) == 1, timeout=5)
        while True:
            m = ws.receive()
            if m["type"] == "websocket.close":
                assert m["code"] == 1001
                break


def test_the_session_takes_the_request_id_by_the_same_rule_as_http(open_client):
    client = open_client()
    for sent, echoed in (("abc.1:2-3", True), ("has space", False), ("x" * 129, False)):
        with client.websocket_connect(PATH, headers={"X-Request-ID": sent}) as ws:
            send(ws, "nonsense")
            rid = error(ws)["request_id"]
            assert (rid == sent) is echoed and (echoed or len(rid) == 32)
        http = client.get("/v1/speakers", headers={"X-Request-ID": sent}).headers["x-request-id"]
        assert (http == sent) is echoed
