"""The typed config: models, presets and loading."""

from toolkit.config.loader import ConfigError, load_config, preset_names
from toolkit.config.models import Config

__all__ = ["Config", "ConfigError", "load_config", "preset_names"]
