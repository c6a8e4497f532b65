"""Typed config: schema (defaults), loader (YAML + overrides), validation."""

from ajet.config.loader import ConfigError, defaults_yaml, load_config, to_yaml
from ajet.config.schema import AjetConfig, Backbone

__all__ = ["AjetConfig", "Backbone", "ConfigError", "defaults_yaml", "load_config", "to_yaml"]
