"""Every mode of CosyVoice v1, v2 and v3 on a user's upstream CosyVoice checkout (``engine.cosyvoice_path``).

CI cannot fetch upstream, so this runs only when asked: ``make test-upstream
UPSTREAM=/path/to/CosyVoice`` (marker ``upstream``, deselected by default). Everything
runs in subprocesses because the checkout must be first on ``sys.path`` before any
``cosyvoice`` import; the tiny CosyVoice3 dir is built there too (the installed
distribution has no v3 classes).

* the adapter alone, every mode, streaming and not, batched LLM and not; batched decoding
  equals upstream's own ``llm.inference`` token for token;
* a live ``cosyserve serve`` per model and batching setting: every mode ``/v1/speakers``
  lists, over ``/v1/tts`` streaming and not, plus a library voice with instructions over
  the OpenAI route.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf

from tests.support.paths import CACHE, ROOT
from tests.support.server import ServerProcess
from tests.support.sounds import speechlike

pytestmark = [pytest.mark.upstream, pytest.mark.integration]

MODES = {1: "sft,zero_shot,cross_lingual,vc", 2: "sft,zero_shot,cross_lingual,instruct2,vc",
         3: "sft,zero_shot,cross_lingual,instruct2,vc"}

SCRIPT = r"""
import sys, threading
from app.engines.base import PromptAudio, SynthesisRequest
from app.engines.cosyvoice.engine import CosyVoiceEngine
from tests.support import configs
from tests.support.sounds import speechlike
model_dir, upstream, modes, batching = sys.argv[1], sys.argv[2], sys.argv[3].split(","), sys.argv[4] == "1"
eng = CosyVoiceEngine(configs.engine(model_dir=model_dir, cosyvoice_path=upstream, batching=batching, llm_greedy=batching))
eng.load()
eng.warmup()  # a v3 dir with preset speakers warms up with sft (needs the system prompt)
assert eng.batching == batching
import cosyvoice
assert cosyvoice.__file__.startswith(upstream), cosyvoice.__file__
prompt = PromptAudio(speechlike(3.0), 16000)
kw = {"sft": dict(speaker="tiny_female"), "zero_shot": dict(prompt_text="hello there my friend", prompt_audio=prompt),
      "cross_lingual": dict(prompt_audio=prompt), "instruct2": dict(prompt_audio=prompt, instruct_text="Speak happily."),
      "vc": dict(prompt_audio=prompt, source_audio=PromptAudio(speechlike(2.0, seed=2), 16000))}
assert set(eng.modes()) == set(modes), eng.modes()
for mode in modes:
    for stream in (False, True):
        chunks = list(eng.synthesize(SynthesisRequest(text="Hello there, this is test 1.", mode=mode, stream=stream, **kw[mode]), threading.Event()))
        seconds = sum(c.duration_s for c in chunks)
        assert chunks and seconds > 0.2, (mode, stream, seconds)
        if mode == "sft":  # stop-calibrated: the tiny LLM stops right after CosyVoice's 2x-text-tokens minimum
            from app.engines.cosyvoice.prompts import speech_text
            version = int(eng.info().family[-1])
            n = eng.inputs.text_tokens(speech_text(version, mode, "Hello there, this is test one."))
            tokens = seconds / (0.02 if version == 1 else 0.04)
            assert 2 * n - 2 <= tokens <= 2.5 * n + 5, (version, stream, n, tokens)
        print(mode, stream, len(chunks), round(seconds, 2))
if batching:  # upstream's own llm.inference alone == our batched decoding, token for token
    import torch
    from tests.support.llm_reference import llm_inputs, make_scheduler, reference, submit
    reqs = [SynthesisRequest(text=t, mode="zero_shot", **kw["zero_shot"]) for t in ("Hello there.", "A longer sentence to decode here.")]
    inputs = [llm_inputs(eng, r) for r in reqs]
    lm, sched = make_scheduler(eng)
    seqs = [submit(lm, sched, mi) for mi in inputs]
    for seq, mi in zip(seqs, inputs):
        seq.wait_for(1 << 30, timeout=120)
        assert seq.tokens == reference(eng, mi)[0]
    sched.stop()
"""


@pytest.fixture(scope="module")
def upstream() -> str:
    path = os.environ.get("COSYSERVE_TEST_UPSTREAM", "")
    assert path and (Path(path) / "cosyvoice").is_dir(), "set COSYSERVE_TEST_UPSTREAM to a CosyVoice checkout"
    return str(Path(path).resolve())


@pytest.fixture(scope="module")
def model_dirs(tiny_models, upstream):
    """``get(version)``: v1/v2 built here, v3 built in a subprocess that imports the checkout."""
    built: dict[int, Path] = {}

    def get(version: int) -> Path:
        if version not in built:
            if version < 3:
                built[version] = tiny_models(version)
            else:
                code = ("import sys; from app.devmodels.tiny import ensure_tiny_model; "
                        "print(ensure_tiny_model(sys.argv[1], 3, cosyvoice_path=sys.argv[2]))")
                out = subprocess.run([sys.executable, "-c", code, str(CACHE), upstream], cwd=ROOT,
                                     capture_output=True, text=True, timeout=600, check=False)
                assert out.returncode == 0, out.stderr[-4000:]
                built[version] = Path(out.stdout.strip().splitlines()[-1])
        return built[version]

    return get


@pytest.mark.parametrize("version, batching", [(1, "0"), (2, "0"), (2, "1"), (3, "0"), (3, "1")],
                         ids=["v1", "v2", "v2-batched", "v3", "v3-batched"])
def test_every_mode_through_the_adapter(model_dirs, upstream, version, batching):
    modes = MODES[version]
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(model_dirs(version)), upstream, modes, batching],
                         cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-4000:]
    assert len(out.stdout.splitlines()) == 2 * len(modes.split(","))


def test_published_v3_layout_loads_and_speaks(model_dirs, upstream, tmp_path):
    """The tiny v3 files in a dir with the extras the real release ships (see test_v3_layout.py)."""
    import shutil

    from tests.support.paths import PUBLISHED_V3

    model_dir = tmp_path / "Fun-CosyVoice3-0.5B"
    shutil.copytree(model_dirs(3), model_dir)
    for name in PUBLISHED_V3:
        path = model_dir / name
        if not path.exists() and not name.startswith("CosyVoice-BlankEN/"):  # the tiny Qwen2 dir stays as built
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"not read by cosyserve")
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(model_dir), upstream, MODES[3], "0"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-4000:]


def _wav(seconds: float, seed: int = 0) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, speechlike(seconds, seed=seed), 16000, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def _fields(mode: str) -> tuple[dict, dict]:
    data = {"text": "Hello there, I have 5 apples.", "mode": mode}
    files = {}
    if mode == "sft":
        data["speaker"] = "tiny_female"
    if mode in ("zero_shot", "cross_lingual", "instruct2", "vc"):
        files["prompt_audio"] = ("prompt.wav", _wav(3.0), "audio/wav")
    if mode == "zero_shot":
        data["prompt_text"] = "hello there my friend"
    if mode == "instruct2":
        data["instruct_text"] = "Speak happily."
    if mode == "vc":
        files["source_audio"] = ("source.wav", _wav(2.0, seed=2), "audio/wav")
    return data, files


@pytest.mark.e2e
@pytest.mark.parametrize("version, batching", [(1, False), (2, False), (2, True), (3, False), (3, True)],
                         ids=["v1", "v2", "v2-batched", "v3", "v3-batched"])
def test_every_mode_through_a_live_server(model_dirs, upstream, tmp_path, version, batching):
    config = {
        "engine": {"model_dir": str(model_dirs(version)), "cosyvoice_path": upstream, "batching": batching},
        "pool": {"workers": 2, "max_queue": 2, "queue_timeout_s": 120, "request_timeout_s": 300},
        "voices": {"dir": str(tmp_path / "voices")},
    }
    with ServerProcess(tmp_path, config) as srv, httpx.Client(base_url=srv.base_url, timeout=300) as http:
        assert f"CosyVoice code from {upstream}" in srv.log()  # the checkout, not the installed copy
        info = http.get("/v1/speakers").json()
        assert info["modes"] and set(info["modes"]) == set(MODES[version].split(",")), info
        rate = info["sample_rate"]
        for mode in info["modes"]:
            data, files = _fields(mode)
            r = http.post("/v1/tts", data={**data, "format": "wav"}, files=files or None)
            assert r.status_code == 200, (mode, r.text)
            audio, got = sf.read(io.BytesIO(r.content), dtype="int16")
            assert got == rate and len(audio) > 0.2 * rate and np.abs(audio).max() > 0, mode
            with http.stream("POST", "/v1/tts", data={**data, "stream": "true", "format": "pcm"},
                             files=files or None) as s:
                assert s.status_code == 200, (mode, s.read())
                pcm = np.frombuffer(b"".join(s.iter_bytes()), dtype="<i2")
            assert len(pcm) > 0.2 * rate, (mode, len(pcm))
        if "instruct2" in info["modes"]:  # OpenAI instructions on a library voice -> instruct2 (v3: its format)
            r = http.post("/v1/voices", data={"name": "narrator", "transcript": "hello there my friend"},
                          files={"audio": ("narrator.wav", _wav(3.0), "audio/wav")})
            assert r.status_code in (200, 201), r.text
            r = http.post("/v1/audio/speech", json={"model": "tts-1", "input": "I have 5 apples.", "voice": "narrator",
                                                    "instructions": "Speak slowly.", "response_format": "wav"})
            assert r.status_code == 200, r.text
            audio, got = sf.read(io.BytesIO(r.content), dtype="int16")
            assert got == rate and len(audio) > 0.2 * rate
        health = http.get("/health/ready")
        assert health.status_code == 200


T2W_SCRIPT = r"""
import sys
import torch
from app.engines.cosyvoice.engine import CosyVoiceEngine
from tests.support import configs
model_dir, upstream = sys.argv[1], sys.argv[2]
engines = {}
for batch in ("off", "on"):
    eng = CosyVoiceEngine(configs.engine(model_dir=model_dir, cosyvoice_path=upstream, batching=True, llm_greedy=True,
                                          token2wav_batch=batch))
    eng.load()
    engines[batch] = eng
import cosyvoice
assert cosyvoice.__file__.startswith(upstream), cosyvoice.__file__
from app.engines.cosyvoice.flow.batch import BatchedFlow
from tests.support.flow_batches import (MIX, assert_exact, assert_same_audio, deterministic_hift, every_mode,
                                        item, pcm, reference)
flow = engines["off"].loaded.model.flow
items = [item(n, p, streaming=s, finalize=f, seed=i) for i, (n, p, s, f) in enumerate(MIX)]
with torch.inference_mode():
    got = BatchedFlow(flow)(items)
for it, mel in zip(items, got):
    assert_exact(mel, reference(flow, it))
with deterministic_hift(*engines.values()):
    for index in range(5):
        for stream in (False, True):
            want, have = every_mode(engines["off"])[index], every_mode(engines["on"])[index]
            want.stream = have.stream = stream
            assert_same_audio(pcm(engines["on"], have), pcm(engines["off"], want))
            print(want.mode, stream)
assert engines["on"].flow_stats()["jobs"] > 0
"""


@pytest.mark.parametrize("version", [2, 3], ids=["v2", "v3"])
def test_batched_token2wav_equals_the_per_request_path(model_dirs, upstream, version):
    """BatchedFlow against upstream's own flow.inference (v3: the DiT flow), then every mode through both engines."""
    out = subprocess.run([sys.executable, "-c", T2W_SCRIPT, str(model_dirs(version)), upstream],
                         cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)
    assert out.returncode == 0, out.stderr[-4000:]
    assert len(out.stdout.splitlines()) == 10


SEEDED_SCRIPT = r"""
import sys
from app.engines.base import PromptAudio
from app.engines.cosyvoice.engine import CosyVoiceEngine
from app.settings import Settings, runtime
from tests.support.seeded import check_repeats
from tests.support.sounds import speechlike
model_dir, upstream = sys.argv[1], sys.argv[2]
settings = Settings(engine={"model_dir": model_dir, "cosyvoice_path": upstream, "torch_threads": 1})
eng = CosyVoiceEngine(runtime.engine_config(settings, model_dir))  # the defaults a user gets (batched LLM)
eng.load()
import cosyvoice
assert cosyvoice.__file__.startswith(upstream), cosyvoice.__file__
assert eng.runner is not None
for stream in (False, True):
    print(check_repeats(eng, PromptAudio(speechlike(3.0), 16000), stream=stream))
"""


@pytest.mark.parametrize("version", [2, 3], ids=["v2", "v3"])
def test_a_seeded_request_gives_the_same_bytes(model_dirs, upstream, version):
    """Issue 51's goal on the checkout's classes: 10 runs alone and 10 beside four others, whole and
    streamed, give the same PCM bytes (tests/support/seeded.py)."""
    out = subprocess.run([sys.executable, "-c", SEEDED_SCRIPT, str(model_dirs(version)), upstream],
                         cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)
    assert out.returncode == 0, out.stderr[-4000:]
    lines = out.stdout.splitlines()
    assert len(lines) == 2 and all("'alone': 10, 'beside': 10" in line for line in lines), lines
