import pytest

from app.engines.cosyvoice.layout import CONFIG_FILES
from app.settings import ConfigError, load_settings


def test_defaults_and_file(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("pool:\n  workers: 3\n  max_queue: 5\nserver:\n  port: 9001\n")
    s = load_settings(cfg)
    assert (s.pool.workers, s.pool.max_queue, s.server.port) == (3, 5, 9001)
    assert s.dev.fake_engine is False


def test_flow_prompt_cache_defaults_to_a_gigabyte_and_zero_turns_it_off(tmp_path):
    assert load_settings(None).engine.flow_prompt_cache_mb == 1024
    cfg = tmp_path / "c.yaml"
    cfg.write_text("engine:\n  flow_prompt_cache_mb: 0\n")
    assert load_settings(cfg).engine.flow_prompt_cache_mb == 0


def test_env_overrides_file_per_key(tmp_path, monkeypatch):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("pool:\n  workers: 3\n  max_queue: 5\n")
    monkeypatch.setenv("COSYSERVE_POOL__WORKERS", "2")
    monkeypatch.setenv("COSYSERVE_DEV__FAKE_ENGINE", "true")
    s = load_settings(cfg)
    assert s.pool.workers == 2
    assert s.pool.max_queue == 5
    assert s.dev.fake_engine is True


def test_bulk_queue_settings_from_env_reach_the_pool(monkeypatch):
    from app.settings.runtime import pool_config

    assert load_settings(None).pool.bulk_max_queue == 1000  # a 200-request backlog fits (issue 39)
    monkeypatch.setenv("COSYSERVE_POOL__BULK_MAX_QUEUE", "7")
    monkeypatch.setenv("COSYSERVE_POOL__BULK_QUEUE_TIMEOUT_S", "12.5")
    cfg = pool_config(load_settings(None))
    assert cfg.bulk_max_queue == 7 and cfg.bulk_queue_timeout_s == 12.5


def test_cli_overrides_beat_env(tmp_path, monkeypatch):
    monkeypatch.setenv("COSYSERVE_SERVER__PORT", "7000")
    s = load_settings(None, server={"port": 7100})
    assert s.server.port == 7100


def test_request_head_limits_default_bounded_and_from_env(monkeypatch):
    s = load_settings(None).server
    assert (s.max_header_bytes, s.max_headers, s.header_timeout_s, s.keep_alive_s) == (65536, 100, 10.0, 5.0)
    monkeypatch.setenv("COSYSERVE_SERVER__MAX_HEADER_BYTES", "32768")
    monkeypatch.setenv("COSYSERVE_SERVER__MAX_HEADERS", "50")
    monkeypatch.setenv("COSYSERVE_SERVER__HEADER_TIMEOUT_S", "2.5")
    monkeypatch.setenv("COSYSERVE_SERVER__KEEP_ALIVE_S", "1")
    s = load_settings(None).server
    assert (s.max_header_bytes, s.max_headers, s.header_timeout_s, s.keep_alive_s) == (32768, 50, 2.5, 1.0)


@pytest.mark.parametrize("key, value", [
    ("max_header_bytes", 512),  # not even a request line with a key fits
    ("max_header_bytes", 32 << 20),
    ("max_headers", 0),
    ("header_timeout_s", 0),  # a head without a deadline is what these bound
    ("keep_alive_s", -1),
])
def test_request_head_limits_out_of_bounds_are_clear_errors(tmp_path, key, value):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"server:\n  {key}: {value}\n")
    with pytest.raises(ConfigError, match=f"server.{key}"):
        load_settings(cfg)


def test_repo_config_yaml_is_valid_and_documents_every_key():
    from pathlib import Path

    import yaml

    from app.settings import Settings

    path = Path(__file__).resolve().parents[2] / "config.yaml"
    s = load_settings(path)
    data = yaml.safe_load(path.read_text())
    assert "dev" not in data  # tests' and benchmarks' knobs: not the user's settings
    for section, model in Settings.model_fields.items():
        if section == "dev":
            continue
        sub = getattr(s, section)
        missing = set(type(sub).model_fields) - set(data.get(section, {}))
        assert not missing, f"config.yaml does not document {section}.{sorted(missing)}"


@pytest.mark.parametrize(
    "text, needle",
    [
        ("pool:\n  workers: 0\n", "pool.workers"),
        ("pool:\n  wrokers: 2\n", "pool.wrokers"),
        ("engine:\n  flow_prompt_cache_mb: -1\n", "engine.flow_prompt_cache_mb"),
        ("engine:\n  model_dir: /does/not/exist\n", "engine"),
        ("server: [1, 2\n", "not valid YAML"),
        ("- a\n- b\n", "mapping"),
    ],
)
def test_invalid_config_is_a_clear_error(tmp_path, text, needle):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_settings(cfg)
    assert needle in str(info.value)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(tmp_path / "nope.yaml")


def test_cli_serve_exits_nonzero_on_bad_config(tmp_path, capsys):
    from app.cli import main

    cfg = tmp_path / "bad.yaml"
    cfg.write_text("pool:\n  workers: -1\n")
    assert main(["serve", "--config", str(cfg)]) == 2
    assert "pool.workers" in capsys.readouterr().err


def test_default_workers_follow_llm_batching(tmp_path, monkeypatch):
    monkeypatch.delenv("COSYSERVE_POOL__WORKERS", raising=False)
    v1, v2 = tmp_path / "v1", tmp_path / "v2"
    v1.mkdir()
    v2.mkdir()
    (v1 / CONFIG_FILES[1]).write_text("")
    (v2 / CONFIG_FILES[2]).write_text("")
    batched = load_settings(None, engine={"model_dir": str(v2), "max_batch_size": 12})
    # workers = concurrent requests; adaptive admission (the default) keeps no queue beyond them
    assert (batched.pool.workers, batched.pool.queue_limit, batched.pool.auto_sized) == (12, 0, True)
    fixed = load_settings(None, engine={"model_dir": str(v2), "max_batch_size": 12}, pool={"admission": "fixed"})
    assert (fixed.pool.workers, fixed.pool.queue_limit) == (12, 12)  # fixed: one waiting request per worker
    by_hand = load_settings(None, engine={"model_dir": str(v2)}, pool={"max_queue": 3})
    assert (by_hand.pool.workers, by_hand.pool.queue_limit, by_hand.pool.auto_sized) == (16, 3, False)
    import os

    cores = max(1, os.cpu_count() or 1)
    assert load_settings(None, engine={"model_dir": str(v1)}).pool.workers == cores  # v1: never batched
    assert load_settings(None, engine={"model_dir": str(v2), "batching": False}).pool.workers == cores
    assert load_settings(None, dev={"fake_engine": True}).pool.workers == cores
    assert load_settings(None, engine={"model_dir": str(v2)}, pool={"workers": 3}).pool.workers == 3


def test_api_keys_and_cors_origins_from_env_comma_or_json(monkeypatch):
    monkeypatch.setenv("COSYSERVE_SERVER__API_KEYS", "k-one, k-two")
    monkeypatch.setenv("COSYSERVE_SERVER__CORS_ORIGINS", '["https://a.example", "https://b.example"]')
    s = load_settings(None)
    assert s.server.api_keys == ["k-one", "k-two"] and s.server.keys == {"k-one", "k-two"}
    assert s.server.cors_origins == ["https://a.example", "https://b.example"]


def test_keys_off_by_default():
    s = load_settings(None)
    assert s.server.keys == frozenset() and s.server.cors_origins == [] and s.metrics.require_key is False


def test_api_keys_file_adds_to_the_list(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# team keys\nk-file-1\n\n  k-file-2  \n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"server:\n  api_keys: [k-inline]\n  api_keys_file: {keys}\n")
    assert load_settings(cfg).server.keys == {"k-inline", "k-file-1", "k-file-2"}


@pytest.mark.parametrize("content, expected", [(None, "cannot read api_keys_file"),
                                               ("# only a comment\n\n", "holds no key")])
def test_a_keys_file_that_gives_no_keys_fails_closed(tmp_path, content, expected):
    keys = tmp_path / "keys"
    if content is not None:
        keys.write_text(content)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"server:\n  api_keys_file: {keys}\n")
    with pytest.raises(ConfigError, match=expected):
        load_settings(cfg)


@pytest.mark.parametrize("bad", ["has space", "tab\tkey", "ключ"])
def test_an_invalid_key_is_refused_without_echoing_it(tmp_path, bad):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("server:\n  api_keys: [ok-key, " + repr(bad).replace("'", '"') + "]\n")
    with pytest.raises(ConfigError) as err:
        load_settings(cfg)
    assert "server.api_keys" in str(err.value) and bad not in str(err.value)
