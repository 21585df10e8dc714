"""The playground in a real headless Chromium against a live `cosyserve serve` on tiny CosyVoice2, keys on.

Debian's ``chromium`` driven by the ``playwright`` package with ``executable_path``
(no browser download); ``make test`` installs both (``setup`` and ``test-deps``).
The server runs the *long* tiny model so a stream arrives in several pieces and the
test can see playback start before the stream ends.

``COSYSERVE_PLAYGROUND_SCREENSHOT=docs/img/playground.png pytest tests/integration/api/test_playground_browser.py``
also writes the screenshot shown in the docs.
"""

from __future__ import annotations

import io
import os
import shutil
from pathlib import Path

import httpx
import pytest
import soundfile as sf

from tests.support.server import ServerProcess
from tests.support.sounds import speechlike

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

KEY = "sk-browser-Wm3Kd8Qs5Ty2"
RATE = 24000
TIMEOUT_MS = 120_000
TEXT = "Hello from the browser, as it streams."  # the long tiny model speaks ~9x the text's length


def chromium_path() -> str:
    path = os.environ.get("COSYSERVE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("Debian chromium is not installed: run `make test-deps` (apt-get install chromium)")
    return path


@pytest.fixture(scope="module")
def server(tiny_models, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("playground")
    config = {
        "engine": {"model_dir": str(tiny_models(2, long=True)), "torch_threads": 1},
        "pool": {"workers": 2, "max_queue": 2, "queue_timeout_s": 60, "request_timeout_s": 120},
        "server": {"api_keys": [KEY], "drain_timeout_s": 30},
        "voices": {"dir": str(tmp / "voices")},
    }
    with ServerProcess(tmp, config) as srv:
        yield srv


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), args=[
            "--autoplay-policy=no-user-gesture-required",
            "--use-fake-ui-for-media-stream",      # grant the microphone without a prompt
            "--use-fake-device-for-media-stream",  # ... and make it a test tone generator
        ])
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def page(browser, server):
    """One page for the module's tests, in order: ask for a key, speak, register, record."""
    context = browser.new_context(viewport={"width": 960, "height": 860})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(server.base_url + "/")
    yield page
    context.close()
    assert not errors, errors


def state(page) -> str:
    return page.get_attribute("body", "data-state")


def wait_state(page, *states: str) -> str:
    wanted = " || ".join(f"document.body.dataset.state === {s!r}" for s in states)
    page.wait_for_function(wanted, timeout=TIMEOUT_MS)
    return state(page)


def stats(page) -> dict:
    data = page.eval_on_selector("#stats", "el => ({...el.dataset})")
    text = {k: page.text_content(f"#stat-{k}") for k in ("ttfa", "rtf", "audio", "samples", "bytes", "total", "class")}
    return {**data, **text}


def speak(page, fmt: str = "pcm") -> dict:
    page.select_option("#format", fmt)
    page.click("#speak")
    assert wait_state(page, "done", "error") == "done", page.text_content("#status")
    return stats(page)


def prompt_wav_bytes() -> bytes:
    buf = io.BytesIO()
    sf.write(buf, speechlike(3.0, 16000, seed=3), 16000, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def test_the_page_asks_for_a_key_and_refuses_a_wrong_one(page):
    assert wait_state(page, "needs-key") == "needs-key"
    assert page.is_visible("#key-panel")
    page.fill("#api-key", "sk-not-the-key")
    page.click("#save-key")
    page.wait_for_function("document.getElementById('key-message').textContent.includes('refused')",
                           timeout=TIMEOUT_MS)
    assert state(page) == "needs-key"
    page.fill("#api-key", KEY)
    page.click("#save-key")
    assert wait_state(page, "idle") == "idle"
    assert not page.is_visible("#key-panel")
    assert "24000 Hz" in page.text_content("#model")
    presets = page.eval_on_selector_all("#voice optgroup[label='Preset speakers'] option", "os => os.map(o => o.value)")
    assert presets and all(v.startswith("speaker:") for v in presets)
    modes = page.eval_on_selector_all("#mode option", "os => os.map(o => o.value)")
    assert "zero_shot" in modes and "sft" in modes


def test_streamed_pcm_is_decoded_and_plays_before_the_stream_ends(page):
    page.fill("#text", TEXT)
    s = speak(page, "pcm")
    samples = int(s["samples"])
    assert samples > 0.5 * RATE
    assert abs(float(s["audio"].split()[0]) - samples / RATE) < 0.01
    assert int(s["bytes"]) == 2 * samples  # every byte received became a sample
    assert int(s["pieces"]) >= 2
    ttfa, total, first_play = float(s["ttfa"].split()[0]), float(s["total"].split()[0]), float(s["firstPlayMs"])
    assert 0 < ttfa <= first_play < total  # the first piece was queued to play while the rest streamed in
    assert float(s["rtf"]) > 0
    shot = os.environ.get("COSYSERVE_PLAYGROUND_SCREENSHOT")
    if shot:
        page.screenshot(path=str(Path(shot)), full_page=True)


def test_a_whole_file_format_is_decoded_by_the_browser(page):
    page.fill("#text", "A short one.")
    s = speak(page, "wav")
    assert int(s["samples"]) > 0 and float(s["audio"].split()[0]) > 0.2
    assert page.is_visible("#player") and page.get_attribute("#download", "download") == "speech.wav"
    page.select_option("#format", "pcm")


def test_the_class_selector_is_sent_and_the_class_shown_with_the_result(page):
    assert page.eval_on_selector_all("#priority option", "os => os.map(o => o.value)") == ["interactive", "bulk"]
    page.fill("#text", "A short one.")
    assert speak(page, "pcm")["class"] == "interactive"
    page.select_option("#priority", "bulk")
    assert speak(page, "pcm")["class"] == "bulk"  # the class the server answered with (X-Priority)
    assert "(bulk)" in page.text_content("#status")
    page.select_option("#priority", "interactive")


def test_register_a_voice_by_upload_and_speak_with_it(page, server):
    page.fill("#voice-name", "browser_voice")
    page.fill("#voice-transcript", "My voice.")
    page.set_input_files("#voice-file", files=[{"name": "me.wav", "mimeType": "audio/wav",
                                                "buffer": prompt_wav_bytes()}])
    page.click("#register")
    page.wait_for_selector("#register-status[data-registered='browser_voice']", timeout=TIMEOUT_MS)
    assert page.input_value("#voice") == "voice:browser_voice"
    listed = httpx.get(server.base_url + "/v1/voices", headers={"X-API-Key": KEY}, timeout=10).json()
    assert [v["name"] for v in listed["voices"]] == ["browser_voice"]
    assert abs(listed["voices"][0]["duration_s"] - 3.0) < 0.05
    page.fill("#text", "Now in my voice.")
    assert int(speak(page, "pcm")["samples"]) > 0


def test_a_bad_registration_shows_the_servers_message(page):
    page.fill("#voice-name", "bad name!")
    page.click("#register")
    page.wait_for_function("document.getElementById('register-status').className === 'error'", timeout=TIMEOUT_MS)
    assert "name must be" in page.text_content("#register-status")


def test_record_a_voice_with_the_microphone(page, server):
    page.fill("#voice-name", "recorded_voice")
    page.fill("#voice-transcript", "A recording from the fake microphone.")
    page.click("#record")
    page.wait_for_function("document.getElementById('record').textContent === 'Stop recording'")
    page.wait_for_timeout(2500)  # the recording's length: the server wants at least a second of audio
    page.click("#record")
    page.wait_for_selector("#record-status[data-recorded='yes']", timeout=10_000)
    page.click("#register")
    page.wait_for_selector("#register-status[data-registered='recorded_voice']", timeout=TIMEOUT_MS)
    card = httpx.get(server.base_url + "/v1/voices/recorded_voice", headers={"X-API-Key": KEY}, timeout=10).json()
    assert 1.5 < card["duration_s"] < 4.0


def test_the_key_is_remembered_across_reloads(page):
    page.reload()
    assert wait_state(page, "idle", "needs-key") == "idle"
    assert page.evaluate("localStorage.getItem('cosyserve.apiKey')") == KEY
    options = page.eval_on_selector_all("#voice optgroup[label='Library voices'] option", "os => os.map(o => o.value)")
    assert options == ["voice:browser_voice", "voice:recorded_voice"]


# -- keys off, and CORS as a browser enforces it: two quick fake-engine servers ------------------

FAKE_KEY = "sk-fake-Lp6Ve1Xn3Cu8"
FAKE_SAMPLES = 3 * 4800  # FakeBehaviour: 3 chunks of 0.2 s at 24 kHz


def fake_server(tmp, server: dict) -> ServerProcess:
    return ServerProcess(tmp, {"dev": {"fake_engine": True}, "pool": {"workers": 1, "max_queue": 1},
                               "server": {"drain_timeout_s": 5, **server}, "voices": {"dir": str(tmp / "voices")}})


@pytest.fixture(scope="module")
def open_server(tmp_path_factory):
    with fake_server(tmp_path_factory.mktemp("open"), {}) as srv:
        yield srv


@pytest.fixture(scope="module")
def cors_server(tmp_path_factory, server):
    """Keys on, and pages served by the tiny server's origin may call it."""
    with fake_server(tmp_path_factory.mktemp("cors"), {"api_keys": [FAKE_KEY], "cors_origins": [server.base_url]}) as srv:
        yield srv


def test_with_keys_off_the_page_never_asks_and_decodes_every_sample(browser, open_server):
    context = browser.new_context()
    page = context.new_page()
    try:
        page.goto(open_server.base_url + "/")
        assert wait_state(page, "idle", "needs-key") == "idle"
        assert not page.is_visible("#key-panel")
        page.fill("#text", "One sentence from the fake engine.")
        s = speak(page, "pcm")
        assert int(s["samples"]) == FAKE_SAMPLES and int(s["bytes"]) == 2 * FAKE_SAMPLES
        assert s["audio"] == "0.60 s"
    finally:
        context.close()


FETCH = """async ([url, headers]) => {
  try {
    const r = await fetch(url, {method: "POST", headers: {"Content-Type": "application/json", ...headers},
                                body: JSON.stringify({text: "Across origins.", format: "pcm"})});
    const body = r.headers.get("content-type").startsWith("application/json") ? await r.json()
                                                                              : (await r.arrayBuffer()).byteLength;
    return {status: r.status, body, rate: r.headers.get("X-Sample-Rate"),
            challenge: r.headers.get("WWW-Authenticate")};
  } catch (err) {
    return {blocked: err.name};
  }
}"""


def test_cors_lets_a_page_on_an_allowed_origin_call_and_read_the_401(page, server, cors_server, open_server):
    """The playground page (the tiny server's origin) calls two other origins from inside Chromium."""
    page.goto(server.base_url + "/")
    url = cors_server.base_url + "/v1/tts"
    ok = page.evaluate(FETCH, [url, {"Authorization": f"Bearer {FAKE_KEY}"}])  # a preflighted request
    assert ok == {"status": 200, "body": 2 * FAKE_SAMPLES, "rate": "24000", "challenge": None}
    refused = page.evaluate(FETCH, [url, {}])
    assert refused["status"] == 401 and refused["challenge"] == 'Bearer realm="cosyserve"'
    assert refused["body"]["error"]["code"] == "missing_api_key"
    # a server without server.cors_origins: the browser itself refuses to hand over the answer
    assert page.evaluate(FETCH, [open_server.base_url + "/v1/tts", {}]) == {"blocked": "TypeError"}
