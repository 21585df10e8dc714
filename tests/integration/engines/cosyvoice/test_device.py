"""engine.device: auto | cpu | cuda | cuda:N. Asking for a GPU that is not there fails at start, in one line."""

from __future__ import annotations

import logging
import subprocess
import sys
import time

import pytest
from pydantic import ValidationError

from app.settings import EngineSettings
from tests.support.paths import ROOT

pytestmark = [pytest.mark.integration]

torch = pytest.importorskip("torch")

from app.engines.cosyvoice.device import (  # noqa: E402
    DeviceUnavailable,
    cuda_memory,
    describe_device,
    device_text,
    resolve_device,
)
from tests.support import configs  # noqa: E402


def test_auto_takes_the_gpu_when_there_is_one_and_the_cpu_otherwise():
    assert resolve_device("auto", cuda_available=False) == torch.device("cpu")
    assert resolve_device("auto", cuda_available=True, device_count=2) == torch.device("cuda", 0)
    assert resolve_device("cpu", cuda_available=True) == torch.device("cpu")
    assert resolve_device("cuda:1", cuda_available=True, device_count=2) == torch.device("cuda", 1)
    assert resolve_device("cuda", cuda_available=True, device_count=1) == torch.device("cuda", 0)


def test_asking_for_a_gpu_that_is_not_there_names_the_fix():
    with pytest.raises(DeviceUnavailable, match=r"engine.device is 'cuda'.*engine.device: cpu"):
        resolve_device("cuda", cuda_available=False)
    with pytest.raises(DeviceUnavailable, match=r"sees 2 CUDA device\(s\).*cuda:0..cuda:1"):
        resolve_device("cuda:2", cuda_available=True, device_count=2)
    with pytest.raises(DeviceUnavailable, match="auto, cpu, cuda or cuda:N"):
        resolve_device("gpu")


def test_the_setting_is_checked_and_reaches_the_adapter(tiny_models):
    assert EngineSettings().device == "auto"
    for good in ("cpu", "cuda", "cuda:3"):
        assert configs.engine(tiny_models(2), device=good).device == good
    for bad in ("gpu", "cuda:", "cuda:x", "mps"):
        with pytest.raises(ValidationError):
            EngineSettings(device=bad)


def test_a_cpu_device_is_described_and_shows_no_gpu_memory():
    info = describe_device("cpu")
    assert info["name"] == "cpu" and device_text(info).startswith("device cpu (torch ")
    assert cuda_memory() == {}  # no CUDA initialised here: nothing to report


def test_the_load_log_names_the_device_and_the_dtype(tiny_models, caplog):
    from app.engines.cosyvoice.engine import CosyVoiceEngine

    eng = CosyVoiceEngine(configs.engine(model_dir=str(tiny_models(2)), device="cpu", batching=True))
    with caplog.at_level(logging.INFO, logger="cosyserve.engine"):
        eng.load()
    try:
        assert eng.loaded.device == torch.device("cpu") and eng.loaded.model.device == torch.device("cpu")
        assert eng.runner.lm.device == torch.device("cpu")
        line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("loaded CosyVoice2"))
        assert " on device cpu (torch " in line and "llm fp32" in line, line
    finally:
        eng.close()


@pytest.mark.e2e
def test_the_server_asked_for_cuda_on_a_cpu_host_exits_at_once_with_the_fix(tiny_models, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this host has a GPU: the server would start")
    env = {"COSYSERVE_ENGINE__DEVICE": "cuda", "COSYSERVE_ENGINE__MODEL_DIR": str(tiny_models(2)),
           "PYTHONUNBUFFERED": "1", "PATH": "/usr/bin:/bin"}
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "app.cli", "serve", "--port", "0"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    assert out.returncode != 0
    assert "engine.device is 'cuda'" in out.stderr and "COSYSERVE_ENGINE__DEVICE=cpu" in out.stderr, out.stderr
    assert took < 30, f"took {took:.1f}s: it should fail before loading anything"


def test_a_cuda_build_without_a_gpu_says_so_once(monkeypatch, caplog):
    """The CUDA image on a machine without a GPU (engine.device auto): the server resolves the device at start and
    again in every engine load; the warning is logged once, not once per resolution."""
    from app.engines.cosyvoice import device

    monkeypatch.setattr(torch.version, "cuda", "13.0")
    device._warn_cuda_build_without_gpu.cache_clear()
    with caplog.at_level(logging.WARNING, logger="cosyserve.engine"):
        for _ in range(3):
            assert resolve_device("auto", cuda_available=False) == torch.device("cpu")
    warnings = [r.getMessage() for r in caplog.records if "built for CUDA 13.0" in r.getMessage()]
    assert len(warnings) == 1 and "running on the CPU" in warnings[0]
    device._warn_cuda_build_without_gpu.cache_clear()
