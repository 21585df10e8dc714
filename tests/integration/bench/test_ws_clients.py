"""The ws scenario's client table runs: `python -m bench serve --scenario ws --clients ...`, one round.

Two clients (the raw WebSocket and the Wyoming streamed text, whose port the scenario turns on) at two
sessions at once, on the tiny CosyVoice2: every session speaks, the table and the goals are written.
The timings themselves are not checked here (docs/benchmarks/README.md has them).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.paths import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.e2e, pytest.mark.slow]


def test_the_clients_table_times_each_client_at_each_concurrency(tiny_models, tmp_path):
    pytest.importorskip("wyoming.client")
    tiny_models(2)  # built once per test session (the scenario's server loads the same dir)
    run = subprocess.run([sys.executable, "-m", "bench", "serve", "--scenario", "ws", "--clients", "ws,wyoming-stream",
                          "--concurrency", "2", "--reps", "1", "--text", "20 words", "--out", str(tmp_path)],
                         check=False, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    doc = json.loads((tmp_path / "ws-clients.json").read_text())
    assert doc["skipped"] == {}
    for name in ("ws", "wyoming-stream"):
        point = doc["summary"][name]["2"]
        assert point["sessions"] == 2 and point["errors"] == 0, doc["raw"][name]
        assert 0 < point["ttfa_p50_s"] <= point["ttfa_p99_s"] and point["audio_per_wall"] > 0
    md = (tmp_path / "ws-clients.md").read_text()
    assert "| wyoming-stream | 2 | 2 | 0 |" in md and "wyoming-stream p50 / ws p50" in md
