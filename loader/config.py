"""Load ml-collections config files (a Python file with ``get_config()``)."""

from __future__ import annotations

import importlib.util
import os

import ml_collections


def load_config(path) -> ml_collections.ConfigDict:
    """Import ``path`` and return its ``get_config()``, locked so a misspelt key raises instead of being added."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(2, "config file not found", path)
    spec = importlib.util.spec_from_file_location(f"babelfeed_config_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "get_config"):
        raise ValueError(f"{path}: a config file must define get_config()")
    config = module.get_config()
    if not isinstance(config, ml_collections.ConfigDict):
        raise ValueError(f"{path}: get_config() returned {type(config).__name__}, not an ml_collections.ConfigDict")
    config.lock()
    return config
