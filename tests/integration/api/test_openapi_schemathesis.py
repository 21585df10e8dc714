"""The OpenAPI schema tells the truth: schemathesis ``--checks all`` against a live server.

The server runs the fake engine (the HTTP layer is what is checked). Semantic 4xx
answers that a JSON schema cannot express (an unknown voice name, bytes that are
not audio, a mode the request lacks inputs for, a name already taken) are
documented responses; ``schemathesis.toml`` lists them as acceptable answers to
schema-valid requests. Everything else must hold: no server errors, documented
statuses, content types and headers, bodies matching their schemas, schema-invalid
requests rejected, 405 with ``Allow``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT
from tests.support.server import ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

MAX_EXAMPLES = os.environ.get("COSYSERVE_SCHEMATHESIS_EXAMPLES", "8")


def test_schemathesis_checks_all_find_nothing(tmp_path):
    config = {
        "dev": {"fake_engine": True},
        "pool": {"workers": 2, "max_queue": 8, "queue_timeout_s": 30, "request_timeout_s": 30},
        "server": {"drain_timeout_s": 5, "access_log": False},
        "voices": {"dir": str(tmp_path / "voices"), "max_voices": 1000},
    }
    with ServerProcess(tmp_path, config) as srv:
        cmd = [str(Path(sys.executable).with_name("schemathesis")), "--config-file", str(ROOT / "schemathesis.toml"),
               "run", srv.base_url + "/openapi.json", "--checks", "all", "--max-examples", MAX_EXAMPLES,
               "--seed", "1", "--no-color"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=540, cwd=tmp_path)
        report = done.stdout[-12000:] + done.stderr[-4000:]
        assert done.returncode == 0, report + "\n--- server log ---\n" + srv.log()[-4000:]
        assert "No issues found" in done.stdout or "0 failures" in done.stdout or "passed" in done.stdout, report
