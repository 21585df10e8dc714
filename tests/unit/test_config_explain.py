"""``cosyserve config``: the effective settings and where each value came from (app/settings/explain.py)."""

from __future__ import annotations

import json

from app.cli import main
from app.settings.explain import explain


def rows_by_key(*args, **kw):
    return {r.key: r for r in explain(*args, **kw)}


def test_each_value_names_its_source_env_beats_file_beats_default(tmp_path, monkeypatch):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("pool:\n  workers: 3\n  max_queue: 1\nserver:\n  port: 9001\n  api_keys: [k1, k2]\n")
    monkeypatch.setenv("COSYSERVE_SERVER__PORT", "9100")
    monkeypatch.setenv("COSYSERVE_DEV__FAKE_ENGINE", "true")
    rows = rows_by_key(cfg)
    assert (rows["server.port"].value, rows["server.port"].source) == (9100, "env COSYSERVE_SERVER__PORT")
    assert (rows["pool.workers"].value, rows["pool.workers"].source) == (3, str(cfg))
    assert (rows["server.host"].value, rows["server.host"].source) == ("127.0.0.1", "default")
    assert rows["server.api_keys"].value == "<2 key(s)>"  # never a key itself
    assert rows["dev.fake_engine"].source == "env COSYSERVE_DEV__FAKE_ENGINE"
    assert "dev.llm_greedy" not in rows  # the dev section shows only what is set


def test_a_default_the_settings_resolve_says_so(monkeypatch):
    monkeypatch.setenv("COSYSERVE_DEV__FAKE_ENGINE", "true")
    rows = rows_by_key()
    assert rows["pool.workers"].value >= 1 and rows["pool.workers"].source == "default, resolved"
    assert rows["engine.batching"].value is False and rows["engine.batching"].source == "default, resolved"
    assert rows["engine.max_batch_size"].source == "default"


def test_the_command_prints_every_user_setting_once_and_json_on_request(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COSYSERVE_DEV__FAKE_ENGINE", "true")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("voices:\n  max_voices: 5\n")
    assert main(["config", "--config", str(cfg)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("voices.max_voices") and "= 5" in line and line.endswith(f"# {cfg}")
               for line in lines)
    keys = [line.split()[0] for line in lines]
    assert len(keys) == len(set(keys)) and "engine.model_dir" in keys
    assert main(["config", "--config", str(cfg), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["voices.max_voices"] == {"value": 5, "source": str(cfg)}


def test_an_invalid_config_is_one_message_and_exit_2(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("engine:\n  fp16: true\n")
    assert main(["config", "--config", str(cfg)]) == 2
    assert "engine.fp16 was removed: write engine.dtype: fp16 instead" in capsys.readouterr().err
