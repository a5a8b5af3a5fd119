"""Layer 8, config: config files read and checked (``files``: load_config, overrides, the translation section).
"""

from babelfeed.config.files import apply_overrides, load_config, task

__all__ = ["apply_overrides", "load_config", "task"]
