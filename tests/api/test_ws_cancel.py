"""input.cancel on WS /v1/audio/speech/stream (barge-in), over the real app and pool with FakeEngines.

The fake engine speaks streamed text sentence by sentence; these tests make a sentence
long (200 chunks, 50 ms apart: 10 s) so that the cancel lands while it is spoken.
"""

from __future__ import annotations

import json

from tests.support.metrics import scrape, value
from tests.support.waiting import wait_until
from tests.support.ws import PATH, in_flight, send, utterance

CANCELS = "tts_ws_cancels_total"


def long_sentences(behaviour) -> None:
    behaviour.chunks, behaviour.chunk_delay_s = 200, 0.05


def short_sentences(behaviour) -> None:
    behaviour.chunks, behaviour.chunk_delay_s = 3, 0.0


def until_event(ws) -> tuple[int, dict]:
    """(audio frames received first, the next event): the frames were in flight when the cancel came."""
    frames = 0
    while True:
        m = ws.receive()
        if m.get("bytes") is not None:
            frames += 1
            continue
        return frames, json.loads(m["text"])


def speaking(ws, text: str) -> None:
    """Send one utterance and wait until its audio is flowing."""
    send(ws, "input.text", text=text)
    send(ws, "input.done")
    assert ws.receive_json()["type"] == "audio.start"
    assert len(ws.receive_bytes()) > 0


def test_cancel_stops_the_utterance_releases_its_permit_and_the_session_goes_on(open_client, behaviour):
    long_sentences(behaviour)
    client = open_client()
    with client.websocket_connect(PATH) as ws:
        speaking(ws, "A very long sentence.")
        assert in_flight(client) == 1
        send(ws, "input.cancel")
        _, ack = until_event(ws)  # audio frames already on their way may come first, never after it
        assert ack == {"type": "audio.cancelled", "utterance": 1, "utterances": [1]}
        assert in_flight(client) == 0  # acknowledged once the job has given its permit back
        assert behaviour.cancelled == [behaviour.started[0]] and behaviour.finished == []
        short_sentences(behaviour)
        send(ws, "session.config", response_format="wav")  # between utterances again
        send(ws, "input.text", text="Next one.")
        send(ws, "input.done")
        start, audio, done = utterance(ws)  # fails on any audio frame before audio.start
    assert (start["utterance"], start["format"], done["utterance"]) == (2, "wav", 2)
    assert audio[:4] == b"RIFF" and len(audio) == 44 + 2 * 3 * int(0.2 * 24000)
    assert behaviour.spoken == ["A very long sentence.", "Next one."]
    wait_until(lambda: in_flight(client) == 0)
    assert value(scrape(client), CANCELS, target="utterance") == 1


def test_cancel_with_nothing_in_progress_is_acknowledged_and_changes_nothing(open_client, behaviour):
    client = open_client()
    with client.websocket_connect(PATH) as ws:
        send(ws, "input.cancel")
        assert ws.receive_json() == {"type": "audio.cancelled", "utterance": None, "utterances": []}
        send(ws, "input.text", text="Spoken whole.")
        send(ws, "input.done")
        start, _, done = utterance(ws)
        send(ws, "input.cancel")  # after audio.done: too late, nothing is dropped
        assert ws.receive_json() == {"type": "audio.cancelled", "utterance": None, "utterances": []}
        send(ws, "session.close")
        assert ws.receive_json() == {"type": "session.done", "utterances": 1, "audio_seconds": 0.6}
    assert (start["utterance"], done["audio_seconds"]) == (1, 0.6)
    samples = scrape(client)
    assert value(samples, CANCELS, target="none") == 2 and value(samples, CANCELS, target="utterance") == 0


def test_cancel_drops_the_queued_utterances_and_the_one_taking_text(open_client, behaviour):
    long_sentences(behaviour)
    client = open_client()
    with client.websocket_connect(PATH) as ws:
        speaking(ws, "The first, being spoken.")
        send(ws, "input.text", text="The second, queued.")
        send(ws, "input.done")
        send(ws, "input.text", text="The third, still being wri")
        send(ws, "input.cancel")
        _, ack = until_event(ws)
        assert ack == {"type": "audio.cancelled", "utterance": 1, "utterances": [1, 2, 3]}
        short_sentences(behaviour)
        send(ws, "input.text", text="The fourth.")
        send(ws, "input.done")
        start, _, _ = utterance(ws)
        assert start["utterance"] == 4
    assert behaviour.spoken == ["The first, being spoken.", "The fourth."]  # 2 and 3 never reached the engine
    wait_until(lambda: in_flight(client) == 0)


def test_cancel_of_an_utterance_waiting_for_its_text(open_client, behaviour):
    client = open_client()
    with client.websocket_connect(PATH) as ws:
        send(ws, "input.text", text="Half a sent")  # the job runs, the engine waits for a sentence end
        wait_until(lambda: len(behaviour.started) == 1)
        assert in_flight(client) == 1
        send(ws, "input.cancel")
        assert ws.receive_json() == {"type": "audio.cancelled", "utterance": 1, "utterances": [1]}
        assert in_flight(client) == 0
        send(ws, "input.text", text="A whole one.")
        send(ws, "input.done")
        start, _, _ = utterance(ws)
    assert start["utterance"] == 2 and behaviour.spoken[-1] == "A whole one."
    assert behaviour.cancelled == [behaviour.started[0]]


def test_cancel_while_queued_for_a_slot_leaves_the_queue(open_client, behaviour):
    import threading

    behaviour.gate = threading.Event()  # every synthesis waits for it: the one worker stays busy
    client = open_client(pool={"workers": 1, "max_queue": 2})
    with client.websocket_connect(PATH) as first, client.websocket_connect(PATH) as second:
        send(first, "input.text", text="Holding the worker.")
        wait_until(lambda: len(behaviour.started) == 1)
        send(second, "input.text", text="Waiting for it.")
        send(second, "input.done")
        wait_until(lambda: in_flight(client) == 2)
        send(second, "input.cancel")
        assert second.receive_json() == {"type": "audio.cancelled", "utterance": 1, "utterances": [1]}
        assert in_flight(client) == 1  # the queued one left at once; the running one is untouched
        behaviour.gate.set()
        send(first, "input.done")
        start, _, _ = utterance(first)
    assert start["utterance"] == 1 and len(behaviour.started) == 1
    wait_until(lambda: in_flight(client) == 0)
