"""Settings: declared once (sections.py), loaded from config.yaml and COSYSERVE_* (load.py),
converted once into the runtime configs (runtime.py), explained by ``cosyserve config`` (explain.py)."""

from app.settings.keys import read_keys_file
from app.settings.load import ConfigError, Settings, load_settings
from app.settings.sections import (
    DEFAULT_CACHE,
    DevSettings,
    EngineSettings,
    MetricsSettings,
    PoolSettings,
    ServerSettings,
    VoicesSettings,
    WebSocketSettings,
    WyomingSettings,
    batches_llm,
)

__all__ = ["DEFAULT_CACHE", "ConfigError", "DevSettings", "EngineSettings", "MetricsSettings", "PoolSettings",
           "ServerSettings", "Settings", "VoicesSettings", "WebSocketSettings", "WyomingSettings", "batches_llm", "load_settings",
           "read_keys_file"]
