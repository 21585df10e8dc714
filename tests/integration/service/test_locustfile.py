"""Smoke test of locustfiles/locustfile.py: locust headless against a real server (fake engine)."""

from __future__ import annotations

import csv
import subprocess
from pathlib import Path

import pytest

from bench.loadtest import locust_argv
from tests.support.paths import ROOT
from tests.support.server import ServerProcess, fake_engine_config

pytestmark = pytest.mark.e2e


def test_locustfile_runs_the_mix_without_failures(tmp_path: Path):
    server = ServerProcess(tmp_path, fake_engine_config(tmp_path, max_queue=16)).start(timeout=60)
    prefix = tmp_path / "lt"
    try:
        cmd = locust_argv(ROOT / "locustfiles" / "locustfile.py", server.base_url, users=4, spawn_rate=4,
                          run_time="10s", csv_prefix=prefix)
        proc = subprocess.run(cmd, check=False, cwd=ROOT, capture_output=True, text=True, timeout=120,
                              env={**server.env, "COSYSERVE_LOCUST_WAIT": "0.05,0.2"})
    finally:
        assert server.stop() == 0, server.log()
    assert proc.returncode == 0, proc.stderr[-4000:]
    with open(f"{prefix}_stats.csv", newline="") as f:
        rows = {row["Name"]: row for row in csv.DictReader(f)}
    total = rows.pop("Aggregated")
    assert int(total["Request Count"]) > 20, rows
    assert int(total["Failure Count"]) == 0, (rows, proc.stderr[-4000:])
    ttfa = [r for name, r in rows.items() if name.startswith("TTFA ")]
    assert {r["Name"] for r in ttfa} == {"TTFA /v1/tts stream", "TTFA /v1/audio/speech stream"}, rows.keys()
    assert all(r["Type"] == "TTFA" and int(r["Request Count"]) > 0 for r in ttfa)
    surfaces = {name.split()[0] for name in rows if not name.startswith(("TTFA", "rejected"))}
    assert surfaces == {"/v1/tts", "/v1/audio/speech"}
    formats = {name.split()[1] for name in rows if name.startswith("/v1/")}
    assert formats == {"wav", "mp3", "pcm", "opus"}
