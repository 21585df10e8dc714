"""``Settings``: config.yaml, overridden by COSYSERVE_* environment variables, then resolved once.

Nesting uses ``__``: ``COSYSERVE_POOL__WORKERS=2`` sets ``pool.workers``. The file is chosen
by ``cosyserve serve --config PATH`` or ``COSYSERVE_CONFIG``. Only the composition root
(lifespan / cli) reads settings; everything below receives runtime configs built from them
(``app/settings/runtime.py``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from app.settings.sections import (
    CacheSettings,
    DevSettings,
    EngineSettings,
    MetricsSettings,
    PoolSettings,
    ServerSettings,
    VoicesSettings,
    WebSocketSettings,
    WyomingSettings,
    batches_llm,
    default_workers,
)

ENV_PREFIX = "COSYSERVE_"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid")

    server: ServerSettings = Field(default_factory=ServerSettings)
    engine: EngineSettings = Field(default_factory=EngineSettings)
    pool: PoolSettings = Field(default_factory=PoolSettings)
    voices: VoicesSettings = Field(default_factory=VoicesSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    websocket: WebSocketSettings = Field(default_factory=WebSocketSettings)
    cache: CacheSettings = Field(default_factory=CacheSettings)
    wyoming: WyomingSettings = Field(default_factory=WyomingSettings)
    dev: DevSettings = Field(default_factory=DevSettings)

    @model_validator(mode="after")
    def _resolve_engine_plan(self) -> Settings:
        """Decide once whether the LLM is batched (read as ``engine.batching`` from here on) and the workers."""
        self.engine.batching = batches_llm(self.engine, self.dev)
        if self.engine.token2wav_batch == "on" and not self.engine.batching and not self.dev.fake_engine:
            raise ValueError("engine.token2wav_batch: on needs the batched CosyVoice2/3 path (engine.batching: true "
                             "and a CosyVoice2/3 model)")
        if self.pool.workers is None:
            self.pool._auto_sized = self.pool.max_queue is None
            self.pool.workers = self.engine.max_batch_size if self.engine.batching else default_workers()
        return self

    @field_validator("engine")
    @classmethod
    def _model_dir_exists(cls, v: EngineSettings) -> EngineSettings:
        if v.model_dir and not Path(v.model_dir).expanduser().is_dir():
            raise ValueError(f"engine.model_dir {v.model_dir!r} is not a directory")
        return v

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings)


class ConfigError(Exception):
    """Invalid configuration; the message is meant for the operator."""


def config_path(path: str | os.PathLike | None = None) -> Path | None:
    """The config file in use: ``path``, else $COSYSERVE_CONFIG, else none."""
    chosen = path or os.environ.get(f"{ENV_PREFIX}CONFIG")
    return Path(chosen) if chosen else None


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of sections")
    return data


def env_keys() -> dict[tuple[str, ...], str]:
    """The settings the environment sets: (section, key) or (section,) -> the variable's name."""
    out: dict[tuple[str, ...], str] = {}
    for name in os.environ:
        if name.startswith(ENV_PREFIX) and name != f"{ENV_PREFIX}CONFIG":
            out[tuple(name[len(ENV_PREFIX):].lower().split("__"))] = name
    return out


def _merge_env(data: dict[str, Any]) -> dict[str, Any]:
    """Environment beats the file: drop file values that an env var overrides, per key."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    for parts in env_keys():
        if len(parts) == 2 and isinstance(out.get(parts[0]), dict):
            out[parts[0]].pop(parts[1], None)
        elif len(parts) == 1:
            out.pop(parts[0], None)
    return out


def load_settings(path: str | os.PathLike | None = None, **overrides: Any) -> Settings:
    """Load settings from ``path`` (or $COSYSERVE_CONFIG), env overrides on top; raise ConfigError."""
    chosen = config_path(path)
    data = _merge_env(read_yaml(chosen)) if chosen else {}
    for section, values in overrides.items():
        data.setdefault(section, {}).update(values)
    try:
        return Settings(**data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "config"
            lines.append(f"  {where}: {err['msg']}")
        raise ConfigError("invalid configuration:\n" + "\n".join(lines)) from exc
