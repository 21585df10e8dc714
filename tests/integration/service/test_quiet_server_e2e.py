"""`make run` prints no third-party warning: the real server on the repo's config.yaml (the default tiny
model), one whole and one streamed `POST /v1/tts`, then its whole output is read."""

from __future__ import annotations

import re

import httpx
import pytest
import yaml

from tests.support.paths import CACHE, ROOT
from tests.support.server import ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

# Python's warning format: "<file>:<line>: <Category>: <message>"
WARNING_LINE = re.compile(r"^(?P<file>\S.*?):\d+: (?P<category>\w*Warning): (?P<message>.*)$", re.MULTILINE)
# transformers logs its own deprecations (logger.warning_once) instead of warning
TRANSFORMERS_DEPRECATION = re.compile(r"is deprecated|are deprecated")


def test_the_default_server_prints_no_warning(tmp_path):
    config = yaml.safe_load((ROOT / "config.yaml").read_text())  # `make run`: model_dir null, the tiny model
    assert config["engine"]["model_dir"] is None
    config["dev"] = {"tiny_cache_dir": str(CACHE)}  # the tests' model cache instead of ~/.cache
    config["voices"]["dir"] = str(tmp_path / "voices")
    with ServerProcess(tmp_path, config) as srv:
        whole = httpx.post(srv.base_url + "/v1/tts", json={"text": "hello"}, timeout=120)
        assert whole.status_code == 200 and whole.content[:4] == b"RIFF"
        with httpx.stream("POST", srv.base_url + "/v1/tts", json={"text": "hello", "stream": True}, timeout=120) as r:
            assert r.status_code == 200 and len(r.read()) > 44
    out = srv.log()
    assert "Application startup complete" in out and "POST /v1/tts" in out  # the output is the server's
    assert [m.group(0) for m in WARNING_LINE.finditer(out)] == []
    assert [line for line in out.splitlines() if TRANSFORMERS_DEPRECATION.search(line)] == []


def test_the_warning_pattern_finds_what_python_prints():
    """The check above would see the warnings `make run` printed before they were silenced."""
    printed = ("/x/site-packages/diffusers/models/lora.py:393: FutureWarning: `LoRACompatibleLinear` is deprecated\n"
               "  deprecate(\"LoRACompatibleLinear\", \"1.0.0\", deprecation_message)\n"
               "INFO:     Application startup complete.\n")
    assert [m.group("category") for m in WARNING_LINE.finditer(printed)] == ["FutureWarning"]
