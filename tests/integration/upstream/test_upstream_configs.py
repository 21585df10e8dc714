"""Upstream's own example configs (``examples/libritts/*/conf``) over weights of the real dimensions.

A released dir's config is upstream's training config; these are the closest thing CI-free
tests can hold. Each is copied unchanged into a model dir next to weights of its dimensions,
loaded strictly by the server's own loader (``strict=True`` state dicts), with the default
install (no pyarrow / pyworld: the data pipeline meets the training-only stand-in):

* v2 (``cosyvoice2.yaml``): the full-size random-weight builder's weights (CosyVoice2-0.5B's
  dimensions; ``COSYSERVE_FULLSIZE_DIR``, else ``.cache/full2``, built there if missing, ~3.4 GB).
  A real ``cosyserve serve`` answers one request, with the installed CosyVoice (the default
  install, the PyPI copy) and with the checkout.
* v1 (``cosyvoice.yaml``) and v3 (``cosyvoice3.yaml``): no builder writes their real
  dimensions, so the weights are the config's own random init (drawn by the checkout, saved
  as ``llm.pt`` / ``flow.pt`` / ``hift.pt``). v1 serves one request; v3 loads and tokenizes
  (its LLM, random at 0.5B, would decode to CosyVoice3's 20x-text cap through a 22-layer DiT:
  minutes per request on a CPU). v3's Qwen2 is the full-size dir's, with the tiny v3 tokenizer
  (numbered like Qwen2's, so ``<|endofprompt|>`` is 151646).

Marked ``upstream`` (``make test-upstream UPSTREAM=...``): needs the checkout, and minutes.
"""

from __future__ import annotations

import io
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf

from app.engines.cosyvoice import layout
from tests.support.paths import CACHE, ROOT
from tests.support.server import ServerProcess

pytestmark = [pytest.mark.upstream, pytest.mark.integration, pytest.mark.slow]

EXAMPLES = {1: "examples/libritts/cosyvoice/conf/cosyvoice.yaml", 2: "examples/libritts/cosyvoice2/conf/cosyvoice2.yaml",
            3: "examples/libritts/cosyvoice3/conf/cosyvoice3.yaml"}
FULL_DIR = ROOT / ".cache" / "full2"
STAND_IN_LOG = "cosyvoice.dataset.processor does not import"

# The config's own modules, drawn by the checkout, saved as the dir's weights (fp32, like a release).
DRAW = r"""
import logging, sys
logging.basicConfig(level=logging.INFO)
from pathlib import Path
import torch
from app.engines.cosyvoice.shims import prepare_imports
from app.engines.cosyvoice.layout import CONFIG_FILES, WEIGHT_FILES
from app.engines.cosyvoice.model_config import read_model_config
model_dir, upstream, version = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
prepare_imports(upstream)
path = model_dir / CONFIG_FILES[version]
configs = read_model_config(path.read_text(), model_dir=model_dir, version=version, name=str(path))
for key, name in WEIGHT_FILES.items():
    torch.save(configs[key].float().state_dict(), model_dir / name)
"""

# The server's loader on the dir: strict, the checkout's code; what a v3 request's text becomes.
CHECK = r"""
import logging, sys
logging.basicConfig(level=logging.INFO)
from app.engines.cosyvoice.layout import ENDOFPROMPT_ID
from app.engines.cosyvoice.load import load_model_dir
lm = load_model_dir(sys.argv[1], cosyvoice_path=sys.argv[2])
import cosyvoice
assert cosyvoice.__file__.startswith(sys.argv[2]), cosyvoice.__file__
count = lambda m: sum(p.numel() for p in m.parameters())
ids = lm.frontend._extract_text_token("You are a helpful assistant.<|endofprompt|>Hello there.")[0][0].tolist()
print(lm.version, type(lm.model).__name__, count(lm.model.llm), count(lm.model.flow), ENDOFPROMPT_ID in ids, lm.tiny)
"""


@pytest.fixture(scope="module")
def upstream() -> str:
    path = os.environ.get("COSYSERVE_TEST_UPSTREAM", "")
    assert path and (Path(path) / "cosyvoice").is_dir(), "set COSYSERVE_TEST_UPSTREAM to a CosyVoice checkout"
    return str(Path(path).resolve())


@pytest.fixture(scope="module")
def full_dir() -> Path:
    """The full-size random-weight v2 dir (COSYSERVE_FULLSIZE_DIR, else .cache/full2, built once)."""
    path = Path(os.environ.get("COSYSERVE_FULLSIZE_DIR") or FULL_DIR)
    if not (path / layout.TINY_MARKER).is_file():
        subprocess.run([sys.executable, "-m", "app.cli", "make-tiny-model", "--version", "2", "--full-size", str(path)],
                       cwd=ROOT, check=True, timeout=1800)
    assert layout.read_tiny_marker(path).get("full_size") is True, path
    return path


def _run(code: str, *argv: str) -> str:
    out = subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, capture_output=True, text=True, timeout=1800,
                         check=False)
    assert out.returncode == 0, out.stderr[-4000:]
    assert STAND_IN_LOG in out.stderr  # the config's data pipeline met the training-only stand-in
    return out.stdout


def _link(src: Path, dst: Path) -> None:
    """Symlink ``src`` (a file or every file of a dir) as ``dst``: the weights are read, never written."""
    if src.is_dir():
        dst.mkdir(parents=True, exist_ok=True)
        for p in src.iterdir():
            (dst / p.name).symlink_to(p.resolve())
    else:
        dst.symlink_to(src.resolve())


def _dir_with_config(root: Path, upstream: str, version: int) -> Path:
    model_dir = root / f"upstream-conf-v{version}"
    model_dir.mkdir()
    shutil.copyfile(Path(upstream) / EXAMPLES[version], model_dir / layout.CONFIG_FILES[version])
    return model_dir


def _serve_one_request(tmp: Path, model_dir: Path, cosyvoice_path: str | None, speaker: str) -> str:
    config = {
        "engine": {"model_dir": str(model_dir), "cosyvoice_path": cosyvoice_path},
        "pool": {"workers": 1, "max_queue": 1, "queue_timeout_s": 600, "request_timeout_s": 600},
        "voices": {"dir": str(tmp / "voices")},
    }
    srv = ServerProcess(tmp, config).start(timeout=900)
    try:
        with httpx.Client(base_url=srv.base_url, timeout=600) as http:
            info = http.get("/v1/speakers").json()
            assert speaker in info["speakers"], info
            r = http.post("/v1/tts", data={"text": "Hello there.", "mode": "sft", "speaker": speaker, "format": "wav"})
            assert r.status_code == 200, r.text
            audio, rate = sf.read(io.BytesIO(r.content), dtype="int16")
            assert rate == info["sample_rate"] and len(audio) > 0.1 * rate and np.abs(audio).max() > 0
        return srv.log()
    finally:
        srv.stop()


@pytest.mark.e2e
@pytest.mark.parametrize("code", ["installed", "checkout"])
def test_upstream_v2_config_over_full_size_weights_serves(upstream, full_dir, tmp_path, code):
    model_dir = _dir_with_config(tmp_path, upstream, 2)
    for name in (*layout.WEIGHT_FILES.values(), layout.CAMPPLUS, layout.SPEECH_TOKENIZER_FILES[2], layout.SPK2INFO,
                 layout.QWEN_DIR):
        _link(full_dir / name, model_dir / name)
    log = _serve_one_request(tmp_path, model_dir, upstream if code == "checkout" else None, "tiny_female")
    assert STAND_IN_LOG in log and "random-weight test model" not in log  # a released dir carries no marker
    assert (f"CosyVoice code from {upstream}" in log) == (code == "checkout")


@pytest.mark.e2e
def test_upstream_v1_config_over_its_own_weights_serves(upstream, tiny_models, tmp_path):
    model_dir = _dir_with_config(tmp_path, upstream, 1)
    for name in (layout.CAMPPLUS, layout.SPEECH_TOKENIZER_FILES[1], layout.SPK2INFO):
        _link(tiny_models(1) / name, model_dir / name)
    _run(DRAW, str(model_dir), upstream, "1")
    version, cls, llm, flow, _, tiny = _run(CHECK, str(model_dir), upstream).split()
    assert (version, cls, tiny) == ("1", "CosyVoiceModel", "False") and int(llm) > 250e6, (llm, flow)
    log = _serve_one_request(tmp_path, model_dir, upstream, "tiny_female")
    assert f"CosyVoice code from {upstream}" in log


def test_upstream_v3_config_over_its_own_weights_loads(upstream, full_dir, tmp_path):
    code = ("import sys; from app.devmodels.tiny import ensure_tiny_model; "
            "print(ensure_tiny_model(sys.argv[1], 3, cosyvoice_path=sys.argv[2]))")
    out = subprocess.run([sys.executable, "-c", code, str(CACHE), upstream], cwd=ROOT, capture_output=True, text=True,
                         timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-4000:]
    tiny3 = Path(out.stdout.strip().splitlines()[-1])
    model_dir = _dir_with_config(tmp_path, upstream, 3)
    for name in (layout.CAMPPLUS, layout.SPEECH_TOKENIZER_FILES[3], layout.SPK2INFO):
        _link(tiny3 / name, model_dir / name)
    blank = model_dir / layout.QWEN_DIR
    blank.mkdir()
    for name in ("config.json", "generation_config.json", "model.safetensors"):  # Qwen2.5-0.5B's shape
        _link(full_dir / layout.QWEN_DIR / name, blank / name)
    for name in layout.QWEN_TOKENIZER_FILES:  # ids numbered like Qwen2's
        _link(tiny3 / layout.QWEN_DIR / name, blank / name)
    try:
        _run(DRAW, str(model_dir), upstream, "3")
        version, cls, llm, flow, endofprompt, tiny = _run(CHECK, str(model_dir), upstream).split()
    finally:
        for name in layout.WEIGHT_FILES.values():  # ~3.4 GB
            (model_dir / name).unlink(missing_ok=True)
    assert (version, cls, endofprompt, tiny) == ("3", "CosyVoice3Model", "True", "False")
    assert int(llm) > 490e6 and int(flow) > 250e6, (llm, flow)  # Qwen2.5-0.5B; the 22-layer DiT


def test_the_cuda_images_build_step_passes_on_the_checkout(upstream):
    """The command Dockerfile.cuda runs at build, with this checkout in place of the image's /opt/CosyVoice."""
    from tests.support.dockerfiles import CHECK_CONFIG

    command = shlex.split(CHECK_CONFIG["Dockerfile.cuda"].replace("${COSYVOICE_PATH}", upstream))  # the build ARG
    out = subprocess.run([sys.executable, "-m", "app.cli", *command[1:]], cwd=ROOT, capture_output=True, text=True,
                         timeout=600, check=False)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert f"CosyVoice code from {upstream}" in out.stdout
    assert all(f"ok: cosyserve's CosyVoice{v} config" in out.stdout for v in (1, 2, 3)), out.stdout
